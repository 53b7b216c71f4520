// Playwright's largest upload as a buffer, for message_memory: connects
// with chromium.connect() to an instance's /playwright socket, opens a page
// with a file input and sets a buffer of `bytes` bytes on it (the client
// refuses buffers of 50 MB or more; larger files go as a stream of small
// writes). Usage: node playwright_upload.mjs '{"endpoint", "key", "bytes"}'.
// Prints one JSON object.
import { createRequire } from 'node:module';

const require = createRequire(new URL('../../tests/js/package.json', import.meta.url));
const { chromium } = require('playwright-core');
const options = JSON.parse(process.argv[2]);

const browser = await chromium.connect(options.endpoint, {
  headers: { Authorization: `Bearer ${options.key}` },
  timeout: 60_000,
});
const context = browser.contexts()[0] ?? (await browser.newContext());
const page = await context.newPage();
await page.setContent('<input type=file id=f>');
await page.setInputFiles('#f', { name: 'big.bin', mimeType: 'application/octet-stream', buffer: Buffer.alloc(options.bytes) });
const size = await page.evaluate(() => document.getElementById('f').files[0].size);
await page.close();
await browser.close();
console.log(JSON.stringify({ size }));
