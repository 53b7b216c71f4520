//! What a browser's pages may reach on the network, and the proxy that enforces it.
//!
//! Each browser runs in a network namespace of its own with nothing but
//! loopback ([`crate::confine::netns`]); its only way out is a SOCKS5 proxy that the
//! agent listens with inside that namespace (Chromium is started with
//! `--proxy-server=socks5://127.0.0.1:<port>` and `--proxy-bypass-list=<-loopback>`,
//! so even loopback goes through it). A client that points a browser context at
//! another proxy, or at none, reaches nothing at all.
//!
//! For every connection the proxy resolves the name itself (Chromium sends names
//! to SOCKS5 proxies), checks each address against the [`EgressPolicy`] and
//! connects only to an address the policy permits: the decision and the
//! connection use the same address, so DNS rebinding cannot slip past it.
//!
//! An instance with `config.proxy` has its connections carried by that
//! upstream proxy ([`Upstream`]: HTTP `CONNECT` or SOCKS5, with the
//! credentials answered here, so neither the browser nor a CDP client ever
//! holds them); destinations in its `bypass` list go direct. The upstream
//! proxy's own address passes the policy like any destination.
//!
//! Denied unless `[agent.egress] allow` names them: loopback, the host's own
//! addresses, link-local (169.254.0.0/16, fe80::/10: cloud metadata), private
//! ranges (10/8, 172.16/12, 192.168/16, fc00::/7), shared address space
//! (100.64/10), unspecified, multicast, broadcast and reserved addresses, and
//! IPv6 forms that embed such an IPv4 address (mapped, NAT64, 6to4).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use flotilla_net::network::canonical;
use flotilla_net::{IpNetwork, NetworkError};

/// `[agent.egress]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EgressConfig {
    /// Confine each browser to its own network namespace and the egress proxy
    /// (needs root). Off: browsers share the node's network, unfiltered.
    pub enabled: bool,
    /// Exceptions to the default denials: `"10.1.2.3"`, `"10.1.2.3:8080"`,
    /// `"192.168.0.0/16"`, `"[fd00::1]:443"`, `"fd00::/8"`.
    pub allow: Vec<String>,
}

impl Default for EgressConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            allow: Vec::new(),
        }
    }
}

impl EgressConfig {
    pub fn validate(&self) -> Result<(), InvalidAllowRule> {
        for entry in &self.allow {
            entry.parse::<AllowRule>()?;
        }
        Ok(())
    }
}

/// One `allow` entry: a network (a single address is a /32 or /128) and
/// optionally one port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllowRule {
    network: IpNetwork,
    port: Option<u16>,
}

impl AllowRule {
    fn permits(&self, addr: SocketAddr) -> bool {
        self.port.is_none_or(|port| port == addr.port()) && self.network.contains(addr.ip())
    }

    fn permits_any_port(&self, ip: IpAddr) -> bool {
        self.network.contains(ip)
    }
}

/// An `[agent.egress] allow` entry that is not an address, an address and
/// port, or a network.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "agent.egress.allow entry {entry:?} {problem}; write an address (10.1.2.3), an address and port (10.1.2.3:8080, [fd00::1]:443) or a network (192.168.0.0/16)"
)]
pub struct InvalidAllowRule {
    pub entry: String,
    pub problem: NetworkError,
}

impl FromStr for AllowRule {
    type Err = InvalidAllowRule;

    fn from_str(entry: &str) -> Result<Self, Self::Err> {
        let bad = |problem| InvalidAllowRule {
            entry: entry.to_owned(),
            problem,
        };
        if let Ok(addr) = entry.trim().parse::<SocketAddr>() {
            return Ok(Self {
                network: IpNetwork::single(addr.ip()),
                port: Some(addr.port()),
            });
        }
        Ok(Self {
            network: IpNetwork::parse(entry).map_err(bad)?,
            port: None,
        })
    }
}

impl fmt::Display for AllowRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.port, self.network.address()) {
            (Some(port), IpAddr::V6(ip)) => write!(f, "[{ip}]:{port}"),
            (Some(port), ip) => write!(f, "{ip}:{port}"),
            (None, _) => write!(f, "{}", self.network),
        }
    }
}

/// Whether `ip` is in the network of `prefix` bits of `network`.
fn in_network(ip: IpAddr, network: IpAddr, prefix: u8) -> bool {
    IpNetwork::new(network, prefix).is_some_and(|network| network.contains(ip))
}

/// The ranges denied unless an `allow` entry names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeniedRange {
    Unspecified,
    Loopback,
    /// 10/8, 172.16/12, 192.168/16, fc00::/7.
    Private,
    /// 169.254/16 and fe80::/10: where cloud metadata services answer.
    LinkLocal,
    SiteLocal,
    /// 100.64/10 (carrier-grade NAT).
    SharedAddressSpace,
    IetfProtocolAssignments,
    Benchmarking,
    Multicast,
    Reserved,
    Broadcast,
}

impl fmt::Display for DeniedRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Unspecified => "unspecified",
            Self::Loopback => "loopback",
            Self::Private => "private",
            Self::LinkLocal => "link-local",
            Self::SiteLocal => "site-local",
            Self::SharedAddressSpace => "shared address space",
            Self::IetfProtocolAssignments => "IETF protocol assignments",
            Self::Benchmarking => "benchmarking",
            Self::Multicast => "multicast",
            Self::Reserved => "reserved",
            Self::Broadcast => "broadcast",
        })
    }
}

