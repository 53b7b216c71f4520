"""Two API keys on Flotilla's MCP server: key A opens a session with the
official Python SDK (`mcp`); key B, which learns A's `Mcp-Session-Id`,
sends requests naming it, as an attacker would (plain HTTP); A's session
goes on afterwards.

Usage: python3 mcp_two_keys.py <control plane URL> <key A> <key B>
Prints one JSON object of what each saw.
"""

import asyncio
import json
import sys

import httpx2 as httpx
from mcp.client.session import ClientSession
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client


async def main(base, key_a, key_b):
    seen = {}
    session_ids = []

    async def capture(response):
        if "mcp-session-id" in response.headers:
            session_ids.append(response.headers["mcp-session-id"])

    client = create_mcp_http_client(headers={"Authorization": f"Bearer {key_a}"})
    client.event_hooks["response"].append(capture)
    async with client:
        async with streamable_http_client(f"{base}/mcp", http_client=client) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                tools = await session.list_tools()
                seen["a_tools"] = len(tools.tools)
                victim = session_ids[0]
                attacker = {"Authorization": f"Bearer {key_b}", "mcp-session-id": victim,
                            "accept": "application/json, text/event-stream",
                            "mcp-protocol-version": "2025-11-25"}
                async with httpx.AsyncClient() as raw:
                    call = {"jsonrpc": "2.0", "id": 99, "method": "tools/call",
                            "params": {"name": "browser_list", "arguments": {}}}
                    posted = await raw.post(f"{base}/mcp", json=call, headers=attacker)
                    seen["b_post"] = {"status": posted.status_code, "body": posted.text[:300]}
                    streamed = await raw.get(f"{base}/mcp", headers=attacker)
                    seen["b_get"] = streamed.status_code
                    ended = await raw.delete(f"{base}/mcp", headers=attacker)
                    seen["b_delete"] = ended.status_code
                    made_up = dict(attacker, **{"mcp-session-id": "0193d6a4-0000-7000-8000-00000000beef"})
                    unknown = await raw.post(f"{base}/mcp", json=call, headers=made_up)
                    seen["unknown_post"] = {"status": unknown.status_code, "body": unknown.text[:300]}
                # A's session is untouched.
                tools = await session.list_tools()
                seen["a_tools_after"] = len(tools.tools)
    print(json.dumps(seen))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
