// Drives a Firefox instance over WebDriver BiDi with Puppeteer
// (puppeteer.connect({browserWSEndpoint, protocol: 'webDriverBiDi'})): a
// page of a local site, an evaluation, a screenshot, a cookie set and read
// back, and a download by a link. Prints what it saw as JSON.
// Usage: node puppeteer_bidi.mjs <urls.bidi> <page url> [<download path>]
import puppeteer from 'puppeteer-core';

const [endpoint, pageUrl, downloadPath] = process.argv.slice(2);
const browser = await puppeteer.connect({
  browserWSEndpoint: endpoint,
  protocol: 'webDriverBiDi',
  protocolTimeout: 60_000,
});
try {
  const page = await browser.newPage();
  await page.goto(pageUrl, { timeout: 60_000 });
  const title = await page.title();
  const sum = await page.evaluate(() => 6 * 7);
  const shot = await page.screenshot();
  await page.setCookie({ name: 'flavour', value: 'oat', url: pageUrl });
  const cookies = (await page.cookies()).map((cookie) => `${cookie.name}=${cookie.value}`);
  let downloaded = null;
  if (downloadPath) {
    // The client asks for its own folder: the pins keep it in the instance's.
    await browser.defaultBrowserContext().setDownloadBehavior?.({ policy: 'allow', downloadPath: '/tmp/elsewhere' });
    await page.evaluate((path) => {
      const link = document.createElement('a');
      link.href = path;
      link.download = 'report.txt';
      document.body.appendChild(link);
      link.click();
    }, downloadPath);
    downloaded = 'clicked';
  }
  console.log(JSON.stringify({
    title,
    sum,
    png: Buffer.from(shot).subarray(0, 4).toString('hex'),
    png_bytes: shot.length,
    cookies,
    version: await browser.version(),
    user_agent: await browser.userAgent(),
    downloaded,
  }));
  // A page with a download in flight stays open (closing it would cancel
  // the download); the caller waits for it in the instance's downloads.
  if (!downloadPath) await page.close();
} finally {
  await browser.disconnect();
}
