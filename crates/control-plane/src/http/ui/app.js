// Flotilla dashboard: plain JavaScript over the public API (/v2) and the event
// proxy (lifecycle updates arrive as server-sent events; nothing polls for them).

import { LiveView, renderControls } from './live.js';

const $ = (selector, root = document) => root.querySelector(selector);
const h = (tag, attrs = {}, ...children) => {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'text') el.textContent = v;
    else el.setAttribute(k, v === true ? '' : v);
  }
  for (const child of children.flat()) if (child !== null && child !== undefined) el.append(child);
  return el;
};

const INSTANCE_EVENTS = ['instance.created', 'instance.running', 'instance.idle', 'instance.dormant',
  'instance.revived', 'instance.failed', 'instance.stopped', 'instance.deleted', 'instance.egress_refused'];

// Destinations the egress policy refused, per instance (the last few), shown
// under the live view: the page itself only sees ERR_SOCKS_CONNECTION_FAILED.
const refusals = new Map();

function noteRefusal(id, data) {
  const seen = refusals.get(id) ?? [];
  refusals.set(id, [...seen, data].slice(-3));
  if (state.detail === id) renderRefusals(id);
}

function renderRefusals(id) {
  const notice = $('#egress-refused');
  const seen = refusals.get(id) ?? [];
  notice.hidden = seen.length === 0;
  notice.textContent = seen.map((r) => `Refused by the node's egress policy: ${r.destination} (${r.reason}). ${r.setting} opens it.`).join(' ');
}

const state = {
  key: sessionStorage.getItem('flotilla.apiKey'),
  instances: new Map(),
  nodes: [],
  sort: { key: 'created_at', dir: 'desc' },
  period: '24h',
  snippet: 'playwright',
  detail: null,
  sources: [],
  // Instances being parked: their live view stays closed meanwhile.
  parking: new Set(),
  // A tenant's key: nodes and alerts are not its to see (404), its events
  // come on its tenant's topic, its metrics count its own instances.
  tenant: false,
  // What the key is (GET /v2/whoami), once asked.
  me: null,
};

// A tenant's key sees its own instances, profiles and recordings only: the
// fleet's sections and choices go.
function enterTenantMode(name) {
  state.tenant = true;
  $('#key-button').textContent = `Tenant ${name}`;
  for (const view of ['nodes', 'alerts']) $(`nav a[data-view="${view}"]`).hidden = true;
  $('#filter-node').hidden = true;
  $('#create-node').closest('label').hidden = true;
  for (const chart of ['#chart-cpu', '#chart-memory', '#chart-instances']) $(chart).closest('figure').hidden = true;
}

class ApiError extends Error {
  constructor(status, detail, code) { super(detail); this.status = status; this.code = code; }
}

function toast(message, error = false) {
  const el = h('div', { class: error ? 'toast error' : 'toast' });
  el.textContent = message;
  $('#toasts').append(el);
  setTimeout(() => el.remove(), error ? 8000 : 3500);
}

function showError(error) {
  if (error instanceof ApiError) toast(`${error.message} (${error.code}, HTTP ${error.status})`, true);
  else toast(`Cannot reach the control plane: ${error.message}`, true);
}

function askKey() {
  return new Promise((resolve) => {
    const dialog = $('#key-dialog');
    $('#key-input').value = state.key ?? '';
    const done = (ok) => { dialog.close(); resolve(ok); };
    $('#key-form').onsubmit = (e) => {
      e.preventDefault();
      state.key = $('#key-input').value.trim();
      sessionStorage.setItem('flotilla.apiKey', state.key);
      done(true);
    };
    $('#key-cancel').onclick = () => done(false);
    dialog.showModal();
  });
}

async function api(method, path, body, retried = false) {
  const headers = {};
  if (body !== undefined) headers['content-type'] = 'application/json';
  if (state.key) headers.authorization = `Bearer ${state.key}`;
  const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = text; }
  if (response.status === 401 && !retried) {
    if (await askKey()) {
      // Another key may see another part of the fleet: start afresh with it.
      if (state.me) location.reload();
      return api(method, path, body, true);
    }
  }
  if (!response.ok) throw new ApiError(response.status, data?.detail ?? String(data ?? response.statusText), data?.code ?? 'error');
  return data;
}

// ---- instances ----------------------------------------------------------

