"""A scripted AI agent on Flotilla's MCP server with the official Python SDK
(`mcp`): open a local form, read the snapshot, fill and send it by
references, wait for the answer, take a screenshot, read the console.

Usage: python3 mcp_agent.py <control plane URL> <API key> <form URL> [image]
Prints one JSON object of what it saw. On the image `firefox` the console
is not read (a tool error, kept in what it saw).
"""

import asyncio
import base64
import json
import re
import sys
import time

from mcp.client.session import ClientSession
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client


def text_of(result):
    return "\n".join(block.text for block in result.content if getattr(block, "type", "") == "text")


def ref(snapshot, pattern):
    match = re.search(pattern + r'.*\[ref=(e\d+)\]', snapshot)
    if not match:
        raise SystemExit(f"no {pattern} in the snapshot:\n{snapshot}")
    return match.group(1)


async def main(base, key, form, image=None):
    seen = {}
    client = create_mcp_http_client(headers={"Authorization": f"Bearer {key}"})
    async with client:
        async with streamable_http_client(f"{base}/mcp", http_client=client) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()

                async def call(name, **arguments):
                    result = await session.call_tool(name, arguments)
                    if result.is_error:
                        raise SystemExit(f"{name} failed: {text_of(result)}")
                    return result

                tools = await session.list_tools()
                seen["tools"] = sorted(tool.name for tool in tools.tools)
                options = {"image": image} if image else {}
                created = text_of(await call("browser_create", url=form, **options))
                seen["instance"] = re.search(r"Created browser (\S+) ", created).group(1)
                # The instance's view says this session drives it.
                view = await client.get(f"{base}/v2/instances/{seen['instance']}")
                seen["drivers"] = view.json().get("drivers")
                snapshot = text_of(await call("browser_snapshot"))
                seen["snapshot"] = snapshot
                name = ref(snapshot, r'textbox "Name"')
                colour = ref(snapshot, r'combobox "Colour"')
                send = ref(snapshot, r'button "Send"')
                await call("browser_type", ref=name, text="Ada", element="the name field")
                await call("browser_select_option", ref=colour, values=["Blue"])
                await call("browser_click", ref=send, element="the Send button")
                await call("browser_wait_for", text="Hello, Ada (blue)")
                shot = await call("browser_screenshot")
                images = [block for block in shot.content if getattr(block, "type", "") == "image"]
                seen["image_type"] = images[0].mime_type
                seen["png"] = base64.b64decode(images[0].data)[:8].hex()
                console = await session.call_tool("browser_console_messages", {})
                seen["console"] = text_of(console)
                seen["console_is_error"] = console.is_error
                seen["evaluated"] = text_of(
                    await call("browser_evaluate", expression="document.getElementById('out').textContent")
                )
                # Values the page writes out itself: deeper than a JSON
                # reader's 128 levels, and far larger than a tool's answer.
                deep = await session.call_tool("browser_evaluate", {
                    "expression": "(() => { let v = 'bottom'; for (let i = 0; i < 200; i++) v = [v]; return v; })()"})
                seen["deep"] = {"is_error": deep.is_error, "text": text_of(deep)}
                large = await session.call_tool("browser_evaluate", {"expression": "Array(4e6).fill(0)"})
                seen["large"] = {"is_error": large.is_error, "length": len(text_of(large)),
                                 "end": text_of(large)[-60:]}
                wrong = await session.call_tool("browser_click", {"ref": "e999999999"})
                seen["wrong_ref"] = {"is_error": wrong.is_error, "text": text_of(wrong)}
                unknown = await session.call_tool("browser_navigate", {"url": "file:///etc/passwd"})
                seen["file_url"] = {"is_error": unknown.is_error, "text": text_of(unknown)}
                seen["tabs"] = text_of(await call("browser_tabs", action="list"))
                photo = ref(snapshot, r'button "Photo"')
                content = base64.b64encode(b"\x89PNG!").decode()
                await call("browser_file_upload", ref=photo, files=[{"name": "photo.png", "content_base64": content}])
                hostile = {}
                for label, files in [
                    ("traversal", [{"name": "../../etc/cron.d/x", "content_base64": content}]),
                    ("folder", [{"name": "a/b.png", "content_base64": content}]),
                    ("bad_base64", [{"name": "x.png", "content_base64": "%%% not base64"}]),
                    ("none", []),
                ]:
                    refused = await session.call_tool("browser_file_upload", {"ref": photo, "files": files})
                    hostile[label] = {"is_error": refused.is_error, "text": text_of(refused)}
                seen["hostile_uploads"] = hostile
                seen["uploaded"] = text_of(await call(
                    "browser_evaluate",
                    expression="(() => { const f = document.getElementById('photo').files[0]; return f.name + ':' + f.size; })()",
                ))
                await call("browser_click", ref=ref(snapshot, r'link "Get the report"'))
                deadline = time.monotonic() + 60
                while True:
                    downloads = text_of(await call("browser_downloads"))
                    if "report.txt (10 bytes" in downloads and "Complete" in downloads or time.monotonic() > deadline:
                        break
                    await call("browser_wait_for", time=0.2)
                seen["downloads"] = downloads
                # Tabs opened, listed and closed; back; a reference of a page
                # that is gone names nothing on the next page, even once that
                # page has references of its own.
                opened = text_of(await call("browser_tabs", action="new", url=form))
                second = re.search(r"- Tab: (\S+)", opened).group(1)
                listed = text_of(await call("browser_tabs", action="list"))
                closed_tab = text_of(await call("browser_tabs", action="close", tab=second))
                await call("browser_navigate", url=form + "?again")
                await call("browser_snapshot")
                stale = await session.call_tool("browser_click", {"ref": send})
                back = text_of(await call("browser_back"))
                seen["tab_flow"] = {
                    "listed": listed.count("  id: "),
                    "after_close": closed_tab.count("  id: "),
                    "stale_is_error": stale.is_error,
                    "stale": text_of(stale),
                    "back": back,
                }
                handoff = text_of(await call("browser_handoff", ttl_sec=60))
                seen["handoff"] = handoff
                link_url = re.search(r"person: (\S+)", handoff).group(1)
                link_id = re.search(r"Link id: (\S+)", handoff).group(1)

                async def person():
                    # Whoever has the link: no API key.
                    async with create_mcp_http_client() as browser:
                        page = await browser.get(link_url)
                        seen["page_has_button"] = 'data-testid="hand-back"' in page.text
                        done = await browser.post(f"{link_url}/done")
                        seen["done_status"] = done.status_code
                        again = await browser.post(f"{link_url}/done")
                        seen["again_status"] = again.status_code

                waited, _ = await asyncio.gather(
                    call("browser_handoff", wait_for_link=link_id, timeout_sec=60), person()
                )
                seen["handed_back"] = text_of(waited)
                # Last: the browser reaches the control plane no more through MCP.
                closed = await session.call_tool("browser_navigate", {"url": f"{base}/health"})
                seen["control_plane_url"] = {"is_error": closed.is_error, "text": text_of(closed)}
    print(json.dumps(seen))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
