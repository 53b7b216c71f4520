//! Session recordings (`config.record`): the live view's frames, encoded to
//! MP4/H.264 by ffmpeg while the instance runs.
//!
//! - One recording per running period: it starts when the browser is ready
//!   and ends when the instance is parked, stopped or deleted; a revive
//!   starts the next one. Recordings are listed oldest first.
//! - The recorder is a quiet viewer of the live view (it keeps the
//!   screencast going but does not count as activity, so an instance that
//!   nobody uses still goes idle). It feeds the newest frame to ffmpeg
//!   [`FPS`] times a second, so the video's clock is the wall clock whether
//!   the page changes or not; frames are scaled and padded to the live
//!   view's size.
//! - ffmpeg decodes what the browser made, so it runs confined like a
//!   browser ([`Isolation::tool_command`]): as the browser user, with no
//!   network and no writable file; it reads frames on stdin and writes the
//!   video on stdout, which the agent writes to the file.
//! - The MP4 is fragmented (a fragment every 2 s): a recording cut off by a
//!   crash still plays up to its last fragment. Beside each `<id>.mp4` a `<id>.json` says when it
//!   started and how long it is.
//! - Files live in `<data_dir>/recordings/<instance id>/`, outside the
//!   browser's sandbox (the browser can neither read nor replace them), and
//!   go with the instance. Their size counts toward `disk_gb`.
//! - A park saves the finished recordings to the snapshot store beside the
//!   instance's snapshots ([`save`]); a revive on a node that lacks them
//!   brings them back ([`restore`]), so they follow the instance across
//!   nodes. With `config.keep_recordings`, a delete moves them to the store's
//!   kept recordings (`/v2/recordings`) instead of deleting them.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

use flotilla_api_types::InstanceId;
use flotilla_api_types::instances::Recording;

use crate::confine::sandbox::Isolation;
use crate::instance::InstanceSlot;
use crate::instance::state::State;
use crate::protocols::live_view::LiveView;
use crate::snapshot::SnapshotStore;
use crate::snapshot::is_recording_id;

/// Frames per second written to the video.
pub const FPS: u32 = 10;
const CONTENT_TYPE: &str = "video/mp4";

/// What a recording's sidecar file says.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Sidecar {
    created_at: DateTime<Utc>,
    frames: u64,
    finished: bool,
}

/// Records every running period of `slot` into `dir` until its servers
/// stop, with ffmpeg confined as `isolation` says.
pub async fn record(
    slot: Arc<InstanceSlot>,
    live_view: Arc<LiveView>,
    dir: PathBuf,
    size: (u32, u32),
    isolation: Isolation,
) {
    loop {
        if !wait_running(&slot).await {
            return;
        }
        if let Err(error) = record_once(&slot, &live_view, &dir, size, &isolation).await {
            tracing::warn!(instance = %slot.id, %error, "recording failed");
            // Do not spin on an ffmpeg that cannot start: wait for the next
            // running period.
            while matches!(slot.state(), State::Running { .. }) {
                if !pause(&slot, Duration::from_millis(500)).await {
                    return;
                }
            }
        }
    }
}

/// Waits until the browser is ready; `false` once the servers stop.
async fn wait_running(slot: &InstanceSlot) -> bool {
    while slot.endpoint().is_none() {
        if !pause(slot, Duration::from_millis(200)).await {
            return false;
        }
    }
    true
}

/// Sleeps `period`; `false` if the servers stopped meanwhile.
async fn pause(slot: &InstanceSlot, period: Duration) -> bool {
    tokio::select! {
        () = tokio::time::sleep(period) => true,
        () = slot.servers.cancelled() => false,
    }
}

