"""A small Selenium suite, as a user's test would drive Flotilla: Selenium 4
for Python (PyPI `selenium`), unchanged, pointed at a remote URL.

Usage: python3 selenium_suite.py <remote url> <site base url> [classic|bidi|firefox]
In `classic` mode the session sets `goog:chromeOptions.prefs`; in `bidi` mode
it asks for WebDriver BiDi (`webSocketUrl`) and
listens to console events over it; chromedriver then answers prompts itself
(BiDi's user prompt handling, the same with a local chromedriver), so the
alert step is left to the classic mode. In `firefox` mode the session is
Firefox's (`FirefoxOptions`, preferences, BiDi on; no CDP).
Prints one JSON object of what it saw; exits non-zero on the first failure.
"""
import json
import os
import sys
import tempfile
import time

from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import Select, WebDriverWait

remote, site = sys.argv[1], sys.argv[2]
mode = sys.argv[3] if len(sys.argv) > 3 else "classic"
firefox = mode == "firefox"
bidi = mode in ("bidi", "firefox")
if firefox:
    options = webdriver.FirefoxOptions()
    options.add_argument("-headless")
    options.add_argument("--width=1024")
    options.add_argument("--height=768")
    # Preferences, as suites set them: a language, and downloads into a
    # folder of the client's (Flotilla's downloads stay the instance's).
    options.set_preference("intl.accept_languages", "fr-FR,fr")
    options.set_preference("browser.download.folderList", 2)
    options.set_preference("browser.download.dir", "/home/tester/Downloads")
else:
    options = webdriver.ChromeOptions()
    options.add_argument("--headless=new")
    options.add_argument("--window-size=1024,768")
options.set_capability("flotilla:options", {"idle_timeout_minutes": 10})
# Grid's managed downloads, and in bidi mode WebDriver BiDi (webSocketUrl).
options.enable_downloads = True
options.enable_bidi = bidi
if mode == "classic":
    # Preferences, as suites set them: a language, and a download folder on
    # the client's machine (Flotilla's downloads stay the instance's).
    options.add_experimental_option(
        "prefs",
        {"intl.accept_languages": "fr-FR,fr", "download.default_directory": "/home/tester/Downloads"},
    )
driver = webdriver.Remote(command_executor=remote, options=options)
seen = {"session": driver.session_id, "capabilities": driver.capabilities}
try:
    wait = WebDriverWait(driver, 30)
    driver.get(f"{site}/")
    seen["title"] = driver.title
    seen["languages"] = driver.execute_script("return navigator.languages")
    driver.find_element(By.ID, "name").send_keys("Ada")
    Select(driver.find_element(By.ID, "color")).select_by_value("blue")
    driver.find_element(By.ID, "go").click()
    seen["greeting"] = wait.until(EC.visibility_of_element_located((By.ID, "out"))).text
    seen["script"] = driver.execute_script("return 6 * 7")
    seen["async_script"] = driver.execute_async_script(
        "const done = arguments[arguments.length - 1]; setTimeout(() => done('later'), 10)"
    )
    if not bidi:
        driver.execute_script("setTimeout(() => alert('attention'), 10)")
        alert = wait.until(EC.alert_is_present())
        seen["alert"] = alert.text
        alert.accept()
    driver.switch_to.frame("inner")
    seen["frame"] = driver.find_element(By.TAG_NAME, "p").text
    driver.switch_to.default_content()
    first = driver.current_window_handle
    driver.switch_to.new_window("tab")
    driver.get(f"{site}/?other")
    seen["windows"] = len(driver.window_handles)
    seen["other_title"] = driver.title
    driver.close()
    driver.switch_to.window(first)
    driver.add_cookie({"name": "flavour", "value": "oatmeal"})
    seen["cookie"] = driver.get_cookie("flavour")["value"]
    png = driver.get_screenshot_as_png()
    seen["screenshot"] = png[:8] == b"\x89PNG\r\n\x1a\n"
    seen["initial_size"] = driver.get_window_size()
    driver.set_window_size(800, 600)
    seen["size"] = driver.get_window_size()
    if not firefox:
        seen["cdp"] = driver.execute_cdp_cmd(
            "Runtime.evaluate", {"expression": "1 + 2", "returnByValue": True}
        )["result"]["value"]
    seen["url"] = driver.current_url

    # A file from this machine's disk, typed into a file input.
    with tempfile.TemporaryDirectory() as local:
        path = os.path.join(local, "upload me.txt")
        with open(path, "w") as f:
            f.write("from the client's disk")
        driver.find_element(By.ID, "file").send_keys(path)
    seen["uploaded"] = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "const file = document.getElementById('file').files[0];"
        "file.text().then(text => done(file.name + ': ' + text))"
    )

    # A download, fetched back through Grid's managed downloads.
    driver.find_element(By.ID, "dl").click()
    deadline = time.time() + 30
    while "hello.txt" not in driver.get_downloadable_files() and time.time() < deadline:
        time.sleep(0.1)
    seen["downloadable"] = driver.get_downloadable_files()
    with tempfile.TemporaryDirectory() as local:
        driver.download_file("hello.txt", local)
        with open(os.path.join(local, "hello.txt")) as f:
            seen["downloaded"] = f.read()
    driver.delete_downloadable_files()
    seen["after_delete"] = driver.get_downloadable_files()

    # WebDriver BiDi through the front door: console events.
    if bidi:
        logs = []
        driver.script.add_console_message_handler(logs.append)
        driver.execute_script("console.log('over bidi')")
        deadline = time.time() + 30
        while not logs and time.time() < deadline:
            time.sleep(0.1)
        seen["bidi_console"] = [entry.text for entry in logs]
finally:
    driver.quit()
print(json.dumps(seen))
