// Flotilla's Playwright server: playwright-core's own server (the one
// `npx playwright run-server` starts), serving each connection the instance's
// running browser instead of launching one. The node agent starts it beside
// the browser, in the browser's confinement, and relays clients to it.
//
// Arguments: the playwright-core package folder, the port to listen on
// (127.0.0.1; 0 for any: the agent reads it from the `listening` line), the folder for temporary files (one the browser sees at the
// same path), the folder of Playwright's tools (ffmpeg), and the instance's
// downloads folder. The agent's secret comes on stdin's first line; a
// connection without it is refused. Each connection names the browser's
// DevTools socket in `x-flotilla-cdp`.
"use strict";
const [pkg, port, tmp, tools, downloads] = process.argv.slice(-5);
process.env.TMPDIR = tmp;
process.env.PLAYWRIGHT_BROWSERS_PATH = tools;
const crypto = require("crypto");
const core = require(pkg + "/lib/coreBundle");
const { PlaywrightServer } = core.remote;
const { nullProgress, DispatcherConnection } = core.server;

// Calls a remote client has no business making, refused before they run:
// they name paths on the server's side, where the server would write.
// (Playwright's remote clients save artifacts with saveAsStream and name
// traces without folders.) If this Playwright has no such hook, the server
// does not start.
if (typeof DispatcherConnection?.prototype?.dispatch !== "function")
  throw new Error("this playwright-core has no DispatcherConnection.dispatch to guard");
const unsafeName = (name) => typeof name === "string" && (/[\\/]/.test(name) || name.includes(".."));
function refusal(type, method, params) {
  if (type === "Artifact" && method === "saveAs")
    return "saving to a path on the server: use saveAs() of a remote client (it streams the file)";
  if (type === "Tracing" && (method === "tracingStart" || method === "tracingStartChunk") && unsafeName(params?.name))
    return "a trace name with a folder in it";
  return null;
}
const dispatch = DispatcherConnection.prototype.dispatch;
DispatcherConnection.prototype.dispatch = function (message) {
  const dispatcher = this._dispatcherByGuid?.get?.(message?.guid);
  const why = dispatcher && refusal(dispatcher._type, message.method, message.params);
  if (why)
    message = { ...message, method: `${message.method} is refused by Flotilla: ${why}` };
  return dispatch.call(this, message);
};

let secret = null;
let input = "";
process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk) => {
  input += chunk;
  const end = input.indexOf("\n");
  if (secret === null && end >= 0) {
    secret = Buffer.from(input.slice(0, end));
    start();
  }
});
// The agent ends: so does this server.
process.stdin.on("end", () => process.exit(0));

function admitted(request) {
  const given = Buffer.from(String(request.headers["x-flotilla-secret"] || ""));
  return secret !== null && given.length === secret.length && crypto.timingSafeEqual(given, secret);
}

function start() {
  const server = new PlaywrightServer({ mode: "default", path: "/playwright", maxConnections: Infinity });
  const delegate = server._wsServer._delegate;
  const endpoints = new Map();
  const onUpgrade = delegate.onUpgrade;
  delegate.onUpgrade = (request, socket) => {
    if (!admitted(request))
      return { error: `HTTP/${request.httpVersion} 401 Unauthorized\r\n\r\n` };
    return onUpgrade(request, socket);
  };
  const onConnection = delegate.onConnection;
  delegate.onConnection = (request, url, ws, id) => {
    endpoints.set(id, String(request.headers["x-flotilla-cdp"] || ""));
    ws.on("close", () => endpoints.delete(id));
    return onConnection(request, url, ws, id);
  };
  // Every connection gets the instance's browser, never a launched one.
  server._initLaunchBrowserMode = async (_name, _proxy, _options, id) => {
    const endpoint = endpoints.get(id);
    endpoints.delete(id);
    const browser = await server._playwright.chromium._connectOverCDPInternal(nullProgress, endpoint, { downloadsPath: downloads });
    return {
      preLaunchedBrowser: browser,
      sharedBrowser: true,
      denyLaunch: true,
      // Disconnects from the browser; the browser goes on.
      dispose: async () => { await browser.close(nullProgress, { reason: "Connection terminated" }).catch(() => {}); },
    };
  };
  // Port 0: the agent reads the port from the line printed here.
  server.listen(Number(port), "127.0.0.1").then(
    (endpoint) => process.stdout.write(`listening ${endpoint}\n`),
    (error) => { process.stderr.write(`cannot listen: ${error}\n`); process.exit(1); });
}
