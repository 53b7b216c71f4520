// A ready page as a Puppeteer client sees it (issue 32), for ready_page_bench:
// Flotilla (create, connect to urls.debug, newPage, goto a data: page, title)
// interleaved with raw Chromium launched here (as root with --no-sandbox, and
// as an unprivileged user in its own sandbox), and the same Flotilla instance
// reached through the front door and through its own port.
//
// Usage: node ready_page.mjs '<json>' with {builds: [{name, api}], key,
// rounds, chromium, flags}; every build and both raw launches take turns in
// each round, after one warm-up round of each (not counted). Prints one JSON
// object of per-round milliseconds.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, chownSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createRequire } from 'node:module';

const require = createRequire(new URL('../../tests/js/package.json', import.meta.url));
const puppeteer = require('puppeteer-core');

const options = JSON.parse(process.argv[2]);
const PAGE = 'data:text/html,<title>ready</title><p>hello</p>';
const now = () => performance.now();

async function api(base, method, path, body) {
  const response = await fetch(base + path, {
    method,
    headers: { authorization: `Bearer ${options.key}`, 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  if (!response.ok) throw new Error(`${method} ${path}: ${response.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

/// connect, newPage, goto, title on `endpoint`: milliseconds of each.
async function readyPage(endpoint) {
  const times = {};
  let started = now();
  const browser = await puppeteer.connect({ browserWSEndpoint: endpoint, protocolTimeout: 60_000 });
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

async function flotilla(base) {
  const { created, answer } = await createWarm(base);
  try {
    return { answer, ...(await readyPage(created.urls.debug)) };
  } finally {
    await api(base, 'DELETE', `/v2/instances/${created.id}`);
  }
}

/// Chromium spawned here with a DevTools port; `launch` is spawn → its
/// "DevTools listening" line. As root (`--no-sandbox`) or as nobody.
async function raw(unprivileged) {
  const profile = mkdtempSync(join(tmpdir(), 'ready-page-'));
  const args = [...options.flags, `--user-data-dir=${profile}/p`, '--remote-debugging-port=0', 'about:blank'];
  let command = options.chromium;
  let argv = args;
  if (unprivileged) {
    chownSync(profile, 65534, 65534);
    command = 'setpriv';
    argv = ['--reuid=65534', '--regid=65534', '--clear-groups', 'env', `HOME=${profile}`, options.chromium, ...args];
  } else {
    argv = [...args, '--no-sandbox'];
  }
  const started = now();
  const child = spawn(command, argv, { stdio: ['ignore', 'ignore', 'pipe'], detached: true, env: { ...process.env, HOME: profile } });
  try {
    const endpoint = await new Promise((resolve, reject) => {
      let seen = '';
      const timer = setTimeout(() => reject(new Error(`no DevTools line: ${seen}`)), 30_000);
      child.stderr.on('data', (chunk) => {
        seen += chunk;
        const match = seen.match(/DevTools listening on (ws:\/\/\S+)/);
        if (match) {
          clearTimeout(timer);
          resolve(match[1]);
        }
      });
      child.on('exit', (code) => reject(new Error(`chromium exited ${code}: ${seen}`)));
    });
    const launch = now() - started;
    return { launch, ...(await readyPage(endpoint)) };
  } finally {
    try { process.kill(-child.pid, 'SIGKILL'); } catch {}
    await new Promise((resolve) => (child.exitCode !== null ? resolve() : child.on('exit', resolve)));
    rmSync(profile, { recursive: true, force: true });
  }
}

/// One instance, reached through the door (urls.debug) and through its own
/// debug port with its token, in an alternating order.
async function twoWays(base, round) {
  const { created } = await createWarm(base);
  try {
    const door = created.urls.debug;
    const token = new URL(door).searchParams.get('token');
    const own = `ws://127.0.0.1:${created.debug_port}/devtools/browser/${created.id}?token=${token}`;
    const result = {};
    const order = round % 2 === 0 ? ['door', 'own'] : ['own', 'door'];
    for (const way of order) {
      result[way] = await readyPage(way === 'door' ? door : own);
    }
    return result;
  } finally {
    await api(base, 'DELETE', `/v2/instances/${created.id}`);
  }
}

/// A create that took a warm browser: one that did not (the pool still
/// refilling after the previous take) is deleted, counted, and tried again.
let coldCreates = 0;
async function createWarm(base) {
  for (let attempt = 0; attempt < 100; attempt++) {
    const started = now();
    const created = await api(base, 'POST', '/v2/instances', {});
    const answer = now() - started;
    if (created.status === 'running') return { created, answer };
    coldCreates++;
    await api(base, 'DELETE', `/v2/instances/${created.id}`);
    await new Promise((r) => setTimeout(r, 300));
  }
  throw new Error('no warm browser in 100 attempts: is agent.warm_pool_size > 0?');
}

async function round(index, results) {
  for (const build of options.builds) results[build.name].flotilla.push(await flotilla(build.api));
  results.raw_root.push(await raw(false));
  results.raw_unprivileged.push(await raw(true));
  for (const build of options.builds) results[build.name].two_ways.push(await twoWays(build.api, index));
}

const fresh = () => {
  const results = { raw_root: [], raw_unprivileged: [] };
  for (const build of options.builds) results[build.name] = { flotilla: [], two_ways: [] };
  return results;
};
await round(0, fresh());
coldCreates = 0;
const results = fresh();
for (let index = 0; index < options.rounds; index++) {
  await round(index, results);
  console.error(`round ${index + 1} of ${options.rounds}`);
}
results.cold_creates = coldCreates;
console.log(JSON.stringify(results));
