//! [`Balancer`]: Debian's nginx as a round-robin load balancer in front of
//! several control planes, passing WebSocket upgrades and streams through
//! (what an operator's Service or ingress does).

use std::path::Path;
use std::process::{Child, Command, Stdio};

/// nginx balancing round-robin over upstream ports on loopback; stopped on
/// drop.
pub struct Balancer {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: tempfile::TempDir,
}

impl Balancer {
    /// Starts nginx on `port` (e.g. a [`crate::free_port`], known before
    /// the control planes start, for their `public_url`), balancing over
    /// `upstream_ports`.
    pub fn start(port: u16, upstream_ports: &[u16]) -> Self {
        let dir = tempfile::tempdir().expect("a temp dir");
        std::fs::create_dir_all(dir.path().join("temp")).expect("nginx's temp dir");
        let config = config(dir.path(), port, upstream_ports);
        std::fs::write(dir.path().join("nginx.conf"), config).expect("nginx.conf");
        let nginx = if Path::new("/usr/sbin/nginx").exists() {
            "/usr/sbin/nginx"
        } else {
            "nginx"
        };
        let child = Command::new(nginx)
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(dir.path().join("nginx.conf"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nginx starts (scripts/install-deps --test installs it)");
        Self { child, port, dir }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The requests it passed on so far: (method, path and `Mcp-Session-Id`
    /// or `-`, the port of the upstream that answered), from its access log.
    pub fn passed(&self) -> Vec<(String, u16)> {
        let log = std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default();
        log.lines()
            .filter_map(|line| {
                let (request, upstream) = line.rsplit_once(' ')?;
                let port = upstream.rsplit(':').next()?.parse().ok()?;
                Some((request.to_owned(), port))
            })
            .collect()
    }
}

/// nginx's configuration: round-robin, each request (not each client) to the
/// next upstream, a failed upstream skipped, upgrades and streams passed.
fn config(dir: &Path, port: u16, upstream_ports: &[u16]) -> String {
    let p = dir.display();
    let servers: String = upstream_ports
        .iter()
        .map(|upstream| format!("    server 127.0.0.1:{upstream} max_fails=1 fail_timeout=2s;\n"))
        .collect();
    format!(
        "worker_processes 1;\npid {p}/nginx.pid;\nerror_log {p}/error.log;\ndaemon off;\n\
         events {{ worker_connections 1024; }}\n\
         http {{\n  log_format passed '$request_method $uri $http_mcp_session_id $upstream_addr';\n  access_log {p}/access.log passed;\n  client_body_temp_path {p}/temp/body;\n  proxy_temp_path {p}/temp/proxy;\n\
           fastcgi_temp_path {p}/temp/fastcgi;\n  uwsgi_temp_path {p}/temp/uwsgi;\n  scgi_temp_path {p}/temp/scgi;\n\
           client_max_body_size 100m;\n\
           map $http_upgrade $connection_upgrade {{ default upgrade; '' close; }}\n\
           upstream control_planes {{\n{servers}  }}\n\
           server {{\n    listen 127.0.0.1:{port};\n\
             location / {{\n      proxy_pass http://control_planes;\n      proxy_http_version 1.1;\n\
               proxy_next_upstream error timeout;\n\
               proxy_set_header Host $http_host;\n      proxy_set_header Upgrade $http_upgrade;\n\
               proxy_set_header Connection $connection_upgrade;\n      proxy_buffering off;\n\
               proxy_request_buffering off;\n      proxy_read_timeout 3600s;\n    }}\n  }}\n}}\n"
    )
}

impl Drop for Balancer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
