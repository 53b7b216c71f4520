//! The configuration file of every `flotilla` process, and its loading:
//! built-in defaults, then the TOML file, then `FLOTILLA_…` environment
//! variables, then command-line flags. Unknown keys are errors that name the key.
//!
//! Environment: `FLOTILLA_<KEY>` for top-level keys and `FLOTILLA_<SECTION>__<KEY>`
//! for keys in sections (e.g. `FLOTILLA_AGENT__MAX_INSTANCES=10`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

use flotilla_control_plane::ControlPlaneConfig;
use flotilla_control_plane::config::ApiRateLimitConfig;
use flotilla_event_proxy::config::{ProxyConfig, RateLimitConfig};
use flotilla_net::ListenerLimits;
use flotilla_node_agent::AgentConfig;
use flotilla_node_agent::snapshot::SnapshotsConfig;

/// Top-level keys that may come from the environment (section keys come as
/// `SECTION__KEY`). Flags' own variables (`FLOTILLA_DATABASE_URL`, …) and the
/// client's (`FLOTILLA_URL`, `FLOTILLA_API_KEY`) are read by the CLI, not here.
const ENV_TOP_LEVEL_KEYS: &[&str] = &[
    "listen",
    "data_dir",
    "auth_enabled",
    "api_keys",
    "cluster_token",
    "public_url",
    "trusted_proxies",
];

/// Every key of the configuration file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FlotillaConfig {
    /// Control plane listen address (`serve`, `control`).
    pub listen: String,
    /// Directory for the embedded store, instance profiles and snapshots.
    pub data_dir: PathBuf,
    #[serde(flatten)]
    pub control: ControlPlaneConfig,
    pub agent: AgentConfig,
    pub snapshots: SnapshotsConfig,
    /// `[listeners]`: what a client may hold on every listener of the process.
    pub listeners: ListenerLimits,
    /// `[telemetry]`: OpenTelemetry spans over OTLP/HTTP (off by default).
    pub telemetry: flotilla_telemetry::TelemetryConfig,
    /// The event proxy's sections: `[http]`, `[jwt_verifier]`, `[publisher]`,
    /// `[history]` (and its `[rate_limit]` keys, below).
    #[serde(flatten)]
    pub proxy: ProxyConfig,
    /// `[rate_limit]` holds keys of both the control plane (`enabled`,
    /// `requests_per_minute`) and the event proxy (`rate_limit_per_ip`, …), so
    /// it is read here and handed to each (`control.rate_limit`,
    /// `proxy.rate_limit`). Declared last: it serialises after the flattened
    /// parts, so the whole section is what the unknown-key check sees.
    pub rate_limit: RateLimitSection,
}

/// The shared `[rate_limit]` section.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RateLimitSection {
    #[serde(flatten)]
    pub api: ApiRateLimitConfig,
    #[serde(flatten)]
    pub proxy: RateLimitConfig,
}

impl Default for FlotillaConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            data_dir: PathBuf::from("./data"),
            control: ControlPlaneConfig::default(),
            agent: AgentConfig::default(),
            snapshots: SnapshotsConfig::default(),
            listeners: ListenerLimits::default(),
            telemetry: flotilla_telemetry::TelemetryConfig::default(),
            proxy: ProxyConfig::default(),
            rate_limit: RateLimitSection::default(),
        }
    }
}

