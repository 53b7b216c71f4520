//! An MCP agent's `browser_navigate` + `browser_snapshot` round trip
//! (issue 30): Flotilla's `/mcp` on a release `flotilla serve` against
//! `@playwright/mcp` connected over CDP (`--cdp-endpoint`, the instance's
//! `urls.debug`) to the same instance, both driven by the official
//! TypeScript SDK in one Node process (`bench/js/mcp_roundtrip.mjs`),
//! interleaved; and the size of each snapshot of the same page. In the
//! same run, Flotilla's `/mcp` on a Firefox instance (issue 47: each step
//! over WebDriver BiDi, the snapshot computed in the page).
//!
//! Usage: mcp_bench [--binary target/release/flotilla] [--rounds 30]
//!                  [--playwright-mcp target/bench-npm/node_modules/@playwright/mcp/cli.js]
//!
//! `@playwright/mcp` is not a test dependency: install it with
//! `npm install --prefix target/bench-npm @playwright/mcp@0.0.83`.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use flotilla_bench::{
    ServeProcess, client_with_key, number_flag, percentile, run_node_script, serve_html, text_flag,
};

const KEY: &str = "mcp-bench-key";

/// A page of some size: a heading, a form and a list of fifty links.
fn page() -> String {
    let mut html = String::from(
        "<!doctype html><title>Catalogue</title><h1>Catalogue</h1>\
         <form><label>Search <input name=q></label><button>Go</button></form><ul>",
    );
    for item in 1..=50 {
        html.push_str(&format!(
            "<li><a href=\"/item/{item}\">Item {item}</a> <span>{}.00 EUR</span></li>",
            item * 3
        ));
    }
    html.push_str("</ul>");
    html
}

fn series(results: &Value, way: &str, field: &str) -> Vec<f64> {
    results[way]
        .as_array()
        .map(|rounds| rounds.iter().filter_map(|r| r[field].as_f64()).collect())
        .unwrap_or_default()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let binary = PathBuf::from(text_flag("--binary", "target/release/flotilla")?);
    let rounds = number_flag("--rounds", 30)?;
    let playwright_mcp = text_flag(
        "--playwright-mcp",
        "target/bench-npm/node_modules/@playwright/mcp/cli.js",
    )?;
    if !Path::new(&playwright_mcp).exists() {
        bail!(
            "{playwright_mcp} is missing: npm install --prefix target/bench-npm @playwright/mcp@0.0.83"
        );
    }
    let site = serve_html(page()).await?;
    let dir = tempfile::Builder::new()
        .prefix("flotilla-mcp-bench-")
        .tempdir()?;
    let config = dir.path().join("flotilla.toml");
    std::fs::write(
        &config,
        format!(
            "auth_enabled = true\napi_keys = [\"{KEY}\"]\n[http]\nbind_address = \"127.0.0.1:0\"\n\
             [agent]\nwarm_pool_size = 1\n[agent.egress]\nallow = [\"{}\"]\n",
            site.trim_start_matches("http://")
        ),
    )?;
    let serve = ServeProcess::start(&binary, &dir.path().join("data"), Some(&config))
        .await
        .with_context(|| format!("starting {}", binary.display()))?;
    let http = client_with_key(KEY)?;
    let create = |image: Option<&'static str>| {
        let (http, url) = (http.clone(), serve.url.clone());
        async move {
            let body = image.map_or_else(|| json!({}), |image| json!({"image": image}));
            let created: Value = http
                .post(format!("{url}/v2/instances"))
                .json(&body)
                .send()
                .await?
                .json()
                .await?;
            let id = created["id"].as_str().context("a created instance")?;
            let pause = std::time::Duration::from_millis(50);
            flotilla_bench::wait_running(&http, &url, id, pause).await?;
            anyhow::Ok(created)
        }
    };
    let created = create(None).await?;
    let instance = created["id"].as_str().context("a created instance")?;
    let firefox = create(Some("firefox")).await?;
    let options = json!({
        "api": serve.url,
        "key": KEY,
        "instance": instance,
        "firefox_instance": firefox["id"],
        "debug": created["urls"]["debug"],
        "url": format!("{site}/"),
        "rounds": rounds,
        "playwright_mcp": std::fs::canonicalize(&playwright_mcp)?,
    });
    let results = run_node_script("mcp_roundtrip.mjs", &options).await;
    serve.stop().await;
    print_results(&results?, rounds);
    Ok(())
}

/// The table of what `mcp_roundtrip.mjs` measured.
fn print_results(results: &Value, rounds: usize) {
    println!("browser_navigate + browser_snapshot, {rounds} rounds, one instance\n");
    println!("| | p50 ms | p90 ms | snapshot bytes |");
    println!("|---|---|---|---|");
    for (way, label) in [
        ("flotilla", "Flotilla /mcp"),
        ("flotilla_firefox", "Flotilla /mcp on Firefox"),
        (
            "playwright_mcp",
            "@playwright/mcp 0.0.83 over CDP (--cdp-endpoint)",
        ),
    ] {
        let times = series(results, way, "ms");
        let sizes = series(results, way, "snapshot_bytes");
        println!(
            "| {label} | {:.1} | {:.1} | {:.0} |",
            percentile(&times, 0.5),
            percentile(&times, 0.9),
            percentile(&sizes, 0.5)
        );
    }
}
