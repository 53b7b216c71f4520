//! A ready page as a client sees it (issue 32): create, `puppeteer.connect`
//! to `urls.debug` through the front door, `newPage`, `goto` a `data:` page,
//! `title`; interleaved with raw Chromium launched by the same script (as
//! root with `--no-sandbox`, and unprivileged in its own sandbox); and one
//! instance reached through the front door and through its own port.
//!
//! Usage: ready_page_bench [--binary target/release/flotilla] [--rounds 10]
//!                         [--chromium /usr/lib/chromium/chromium]
//!                         [--baseline path/to/an/older/flotilla]
//!
//! Each binary is a release `flotilla serve` with authentication on,
//! `public_url` set (so `urls.debug` is the door, as in production) and a
//! warm pool of two. With `--baseline`, both builds take turns in every
//! round of one run. One Node process drives it all
//! (`bench/js/ready_page.mjs`), after a warm-up round that is not counted.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde_json::{Value, json};

use flotilla_bench::{
    ServeProcess, free_port, keyed_config, number_flag, run_node_script, step_medians, text_flag,
};
use flotilla_node_agent::config::BASE_CHROMIUM_FLAGS;

const KEY: &str = "ready-page-bench-key";
const STEPS: [&str; 5] = ["answer", "connect", "newPage", "goto", "title"];

struct Build {
    name: String,
    serve: ServeProcess,
    _dir: tempfile::TempDir,
}

async fn start(name: &str, binary: &Path) -> anyhow::Result<Build> {
    let dir = tempfile::Builder::new()
        .prefix("flotilla-ready-page-")
        .tempdir()?;
    let port = free_port();
    let rest = "[http]\nbind_address = \"127.0.0.1:0\"\n[agent]\nwarm_pool_size = 2\n";
    let config = keyed_config(dir.path(), KEY, port, rest)?;
    let serve = ServeProcess::start_listening(
        binary,
        &dir.path().join("data"),
        Some(&config),
        &format!("127.0.0.1:{port}"),
    )
    .await
    .with_context(|| format!("starting {}", binary.display()))?;
    Ok(Build {
        name: name.to_owned(),
        serve,
        _dir: dir,
    })
}

/// Runs `bench/js/ready_page.mjs` over `builds`: its JSON.
async fn run_script(builds: &[Build], chromium: &str, rounds: usize) -> anyhow::Result<Value> {
    let listed: Vec<Value> = builds
        .iter()
        .map(|b| json!({"name": b.name, "api": b.serve.url}))
        .collect();
    let options = json!({
        "builds": listed,
        "key": KEY,
        "rounds": rounds,
        "chromium": chromium,
        "flags": BASE_CHROMIUM_FLAGS,
    });
    run_node_script("ready_page.mjs", &options).await
}

/// The rounds of `list`, or their member `way`.
fn samples<'a>(list: &'a Value, way: Option<&str>) -> Vec<&'a Value> {
    let rounds = list.as_array().map(Vec::as_slice).unwrap_or_default();
    rounds
        .iter()
        .map(|round| way.map_or(round, |way| &round[way]))
        .collect()
}

fn print_row(label: &str, values: &[f64]) {
    let cells: Vec<String> = values.iter().map(|v| format!("{v:.1}")).collect();
    println!("| {label} | {} |", cells.join(" | "));
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let binary = PathBuf::from(text_flag("--binary", "target/release/flotilla")?);
    let baseline = text_flag("--baseline", "")?;
    let rounds = number_flag("--rounds", 10)?;
    let chromium = text_flag("--chromium", "/usr/lib/chromium/chromium")?;
    let mut builds = Vec::new();
    if !baseline.is_empty() {
        builds.push(start("baseline", Path::new(&baseline)).await?);
    }
    builds.push(start("this build", &binary).await?);
    let results = run_script(&builds, &chromium, rounds).await?;
    println!("medians in ms, {rounds} rounds\n");
    println!("| | answer / launch | connect | newPage | goto | title | total |");
    println!("|---|---|---|---|---|---|---|");
    for build in &builds {
        let samples = samples(&results[&build.name]["flotilla"], None);
        print_row(
            &format!("Flotilla ({}), warm pool", build.name),
            &step_medians(&samples, &STEPS),
        );
    }
    let launch_steps = ["launch", "connect", "newPage", "goto", "title"];
    for (key, label) in [
        ("raw_root", "raw Chromium, root, --no-sandbox"),
        (
            "raw_unprivileged",
            "raw Chromium, unprivileged, its own sandbox",
        ),
    ] {
        let samples = samples(&results[key], None);
        print_row(label, &step_medians(&samples, &launch_steps));
    }
    println!("\none instance, two ways (medians in ms)\n");
    println!("| build, urls.debug | connect | newPage | goto | title | total |");
    println!("|---|---|---|---|---|---|");
    for build in &builds {
        for (way, label) in [
            ("own", "its own port, with its token"),
            ("door", "the front door"),
        ] {
            let samples = samples(&results[&build.name]["two_ways"], Some(way));
            print_row(
                &format!("{}, {label}", build.name),
                &step_medians(&samples, &STEPS[1..]),
            );
        }
    }
    println!(
        "\n{} creates found no warm browser (deleted and retried, not counted)",
        results["cold_creates"]
    );
    for build in builds {
        build.serve.stop().await;
    }
    Ok(())
}
