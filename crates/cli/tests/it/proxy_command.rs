//! `flotilla proxy` as a process: startup is refused with a clear message when
//! authentication is required but no webhook is set; it starts otherwise and
//! stops cleanly on SIGTERM. And `flotilla keys create`.

use std::process::Stdio;
use std::time::Duration;

use flotilla_testkit::get_json;
use tokio::io::{AsyncBufReadExt, BufReader};

fn proxy() -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_flotilla"));
    command
        .args(["proxy", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

#[tokio::test]
async fn startup_is_refused_without_a_webhook_when_authentication_is_required() {
    let output = tokio::time::timeout(Duration::from_secs(60), proxy().output())
        .await
        .unwrap()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("jwt_verifier.webhook_url") && stderr.contains("require_authentication"),
        "{stderr}"
    );
}

#[tokio::test]
async fn starts_open_when_told_and_stops_on_sigterm() {
    let mut child = proxy()
        .env("FLOTILLA_JWT_VERIFIER__REQUIRE_AUTHENTICATION", "false")
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let url = line
        .strip_prefix("event proxy listening on ")
        .expect("the address line")
        .to_owned();
    let health: serde_json::Value = get_json(&format!("{url}/health")).await;
    assert_eq!(health["status"], "healthy");
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(child.id().unwrap() as i32, libc::SIGTERM) };
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
}

#[tokio::test]
async fn keys_create_prints_a_key_and_its_configuration_line() {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["keys", "create"])
        .output()
        .await
        .unwrap();
    assert!(output.status.success());
    let stdout = String::from_utf8(output.stdout).unwrap();
    let key = stdout
        .lines()
        .find_map(|l| l.strip_prefix("API key (give it to the client; it is not stored): "))
        .expect("the key line");
    assert!(key.starts_with("flt_") && key.len() == 68, "{key}");
    use sha2::Digest;
    let hash: String = sha2::Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert!(
        stdout.contains(&format!("api_keys = [\"sha256:{hash}\"]")),
        "{stdout}"
    );
}