// The dashboard reaches instances through the front door of the control
// plane that serves it, so it works when only this port is exposed. The
// token (authentication on) comes from the create or get answer's urls.
function urlsOf(instance) {
  if (!instance.debug_port) return null;
  const token = instance.urls?.debug?.split('?token=')[1];
  const query = token ? `?token=${token}` : '';
  const ws = location.protocol === 'https:' ? 'wss:' : 'ws:';
  const door = `${location.host}/v2/instances/${instance.id}`;
  return {
    debug: `${ws}//${door}/cdp${query}`,
    stream: `${location.protocol}//${door}/stream${query}`,
    live: `${ws}//${door}/stream/ws${query}`,
    playwright: `${ws}//${door}/playwright${query}`,
  };
}

function badge(status) { return h('span', { class: `badge ${status}`, 'data-status': status, text: status }); }

function actionsFor(instance, small = true) {
  const cls = small ? 'small' : '';
  const act = (label, fn, extra = '') => h('button', {
    type: 'button', class: `${cls} ${extra}`.trim(), 'aria-label': `${label} ${instance.id}`,
    onclick: async (e) => {
      e.target.disabled = true;
      try { await fn(); } catch (error) { showError(error); } finally { e.target.disabled = false; }
    },
  }, label);
  const buttons = [];
  const s = instance.status;
  // The answer of an operation is the instance's new state: show it at once
  // (its event follows).
  const apply = (answer) => {
    const known = state.instances.get(instance.id) ?? instance;
    state.instances.set(instance.id, { ...known, ...answer });
    renderInstances();
    if (state.detail === instance.id) renderDetail();
  };
  if (s === 'running' || s === 'idle') {
    buttons.push(act('Park', async () => {
      // Let go of the live view first: a connection to a parked instance's
      // ports wakes it up.
      stopLiveView();
      state.parking.add(instance.id);
      try {
        apply(await api('POST', `/v2/instances/${instance.id}/dormant`));
        toast('Parked');
      } finally {
        state.parking.delete(instance.id);
      }
    }));
  }
  if (s === 'dormant' || ((s === 'failed' || s === 'stopped') && instance.snapshot_id)) {
    buttons.push(act('Revive', async () => apply(await api('POST', `/v2/instances/${instance.id}/revive`, { method: 'quick_start' }))));
    buttons.push(act('Full restore', async () => apply(await api('POST', `/v2/instances/${instance.id}/revive`, { method: 'full_restore' }))));
  }
  buttons.push(act('Delete', async () => {
    if (!confirm(`Delete instance ${instance.id}?`)) return;
    await api('DELETE', `/v2/instances/${instance.id}`);
    toast('Deleted');
  }, 'danger'));
  return h('div', { class: 'actions' }, buttons);
}

function matchesFilters(instance) {
  const status = $('#filter-status').value;
  const node = $('#filter-node').value;
  return (!status || instance.status === status) && (!node || instance.node_id === node);
}

// What drives an instance, in words ("CDP ×2 · WebDriver"; "—": nothing).
const DRIVER_NAMES = [['cdp', 'CDP'], ['playwright', 'Playwright'], ['webdriver', 'WebDriver'], ['mcp', 'MCP'], ['actions', 'Action']];
function drivenBy(drivers) {
  const parts = DRIVER_NAMES.filter(([key]) => (drivers?.[key] ?? 0) > 0)
    .map(([key, name]) => (drivers[key] > 1 ? `${name} ×${drivers[key]}` : name));
  return parts.length ? parts.join(' · ') : '—';
}

function sortValue(instance, key) {
  switch (key) {
    case 'drivers': return drivenBy(instance.drivers);
    case 'cpu': return instance.resources?.cpu_percent ?? 0;
    case 'memory': return instance.resources?.memory_mb ?? 0;
    default: return instance[key] ?? '';
  }
}

