//! The snapshot capture and restore on a Chromium started by hand: after the
//! profile lost its `localStorage` (removed from disk here, as a write still in
//! flight from a renderer is lost when the browser closes), restoring puts the
//! captured items back in their origin, with the tabs or without, and without
//! a request to the site.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use flotilla_node_agent::config::BASE_CHROMIUM_FLAGS;
use flotilla_node_agent::engine::browser::CdpEndpoint;
use flotilla_node_agent::engine::cdp::CdpClient;
use flotilla_node_agent::snapshot;
use flotilla_testkit::{Page, serve_page};

const CHROMIUM: &str = "/usr/lib/chromium/chromium";

/// A browser process group, killed when dropped.
struct Browser {
    child: tokio::process::Child,
    endpoint: CdpEndpoint,
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            // SAFETY: killpg has no memory-safety preconditions.
            unsafe { libc::killpg(pid as i32, libc::SIGKILL) };
        }
    }
}

async fn launch(profile: &Path) -> Browser {
    let port_file = profile.join("DevToolsActivePort");
    let _ = std::fs::remove_file(&port_file);
    let child = tokio::process::Command::new(CHROMIUM)
        .args(BASE_CHROMIUM_FLAGS)
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--remote-debugging-port=0")
        .arg("--no-sandbox")
        .arg("about:blank")
        .env("HOME", profile)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .expect("chromium starts");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let endpoint = loop {
        if let Ok(text) = std::fs::read_to_string(&port_file) {
            let mut lines = text.lines();
            if let (Some(port), Some(path)) = (lines.next(), lines.next())
                && let Ok(port) = port.trim().parse()
            {
                break CdpEndpoint::on_host(port, path.trim().to_owned());
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "chromium did not write DevToolsActivePort"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    Browser { child, endpoint }
}

/// `Browser.close`, then waits for the process to exit.
async fn close(mut browser: Browser) {
    let client = CdpClient::connect(&browser.endpoint.browser_ws_url())
        .await
        .unwrap();
    let _ = client.send("Browser.close", serde_json::json!({})).await;
    tokio::time::timeout(Duration::from_secs(60), browser.child.wait())
        .await
        .expect("chromium exits after Browser.close")
        .unwrap();
}

#[tokio::test]
async fn browser_restore_puts_back_local_storage_the_profile_lost() {
    flotilla_testkit::init_logging();
    // What the page's own script reads as it loads: a reopened tab loads
    // only once the captured items are back.
    let pages = serve_page(&[(
        "/state",
        "<html><body>state<script>window.readAtLoad = localStorage.getItem('kept')</script></body></html>",
    )])
    .await;
    let state_url = format!("{}/state", pages.base);
    // More origins than scratch tabs open at once: each gets its own.
    let mut others = Vec::new();
    for _ in 0..5 {
        others.push(serve_page(&[("/other", "<title>other</title>")]).await);
    }
    let other_url = |other: &flotilla_testkit::PageServer| format!("{}/other", other.base);
    // Both revive methods (tabs reopened or one blank tab); the profile's
    // localStorage gone from disk, or only changed after the capture; a
    // scratch tab per origin, or one bypassing service workers.
    let cases = [
        (true, true, false),
        (true, true, true),
        (false, true, true),
        (false, false, false),
    ];
    for (reopen_tabs, storage_lost, service_workers) in cases {
        let profile = tempfile::tempdir().unwrap();
        let browser = launch(profile.path()).await;
        let page = Page::open(&browser.endpoint.browser_ws_url(), &state_url)
            .await
            .unwrap();
        // A large item written back before the one the page reads, so a
        // page that did not wait would read too early; and large enough
        // that a scratch tab closed before the browser's storage service
        // had the items would lose them (3 of 5 runs, before the write-back
        // waited for the service's word).
        // And one that would end the script element it is written by, with
        // characters beyond ASCII.
        page.eval(
            "localStorage.setItem('big', 'x'.repeat(4000000)); \
             localStorage.setItem('kept', 'yes'); localStorage.setItem('second', 'too'); \
             localStorage.setItem('markup', '</script><script>localStorage.clear()</script>\\u2028 é€😀'); true",
        )
        .await
        .unwrap();
        drop(page);
        for (index, other) in others.iter().enumerate() {
            let page = Page::open(&browser.endpoint.browser_ws_url(), &other_url(other))
                .await
                .unwrap();
            page.eval(&format!(
                "localStorage.setItem('other', 'origin {index}'); true"
            ))
            .await
            .unwrap();
            drop(page);
        }
        let mut captured = flotilla_node_agent::engine::state::capture(&browser.endpoint)
            .await
            .unwrap();
        let origin = captured
            .local_storage
            .iter_mut()
            .find(|o| o.origin == pages.base)
            .expect("the origin's storage is captured");
        assert_eq!(
            origin.items.len(),
            4,
            "{:?}",
            origin.items.iter().map(|(k, _)| k).collect::<Vec<_>>()
        );
        origin.items.sort_by_key(|(key, _)| key != "big");
        for other in &others {
            assert!(
                captured
                    .local_storage
                    .iter()
                    .any(|o| o.origin == other.base),
                "{:?}",
                captured
                    .local_storage
                    .iter()
                    .map(|o| &o.origin)
                    .collect::<Vec<_>>()
            );
        }
        // Changes after the capture: the capture (the state at park time)
        // wins on restore.
        let page = Page::open(&browser.endpoint.browser_ws_url(), &state_url)
            .await
            .unwrap();
        page.eval("localStorage.setItem('kept', 'later'); localStorage.removeItem('second'); true")
            .await
            .unwrap();
        drop(page);
        close(browser).await;

        let storage = profile.path().join("Default/Local Storage");
        assert!(storage.exists(), "chromium keeps localStorage there");
        if storage_lost {
            std::fs::remove_dir_all(&storage).unwrap();
        }

        let state_loads = || pages.requested().iter().filter(|p| *p == "/state").count();
        let loads_before = state_loads();
        let browser = launch(profile.path()).await;
        // No request reaches the site either way.
        let options = snapshot::RestoreOptions {
            reopen_tabs,
            service_workers,
        };
        flotilla_node_agent::engine::state::restore(&browser.endpoint, &captured, options)
            .await
            .unwrap();
        if reopen_tabs {
            assert_eq!(
                read_at_load(&browser.endpoint, &state_url).await,
                "yes",
                "the reopened tab loaded after the write-back (service_workers {service_workers})"
            );
        }
        assert_eq!(
            state_loads() - loads_before,
            usize::from(reopen_tabs),
            "only a reopened tab loads the page (reopen_tabs {reopen_tabs})"
        );
        let open_pages = page_urls(&browser.endpoint).await;
        if !reopen_tabs {
            // The blank tab that wrote the first origin's items was replaced.
            assert_eq!(open_pages, ["about:blank"], "one blank tab is left");
        }
        for site in std::iter::once(&pages).chain(&others) {
            let scratch = format!("{}/", site.base);
            assert!(
                !open_pages.contains(&scratch),
                "the scratch tabs are closed: {open_pages:?}"
            );
        }
        let check = Page::open(&browser.endpoint.browser_ws_url(), &state_url)
            .await
            .unwrap();
        let values = check
            .eval("['kept', 'second', 'markup'].map((key) => localStorage.getItem(key))")
            .await
            .unwrap();
        let markup = "</script><script>localStorage.clear()</script>\u{2028} é€😀";
        assert_eq!(
            values,
            serde_json::json!(["yes", "too", markup]),
            "reopen_tabs {reopen_tabs}, storage_lost {storage_lost}, service_workers {service_workers}"
        );
        drop(check);
        for (index, other) in others.iter().enumerate() {
            let check = Page::open(&browser.endpoint.browser_ws_url(), &other_url(other))
                .await
                .unwrap();
            assert_eq!(
                check.eval("localStorage.getItem('other')").await.unwrap(),
                format!("origin {index}"),
                "reopen_tabs {reopen_tabs}, storage_lost {storage_lost}, service_workers {service_workers}"
            );
            drop(check);
        }
        // Checked last: a request let go late would have arrived by now.
        for site in std::iter::once(&pages).chain(&others) {
            assert!(
                !site.requested().iter().any(|p| p == "/"),
                "the restore's scratch tabs never reach the sites: {:?}",
                site.requested()
            );
        }
        close(browser).await;
    }
}

#[tokio::test]
async fn browser_a_page_cannot_answer_the_capture_for_another_origin() {
    flotilla_testkit::init_logging();
    let bank = serve_page(&[("/", "<title>bank</title>")]).await;
    let evil = serve_page(&[("/", "<title>evil</title>")]).await;
    let profile = tempfile::tempdir().unwrap();
    let browser = launch(profile.path()).await;
    let ws = browser.endpoint.browser_ws_url();
    let bank_page = Page::open(&ws, &format!("{}/", bank.base)).await.unwrap();
    bank_page
        .eval("localStorage.setItem('balance', '100'); true")
        .await
        .unwrap();
    // Opened last, so read first: it claims to be the bank, with nothing stored.
    let evil_page = Page::open(&ws, &format!("{}/", evil.base)).await.unwrap();
    let forged = format!(
        "const real = JSON.stringify; \
         JSON.stringify = (v) => real(['{}', [], [['stolen', 'yes']], [0, 0]]); true",
        bank.base
    );
    evil_page.eval(&forged).await.unwrap();

    let captured = flotilla_node_agent::engine::state::capture(&browser.endpoint)
        .await
        .unwrap();
    let origins: Vec<&str> = captured
        .local_storage
        .iter()
        .map(|o| o.origin.as_str())
        .collect();
    assert_eq!(
        origins,
        [bank.base.as_str()],
        "the evil page's answer is dropped: {captured:?}"
    );
    assert_eq!(
        captured.local_storage[0].items,
        [("balance".to_owned(), "100".to_owned())]
    );
    let evil_tab = captured
        .tabs
        .iter()
        .find(|t| t.url.starts_with(&evil.base))
        .unwrap();
    assert!(evil_tab.session_storage.is_empty(), "{evil_tab:?}");
    drop((bank_page, evil_page));
    close(browser).await;
}

/// The browser's pages: (target id, URL).
async fn pages_of(endpoint: &CdpEndpoint) -> Vec<(String, String)> {
    let browser = CdpClient::connect(&endpoint.browser_ws_url())
        .await
        .unwrap();
    let targets = browser
        .call(
            "Target.getTargets",
            serde_json::json!({}),
            None,
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    targets["targetInfos"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["type"] == "page")
        .map(|t| {
            let field = |name: &str| t[name].as_str().unwrap_or_default().to_owned();
            (field("targetId"), field("url"))
        })
        .collect()
}

/// The URLs of the browser's pages.
async fn page_urls(endpoint: &CdpEndpoint) -> Vec<String> {
    pages_of(endpoint)
        .await
        .into_iter()
        .map(|(_, url)| url)
        .collect()
}

/// What the tab at `url` read from `localStorage` as its page loaded (it may
/// still be loading when the restore returns).
async fn read_at_load(endpoint: &CdpEndpoint, url: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let target_id = loop {
        let pages = pages_of(endpoint).await;
        if let Some((target_id, _)) = pages.iter().find(|(_, at)| at == url) {
            break target_id.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no tab at {url}: {pages:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let ws = endpoint.browser_ws_url();
    let tab = Page::attach(&ws, &target_id).await.unwrap();
    loop {
        let read = tab
            .eval("'readAtLoad' in window ? String(window.readAtLoad) : 'loading'")
            .await
            .unwrap();
        if read != "loading" {
            return read.as_str().unwrap().to_owned();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the reopened tab never loaded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A client that enabled request interception and was dropped leaves no
/// request paused: dropping it closes its connection, and the browser ends
/// the session (before, the connection stayed open until the browser
/// exited, and every request waited for good).
#[tokio::test]
async fn browser_a_dropped_client_leaves_no_request_paused() {
    flotilla_testkit::init_logging();
    let pages = serve_page(&[("/page", "<title>loaded</title>")]).await;
    let profile = tempfile::tempdir().unwrap();
    let browser = launch(profile.path()).await;
    let client = CdpClient::browser(&browser.endpoint).await.unwrap();
    client
        .call(
            "Fetch.enable",
            serde_json::json!({"patterns": [{"urlPattern": "*"}]}),
            None,
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    drop(client);
    let url = format!("{}/page", pages.base);
    let page = tokio::time::timeout(
        Duration::from_secs(60),
        Page::open(&browser.endpoint.browser_ws_url(), &url),
    )
    .await
    .expect("the page loads: nothing holds its request")
    .unwrap();
    assert_eq!(page.eval("document.title").await.unwrap(), "loaded");
    drop(page);
    close(browser).await;
}
