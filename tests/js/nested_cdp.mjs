// Sends pinned commands nested in Target.sendMessageToTarget (the way a
// client could try to get around the gateway's pins) and prints what the
// browser answered: {"download": <answer to a nested Page.setDownloadBehavior
// with downloadPath /instance/home>, "extension": <answer to a nested
// Extensions.loadUnpacked>, "clicked": <a download started in the page>}.
// Usage: node nested_cdp.mjs <urls.debug> <file name>
import WebSocket from 'ws';

const [debugUrl, name] = process.argv.slice(2);
const socket = new WebSocket(debugUrl, { perMessageDeflate: false });
await new Promise((resolve, reject) => { socket.once('open', resolve); socket.once('error', reject); });
let nextId = 1;
const pending = new Map();
const nested = new Map();
socket.on('message', (data) => {
  const message = JSON.parse(data.toString());
  if (message.id && pending.has(message.id)) {
    pending.get(message.id)(message);
    pending.delete(message.id);
  } else if (message.method === 'Target.receivedMessageFromTarget') {
    const inner = JSON.parse(message.params.message);
    if (inner.id && nested.has(inner.id)) {
      nested.get(inner.id)(inner);
      nested.delete(inner.id);
    }
  }
});
const call = (method, params = {}) => new Promise((resolve) => {
  const id = nextId++;
  pending.set(id, resolve);
  socket.send(JSON.stringify({ id, method, params }));
});
let innerId = 1000;
const through = (sessionId, method, params) => new Promise((resolve) => {
  const id = innerId++;
  nested.set(id, resolve);
  call('Target.sendMessageToTarget', { sessionId, message: JSON.stringify({ id, method, params }) });
});
const timeout = setTimeout(() => { console.error('timed out'); process.exit(2); }, 60_000);

const { result: { targetId } } = await call('Target.createTarget', { url: 'about:blank' });
const { result: { sessionId: page } } = await call('Target.attachToTarget', { targetId, flatten: false });
const { result: { targetInfo: { targetId: browserTarget } } } = await call('Target.getTargetInfo');
const { result: { sessionId: browser } } = await call('Target.attachToTarget', { targetId: browserTarget, flatten: false });
const download = await through(page, 'Page.setDownloadBehavior', { behavior: 'allow', downloadPath: '/instance/home' });
const extension = await through(browser, 'Extensions.loadUnpacked', { path: '/instance/home' });
const clicked = await through(page, 'Runtime.evaluate', {
  expression: `document.body.innerHTML = '<a id=g href="data:text/plain,nested" download="${name}">g</a>'; document.getElementById('g').click(); true`,
});
console.log(JSON.stringify({ download, extension, clicked }));
clearTimeout(timeout);
socket.close();
