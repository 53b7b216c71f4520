// Launches the system Chromium (not an instance) with --host-resolver-rules
// mapping *.<domain> to 127.0.0.1, opens <url> and prints {"status", "contentType",
// "text"} (text cut to 2,000 characters). Usage: node browser_fetch.mjs <domain> <url>
import { chromium } from 'playwright-core';

const [domain, url] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: '/usr/lib/chromium/chromium',
  args: [`--host-resolver-rules=MAP *.${domain} 127.0.0.1`, '--no-sandbox', '--disable-gpu'],
});
try {
  const page = await browser.newPage();
  const response = await page.goto(url, { timeout: 60_000 });
  const text = (await response.text()).slice(0, 2000);
  console.log(JSON.stringify({ status: response.status(), contentType: response.headers()['content-type'], text }));
} finally {
  await browser.close();
}