function renderInstances() {
  const { key, dir } = state.sort;
  const rows = [...state.instances.values()].filter(matchesFilters).sort((a, b) => {
    const x = sortValue(a, key), y = sortValue(b, key);
    const order = x < y ? -1 : x > y ? 1 : 0;
    return dir === 'asc' ? order : -order;
  });
  const tbody = $('#instances tbody');
  tbody.replaceChildren(...rows.map((i) => h('tr', { 'data-id': i.id },
    h('td', {}, h('a', { href: `#instance/${i.id}`, title: i.id, text: i.id.slice(0, 13) + '…' })),
    h('td', {}, badge(i.status)),
    h('td', { text: i.node_id ?? '—' }),
    h('td', { 'data-field': 'image', text: i.image ?? '—' }),
    h('td', { 'data-field': 'drivers', text: drivenBy(i.drivers) }),
    h('td', { class: 'num', text: (i.resources?.cpu_percent ?? 0).toFixed(1) }),
    h('td', { class: 'num', text: (i.resources?.memory_mb ?? 0).toFixed(0) }),
    h('td', { text: i.created_at ? new Date(i.created_at).toLocaleString() : '—' }),
    h('td', {}, actionsFor(i)),
  )));
  $('#instances-empty').hidden = rows.length > 0;
  const more = (state.total ?? 0) - state.instances.size;
  $('#instances-more').hidden = more <= 0;
  $('#instances-more').textContent = `Showing the newest ${state.instances.size} of ${state.total} instances; filter by status or node to see others.`;
  for (const button of document.querySelectorAll('th .sort')) {
    button.setAttribute('aria-sort', button.dataset.sort === key ? (dir === 'asc' ? 'ascending' : 'descending') : 'none');
  }
}

async function loadInstances() {
  const query = new URLSearchParams({ limit: '1000' });
  if ($('#filter-status').value) query.set('status', $('#filter-status').value);
  if ($('#filter-node').value) query.set('node_id', $('#filter-node').value);
  const page = await api('GET', `/v2/instances?${query}`);
  // List items carry no URLs: keep those a get or create answer brought.
  const previous = state.instances;
  state.instances = new Map(page.instances.map((i) => {
    const urls = previous.get(i.id)?.urls;
    return [i.id, urls ? { urls, ...i } : i];
  }));
  state.total = page.total;
  renderInstances();
}

async function refreshInstance(id) {
  try {
    const instance = await api('GET', `/v2/instances/${id}`);
    state.instances.set(id, instance);
  } catch (error) {
    if (error.status === 404) state.instances.delete(id); else throw error;
  }
  renderInstances();
  if (state.detail === id) renderDetail();
}

// ---- detail -------------------------------------------------------------

// The live view: one WebSocket through the front door (see live.js).
let live = null;

function stopLiveView() { live?.close(); }

function startLiveView(url) { live.open(url); }

function renderControl(liveState) {
  renderControls({ button: $('#take-control'), select: $('#tab-switcher'), sign: $('#control-state'), area: $('#live-area') }, liveState);
}

function wireLiveView() {
  live = new LiveView({
    img: $('#live-view'),
    area: $('#live-area'),
    onState: renderControl,
    onError: (detail) => toast(detail, true),
    // Reconnect while the detail still shows a live instance.
    onClose: () => setTimeout(() => { if (state.detail) renderDetail(); }, 1000),
  });
  $('#take-control').addEventListener('click', () => live.toggleControl());
  $('#tab-switcher').addEventListener('change', (e) => live.showTab(e.target.value));
}

