//! The `flotilla` binary: argument parsing and wiring only. Every flag has a
//! `FLOTILLA_…` environment twin and a key in the TOML configuration file.

use std::path::PathBuf;

mod client;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};

use flotilla_event_proxy::Proxy;
use flotilla_server::{AgentNode, Control, FlotillaConfig, Serve};

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
    /// All in one: control plane, a local node agent running Chromium and the
    /// event proxy, on an embedded SQLite store under the data directory. Needs
    /// no configuration.
    Serve(ServeArgs),
    /// The control plane alone, for node agents on other machines (`flotilla
    /// agent`), on SQLite or a PostgreSQL shared by several control planes.
    Control(ControlArgs),
    /// A node agent: runs browsers on this machine for a control plane.
    Agent(AgentArgs),
    /// The event-streaming proxy alone (server-sent events, JWT webhook).
    Proxy(ProxyArgs),
    /// API keys for `auth_enabled = true`.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Browser instances (client of FLOTILLA_URL, with FLOTILLA_API_KEY).
    Instances {
        #[command(subcommand)]
        command: client::InstancesCommand,
        #[command(flatten)]
        output: client::Output,
    },
    /// Nodes (client of FLOTILLA_URL).
    Nodes {
        #[command(subcommand)]
        command: client::NodesCommand,
        #[command(flatten)]
        output: client::Output,
    },
    /// Cluster metrics (client of FLOTILLA_URL).
    Metrics {
        #[command(flatten)]
        args: client::MetricsArgs,
        #[command(flatten)]
        output: client::Output,
    },
    /// Lifecycle events, live (client of FLOTILLA_URL and its event proxy).
    Events {
        #[command(subcommand)]
        command: client::EventsCommand,
        #[command(flatten)]
        output: client::Output,
    },
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Prints a new random API key, and the `api_keys` entry (its SHA-256) to
    /// put in the configuration file. The key itself is shown once and stored nowhere.
    Create {
        /// Make it a tenant's key: it sees and acts only on what its tenant
        /// makes (printed as a `[[tenants]]` entry). Without it, an admin key.
        #[arg(long, value_name = "NAME")]
        tenant: Option<String>,
    },
}

#[derive(Args)]
struct ServeArgs {
    /// Control plane listen address [key: listen; default 127.0.0.1:8080; port 0 picks one].
    #[arg(long, env = "FLOTILLA_LISTEN")]
    listen: Option<String>,
    /// Event proxy listen address [key: http.bind_address; default 127.0.0.1:8081].
    #[arg(long, env = "FLOTILLA_PROXY_LISTEN")]
    proxy_listen: Option<String>,
    /// Directory for the store, profiles and snapshots [key: data_dir; default ./data].
    #[arg(long, env = "FLOTILLA_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// TOML configuration file (docs/configuration.md lists every key).
    #[arg(long, env = "FLOTILLA_CONFIG")]
    config: Option<PathBuf>,
}

#[derive(Args)]
struct ControlArgs {
    /// Listen address [key: listen; default 127.0.0.1:8080; port 0 picks one].
    #[arg(long, env = "FLOTILLA_LISTEN")]
    listen: Option<String>,
    /// `postgres://…` or `sqlite://…` [key: store.database_url; default SQLite under data_dir].
    #[arg(long, env = "FLOTILLA_DATABASE_URL")]
    database_url: Option<String>,
    /// Directory for the SQLite store and local snapshots [key: data_dir; default ./data].
    #[arg(long, env = "FLOTILLA_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// TOML configuration file (docs/configuration.md lists every key).
    #[arg(long, env = "FLOTILLA_CONFIG")]
    config: Option<PathBuf>,
}

#[derive(Args)]
struct AgentArgs {
    /// The control plane's URL [key: agent.control_plane_url].
    #[arg(long, env = "FLOTILLA_CONTROL_PLANE")]
    control_plane: Option<String>,
    /// Agent API listen address [key: agent.listen; default 127.0.0.1:0].
    #[arg(long, env = "FLOTILLA_AGENT_LISTEN")]
    listen: Option<String>,
    /// Address control planes use to reach this agent, `<scheme>://<host>:<port>`
    /// [key: agent.advertise; default http://<listen address>].
    #[arg(long, env = "FLOTILLA_ADVERTISE")]
    advertise: Option<String>,
    /// Directory for profiles and local snapshots [key: data_dir; default ./data].
    #[arg(long, env = "FLOTILLA_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// TOML configuration file (docs/configuration.md lists every key).
    #[arg(long, env = "FLOTILLA_CONFIG")]
    config: Option<PathBuf>,
}

