#!/usr/bin/env python3
"""Where an idle browser's memory is: starts EXECUTABLE headless on
about:blank with FLAGS (in a fresh profile, without its sandbox: run it as
root in a throwaway container or VM), waits 10 s, and prints the PSS of
each of its processes by type (from /proc/PID/smaps_rollup) as a Markdown
table.

Usage: bench/chromium_pss.py EXECUTABLE [FLAGS...]
"""
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

PORT = 9444


def descendants(root):
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
                parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
            except OSError:
                pass
    tree = [root]
    for pid in tree:
        tree += [child for child, parent in parents.items() if parent == pid]
    return tree


def main():
    executable, flags = sys.argv[1], sys.argv[2:]
    profile = tempfile.mkdtemp()
    browser = subprocess.Popen(
        [executable, "--headless", "--no-sandbox", f"--remote-debugging-port={PORT}",
         f"--user-data-dir={profile}", *flags, "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{PORT}/json/version")
                break
            except OSError:
                time.sleep(0.1)
        time.sleep(10)
        kinds = {}
        for pid in descendants(browser.pid):
            try:
                # Chromium rewrites its title: arguments end up space-separated.
                words = re.split(r"[\0 ]", open(f"/proc/{pid}/cmdline").read())
                pss = int(re.search(r"Pss:\s+(\d+)", open(f"/proc/{pid}/smaps_rollup").read()).group(1))
            except (OSError, AttributeError):
                continue
            kind = next((w.split("=", 1)[1] for w in words if w.startswith("--type=")), "browser")
            sub = next((w.split("=", 1)[1] for w in words if w.startswith("--utility-sub-type=")), "")
            kinds.setdefault(kind + (f" ({sub})" if sub else ""), []).append(pss / 1024)
        print("| process | count | PSS MiB |")
        print("|---|---|---|")
        for kind, sizes in sorted(kinds.items(), key=lambda item: -sum(item[1])):
            each = ", ".join(f"{size:.1f}" for size in sizes)
            print(f"| {kind} | {len(sizes)} | {sum(sizes):.1f} ({each}) |")
        total = [size for sizes in kinds.values() for size in sizes]
        print(f"| total | {len(total)} | {sum(total):.1f} |")
    finally:
        browser.terminate()
        browser.wait()


if __name__ == "__main__":
    main()
