// Downloads a file with Playwright over connectOverCDP and prints what the
// download object offers there: {"suggested", "url", "path": <path or error>}.
// Usage: node playwright_download.mjs <urls.debug> <file name> <content>
import { chromium } from 'playwright-core';

const [debugUrl, name, content] = process.argv.slice(2);
const browser = await chromium.connectOverCDP(debugUrl, { timeout: 60_000 });
try {
  const context = browser.contexts()[0] ?? (await browser.newContext());
  const page = await context.newPage();
  await page.setContent(`<a id=get href="data:text/plain,${encodeURIComponent(content)}" download="${name}">get</a>`);
  const [download] = await Promise.all([page.waitForEvent('download', { timeout: 60_000 }), page.click('#get')]);
  let path;
  try {
    path = await Promise.race([
      download.path(),
      new Promise((_, reject) => setTimeout(() => reject(new Error('download.path() did not settle in 5 s')), 5_000)),
    ]);
  } catch (error) {
    path = `error: ${String(error.message).split('\n')[0]}`;
  }
  console.log(JSON.stringify({ suggested: download.suggestedFilename(), url: download.url(), path }));
  await page.close();
} finally {
  await browser.close();
}