#[derive(Args)]
struct ProxyArgs {
    /// Listen address [key: http.bind_address; default 127.0.0.1:8081; port 0 picks one].
    #[arg(long, env = "FLOTILLA_PROXY_LISTEN")]
    listen: Option<String>,
    /// TOML configuration file (docs/configuration.md lists every key).
    #[arg(long, env = "FLOTILLA_CONFIG")]
    config: Option<PathBuf>,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if let Some(result) = run_client(&cli) {
        return match result {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("flotilla: {error}");
                std::process::ExitCode::from(error.exit_code())
            }
        };
    }
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("flotilla: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The client commands, on a small runtime; `None` for the server commands.
fn run_client(cli: &Cli) -> Option<Result<(), client::ClientError>> {
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    };
    let result = match &cli.command {
        Command::Instances { command, output } => {
            let client = client::Client::from_env(output);
            runtime().block_on(client.instances(command.clone()))
        }
        Command::Nodes { command, output } => {
            let client = client::Client::from_env(output);
            runtime().block_on(client.nodes(command.clone()))
        }
        Command::Metrics { args, output } => {
            let client = client::Client::from_env(output);
            runtime().block_on(client.metrics(args.clone()))
        }
        Command::Events { command, output } => {
            let client = client::Client::from_env(output);
            runtime().block_on(client.watch(command.clone()))
        }
        _ => return None,
    };
    Some(result)
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Instances { .. }
        | Command::Nodes { .. }
        | Command::Metrics { .. }
        | Command::Events { .. } => unreachable!("client commands run in run_client"),
        Command::Serve(args) => {
            let mut overrides = Vec::new();
            push(&mut overrides, "listen", args.listen);
            push(&mut overrides, "http.bind_address", args.proxy_listen);
            push(
                &mut overrides,
                "data_dir",
                args.data_dir.map(|d| d.display().to_string()),
            );
            let config = FlotillaConfig::load(args.config.as_deref(), &overrides)?;
            with_telemetry(&config, "serve", || {
                runtime(0)?.block_on(serve(config.clone()))
            })
        }
        Command::Control(args) => {
            let mut overrides = Vec::new();
            push(&mut overrides, "listen", args.listen);
            push(&mut overrides, "store.database_url", args.database_url);
            push(
                &mut overrides,
                "data_dir",
                args.data_dir.map(|d| d.display().to_string()),
            );
            let config = FlotillaConfig::load(args.config.as_deref(), &overrides)?;
            with_telemetry(&config, "control", || {
                runtime(0)?.block_on(control(config.clone()))
            })
        }
        Command::Agent(args) => {
            let mut overrides = Vec::new();
            push(
                &mut overrides,
                "agent.control_plane_url",
                args.control_plane,
            );
            push(&mut overrides, "agent.listen", args.listen);
            push(&mut overrides, "agent.advertise", args.advertise);
            push(
                &mut overrides,
                "data_dir",
                args.data_dir.map(|d| d.display().to_string()),
            );
            let config = FlotillaConfig::load(args.config.as_deref(), &overrides)?;
            with_telemetry(&config, "agent", || {
                runtime(0)?.block_on(agent(config.clone()))
            })
        }
        Command::Keys(KeysCommand::Create { tenant }) => keys_create(tenant.as_deref()),
        Command::Proxy(args) => {
            let mut overrides = Vec::new();
            push(&mut overrides, "http.bind_address", args.listen);
            let config = FlotillaConfig::load(args.config.as_deref(), &overrides)?;
            config.proxy.validate().map_err(anyhow::Error::msg)?;
            with_telemetry(&config, "proxy", || {
                runtime(config.proxy.http.thread_pool_size)?.block_on(proxy(config.clone()))
            })
        }
    }
}

