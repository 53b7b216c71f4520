//! The `flotilla` binary: argument parsing and wiring only. Every flag has a
//! `FLOTILLA_…` environment twin and a key in the TOML configuration file.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};

use flotilla_server::{FlotillaConfig, Serve};

/// mimalloc: the API's hot paths allocate per row and per response; measured
/// with glibc malloc, a 100-item list page spent ~40 % of its time in malloc/free.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "flotilla",
    version,
    about = "A self-hosted fleet of real browsers"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// All in one: control plane and a local node agent running Chromium, on an
    /// embedded SQLite store under the data directory. Needs no configuration.
    Serve(ServeArgs),
}

#[derive(Args)]
struct ServeArgs {
    /// Control plane listen address [key: listen; default 127.0.0.1:8080; port 0 picks one].
    #[arg(long, env = "FLOTILLA_LISTEN")]
    listen: Option<String>,
    /// Directory for the store, profiles and snapshots [key: data_dir; default ./data].
    #[arg(long, env = "FLOTILLA_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// TOML configuration file (docs/configuration.md lists every key).
    #[arg(long, env = "FLOTILLA_CONFIG")]
    config: Option<PathBuf>,
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("info,tower_http=warn,sqlx=warn")
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("flotilla: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => serve(args).await,
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let mut overrides = Vec::new();
    if let Some(listen) = args.listen {
        overrides.push(("listen", toml::Value::String(listen)));
    }
    if let Some(data_dir) = args.data_dir {
        overrides.push((
            "data_dir",
            toml::Value::String(data_dir.display().to_string()),
        ));
    }
    let config = FlotillaConfig::load(args.config.as_deref(), &overrides)?;
    let serve = Serve::start(config)
        .await
        .context("cannot start flotilla serve")?;
    println!("control plane listening on http://{}", serve.control_addr);
    println!("node agent listening on http://{}", serve.agent_addr);
    wait_for_signal().await?;
    tracing::info!("shutting down: closing every browser");
    serve.shutdown().await;
    Ok(())
}

async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    Ok(())
}
