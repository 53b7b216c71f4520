//! Recordings of a real Chromium's live view (`config.record`): an animated
//! page is recorded while the instance runs, the recording ends with a park
//! and the next starts with the revive, each a playable MP4 (ffprobe reads
//! its duration and frame size) served through the front door; they go with
//! the instance, unless kept (`config.keep_recordings`): then they move to the
//! snapshot store and are served under `/v2/recordings` until deleted.

use std::time::Duration;

use serde_json::{Value, json};

use flotilla_testkit::{
    BROWSER_DEADLINE, Page, serve_page, spawn_serve_in, spawn_serve_with, wait_until,
};

pub(crate) const ANIMATED: &str = r#"<!doctype html><title>moving</title>
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

/// Creates an instance with `config`, shows the animated page in its only
/// tab and waits until `seconds` of it are recorded; the page stays open
/// while the returned handle lives.
pub(crate) async fn record_animated_page(
    api: &flotilla_testkit::Api,
    pages: &flotilla_testkit::PageServer,
    config: &str,
    seconds: f64,
) -> (String, Page) {
    let (id, created, detail) = api
        .create_running(&format!(r#"{{"config": {config}}}"#))
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
    wait_until(BROWSER_DEADLINE, "the page recorded", || async {
        let (_, body) = api.get(&list).await;
        let recorded = body["recordings"][0]["duration_sec"]
            .as_f64()
            .unwrap_or(0.0);
        if recorded >= seconds {
            Ok(Some(()))
        } else {
            Err(body.to_string())
        }
    })
    .await
    .unwrap();
    (id, page)
}

/// Every recording ffmpeg (it decodes what the browser made) runs as a user
/// other than root and in a network namespace of its own.
fn assert_encoders_confined() {
    let encoders: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "ffmpeg")
                && std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains("image2pipe"))
        })
        .collect();
    assert!(!encoders.is_empty(), "no recording ffmpeg runs");
    let own_network = std::fs::read_link("/proc/self/ns/net").unwrap();
    for pid in encoders {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let uid = status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .unwrap_or_default();
        assert!(
            !uid.split_whitespace().any(|id| id == "0"),
            "ffmpeg {pid} runs as root: {uid}"
        );
        if let Ok(network) = std::fs::read_link(format!("/proc/{pid}/ns/net")) {
            assert_ne!(
                network, own_network,
                "ffmpeg {pid} shares the host's network"
            );
        }
    }
}

/// Where the node keeps instance `id`'s recordings.
fn recordings_dir(serve: &flotilla_testkit::TestServe, id: &str) -> std::path::PathBuf {
    let data = serve.data_dir.canonicalize().unwrap();
    data.join("agent/recordings").join(id)
}