// The Connect panel: each door, with this instance's own URLs where the door
// attaches to an instance; a WebDriver session makes an instance of its own
// (the same image), and an action needs none.
const SNIPPETS = {
  playwright: ({ debug }) => ({
    hint: 'Playwright over CDP, on this instance (its own context and tabs).',
    code: `import { chromium } from 'playwright-core';\n\nconst browser = await chromium.connectOverCDP('${debug}');\nconst context = browser.contexts()[0];\nconst page = context.pages()[0] ?? await context.newPage();\nawait page.goto('https://example.com');\nconsole.log(await page.title());\nawait browser.close(); // disconnects; the instance keeps running`,
  }),
  puppeteer: ({ debug }) => ({
    hint: 'Puppeteer over CDP, on this instance.',
    code: `import puppeteer from 'puppeteer-core';\n\nconst browser = await puppeteer.connect({ browserWSEndpoint: '${debug}' });\nconst [page] = await browser.pages();\nawait page.goto('https://example.com');\nconsole.log(await page.title());\nawait browser.disconnect();`,
  }),
  'playwright-connect': ({ playwright }) => ({
    hint: "Playwright's own protocol (urls.playwright), on this instance: the client's version is served by the node.",
    code: `import { chromium } from 'playwright-core';\n\nconst browser = await chromium.connect('${playwright}');\nconst context = browser.contexts()[0];\nconst page = await context.newPage();\nawait page.goto('https://example.com');\nconsole.log(await page.title());\nawait browser.close();`,
  }),
  'selenium-python': ({ hub, image }) => ({
    hint: 'A WebDriver session is an instance of its own, of this image; add your API key to the URL when authentication is on.',
    code: `from selenium import webdriver\n\noptions = webdriver.ChromeOptions()\noptions.set_capability("flotilla:options", {"image": "${image}"})\ndriver = webdriver.Remote("${hub}", options=options)\ndriver.get("https://example.com")\nprint(driver.title)\ndriver.quit()`,
  }),
  'selenium-js': ({ hub, image }) => ({
    hint: 'A WebDriver session is an instance of its own, of this image.',
    code: `import { Builder } from 'selenium-webdriver';\nimport chrome from 'selenium-webdriver/chrome.js';\n\nconst options = new chrome.Options();\noptions.set('flotilla:options', { image: '${image}' });\nconst driver = await new Builder().usingServer('${hub}').forBrowser('chrome').setChromeOptions(options).build();\nawait driver.get('https://example.com');\nconsole.log(await driver.getTitle());\nawait driver.quit();`,
  }),
  webdriverio: ({ origin, image }) => {
    const url = new URL(origin);
    const port = url.port || (url.protocol === 'https:' ? 443 : 80);
    return {
      hint: 'A WebDriver session is an instance of its own, of this image; with authentication on, add headers: { Authorization: "Bearer <API key>" }.',
      code: `import { remote } from 'webdriverio';\n\nconst browser = await remote({\n  protocol: '${url.protocol.replace(':', '')}', hostname: '${url.hostname}', port: ${port}, path: '/wd/hub',\n  capabilities: { browserName: 'chrome', 'flotilla:options': { image: '${image}' } },\n});\nawait browser.url('https://example.com');\nconsole.log(await browser.getTitle());\nawait browser.deleteSession();`,
    };
  },
  mcp: ({ origin, id }) => ({
    hint: `An AI agent's MCP client: its tools take instance_id (this one: ${id}).`,
    code: JSON.stringify({ mcpServers: { flotilla: { type: 'http', url: `${origin}/mcp`, headers: { Authorization: 'Bearer <API key>' } } } }, null, 2),
  }),
  action: ({ origin }) => ({
    hint: 'One page, no session: a REST action answers with the result (screenshot, pdf, content, scrape).',
    code: `curl -s -H "Authorization: Bearer $FLOTILLA_API_KEY" -H 'content-type: application/json' \\\n  -d '{"url": "https://example.com/", "full_page": true}' \\\n  ${origin}/v2/actions/screenshot > page.png`,
  }),
};

function snippet(instance) {
  const urls = urlsOf(instance);
  const origin = location.origin;
  const choice = SNIPPETS[state.snippet] ?? SNIPPETS.playwright;
  return choice({
    id: instance.id,
    image: instance.image ?? 'chromium',
    origin,
    hub: `${origin}/wd/hub`,
    debug: urls?.debug ?? '<urls.debug>',
    playwright: urls?.playwright ?? '<urls.playwright>',
  });
}

function renderDetail() {
  const instance = state.instances.get(state.detail);
  const fields = $('#detail-fields');
  if (!instance) {
    fields.replaceChildren(h('dt', { text: 'Instance' }), h('dd', { text: 'deleted' }));
    $('#detail-actions').replaceChildren();
    stopLiveView();
    return;
  }
  $('#h-detail').textContent = `Instance ${instance.id.slice(0, 13)}…`;
  const urls = urlsOf(instance);
  const rows = [
    ['ID', instance.id], ['Status', badge(instance.status)], ['Reason', instance.status_reason],
    ['Node', instance.node_id], ['Image', instance.image], ['Driven by', drivenBy(instance.drivers)],
    ['Memory', instance.config ? `${instance.config.memory_gb} GB` : null],
    ['CPU cores', instance.config?.cpu_cores], ['CPU now', instance.resources ? `${instance.resources.cpu_percent.toFixed(1)} %` : null],
    ['Memory now', instance.resources ? `${instance.resources.memory_mb.toFixed(0)} MB` : null],
    ['Debug URL', urls?.debug], ['Live view', urls?.stream],
    ['Created', instance.created_at && new Date(instance.created_at).toLocaleString()],
    ['Dormant since', instance.dormant_since && new Date(instance.dormant_since).toLocaleString()],
  ].filter(([, v]) => v !== null && v !== undefined && v !== '');
  fields.replaceChildren(...rows.flatMap(([k, v]) => [h('dt', { text: k }), h('dd', {}, v)]));
  $('#detail-actions').replaceChildren(actionsFor(instance, false));
  const showing = urls && (instance.status === 'running' || instance.status === 'idle') && !state.parking.has(instance.id);
  if (showing) {
    startLiveView(urls.live);
    $('#live-hint').textContent = 'Frames stream as the page changes. Take control to click and type in the page.';
  } else {
    stopLiveView();
    $('#live-hint').textContent = `No live view while the instance is ${state.parking.has(instance.id) ? 'parking' : instance.status}.`;
  }
  renderRefusals(instance.id);
  const shown = snippet(instance);
  $('#snippet').textContent = shown.code;
  $('#snippet-hint').textContent = shown.hint;
  renderRecordings(instance).catch(showError);
}

