// Connects with Playwright's own protocol (chromium.connect, the credential
// in the URL) and either opens a tab at <page url> and leaves it open
// ("open": prints {"title"}) or looks for such a tab ("find": prints
// {"found", "urls"}). Disconnects only: the tabs are the instance's.
// Usage: node playwright_keep_tab.mjs <ws url> <page url> open|find
import { chromium } from 'playwright-core';

const [wsUrl, pageUrl, mode] = process.argv.slice(2);
const browser = await chromium.connect(wsUrl, { timeout: 60_000 });
const seen = {};
try {
  const context = browser.contexts()[0];
  if (mode === 'open') {
    const page = await context.newPage();
    await page.goto(pageUrl, { timeout: 60_000 });
    seen.title = await page.title();
  } else {
    const urls = context.pages().map((page) => page.url());
    seen.urls = urls;
    seen.found = urls.includes(pageUrl);
  }
} finally {
  await browser.close();
}
console.log(JSON.stringify(seen));
