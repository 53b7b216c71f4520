"""Connects to Flotilla with Python's Playwright over its own protocol
(chromium.connect; it never launches or downloads a browser), opens a page
and saves a download on this disk. Prints what it saw as JSON.

Usage: python3 playwright_connect.py <ws url> <site url> <out dir>
"""

import json
import os
import sys

from playwright.sync_api import sync_playwright
from playwright._repo_version import version


def main() -> None:
    ws_url, site_url, out_dir = sys.argv[1:4]
    seen = {"client": version}
    with sync_playwright() as playwright:
        browser = playwright.chromium.connect(ws_url, timeout=60_000)
        try:
            seen["browser_version"] = browser.version
            context = browser.contexts[0]
            page = context.new_page()
            page.goto(site_url, timeout=60_000)
            seen["title"] = page.title()
            page.set_content(
                '<a id=get href="data:text/plain,from%20python" download="p.txt">get</a>'
            )
            with page.expect_download() as info:
                page.click("#get")
            saved = os.path.join(out_dir, "python.txt")
            info.value.save_as(saved)
            with open(saved, encoding="utf-8") as file:
                seen["saved"] = file.read()
            page.close()
        finally:
            browser.close()
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
