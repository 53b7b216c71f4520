// Connects to a Flotilla instance with puppeteer.connect({browserWSEndpoint}),
// loads a page and prints {"title": ...}. Usage: node puppeteer_title.mjs <urls.debug> <page url>
import puppeteer from 'puppeteer-core';

const [endpoint, pageUrl] = process.argv.slice(2);
const browser = await puppeteer.connect({ browserWSEndpoint: endpoint, protocolTimeout: 60_000 });
try {
  const page = await browser.newPage();
  await page.goto(pageUrl, { timeout: 60_000 });
  console.log(JSON.stringify({ title: await page.title(), version: await browser.version() }));
  await page.close();
} finally {
  await browser.disconnect();
}
