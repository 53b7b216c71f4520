//! Files are owner-only: after a session of every kind (a download, a
//! persistent profile, an extension, a kept recording, a park and a revive,
//! a live link), no file under the data directory can be read by another
//! local user, and the browser user is let through only the directories
//! that lead to its own.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use flotilla_testkit::{BROWSER_DEADLINE, Page, StatusCode, spawn_serve_with_page, wait_until};

use crate::browser_sessions::{MARKER_MANIFEST, MARKER_SCRIPT, zip_of};

/// Every entry under `root` (symbolic links included, not followed).
fn entries(root: &Path) -> Vec<PathBuf> {
    let mut found = vec![root.to_path_buf()];
    let mut index = 0;
    while index < found.len() {
        let path = found[index].clone();
        index += 1;
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir())
            && let Ok(read) = std::fs::read_dir(&path)
        {
            found.extend(read.flatten().map(|entry| entry.path()));
        }
    }
    found
}

/// What others (and the browser user) may do with `path`, when more than
/// its owner's alone: `None` when owner-only.
fn opened(path: &Path) -> Option<String> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    if meta.file_type().is_symlink() {
        return None;
    }
    let mode = meta.mode() & 0o7777;
    (mode & 0o077 != 0).then(|| format!("{mode:04o} gid {}", meta.gid()))
}

/// Checks every entry under `data_dir`: owner-only, but for the directories
/// leading the browser user to its instances and to the WebDriver uploads
/// handed to it (0710, its group) and the sandbox's generated `/etc`
/// (public facts, 0755/0644).
fn assert_owner_only(data_dir: &Path, browser_gid: u32) {
    let agent = data_dir.join("agent");
    let instances = agent.join("instances");
    let etc = agent.join("sandbox-etc");
    let mut seen = 0;
    for path in entries(data_dir) {
        seen += 1;
        let Some(opened) = opened(&path) else {
            continue;
        };
        let passage = path == data_dir
            || path == agent
            || path == instances
            || path.parent() == Some(instances.as_path())
            || (path.file_name() == Some("uploads".as_ref())
                && path.parent().and_then(Path::parent) == Some(instances.as_path()));
        if passage {
            assert_eq!(
                opened,
                format!("0710 gid {browser_gid}"),
                "{} lets only the browser group through",
                path.display()
            );
        } else if path == etc {
            assert_eq!(
                opened,
                format!("0755 gid {}", std::fs::metadata(&path).unwrap().gid())
            );
        } else if path.parent() == Some(etc.as_path()) {
            assert!(opened.starts_with("0644"), "{}: {opened}", path.display());
        } else {
            panic!("{} can be read by others: {opened}", path.display());
        }
    }
    assert!(
        seen > 20,
        "the walk saw the data directory ({seen} entries)"
    );
}

fn browser_gid() -> u32 {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let line = passwd
        .lines()
        .find(|line| line.starts_with("flotilla-browser:"))
        .expect("scripts/install-deps creates flotilla-browser");
    line.split(':').nth(3).unwrap().parse().unwrap()
}

#[tokio::test]
async fn browser_every_file_a_session_leaves_is_owner_only() {
    const KEY: &str = "files-key";
    let (site, mut serve) =
        spawn_serve_with_page("<title>files</title><body>page</body>", |config| {
            config.control.auth_enabled = true;
            config.control.api_keys = vec![KEY.into()];
        })
        .await;
    serve.api = flotilla_testkit::Api::with_key(serve.api.base.clone(), KEY);
    let api = &serve.api;
    let url = format!("{}/", site.base);

    let zip = zip_of(&[
        ("marker/manifest.json", MARKER_MANIFEST),
        ("marker/content.js", MARKER_SCRIPT),
    ]);
    let (status, extension) = api
        .post_bytes("/v2/extensions", "application/zip", zip)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{extension}");
    let (status, body) = api.post("/v2/profiles", r#"{"name": "files"}"#).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let create = serde_json::json!({
        "profile": {"name": "files", "persist": true},
        "config": {"extensions": [extension["id"]], "record": true, "keep_recordings": true},
    });
    let (id, created, _) = api.create_running(&create.to_string()).await;
    let debug = created["urls"]["debug"].as_str().unwrap();
    let page = Page::open(debug, &url).await.unwrap();
    page.eval(
        "document.cookie = 'session=secret; max-age=86400'; localStorage.setItem('k', 'v'); true",
    )
    .await
    .unwrap();
    let result =
        flotilla_testkit::run_node("playwright_download.mjs", &[debug, "data.csv", "a,b\n"])
            .await
            .unwrap();
    assert_eq!(result["suggested"], "data.csv", "{result}");
    wait_until(BROWSER_DEADLINE, "the download to complete", || async {
        let (_, body) = api.get(&format!("/v2/instances/{id}/downloads")).await;
        let done = body["downloads"]
            .as_array()
            .is_some_and(|list| list.iter().any(|d| d["state"] == "complete"));
        Ok::<_, String>(done.then_some(()))
    })
    .await
    .unwrap();
    let (status, link) = api
        .post(&format!("/v2/instances/{id}/live"), r#"{"mode": "view"}"#)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{link}");
    let gid = browser_gid();
    // While it runs: the profile, home and downloads are the browser's alone.
    assert_owner_only(&serve.data_dir, gid);
    drop(page);

    api.park(&id).await;
    api.wait_for_status(&id, "dormant", BROWSER_DEADLINE).await;
    assert_owner_only(&serve.data_dir, gid);
    api.revive(&id).await;
    api.wait_for_status(&id, "running", BROWSER_DEADLINE).await;
    api.delete_instance(&id).await;
    wait_until(BROWSER_DEADLINE, "the recording to be kept", || async {
        let (_, body) = api.get("/v2/recordings").await;
        let kept = body["recordings"].as_array().is_some_and(|r| !r.is_empty());
        Ok::<_, String>(kept.then_some(()))
    })
    .await
    .unwrap();
    assert_owner_only(&serve.data_dir, gid);
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_a_data_dir_the_browser_user_cannot_reach_is_refused_saying_what_to_change() {
    use std::os::unix::fs::PermissionsExt as _;
    // mktemp -d: mode 0700, the agent's own. Made passable, and browsers run.
    let (_site, serve) = spawn_serve_with_page("<title>t</title>", |_| {}).await;
    let (id, _, _) = serve.api.create_running("{}").await;
    serve.api.delete_instance(&id).await;
    serve.shutdown().await;

    // Inside a directory that is not the data directory and keeps others out:
    // refused at start, naming it and the fix.
    let closed = tempfile::tempdir().unwrap();
    std::fs::set_permissions(closed.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let config = flotilla_server::FlotillaConfig {
        listen: "127.0.0.1:0".into(),
        data_dir: closed.path().join("data"),
        ..Default::default()
    };
    let mut config = config;
    config.proxy.http.bind_address = "127.0.0.1:0".into();
    let error = match flotilla_server::Serve::start(config).await {
        Ok(_) => panic!("a data dir browsers cannot reach is refused"),
        Err(error) => format!("{error:#}"),
    };
    let closed = closed.path().display().to_string();
    assert!(error.contains(&closed), "{error}");
    assert!(error.contains("flotilla-browser"), "{error}");
    assert!(error.contains("chmod o+x"), "{error}");
}