/// Why the egress policy refuses a connection to an address (the SOCKS5
/// reply is "not allowed"; the reason is logged). An `[agent.egress]
/// allow` entry that names the address lets it through.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// In a range denied by default: loopback, private, link-local
    /// (cloud metadata), ….
    #[error("{addr} is a {range} address")]
    Range {
        addr: SocketAddr,
        range: DeniedRange,
    },
    /// One of this node's own addresses.
    #[error("{addr} is an address of this node")]
    HostAddress { addr: SocketAddr },
}

/// Why an IPv4 address is denied by default, if it is.
fn denied_v4(ip: Ipv4Addr) -> Option<DeniedRange> {
    use DeniedRange::*;
    let ranges: [(Ipv4Addr, u8, DeniedRange); 12] = [
        (Ipv4Addr::new(0, 0, 0, 0), 8, Unspecified),
        (Ipv4Addr::new(127, 0, 0, 0), 8, Loopback),
        (Ipv4Addr::new(10, 0, 0, 0), 8, Private),
        (Ipv4Addr::new(172, 16, 0, 0), 12, Private),
        (Ipv4Addr::new(192, 168, 0, 0), 16, Private),
        (Ipv4Addr::new(169, 254, 0, 0), 16, LinkLocal),
        (Ipv4Addr::new(100, 64, 0, 0), 10, SharedAddressSpace),
        (Ipv4Addr::new(192, 0, 0, 0), 24, IetfProtocolAssignments),
        (Ipv4Addr::new(198, 18, 0, 0), 15, Benchmarking),
        (Ipv4Addr::new(224, 0, 0, 0), 4, Multicast),
        (Ipv4Addr::new(240, 0, 0, 0), 4, Reserved),
        (Ipv4Addr::new(255, 255, 255, 255), 32, Broadcast),
    ];
    ranges
        .iter()
        .find(|(network, prefix, _)| in_network(IpAddr::V4(ip), IpAddr::V4(*network), *prefix))
        .map(|(_, _, why)| *why)
}

/// Why an address is denied by default, if it is.
pub fn denied_by_default(ip: IpAddr) -> Option<DeniedRange> {
    match canonical(ip) {
        IpAddr::V4(v4) => denied_v4(v4),
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let v6_net = |network: Ipv6Addr, prefix: u8| {
                in_network(IpAddr::V6(v6), IpAddr::V6(network), prefix)
            };
            if v6.is_unspecified() {
                Some(DeniedRange::Unspecified)
            } else if v6.is_loopback() {
                Some(DeniedRange::Loopback)
            } else if v6_net(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10) {
                Some(DeniedRange::LinkLocal)
            } else if v6_net(Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0), 10) {
                Some(DeniedRange::SiteLocal)
            } else if v6_net(Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0), 7) {
                Some(DeniedRange::Private)
            } else if v6_net(Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8) {
                Some(DeniedRange::Multicast)
            } else if v6_net(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0), 96)
                || v6_net(Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 0), 96)
            {
                // NAT64 and IPv4-compatible forms reach the IPv4 address they embed.
                denied_v4(Ipv4Addr::from((bits & 0xffff_ffff) as u32))
            } else if v6_net(Ipv6Addr::new(0x2002, 0, 0, 0, 0, 0, 0, 0), 16) {
                // 6to4 embeds an IPv4 address in bits 16..48.
                denied_v4(Ipv4Addr::from(((bits >> 80) & 0xffff_ffff) as u32))
            } else {
                None
            }
        }
    }
}

/// The addresses of the node's own interfaces, re-read at most every few seconds.
#[derive(Default)]
struct HostAddresses {
    /// When read, and what. A std mutex: read and replaced without awaiting.
    cached: Mutex<Option<(Instant, Arc<Vec<IpAddr>>)>>,
}

impl HostAddresses {
    const REFRESH: Duration = Duration::from_secs(5);

    fn current(&self) -> Arc<Vec<IpAddr>> {
        let mut cached = self.cached.lock().expect("host addresses lock");
        if let Some((read, addresses)) = cached.as_ref()
            && read.elapsed() < Self::REFRESH
        {
            return addresses.clone();
        }
        let addresses = Arc::new(interface_addresses());
        *cached = Some((Instant::now(), addresses.clone()));
        addresses
    }
}

/// Every address of every interface of the host (getifaddrs).
pub fn interface_addresses() -> Vec<IpAddr> {
    let mut addresses = Vec::new();
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a linked list we free below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return addresses;
    }
    let mut cursor = list;
    while !cursor.is_null() {
        // SAFETY: `cursor` points into the list getifaddrs returned.
        let entry = unsafe { &*cursor };
        if !entry.ifa_addr.is_null() {
            // SAFETY: the family says which sockaddr type ifa_addr points to.
            let family = i32::from(unsafe { (*entry.ifa_addr).sa_family });
            if family == libc::AF_INET {
                // SAFETY: AF_INET means a sockaddr_in.
                let sin = unsafe { &*(entry.ifa_addr as *const libc::sockaddr_in) };
                addresses.push(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                    sin.sin_addr.s_addr,
                ))));
            } else if family == libc::AF_INET6 {
                // SAFETY: AF_INET6 means a sockaddr_in6.
                let sin6 = unsafe { &*(entry.ifa_addr as *const libc::sockaddr_in6) };
                addresses.push(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
            }
        }
        cursor = entry.ifa_next;
    }
    // SAFETY: frees the list getifaddrs allocated, once.
    unsafe { libc::freeifaddrs(list) };
    addresses
}

