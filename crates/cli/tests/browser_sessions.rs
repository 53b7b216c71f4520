//! What automation users expect of a browser session, with real Chromium:
//! an upstream proxy per instance (a real tinyproxy with Basic auth).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use flotilla_testkit::{
    BROWSER_DEADLINE, Page, StatusCode, browser_processes, serve_page, spawn_serve_with, wait_until,
};

const PROXY_USER: &str = "flotilla";
const PROXY_PASSWORD: &str = "s3cret-upstream-password";

/// Debian's tinyproxy on a free loopback port, wanting Basic credentials and
/// logging every connection; stopped on drop.
struct Tinyproxy {
    child: std::process::Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tinyproxy {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = dir.path().join("tinyproxy.log");
        let config = dir.path().join("tinyproxy.conf");
        std::fs::write(
            &config,
            format!(
                "Port {port}\nListen 127.0.0.1\nTimeout 60\nUser nobody\nGroup nogroup\n\
                 LogFile \"{}\"\nLogLevel Info\nMaxClients 50\nAllow 127.0.0.1\n\
                 BasicAuth {PROXY_USER} {PROXY_PASSWORD}\n",
                log.display()
            ),
        )
        .unwrap();
        let binary = if std::path::Path::new("/usr/bin/tinyproxy").exists() {
            "/usr/bin/tinyproxy"
        } else {
            "tinyproxy"
        };
        let child = std::process::Command::new(binary)
            .args(["-d", "-c"])
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("tinyproxy starts (scripts/install-deps --test installs it)");
        Self {
            child,
            port,
            log,
            _dir: dir,
        }
    }

    fn logged(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Tinyproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn proxy_body(port: u16, password: &str) -> String {
    format!(
        r#"{{"config": {{"proxy": {{"server": "http://127.0.0.1:{port}", "username": "{PROXY_USER}", "password": "{password}"}}}}}}"#
    )
}

#[tokio::test]
async fn browser_an_upstream_proxy_carries_every_request_and_keeps_its_credentials() {
    let proxy = Tinyproxy::start();
    // The site is reachable only through the proxy: egress opens the proxy,
    // not the site.
    let site = serve_page(&[("/", "<title>via the upstream proxy</title>")]).await;
    let proxy_addr = format!("127.0.0.1:{}", proxy.port);
    let serve = spawn_serve_with(|config| config.agent.egress.allow.push(proxy_addr.clone())).await;
    wait_until(Duration::from_secs(30), "tinyproxy to listen", || async {
        Ok(tokio::net::TcpStream::connect(("127.0.0.1", proxy.port))
            .await
            .ok()
            .map(|_| ()))
    })
    .await
    .unwrap();

    // Bad proxies are 400 naming the field.
    for (body, field) in [
        (
            r#"{"config": {"proxy": {"server": "ftp://127.0.0.1:21"}}}"#,
            "config.proxy.server",
        ),
        (
            r#"{"config": {"proxy": {"server": "http://user:pw@127.0.0.1:3128"}}}"#,
            "config.proxy.server",
        ),
        (
            r#"{"config": {"proxy": {"server": "http://127.0.0.1"}}}"#,
            "config.proxy.server",
        ),
        (
            r#"{"config": {"proxy": {"server": "http://127.0.0.1:3128", "password": "x"}}}"#,
            "config.proxy.password",
        ),
        (
            r#"{"config": {"proxy": {"server": "http://127.0.0.1:3128", "bypass": ["a b"]}}}"#,
            "config.proxy.bypass",
        ),
        (
            r#"{"config": {"proxy": {"server": "http://127.0.0.1:3128", "extra": 1}}}"#,
            "extra",
        ),
    ] {
        let (status, answer) = serve.api.post("/v2/instances", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert!(
            answer["detail"].as_str().unwrap().contains(field),
            "{body}: {answer}"
        );
    }

    let created = serve
        .api
        .create(&proxy_body(proxy.port, PROXY_PASSWORD))
        .await;
    let id = created["id"].as_str().unwrap().to_owned();
    let detail = serve
        .api
        .wait_for_status(&id, "running", BROWSER_DEADLINE)
        .await;
    assert_eq!(
        detail["config"]["proxy"]["password"], "********",
        "{detail}"
    );
    assert_eq!(detail["config"]["proxy"]["username"], PROXY_USER);

    let page = Page::open(
        created["urls"]["debug"].as_str().unwrap(),
        &format!("{}/", site.base),
    )
    .await
    .unwrap();
    assert_eq!(
        page.eval("document.title").await.unwrap(),
        "via the upstream proxy"
    );
    let port = site.authority().rsplit_once(':').unwrap().1.to_owned();
    assert!(
        proxy.logged().contains(&format!("127.0.0.1:{port}")),
        "the proxy carried the request: {}",
        proxy.logged()
    );
    assert!(site.requested().contains(&"/".to_owned()));

    // Without the proxy the site is out of reach (egress does not open it).
    let plain = serve.api.create("{}").await;
    let plain_id = plain["id"].as_str().unwrap().to_owned();
    serve
        .api
        .wait_for_status(&plain_id, "running", BROWSER_DEADLINE)
        .await;
    let other = Page::open(plain["urls"]["debug"].as_str().unwrap(), "data:text/html,x")
        .await
        .unwrap();
    let answer = other
        .try_navigate(&format!("{}/", site.base))
        .await
        .unwrap();
    assert!(
        answer["errorText"].as_str().is_some_and(|e| !e.is_empty()),
        "{answer}"
    );

    // Wrong credentials: the page does not load.
    let wrong = serve
        .api
        .create(&proxy_body(proxy.port, "wrong-password"))
        .await;
    let wrong_id = wrong["id"].as_str().unwrap().to_owned();
    serve
        .api
        .wait_for_status(&wrong_id, "running", BROWSER_DEADLINE)
        .await;
    let refused = Page::open(wrong["urls"]["debug"].as_str().unwrap(), "data:text/html,x")
        .await
        .unwrap();
    let answer = refused
        .try_navigate(&format!("{}/", site.base))
        .await
        .unwrap();
    assert!(
        answer["errorText"].as_str().is_some_and(|e| !e.is_empty()),
        "{answer}"
    );

    // The password is nowhere a client or the browser could read it.
    let (_, list) = serve.api.get("/v2/instances").await;
    assert!(!list.to_string().contains(PROXY_PASSWORD));
    assert!(!detail.to_string().contains(PROXY_PASSWORD));
    let version: Value = page
        .call_browser("Browser.getVersion", serde_json::json!({}))
        .await
        .unwrap();
    assert!(!version.to_string().contains(PROXY_PASSWORD));
    let instance_dir = serve.instances_dir().join(&id);
    for pid in browser_processes(&instance_dir) {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        for bytes in [cmdline, environ] {
            assert!(
                !String::from_utf8_lossy(&bytes).contains(PROXY_PASSWORD),
                "pid {pid} holds the password"
            );
        }
    }
    let log = std::fs::read_to_string(instance_dir.join("browser.log")).unwrap_or_default();
    assert!(!log.contains(PROXY_PASSWORD));
    serve.shutdown().await;
}
