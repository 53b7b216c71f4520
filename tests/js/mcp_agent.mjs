// A scripted AI agent on Flotilla's MCP server with the official TypeScript
// SDK: open a local form, read the snapshot, fill and send it by references,
// wait for the answer, take a screenshot, read the console; then end the
// session. Usage: node mcp_agent.mjs <control plane URL> <API key> <form URL>
// Prints one JSON object of what it saw.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const [base, key, form] = process.argv.slice(2);
const transport = new StreamableHTTPClientTransport(new URL(`${base}/mcp`), {
  requestInit: { headers: { Authorization: `Bearer ${key}` } },
});
const client = new Client({ name: 'flotilla-test-agent', version: '1.0.0' });
await client.connect(transport);

const textOf = (result) => result.content.filter((b) => b.type === 'text').map((b) => b.text).join('\n');
async function call(name, args = {}) {
  const result = await client.callTool({ name, arguments: args });
  if (result.isError) throw new Error(`${name} failed: ${textOf(result)}`);
  return result;
}
const ref = (snapshot, pattern) => {
  const match = snapshot.match(new RegExp(`${pattern}.*\\[ref=(e\\d+)\\]`));
  if (!match) throw new Error(`no ${pattern} in the snapshot:\n${snapshot}`);
  return match[1];
};

const seen = {};
seen.tools = (await client.listTools()).tools.map((t) => t.name).sort();
const created = textOf(await call('browser_create', { url: form }));
seen.instance = created.match(/Created browser (\S+) /)[1];
const snapshot = textOf(await call('browser_snapshot'));
seen.snapshot = snapshot;
await call('browser_type', { ref: ref(snapshot, 'textbox "Name"'), text: 'Ada' });
await call('browser_select_option', { ref: ref(snapshot, 'combobox "Colour"'), values: ['blue'] });
await call('browser_click', { ref: ref(snapshot, 'button "Send"') });
await call('browser_wait_for', { text: 'Hello, Ada (blue)' });
const shot = await call('browser_screenshot');
const image = shot.content.find((b) => b.type === 'image');
seen.image_type = image.mimeType;
seen.png = Buffer.from(image.data, 'base64').subarray(0, 8).toString('hex');
seen.console = textOf(await call('browser_console_messages'));
seen.evaluated = textOf(await call('browser_evaluate', { expression: "document.getElementById('out').textContent" }));
const wrong = await client.callTool({ name: 'browser_click', arguments: { ref: 'e999999999' } });
seen.wrong_ref = { is_error: wrong.isError === true, text: textOf(wrong) };
const missing = await client.callTool({ name: 'browser_click', arguments: {} });
seen.missing_ref = { is_error: missing.isError === true, text: textOf(missing) };
await transport.terminateSession();
await client.close();
console.log(JSON.stringify(seen));
