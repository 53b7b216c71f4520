//! The dashboard in real headless Chromium (Playwright, system Chromium)
//! against `serve` with authentication on and a real browser instance: the key
//! prompt, create, running without reload (event stream), live view frames,
//! park, revive, delete, every page, no console errors. Screenshots are kept in
//! `target/ui-screenshots/`.

use flotilla_testkit::{run_node, spawn_serve_with, workspace_root};

#[tokio::test]
async fn browser_dashboard_drives_an_instance_through_its_life() {
    let serve = spawn_serve_with(|config| {
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
        ],
    )
    .await
    .unwrap();
    assert_eq!(
        result["errors"],
        serde_json::json!([]),
        "console errors: {result}"
    );
    assert!(result["shots"].as_array().unwrap().len() >= 9, "{result}");
    let id = result["id"].as_str().unwrap();
    let (status, _) = serve
        .api
        .call(reqwest::Method::GET, &format!("/v2/instances/{id}"), None)
        .await;
    assert_eq!(status.as_u16(), 401, "the API still wants the key");
    serve.shutdown().await;
}
