//! The clients users run, driving Flotilla in the tests: the Playwright and
//! Puppeteer scripts in `tests/js` (Node), and the Selenium ones in
//! `tests/py` (Python).

use std::process::Stdio;
use std::time::Duration;

use crate::workspace_root;
use anyhow::{Context as _, bail};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

/// Runs `tests/js/<script>` with Node and parses the last line of its output as JSON.
pub async fn run_node(script: &str, args: &[&str]) -> anyhow::Result<Value> {
    run_node_with(script, args, &[]).await
}

/// [`run_node`] with extra environment variables (`NODE_OPTIONS`,
/// `NODE_EXTRA_CA_CERTS`, …).
pub async fn run_node_with(
    script: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> anyhow::Result<Value> {
    let dir = workspace_root().join("tests/js");
    if !dir.join("node_modules").is_dir() {
        bail!("tests/js/node_modules is missing: run scripts/install-deps --test");
    }
    run_client("node", &dir, script, args, env).await
}

/// Runs `tests/py/<script>` with Python 3 and parses the last line of its
/// output as JSON.
pub async fn run_python(script: &str, args: &[&str]) -> anyhow::Result<Value> {
    let dir = workspace_root().join("tests/py");
    run_client("python3", &dir, script, args, &[]).await
}

/// Runs `program dir/script args…` in `dir` (120 s at most): the JSON of
/// its last line of output.
async fn run_client(
    program: &str,
    dir: &std::path::Path,
    script: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> anyhow::Result<Value> {
    let mut child = tokio::process::Command::new(program)
        .arg(dir.join(script))
        .args(args)
        .envs(env.iter().copied())
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {program}"))?;
    let output = tokio::time::timeout(Duration::from_secs(120), async {
        let mut stdout = String::new();
        let mut stderr = String::new();
        let mut out = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut err = BufReader::new(child.stderr.take().expect("stderr")).lines();
        loop {
            tokio::select! {
                line = out.next_line() => match line? { Some(l) => { stdout.push_str(&l); stdout.push('\n'); } None => break },
                line = err.next_line() => if let Some(l) = line? { stderr.push_str(&l); stderr.push('\n'); },
            }
        }
        while let Some(l) = err.next_line().await? {
            stderr.push_str(&l);
            stderr.push('\n');
        }
        let status = child.wait().await?;
        anyhow::Ok((status, stdout, stderr))
    })
    .await
    .with_context(|| format!("{script} timed out after 120 s"))??;
    let (status, stdout, stderr) = output;
    if !status.success() {
        bail!("{script} failed ({status}):\n{stderr}\n{stdout}");
    }
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last)
        .with_context(|| format!("{script} printed no JSON: {stdout}\n{stderr}"))
}
