// A raw WebDriver BiDi client for the tests' scripts: `open(endpoint)`
// connects (an HTTP refusal rejects with its status) and answers `send`
// (the whole answer) and `call` (its result, or a thrown error), commands
// numbered in order; events are ignored.
import WebSocket from 'ws';

export async function open(endpoint) {
  const socket = new WebSocket(endpoint);
  await new Promise((resolve, reject) => {
    socket.once('open', resolve);
    socket.once('error', reject);
    socket.once('unexpected-response', (_, response) => reject(new Error(`HTTP ${response.statusCode}`)));
  });
  let nextId = 1;
  const waiting = new Map();
  socket.on('message', (data) => {
    const message = JSON.parse(data.toString());
    if (message.id !== undefined && waiting.has(message.id)) {
      waiting.get(message.id)(message);
      waiting.delete(message.id);
    }
  });
  const send = (method, params) => {
    const id = nextId++;
    socket.send(JSON.stringify({ id, method, params }));
    return new Promise((resolve) => waiting.set(id, resolve));
  };
  const call = async (method, params) => {
    const answer = await send(method, params);
    if (answer.type !== 'success') throw new Error(`${method}: ${answer.error}: ${answer.message}`);
    return answer.result;
  };
  return { socket, send, call };
}