impl FlotillaConfig {
    /// Loads the configuration. `overrides` are flag values as (dotted key, value).
    pub fn load(file: Option<&Path>, overrides: &[(&str, toml::Value)]) -> anyhow::Result<Self> {
        let mut figment = Figment::from(Serialized::defaults(FlotillaConfig::default()));
        let mut supplied = toml::Table::new();
        if let Some(file) = file {
            let text = std::fs::read_to_string(file).with_context(|| {
                format!("cannot read the configuration file {}", file.display())
            })?;
            let table: toml::Table = text
                .parse()
                .with_context(|| format!("{} is not valid TOML", file.display()))?;
            merge_tables(&mut supplied, table);
            figment = figment.merge(Toml::file_exact(file));
        }
        let env = Env::prefixed("FLOTILLA_").split("__").filter(|key| {
            let key = key.as_str().to_ascii_lowercase();
            key.contains('.') || ENV_TOP_LEVEL_KEYS.contains(&key.as_str())
        });
        for (key, value) in env.iter() {
            insert_dotted(&mut supplied, key.as_str(), toml::Value::String(value));
        }
        figment = figment.merge(env);
        for (key, value) in overrides {
            figment = figment.merge(Serialized::default(key, value.clone()));
            insert_dotted(&mut supplied, key, value.clone());
        }
        let mut config: FlotillaConfig = match figment.extract() {
            Ok(config) => config,
            Err(error) => {
                // The flattened top level hides key paths; extracting the control
                // plane's part alone names the key.
                if let Err(keyed) = figment.extract::<ControlPlaneConfig>() {
                    return Err(describe_figment_error(keyed));
                }
                if let Err(keyed) = figment.extract::<ProxyConfig>() {
                    return Err(describe_figment_error(keyed));
                }
                return Err(describe_figment_error(error));
            }
        };
        config.control.rate_limit = config.rate_limit.api.clone();
        config.proxy.rate_limit = config.rate_limit.proxy.clone();
        let known = toml::Table::try_from(&config).context("configuration does not serialise")?;
        if let Some(unknown) = first_unknown_key(&supplied, &known, "") {
            anyhow::bail!(
                "unknown configuration key `{unknown}`; docs/configuration.md lists every key"
            );
        }
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        self.listen_addr()?;
        self.control.validate().map_err(anyhow::Error::msg)?;
        self.agent.validate().map_err(anyhow::Error::msg)?;
        self.listeners.validate().map_err(anyhow::Error::msg)?;
        self.telemetry.validate()?;
        Ok(())
    }

    /// [`Self::validate`], and what a process serving the API needs beyond
    /// it (an API key when `auth_enabled`).
    pub fn validate_serving(&self) -> anyhow::Result<()> {
        self.validate()?;
        self.control.validate_serving().map_err(anyhow::Error::msg)
    }

    pub fn listen_addr(&self) -> anyhow::Result<SocketAddr> {
        self.listen.parse().with_context(|| {
            format!(
                "listen must be an address like 127.0.0.1:8080 (got {:?})",
                self.listen
            )
        })
    }

    /// The store URL: `store.database_url`, or SQLite under `data_dir`.
    pub fn database_url(&self) -> String {
        self.control
            .store
            .database_url
            .clone()
            .unwrap_or_else(|| format!("sqlite://{}/flotilla.db", self.data_dir.display()))
    }
}

/// Names the key of every error figment found.
fn describe_figment_error(error: figment::Error) -> anyhow::Error {
    let messages: Vec<String> = error
        .into_iter()
        .map(|e| {
            if e.path.is_empty() {
                e.kind.to_string()
            } else {
                format!("{}: {}", e.path.join("."), e.kind)
            }
        })
        .collect();
    anyhow::anyhow!("invalid configuration: {}", messages.join("; "))
}

fn merge_tables(into: &mut toml::Table, from: toml::Table) {
    for (key, value) in from {
        match (into.get_mut(&key), value) {
            (Some(toml::Value::Table(existing)), toml::Value::Table(table)) => {
                merge_tables(existing, table)
            }
            (_, value) => {
                into.insert(key, value);
            }
        }
    }
}

fn insert_dotted(into: &mut toml::Table, dotted: &str, value: toml::Value) {
    let mut parts: Vec<&str> = dotted.split('.').collect();
    let last = parts.pop().unwrap_or_default();
    let mut table = into;
    for part in parts {
        let entry = table
            .entry(part.to_owned())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if !entry.is_table() {
            *entry = toml::Value::Table(toml::Table::new());
        }
        table = entry.as_table_mut().expect("just made a table");
    }
    table.insert(last.to_owned(), value);
}

