//! The response shapes of the spec, built from store records: each operation
//! shows exactly its members ("Response shapes per operation").

use chrono::{DateTime, Utc};

use flotilla_api_types::instances::{
    Activity, Instance, InstanceDrivers, InstanceStatus, InstanceUrls,
};
use flotilla_api_types::nodes::{Node, NodeStatus};
use flotilla_api_types::profiles::ProfileUse;

use crate::store::{InstanceRecord, NodeRecord};

/// `host` as it goes into a URL (IPv6 in brackets).
fn url_host(host: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_owned()
    }
}

/// `urls` on the instance's own ports; with `token` (authentication on) each
/// carries it as `?token=`, so clients given the URL need nothing else.
pub fn instance_urls(
    record: &InstanceRecord,
    public_host: &str,
    token: Option<&str>,
) -> Option<InstanceUrls> {
    let [debug, stream, http] = record.ports?;
    let host = url_host(public_host);
    let query = token.map(|t| format!("?token={t}")).unwrap_or_default();
    Some(InstanceUrls {
        debug: format!("ws://{host}:{debug}/devtools/browser/{}{query}", record.id),
        stream: format!("http://{host}:{stream}/{query}"),
        playwright: format!("ws://{host}:{http}/playwright{query}"),
        bidi: format!("ws://{host}:{debug}/session{query}"),
    })
}

/// `urls` through the front door at `public_url` (`http(s)://host[:port]`):
/// by path (`…/v2/instances/{id}/cdp`), or by subdomain when `base_domain` is
/// set (`wss://<subdomain>.<base_domain>/devtools/browser/{id}`).
pub fn door_urls(
    record: &InstanceRecord,
    public_url: &str,
    base_domain: Option<&str>,
    token: Option<&str>,
) -> InstanceUrls {
    let (secure, authority) = match public_url.split_once("://") {
        Some((scheme, rest)) => (scheme == "https", rest.trim_end_matches('/')),
        None => (false, public_url.trim_end_matches('/')),
    };
    let (ws, http) = if secure {
        ("wss", "https")
    } else {
        ("ws", "http")
    };
    let query = token.map(|t| format!("?token={t}")).unwrap_or_default();
    let id = &record.id;
    match base_domain {
        Some(domain) => {
            // The port of public_url, if any, is the door's port for every host.
            let port = authority
                .rsplit_once(':')
                .filter(|(_, p)| p.bytes().all(|b| b.is_ascii_digit()))
                .map(|(_, p)| format!(":{p}"))
                .unwrap_or_default();
            let host = format!("{}.{domain}{port}", record.subdomain);
            InstanceUrls {
                debug: format!("{ws}://{host}/devtools/browser/{id}{query}"),
                stream: format!("{http}://{host}/stream{query}"),
                playwright: format!("{ws}://{host}/playwright{query}"),
                bidi: format!("{ws}://{host}/bidi{query}"),
            }
        }
        None => InstanceUrls {
            debug: format!("{ws}://{authority}/v2/instances/{id}/cdp{query}"),
            stream: format!("{http}://{authority}/v2/instances/{id}/stream{query}"),
            playwright: format!("{ws}://{authority}/v2/instances/{id}/playwright{query}"),
            bidi: format!("{ws}://{authority}/v2/instances/{id}/bidi{query}"),
        },
    }
}

/// When `config.max_duration_minutes` ends the instance.
pub fn expires_at(record: &InstanceRecord) -> Option<DateTime<Utc>> {
    let minutes = record.config.max_duration_minutes?;
    let millis = (minutes * 60_000.0).round() as i64;
    Some(record.created_at + chrono::Duration::milliseconds(millis))
}

fn with_common(record: &InstanceRecord) -> Instance {
    let mut view = Instance::bare(record.id.clone(), record.status);
    view.node_id = Some(record.node_id.clone());
    view.subdomain = Some(record.subdomain.clone());
    view.debug_port = record.ports.map(|p| p[0]);
    view.stream_port = record.ports.map(|p| p[1]);
    view.created_at = Some(record.created_at);
    view
}

/// create: id, status, node_id, subdomain, debug_port, stream_port, http_port, created_at, urls.
pub fn instance_created(record: &InstanceRecord, urls: Option<InstanceUrls>) -> Instance {
    let mut view = with_common(record);
    view.http_port = record.ports.map(|p| p[2]);
    view.urls = urls;
    view
}

/// What drives the instance: its node's clients while it runs (a parked or
/// ended instance has none), its WebDriver session, and `mcp_sessions`, the
/// MCP sessions holding it.
pub fn drivers(record: &InstanceRecord, mcp_sessions: u32) -> InstanceDrivers {
    let serving = matches!(
        record.status,
        InstanceStatus::Running | InstanceStatus::Idle
    );
    let clients = if serving {
        record.clients
    } else {
        Default::default()
    };
    InstanceDrivers {
        cdp: clients.cdp,
        playwright: clients.playwright,
        webdriver: u32::from(
            record.webdriver_owner.is_some() && InstanceStatus::OCCUPYING.contains(&record.status),
        ),
        mcp: mcp_sessions,
        actions: clients.actions,
    }
}

/// list items: id, status, node_id, subdomain, debug_port, stream_port,
/// created_at, resources; and its image and what drives it (`drivers`).
pub fn instance_summary(record: &InstanceRecord, drivers: InstanceDrivers) -> Instance {
    let mut view = with_common(record);
    view.image = Some(record.image.clone());
    view.resources = Some(record.resources);
    view.drivers = Some(drivers);
    view
}

/// get: the list members plus http_port, config, activity, and urls (with the
/// instance's token when authentication is on) and status_reason; and
/// while the instance holds a snapshot (dormant, or failed or stopped and
/// revivable), snapshot_id and dormant_since.
pub fn instance_detail(
    record: &InstanceRecord,
    (urls, drivers): (Option<InstanceUrls>, InstanceDrivers),
    now: DateTime<Utc>,
) -> Instance {
    let mut view = instance_summary(record, drivers);
    view.urls = urls;
    view.http_port = record.ports.map(|p| p[2]);
    let mut config = record.config.clone();
    config.proxy = config.proxy.map(|proxy| proxy.redacted());
    view.config = Some(config);
    view.expires_at = expires_at(record);
    view.profile = record.profile.as_ref().map(|profile| ProfileUse {
        name: super::profiles::own_name(record.tenant.as_deref(), &profile.name).to_owned(),
        persist: profile.persist,
    });
    let idle_ms = (now - record.last_activity).num_milliseconds().max(0);
    view.activity = Some(Activity {
        last_activity: record.last_activity,
        idle_minutes: (idle_ms as f64 / 60_000.0 * 100.0).round() / 100.0,
    });
    view.status_reason = record.status_reason.clone();
    view.snapshot_id = record.snapshot_id.clone();
    view.dormant_since = record.dormant_since;
    view
}

pub fn node_view(record: &NodeRecord, instances_count: i64, detail: bool) -> Node {
    Node {
        id: record.id.clone(),
        status: match record.status {
            NodeStatus::Online if record.draining => NodeStatus::Draining,
            status => status,
        },
        address: record.address.clone(),
        instances_count,
        max_instances: record.max_instances,
        resources: record.resources,
        last_heartbeat: record.last_heartbeat,
        capabilities: detail.then_some(record.capabilities),
        images: detail.then(|| record.images.clone()),
        warnings: (detail && !record.warnings.is_empty()).then(|| record.warnings.clone()),
        protocol_version: Some(
            flotilla_api_types::agent::protocol_version_or_before(&record.protocol_version)
                .to_owned(),
        ),
        drain: None,
    }
}
