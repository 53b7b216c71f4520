// Opens each URL in a Firefox instance over raw WebDriver BiDi (session.new,
// browsingContext.navigate, script.evaluate) and prints, per URL, whether
// it loaded: {"<url>": {"loaded": bool, "text": "<start of its body>"}}.
// A page loaded when the navigation succeeded and the document is the page
// itself, not one of Firefox's error pages (about:neterror, …).
// Usage: node bidi_loads.mjs <urls.bidi> <url>...
import { open } from './bidi_client.mjs';

const [endpoint, ...urls] = process.argv.slice(2);
const { socket, send, call } = await open(endpoint);

await call('session.new', { capabilities: {} });
const tree = await call('browsingContext.getTree', {});
const context = tree.contexts[0].context;
const seen = {};
for (const url of urls) {
  const navigated = await send('browsingContext.navigate', { context, url, wait: 'complete' });
  const evaluated = await call('script.evaluate', {
    target: { context },
    expression: "JSON.stringify([document.documentURI, document.body ? document.body.innerText.slice(0, 200) : ''])",
    awaitPromise: false,
  });
  const [documentUri, text] = JSON.parse(evaluated.result.value);
  seen[url] = {
    loaded: navigated.type === 'success' && !documentUri.startsWith('about:'),
    text,
    error: navigated.type === 'success' ? null : `${navigated.error}: ${navigated.message}`,
  };
}
await call('session.end', {});
socket.close();
console.log(JSON.stringify(seen));
