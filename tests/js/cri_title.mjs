// Opens a page with chrome-remote-interface through a DevTools HTTP endpoint
// (host, port, a path prefix such as /v2/instances/<id>, and a token; "-" for
// none) and prints {"title": ...}. Usage:
//   node cri_title.mjs <host> <port> <prefix|-> <token|-> <page url>
import CDP from 'chrome-remote-interface';

const [host, port, prefix, token, pageUrl] = process.argv.slice(2);
const options = {
  host,
  port: Number(port),
  // Keep the name in Host (an instance subdomain routes by it).
  useHostName: true,
  // Applied to the HTTP endpoints, and by chrome-remote-interface also to the
  // path of the WebSocket URL it was given, which already holds prefix and token.
  alterPath: (path) => {
    const base = prefix === '-' ? '' : prefix;
    if (path.startsWith(base + '/devtools/')) return path;
    const withPrefix = base + path;
    if (token === '-') return withPrefix;
    return withPrefix + (withPrefix.includes('?') ? '&' : '?') + 'token=' + token;
  },
};
const target = await CDP.New({ ...options, url: 'about:blank' });
const client = await CDP({ ...options, target });
try {
  await client.Page.enable();
  const loaded = client.Page.loadEventFired();
  await client.Page.navigate({ url: pageUrl });
  await loaded;
  const { result } = await client.Runtime.evaluate({ expression: 'document.title' });
  console.log(JSON.stringify({ title: result.value }));
} finally {
  await client.close();
  await CDP.Close({ ...options, id: target.id });
}
