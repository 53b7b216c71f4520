//! The README's "Try it", run as it is written: every fenced snippet of the
//! section is read from README.md (never copied here) and run against a real
//! `serve` (real Chromium), with only the README's addresses
//! (`localhost:8080`, the proxy's `localhost:8081`) pointed at the test's
//! ports. JavaScript runs with Node in `tests/js` (its packages), Python with
//! `python3`, shell with bash (the `flotilla` binary first on `PATH`), and the
//! MCP configuration is connected to with an MCP handshake. The image's
//! `podman run` is the one snippet left out: it needs the image, and
//! `bench/first_instance.py` reads it from README.md and runs it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};

use flotilla_testkit::{TestServe, get_json, spawn_serve, wait_until, workspace_root};

/// One fenced block of the section.
#[derive(Debug)]
struct Snippet {
    language: String,
    code: String,
    /// Its first line in README.md.
    line: usize,
}

/// The fenced blocks between "## Try it" and the next "## " heading.
fn try_it_snippets(readme: &str) -> Vec<Snippet> {
    let mut snippets = Vec::new();
    let mut in_section = false;
    let mut open: Option<Snippet> = None;
    for (index, line) in readme.lines().enumerate() {
        if open.is_none() && line.starts_with("## ") {
            in_section = line.trim() == "## Try it";
            continue;
        }
        if !in_section {
            continue;
        }
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(language)) => {
                open = Some(Snippet {
                    language: language.trim().to_owned(),
                    code: String::new(),
                    line: index + 2,
                })
            }
            (Some(_), Some(_)) => snippets.extend(open.take()),
            (Some(snippet), None) => {
                snippet.code.push_str(line);
                snippet.code.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "a fenced block of README.md is not closed");
    snippets
}

/// The snippet with the README's addresses pointed at this test's processes.
fn pointed(code: &str, api: &str, proxy: &str) -> String {
    let api_port = api.rsplit(':').next().expect("a port");
    code.replace("localhost:8080", api)
        .replace("localhost:8081", proxy)
        .replace("port: 8080", &format!("port: {api_port}"))
}

struct Ran {
    status: Option<i32>,
    stdout: String,
    stderr: String,
}

async fn run(program: &str, args: &[&str], dir: &Path, env: &[(&str, &str)]) -> Ran {
    let output = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(program)
            .args(args)
            .current_dir(dir)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the snippet ends within 120 s")
    .expect("it starts");
    Ran {
        status: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Runs one snippet; what it printed. `path`: `PATH` with the `flotilla`
/// binary first (the CLI's `FLOTILLA_URL` is this test's `serve`).
async fn run_snippet(snippet: &Snippet, serve: &TestServe, path: &str) -> String {
    let api = serve.api.base.trim_start_matches("http://").to_owned();
    let proxy = serve.serve().proxy_url();
    let proxy = proxy.trim_start_matches("http://");
    let code = pointed(&snippet.code, &api, proxy);
    let js = workspace_root().join("tests/js");
    let path = &[("PATH", path), ("FLOTILLA_URL", serve.api.base.as_str())];
    let ran = match snippet.language.as_str() {
        "js" => {
            let file = js.join(format!(".readme-{}.mjs", snippet.line));
            std::fs::write(&file, &code).expect("write the snippet");
            let ran = run("node", &[&file.to_string_lossy()], &js, path).await;
            let _ = std::fs::remove_file(&file);
            ran
        }
        "python" => run("python3", &["-c", &code], &js, path).await,
        "sh" => run("bash", &["-euo", "pipefail", "-c", &code], &js, path).await,
        "json" => return mcp_handshake(&code).await,
        other => panic!("README.md line {}: no runner for ```{other}", snippet.line),
    };
    // curl's --max-time ends a stream of events as intended (exit 28).
    let ended = ran.status == Some(0) || (code.contains("--max-time") && ran.status == Some(28));
    assert!(
        ended,
        "README.md line {}: exit {:?}\n{code}\nstdout: {}\nstderr: {}",
        snippet.line, ran.status, ran.stdout, ran.stderr
    );
    ran.stdout
}

/// The MCP client configuration: its server answers an MCP `initialize`.
async fn mcp_handshake(configuration: &str) -> String {
    let configuration: Value =
        serde_json::from_str(configuration).expect("the MCP configuration is JSON");
    let url = configuration["mcpServers"]["flotilla"]["url"]
        .as_str()
        .expect("mcpServers.flotilla.url");
    let answer = reqwest::Client::new()
        .post(url)
        .header("Accept", "application/json, text/event-stream")
        .json(&json!({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "readme", "version": "1"}},
        }))
        .send()
        .await
        .expect("the MCP server answers");
    assert!(answer.status().is_success(), "{}", answer.status());
    answer.text().await.expect("a body")
}

/// Every snippet of "Try it" runs and says what the README says it does.
#[tokio::test]
async fn browser_every_snippet_of_the_readme_runs_as_written() {
    let readme = std::fs::read_to_string(workspace_root().join("README.md")).expect("README.md");
    let snippets = try_it_snippets(&readme);
    let (image, runnable): (Vec<&Snippet>, Vec<&Snippet>) = snippets
        .iter()
        .partition(|snippet| snippet.code.contains("podman run"));
    assert_eq!(
        image.len(),
        1,
        "one image snippet, run by bench/first_instance.py"
    );
    let doors = [
        "connectOverCDP",
        "puppeteer.connect",
        "chromium.connect(",
        "selenium",
        "webdriverio",
        "mcpServers",
        "/v2/actions/",
        "/events/",
        "flotilla instances",
    ];
    for door in doors {
        assert!(
            runnable.iter().any(|snippet| snippet.code.contains(door)),
            "no snippet of README.md's Try it shows {door}"
        );
    }

    let serve = spawn_serve().await;
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_flotilla"));
    let path = format!(
        "{}:{}",
        binary.parent().expect("a folder").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for snippet in runnable {
        // The events snippet listens for ten seconds: something happens then.
        let meanwhile = snippet.code.contains("/events/").then(|| {
            let api = serve.api.clone();
            let proxy = serve.serve().proxy_url();
            tokio::spawn(async move {
                // Once the proxy counts the snippet's subscription.
                wait_until(
                    Duration::from_secs(30),
                    "the snippet to subscribe",
                    || async {
                        let health: Value = get_json(&format!("{proxy}/health")).await;
                        Ok::<_, String>((health["connections"].as_i64() == Some(1)).then_some(()))
                    },
                )
                .await
                .expect("subscribed");
                api.create("{}").await
            })
        });
        let printed = run_snippet(snippet, &serve, &path).await;
        if let Some(meanwhile) = meanwhile {
            meanwhile.await.expect("the create meanwhile");
        }
        let expected = match snippet.language.as_str() {
            "js" | "python" => "Hello from",
            "json" => "serverInfo",
            _ if snippet.code.contains("/v2/actions/content") => "<h1>Hello from an action</h1>",
            _ if snippet.code.contains("/events/") => "instance.created",
            _ if snippet.code.contains("-XPOST localhost") => "\"urls\"",
            _ if snippet.code.contains("flotilla instances") => "running",
            _ => "",
        };
        assert!(
            printed.contains(expected),
            "README.md line {}: {expected:?} not in what it printed:\n{printed}",
            snippet.line
        );
    }
}
