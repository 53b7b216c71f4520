// Connects to a Flotilla instance with Playwright's own protocol
// (chromium.connect) and uses what Playwright moves as artifacts, printing
// what it saw as JSON.
// Usage: node playwright_connect.mjs <module> <ws url> <headers JSON> <site url> <out dir> [full|basic] [urls.debug]
//   module: playwright-core, or playwright-core-1.64 (another minor version)
//   full: downloads, upload from this disk, trace, video, PDF, storage
//   state, route and routeFromHAR, and a CDP client on the same browser at
//   once (urls.debug); basic: the title and one download.
import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';

const require = createRequire(import.meta.url);
const [moduleName, wsUrl, headersJson, siteUrl, outDir, mode = 'basic', debugUrl] = process.argv.slice(2);
const { chromium } = require(moduleName);
const version = require(`${moduleName}/package.json`).version;
const seen = { client: version };
fs.mkdirSync(outDir, { recursive: true });

const browser = await chromium.connect(wsUrl, { headers: JSON.parse(headersJson), timeout: 60_000 });
try {
  seen.browser_version = browser.version();
  // The instance's own context (with its tabs), as connectOverCDP gives it.
  const context = browser.contexts()[0];
  seen.contexts = browser.contexts().length;
  const page = await context.newPage();
  await page.goto(siteUrl, { timeout: 60_000 });
  seen.title = await page.title();

  // A download, saved on this machine's disk and read as a stream.
  await page.setContent('<a id=get href="data:text/plain,bytes%20of%20the%20download" download="report.txt">get</a>');
  const [download] = await Promise.all([page.waitForEvent('download'), page.click('#get')]);
  const saved = path.join(outDir, `saved-${version}.txt`);
  await download.saveAs(saved);
  seen.saved = fs.readFileSync(saved, 'utf8');
  seen.suggested = download.suggestedFilename();
  let streamed = '';
  for await (const chunk of await download.createReadStream()) streamed += chunk;
  seen.streamed = streamed;

  if (mode === 'full') {
    // A CDP client on the same browser at once.
    const cdp = await chromium.connectOverCDP(debugUrl, { timeout: 60_000 });
    seen.cdp_sees = cdp.contexts()[0].pages().map((p) => p.url()).filter((u) => u.startsWith(siteUrl.replace(/\/[^/]*$/, ''))).length;
    await cdp.close();

    // A context of the client's own, recorded, traced, routed.
    const recorded = await browser.newContext({ recordVideo: { dir: path.join(outDir, 'videos') } });
    await recorded.tracing.start({ screenshots: true, snapshots: true });
    const second = await recorded.newPage();
    await second.route('**/routed', (route) => route.fulfill({ contentType: 'text/html', body: '<title>fulfilled by the client</title>' }));
    await second.goto(siteUrl.replace(/\/[^/]*$/, '/routed'));
    seen.routed_title = await second.title();
    // A HAR recorded here, replayed from here.
    const har = path.join(outDir, 'replay.har');
    fs.writeFileSync(har, JSON.stringify({ log: { version: '1.2', creator: { name: 'flotilla-test', version: '1' }, entries: [{
      startedDateTime: new Date().toISOString(), time: 1,
      request: { method: 'GET', url: 'https://har.flotilla.invalid/page', httpVersion: 'HTTP/1.1', headers: [], queryString: [], cookies: [], headersSize: -1, bodySize: 0 },
      response: { status: 200, statusText: 'OK', httpVersion: 'HTTP/1.1', headers: [{ name: 'Content-Type', value: 'text/html' }], cookies: [], content: { size: 30, mimeType: 'text/html', text: '<title>replayed from a HAR</title>' }, redirectURL: '', headersSize: -1, bodySize: 30 },
      cache: {}, timings: { send: 0, wait: 1, receive: 0 } }] } }));
    await second.routeFromHAR(har, { url: 'https://har.flotilla.invalid/**' });
    await second.goto('https://har.flotilla.invalid/page');
    seen.har_title = await second.title();
    // A file from this disk into a file input.
    const upload = path.join(outDir, 'upload.txt');
    fs.writeFileSync(upload, 'uploaded from the client');
    await second.setContent('<input type=file id=f>');
    await second.setInputFiles('#f', upload);
    seen.uploaded = await second.evaluate(async () => { const f = document.getElementById('f').files[0]; return `${f.name}: ${await f.text()}`; });
    seen.pdf_bytes = (await second.pdf()).length;
    await second.evaluate(() => localStorage.setItem('k', 'v'));
    await recorded.addCookies([{ name: 'c', value: '1', url: siteUrl }]);
    const state = await recorded.storageState({ path: path.join(outDir, 'state.json') });
    seen.state_cookies = state.cookies.map((c) => c.name);
    const trace = path.join(outDir, 'trace.zip');
    await recorded.tracing.stop({ path: trace });
    seen.trace_bytes = fs.statSync(trace).size;
    await recorded.close();
    const video = path.join(outDir, 'video.webm');
    await second.video().saveAs(video);
    seen.video_bytes = fs.statSync(video).size;
  }
  await page.close();
} finally {
  // Disconnects: the browser is the instance's.
  await browser.close();
}
console.log(JSON.stringify(seen));
