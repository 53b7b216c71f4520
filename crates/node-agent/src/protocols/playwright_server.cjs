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

// Calls a remote client has no business making, refused before they run
// (read from the protocol of every served version, 1.60 to 1.65): they name
// paths on the server's side, where the server would read or write, or
// reach past the instance (a second server without Flotilla's door,
// launches, LocalUtils). Refused: Artifact.saveAs to a path; trace names
// that are not plain names; createTempFiles names that are not relative
// paths of plain names inside the upload's own folder (1.60 joined them
// unchecked: '../../downloads/x' wrote anywhere the browser user may), a
// root folder name that is not a plain name, a name twice, a file inside
// another, a path longer than Linux takes (each would crash the server);
// setInputFiles/drop naming files by a path on the server (a remote client
// streams its files); a recorder's output or storage file;
// Browser.startServer; launches, connectOverCDP, Android, Electron,
// newRequest. Paths a real remote client sends for its own disk
// (recordVideo.dir, harStart's harPath and resourcesDir) are dropped. If
// this Playwright has no such hook, the server does not start.
if (typeof DispatcherConnection?.prototype?.dispatch !== "function")
  throw new Error("this playwright-core has no DispatcherConnection.dispatch to guard");
const path = require("path");
const fs = require("fs");
// Linux's limits, in bytes: a name (NAME_MAX) and a whole path (PATH_MAX - 1).
const NAME_MAX = 255;
const PATH_MAX = 4095;
const bytes = (text) => Buffer.byteLength(text, "utf8");
// One path component on the server (Linux): not empty, ".", "..", no "/"
// and no NUL, at most 255 bytes. A backslash is an ordinary character on
// Linux (a Windows client's folder upload names "sub\\b.txt"), so it stays.
const plainName = (name) =>
  typeof name === "string" && name !== "" && name !== "." && name !== ".." && !/[/\0]/.test(name) && bytes(name) <= NAME_MAX;
// What Playwright's own client sends as an upload's name:
// path.relative(folder, file) (POSIX client) or basename(file).
const relativeOfPlainNames = (name) => typeof name === "string" && name.split("/").every(plainName);
const shown = (value) => JSON.stringify(String(value)).slice(0, 120);
// createTempFiles writes <os.tmpdir()>/playwright-artifacts-XXXXXX/upload-<32 hex>/[<root>/]<name>
// (os.tmpdir() is TMPDIR, set above to tmp).
const uploadPrefix = Math.max(bytes(path.resolve(tmp)), bytes(fs.realpathSync(tmp))) +
  "/playwright-artifacts-XXXXXX/upload-".length + 32 + "/".length;

function tempFilesRefusal(params) {
  const root = params?.rootDirName;
  if (root !== undefined && !plainName(root))
    return `a root folder name that is not a plain name (${shown(root)})`;
  const names = Array.isArray(params?.items) ? params.items.map((item) => item?.name) : [];
  if (names.length > 10000)
    return "more than 10000 files at once";
  const base = uploadPrefix + (root !== undefined ? bytes(root) + 1 : 0);
  for (const name of names) {
    if (!relativeOfPlainNames(name))
      return `a file name that is not a relative path of plain names (${shown(name)})`;
    if (base + bytes(name) > PATH_MAX)
      return `a file path longer than the server's file system takes (${shown(name)})`;
  }
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

// Calls whose server-side effect no remote client needs.
const REFUSED = {
  "Artifact.saveAs": "saving to a path on the server: use saveAs() of a remote client (it streams the file)",
  "Browser.startServer": "another server for this browser, listening without Flotilla's door",
  "Playwright.newRequest": "a request context of the server's own (use context.request)",
  "BrowserType.launch": "launching a browser",
  "BrowserType.launchPersistentContext": "launching a browser",
  "BrowserType.connectOverCDP": "connecting to another browser",
  "BrowserType.connectToWorker": "connecting to another browser",
  "Electron.launch": "launching Electron",
  "Android.devices": "connecting to Android devices",
};

function refusal(type, method, params) {
  const why = REFUSED[`${type}.${method}`];
  if (why)
    return why;
  // Not offered to a server's clients (utils is undefined when isServer);
  // refused should a later version offer them.
  if (type === "LocalUtils" || type === "AndroidDevice" || type === "DebugController")
    return `${type} calls (they name paths and endpoints on the server)`;
  if (type === "Tracing" && (method === "tracingStart" || method === "tracingStartChunk")) {
    const name = params?.name;
    if (name !== undefined && name !== "" && !(plainName(name) && bytes(name) <= 200))
      return `a trace name that is not a plain name of at most 200 bytes (${shown(name)})`;
  }
  if (type === "BrowserContext" && method === "createTempFiles")
    return tempFilesRefusal(params);
  // A remote client sends files as streams (createTempFiles) or payloads,
  // never as paths: localPaths/localDirectory are the server's files.
  if ((type === "Frame" || type === "ElementHandle") && (method === "setInputFiles" || method === "drop") &&
      (params?.localPaths !== undefined || params?.localDirectory !== undefined))
    return "files named by a path on the server (setInputFiles of a remote client streams the client's files)";
  if (type === "BrowserContext" && (method === "enableRecorder" || method === "showRecorder") &&
      (params?.outputFile !== undefined || params?.saveStorage !== undefined))
    return "a recorder writing to a file on the server";
  return null;
}

// Paths a real remote client sends, that name its own disk: dropped, never
// refused (the server keeps these files in its artifacts folder).
function withoutServerPaths(type, method, message) {
  const params = message.params;
  if (type === "Browser" && (method === "newContext" || method === "newContextForReuse") && params?.recordVideo?.dir !== undefined) {
    const { dir, ...kept } = params.recordVideo;
    return { ...message, params: { ...params, recordVideo: kept } };
  }
  if (type === "Tracing" && method === "harStart" && params?.options &&
      (params.options.harPath !== undefined || params.options.resourcesDir !== undefined)) {
    const { harPath, resourcesDir, ...kept } = params.options;
    return { ...message, params: { ...params, options: kept } };
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
