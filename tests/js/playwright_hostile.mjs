// A Playwright client that tries to reach past its instance: API requests
// to another address (made by the server, which has no network), raw CDP
// through a CDPSession that would put downloads elsewhere or load an
// extension. Prints what each attempt got as JSON.
// Usage: node playwright_hostile.mjs <ws url> <headers JSON> <address to reach>
import { chromium } from 'playwright-core';

const [wsUrl, headersJson, target] = process.argv.slice(2);
const browser = await chromium.connect(wsUrl, { headers: JSON.parse(headersJson), timeout: 60_000 });
const seen = {};
const outcome = async (attempt) => {
  try {
    return `ok: ${JSON.stringify(await attempt())}`.slice(0, 300);
  } catch (error) {
    return `error: ${String(error.message).split('\n')[0]}`;
  }
};
try {
  const context = browser.contexts()[0];
  const page = await context.newPage();
  seen.api_request = await outcome(async () => (await context.request.get(target, { timeout: 10_000 })).status());
  const session = await context.newCDPSession(page);
  seen.extension = await outcome(() => session.send('Extensions.loadUnpacked', { path: '/tmp' }));
  seen.download_behavior = await outcome(() =>
    session.send('Browser.setDownloadBehavior', { behavior: 'allow', downloadPath: '/instance/profile' }));
  await page.setContent('<a id=get href="data:text/plain,elsewhere" download="hostile.txt">get</a>');
  const [download] = await Promise.all([page.waitForEvent('download'), page.click('#get')]);
  await download.path().catch(() => {});
  // The raw protocol, as a client of this library would not send it: save
  // the download at a path on the server's side; a trace named into
  // another folder.
  seen.save_on_server = await outcome(() => download._artifact._channel.saveAs({ path: '/instance/profile/planted.txt' }));
  seen.trace_name = await outcome(() => context.tracing._channel.tracingStart({ name: '../../planted', snapshots: false, screenshots: false, live: false }));
  await page.close();
} finally {
  await browser.close();
}
console.log(JSON.stringify(seen));