/// The node's egress rules: default denials, the host's own addresses, and
/// the operator's exceptions.
pub struct EgressPolicy {
    allow: Vec<AllowRule>,
    host: HostAddresses,
    /// Connections refused since start (for tests and logs).
    refused: AtomicU64,
}

impl EgressPolicy {
    /// From a validated `[agent.egress]` (an entry that does not parse is skipped).
    pub fn new(config: &EgressConfig) -> Self {
        Self {
            allow: config
                .allow
                .iter()
                .filter_map(|entry| entry.parse().ok())
                .collect(),
            host: HostAddresses::default(),
            refused: AtomicU64::new(0),
        }
    }

    /// `Ok` when a page may connect to `addr`; else why not.
    pub fn check(&self, addr: SocketAddr) -> Result<(), Denied> {
        self.check_with_host(addr, &self.host.current())
    }

    fn check_with_host(&self, addr: SocketAddr, host: &[IpAddr]) -> Result<(), Denied> {
        if self.allow.iter().any(|rule| rule.permits(addr)) {
            return Ok(());
        }
        let ip = canonical(addr.ip());
        if let Some(range) = denied_by_default(ip) {
            return Err(Denied::Range { addr, range });
        }
        if host.iter().any(|own| canonical(*own) == ip) {
            return Err(Denied::HostAddress { addr });
        }
        Ok(())
    }