function sizeText(bytes) {
  return bytes >= 1e6 ? `${(bytes / 1e6).toFixed(1)} MB` : `${Math.ceil(bytes / 1e3)} kB`;
}

// The recordings of an instance with config.record, played through the
// front door (the instance's token in the URL, as for the live view). Read
// again when the instance's status changes, and every 2 s while one is
// still being written (it plays once finished).
async function renderRecordings(instance, again = false) {
  const card = $('#recordings-card');
  card.hidden = !instance.config?.record;
  const seen = `${instance.id}:${instance.status}`;
  if (card.hidden || (state.recordingsSeen === seen && !again)) return;
  state.recordingsSeen = seen;
  clearTimeout(state.recordingsTimer);
  const { recordings } = await api('GET', `/v2/instances/${instance.id}/recordings`);
  if (state.detail !== instance.id) return;
  const token = instance.urls?.debug?.split('?token=')[1];
  const query = token ? `?token=${token}` : '';
  const item = (r) => h('li', {},
    h('div', { class: 'meta', text: `${new Date(r.created_at).toLocaleString()} · ${r.duration_sec.toFixed(1)} s · ${sizeText(r.size_bytes)}${r.recording ? ' · recording…' : ''}` }),
    r.recording ? null : h('video', { controls: '', preload: 'metadata', src: `/v2/instances/${instance.id}/recordings/${r.id}${query}` }));
  $('#recordings').replaceChildren(...recordings.map(item));
  if (!recordings.length) $('#recordings').replaceChildren(h('li', { class: 'meta', text: 'No recording yet.' }));
  if (recordings.some((r) => r.recording)) {
    state.recordingsTimer = setTimeout(() => {
      const current = state.instances.get(instance.id);
      if (current && state.detail === instance.id) renderRecordings(current, true).catch(showError);
    }, 2000);
  }
}

// Recordings kept after their instance was deleted (config.keep_recordings).
// They are served under the API key, which a <video> cannot send: Play
// fetches the file and plays it from memory.
async function loadKeptRecordings() {
  const { recordings } = await api('GET', '/v2/recordings');
  const play = async (r, li, button) => {
    button.disabled = true;
    try {
      const headers = state.key ? { authorization: `Bearer ${state.key}` } : {};
      const response = await fetch(`/v2/recordings/${r.id}`, { headers });
      if (!response.ok) throw new ApiError(response.status, `cannot load the recording (${response.status})`, 'error');
      const src = URL.createObjectURL(await response.blob());
      li.append(h('video', { controls: '', autoplay: '', src }));
      button.remove();
    } catch (error) { button.disabled = false; showError(error); }
  };
  const remove = async (r) => {
    if (!confirm(`Delete the recording of ${r.instance_id}?`)) return;
    try { await api('DELETE', `/v2/recordings/${r.id}`); toast('Recording deleted'); await loadKeptRecordings(); } catch (error) { showError(error); }
  };
  const item = (r) => {
    const li = h('li', { 'data-recording': r.id },
      h('div', { class: 'meta', text: `${r.instance_id} · ${new Date(r.created_at).toLocaleString()} · ${r.duration_sec.toFixed(1)} s · ${sizeText(r.size_bytes)}` }));
    const playButton = h('button', { type: 'button', class: 'small', text: 'Play', onclick: () => play(r, li, playButton) });
    li.append(h('div', { class: 'actions' }, playButton,
      h('button', { type: 'button', class: 'small danger', text: 'Delete', onclick: () => remove(r) })));
    return li;
  };
  $('#kept-recordings').replaceChildren(...recordings.map(item));
  $('#kept-empty').hidden = recordings.length > 0;
}

