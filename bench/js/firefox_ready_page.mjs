// Firefox instances as clients see them (issue 47), for firefox_bench:
// - a ready page: create (warm pool), puppeteer.connect to urls.bidi over
//   WebDriver BiDi, newPage, goto a local page, title; against Firefox
//   launched here (`firefox-esr --headless`, as root, its own profile) and
//   driven the same way, and a Chromium instance of the same build over CDP;
// - park and revive: an instance with a page and a cookie, `POST …/dormant`
//   timed, then `POST …/revive {"method": "full_restore"}` timed until it
//   runs, per image.
//
// Usage: node firefox_ready_page.mjs '<json>' with {api, key, rounds,
// firefox, page_port}. Every kind takes its turn in each round, after one
// warm-up round (not counted). Prints one JSON object of per-round
// milliseconds.
import { spawn } from 'node:child_process';
import { createServer } from 'node:http';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createRequire } from 'node:module';

const require = createRequire(new URL('../../tests/js/package.json', import.meta.url));
const puppeteer = require('puppeteer-core');

const options = JSON.parse(process.argv[2]);
const now = () => performance.now();
const site = createServer((_, response) => {
  response.setHeader('content-type', 'text/html');
  response.end('<title>ready</title><p>hello</p>');
});
await new Promise((resolve) => site.listen(options.page_port, '127.0.0.1', resolve));
const PAGE = `http://127.0.0.1:${options.page_port}/`;

async function api(method, path, body) {
  const response = await fetch(options.api + path, {
    method,
    headers: { authorization: `Bearer ${options.key}`, 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  if (!response.ok) throw new Error(`${method} ${path}: ${response.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

const protocolOf = (image) => (image === 'firefox' ? 'webDriverBiDi' : 'cdp');
const endpointOf = (created, image) => (image === 'firefox' ? created.urls.bidi : created.urls.debug);

/// connect, newPage, goto, title: milliseconds of each.
async function readyPage(endpoint, protocol) {
  const times = {};
  let started = now();
  const browser = await puppeteer.connect({ browserWSEndpoint: endpoint, protocol, protocolTimeout: 60_000 });
  times.connect = now() - started;
  try {
    started = now();
    const page = await browser.newPage();
    times.newPage = now() - started;
    started = now();
    await page.goto(PAGE, { timeout: 60_000 });
    times.goto = now() - started;
    started = now();
    const title = await page.title();
    times.title = now() - started;
    if (title !== 'ready') throw new Error(`title ${title}`);
    await page.close();
  } finally {
    await browser.disconnect();
  }
  return times;
}

/// A create that took a warm browser: one that did not (the pool still
/// refilling) is deleted, counted, and tried again.
let coldCreates = 0;
async function createWarm(image) {
  for (let attempt = 0; attempt < 100; attempt++) {
    const started = now();
    const created = await api('POST', '/v2/instances', { image });
    const answer = now() - started;
    if (created.status === 'running') return { created, answer };
    coldCreates++;
    await api('DELETE', `/v2/instances/${created.id}`);
    await new Promise((r) => setTimeout(r, 500));
  }
  throw new Error(`no warm ${image} browser in 100 attempts`);
}

async function flotilla(image) {
  const { created, answer } = await createWarm(image);
  try {
    return { answer, ...(await readyPage(endpointOf(created, image), protocolOf(image))) };
  } finally {
    await api('DELETE', `/v2/instances/${created.id}`);
  }
}

/// firefox-esr spawned here; `launch` is spawn → its "WebDriver BiDi
/// listening" line.
async function rawFirefox() {
  const profile = mkdtempSync(join(tmpdir(), 'firefox-ready-'));
  const started = now();
  const child = spawn(options.firefox, ['--headless', '--no-remote', '--profile', profile, '--remote-debugging-port=0', 'about:blank'], {
    stdio: ['ignore', 'ignore', 'pipe'],
    detached: true,
    env: { ...process.env, HOME: profile, MOZ_CRASHREPORTER_DISABLE: '1' },
  });
  try {
    const port = await new Promise((resolve, reject) => {
      let seen = '';
      const timer = setTimeout(() => reject(new Error(`no BiDi line: ${seen}`)), 30_000);
      child.stderr.on('data', (chunk) => {
        seen += chunk;
        const match = seen.match(/WebDriver BiDi listening on ws:\/\/[^:]+:(\d+)/);
        if (match) {
          clearTimeout(timer);
          resolve(match[1]);
        }
      });
      child.on('exit', (code) => reject(new Error(`firefox exited ${code}: ${seen}`)));
    });
    const launch = now() - started;
    return { launch, ...(await readyPage(`ws://127.0.0.1:${port}/session`, 'webDriverBiDi')) };
  } finally {
    try { process.kill(-child.pid, 'SIGKILL'); } catch {}
    await new Promise((resolve) => (child.exitCode !== null ? resolve() : child.on('exit', resolve)));
    rmSync(profile, { recursive: true, force: true });
  }
}

async function waitRunning(id) {
  for (;;) {
    const instance = await api('GET', `/v2/instances/${id}`);
    if (instance.status === 'running') return;
    if (['failed', 'stopped'].includes(instance.status)) throw new Error(`instance ${id} ${instance.status}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/// An instance with a page and a cookie, parked and revived (full_restore).
async function parkRevive(image) {
  const { created } = await createWarm(image);
  try {
    const browser = await puppeteer.connect({ browserWSEndpoint: endpointOf(created, image), protocol: protocolOf(image), protocolTimeout: 60_000 });
    const page = await browser.newPage();
    await page.goto(PAGE, { timeout: 60_000 });
    await page.setCookie({ name: 'kept', value: 'yes', url: PAGE });
    await browser.disconnect();
    let started = now();
    await api('POST', `/v2/instances/${created.id}/dormant`);
    const park = now() - started;
    started = now();
    await api('POST', `/v2/instances/${created.id}/revive`, { method: 'full_restore' });
    await waitRunning(created.id);
    const revive = now() - started;
    return { park, revive };
  } finally {
    await api('DELETE', `/v2/instances/${created.id}`);
  }
}

async function round(results) {
  results.firefox.push(await flotilla('firefox'));
  results.raw_firefox.push(await rawFirefox());
  results.chromium.push(await flotilla('chromium'));
  for (const image of ['firefox', 'chromium']) results.park_revive[image].push(await parkRevive(image));
}

const fresh = () => ({ firefox: [], raw_firefox: [], chromium: [], park_revive: { firefox: [], chromium: [] } });
await round(fresh());
coldCreates = 0;
const results = fresh();
for (let index = 0; index < options.rounds; index++) {
  await round(results);
  console.error(`round ${index + 1} of ${options.rounds}`);
}
results.cold_creates = coldCreates;
site.close();
console.log(JSON.stringify(results));
