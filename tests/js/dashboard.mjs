// Drives the dashboard (/ui) in headless system Chromium with Playwright:
// API key prompt, create, live status without reloading, live view frames,
// taking control of the live view (a click and typing reach a test page),
// live links (a view link cannot click, a control link can and hands back), a recorded
// instance's recording playing after a park, park, revive, delete, its kept
// recordings playing and deleted; screenshots of every page (1280x800 and a phone).
// Usage: node dashboard.mjs <control plane URL> <screenshot dir> <api key> <test page URL>
// Prints {"id": …, "errors": [console errors], "shots": [...]} as JSON.
import { chromium } from 'playwright-core';
import { mkdirSync } from 'node:fs';

const [base, shots, apiKey, testPage] = process.argv.slice(2);
mkdirSync(shots, { recursive: true });
const browser = await chromium.launch({
  executablePath: '/usr/lib/chromium/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
const errors = [];

// Waits for the live view <img> to show a frame; says what it saw otherwise.
async function liveFrames(page) {
  try {
    await page.waitForFunction(() => document.querySelector('#live-view')?.naturalWidth > 0, null, { timeout: 60_000 });
  } catch (error) {
    const seen = await page.evaluate(() => {
      const img = document.querySelector('#live-view');
      return { src: img.src, complete: img.complete, hint: document.querySelector('#live-hint').textContent,
        fields: document.querySelector('#detail-fields').textContent };
    });
    throw new Error(`no live view frame: ${JSON.stringify(seen)}`);
  }
}
const taken = [];
const T = 60_000;

// Waits until the instance list's "Driven by" cell of `id` satisfies `wanted`
// (the list refreshes itself every 10 s; the node counts clients with its
// heartbeat).
async function drivenBy(page, id, wanted) {
  const cell = page.locator(`tr[data-id="${id}"] [data-field="drivers"]`);
  const deadline = Date.now() + T;
  let text;
  while (Date.now() < deadline) {
    text = (await cell.textContent())?.trim();
    if (wanted(text)) return text;
    await page.waitForTimeout(250);
  }
  throw new Error(`the instance list's "Driven by" shows ${JSON.stringify(text)}`);
}
let shot;

// Opens the test page in the instance's tab (over CDP), takes control in the
// dashboard, clicks the page's button and types into its input through the
// live view, and checks that the page saw both.
async function takeControl(page, id) {
  const instance = await (await fetch(`${base}/v2/instances/${id}`, { headers: { Authorization: `Bearer ${apiKey}` } })).json();
  const remote = await chromium.connectOverCDP(instance.urls.debug);
  try {
    const tab = remote.contexts()[0].pages()[0];
    await tab.goto(testPage);
    await page.locator('[data-testid="tab-switcher"] option', { hasText: 'controls' }).waitFor({ state: 'attached', timeout: T });
    await page.selectOption('[data-testid="tab-switcher"]', { label: 'controls' });
    await page.click('[data-testid="take-control"]');
    await page.locator('[data-testid="control-state"].yours').waitFor({ timeout: T });
    // Where `selector` of the test page shows in `on`'s live view.
    const target = async (selector, on = page) => {
      const spot = await tab.evaluate((s) => {
        const r = document.querySelector(s).getBoundingClientRect();
        return { x: (r.x + r.width / 2) / innerWidth, y: (r.y + r.height / 2) / innerHeight };
      }, selector);
      const box = await on.locator('[data-testid="live-view"] img').boundingBox();
      return [box.x + box.width * spot.x, box.y + box.height * spot.y];
    };
    await page.mouse.click(...(await target('#b')));
    await tab.waitForFunction(() => window.clicks === 1, null, { timeout: T });
    await page.mouse.click(...(await target('#i')));
    await tab.waitForFunction(() => document.activeElement?.id === 'i', null, { timeout: T });
    await page.keyboard.type('hello');
    await tab.waitForFunction(() => document.querySelector('#i').value === 'hello', null, { timeout: T });
    await shot('live-control');
    await page.click('[data-testid="take-control"]');
    await page.locator('[data-testid="take-control"][aria-pressed="false"]').waitFor({ timeout: T });
    await liveLinks(page, id, tab, target);
  } finally {
    await remote.close();
  }
}

// Live links in their own pages (no API key): a `view` link shows the page
// but cannot click; a `control` link takes control and clicks.
async function liveLinks(page, id, tab, target) {
  const link = async (mode) => {
    const answer = await fetch(`${base}/v2/instances/${id}/live`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${apiKey}`, 'content-type': 'application/json' },
      body: JSON.stringify({ mode, ttl_sec: 600 }),
    });
    if (answer.status !== 201) throw new Error(`live link: ${answer.status} ${await answer.text()}`);
    return (await answer.json()).url;
  };
  const open = async (mode) => {
    const viewer = await page.context().newPage();
    viewer.on('pageerror', (e) => errors.push(String(e)));
    viewer.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
    await viewer.goto(await link(mode));
    await viewer.waitForFunction(() => document.querySelector('[data-testid="live-view"] img')?.naturalWidth > 0, null, { timeout: T });
    return viewer;
  };
  const watcher = await open('view');
  await watcher.locator('[data-testid="control-state"]', { hasText: 'View only' }).waitFor({ timeout: T });
  if (await watcher.locator('[data-testid="take-control"]').isVisible()) throw new Error('a view link offers control');
  await watcher.mouse.click(...(await target('#b', watcher)));
  const driver = await open('control');
  await driver.click('[data-testid="take-control"]');
  await driver.locator('[data-testid="control-state"].yours').waitFor({ timeout: T });
  await driver.mouse.click(...(await target('#b', driver)));
  await tab.waitForFunction(() => window.clicks >= 2, null, { timeout: T });
  const clicks = await tab.evaluate(() => window.clicks);
  if (clicks !== 2) throw new Error(`the view link clicked: ${clicks} clicks`);
  await shot('live-link');
  // Done: the control link's person hands the browser back, and the link ends.
  if (await watcher.locator('[data-testid="hand-back"]').isVisible()) throw new Error('a view link offers to hand back');
  await driver.click('[data-testid="hand-back"]');
  await driver.locator('[data-testid="control-state"]', { hasText: 'Handed back' }).waitFor({ timeout: T });
  const ended = await fetch(driver.url());
  if (ended.status !== 404) throw new Error(`a handed-back link still answers ${ended.status}`);
  await watcher.close();
  await driver.close();
}
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const page = await context.newPage();
  page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
  page.on('pageerror', (e) => errors.push(String(e)));
  page.on('dialog', (d) => d.accept());
  page.on('response', (r) => console.error(`response ${r.status()} ${r.url()}`));
  page.on('requestfailed', (r) => console.error(`failed ${r.url()} ${r.failure()?.errorText}`));
  shot = async (name) => { const path = `${shots}/${name}.png`; await page.screenshot({ path, fullPage: true }); taken.push(path); };

  await page.goto(`${base}/ui`);
  if (apiKey) {
    await page.locator('#key-dialog[open]').waitFor({ timeout: T });
    await shot('api-key');
    await page.fill('#key-input', apiKey);
    await page.click('#key-form button[type=submit]');
  }
  await page.locator('#live.on').waitFor({ timeout: T });
  await shot('instances-empty');

  // Recorded, and kept: the detail lists the recording and plays it; after
  // the delete, the Recordings view plays and deletes what was kept.
  await page.check('#create-keep');
  await page.click('#create-button');
  const row = page.locator('#instances tbody tr').first();
  await row.waitFor({ timeout: T });
  const id = await row.getAttribute('data-id');
  // Turns running through the event stream: no reload, no polling.
  await page.locator(`tr[data-id="${id}"] [data-status="running"]`).waitFor({ timeout: T });
  await shot('instances');

  await page.click(`tr[data-id="${id}"] a`);
  await liveFrames(page);
  const liveSrc = await page.getAttribute('#live-view', 'data-src');
  if (!liveSrc.startsWith(`ws://${new URL(base).host}/v2/instances/${id}/stream/ws?token=flt_`)) {
    throw new Error(`the live view does not come through the front door: ${liveSrc}`);
  }
  await takeControl(page, id);
  const snippet = await page.textContent('#snippet');
  // Through the front door of the dashboard's own origin, with the token.
  const doorUrl = `ws://${new URL(base).host}/v2/instances/${id}/cdp?token=flt_`;
  if (!snippet.includes(doorUrl)) throw new Error(`snippet lacks the door's debug URL ${doorUrl}: ${snippet}`);
  await page.click('[data-snippet="puppeteer"]');
  if (!(await page.textContent('#snippet')).includes('browserWSEndpoint')) throw new Error('no Puppeteer snippet');
  // Every door, each with this instance's own URLs where it attaches to one.
  const doors = {
    'playwright-connect': `chromium.connect('ws://${new URL(base).host}/v2/instances/${id}/playwright?token=flt_`,
    'selenium-python': `webdriver.Remote("${base}/wd/hub"`,
    'selenium-js': `usingServer('${base}/wd/hub')`,
    webdriverio: "path: '/wd/hub'",
    mcp: `"url": "${base}/mcp"`,
    action: `${base}/v2/actions/screenshot`,
  };
  for (const [door, expected] of Object.entries(doors)) {
    await page.click(`[data-snippet="${door}"]`);
    const shown = await page.textContent('#snippet');
    if (!shown.includes(expected)) throw new Error(`the ${door} snippet lacks ${expected}: ${shown}`);
  }
  const image = await page.textContent(`tr[data-id="${id}"] [data-field="image"]`);
  if (!image || image === '—') throw new Error(`the instance list shows no image: ${image}`);

  // A page the egress policy refuses (the control plane's own loopback
  // address): the live view says which address and what opens it.
  const instance = await (await fetch(`${base}/v2/instances/${id}`, { headers: { Authorization: `Bearer ${apiKey}` } })).json();
  const remote = await chromium.connectOverCDP(instance.urls.debug);
  try {
    const refusedTab = await remote.contexts()[0].newPage();
    const refused = await refusedTab.goto(`${base}/health`).then(() => null, (error) => error.message);
    if (!refused?.includes('ERR_SOCKS_CONNECTION_FAILED')) throw new Error(`the loopback page was not refused: ${refused}`);
    await refusedTab.close();
    // While this client is connected, the list says a CDP client drives it.
    await drivenBy(page, id, (text) => text.includes('CDP'));
  } finally {
    await remote.close();
  }
  await drivenBy(page, id, (text) => text === '—');
  const notice = page.locator('#egress-refused');
  await notice.waitFor({ state: 'visible', timeout: T });
  const said = await notice.textContent();
  const address = new URL(base).host;
  if (!said.includes(address) || !said.includes('[agent.egress] allow') || !said.includes('loopback')) {
    throw new Error(`the live view does not name the refused address and the setting: ${said}`);
  }
  await shot('instance-detail');

  await page.click(`#detail-actions button[aria-label="Park ${id}"]`);
  await page.locator('#detail-fields [data-status="dormant"]').waitFor({ timeout: T });
  const video = page.locator('[data-testid="recordings"] video').first();
  await video.waitFor({ timeout: T });
  await page.waitForFunction(() => {
    const v = document.querySelector('[data-testid="recordings"] video');
    return v && v.readyState >= 1 && v.duration > 0 && v.videoWidth > 0;
  }, null, { timeout: T }).catch(async () => {
    const seen = await page.evaluate(() => { const v = document.querySelector('[data-testid="recordings"] video');
      return { src: v?.src, readyState: v?.readyState, error: v?.error?.message, code: v?.error?.code }; });
    throw new Error(`the recording does not play: ${JSON.stringify(seen)}`);
  });
  await shot('instance-dormant');
  await page.click(`#detail-actions button[aria-label="Revive ${id}"]`);
  await page.locator('#detail-fields [data-status="running"]').waitFor({ timeout: T });
  await liveFrames(page);

  for (const view of ['nodes', 'metrics', 'alerts']) {
    await page.click(`nav a[data-view="${view}"]`);
    await page.locator(`#view-${view}:not([hidden])`).waitFor({ timeout: T });
    if (view === 'nodes') await page.locator('#nodes .node').first().waitFor({ timeout: T });
    if (view === 'metrics') await page.locator('#metric-cards .stat').first().waitFor({ timeout: T });
    await shot(view);
  }

  await page.click(`nav a[data-view="instances"]`);
  await page.click(`tr[data-id="${id}"] button[aria-label="Delete ${id}"]`);
  await page.locator(`tr[data-id="${id}"]`).waitFor({ state: 'detached', timeout: T });
  await shot('instances-after-delete');

  await page.click('nav a[data-view="recordings"]');
  const kept = page.locator('[data-testid="kept-recordings"] li');
  await kept.first().waitFor({ timeout: T });
  const keptBefore = await kept.count();
  const first = kept.first();
  if (!(await first.textContent()).includes(id)) throw new Error(`the kept recording does not name ${id}`);
  await first.locator('button', { hasText: 'Play' }).click();
  await page.waitForFunction(() => {
    const v = document.querySelector('[data-testid="kept-recordings"] video');
    return v && v.readyState >= 1 && v.duration > 0 && v.videoWidth > 0;
  }, null, { timeout: T }).catch(async () => {
    const seen = await page.evaluate(() => { const v = document.querySelector('[data-testid="kept-recordings"] video');
      return { src: v?.src, readyState: v?.readyState, error: v?.error?.message }; });
    throw new Error(`the kept recording does not play: ${JSON.stringify(seen)}`);
  });
  await shot('recordings');
  await first.locator('button', { hasText: 'Delete' }).click();
  await page.waitForFunction((before) => document.querySelectorAll('[data-testid="kept-recordings"] li').length === before - 1,
    keptBefore, { timeout: T });

  await page.setViewportSize({ width: 390, height: 844 });
  await shot('phone');
  console.log(JSON.stringify({ id, errors, shots: taken }));
} finally {
  await browser.close();
}
