"""A small Selenium suite, as a user's test would drive Flotilla: Selenium 4
for Python (PyPI `selenium`), unchanged, pointed at a remote URL.

Usage: python3 selenium_suite.py <remote url> <site base url>
Prints one JSON object of what it saw; exits non-zero on the first failure.
"""
import json
import sys

from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import Select, WebDriverWait

remote, site = sys.argv[1], sys.argv[2]
options = webdriver.ChromeOptions()
options.add_argument("--headless=new")
options.add_argument("--window-size=1024,768")
options.set_capability("flotilla:options", {"idle_timeout_minutes": 10})
driver = webdriver.Remote(command_executor=remote, options=options)
seen = {"session": driver.session_id, "capabilities": driver.capabilities}
try:
    wait = WebDriverWait(driver, 30)
    driver.get(f"{site}/")
    seen["title"] = driver.title
    driver.find_element(By.ID, "name").send_keys("Ada")
    Select(driver.find_element(By.ID, "color")).select_by_value("blue")
    driver.find_element(By.ID, "go").click()
    seen["greeting"] = wait.until(EC.visibility_of_element_located((By.ID, "out"))).text
    seen["script"] = driver.execute_script("return 6 * 7")
    seen["async_script"] = driver.execute_async_script(
        "const done = arguments[arguments.length - 1]; setTimeout(() => done('later'), 10)"
    )
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
    seen["screenshot"] = {"png": png[:8] == b"\x89PNG\r\n\x1a\n", "bytes": len(png)}
    seen["initial_size"] = driver.get_window_size()
    driver.set_window_size(800, 600)
    seen["size"] = driver.get_window_size()
    seen["cdp"] = driver.execute_cdp_cmd(
        "Runtime.evaluate", {"expression": "1 + 2", "returnByValue": True}
    )["result"]["value"]
    seen["url"] = driver.current_url
finally:
    driver.quit()
print(json.dumps(seen))