/// `flotilla keys create [--tenant NAME]`: a new key and its configuration
/// lines (it is shown once and stored nowhere).
fn keys_create(tenant: Option<&str>) -> anyhow::Result<()> {
    if let Some(name) = tenant
        && !flotilla_control_plane::config::is_tenant_name(name)
    {
        anyhow::bail!(
            "--tenant {name:?}: a tenant's name is 1 to 63 lower-case letters, digits and '-'"
        );
    }
    let key = format!("flt_{}", hex_encode(&rand_bytes()));
    println!("API key (give it to the client; it is not stored): {key}");
    println!("Add to the configuration file:");
    match tenant {
        None => println!("api_keys = [\"{}\"]", api_key_entry(&key)),
        Some(name) => {
            println!(
                "[[tenants]]\nname = \"{name}\"\napi_keys = [\"{}\"]",
                api_key_entry(&key)
            );
            println!("(or add the key to api_keys of the [[tenants]] entry named {name:?})");
        }
    }
    Ok(())
}

/// Runs a server command with the process's logs (stderr, `RUST_LOG`) and,
/// with `[telemetry] otlp_endpoint`, its spans exported; the spans still
/// buffered are sent once it has stopped.
fn with_telemetry(
    config: &FlotillaConfig,
    role: &str,
    run: impl FnOnce() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let logs = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,tower_http=warn,sqlx=warn"));
    let telemetry = flotilla_telemetry::init(&config.telemetry, role, logs)?;
    let result = run();
    telemetry.shutdown();
    result
}

fn rand_bytes() -> [u8; 32] {
    rand::random()
}

fn hex_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The configuration entry of `key`: `sha256:<hex>`.
fn api_key_entry(key: &str) -> String {
    use sha2::Digest as _;
    format!(
        "sha256:{}",
        hex_encode(&sha2::Sha256::digest(key.as_bytes()))
    )
}

fn push(
    overrides: &mut Vec<(&'static str, toml::Value)>,
    key: &'static str,
    value: Option<String>,
) {
    if let Some(value) = value {
        overrides.push((key, toml::Value::String(value)));
    }
}

fn runtime(worker_threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if worker_threads > 0 {
        builder.worker_threads(worker_threads);
    }
    Ok(builder.enable_all().build()?)
}

async fn serve(config: FlotillaConfig) -> anyhow::Result<()> {
    let serve = Serve::start(config)
        .await
        .context("cannot start flotilla serve")?;
    println!("control plane listening on http://{}", serve.control_addr);
    println!("event proxy listening on http://{}", serve.proxy_addr);
    println!("node agent listening on http://{}", serve.agent_addr);
    wait_for_signal().await?;
    drain_unless_signalled(&serve.agent).await?;
    tracing::info!("shutting down: closing every stream and browser");
    serve.shutdown().await;
    Ok(())
}

async fn control(config: FlotillaConfig) -> anyhow::Result<()> {
    let control = Control::start(config)
        .await
        .context("cannot start flotilla control")?;
    println!("control plane listening on http://{}", control.addr);
    wait_for_signal().await?;
    tracing::info!("shutting down");
    control.shutdown().await;
    Ok(())
}

async fn agent(config: FlotillaConfig) -> anyhow::Result<()> {
    let node = AgentNode::start(config)
        .await
        .context("cannot start flotilla agent")?;
    println!("node agent listening on http://{}", node.addr);
    wait_for_signal().await?;
    drain_unless_signalled(&node.agent).await?;
    tracing::info!("shutting down: closing every browser");
    node.shutdown().await;
    Ok(())
}

async fn proxy(config: FlotillaConfig) -> anyhow::Result<()> {
    flotilla_net::descriptors::raise_to_hard_limit();
    let listeners = flotilla_net::Listeners::new(&config.listeners, flotilla_net::Runs::NoBrowsers);
    let clock = std::sync::Arc::new(flotilla_api_types::clock::SystemClock);
    let proxy = Proxy::start_with(config.proxy, clock, listeners)
        .await
        .context("cannot start the event proxy")?;
    println!("event proxy listening on http://{}", proxy.addr);
    wait_for_signal().await?;
    tracing::info!("shutting down: closing every stream");
    proxy.shutdown().await;
    Ok(())
}

/// With `agent.drain_on_shutdown`, drains the node before the agent stops;
/// a second SIGTERM or SIGINT cuts the drain short.
async fn drain_unless_signalled(agent: &flotilla_node_agent::Agent) -> anyhow::Result<()> {
    tokio::select! {
        () = agent.drain_before_shutdown() => {}
        signalled = wait_for_signal() => {
            signalled?;
            tracing::warn!("a second signal: stopping without finishing the drain");
        }
    }
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
