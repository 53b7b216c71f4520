//! [`S3Server`]: an S3-compatible object store (moto) on a free port.

use std::process::Stdio;
use std::time::Duration;

use crate::wait_until;
use anyhow::Context as _;

/// An S3-compatible server (moto, from PyPI) on a free loopback port, with one
/// bucket; stopped on drop.
pub struct S3Server {
    child: tokio::process::Child,
    pub endpoint: String,
    pub bucket: String,
}

impl S3Server {
    pub async fn start(bucket: &str) -> anyhow::Result<Self> {
        let port = crate::free_port();
        let endpoint = format!("http://127.0.0.1:{port}");
        let child = Self::spawn_on(&endpoint, bucket).await?;
        Ok(Self {
            child,
            endpoint,
            bucket: bucket.to_owned(),
        })
    }

    /// Kills the server: connections are refused until [`S3Server::restart`].
    pub async fn stop(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Starts a fresh (empty) server on the same port, with the bucket.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.stop().await;
        self.child = Self::spawn_on(&self.endpoint, &self.bucket).await?;
        Ok(())
    }

    /// Freezes the server (SIGSTOP): connections are accepted by the kernel
    /// but never answered, until [`S3Server::resume`]. Its objects stay.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    pub(super) fn signal(&self, signal: i32) {
        if let Some(pid) = self.child.id() {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(pid as i32, signal) };
        }
    }

    pub(super) async fn spawn_on(
        endpoint: &str,
        bucket: &str,
    ) -> anyhow::Result<tokio::process::Child> {
        let port = endpoint.rsplit(':').next().unwrap_or_default().to_owned();
        let child = tokio::process::Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start moto_server: run scripts/install-deps --test (pip install 'moto[server]')")?;
        let http = reqwest::Client::new();
        let bucket_url = format!("{endpoint}/{bucket}");
        wait_until(
            Duration::from_secs(60),
            "moto to accept a bucket",
            || async {
                match http.put(&bucket_url).send().await {
                    Ok(response) if response.status().is_success() => Ok(Some(())),
                    Ok(response) => Err(response.status().to_string()),
                    Err(error) => Err(error.to_string()),
                }
            },
        )
        .await?;
        Ok(child)
    }

    /// Keys of the objects under `prefix`.
    pub async fn keys(&self, prefix: &str) -> Vec<String> {
        let listing = reqwest::get(format!(
            "{}/{}?list-type=2&prefix={prefix}",
            self.endpoint, self.bucket
        ))
        .await
        .expect("moto answers")
        .text()
        .await
        .unwrap_or_default();
        listing
            .split("<Key>")
            .skip(1)
            .filter_map(|part| part.split("</Key>").next())
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.resume();
        let _ = self.child.start_kill();
    }
}