// ---- nodes, metrics, alerts ----------------------------------------------

function bar(value, max, label) {
  const pct = max > 0 ? Math.min(100, (value / max) * 100) : 0;
  const cls = pct >= 100 ? 'full' : pct >= 80 ? 'high' : '';
  return [h('div', { class: 'meta', text: label }),
    h('div', { class: 'bar', role: 'progressbar', 'aria-label': label, 'aria-valuenow': pct.toFixed(0), 'aria-valuemin': 0, 'aria-valuemax': 100 },
      h('span', { class: cls, style: `width:${pct}%` }))];
}

async function loadNodes() {
  if (state.tenant) return;
  const list = await api('GET', '/v2/nodes');
  state.nodes = list.nodes;
  // Warnings (reduced isolation) come with a node's detail; small clusters only.
  const details = state.nodes.length <= 50
    ? await Promise.all(state.nodes.map((n) => api('GET', `/v2/nodes/${encodeURIComponent(n.id)}`).catch(() => n)))
    : state.nodes;
  const warnings = new Map(details.map((d) => [d.id, d.warnings ?? []]));
  const selects = [$('#filter-node'), $('#create-node')];
  for (const select of selects) {
    const keep = select.value;
    select.replaceChildren(h('option', { value: '', text: select.id === 'create-node' ? 'any' : 'all' }),
      ...state.nodes.map((n) => h('option', { value: n.id, text: n.id })));
    select.value = keep;
  }
  $('#nodes').replaceChildren(...state.nodes.map((n) => h('article', { class: 'card node', 'data-node': n.id },
    h('h2', {}, h('span', { text: n.id }), badge(n.status)),
    ...bar(n.instances_count, n.max_instances, `Instances ${n.instances_count} of ${n.max_instances}`),
    ...bar(n.resources.cpu_percent, 100, `CPU ${n.resources.cpu_percent.toFixed(1)} %`),
    ...bar(n.resources.memory_percent, 100, `Memory ${n.resources.memory_percent.toFixed(1)} %`),
    ...bar(n.resources.disk_percent, 100, `Disk ${n.resources.disk_percent.toFixed(1)} %`),
    h('div', { class: 'meta', text: `${n.address} · last heartbeat ${new Date(n.last_heartbeat).toLocaleTimeString()}` }),
    ...(warnings.get(n.id) ?? []).map((w) => h('p', { class: 'warning-note', role: 'note', text: `⚠ ${w}` })),
  )));
}

function chart(svg, timestamps, values) {
  const width = svg.clientWidth || 360, height = 160, pad = 28;
  svg.setAttribute('viewBox', `0 0 ${width} ${height}`);
  if (values.length === 0) {
    svg.replaceChildren(Object.assign(document.createElementNS('http://www.w3.org/2000/svg', 'text'), { textContent: 'No samples yet' }));
    svg.firstChild.setAttribute('x', pad); svg.firstChild.setAttribute('y', height / 2);
    return;
  }
  const max = Math.max(1, ...values), n = values.length;
  const x = (i) => pad + (n === 1 ? 0 : (i / (n - 1)) * (width - pad - 8));
  const y = (v) => height - 18 - (v / max) * (height - 30);
  const points = values.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(' ');
  const ns = 'http://www.w3.org/2000/svg';
  const el = (tag, attrs) => { const e = document.createElementNS(ns, tag); for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v); return e; };
  const label = (text, lx, ly, anchor = 'start') => { const t = el('text', { x: lx, y: ly, 'text-anchor': anchor }); t.textContent = text; return t; };
  svg.replaceChildren(
    el('line', { class: 'grid', x1: pad, x2: width - 8, y1: y(max), y2: y(max) }),
    el('line', { class: 'grid', x1: pad, x2: width - 8, y1: y(0), y2: y(0) }),
    el('polygon', { class: 'area', points: `${x(0)},${y(0)} ${points} ${x(n - 1)},${y(0)}` }),
    el('polyline', { class: 'line', points }),
    label(String(Math.round(max * 10) / 10), 2, y(max) + 4), label('0', 2, y(0) + 4),
    label(new Date(timestamps[0]).toLocaleTimeString(), pad, height - 4),
    label(new Date(timestamps[n - 1]).toLocaleTimeString(), width - 8, height - 4, 'end'),
  );
}

