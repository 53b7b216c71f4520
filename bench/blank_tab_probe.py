#!/usr/bin/env python3
"""How much sooner a tab that is already open (a blank tab left a second)
reaches a page's first request back than a tab created at the URL: starts
EXECUTABLE headless on a fresh profile (without its sandbox: run it as root
in a throwaway container or VM) and a local HTTP server whose page stores
a localStorage item and then requests /done; ROUNDS rounds of each way,
alternating, each on the other of two sites (127.0.0.1, localhost); prints
every sample and the medians in ms, from the CDP call to /done arriving.

The question it answered (bench/RESULTS.md, tenth session): whether the
write-back should lend the fresh browser's own blank tab to its first
origin instead of opening a scratch tab. Needs `pip install websocket-client`.

Usage: bench/blank_tab_probe.py EXECUTABLE [ROUNDS]
"""
import http.server
import json
import os
import shutil
import socketserver
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import websocket

DONE = {}


class Page(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path.startswith("/done?"):
            DONE[self.path[len("/done?"):]] = time.perf_counter()
            self.send_response(204)
            self.end_headers()
            return
        body = (b"<!doctype html><script>localStorage.setItem('k', 'v'); "
                b"fetch('/done?' + location.hash.slice(1))</script>")
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Cdp:
    def __init__(self, url):
        self.ws = websocket.create_connection(url, suppress_origin=True)
        self.next_id = 0

    def call(self, method, params=None, session=None):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self.ws.send(json.dumps(message))
        while True:
            answer = json.loads(self.ws.recv())
            if answer.get("id") == self.next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer["result"]


def until_done(key, started):
    deadline = time.perf_counter() + 30
    while key not in DONE:
        if time.perf_counter() > deadline:
            raise RuntimeError(f"the page of round {key} never requested /done")
        time.sleep(0.0005)
    return (DONE[key] - started) * 1000


def main():
    executable = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Page)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    profile = tempfile.mkdtemp()
    browser = subprocess.Popen(
        [executable, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--remote-debugging-port=0", f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        active = os.path.join(profile, "DevToolsActivePort")
        deadline = time.time() + 30
        while not os.path.exists(active) or len(open(active).read().split("\n")) < 2:
            if time.time() > deadline:
                raise RuntimeError("the browser did not start")
            time.sleep(0.05)
        port_line, path = open(active).read().split("\n")[:2]
        cdp = Cdp(f"ws://127.0.0.1:{port_line}{path}")
        created, lent = [], []
        time.sleep(1.5)
        for n in range(2 * rounds):
            host = ("127.0.0.1", "localhost")[n % 2]
            key = f"round{n}"
            url = f"http://{host}:{port}/#{key}"
            if n % 2 == 0:
                started = time.perf_counter()
                target = cdp.call("Target.createTarget", {"url": url, "background": True})
                created.append(until_done(key, started))
            else:
                target = cdp.call("Target.createTarget", {"url": "about:blank", "background": True})
                time.sleep(1.0)
                started = time.perf_counter()
                session = cdp.call("Target.attachToTarget",
                                   {"targetId": target["targetId"], "flatten": True})["sessionId"]
                cdp.call("Page.navigate", {"url": url}, session)
                lent.append(until_done(key, started))
            time.sleep(0.3)
            cdp.call("Target.closeTarget", {"targetId": target["targetId"]})
            time.sleep(0.3)
        for name, samples in (("createTarget at the URL", created),
                              ("a blank tab open a second, navigated", lent)):
            shown = ", ".join(f"{s:.1f}" for s in sorted(samples))
            print(f"{name}: median {statistics.median(samples):.1f} ms ({shown})")
    finally:
        browser.kill()
        browser.wait()
        server.shutdown()
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    main()