/// Why a recording could not start (logged; the next running period tries
/// again).
#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    /// The recordings directory or the video file.
    #[error("cannot create {}: {source}", .path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start ffmpeg (install it: scripts/install-deps): {0}")]
    Ffmpeg(#[source] std::io::Error),
    /// ffmpeg's stdin or stdout was not piped.
    #[error("ffmpeg has no {0}")]
    FfmpegPipe(&'static str),
}

/// One recording, from now until the browser stops being ready.
async fn record_once(
    slot: &InstanceSlot,
    live_view: &Arc<LiveView>,
    dir: &Path,
    (width, height): (u32, u32),
    isolation: &Isolation,
) -> Result<(), RecordingError> {
    tokio::fs::create_dir_all(dir)
        .await
        .map_err(|source| RecordingError::Create {
            path: dir.to_owned(),
            source,
        })?;
    let id = uuid::Uuid::now_v7().simple().to_string();
    let video = dir.join(format!("{id}.mp4"));
    let mut file =
        tokio::fs::File::create(&video)
            .await
            .map_err(|source| RecordingError::Create {
                path: video.clone(),
                source,
            })?;
    let mut ffmpeg = encoder(isolation, width, height)?;
    let mut input = ffmpeg
        .stdin
        .take()
        .ok_or(RecordingError::FfmpegPipe("stdin"))?;
    let mut output = ffmpeg
        .stdout
        .take()
        .ok_or(RecordingError::FfmpegPipe("stdout"))?;
    // ffmpeg writes nothing itself: the agent writes its output to the file.
    let writer = tokio::spawn(async move {
        let copied = tokio::io::copy(&mut output, &mut file).await;
        let _ = file.flush().await;
        copied
    });
    let _viewer = live_view.join_quietly().await;
    let frames = live_view.frames();
    let mut sidecar = Sidecar {
        created_at: Utc::now(),
        frames: 0,
        finished: false,
    };
    tracing::info!(instance = %slot.id, recording = id, "recording started");
    let mut tick = tokio::time::interval(Duration::from_secs(1) / FPS);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while matches!(slot.state(), State::Running { .. }) && !slot.servers.is_cancelled() {
        tick.tick().await;
        let Some(frame) = frames.borrow().clone() else {
            continue;
        };
        if input.write_all(&frame.jpeg).await.is_err() {
            break;
        }
        sidecar.frames += 1;
        if sidecar.frames.is_multiple_of(u64::from(FPS)) {
            write_sidecar(dir, &id, &sidecar).await;
        }
    }
    drop(input);
    let finished = tokio::time::timeout(Duration::from_secs(30), ffmpeg.wait()).await;
    if !matches!(finished, Ok(Ok(status)) if status.success()) {
        let _ = ffmpeg.kill().await;
    }
    if let Ok(Err(error)) = writer.await {
        tracing::warn!(instance = %slot.id, recording = id, %error, "cannot write the recording");
    }
    sidecar.finished = true;
    write_sidecar(dir, &id, &sidecar).await;
    tracing::info!(instance = %slot.id, recording = id, frames = sidecar.frames, "recording finished");
    Ok(())
}

/// ffmpeg reading JPEGs on stdin at [`FPS`], writing fragmented MP4/H.264
/// to stdout, confined (it decodes what the browser made).
fn encoder(
    isolation: &Isolation,
    width: u32,
    height: u32,
) -> Result<tokio::process::Child, RecordingError> {
    let fit = format!(
        "scale={width}:{height}:force_original_aspect_ratio=decrease,\
         pad={width}:{height}:(ow-iw)/2:(oh-ih)/2,format=yuv420p"
    );
    isolation
        .tool_command(Path::new("ffmpeg"))
        .args(["-hide_banner", "-loglevel", "error", "-nostdin"])
        .args([
            "-f",
            "image2pipe",
            "-c:v",
            "mjpeg",
            "-framerate",
            &FPS.to_string(),
        ])
        .args(["-i", "pipe:0", "-vf", &fit])
        .args(["-c:v", "libx264", "-preset", "ultrafast", "-crf", "30"])
        // A keyframe, and so a fragment, every 2 s: an unfinished recording
        // plays up to 2 s before its end.
        .args(["-g", &(FPS * 2).to_string()])
        .args(["-movflags", "+frag_keyframe+empty_moov+default_base_moof"])
        .args(["-f", "mp4", "pipe:1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(RecordingError::Ffmpeg)
}

async fn write_sidecar(dir: &Path, id: &str, sidecar: &Sidecar) {
    let text = serde_json::to_vec(sidecar).expect("a sidecar serialises");
    let partial = dir.join(format!("{id}.json.partial"));
    if tokio::fs::write(&partial, text).await.is_ok() {
        let _ = tokio::fs::rename(&partial, dir.join(format!("{id}.json"))).await;
    }
}

/// The recordings in `dir`, oldest first (ids are time-ordered).
pub fn list(dir: &Path) -> std::io::Result<Vec<Recording>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(error),
    };
    let mut recordings = Vec::new();
    for entry in entries {
        let name = entry?.file_name();
        let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".mp4")) else {
            continue;
        };
        if let Some(recording) = describe(dir, id) {
            recordings.push(recording);
        }
    }
    recordings.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(recordings)
}

fn describe(dir: &Path, id: &str) -> Option<Recording> {
    if !is_recording_id(id) {
        return None;
    }
    let video = std::fs::symlink_metadata(dir.join(format!("{id}.mp4"))).ok()?;
    if !video.is_file() {
        return None;
    }
    let sidecar: Sidecar =
        serde_json::from_slice(&std::fs::read(dir.join(format!("{id}.json"))).ok()?).ok()?;
    Some(Recording {
        id: id.to_owned(),
        content_type: CONTENT_TYPE.to_owned(),
        size_bytes: video.len(),
        duration_sec: sidecar.frames as f64 / f64::from(FPS),
        created_at: sidecar.created_at,
        recording: !sidecar.finished,
    })
}

/// Opens recording `id` for reading: the file and its length.
pub fn open(dir: &Path, id: &str) -> std::io::Result<(std::fs::File, u64)> {
    use std::os::unix::fs::OpenOptionsExt as _;
    if !is_recording_id(id) {
        return Err(std::io::ErrorKind::NotFound.into());
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(dir.join(format!("{id}.mp4")))?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::ErrorKind::NotFound.into());
    }
    Ok((file, meta.len()))
}

