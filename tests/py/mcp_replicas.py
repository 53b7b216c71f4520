"""An AI agent on Flotilla's MCP server through a load balancer in front of
two control planes, with the official Python SDK (`mcp`), unchanged: each of
its requests goes to the next replica. Halfway through its task it writes
`<pause file>` and waits for `<resume file>` (the test kills a replica
meanwhile), then finishes through whichever replica is left and ends its
session. A second session opens a browser and then its agent vanishes
without ending it (its end is the idle timeout's).

Usage: python3 mcp_replicas.py <base URL> <form URL> <pause file> <resume file>
Prints one JSON object of what it saw; exits non-zero on the first failure.
"""

import asyncio
import json
import os
import re
import sys
import time

from mcp.client.session import ClientSession
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

from mcp_agent import ref, text_of


def session_recorder(seen, key):
    """An httpx response hook that keeps the session id the server names."""

    async def record(response):
        session = response.headers.get("mcp-session-id")
        if session:
            seen.setdefault(key, session)

    return record


async def call(session, name, **arguments):
    result = await session.call_tool(name, arguments)
    if result.is_error:
        raise SystemExit(f"{name} failed: {text_of(result)}")
    return text_of(result)


async def wait_for_file(path, deadline_sec=180):
    end = time.monotonic() + deadline_sec
    while not os.path.exists(path):
        if time.monotonic() > end:
            raise SystemExit(f"{path} never appeared")
        await asyncio.sleep(0.2)


async def the_task(base, form, pause, resume, seen):
    client = create_mcp_http_client()
    client.event_hooks["response"].append(session_recorder(seen, "session"))
    async with client:
        async with streamable_http_client(f"{base}/mcp", http_client=client) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                created = await call(session, "browser_create", url=form)
                seen["instance"] = re.search(r"Created browser (\S+) ", created).group(1)
                snapshot = await call(session, "browser_snapshot")
                name = ref(snapshot, r'textbox')
                send = ref(snapshot, r'button "Send"')
                await call(session, "browser_type", ref=name, text="Ada", element="the name field")
                # More requests of the session, so that the balancer's
                # round-robin (which the agents' heartbeats share) has sent
                # some to each replica before the pause.
                for _ in range(12):
                    await call(session, "browser_list")
                view = await client.get(f"{base}/v2/instances/{seen['instance']}")
                seen["drivers_before"] = view.json().get("drivers")
                with open(pause, "w") as marker:
                    json.dump(seen, marker)
                await wait_for_file(resume)
                # The same session, its current instance and the references
                # of its last snapshot, through the replica left.
                await call(session, "browser_click", ref=send, element="the Send button")
                await call(session, "browser_wait_for", text="Hello, Ada")
                seen["title"] = await call(session, "browser_evaluate", expression="document.title")
                seen["list"] = await call(session, "browser_list")
                view = await client.get(f"{base}/v2/instances/{seen['instance']}")
                seen["drivers_after"] = view.json().get("drivers")


async def the_vanished_agent(base, seen):
    client = create_mcp_http_client()
    client.event_hooks["response"].append(session_recorder(seen, "vanished_session"))
    async with client:
        async with streamable_http_client(
            f"{base}/mcp", http_client=client, terminate_on_close=False
        ) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                created = await call(session, "browser_create")
                seen["vanished_instance"] = re.search(r"Created browser (\S+) ", created).group(1)


async def main(base, form, pause, resume):
    seen = {}
    await the_vanished_agent(base, seen)
    await the_task(base, form, pause, resume, seen)
    print(json.dumps(seen))


asyncio.run(main(*sys.argv[1:5]))
