// Sets or reads a cookie in a Firefox instance over raw WebDriver BiDi,
// without visiting its site (storage.setCookie, storage.getCookies).
// Usage: node bidi_cookie.mjs <urls.bidi> set <name> <value> <domain> | get
// Prints {"set": true} or {"cookies": ["name=value@domain", …]}.
import { open } from './bidi_client.mjs';

const [endpoint, verb, name, value, domain] = process.argv.slice(2);
const { socket, call } = await open(endpoint);
await call('session.new', { capabilities: {} });
let seen;
if (verb === 'set') {
  const expiry = Math.floor(Date.now() / 1000) + 86400;
  await call('storage.setCookie', {
    cookie: { name, value: { type: 'string', value }, domain, path: '/', expiry },
  });
  seen = { set: true };
} else {
  const { cookies } = await call('storage.getCookies', {});
  seen = { cookies: cookies.map((c) => `${c.name}=${c.value.value}@${c.domain}`).sort() };
}
await call('session.end', {});
socket.close();
console.log(JSON.stringify(seen));
