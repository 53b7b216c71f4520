// A Playwright client of any installed version (its playwright-core folder
// is the first argument) that names paths on the server's side through the
// raw protocol, as Playwright's own client never would: upload file names
// that climb out of the upload's folder (Playwright 1.60 joined them
// unchecked), names that would crash the server, local paths outside the
// uploads, a recorder's output file, a request context's traces folder, a
// context's video folder. Then a real directory upload with sub-folders,
// which must keep working. Prints what each attempt got as JSON.
// Usage: node playwright_paths.mjs <playwright-core dir> <ws url> <headers JSON>
import { createRequire } from 'node:module';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const [core, wsUrl, headersJson] = process.argv.slice(2);
const require = createRequire(path.join(core, 'package.json'));
const { chromium } = require(core);
const browser = await chromium.connect(wsUrl, { headers: JSON.parse(headersJson), timeout: 60_000 });
const seen = {};
const outcome = async (attempt) => {
  try {
    return `ok: ${JSON.stringify(await attempt())}`.slice(0, 300);
  } catch (error) {
    return `error: ${String(error.message).split('\n')[0]}`;
  }
};
try {
  const context = browser.contexts()[0];
  const page = await context.newPage();
  await page.setContent('<input type=file id=one><input type=file id=dir webkitdirectory>');
  const channel = context._channel;
  const now = Date.now();
  // Each attempt writes through the stream it got, as the did.
  const plant = async (items, rootDirName) => {
    const { writableStreams } = await channel.createTempFiles({ rootDirName, items });
    for (const stream of writableStreams) {
      await stream._channel.write({ binary: Buffer.from('planted by a client') });
      await stream._channel.close();
    }
    return writableStreams.length;
  };
  for (const depth of [2, 3, 4, 5, 6]) {
    const name = `${'../'.repeat(depth)}downloads/evil-${depth}.txt`;
    seen[`climb_${depth}`] = await outcome(() => plant([{ name, lastModifiedMs: now }]));
  }
  seen.climb_profile = await outcome(() => plant([{ name: '../../../../profile/Default/evil.txt', lastModifiedMs: now }]));
  seen.absolute = await outcome(() => plant([{ name: '/tmp/evil.txt', lastModifiedMs: now }]));
  // Names that crashed the server: empty, '.', and too long in bytes.
  seen.empty_name = await outcome(() => plant([{ name: '', lastModifiedMs: now }]));
  seen.dot_name = await outcome(() => plant([{ name: '.', lastModifiedMs: now }]));
  seen.long_name = await outcome(() => plant([{ name: 'é'.repeat(200), lastModifiedMs: now }]));
  seen.root_dot_dot = await outcome(() => plant([{ name: 'a.txt', lastModifiedMs: now }], '..'));
  // A second server for this browser, without Flotilla's door.
  seen.start_server = await outcome(() => browser._channel.startServer({ title: 'x', host: '0.0.0.0', port: 0 }));
  seen.local_directory = await outcome(() => page.mainFrame()._channel.setInputFiles({ selector: '#dir', localDirectory: '/instance', timeout: 10_000 }));
  seen.root_dir = await outcome(() => plant([{ name: 'a.txt', lastModifiedMs: now }], '../evil-root'));
  seen.twice = await outcome(() => plant([{ name: 'a.txt', lastModifiedMs: now }, { name: 'a.txt', lastModifiedMs: now }]));
  seen.file_in_file = await outcome(() => plant([{ name: 'a', lastModifiedMs: now }, { name: 'a/b.txt', lastModifiedMs: now }]));
  seen.local_paths = await outcome(() => page.mainFrame()._channel.setInputFiles({ selector: '#one', localPaths: ['/etc/hostname'], timeout: 10_000 }));
  // enableRecorder until 1.63, showRecorder from 1.64.
  const recorder = channel.enableRecorder ? 'enableRecorder' : 'showRecorder';
  seen.recorder = await outcome(() => channel[recorder]({ outputFile: '/instance/profile/recorded.js' }));
  // The server's Playwright object (the library's own `_playwright` here is
  // an in-process one), among the connection's objects.
  const remote = [...browser._connection._objects.values()].find((o) => o._type === 'Playwright');
  seen.request_traces = await outcome(() => {
    if (remote?._type !== 'Playwright')
      throw new Error(`not the server's Playwright: ${remote?._type}`);
    return remote._channel.newRequest({ tracesDir: '/instance/profile' });
  });
  // Taken, with its folder dropped: videos stay in the server's artifacts.
  seen.video_dir = await outcome(async () => {
    const { context: made } = await browser._channel.newContextForReuse({ recordVideo: { dir: '/instance/profile/videos-evil' } });
    return Boolean(made);
  });
  // What Playwright's client sends for a folder: names with sub-folders.
  const folder = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'flotilla-')), 'upload-dir');
  fs.mkdirSync(folder);
  fs.mkdirSync(path.join(folder, 'sub'));
  fs.writeFileSync(path.join(folder, 'a.txt'), 'a');
  fs.writeFileSync(path.join(folder, 'sub', 'b.txt'), 'bb');
  seen.folder_upload = await outcome(async () => {
    await page.setInputFiles('#dir', folder);
    return page.evaluate(() => [...document.getElementById('dir').files].map((f) => `${f.webkitRelativePath}:${f.size}`).sort());
  });
  fs.rmSync(path.dirname(folder), { recursive: true, force: true });
  seen.server_alive = await outcome(() => page.evaluate(() => 1 + 1));
  await page.close();
} finally {
  await browser.close();
}
console.log(JSON.stringify(seen));
