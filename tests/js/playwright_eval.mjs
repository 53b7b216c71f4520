// Connects to a Flotilla instance with Playwright's connectOverCDP, opens a page
// at <page url>, evaluates <expression> (awaited) and prints {"title", "value"}.
// Usage: node playwright_eval.mjs <urls.debug> <page url> <expression>
import { chromium } from 'playwright-core';

const [debugUrl, pageUrl, expression] = process.argv.slice(2);
const browser = await chromium.connectOverCDP(debugUrl, { timeout: 90_000 });
try {
  const context = browser.contexts()[0] ?? (await browser.newContext());
  const page = await context.newPage();
  await page.goto(pageUrl, { timeout: 60_000 });
  const value = await page.evaluate(expression);
  console.log(JSON.stringify({ title: await page.title(), value }));
  await page.close();
} finally {
  await browser.close();
}
