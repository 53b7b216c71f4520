//! Recordings of a real Chromium's live view (`config.record`): an animated
//! page is recorded while the instance runs, the recording ends with a park
//! and the next starts with the revive, each a playable MP4 (ffprobe reads
//! its duration and frame size) served through the front door; they go with
//! the instance.

use std::time::Duration;

use serde_json::{Value, json};

use flotilla_testkit::{BROWSER_DEADLINE, Page, serve_page, spawn_serve_with, wait_until};

const ANIMATED: &str = r#"<!doctype html><title>moving</title>
<style>body{margin:0;background:#123}#box{width:200px;height:200px;background:#fc0;
position:absolute;animation:move 1s linear infinite alternate}
@keyframes move{from{left:0;top:0}to{left:600px;top:300px}}</style><div id="box"></div>"#;

/// ffprobe's reading of a video file: (duration, width, height).
fn probe(path: &std::path::Path) -> (f64, u64, u64) {
    let output = std::process::Command::new("ffprobe")
        .args([
            "-v",
            "error",
            "-show_entries",
            "stream=width,height:format=duration",
        ])
        .args(["-of", "json"])
        .arg(path)
        .output()
        .expect("ffprobe runs (scripts/install-deps installs ffmpeg)");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let info: Value = serde_json::from_slice(&output.stdout).unwrap();
    let duration = info["format"]["duration"]
        .as_str()
        .and_then(|d| d.parse().ok())
        .unwrap_or(0.0);
    let stream = &info["streams"][0];
    (
        duration,
        stream["width"].as_u64().unwrap(),
        stream["height"].as_u64().unwrap(),
    )
}

#[tokio::test]
async fn browser_a_recording_of_an_animated_page_is_a_playable_video() {
    let pages = serve_page(&[("/", ANIMATED)]).await;
    let (width, height) = (960u32, 540u32);
    let serve = spawn_serve_with(|config| {
        pages.allow_in(config);
        config.agent.viewport_width = width;
        config.agent.viewport_height = height;
    })
    .await;
    let created = serve.api.create(r#"{"config": {"record": true}}"#).await;
    let id = created["id"].as_str().unwrap().to_owned();
    let detail = serve
        .api
        .wait_for_status(&id, "running", BROWSER_DEADLINE)
        .await;
    assert_eq!(detail["config"]["record"], json!(true), "{detail}");

    // The animated page is the only tab, so the live view shows it.
    let debug = created["urls"]["debug"].as_str().unwrap();
    let page = Page::open(debug, &format!("{}/", pages.base))
        .await
        .unwrap();
    let others = page
        .call_browser("Target.getTargets", json!({}))
        .await
        .unwrap();
    for target in others["targetInfos"].as_array().unwrap() {
        if target["type"] == "page" && target["url"] != format!("{}/", pages.base).as_str() {
            page.call_browser(
                "Target.closeTarget",
                json!({"targetId": target["targetId"]}),
            )
            .await
            .unwrap();
        }
    }

    let list = format!("/v2/instances/{id}/recordings");
    wait_until(BROWSER_DEADLINE, "4 s recorded", || async {
        let (_, body) = serve.api.get(&list).await;
        let recorded = body["recordings"][0]["duration_sec"]
            .as_f64()
            .unwrap_or(0.0);
        if recorded >= 4.0 {
            Ok(Some(()))
        } else {
            Err(body.to_string())
        }
    })
    .await
    .unwrap();
    let (status, parked) = serve
        .api
        .post(&format!("/v2/instances/{id}/dormant"), "")
        .await;
    assert_eq!(status.as_u16(), 200, "{parked}");

    // The park ends the recording: ffmpeg writes its last fragment.
    let body = wait_until(
        Duration::from_secs(30),
        "the recording finished",
        || async {
            let (_, body) = serve.api.get(&list).await;
            match body["recordings"][0]["recording"].as_bool() {
                Some(false) => Ok(Some(body)),
                _ => Err(body.to_string()),
            }
        },
    )
    .await
    .unwrap();
    let recordings = body["recordings"].as_array().unwrap().clone();
    assert_eq!(recordings.len(), 1, "{body}");
    let first = &recordings[0];
    assert_eq!(first["content_type"], "video/mp4");
    assert!(first["size_bytes"].as_u64().unwrap() > 1000, "{first}");
    assert!(first["duration_sec"].as_f64().unwrap() >= 4.0, "{first}");

    // The file through the front door is a playable video of that length.
    let rid = first["id"].as_str().unwrap();
    let response = reqwest::get(format!("{}{list}/{rid}", serve.api.base))
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(response.headers()["content-type"], "video/mp4");
    let bytes = response.bytes().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("recording.mp4");
    std::fs::write(&file, &bytes).unwrap();
    let (duration, w, h) = probe(&file);
    assert_eq!((w, h), (u64::from(width), u64::from(height)));
    assert!(duration >= 3.5, "ffprobe: {duration} s");

    // Hostile ids are refused.
    for bad in [
        "..%2f..%2fetc%2fpasswd",
        "0193d6a4e1f07000800000000000abcd",
        "x",
    ] {
        let (status, _) = serve.api.get(&format!("{list}/{bad}")).await;
        assert_eq!(status.as_u16(), 404, "{bad}");
    }

    // The revive starts the next recording.
    let (status, body) = serve
        .api
        .post(&format!("/v2/instances/{id}/revive"), "")
        .await;
    assert_eq!(status.as_u16(), 200, "{body}");
    serve
        .api
        .wait_for_status(&id, "running", BROWSER_DEADLINE)
        .await;
    wait_until(BROWSER_DEADLINE, "a second recording", || async {
        let (_, body) = serve.api.get(&list).await;
        match body["recordings"].as_array().map(Vec::len) {
            Some(2) => Ok(Some(())),
            _ => Err(body.to_string()),
        }
    })
    .await
    .unwrap();

    // They go with the instance.
    let recordings_dir = serve
        .data_dir
        .canonicalize()
        .unwrap()
        .join("agent/recordings")
        .join(&id);
    assert!(recordings_dir.exists());
    let (status, _) = serve.api.delete(&format!("/v2/instances/{id}")).await;
    assert_eq!(status.as_u16(), 200);
    wait_until(
        Duration::from_secs(30),
        "the recordings deleted",
        || async {
            if recordings_dir.exists() {
                Err("still there".into())
            } else {
                Ok(Some(()))
            }
        },
    )
    .await
    .unwrap();
    serve.shutdown().await;
}
