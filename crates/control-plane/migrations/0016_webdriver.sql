-- The Chromium version a node runs (WebDriver's browserVersion), and for an
-- instance that is a WebDriver session, who created it (the API key's id,
-- or "anonymous" with authentication off): only they may drive it.
ALTER TABLE nodes ADD COLUMN browser_version TEXT;
ALTER TABLE instances ADD COLUMN webdriver_owner TEXT;
