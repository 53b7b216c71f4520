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
// they name paths on the server's side, where the server would read or
// write. Read from the protocol of every served version (1.60 to 1.65):
// - Artifact.saveAs: a path to save to (remote clients use saveAsStream);
// - Tracing.tracingStart/tracingStartChunk: a trace name with a folder;
// - BrowserContext.createTempFiles: file names that are not relative paths
//   of plain names inside the upload's own folder (1.60 joined them
//   unchecked: '../../downloads/x' wrote anywhere the browser user may),
//   a root folder name that is not a plain name, a name twice, or a file
//   inside another (both would crash the server);
// - Frame/ElementHandle.setInputFiles and Frame.drop: local paths outside
//   this server's temporary folder, where createTempFiles puts uploads;
// - BrowserContext.enableRecorder (showRecorder from 1.64): an output file
//   or a storage file to save;
// - Playwright.newRequest: a folder for traces;
// And one is rewritten: Browser.newContext/newContextForReuse record videos
// into the server's artifacts, never into a folder the client names
// (Playwright's server drops it from newContext only; its remote client
// sends its own local folder, and videos come back through saveAs()).
// Launches, connectOverCDP (with its artifactsDir), Android and Electron are
// refused by the server itself (denyLaunch), and LocalUtils (zip, HAR) is
// not offered to a server's clients. If this Playwright has no such hook,
// the server does not start.
if (typeof DispatcherConnection?.prototype?.dispatch !== "function")
  throw new Error("this playwright-core has no DispatcherConnection.dispatch to guard");
const path = require("path");
const fs = require("fs");
const unsafeName = (name) => typeof name === "string" && (/[\\/]/.test(name) || name.includes(".."));
const plainName = (name) =>
  typeof name === "string" && name.length > 0 && name.length <= 255 && !/[\\/\0]/.test(name) && name !== "." && name !== "..";
const relativeOfPlainNames = (name) =>
  typeof name === "string" && name.length > 0 && name.length <= 4096 && name.split("/").every(plainName);
const shown = (value) => JSON.stringify(String(value)).slice(0, 120);

function tempFilesRefusal(params) {
  if (params?.rootDirName !== undefined && !plainName(params.rootDirName))
    return `a root folder name that is not a plain name (${shown(params.rootDirName)})`;
  const names = Array.isArray(params?.items) ? params.items.map((item) => item?.name) : [];
  if (names.length > 10000)
    return "more than 10000 files at once";
  const bad = names.find((name) => !relativeOfPlainNames(name));
  if (bad !== undefined)
    return `a file name that is not a relative path of plain names (${shown(bad)})`;
  const seen = new Set(names);
  if (seen.size !== names.length)
    return "a file named twice";
  for (const name of names) {
    const parts = name.split("/");
    for (let i = 1; i < parts.length; i++) {
      if (seen.has(parts.slice(0, i).join("/")))
        return `a file inside another file (${shown(name)})`;
    }
  }
  return null;
}

// Where createTempFiles puts uploads (the artifacts folder under TMPDIR).
const tempRoot = fs.realpathSync(tmp);
function outsideTemp(paths) {
  return paths.some((given) => {
    if (typeof given !== "string")
      return true;
    let real;
    try {
      real = fs.realpathSync(path.resolve(tempRoot, given));
    } catch {
      return true;
    }
    return real !== tempRoot && !real.startsWith(tempRoot + path.sep);
  });
}

function refusal(type, method, params) {
  if (type === "Artifact" && method === "saveAs")
    return "saving to a path on the server: use saveAs() of a remote client (it streams the file)";
  if (type === "Tracing" && (method === "tracingStart" || method === "tracingStartChunk") && unsafeName(params?.name))
    return "a trace name with a folder in it";
  if (type === "BrowserContext" && method === "createTempFiles")
    return tempFilesRefusal(params);
  if ((type === "Frame" || type === "ElementHandle") && (method === "setInputFiles" || method === "drop")) {
    const paths = [...(params?.localPaths ?? []), ...(params?.localDirectory !== undefined ? [params.localDirectory] : [])];
    if (outsideTemp(paths))
      return "files named by a path outside the uploads this server received (send them with setInputFiles from the client)";
  }
  if (type === "BrowserContext" && (method === "enableRecorder" || method === "showRecorder") && (params?.outputFile !== undefined || params?.saveStorage !== undefined))
    return "a recorder writing to a file on the server";
  if (type === "Playwright" && method === "newRequest" && params?.tracesDir !== undefined)
    return "a folder for traces on the server";
  return null;
}

function withoutServerPaths(type, method, message) {
  const video = message.params?.recordVideo;
  if (type === "Browser" && (method === "newContext" || method === "newContextForReuse") && video?.dir !== undefined) {
    const { dir, ...kept } = video;
    return { ...message, params: { ...message.params, recordVideo: kept } };
  }
  return message;
}
const dispatch = DispatcherConnection.prototype.dispatch;
DispatcherConnection.prototype.dispatch = function (message) {
  const dispatcher = this._dispatcherByGuid?.get?.(message?.guid);
  if (dispatcher)
    message = withoutServerPaths(dispatcher._type, message.method, message);
  const why = dispatcher && refusal(dispatcher._type, message.method, message.params);
  if (why)
    message = { ...message, method: `${message.method} is refused by Flotilla: ${why}` };
  const dispatched = dispatch.call(this, message);
  // A message the server cannot take (a broken initialize) must not end
  // the server for the instance's other clients.
  if (dispatched && typeof dispatched.catch === "function")
    dispatched.catch((error) => process.stderr.write(`a client message failed: ${String(error).split("\n")[0]}\n`));
  return dispatched;
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