/// Saves `bytes` and reads them with ffprobe: (duration, width, height).
fn probe_bytes(bytes: &[u8]) -> (f64, u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("recording.mp4");
    std::fs::write(&file, bytes).unwrap();
    probe(&file)
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
    let (id, _page) = record_animated_page(&serve.api, &pages, r#"{"record": true}"#, 4.0).await;
    let list = format!("/v2/instances/{id}/recordings");
    assert_encoders_confined();
    serve.api.park(&id).await;

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
    let (duration, w, h) = probe_bytes(&bytes);
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
    serve.api.revive(&id).await;
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
    let recordings_dir = recordings_dir(&serve, &id);
    assert!(recordings_dir.exists());
    serve.api.delete_instance(&id).await;
    wait_until(
        Duration::from_secs(30),
        "the recordings deleted",
        || async {
            if recordings_dir.exists() {
                Err("still there")
            } else {
                Ok(Some(()))
            }
        },
    )
    .await
    .unwrap();
    let (_, kept) = serve.api.get("/v2/recordings").await;
    assert_eq!(
        kept["recordings"],
        json!([]),
        "nothing kept without keep_recordings"
    );
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_kept_recordings_outlive_their_instance_until_deleted() {
    let pages = serve_page(&[("/", ANIMATED)]).await;
    let serve = spawn_serve_with(|config| pages.allow_in(config)).await;
    let (id, page) = record_animated_page(
        &serve.api,
        &pages,
        r#"{"record": true, "keep_recordings": true}"#,
        3.0,
    )
    .await;
    let (_, detail) = serve.api.get(&format!("/v2/instances/{id}")).await;
    assert_eq!(detail["config"]["keep_recordings"], json!(true), "{detail}");
    drop(page);

    // Deleting the instance moves its recording to the snapshot store.
    serve.api.delete_instance(&id).await;
    let kept = wait_until(BROWSER_DEADLINE, "the recording kept", || async {
        let (_, body) = serve.api.get("/v2/recordings").await;
        match body["recordings"].as_array() {
            Some(listed) if listed.len() == 1 => Ok(Some(listed[0].clone())),
            _ => Err(body.to_string()),
        }
    })
    .await
    .unwrap();
    assert_eq!(kept["instance_id"], json!(id), "{kept}");
    assert_eq!(kept["content_type"], "video/mp4");
    assert!(kept["duration_sec"].as_f64().unwrap() >= 3.0, "{kept}");
    assert!(kept["kept_at"].as_str().unwrap() >= kept["created_at"].as_str().unwrap());
    let size = kept["size_bytes"].as_u64().unwrap();
    assert!(size > 1000, "{kept}");
    let recordings_dir = recordings_dir(&serve, &id);
    assert!(!recordings_dir.exists(), "the node keeps no copy");

    // Filtered by instance; unknown query fields are refused.
    let (_, mine) = serve
        .api
        .get(&format!("/v2/recordings?instance_id={id}"))
        .await;
    assert_eq!(mine["recordings"].as_array().unwrap().len(), 1, "{mine}");
    let (_, others) = serve
        .api
        .get("/v2/recordings?instance_id=00000000-0000-7000-8000-000000000000")
        .await;
    assert_eq!(others["recordings"], json!([]), "{others}");
    let (status, body) = serve.api.get("/v2/recordings?instance=x").await;
    assert_eq!(status.as_u16(), 400, "{body}");

    // The video plays, whole.
    let rid = kept["id"].as_str().unwrap();
    let url = format!("{}/v2/recordings/{rid}", serve.api.base);
    let response = reqwest::get(&url).await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(response.headers()["content-type"], "video/mp4");
    let bytes = response.bytes().await.unwrap();
    assert_eq!(bytes.len() as u64, size);
    let (duration, w, h) = probe_bytes(&bytes);
    assert!(duration >= 2.5, "ffprobe: {duration} s");
    assert!(w > 0 && h > 0);

    // Hostile ids find nothing.
    for bad in [
        "..%2f..%2fetc%2fpasswd",
        "..%2fprofiles%2fx",
        "0193d6a4e1f07000800000000000abcd",
        &rid.to_uppercase(),
        "x",
    ] {
        let (status, body) = serve.api.get(&format!("/v2/recordings/{bad}")).await;
        assert_eq!(status.as_u16(), 404, "{bad}: {body}");
        assert_eq!(body["code"], "not_found", "{bad}: {body}");
    }

    // Deleted, it is gone for good.
    let (status, body) = serve.api.delete(&format!("/v2/recordings/{rid}")).await;
    assert_eq!(status.as_u16(), 200, "{body}");
    let (status, _) = serve.api.delete(&format!("/v2/recordings/{rid}")).await;
    assert_eq!(status.as_u16(), 404);
    let (status, _) = serve.api.get(&format!("/v2/recordings/{rid}")).await;
    assert_eq!(status.as_u16(), 404);
    let (_, listed) = serve.api.get("/v2/recordings").await;
    assert_eq!(listed["recordings"], json!([]), "{listed}");
    serve.shutdown().await;
}

#[tokio::test]
async fn browser_recordings_follow_a_revive_onto_a_node_that_lacks_them() {
    let pages = serve_page(&[("/", ANIMATED)]).await;
    let data = tempfile::Builder::new()
        .prefix("flotilla-test-")
        .tempdir()
        .unwrap();
    let serve = spawn_serve_in(data.path(), |config| pages.allow_in(config)).await;
    let (id, page) = record_animated_page(&serve.api, &pages, r#"{"record": true}"#, 2.0).await;
    drop(page);
    serve.api.park(&id).await;
    let list = format!("/v2/instances/{id}/recordings");
    let (_, before) = serve.api.get(&list).await;
    let first = before["recordings"][0]["id"].as_str().unwrap().to_owned();
    let root = data.path().canonicalize().unwrap();
    let saved = root.join("snapshots").join(&id).join("recordings");
    assert!(
        saved.join(format!("{first}.json")).exists(),
        "the park saved the recording to the snapshot store"
    );

    // The node restarts without the files, as another node would be: the
    // revive brings them back from the store.
    serve.shutdown().await;
    std::fs::remove_dir_all(root.join("agent/recordings").join(&id)).unwrap();
    let serve = spawn_serve_in(data.path(), |config| pages.allow_in(config)).await;
    serve.api.revive(&id).await;
    serve
        .api
        .wait_for_status(&id, "running", BROWSER_DEADLINE)
        .await;
    let listed = wait_until(BROWSER_DEADLINE, "the first recording back", || async {
        let (_, body) = serve.api.get(&list).await;
        match body["recordings"][0]["id"].as_str() {
            Some(back) if back == first => Ok(Some(body)),
            _ => Err(body.to_string()),
        }
    })
    .await
    .unwrap();
    assert_eq!(
        listed["recordings"][0]["recording"],
        json!(false),
        "{listed}"
    );
    let response = reqwest::get(format!("{}{list}/{first}", serve.api.base))
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let (duration, _, _) = probe_bytes(&response.bytes().await.unwrap());
    assert!(duration >= 1.5, "ffprobe: {duration} s");

    // The saved copies go with the instance.
    serve.api.delete_instance(&id).await;
    wait_until(
        Duration::from_secs(30),
        "the saved recordings deleted",
        || async {
            if saved.exists() && std::fs::read_dir(&saved).is_ok_and(|mut d| d.next().is_some()) {
                Err("still there")
            } else {
                Ok(Some(()))
            }
        },
    )
    .await
    .unwrap();
    serve.shutdown().await;
}
