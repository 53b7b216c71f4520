"""A Selenium session through a load balancer in front of several control
planes: each command is one request, and the balancer sends each to the next
replica. Selenium 4 for Python, unchanged.

Usage: python3 selenium_replicas.py <remote url> <page url>
Prints one JSON object of what it saw; exits non-zero on the first failure.
"""
import json
import sys

from selenium import webdriver
from selenium.webdriver.common.by import By

remote, page = sys.argv[1], sys.argv[2]
options = webdriver.ChromeOptions()
options.add_argument("--headless=new")
driver = webdriver.Remote(command_executor=remote, options=options)
seen = {"session": driver.session_id}
try:
    driver.get(page)
    seen["title"] = driver.title
    driver.find_element(By.ID, "name").send_keys("Ada")
    driver.find_element(By.ID, "send").click()
    seen["said"] = driver.find_element(By.ID, "said").text
    driver.add_cookie({"name": "kept", "value": "yes"})
    seen["cookie"] = driver.get_cookie("kept")["value"]
    seen["script"] = driver.execute_script("return 6 * 7")
    seen["handles"] = len(driver.window_handles)
finally:
    driver.quit()
print(json.dumps(seen))