async function loadMetrics() {
  const m = await api('GET', `/v2/metrics?period=${state.period}`);
  const c = m.cluster;
  const stat = (value, label) => h('div', { class: 'stat' }, h('b', { text: String(value) }), h('span', { text: label }));
  const instances = [stat(c.total_instances, 'instances'), stat(c.running_instances, 'running'),
    stat(c.dormant_instances, 'dormant'), stat(c.failed_instances, 'failed')];
  if (state.tenant) { $('#metric-cards').replaceChildren(...instances); return; }
  $('#metric-cards').replaceChildren(
    ...instances, stat(`${c.nodes_online}/${c.nodes_online + c.nodes_offline}`, 'nodes online'),
    stat(`${c.avg_cpu_percent.toFixed(1)} %`, 'CPU now'), stat(`${c.avg_memory_percent.toFixed(1)} %`, 'memory now'),
    stat(`${m.resources.avg_cpu_percent.toFixed(1)} %`, `CPU avg ${state.period}`),
  );
  const t = m.timeseries;
  chart($('#chart-cpu'), t.timestamps, t.cpu);
  chart($('#chart-memory'), t.timestamps, t.memory);
  chart($('#chart-instances'), t.timestamps, t.instances);
}

async function loadAlerts() {
  if (state.tenant) return;
  const active = await api('GET', '/v2/alerts?state=active&limit=1000');
  const count = $('#alert-count');
  count.hidden = active.total === 0;
  count.textContent = active.total;
  const shown = $('#alert-state').value === 'active' ? active : await api('GET', `/v2/alerts?state=${$('#alert-state').value}&limit=1000`);
  $('#alerts tbody').replaceChildren(...shown.alerts.map((a) => h('tr', {},
    h('td', {}, badge(a.level)), h('td', { text: a.node_id ? `node ${a.node_id}` : a.scope }), h('td', { text: a.metric }),
    h('td', { text: a.message }), h('td', { text: new Date(a.raised_at).toLocaleString() }),
    h('td', { text: a.cleared_at ? new Date(a.cleared_at).toLocaleString() : '—' }))));
  $('#alerts-empty').hidden = shown.alerts.length > 0;
}

// ---- live updates -----------------------------------------------------------

function setLive(on) {
  const el = $('#live');
  el.className = on ? 'live on' : 'live off';
  el.textContent = on ? 'live' : 'reconnecting…';
}

async function connectEvents() {
  for (const source of state.sources) source.close();
  state.sources = [];
  let token;
  try {
    // A tenant's key is given its tenant's topic (the answer names it).
    const topics = state.tenant ? undefined : ['instances', 'nodes', 'alerts'];
    token = await api('POST', '/v2/tokens', { topics, ttl_sec: 3600 });
  } catch (error) {
    setLive(false);
    setTimeout(connectEvents, 5000);
    return;
  }
  if (!token.events_url) { $('#live').textContent = 'no event proxy'; return; }
  let open = 0;
  const subscribe = (topic, names, handler) => {
    const source = new EventSource(`${token.events_url}/events/${topic}?token=${encodeURIComponent(token.token)}`);
    source.onopen = () => { open += 1; if (open >= token.topics.length) setLive(true); };
    source.onerror = () => {
      if (source.readyState === EventSource.CLOSED) { setLive(false); setTimeout(connectEvents, 2000); }
    };
    for (const name of names) source.addEventListener(name, (e) => handler(name, JSON.parse(e.data)));
    state.sources.push(source);
  };
  subscribe(state.tenant ? token.topics[0] : 'instances', INSTANCE_EVENTS, (name, payload) => {
    const id = payload.data.instance_id;
    if (name === 'instance.egress_refused') {
      noteRefusal(id, payload.data);
    } else if (name === 'instance.deleted') {
      state.instances.delete(id);
      refusals.delete(id);
      renderInstances();
      if (state.detail === id) renderDetail();
    } else {
      refreshInstance(id).catch(showError);
    }
  });
  if (!state.tenant) {
    subscribe('nodes', ['node.online', 'node.offline'], () => loadNodes().catch(showError));
    subscribe('alerts', ['alert.raised', 'alert.cleared'], (name, payload) => {
      if (name === 'alert.raised') toast(`Alert (${payload.data.level}): ${payload.data.message}`, payload.data.level === 'critical');
      loadAlerts().catch(showError);
    });
  }
  // Tokens last an hour: reconnect with a fresh one before it ends.
  setTimeout(connectEvents, 55 * 60 * 1000);
}

