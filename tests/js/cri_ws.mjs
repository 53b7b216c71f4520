// Connects chrome-remote-interface to a WebSocket URL alone (urls.debug, as a
// user would paste it), without `local`: it fetches /json/protocol from the
// root of that URL's host. Asks the browser target its version and prints
// {"product": "Chrome/…"}.
// Usage: node cri_ws.mjs <ws url>
import CDP from 'chrome-remote-interface';

const [target] = process.argv.slice(2);
const client = await CDP({ target });
try {
  const { product } = await client.Browser.getVersion();
  console.log(JSON.stringify({ product }));
} finally {
  await client.close();
}