    /// Connections refused since the agent started.
    pub fn refused_total(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// An instance's upstream proxy, as the egress proxy uses it.
#[derive(Clone)]
pub struct Upstream {
    socks5: bool,
    host: String,
    port: u16,
    credentials: Option<(String, String)>,
    bypass: Vec<String>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("socks5", &self.socks5)
            .field("host", &self.host)
            .field("port", &self.port)
            .field(
                "credentials",
                &self.credentials.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

impl Upstream {
    pub fn from_config(
        proxy: &flotilla_api_types::instances::UpstreamProxy,
    ) -> Result<Self, flotilla_api_types::instances::ProxyError> {
        let endpoint = proxy.validate()?;
        Ok(Self {
            socks5: endpoint.scheme == "socks5",
            host: endpoint.host,
            port: endpoint.port,
            credentials: proxy.username.clone().map(|user| {
                (
                    user,
                    proxy
                        .password
                        .as_ref()
                        .map(|p| p.expose().to_owned())
                        .unwrap_or_default(),
                )
            }),
            bypass: proxy.bypass.clone(),
        })
    }

    /// Whether `destination` goes direct (its `bypass` list).
    fn bypasses(&self, destination: &Destination) -> bool {
        let (host, ip) = match destination {
            Destination::Address(addr) => (addr.ip().to_string(), Some(canonical(addr.ip()))),
            Destination::Name(name, _) => (name.to_ascii_lowercase(), None),
        };
        self.bypass.iter().any(|entry| {
            let entry = entry.to_ascii_lowercase();
            if let Some(suffix) = entry.strip_prefix("*.") {
                return host.ends_with(&format!(".{suffix}"));
            }
            if let (Some(ip), Ok(rule)) = (ip, entry.parse::<AllowRule>()) {
                return rule.permits(SocketAddr::new(ip, 0)) || rule.permits_any_port(ip);
            }
            host == entry.trim_matches(['[', ']'])
        })
    }
}

/// What a browser's egress proxy does with a connection: the node's policy
/// (`None`: egress not enforced) and the instance's upstream proxy, which a
/// warm browser learns when an instance takes it.
pub struct Route {
    pub policy: Option<Arc<EgressPolicy>>,
    /// A std mutex: read once per connection, set when an instance takes the browser.
    upstream: Mutex<Option<Arc<Upstream>>>,
    /// Destinations the policy refused, for the instance's events.
    refusals: Mutex<Refusals>,
}

/// A destination the egress policy refused this browser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// What the page asked for: `host:port` (a name or an address).
    pub destination: String,
    /// Why, naming the address (`127.0.0.1:8080 is a loopback address`).
    pub reason: String,
}

/// The refusals of one browser not announced yet, each destination once:
/// a page that retries (or a hostile one that scans) makes a few events,
/// never a flood.
#[derive(Default)]
struct Refusals {
    pending: Vec<Refusal>,
    announced: std::collections::HashSet<String>,
}

/// Distinct refused destinations one browser announces, at most.
const REFUSALS_ANNOUNCED: usize = 32;

impl Refusals {
    fn note(&mut self, refusal: Refusal) {
        if self.announced.len() < REFUSALS_ANNOUNCED
            && self.announced.insert(refusal.destination.clone())
        {
            self.pending.push(refusal);
        }
    }
}

impl Route {
    pub fn new(policy: Option<Arc<EgressPolicy>>, upstream: Option<Upstream>) -> Self {
        Self {
            policy,
            upstream: Mutex::new(upstream.map(Arc::new)),
            refusals: Mutex::default(),
        }
    }

    /// The refusals since the last call (each destination once per browser).
    pub fn take_refusals(&self) -> Vec<Refusal> {
        std::mem::take(&mut self.refusals.lock().expect("refusals lock").pending)
    }

    fn note_refusal(&self, destination: &Destination, why: &Unconnected) {
        let (destination, reason) = match (destination, why) {
            (Destination::Address(addr), why) => (addr.to_string(), why.to_string()),
            // What a name resolves to inside the node's network is not the
            // page's to learn: only the kinds of address it was denied.
            (Destination::Name(name, port), Unconnected::Denied(denials)) => (
                format!("{name}:{port}"),
                format!(
                    "{name} resolves only to denied addresses ({})",
                    kinds(denials)
                ),
            ),
            (Destination::Name(name, port), why) => (format!("{name}:{port}"), why.to_string()),
        };
        self.refusals.lock().expect("refusals lock").note(Refusal {
            destination,
            reason,
        });
    }

    pub fn set_upstream(&self, upstream: Option<Upstream>) {
        *self.upstream.lock().expect("route lock") = upstream.map(Arc::new);
    }

    fn upstream(&self) -> Option<Arc<Upstream>> {
        self.upstream.lock().expect("route lock").clone()
    }

    fn check(&self, addr: SocketAddr) -> Result<(), Denied> {
        match &self.policy {
            Some(policy) => policy.check(addr),
            None => Ok(()),
        }
    }

    fn count_refusal(&self) {
        if let Some(policy) = &self.policy {
            policy.refused.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// How long a name lookup or a connection attempt of the proxy may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// Connections one browser may hold through the proxy at once (Chromium
/// itself keeps at most 256 sockets per profile); more are refused, so that
/// a browser cannot exhaust the agent's file descriptors.
const MAX_CONNECTIONS_PER_BROWSER: usize = 512;

/// Serves SOCKS5 (CONNECT only, no authentication) on `listener` until `stop`.
pub async fn serve_socks(
    listener: TcpListener,
    route: Arc<Route>,
    instance: String,
    stop: CancellationToken,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS_PER_BROWSER));
    loop {
        let mut client = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => client,
                Err(error) => {
                    tracing::debug!(%error, "egress proxy accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => return,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%instance, "egress connection refused: {MAX_CONNECTIONS_PER_BROWSER} open");
            let _ = client.shutdown().await;
            continue;
        };
        let route = route.clone();
        let instance = instance.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let _ = client.set_nodelay(true);
            tokio::select! {
                outcome = relay(client, &route) => {
                    if let Err(error) = outcome {
                        tracing::debug!(%instance, %error, "egress connection ended");
                    }
                }
                _ = stop.cancelled() => {}
            }
        });
    }
}

/// SOCKS5 reply codes (RFC 1928 §6).
mod reply {
    pub const SUCCEEDED: u8 = 0;
    pub const GENERAL_FAILURE: u8 = 1;
    pub const NOT_ALLOWED: u8 = 2;
    pub const HOST_UNREACHABLE: u8 = 4;
    pub const REFUSED: u8 = 5;
    pub const COMMAND_NOT_SUPPORTED: u8 = 7;
    pub const ADDRESS_TYPE_NOT_SUPPORTED: u8 = 8;
}

/// Where a client asked to go.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Destination {
    Address(SocketAddr),
    Name(String, u16),
}

/// One SOCKS5 connection: greeting, request, route (upstream proxy or
/// direct, under the policy), connection, relay.
async fn relay(mut client: TcpStream, route: &Route) -> std::io::Result<()> {
    let destination = match tokio::time::timeout(CONNECT_TIMEOUT, handshake(&mut client)).await {
        Ok(Ok(Ok(destination))) => destination,
        Ok(Ok(Err(code))) => return send_reply(&mut client, code).await,
        Ok(Err(error)) => return Err(error),
        Err(_) => return Ok(()),
    };
    let connected = match route.upstream().filter(|u| !u.bypasses(&destination)) {
        Some(upstream) => through_upstream(&upstream, &destination, route).await,
        None => connect_permitted(&destination, route).await,
    };
    let mut upstream = match connected {
        Ok(upstream) => upstream,
        Err(why) => {
            let code = why.reply();
            if code == reply::NOT_ALLOWED {
                route.count_refusal();
                route.note_refusal(&destination, &why);
                tracing::debug!(destination = ?destination, %why, "egress refused");
            }
            return send_reply(&mut client, code).await;
        }
    };
    send_reply(&mut client, reply::SUCCEEDED).await?;
    let _ = upstream.set_nodelay(true);
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

/// Reads the greeting and the request. The inner `Err` is a reply code to send.
async fn handshake(client: &mut TcpStream) -> std::io::Result<Result<Destination, u8>> {
    let mut head = [0u8; 2];
    client.read_exact(&mut head).await?;
    if head[0] != 5 {
        return Err(std::io::Error::other("not SOCKS5"));
    }
    let mut methods = vec![0u8; usize::from(head[1])];
    client.read_exact(&mut methods).await?;
    if !methods.contains(&0) {
        client.write_all(&[5, 0xff]).await?;
        return Err(std::io::Error::other("no acceptable SOCKS5 method"));
    }
    client.write_all(&[5, 0]).await?;
    let mut request = [0u8; 4];
    client.read_exact(&mut request).await?;
    if request[0] != 5 {
        return Err(std::io::Error::other("bad SOCKS5 request"));
    }
    let destination = match request[3] {
        1 => {
            let mut raw = [0u8; 6];
            client.read_exact(&mut raw).await?;
            let ip = Ipv4Addr::new(raw[0], raw[1], raw[2], raw[3]);
            Destination::Address(SocketAddr::new(
                IpAddr::V4(ip),
                u16::from_be_bytes([raw[4], raw[5]]),
            ))
        }
        3 => {
            let mut length = [0u8; 1];
            client.read_exact(&mut length).await?;
            let mut name = vec![0u8; usize::from(length[0])];
            client.read_exact(&mut name).await?;
            let mut port = [0u8; 2];
            client.read_exact(&mut port).await?;
            let Ok(name) = String::from_utf8(name) else {
                return Ok(Err(reply::HOST_UNREACHABLE));
            };
            let port = u16::from_be_bytes(port);
            // A name that is an address literal is that address.
            match name.trim_matches(['[', ']']).parse::<IpAddr>() {
                Ok(ip) => Destination::Address(SocketAddr::new(ip, port)),
                Err(_) => Destination::Name(name, port),
            }
        }
        4 => {
            let mut raw = [0u8; 18];
            client.read_exact(&mut raw).await?;
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&raw[..16]);
            Destination::Address(SocketAddr::new(
                IpAddr::V6(Ipv6Addr::from(octets)),
                u16::from_be_bytes([raw[16], raw[17]]),
            ))
        }
        _ => return Ok(Err(reply::ADDRESS_TYPE_NOT_SUPPORTED)),
    };
    if request[1] != 1 {
        return Ok(Err(reply::COMMAND_NOT_SUPPORTED));
    }
    Ok(Ok(destination))
}

/// Why the egress proxy made no connection; each cause has its SOCKS5 reply.
#[derive(Debug, thiserror::Error)]
enum Unconnected {
    #[error("{name}: {source}")]
    Lookup {
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{name}: lookup timed out")]
    LookupTimeout { name: String },
    /// Every address of the destination is denied by the policy.
    #[error("{}", join(.0))]
    Denied(Vec<Denied>),
    /// The destination refused the connection.
    #[error("{0}")]
    Refused(#[source] std::io::Error),
    /// The last permitted address could not be reached (or timed out).
    #[error("{0}")]
    Unreachable(#[source] std::io::Error),
    /// The name resolved to no address.
    #[error("no address")]
    NoAddress,
    /// The upstream proxy gave no tunnel.
    #[error(transparent)]
    Tunnel(#[from] TunnelError),
}

impl Unconnected {
    /// The SOCKS5 reply that answers it.
    fn reply(&self) -> u8 {
        match self {
            Self::Lookup { .. } | Self::LookupTimeout { .. } | Self::Unreachable(_) => {
                reply::HOST_UNREACHABLE
            }
            Self::Denied(_) => reply::NOT_ALLOWED,
            Self::Refused(_) => reply::REFUSED,
            Self::NoAddress | Self::Tunnel(_) => reply::GENERAL_FAILURE,
        }
    }
}

/// The kinds of the denied addresses, without the addresses
/// (`private, this node's own`).
fn kinds(denials: &[Denied]) -> String {
    let mut kinds: Vec<String> = Vec::new();
    for denial in denials {
        let kind = match denial {
            Denied::Range { range, .. } => range.to_string(),
            Denied::HostAddress { .. } => "this node's own".to_owned(),
        };
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    kinds.join(", ")
}

fn join(denials: &[Denied]) -> String {
    denials
        .iter()
        .map(Denied::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Why an upstream proxy gave no tunnel.
#[derive(Debug, thiserror::Error)]
enum TunnelError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("the upstream proxy did not answer in time")]
    Timeout,
    #[error("the upstream proxy's answer is too long")]
    AnswerTooLong,
    #[error("the upstream proxy closed the connection")]
    Closed,
    #[error("the upstream proxy answered {status} to CONNECT")]
    ConnectStatus { status: String },
    #[error("the upstream SOCKS5 proxy refused the authentication method")]
    Socks5Method,
    #[error("the upstream SOCKS5 proxy refused the credentials")]
    Socks5Credentials,
    #[error("the upstream SOCKS5 proxy answered {0}")]
    Socks5Reply(u8),
    #[error("the upstream SOCKS5 proxy sent a bad address")]
    Socks5Address,
}

/// Resolves `destination` and connects to the first address the policy
/// permits. A name whose addresses are all denied is refused as not allowed.
async fn connect_permitted(
    destination: &Destination,
    route: &Route,
) -> Result<TcpStream, Unconnected> {
    let candidates: Vec<SocketAddr> = match destination {
        Destination::Address(addr) => vec![*addr],
        Destination::Name(name, port) => {
            match tokio::time::timeout(
                CONNECT_TIMEOUT,
                tokio::net::lookup_host((name.as_str(), *port)),
            )
            .await
            {
                Ok(Ok(found)) => found.collect(),
                Ok(Err(source)) => {
                    return Err(Unconnected::Lookup {
                        name: name.clone(),
                        source,
                    });
                }
                Err(_) => return Err(Unconnected::LookupTimeout { name: name.clone() }),
            }
        }
    };
    let mut refusals = Vec::new();
    let mut last_error = None;
    for addr in candidates {
        if let Err(why) = route.check(addr) {
            refusals.push(why);
            continue;
        }
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(error)) => last_error = Some(error),
            Err(_) => {
                last_error = Some(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "connection timed out",
                ))
            }
        }
    }
    match last_error {
        Some(error) if error.kind() == std::io::ErrorKind::ConnectionRefused => {
            Err(Unconnected::Refused(error))
        }
        Some(error) => Err(Unconnected::Unreachable(error)),
        None if !refusals.is_empty() => Err(Unconnected::Denied(refusals)),
        None => Err(Unconnected::NoAddress),
    }
}

/// Connects to the upstream proxy (its address under the policy) and asks it
/// for a tunnel to `destination`, answering its credentials here.
async fn through_upstream(
    upstream: &Upstream,
    destination: &Destination,
    route: &Route,
) -> Result<TcpStream, Unconnected> {
    let proxy = Destination::Name(upstream.host.clone(), upstream.port);
    let proxy = match upstream.host.parse::<IpAddr>() {
        Ok(ip) => Destination::Address(SocketAddr::new(ip, upstream.port)),
        Err(_) => proxy,
    };
    let mut stream = connect_permitted(&proxy, route).await?;
    let target = match destination {
        Destination::Address(addr) => (addr.ip().to_string(), addr.port()),
        Destination::Name(name, port) => (name.clone(), *port),
    };
    let opened = tokio::time::timeout(CONNECT_TIMEOUT, async {
        if upstream.socks5 {
            socks5_tunnel(&mut stream, &target, upstream.credentials.as_ref()).await
        } else {
            http_tunnel(&mut stream, &target, upstream.credentials.as_ref()).await
        }
    })
    .await
    .unwrap_or(Err(TunnelError::Timeout));
    opened?;
    Ok(stream)
}

/// `CONNECT host:port` to an HTTP proxy, with Basic credentials.
async fn http_tunnel(
    stream: &mut TcpStream,
    (host, port): &(String, u16),
    credentials: Option<&(String, String)>,
) -> Result<(), TunnelError> {
    use base64::Engine as _;
    let authority = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let mut request = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n");
    if let Some((user, password)) = credentials {
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        request.push_str(&format!("Proxy-Authorization: Basic {basic}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await?;
    // The answer's head, read a byte at a time so that nothing of the tunnel
    // after it is consumed.
    let mut head = Vec::with_capacity(256);
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 16 * 1024 {
            return Err(TunnelError::AnswerTooLong);
        }
        let mut byte = [0u8; 1];
        match stream.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => return Err(TunnelError::Closed),
        }
    }
    let status_line = String::from_utf8_lossy(&head);
    let status = status_line.split_whitespace().nth(1).unwrap_or("");
    if status.starts_with('2') {
        Ok(())
    } else {
        Err(TunnelError::ConnectStatus {
            status: status.to_owned(),
        })
    }
}

/// A SOCKS5 CONNECT to an upstream SOCKS5 proxy (RFC 1928), with
/// username/password authentication (RFC 1929) when configured.
async fn socks5_tunnel(
    stream: &mut TcpStream,
    (host, port): &(String, u16),
    credentials: Option<&(String, String)>,
) -> Result<(), TunnelError> {
    let method = if credentials.is_some() { 2 } else { 0 };
    stream.write_all(&[5, 1, method]).await?;
    let mut choice = [0u8; 2];
    stream.read_exact(&mut choice).await?;
    if choice != [5, method] {
        return Err(TunnelError::Socks5Method);
    }
    if let Some((user, password)) = credentials {
        let mut auth = vec![1, user.len() as u8];
        auth.extend_from_slice(user.as_bytes());
        auth.push(password.len() as u8);
        auth.extend_from_slice(password.as_bytes());
        stream.write_all(&auth).await?;
        let mut status = [0u8; 2];
        stream.read_exact(&mut status).await?;
        if status[1] != 0 {
            return Err(TunnelError::Socks5Credentials);
        }
    }
    let mut request = vec![5, 1, 0];
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => {
            request.push(1);
            request.extend_from_slice(&ip.octets());
        }
        Ok(IpAddr::V6(ip)) => {
            request.push(4);
            request.extend_from_slice(&ip.octets());
        }
        Err(_) => {
            request.push(3);
            request.push(host.len().min(255) as u8);
            request.extend_from_slice(&host.as_bytes()[..host.len().min(255)]);
        }
    }
    request.extend_from_slice(&port.to_be_bytes());
    stream.write_all(&request).await?;
    let mut head = [0u8; 4];
    stream.read_exact(&mut head).await?;
    if head[1] != 0 {
        return Err(TunnelError::Socks5Reply(head[1]));
    }
    let rest = match head[3] {
        1 => 4 + 2,
        4 => 16 + 2,
        3 => {
            let mut len = [0u8; 1];
            stream.read_exact(&mut len).await?;
            usize::from(len[0]) + 2
        }
        _ => return Err(TunnelError::Socks5Address),
    };
    let mut bound = vec![0u8; rest];
    stream.read_exact(&mut bound).await?;
    Ok(())
}

async fn send_reply(client: &mut TcpStream, code: u8) -> std::io::Result<()> {
    client.write_all(&[5, code, 0, 1, 0, 0, 0, 0, 0, 0]).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str]) -> EgressPolicy {
        EgressPolicy::new(&EgressConfig {
            enabled: true,
            allow: allow.iter().map(|s| s.to_string()).collect(),
        })
    }

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn the_node_and_private_networks_are_denied_by_default() {
        let policy = policy(&[]);
        let host = [IpAddr::from([203, 0, 113, 7])];
        for denied in [
            "127.0.0.1:8080",
            "127.1.2.3:80",
            "0.0.0.0:80",
            "10.0.0.1:80",
            "172.16.0.1:80",
            "172.31.255.255:80",
            "192.168.1.1:80",
            "169.254.169.254:80",
            "100.100.100.200:80",
            "224.0.0.1:80",
            "255.255.255.255:80",
            "[::1]:80",
            "[::]:80",
            "[fe80::1]:80",
            "[fd00::1]:80",
            "[ff02::1]:80",
            "[::ffff:127.0.0.1]:80",
            "[::ffff:169.254.169.254]:80",
            "[64:ff9b::a9fe:a9fe]:80",
            "[2002:7f00:1::]:80",
            "[::7f00:1]:80",
            // The node's own public address.
            "203.0.113.7:443",
        ] {
            assert!(
                policy.check_with_host(addr(denied), &host).is_err(),
                "{denied} must be denied"
            );
        }
        for allowed in [
            "93.184.216.34:443",
            "172.32.0.1:80",
            "[2606:4700::1111]:443",
            "[2002:5db8:d822::]:80",
            "203.0.113.8:443",
        ] {
            assert!(
                policy.check_with_host(addr(allowed), &host).is_ok(),
                "{allowed} must be allowed"
            );
        }
    }

    #[test]
    fn allow_entries_open_exactly_what_they_name() {
        let policy = policy(&[
            "127.0.0.1:8080",
            "192.168.0.0/16",
            "10.1.2.3",
            "[fd00::5]:443",
        ]);
        let host = [];
        assert!(
            policy
                .check_with_host(addr("127.0.0.1:8080"), &host)
                .is_ok()
        );
        assert!(
            policy
                .check_with_host(addr("[::ffff:127.0.0.1]:8080"), &host)
                .is_ok()
        );
        assert!(
            policy
                .check_with_host(addr("127.0.0.1:8081"), &host)
                .is_err()
        );
        assert!(
            policy
                .check_with_host(addr("192.168.44.5:22"), &host)
                .is_ok()
        );
        assert!(
            policy
                .check_with_host(addr("192.169.0.1:22"), &host)
                .is_ok()
        );
        assert!(policy.check_with_host(addr("10.1.2.3:5432"), &host).is_ok());
        assert!(
            policy
                .check_with_host(addr("10.1.2.4:5432"), &host)
                .is_err()
        );
        assert!(policy.check_with_host(addr("[fd00::5]:443"), &host).is_ok());
        assert!(policy.check_with_host(addr("[fd00::5]:80"), &host).is_err());
    }

    #[test]
    fn allow_entries_are_validated() {
        for good in [
            "10.0.0.1",
            "10.0.0.1:80",
            "10.0.0.0/8",
            "[::1]:80",
            "fd00::/8",
            "0.0.0.0/0",
        ] {
            assert!(good.parse::<AllowRule>().is_ok(), "{good}");
        }
        for bad in [
            "",
            "example.com",
            "10.0.0.0/33",
            "10.0.0.1:99999",
            "fd00::/129",
            "10.0.0.0/x",
        ] {
            let error = bad.parse::<AllowRule>().unwrap_err().to_string();
            assert!(error.contains("agent.egress.allow"), "{error}");
        }
    }

    #[test]
    fn the_host_has_addresses() {
        assert!(
            interface_addresses().iter().any(|ip| ip.is_loopback()),
            "getifaddrs lists loopback"
        );
    }

    /// A SOCKS5 CONNECT through the proxy; the reply code.
    async fn socks_connect(proxy: SocketAddr, request: &[u8]) -> (u8, TcpStream) {
        let mut stream = TcpStream::connect(proxy).await.unwrap();
        stream.write_all(&[5, 1, 0]).await.unwrap();
        let mut answer = [0u8; 2];
        stream.read_exact(&mut answer).await.unwrap();
        assert_eq!(answer, [5, 0]);
        stream.write_all(request).await.unwrap();
        let mut reply = [0u8; 10];
        stream.read_exact(&mut reply).await.unwrap();
        (reply[1], stream)
    }

    #[tokio::test]
    async fn the_proxy_relays_permitted_connections_and_refuses_the_rest() {
        let target = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target_addr = target.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = target.accept().await {
                let _ = stream.write_all(b"hello").await;
            }
        });
        let policy = Arc::new(policy(&[&target_addr.to_string()]));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let route = Arc::new(Route::new(Some(policy.clone()), None));
        tokio::spawn(serve_socks(listener, route, "test".into(), stop.clone()));

        let port = target_addr.port().to_be_bytes();
        let (code, mut stream) =
            socks_connect(proxy, &[5, 1, 0, 1, 127, 0, 0, 1, port[0], port[1]]).await;
        assert_eq!(code, reply::SUCCEEDED);
        let mut greeting = [0u8; 5];
        stream.read_exact(&mut greeting).await.unwrap();
        assert_eq!(&greeting, b"hello");

        // By name: localhost resolves to loopback, allowed only on that port.
        let mut by_name = vec![5, 1, 0, 3, 9];
        by_name.extend_from_slice(b"localhost");
        by_name.extend_from_slice(&port);
        assert_eq!(socks_connect(proxy, &by_name).await.0, reply::SUCCEEDED);

        let other = (target_addr.port() ^ 1).to_be_bytes();
        let (code, _) = socks_connect(proxy, &[5, 1, 0, 1, 127, 0, 0, 1, other[0], other[1]]).await;
        assert_eq!(code, reply::NOT_ALLOWED);
        let (code, _) = socks_connect(proxy, &[5, 1, 0, 1, 169, 254, 169, 254, 0, 80]).await;
        assert_eq!(code, reply::NOT_ALLOWED);
        // BIND and UDP ASSOCIATE are not offered.
        let (code, _) = socks_connect(proxy, &[5, 2, 0, 1, 1, 1, 1, 1, 0, 80]).await;
        assert_eq!(code, reply::COMMAND_NOT_SUPPORTED);
        assert!(policy.refused_total() >= 2);
        stop.cancel();
    }

