//! The crash rounds, again and again with fresh seeds (issue 27): each
//! random-schedule crash test of `crates/cli/tests/it/crash_rounds.rs` (the
//! exact, fault-point ones have no seed) is run `--runs` times in a row,
//! each run with a new random `FLOTILLA_CRASH_SEED`
//! (printed, so that a failure can be replayed), until it fails or all are
//! green. The tests run one at a time (they kill and restart whole fleets
//! of real browsers).
//!
//! Usage: crash_stress [--runs 20] [--rounds 50] [--tests a,b,c] [--keep-going]
//!
//! `--rounds` sets `FLOTILLA_CRASH_ROUNDS` (rounds per run; the tests'
//! default is 50). `--tests` names tests by the end of their name (default:
//! the three crash-round tests). A test stops at its first failure (the
//! report is of consecutive green runs) unless `--keep-going`. Prints one
//! line per run and a table for `bench/RESULTS.md`; exits 1 when a run
//! failed. Run from the repository root; it builds with
//! `cargo nextest run --features flotilla/fault-points` first.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use flotilla_bench::{number_flag, text_flag};

const CRASH_TESTS: [&str; 3] = [
    "browser_serve_on_sqlite_survives_kill_9_at_any_moment",
    "browser_serve_on_postgres_and_s3_survives_kill_9_at_any_moment",
    "browser_a_cluster_survives_kill_9_of_its_agent_and_of_its_control_plane",
];

/// How one test fared.
struct Tally {
    test: String,
    green: usize,
    failed: Option<u64>,
    durations: Vec<Duration>,
}

fn nextest(test: &str, seed: Option<u64>, rounds: usize) -> Command {
    let mut command = Command::new("cargo");
    command.args([
        "nextest",
        "run",
        "--workspace",
        "--features",
        "flotilla/fault-points",
        "-E",
    ]);
    command.arg(format!("test(=crash_rounds::{test})"));
    if let Some(seed) = seed {
        command.env("FLOTILLA_CRASH_SEED", seed.to_string());
    }
    if rounds > 0 {
        command.env("FLOTILLA_CRASH_ROUNDS", rounds.to_string());
    }
    command
}

/// A random odd seed (the schedule's xorshift takes any non-zero one).
fn fresh_seed() -> u64 {
    rand::random::<u64>() | 1
}

/// `runs` runs of crash test `test` at `rounds` rounds each, each with a
/// fresh seed; stops at the first failure unless `keep_going`.
fn runs_of(test: &str, runs: usize, rounds: usize, keep_going: bool) -> anyhow::Result<Tally> {
    let mut tally = Tally {
        test: test.to_owned(),
        green: 0,
        failed: None,
        durations: Vec::new(),
    };
    for run in 1..=runs {
        let seed = fresh_seed();
        let started = Instant::now();
        let output = nextest(test, Some(seed), rounds)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .context("cargo nextest")?;
        let took = started.elapsed();
        let log = String::from_utf8_lossy(&output.stderr);
        let ran_one = log.contains(" 1 test run:");
        let passed = output.status.success() && ran_one;
        println!(
            "{test} run {run}/{runs} seed {seed}: {} in {:.0} s",
            if passed { "green" } else { "FAILED" },
            took.as_secs_f64()
        );
        if !ran_one {
            bail!("no test matched {test}:\n{log}");
        }
        if passed {
            tally.green += 1;
            tally.durations.push(took);
            continue;
        }
        let kept = std::env::temp_dir().join(format!("crash_stress-{test}-{seed}.log"));
        std::fs::write(&kept, &output.stderr)?;
        println!("  its output: {}", kept.display());
        tally.failed.get_or_insert(seed);
        if !keep_going {
            break;
        }
    }
    Ok(tally)
}

fn main() -> anyhow::Result<()> {
    let runs = number_flag("--runs", 20)?;
    let rounds = number_flag("--rounds", 0)?;
    let keep_going = std::env::args().any(|a| a == "--keep-going");
    let tests: Vec<String> = match text_flag("--tests", "")?.as_str() {
        "" => CRASH_TESTS.iter().map(|t| (*t).to_owned()).collect(),
        list => list.split(',').map(|t| t.trim().to_owned()).collect(),
    };
    let status = nextest("nothing", None, 0)
        .arg("--no-run")
        .status()
        .context("cargo nextest")?;
    if !status.success() {
        bail!("the test build failed");
    }
    let rounds_text = if rounds == 0 {
        "50 (default)".to_owned()
    } else {
        rounds.to_string()
    };
    println!("# crash_stress: {runs} runs per test, {rounds_text} rounds per run");
    let mut tallies = Vec::new();
    for test in &tests {
        tallies.push(runs_of(test, runs, rounds, keep_going)?);
    }
    println!("\n| test | rounds per run | green runs | first failing seed | run time (min–max) |");
    println!("|---|---|---|---|---|");
    for tally in &tallies {
        let (min, max) = (
            tally.durations.iter().min().copied().unwrap_or_default(),
            tally.durations.iter().max().copied().unwrap_or_default(),
        );
        println!(
            "| {} | {rounds_text} | {} of {runs} | {} | {:.0}–{:.0} s |",
            tally.test,
            tally.green,
            tally
                .failed
                .map_or_else(|| "none".to_owned(), |seed| seed.to_string()),
            min.as_secs_f64(),
            max.as_secs_f64()
        );
    }
    if tallies.iter().any(|t| t.failed.is_some()) {
        std::process::exit(1);
    }
    Ok(())
}
