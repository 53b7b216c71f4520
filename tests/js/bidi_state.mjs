// Sets up or reads back what a park must keep in a Firefox instance, over
// raw WebDriver BiDi. `set <url>...`: opens each URL in a tab of its own
// (the first in the browser's first tab), and there sets a session cookie, a
// persistent cookie and a localStorage item. `get`: prints the tabs' URLs,
// the cookies and the first web tab's localStorage item as JSON. `leave`:
// starts a session and drops the connection without ending it (a client
// that crashed).
// Usage: node bidi_state.mjs <urls.bidi> set <url>... | get | leave
import { open } from './bidi_client.mjs';

const [endpoint, verb, ...urls] = process.argv.slice(2);
const { socket, call } = await open(endpoint);
async function evaluate(context, expression) {
  const evaluated = await call('script.evaluate', { target: { context }, expression, awaitPromise: false });
  return evaluated.result.value;
}

await call('session.new', { capabilities: {} });
if (verb === 'leave') {
  socket.terminate();
  console.log(JSON.stringify({ left: true }));
  process.exit(0);
}
const tree = await call('browsingContext.getTree', { maxDepth: 0 });
let seen = {};
if (verb === 'set') {
  let context = tree.contexts[0].context;
  for (const [index, url] of urls.entries()) {
    if (index > 0) context = (await call('browsingContext.create', { type: 'tab' })).context;
    await call('browsingContext.navigate', { context, url, wait: 'complete' });
    if (index === 0) {
      await evaluate(context, "document.cookie = 'visit=session'; document.cookie = 'flavour=oat; max-age=86400'; localStorage.setItem('basket', 'three apples'); 'ok'");
    }
  }
  seen = { set: urls.length };
} else {
  const web = tree.contexts.filter((context) => context.url.startsWith('http'));
  const cookies = (await call('storage.getCookies', {})).cookies
    .map((cookie) => `${cookie.name}=${cookie.value.value}`)
    .sort();
  seen = {
    tabs: tree.contexts.map((context) => context.url),
    cookies,
    basket: web.length ? await evaluate(web[0].context, "localStorage.getItem('basket')") : null,
  };
}
await call('session.end', {});
socket.close();
console.log(JSON.stringify(seen));
