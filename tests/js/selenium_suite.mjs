// A small Selenium suite with selenium-webdriver for JavaScript, unchanged,
// pointed at a remote URL (the API key in it, as Selenium carries it):
// navigation, elements, scripts, frames, windows, cookies, screenshots, a
// file from this machine's disk, a managed download, a CDP command and
// WebDriver BiDi console events.
// Usage: node selenium_suite.mjs <remote url> <site base url>
// Prints one JSON object of what it saw; exits non-zero on the first failure.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Builder, By, until } from 'selenium-webdriver';
import chrome from 'selenium-webdriver/chrome.js';
import remote from 'selenium-webdriver/remote/index.js';
import logInspector from 'selenium-webdriver/bidi/logInspector.js';

const [remoteUrl, site] = process.argv.slice(2);
const options = new chrome.Options();
options.addArguments('--headless=new', '--window-size=1024,768');
options.set('flotilla:options', { idle_timeout_minutes: 10 });
options.set('se:downloadsEnabled', true);
options.enableBidi();

const driver = await new Builder()
  .usingServer(remoteUrl)
  .forBrowser('chrome')
  .setChromeOptions(options)
  .build();
const seen = {};
const local = fs.mkdtempSync(path.join(os.tmpdir(), 'flotilla-selenium-'));
try {
  const session = await driver.getSession();
  seen.session = session.getId();
  seen.capabilities = Object.fromEntries(
    [...session.getCapabilities().keys()].map((key) => [key, session.getCapabilities().get(key)]),
  );
  const logs = [];
  const inspector = await logInspector(driver);
  await inspector.onConsoleEntry((entry) => logs.push(entry.text));

  await driver.get(`${site}/`);
  seen.title = await driver.getTitle();
  await driver.findElement(By.id('name')).sendKeys('Ada');
  await driver.findElement(By.css('#color option[value=blue]')).click();
  await driver.findElement(By.id('go')).click();
  seen.greeting = await driver.wait(until.elementTextContains(driver.findElement(By.id('out')), 'Hello'), 30_000)
    .then(() => driver.findElement(By.id('out')).getText());
  seen.script = await driver.executeScript('return 6 * 7');
  await driver.switchTo().frame('inner');
  seen.frame = await driver.findElement(By.css('p')).getText();
  await driver.switchTo().defaultContent();
  const first = await driver.getWindowHandle();
  await driver.switchTo().newWindow('tab');
  await driver.get(`${site}/?other`);
  seen.windows = (await driver.getAllWindowHandles()).length;
  await driver.close();
  await driver.switchTo().window(first);
  await driver.manage().addCookie({ name: 'flavour', value: 'oatmeal' });
  seen.cookie = (await driver.manage().getCookie('flavour')).value;
  const png = Buffer.from(await driver.takeScreenshot(), 'base64');
  seen.screenshot = png.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]));
  await driver.manage().window().setRect({ width: 800, height: 600 });
  const rect = await driver.manage().window().getRect();
  seen.size = { width: rect.width, height: rect.height };
  const evaluated = await driver.sendAndGetDevToolsCommand('Runtime.evaluate', {
    expression: '1 + 2',
    returnByValue: true,
  });
  seen.cdp = evaluated.result.value;
  // Selenium's DevTools API, over the session's se:cdp socket.
  const cdp = await driver.createCDPConnection('page');
  const overSeCdp = await cdp.send('Runtime.evaluate', { expression: '2 + 3', returnByValue: true });
  seen.se_cdp = overSeCdp.result.result.value;

  // A file from this machine's disk.
  const upload = path.join(local, 'upload me.txt');
  fs.writeFileSync(upload, "from the client's disk");
  driver.setFileDetector(new remote.FileDetector());
  await driver.findElement(By.id('file')).sendKeys(upload);
  seen.uploaded = await driver.executeAsyncScript(
    "const done = arguments[arguments.length - 1];" +
      "const file = document.getElementById('file').files[0];" +
      "file.text().then(text => done(file.name + ': ' + text))",
  );

  // A managed download.
  await driver.findElement(By.id('dl')).click();
  const deadline = Date.now() + 30_000;
  while (!(await driver.getDownloadableFiles()).includes('hello.txt') && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  seen.downloadable = await driver.getDownloadableFiles();
  const target = path.join(local, 'downloads') + path.sep;
  fs.mkdirSync(target);
  await driver.downloadFile('hello.txt', target);
  // selenium-webdriver unzips without waiting for its own promise.
  const extracted = path.join(target, 'hello.txt');
  const until_extracted = Date.now() + 30_000;
  while (!fs.existsSync(extracted) && Date.now() < until_extracted) {
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  await new Promise((resolve) => setTimeout(resolve, 50));
  seen.downloaded = fs.readFileSync(extracted, 'utf8');
  await driver.deleteDownloadableFiles();
  seen.after_delete = await driver.getDownloadableFiles();

  // WebDriver BiDi: a console message of the page.
  await driver.executeScript("console.log('over bidi')");
  const until_logged = Date.now() + 30_000;
  while (logs.length === 0 && Date.now() < until_logged) {
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  seen.bidi_console = logs;
  seen.url = await driver.getCurrentUrl();
} finally {
  await driver.quit();
  fs.rmSync(local, { recursive: true, force: true });
}
console.log(JSON.stringify(seen));
