// Playwright's own protocol against connectOverCDP on the same instance
// (issue 29), for playwright_bench: rounds of connect → newPage → goto a
// local page → title → disconnect, interleaved; a page.evaluate round trip
// on one open connection each way; and the memory of the instance's
// Playwright server with 1 and with 10 connected clients.
//
// Usage: node playwright_protocol.mjs '<json>' with {playwright, debug, url,
// rounds, evaluations, direct: {playwright, debug}, raw: {playwright,
// headers, debug, server_pid}}. Prints one JSON
// object.
import { createRequire } from 'node:module';
import fs from 'node:fs';

const require = createRequire(new URL('../../tests/js/package.json', import.meta.url));
const { chromium } = require('playwright-core');
const options = JSON.parse(process.argv[2]);
const now = () => performance.now();

const ways = {
  connect: () => chromium.connect(options.playwright, { timeout: 60_000 }),
  cdp: () => chromium.connectOverCDP(options.debug, { timeout: 60_000 }),
  // The instance's own ports, past the front door.
  port_connect: () => chromium.connect(options.direct.playwright, { timeout: 60_000 }),
  port_cdp: () => chromium.connectOverCDP(options.direct.debug, { timeout: 60_000 }),
  // The baseline: the same server program beside a Chromium started by
  // hand, each reached directly (no Flotilla in the way).
  raw_connect: () => chromium.connect(options.raw.playwright, { headers: options.raw.headers, timeout: 60_000 }),
  raw_cdp: () => chromium.connectOverCDP(options.raw.debug, { timeout: 60_000 }),
};

async function round(way) {
  const t0 = now();
  const browser = await ways[way]();
  const t1 = now();
  const page = await browser.contexts()[0].newPage();
  const t2 = now();
  await page.goto(options.url);
  const t3 = now();
  await page.title();
  const t4 = now();
  await page.close();
  await browser.close();
  return { connect: t1 - t0, new_page: t2 - t1, goto: t3 - t2, title: t4 - t3, total: t4 - t0 };
}

async function evaluations(way) {
  const browser = await ways[way]();
  const page = await browser.contexts()[0].newPage();
  await page.goto(options.url);
  for (let i = 0; i < 20; i++) await page.evaluate(() => 1);
  const samples = [];
  for (let i = 0; i < options.evaluations; i++) {
    const t0 = now();
    await page.evaluate(() => 1);
    samples.push(now() - t0);
  }
  await page.close();
  await browser.close();
  return samples;
}

// The Playwright servers (Node, with the agent's x-flotilla-cdp on their
// command line): their RSS and PSS in MiB.
function serverMemory() {
  const servers = [];
  for (const pid of fs.readdirSync('/proc').filter((name) => /^\d+$/.test(name))) {
    let cmdline;
    try { cmdline = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8'); } catch { continue; }
    const program = cmdline.split('\0')[0];
    // Node running the server program; not this client, not the baseline's.
    if (!program.endsWith('node') || !cmdline.includes('x-flotilla-cdp')) continue;
    if (Number(pid) === process.pid || Number(pid) === options.raw.server_pid) continue;
    const field = (text, name) => Number((text.match(new RegExp(`^${name}:\\s+(\\d+)`, 'm')) || [0, 0])[1]) / 1024;
    try {
      servers.push({
        rss_mib: field(fs.readFileSync(`/proc/${pid}/status`, 'utf8'), 'VmRSS'),
        pss_mib: field(fs.readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8'), 'Pss'),
      });
    } catch { /* ended meanwhile */ }
  }
  return servers;
}

const results = { connect: [], cdp: [] };
// One warm-up of each (the first connect() starts the server).
const first = now();
await round('connect');
results.first_connect_ms = now() - first;
await round('cdp');
for (let i = 0; i < options.rounds; i++) {
  for (const way of i % 2 ? ['cdp', 'connect'] : ['connect', 'cdp']) results[way].push(await round(way));
}
results.evaluate = {};
for (const way of ['connect', 'cdp', 'port_connect', 'port_cdp', 'raw_connect', 'raw_cdp']) results.evaluate[way] = await evaluations(way);

const held = [await ways.connect()];
await (await held[0].contexts()[0].newPage()).goto(options.url);
results.memory_1 = serverMemory();
for (let i = 1; i < 10; i++) {
  const browser = await ways.connect();
  await (await browser.contexts()[0].newPage()).goto(options.url);
  held.push(browser);
}
results.memory_10 = serverMemory();
for (const browser of held) await browser.close();
console.log(JSON.stringify(results));