/// Waits (at most `deadline`) until no recording in `dir` is still being
/// written; `false` if one still is.
pub async fn wait_finished(dir: &Path, deadline: Duration) -> bool {
    let until = tokio::time::Instant::now() + deadline;
    loop {
        let listed = {
            let dir = dir.to_owned();
            tokio::task::spawn_blocking(move || list(&dir)).await
        };
        let writing =
            matches!(listed, Ok(Ok(recordings)) if recordings.iter().any(|r| r.recording));
        if !writing {
            return true;
        }
        if tokio::time::Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Saves to the snapshot store the finished recordings in `dir` that it
/// lacks (at a park), so that a revive on another node brings them back.
/// The sidecar goes last: a saved sidecar means a saved video. Answers how
/// many were saved.
pub async fn save(
    store: &SnapshotStore,
    instance: &InstanceId,
    dir: &Path,
) -> anyhow::Result<usize> {
    let saved: HashSet<String> = store
        .recordings_saved(instance)
        .await?
        .into_iter()
        .collect();
    let listed = {
        let dir = dir.to_owned();
        tokio::task::spawn_blocking(move || list(&dir)).await??
    };
    let mut count = 0;
    for recording in listed.iter().filter(|r| !r.recording) {
        let (video, sidecar) = file_names(&recording.id);
        if saved.contains(&sidecar) {
            continue;
        }
        for name in [video, sidecar] {
            store
                .recording_save(instance, &name, &dir.join(&name))
                .await?;
        }
        count += 1;
    }
    Ok(count)
}

/// Brings back into `dir` the saved recordings of `instance` that it lacks
/// (a revive on a node that did not record them). Each file is written
/// aside and renamed into place, the sidecar last, so that a listing never
/// shows half a recording. Answers how many were brought back.
pub async fn restore(
    store: &SnapshotStore,
    instance: &InstanceId,
    dir: &Path,
) -> anyhow::Result<usize> {
    let saved = store.recordings_saved(instance).await?;
    let ids: Vec<&str> = saved
        .iter()
        .filter_map(|name| name.strip_suffix(".json"))
        .filter(|id| is_recording_id(id))
        .collect();
    tokio::fs::create_dir_all(dir).await?;
    let mut count = 0;
    for id in ids {
        let (video, sidecar) = file_names(id);
        if tokio::fs::try_exists(dir.join(&sidecar)).await? {
            continue;
        }
        for name in [video, sidecar] {
            let partial = dir.join(format!("{name}.partial"));
            store.recording_fetch(instance, &name, &partial).await?;
            tokio::fs::rename(&partial, dir.join(&name)).await?;
        }
        count += 1;
    }
    Ok(count)
}

/// The names of a recording's video and sidecar.
fn file_names(id: &str) -> (String, String) {
    (format!("{id}.mp4"), format!("{id}.json"))
}

/// Bytes the recordings in `dir` take.
pub fn size_bytes(dir: &Path) -> u64 {
    crate::system::monitor::dir_size(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_recording_ids_name_files() {
        assert!(is_recording_id("0193d6a4e1f07000800000000000abcd"));
        for bad in [
            "",
            "../../etc/passwd",
            "0193d6a4-e1f0-7000-8000-00000000abcd",
            "0193D6A4E1F07000800000000000ABCD",
            "0193d6a4e1f07000800000000000abc",
            "0193d6a4e1f07000800000000000abcd.mp4",
        ] {
            assert!(!is_recording_id(bad), "{bad}");
        }
    }

    #[test]
    fn listing_skips_what_is_not_a_recording_and_opening_follows_no_link() {
        let dir = tempfile::tempdir().unwrap();
        let id = "0193d6a4e1f07000800000000000abcd";
        std::fs::write(dir.path().join(format!("{id}.mp4")), b"video").unwrap();
        let sidecar = Sidecar {
            created_at: Utc::now(),
            frames: 25,
            finished: true,
        };
        std::fs::write(
            dir.path().join(format!("{id}.json")),
            serde_json::to_vec(&sidecar).unwrap(),
        )
        .unwrap();
        std::fs::write(dir.path().join("notes.mp4"), b"x").unwrap();
        let linked = "0193d6a4e1f07000800000000000ffff";
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join(format!("{linked}.mp4")))
            .unwrap();
        std::fs::write(
            dir.path().join(format!("{linked}.json")),
            serde_json::to_vec(&sidecar).unwrap(),
        )
        .unwrap();
        let listed = list(dir.path()).unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(listed[0].duration_sec, 2.5);
        assert_eq!(listed[0].size_bytes, 5);
        assert!(!listed[0].recording);
        assert!(open(dir.path(), id).is_ok());
        assert!(open(dir.path(), linked).is_err(), "a link is not followed");
        assert!(open(dir.path(), "../x").is_err());
        assert!(list(&dir.path().join("absent")).unwrap().is_empty());
    }
}