/// The first key of `supplied` that the parsed configuration does not have.
/// Map-valued sections (like `agent.images`) accept any key.
fn first_unknown_key(supplied: &toml::Table, known: &toml::Table, prefix: &str) -> Option<String> {
    for (key, value) in supplied {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        if path == "agent.images" {
            continue;
        }
        match (value, known.get(key)) {
            (_, None) => return Some(path),
            (toml::Value::Table(inner), Some(toml::Value::Table(known_inner))) => {
                if let Some(found) = first_unknown_key(inner, known_inner, &path) {
                    return Some(found);
                }
            }
            (toml::Value::Array(items), Some(toml::Value::Array(known_items))) => {
                for (item, known_item) in items.iter().zip(known_items) {
                    if let (toml::Value::Table(a), toml::Value::Table(b)) = (item, known_item)
                        && let Some(found) = first_unknown_key(a, b, &path)
                    {
                        return Some(found);
                    }
                }
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), text).unwrap();
        file
    }

    #[test]
    fn defaults_need_no_file() {
        let config = FlotillaConfig::load(None, &[]).unwrap();
        assert_eq!(config.listen, "127.0.0.1:8080");
        assert_eq!(config.agent.max_instances, 20);
        assert!(config.database_url().starts_with("sqlite://./data/"));
    }

    #[test]
    fn file_then_flags() {
        let file = write(
            "listen = \"127.0.0.1:9000\"\n[agent]\nmax_instances = 3\nport_range = \"30000-30100\"\n[nodes]\nheartbeat_timeout_sec = 20\n",
        );
        let config = FlotillaConfig::load(
            Some(file.path()),
            &[("listen", toml::Value::String("127.0.0.1:0".into()))],
        )
        .unwrap();
        assert_eq!(config.listen, "127.0.0.1:0");
        assert_eq!(config.agent.max_instances, 3);
        assert_eq!(config.agent.port_range.first, 30000);
        assert_eq!(config.control.nodes.heartbeat_timeout_sec, 20.0);
    }

    #[test]
    fn environment_sits_between_file_and_flags() {
        // SAFETY: nextest runs every test in its own process; nothing else reads
        // the environment concurrently.
        unsafe {
            std::env::set_var("FLOTILLA_AGENT__MAX_INSTANCES", "7");
            std::env::set_var("FLOTILLA_LISTEN", "127.0.0.1:9100");
            std::env::set_var("FLOTILLA_URL", "http://client-only");
            std::env::set_var(
                "FLOTILLA_DATABASE_URL",
                "postgres://flag-twin-read-by-the-cli",
            );
        }
        let file = write("listen = \"127.0.0.1:9000\"\n[agent]\nmax_instances = 3\n");
        let config = FlotillaConfig::load(Some(file.path()), &[]).unwrap();
        assert_eq!(config.agent.max_instances, 7, "environment over file");
        assert_eq!(config.listen, "127.0.0.1:9100");
        let config = FlotillaConfig::load(
            Some(file.path()),
            &[("listen", toml::Value::String("127.0.0.1:0".into()))],
        )
        .unwrap();
        assert_eq!(config.listen, "127.0.0.1:0", "flags over environment");
        unsafe {
            std::env::set_var("FLOTILLA_AGENT__MAX_INSTANCEZ", "7");
        }
        let error = FlotillaConfig::load(None, &[]).unwrap_err().to_string();
        assert!(error.contains("agent.max_instancez"), "{error}");
    }

    /// The manifests give the agents and proxies the control planes' file
    /// (`auth_enabled = true`) without an API key: only a process serving
    /// the API needs one. (Agents and proxies refused to start before.)
    #[test]
    fn only_a_process_serving_the_api_needs_an_api_key() {
        let file = write("auth_enabled = true\n");
        let config =
            FlotillaConfig::load(Some(file.path()), &[]).expect("an agent or proxy loads it");
        let error = config.control.validate_serving().unwrap_err().to_string();
        assert!(
            error.contains("needs at least one entry in api_keys"),
            "{error}"
        );
    }

    #[test]
    fn rate_limit_section_feeds_both_services() {
        let file = write(
            "[rate_limit]\nenabled = true\nrequests_per_minute = 5\nrate_limit_per_ip = 7\n[[webhooks]]\nurl = \"http://127.0.0.1:9/hook\"\nsecret = \"s\"\nevents = [\"instance.created\"]\n",
        );
        let config = FlotillaConfig::load(Some(file.path()), &[]).unwrap();
        assert!(config.control.rate_limit.enabled);
        assert_eq!(config.control.rate_limit.requests_per_minute, 5);
        assert_eq!(config.proxy.rate_limit.rate_limit_per_ip, 7);
        assert_eq!(config.control.webhooks.len(), 1);
        let file = write("[rate_limit]\nenabeld = true\n");
        let error = FlotillaConfig::load(Some(file.path()), &[])
            .unwrap_err()
            .to_string();
        assert!(error.contains("rate_limit.enabeld"), "{error}");
        let file = write(
            "[[webhooks]]\nurl = \"http://x\"\nsecret = \"s\"\nevents = [\"instance.exploded\"]\n",
        );
        let error = format!(
            "{:#}",
            FlotillaConfig::load(Some(file.path()), &[]).unwrap_err()
        );
        assert!(
            error.contains("instance.exploded") || error.contains("webhooks"),
            "{error}"
        );
    }

    #[test]
    fn unknown_keys_are_named() {
        for (text, key) in [
            ("lissen = \"x\"\n", "lissen"),
            ("[agent]\nmax_instancez = 3\n", "agent.max_instancez"),
            ("[nodes]\nheartbeat = 3\n", "nodes.heartbeat"),
        ] {
            let file = write(text);
            let error = FlotillaConfig::load(Some(file.path()), &[])
                .unwrap_err()
                .to_string();
            assert!(error.contains(key), "{error}");
        }
    }

    #[test]
    fn bad_values_are_named() {
        let file = write("[agent]\nport_range = \"9-3\"\n");
        let error = format!(
            "{:#}",
            FlotillaConfig::load(Some(file.path()), &[]).unwrap_err()
        );
        assert!(error.contains("port range"), "{error}");
        let file = write("[agent]\nmax_instances = \"ten\"\n");
        let error = format!(
            "{:#}",
            FlotillaConfig::load(Some(file.path()), &[]).unwrap_err()
        );
        assert!(error.contains("agent.max_instances"), "{error}");
        let file = write("auth_enabled = \"maybe\"\n");
        let error = format!(
            "{:#}",
            FlotillaConfig::load(Some(file.path()), &[]).unwrap_err()
        );
        assert!(error.contains("auth_enabled"), "{error}");
        let file = write("[agent]\nmax_instances = 0\n");
        let error = format!(
            "{:#}",
            FlotillaConfig::load(Some(file.path()), &[]).unwrap_err()
        );
        assert!(error.contains("agent.max_instances"), "{error}");
        for (pools, mention) in [
            ("{ \"no-such-image\" = 1 }", "\"no-such-image\""),
            ("{ \"chromium\" = 65 }", "at most 64"),
            ("{ \"chromium\" = -1 }", "agent.warm_pools"),
        ] {
            let file = write(&format!("[agent]\nwarm_pools = {pools}\n"));
            let error = format!(
                "{:#}",
                FlotillaConfig::load(Some(file.path()), &[]).unwrap_err()
            );
            assert!(error.contains(mention), "{pools}: {error}");
        }
        let file = write("[agent]\nwarm_pools = { \"chromium-headless-shell\" = 2 }\n");
        let config = FlotillaConfig::load(Some(file.path()), &[]).unwrap();
        assert_eq!(
            config
                .agent
                .warm_pool_sizes()
                .into_iter()
                .collect::<Vec<_>>(),
            [
                ("chromium-headless-shell".to_owned(), 2),
                ("ubuntu:22.04".to_owned(), 1)
            ]
        );
    }
}
