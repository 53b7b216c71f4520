//! Restarts lose nothing: the real `flotilla` binary is stopped with SIGTERM
//! and with kill -9, then started again on the same data directory.

use std::path::Path;

use flotilla_testkit::{
    BROWSER_DEADLINE, ServeProcess, StatusCode, browser_processes, wait_browser_processes_gone,
};

/// The browsers counted here are the instances'; no spare pooled browser.
const NO_WARM_POOL: &[(&str, &str)] = &[("FLOTILLA_AGENT__WARM_POOL_SIZE", "0")];

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_flotilla"))
}

#[tokio::test]
async fn browser_records_survive_sigterm_and_kill_9_and_orphans_are_swept() {
    flotilla_testkit::init_logging();
    let temp = tempfile::tempdir().unwrap();
    let data_dir = temp.path().join("data");
    let instances_dir = data_dir.join("agent/instances");

    // 1. Graceful stop: every browser closed, records kept as stopped.
    let mut serve = ServeProcess::start(binary(), &data_dir, NO_WARM_POOL)
        .await
        .unwrap();
    let first = serve.api.create("{}").await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    serve
        .api
        .wait_for_status(&first, "running", BROWSER_DEADLINE)
        .await;
    assert!(!browser_processes(&instances_dir).is_empty());
    let code = serve.stop_with(libc::SIGTERM).await;
    assert_eq!(
        code,
        Some(0),
        "graceful exit; log in {}",
        serve.stderr_log.display()
    );
    assert!(
        browser_processes(&instances_dir).is_empty(),
        "no Chromium left after a graceful stop"
    );
    drop(serve);

    let serve = ServeProcess::start(binary(), &data_dir, NO_WARM_POOL)
        .await
        .unwrap();
    let (status, detail) = serve.api.get(&format!("/v2/instances/{first}")).await;
    assert_eq!(status, StatusCode::OK, "the record survived: {detail}");
    assert_eq!(detail["status"], "stopped");
    assert!(
        detail["status_reason"]
            .as_str()
            .unwrap()
            .contains("shut down"),
        "{detail}"
    );

    // 2. kill -9 with a running browser: the record survives, the orphan is swept.
    let second = serve.api.create("{}").await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    serve
        .api
        .wait_for_status(&second, "running", BROWSER_DEADLINE)
        .await;
    let mut serve = serve;
    serve.stop_with(libc::SIGKILL).await;
    let orphans = browser_processes(&instances_dir);
    assert!(
        !orphans.is_empty(),
        "kill -9 leaves the browser running (it is in its own process group)"
    );

    let serve = ServeProcess::start(binary(), &data_dir, NO_WARM_POOL)
        .await
        .unwrap();
    wait_browser_processes_gone(&instances_dir).await;
    let (_, list) = serve.api.get("/v2/instances?sort=created_at_asc").await;
    assert_eq!(list["total"], 2, "both records are still there: {list}");
    let (_, detail) = serve.api.get(&format!("/v2/instances/{second}")).await;
    assert_eq!(detail["status"], "stopped", "{detail}");
    assert!(
        detail["status_reason"]
            .as_str()
            .unwrap()
            .contains("no longer runs"),
        "{detail}"
    );
    assert!(
        std::fs::read_dir(&instances_dir)
            .map(|d| d.count())
            .unwrap_or(0)
            == 0,
        "stale profiles swept"
    );

    // 3. The restarted service works.
    let third = serve.api.create("{}").await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    serve
        .api
        .wait_for_status(&third, "running", BROWSER_DEADLINE)
        .await;
    let mut serve = serve;
    assert_eq!(serve.stop_with(libc::SIGTERM).await, Some(0));
    assert!(browser_processes(&instances_dir).is_empty());
}
