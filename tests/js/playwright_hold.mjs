// Connects with Playwright's own protocol (chromium.connect) to a URL that
// makes an instance for the connection (/v2/playwright), opens a page,
// writes <connected file> with what it saw, and holds the connection until
// the far side drops it; then prints what it saw as JSON.
// Usage: node playwright_hold.mjs <ws url> <page url> <connected file>
import { createRequire } from 'node:module';
import fs from 'node:fs';

const require = createRequire(import.meta.url);
const [wsUrl, pageUrl, connectedFile] = process.argv.slice(2);
const { chromium } = require('playwright-core');

const browser = await chromium.connect(wsUrl, { timeout: 60_000 });
const seen = {};
const dropped = new Promise((resolve) => browser.on('disconnected', resolve));
const page = await browser.contexts()[0].newPage();
await page.goto(pageUrl, { timeout: 60_000 });
seen.title = await page.title();
fs.writeFileSync(connectedFile, JSON.stringify(seen));
const deadline = setTimeout(() => {
  console.error('the connection was never dropped');
  process.exit(1);
}, 110_000);
await dropped;
clearTimeout(deadline);
seen.dropped = true;
console.log(JSON.stringify(seen));
