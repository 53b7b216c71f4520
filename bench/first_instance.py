#!/usr/bin/env python3
"""Time to a first instance: from the start command to `/health` healthy, and
to a first instance `running`, for the image (the README's all-in-one
`podman run`, read from README.md) against `scripts/run` from a built
checkout, on the same machine in the same run.

    bench/first_instance.py [ROUNDS]      (3 by default; run as root, after scripts/image)

Each round starts afresh (a new container; a new data directory for
scripts/run) and is stopped before the next. Prints one line per round and
the medians.
"""

import json
import os
import pathlib
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent.parent
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(method, url, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read() or b"null")


def until(probe, deadline=300):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        try:
            if probe():
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.05)
    raise SystemExit("FAIL: not within the deadline")


def readme_podman_run():
    """The README's `podman run` snippet, as one argument list."""
    readme = (ROOT / "README.md").read_text()
    block = next(b for b in re.findall(r"```sh\n(.*?)```", readme, re.S) if "podman run" in b)
    return block.replace("\\\n", " ").split()


def measure(start, base):
    started = time.monotonic()
    process = start()
    try:
        until(lambda: call("GET", f"{base}/health")["status"] == "healthy")
        healthy = time.monotonic() - started
        created = call("POST", f"{base}/v2/instances", {})
        until(lambda: call("GET", f"{base}/v2/instances/{created['id']}")["status"] == "running")
        return healthy, time.monotonic() - started
    finally:
        process()


def image_round():
    port = free_port()
    command = [a.replace("127.0.0.1:8080", f"127.0.0.1:{port}") for a in readme_podman_run()]
    name = f"flotilla-bench-{os.getpid()}-{port}"
    command.insert(command.index("run") + 1, f"--name={name}")
    unified = pathlib.Path("/sys/fs/cgroup/unified/cgroup.controllers")
    if unified.exists() and unified.read_text().strip():
        command[1:1] = ["--runtime", "runc"]

    def start():
        subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return lambda: subprocess.run(["podman", "rm", "--force", "--time=10", name],
                                      capture_output=True)
    return measure(start, f"http://127.0.0.1:{port}")


def source_round():
    port = free_port()
    data = tempfile.mkdtemp(prefix="flotilla-bench-")

    def start():
        process = subprocess.Popen(
            ["scripts/run", "--listen", f"127.0.0.1:{port}"], cwd=ROOT,
            env={**os.environ, "FLOTILLA_DATA_DIR": data},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

        def stop():
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=60)
            subprocess.run(["rm", "-rf", data])
        return stop
    return measure(start, f"http://127.0.0.1:{port}")


def main():
    results = {"image (podman run, README)": [], "source (scripts/run, built)": []}
    for round_ in range(ROUNDS):
        for (label, runs), round_fn in zip(results.items(), (image_round, source_round)):
            healthy, first = round_fn()
            runs.append((healthy, first))
            print(f"round {round_ + 1} {label}: /health {healthy:.2f} s, first instance running {first:.2f} s",
                  flush=True)
    for label, runs in results.items():
        print(f"median {label}: /health {statistics.median(r[0] for r in runs):.2f} s, "
              f"first instance running {statistics.median(r[1] for r in runs):.2f} s")


if __name__ == "__main__":
    main()
