//! The dashboard in real headless Chromium (Playwright, system Chromium)
//! against `serve` with authentication on and a real browser instance: the key
//! prompt, create, running without reload (event stream), live view frames,
//! taking control of the live view (a click and typing reach a test page),
//! live-link pages (a view link cannot click, a control link can),
//! the recording of a recorded instance playing in the detail,
//! park, revive, delete, its kept recordings playing and deleted, every page,
//! no console errors. Screenshots are kept in
//! `target/ui-screenshots/`.

use flotilla_testkit::{run_node, serve_page, spawn_serve_with, workspace_root};

const CONTROLS: &str = r#"<!doctype html><title>controls</title>
<style>body{margin:0}#b{position:absolute;left:80px;top:80px;width:240px;height:90px}
#i{position:absolute;left:80px;top:260px;width:300px;height:40px}</style>
<button id="b" onclick="window.clicks=(window.clicks||0)+1">press</button><input id="i">"#;

#[tokio::test]
async fn browser_dashboard_drives_an_instance_through_its_life() {
    let pages = serve_page(&[("/", CONTROLS)]).await;
    let serve = spawn_serve_with(|config| {
        pages.allow_in(config);
        config.control.auth_enabled = true;
        config.control.api_keys = vec!["flt_dashboard_key".into()];
    })
    .await;
    let shots = workspace_root().join("target/ui-screenshots");
    let result = run_node(
        "dashboard.mjs",
        &[
            &serve.api.base,
            &shots.display().to_string(),
            "flt_dashboard_key",
            &format!("{}/", pages.base),
        ],
    )
    .await
    .unwrap();
    assert_eq!(
        result["errors"],
        serde_json::json!([]),
        "console errors: {result}"
    );
    assert!(result["shots"].as_array().unwrap().len() >= 10, "{result}");
    let id = result["id"].as_str().unwrap();
    let (status, _) = serve
        .api
        .call(reqwest::Method::GET, &format!("/v2/instances/{id}"), None)
        .await;
    assert_eq!(status.as_u16(), 401, "the API still wants the key");
    serve.shutdown().await;
}
