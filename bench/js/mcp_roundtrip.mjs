// An MCP agent's navigate + snapshot round trip (issue 30), for mcp_bench:
// Flotilla's /mcp against @playwright/mcp connected over CDP to the same
// instance (--cdp-endpoint urls.debug), both driven by the official
// TypeScript SDK, interleaved round by round after one warm-up of each.
//
// Usage: node mcp_roundtrip.mjs '<json>' with {api, key, instance, debug,
// url, rounds, playwright_mcp} (the path of @playwright/mcp's cli.js), and
// firefox_instance: Flotilla's /mcp on a Firefox instance, in the same turns.
// Prints one JSON object: per-round milliseconds and snapshot sizes.
import { createRequire } from 'node:module';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const require = createRequire(new URL('../../tests/js/package.json', import.meta.url));
const { Client } = require('@modelcontextprotocol/sdk/client/index.js');
const { StreamableHTTPClientTransport } = require('@modelcontextprotocol/sdk/client/streamableHttp.js');
const { StdioClientTransport } = require('@modelcontextprotocol/sdk/client/stdio.js');

const options = JSON.parse(process.argv[2]);
const now = () => performance.now();
const textOf = (result) => result.content.filter((b) => b.type === 'text').map((b) => b.text).join('\n');

async function connect(transport) {
  const client = new Client({ name: 'flotilla-bench', version: '1.0.0' });
  await client.connect(transport);
  return client;
}

const flotilla = await connect(new StreamableHTTPClientTransport(new URL(`${options.api}/mcp`), {
  requestInit: { headers: { Authorization: `Bearer ${options.key}` } },
}));
// @playwright/mcp writes snapshots and logs where it runs: a temp folder.
const scratch = mkdtempSync(join(tmpdir(), 'playwright-mcp-'));
const playwright = await connect(new StdioClientTransport({
  command: process.execPath,
  args: [options.playwright_mcp, '--cdp-endpoint', options.debug],
  cwd: scratch,
  stderr: 'ignore',
}));

async function roundTrip(client, args) {
  const started = now();
  const navigated = await client.callTool({ name: 'browser_navigate', arguments: { url: options.url, ...args } });
  if (navigated.isError) throw new Error(`navigate: ${textOf(navigated)}`);
  const snapshot = await client.callTool({ name: 'browser_snapshot', arguments: { ...args } });
  if (snapshot.isError) throw new Error(`snapshot: ${textOf(snapshot)}`);
  return { ms: now() - started, snapshot_bytes: Buffer.byteLength(textOf(snapshot)) };
}

const ways = {
  flotilla: () => roundTrip(flotilla, { instance_id: options.instance }),
  playwright_mcp: () => roundTrip(playwright, {}),
  flotilla_firefox: () => roundTrip(flotilla, { instance_id: options.firefox_instance }),
};
for (const way of Object.values(ways)) await way();
const results = { flotilla: [], playwright_mcp: [], flotilla_firefox: [] };
const names = Object.keys(ways);
for (let round = 0; round < options.rounds; round++) {
  // Each way goes first in turn.
  const order = names.map((_, i) => names[(i + round) % names.length]);
  for (const name of order) results[name].push(await ways[name]());
}
await flotilla.close();
await playwright.close();
rmSync(scratch, { recursive: true, force: true });
console.log(JSON.stringify(results));
