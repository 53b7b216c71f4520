// Connects to a Flotilla instance with Playwright's connectOverCDP, loads a page
// and prints {"title": ..., "contexts": n} as JSON. Usage: node playwright_title.mjs <urls.debug> <page url>
import { chromium } from 'playwright-core';

const [debugUrl, pageUrl] = process.argv.slice(2);
const browser = await chromium.connectOverCDP(debugUrl, { timeout: 60_000 });
try {
  const context = browser.contexts()[0] ?? (await browser.newContext());
  const page = await context.newPage();
  await page.goto(pageUrl, { timeout: 60_000 });
  const title = await page.title();
  console.log(JSON.stringify({ title, contexts: browser.contexts().length, version: browser.version() }));
  await page.close();
} finally {
  // Disconnect only: the browser belongs to Flotilla.
  await browser.close();
}
