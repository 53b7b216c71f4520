// The checks scripts/image-test runs against the image's three containers,
// from outside them, through the front door only: Playwright's
// connectOverCDP and chromium.connect(), a Selenium session through /wd/hub,
// Firefox (Puppeteer over WebDriver BiDi, and a Selenium session on
// geckodriver), a cookie kept across park and revive, the egress policy refusing the node's
// loopback, and the browser's view of the filesystem (confined: none of the
// agent container's files). Leaves one instance running and prints its id
// ("kept instance <id>") for the host-side checks.
// Env: FLOTILLA_URL, FLOTILLA_API_KEY, FLOTILLA_LOOPBACK_URL (a URL on the
// node's loopback that the policy must refuse).
import { chromium } from 'playwright-core';
import puppeteer from 'puppeteer-core';
import { Builder } from 'selenium-webdriver';
import chrome from 'selenium-webdriver/chrome.js';
import firefox from 'selenium-webdriver/firefox.js';

const base = process.env.FLOTILLA_URL;
const key = process.env.FLOTILLA_API_KEY;
const loopback = process.env.FLOTILLA_LOOPBACK_URL;
const headers = { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' };

async function api(method, path, body) {
  const response = await fetch(`${base}${path}`, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  if (!response.ok) throw new Error(`${method} ${path}: ${response.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

async function until(what, probe, seconds = 120) {
  const deadline = Date.now() + seconds * 1000;
  let last;
  while (Date.now() < deadline) {
    try {
      const value = await probe();
      if (value) return value;
    } catch (error) {
      last = error;
    }
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  throw new Error(`${what} within ${seconds} s (last: ${last})`);
}

async function running(id) {
  return until(`instance ${id} running`, async () => {
    const instance = await api('GET', `/v2/instances/${id}`);
    return instance.status === 'running' && instance;
  });
}

function ok(line) {
  console.log(`ok: ${line}`);
}

// Playwright over CDP: the browser sees none of the container's files, and
// the egress policy refuses the node's loopback.
const first = await running((await api('POST', '/v2/instances', {})).id);
if (!first.urls.debug.startsWith(base.replace('http', 'ws'))) {
  throw new Error(`urls.debug is not through the front door: ${first.urls.debug}`);
}
let browser = await chromium.connectOverCDP(first.urls.debug);
let context = browser.contexts()[0];
const page = await context.newPage();
await page.goto('file:///etc/passwd');
const passwd = await page.textContent('body');
if (!passwd.includes('flotilla-browser') || /^flotilla:/m.test(passwd)) {
  throw new Error(`the browser sees the container's /etc/passwd:\n${passwd}`);
}
for (const hidden of ['file:///var/lib/flotilla/', 'file:///var/lib/flotilla/agent/sandbox-etc/passwd', 'file:///etc/flotilla/flotilla.toml']) {
  const seen = await page.goto(hidden).then(() => 'opened', (error) => error.message);
  if (seen === 'opened' || !/ERR_FILE_NOT_FOUND/.test(seen)) {
    throw new Error(`the browser reaches ${hidden}: ${seen}`);
  }
}
// The machine-wide files a container runtime masks read as empty in the
// browser's own /proc too.
for (const masked of ['file:///proc/timer_list', 'file:///proc/keys', 'file:///proc/sched_debug']) {
  // An error page (the empty file bound over it is not the browser's to
  // read) or an empty page; never the machine's timers or keys, nor a download.
  const seen = await page.goto(masked).then(() => page.textContent('body'), (error) => error);
  const readable = seen instanceof Error ? /Download is starting/.test(seen.message) : seen.trim() !== '';
  if (readable) throw new Error(`${masked} is readable in the browser: ${String(seen).slice(0, 200)}`);
}
ok('connectOverCDP through the front door; the browser sees only its sandbox (none of the container’s data or configuration; the masked /proc files empty)');
const refused = await page.goto(loopback).then(() => null, (error) => error.message);
if (!refused) throw new Error(`the browser reached the node's loopback ${loopback}`);
ok(`the egress policy refuses the node's loopback (${refused.split('\n')[0]})`);

// A cookie across park and revive.
await context.addCookies([{ name: 'kept', value: 'across-revive', domain: 'example.com', path: '/' }]);
await browser.close();
await api('POST', `/v2/instances/${first.id}/dormant`);
await until('the instance parked', async () => (await api('GET', `/v2/instances/${first.id}`)).status === 'dormant');
await api('POST', `/v2/instances/${first.id}/revive`);
const revived = await running(first.id);
browser = await chromium.connectOverCDP(revived.urls.debug);
context = browser.contexts()[0];
const cookies = await context.cookies('https://example.com/');
if (!cookies.some((cookie) => cookie.name === 'kept' && cookie.value === 'across-revive')) {
  throw new Error(`the cookie did not survive park and revive: ${JSON.stringify(cookies)}`);
}
await browser.close();
ok('a cookie kept across park and revive');

// Playwright's own protocol: chromium.connect().
const second = await running((await api('POST', '/v2/instances', {})).id);
const connected = await chromium.connect(second.urls.playwright);
const playwrightPage = await (await connected.newContext()).newPage();
await playwrightPage.setContent('<title>connect</title>');
if ((await playwrightPage.title()) !== 'connect') throw new Error('chromium.connect() page');
await connected.close();
await api('DELETE', `/v2/instances/${second.id}`);
ok('chromium.connect() through the front door');

// Selenium through /wd/hub, the API key as Selenium carries it.
const hub = new URL('/wd/hub', base);
hub.username = 'flotilla';
hub.password = key;
const options = new chrome.Options();
options.addArguments('--headless=new');
const driver = await new Builder().usingServer(hub.href).forBrowser('chrome').setChromeOptions(options).build();
try {
  await driver.get('data:text/html,<title>selenium</title>');
  const title = await driver.getTitle();
  if (title !== 'selenium') throw new Error(`Selenium title ${title}`);
} finally {
  await driver.quit();
}
ok('a Selenium session through /wd/hub');

// Firefox: Puppeteer over WebDriver BiDi through the door, and Selenium on
// the node's geckodriver.
const fox = await running((await api('POST', '/v2/instances', { image: 'firefox' })).id);
const bidi = await puppeteer.connect({ browserWSEndpoint: fox.urls.bidi, protocol: 'webDriverBiDi' });
try {
  const foxPage = await bidi.newPage();
  await foxPage.setContent('<title>firefox in the image</title>');
  const title = await foxPage.title();
  if (title !== 'firefox in the image') throw new Error(`Firefox title ${title}`);
} finally {
  await bidi.disconnect();
}
await api('DELETE', `/v2/instances/${fox.id}`);
const foxOptions = new firefox.Options();
foxOptions.addArguments('-headless');
const foxDriver = await new Builder().usingServer(hub.href).forBrowser('firefox').setFirefoxOptions(foxOptions).build();
try {
  await foxDriver.executeScript("document.title = 'geckodriver'");
  const title = await foxDriver.getTitle();
  if (title !== 'geckodriver') throw new Error(`geckodriver title ${title}`);
} finally {
  await foxDriver.quit();
}
ok('Firefox: Puppeteer over WebDriver BiDi and a Selenium session on geckodriver, through the front door');
console.log(`kept instance ${first.id}`);