    /// An HTTP proxy that wants Basic `user:secret` and records the heads it got.
    async fn fake_http_proxy() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let seen = heads.clone();
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    while !head.ends_with(b"\r\n\r\n") {
                        let mut byte = [0u8; 1];
                        if client.read_exact(&mut byte).await.is_err() {
                            return;
                        }
                        head.push(byte[0]);
                    }
                    let head = String::from_utf8_lossy(&head).into_owned();
                    seen.lock().unwrap().push(head.clone());
                    // base64("user:secret")
                    if !head.contains("Proxy-Authorization: Basic dXNlcjpzZWNyZXQ=") {
                        let _ = client
                            .write_all(b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n")
                            .await;
                        return;
                    }
                    let target = head.split_whitespace().nth(1).unwrap().to_owned();
                    let mut upstream = TcpStream::connect(target).await.unwrap();
                    client
                        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                        .await
                        .unwrap();
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                });
            }
        });
        (addr, heads)
    }

    fn upstream_config(proxy: SocketAddr, password: &str, bypass: &[&str]) -> Upstream {
        Upstream::from_config(&flotilla_api_types::instances::UpstreamProxy {
            server: format!("http://{proxy}"),
            username: Some("user".into()),
            password: Some(flotilla_api_types::credentials::Secret::new(
                password.into(),
            )),
            bypass: bypass.iter().map(|b| b.to_string()).collect(),
        })
        .unwrap()
    }

    #[tokio::test]
    async fn an_upstream_proxy_carries_connections_with_credentials_answered_here() {
        let target = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target_addr = target.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = target.accept().await {
                let _ = stream.write_all(b"hello").await;
            }
        });
        let (proxy_addr, heads) = fake_http_proxy().await;
        // The policy opens the upstream proxy, not the target: only the proxy
        // can reach it.
        let policy = Arc::new(policy(&[&proxy_addr.to_string()]));
        let route = Arc::new(Route::new(
            Some(policy),
            Some(upstream_config(proxy_addr, "secret", &[])),
        ));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let socks = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        tokio::spawn(serve_socks(
            listener,
            route.clone(),
            "test".into(),
            stop.clone(),
        ));
        let port = target_addr.port().to_be_bytes();
        let request = [5, 1, 0, 1, 127, 0, 0, 1, port[0], port[1]];
        let (code, mut stream) = socks_connect(socks, &request).await;
        assert_eq!(code, reply::SUCCEEDED);
        let mut greeting = [0u8; 5];
        stream.read_exact(&mut greeting).await.unwrap();
        assert_eq!(&greeting, b"hello");
        assert!(heads.lock().unwrap()[0].starts_with(&format!("CONNECT {target_addr} HTTP/1.1")));

        // Wrong credentials: refused by the upstream.
        route.set_upstream(Some(upstream_config(proxy_addr, "wrong", &[])));
        assert_eq!(
            socks_connect(socks, &request).await.0,
            reply::GENERAL_FAILURE
        );
        // Bypassed: direct, where the policy refuses the target.
        route.set_upstream(Some(upstream_config(
            proxy_addr,
            "secret",
            &["127.0.0.0/8"],
        )));
        assert_eq!(socks_connect(socks, &request).await.0, reply::NOT_ALLOWED);
        assert_eq!(
            heads.lock().unwrap().len(),
            2,
            "the bypassed connection skipped the proxy"
        );
        // The credentials never show in Debug output.
        assert!(!format!("{:?}", upstream_config(proxy_addr, "secret", &[])).contains("secret"));
        stop.cancel();
    }

    /// Each refused destination is announced once per browser, and a page
    /// that scans makes at most REFUSALS_ANNOUNCED announcements.
    #[test]
    fn refusals_are_announced_once_per_destination_and_bounded() {
        let route = Route::new(None, None);
        let why = Unconnected::NoAddress;
        let loopback = Destination::Address("127.0.0.1:8000".parse().unwrap());
        route.note_refusal(&loopback, &why);
        route.note_refusal(&loopback, &why);
        route.note_refusal(&Destination::Name("metadata.internal".into(), 80), &why);
        let first = route.take_refusals();
        assert_eq!(
            first
                .iter()
                .map(|r| r.destination.as_str())
                .collect::<Vec<_>>(),
            ["127.0.0.1:8000", "metadata.internal:80"]
        );
        route.note_refusal(&loopback, &why);
        assert!(route.take_refusals().is_empty(), "announced once");
        // A name's refusal says what kinds of address it resolved to, never
        // which (the node's internal names are not the page's to map).
        let internal = Destination::Name("db.internal".into(), 5432);
        let denied = Unconnected::Denied(vec![
            Denied::Range {
                addr: "10.96.0.12:5432".parse().unwrap(),
                range: DeniedRange::Private,
            },
            Denied::HostAddress {
                addr: "192.168.1.5:5432".parse().unwrap(),
            },
        ]);
        route.note_refusal(&internal, &denied);
        let named = route.take_refusals();
        assert_eq!(
            named[0].reason,
            "db.internal resolves only to denied addresses (private, this node's own)"
        );
        assert!(!named[0].reason.contains("10.96"));
        for port in 1..=200 {
            route.note_refusal(
                &Destination::Address(SocketAddr::from(([10, 0, 0, 1], port))),
                &why,
            );
        }
        assert_eq!(route.take_refusals().len(), REFUSALS_ANNOUNCED - 3);
    }
}
