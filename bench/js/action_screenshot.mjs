// A screenshot of a local page as a script gets it (issue 30), for
// actions_bench: `POST /v2/actions/screenshot` on Flotilla against
// `puppeteer.launch` + newPage + goto + screenshot + close of the same
// Chromium, interleaved round by round (after one warm-up round of each, not
// counted); then throughput with `concurrency` clients each way.
//
// Usage: node action_screenshot.mjs '<json>' with {api, key, url, rounds,
// chromium, concurrency, jobs}. Prints one JSON object: per-round
// milliseconds of each way, and each way's throughput run.
import { createRequire } from 'node:module';

const require = createRequire(new URL('../../tests/js/package.json', import.meta.url));
const puppeteer = require('puppeteer-core');

const options = JSON.parse(process.argv[2]);
const now = () => performance.now();

function assertPng(bytes) {
  const signature = [0x89, 0x50, 0x4e, 0x47];
  if (!signature.every((b, i) => bytes[i] === b)) throw new Error('not a PNG');
}

async function viaAction() {
  const started = now();
  const response = await fetch(`${options.api}/v2/actions/screenshot`, {
    method: 'POST',
    headers: { authorization: `Bearer ${options.key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ url: options.url }),
  });
  const bytes = new Uint8Array(await response.arrayBuffer());
  if (!response.ok) throw new Error(`action: ${response.status} ${new TextDecoder().decode(bytes)}`);
  assertPng(bytes);
  return now() - started;
}

async function viaLaunch() {
  const started = now();
  const browser = await puppeteer.launch({
    executablePath: options.chromium,
    headless: true,
    args: ['--no-sandbox'],
    protocolTimeout: 60_000,
  });
  try {
    const page = await browser.newPage();
    await page.setViewport({ width: 1280, height: 720 });
    await page.goto(options.url, { timeout: 60_000 });
    assertPng(await page.screenshot());
  } finally {
    await browser.close();
  }
  return now() - started;
}

async function throughput(job) {
  let next = 0;
  const started = now();
  const client = async () => {
    while (next < options.jobs) {
      next++;
      await job();
    }
  };
  await Promise.all(Array.from({ length: options.concurrency }, client));
  const seconds = (now() - started) / 1000;
  return { jobs: options.jobs, seconds, per_second: options.jobs / seconds };
}

await viaAction();
await viaLaunch();
const results = { action: [], launch: [] };
for (let round = 0; round < options.rounds; round++) {
  const order = round % 2 === 0 ? ['action', 'launch'] : ['launch', 'action'];
  for (const way of order) results[way].push(way === 'action' ? await viaAction() : await viaLaunch());
  console.error(`round ${round + 1} of ${options.rounds}`);
}
results.throughput_action = await throughput(viaAction);
results.throughput_launch = await throughput(viaLaunch);
console.log(JSON.stringify(results));
