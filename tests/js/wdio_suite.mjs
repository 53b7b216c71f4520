// A small suite with WebdriverIO 9, unchanged, against a remote WebDriver
// endpoint. WebdriverIO 9 asks for WebDriver BiDi by default (webSocketUrl)
// and uses it for navigation and events.
// Usage: node wdio_suite.mjs <http://host:port> <path, e.g. /wd/hub> <API key> <site base url> [chrome|firefox]
// WebdriverIO sends `user`/`key` only with the new session; the API key goes
// in `headers`, which it sends with every command.
// Prints one JSON object of what it saw; exits non-zero on the first failure.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { remote } from 'webdriverio';

const [base, hubPath, key, site, browserName = 'chrome'] = process.argv.slice(2);
const browserOptions =
  browserName === 'firefox'
    ? { 'moz:firefoxOptions': { args: ['-headless', '--width=1024', '--height=768'] } }
    : { 'goog:chromeOptions': { args: ['--headless=new', '--window-size=1024,768'] } };
const url = new URL(base);
const browser = await remote({
  protocol: url.protocol.replace(':', ''),
  hostname: url.hostname,
  port: Number(url.port),
  path: hubPath,
  headers: { Authorization: `Bearer ${key}` },
  logLevel: 'error',
  connectionRetryCount: 0,
  capabilities: {
    browserName,
    ...browserOptions,
    'se:downloadsEnabled': true,
    'flotilla:options': { idle_timeout_minutes: 10 },
  },
});
const seen = { session: browser.sessionId, capabilities: browser.capabilities };
const local = fs.mkdtempSync(path.join(os.tmpdir(), 'flotilla-wdio-'));
try {
  const logs = [];
  await browser.sessionSubscribe({ events: ['log.entryAdded'] });
  browser.on('log.entryAdded', (entry) => logs.push(entry.text));
  const navigations = [];
  await browser.sessionSubscribe({ events: ['browsingContext.load'] });
  browser.on('browsingContext.load', (event) => navigations.push(event.url));

  await browser.url(`${site}/`);
  seen.title = await browser.getTitle();
  await browser.$('#name').setValue('Ada');
  await browser.$('#color').selectByAttribute('value', 'blue');
  await browser.$('#go').click();
  await browser.$('#out').waitForDisplayed({ timeout: 30_000 });
  seen.greeting = await browser.$('#out').getText();
  seen.script = await browser.execute(() => 6 * 7);
  await browser.switchFrame(await browser.$('iframe[name=inner]'));
  seen.frame = await browser.$('p').getText();
  await browser.switchFrame(null);
  const first = await browser.getWindowHandle();
  await browser.newWindow(`${site}/?other`);
  seen.windows = (await browser.getWindowHandles()).length;
  await browser.closeWindow();
  await browser.switchToWindow(first);
  await browser.setCookies({ name: 'flavour', value: 'oatmeal' });
  seen.cookie = (await browser.getCookies(['flavour']))[0]?.value;
  const png = Buffer.from(await browser.takeScreenshot(), 'base64');
  seen.screenshot = png.subarray(0, 4).toString('latin1') === '\x89PNG';
  await browser.setWindowSize(800, 600);
  seen.size = await browser.getWindowSize();

  // A file from this machine's disk.
  const upload = path.join(local, 'upload me.txt');
  fs.writeFileSync(upload, "from the client's disk");
  const remotePath = await browser.uploadFile(upload);
  await browser.$('#file').setValue(remotePath);
  seen.uploaded = await browser.executeAsync((done) => {
    const file = document.getElementById('file').files[0];
    file.text().then((text) => done(`${file.name}: ${text}`));
  });

  // A managed download.
  await browser.$('#dl').click();
  await browser.waitUntil(async () => (await browser.getDownloadableFiles()).names.includes('hello.txt'), {
    timeout: 30_000,
  });
  seen.downloadable = (await browser.getDownloadableFiles()).names;
  await browser.downloadFile('hello.txt', local);
  seen.downloaded = fs.readFileSync(path.join(local, 'hello.txt'), 'utf8');
  await browser.deleteDownloadableFiles();

  // BiDi events.
  await browser.execute(() => console.log('over bidi'));
  await browser.waitUntil(async () => logs.length > 0, { timeout: 30_000 });
  seen.bidi_console = logs;
  seen.bidi_loads = navigations.filter((u) => u.startsWith(site)).length;
} finally {
  await browser.deleteSession();
  fs.rmSync(local, { recursive: true, force: true });
}
console.log(JSON.stringify(seen));
