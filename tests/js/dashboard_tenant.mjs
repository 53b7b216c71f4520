// The dashboard (/ui) with a tenant's key, in headless system Chromium with
// Playwright: the fleet's sections (nodes, alerts) and the node choices are
// not offered, the instance list shows the tenant's own instances only (not
// another tenant's), an instance created in the dashboard turns running
// without a reload (the tenant's event topic), and the metrics count the
// tenant's instances.
// Usage: node dashboard_tenant.mjs <control plane URL> <tenant key> <tenant name> <another tenant's instance id>
// Prints {"id": …, "errors": [console errors], "instances": n} as JSON.
import { chromium } from 'playwright-core';

const [base, apiKey, tenant, theirs] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: '/usr/lib/chromium/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
const errors = [];
const T = 60_000;
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
  page.on('pageerror', (e) => errors.push(String(e)));
  await page.goto(`${base}/ui`);
  await page.locator('#key-dialog[open]').waitFor({ timeout: T });
  await page.fill('#key-input', apiKey);
  await page.click('#key-form button[type=submit]');
  await page.locator('#live.on').waitFor({ timeout: T });
  await page.locator('#key-button', { hasText: `Tenant ${tenant}` }).waitFor({ timeout: T });
  for (const hidden of ['nav a[data-view="nodes"]', 'nav a[data-view="alerts"]', '#filter-node']) {
    if (await page.locator(hidden).isVisible()) throw new Error(`a tenant is offered ${hidden}`);
  }
  await page.click('#create-button');
  const row = page.locator('#instances tbody tr').first();
  await row.waitFor({ timeout: T });
  const id = await row.getAttribute('data-id');
  await page.locator(`tr[data-id="${id}"] [data-status="running"]`).waitFor({ timeout: T });
  if (await page.locator(`tr[data-id="${theirs}"]`).count() > 0) throw new Error('another tenant\'s instance is listed');
  const rows = await page.locator('#instances tbody tr').count();
  await page.click('nav a[data-view="metrics"]');
  await page.locator('#metric-cards .stat').first().waitFor({ timeout: T });
  const instances = Number(await page.locator('#metric-cards .stat b').first().textContent());
  if (instances !== rows) throw new Error(`metrics count ${instances} instances, the list ${rows}`);
  console.log(JSON.stringify({ id, errors, instances }));
} finally {
  await browser.close();
}