// ---- routing and wiring -------------------------------------------------------

async function route() {
  const hash = location.hash.slice(1) || 'instances';
  const [view, id] = hash.split('/');
  for (const section of document.querySelectorAll('.view')) section.hidden = true;
  for (const link of document.querySelectorAll('nav a')) {
    if (link.dataset.view === (view === 'instance' ? 'instances' : view)) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
  try {
    if (view === 'instance' && id) {
      $('#view-detail').hidden = false;
      state.detail = id;
      await refreshInstance(id);
      return;
    }
    state.detail = null;
    stopLiveView();
    const section = $(`#view-${view}`) ?? $('#view-instances');
    section.hidden = false;
    if (view === 'nodes') await loadNodes();
    if (view === 'metrics') await loadMetrics();
    if (view === 'alerts') await loadAlerts();
    if (view === 'recordings') await loadKeptRecordings();
  } catch (error) { showError(error); }
}

function wire() {
  $('#create-form').addEventListener('submit', async (e) => {
    e.preventDefault();
    const button = $('#create-button');
    button.disabled = true;
    const body = {};
    const image = $('#create-image').value.trim();
    if (image) body.image = image;
    const config = {};
    const number = (sel) => $(sel).value === '' ? undefined : Number($(sel).value);
    if (number('#create-memory') !== undefined) config.memory_gb = number('#create-memory');
    if (number('#create-cpu') !== undefined) config.cpu_cores = number('#create-cpu');
    if (number('#create-idle') !== undefined) config.idle_timeout_minutes = number('#create-idle');
    if ($('#create-record').checked) config.record = true;
    if ($('#create-keep').checked) Object.assign(config, { record: true, keep_recordings: true });
    if (Object.keys(config).length) body.config = config;
    if ($('#create-node').value) body.node_preference = $('#create-node').value;
    try {
      const created = await api('POST', '/v2/instances', body);
      if (!state.instances.has(created.id)) state.instances.set(created.id, created);
      renderInstances();
      toast(`Instance ${created.id.slice(0, 13)}… is starting`);
    } catch (error) { showError(error); } finally { button.disabled = false; }
  });
  $('#filter-status').addEventListener('change', () => loadInstances().catch(showError));
  $('#filter-node').addEventListener('change', () => loadInstances().catch(showError));
  for (const button of document.querySelectorAll('th .sort')) {
    button.addEventListener('click', () => {
      const key = button.dataset.sort;
      state.sort = { key, dir: state.sort.key === key && state.sort.dir === 'desc' ? 'asc' : 'desc' };
      renderInstances();
    });
  }
  for (const button of document.querySelectorAll('[data-period]')) {
    button.addEventListener('click', () => {
      state.period = button.dataset.period;
      for (const b of document.querySelectorAll('[data-period]')) b.setAttribute('aria-pressed', String(b === button));
      loadMetrics().catch(showError);
    });
  }
  for (const tab of document.querySelectorAll('[data-snippet]')) {
    tab.addEventListener('click', () => {
      state.snippet = tab.dataset.snippet;
      for (const t of document.querySelectorAll('[data-snippet]')) t.setAttribute('aria-selected', String(t === tab));
      renderDetail();
    });
  }
  $('#copy-snippet').addEventListener('click', async () => {
    try { await navigator.clipboard.writeText($('#snippet').textContent); toast('Copied'); } catch { toast('Select the code to copy it', true); }
  });
  $('#alert-state').addEventListener('change', () => loadAlerts().catch(showError));
  // Another key may see another part of the fleet: start afresh with it.
  $('#key-button').addEventListener('click', async () => { if (await askKey()) location.reload(); });
  window.addEventListener('hashchange', route);
  wireLiveView();
}

async function start() {
  try {
    const config = await fetch('/ui/config.json').then((r) => r.json());
    if (config.auth_enabled && !state.key) await askKey();
    const me = await api('GET', '/v2/whoami');
    state.me = me;
    if (me.scope === 'tenant') enterTenantMode(me.tenant);
    await loadNodes();
    await loadInstances();
    await loadAlerts();
  } catch (error) { showError(error); }
  await route();
  connectEvents();
}

wire();
start();
// Node resources, and what drives each instance, change without lifecycle
// events: refresh them now and then.
setInterval(() => {
  if (!document.hidden) {
    loadNodes().catch(() => {});
    loadInstances().catch(() => {});
  }
}, 10000);
