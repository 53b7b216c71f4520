//! IP networks as the services' settings write them: one address
//! (`10.1.2.3`, `fd00::1`) or a network (`192.168.0.0/16`, `fd00::/8`).
//! Parsed here once for every list of addresses Flotilla takes (trusted
//! proxies of the control plane and the event proxy, the egress policy).
//! An IPv4-mapped IPv6 address is the IPv4 address it maps, on both sides.

use std::fmt;
use std::net::IpAddr;

/// A network: an address and how many of its leading bits count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNetwork {
    network: IpAddr,
    prefix: u8,
}

/// Why text is not an [`IpNetwork`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NetworkError {
    /// Neither an address nor `<address>/<prefix>`.
    #[error("is not valid")]
    NotValid,
    #[error("has no valid address")]
    NoValidAddress,
    #[error("has no valid prefix length")]
    NoValidPrefix,
    #[error("has a prefix length longer than the address")]
    PrefixTooLong,
}

impl IpNetwork {
    /// The network of `prefix` leading bits of `network` (`None` when the
    /// prefix is longer than the address).
    pub fn new(network: IpAddr, prefix: u8) -> Option<Self> {
        if prefix > full_prefix(network) {
            return None;
        }
        // `::ffff:10.0.0.0/104` is 10.0.0.0/8; a shorter prefix of a mapped
        // address reaches past the IPv4 range and stays IPv6.
        let (network, prefix) = match (network, canonical(network)) {
            (IpAddr::V6(_), IpAddr::V4(v4)) if prefix >= 96 => (IpAddr::V4(v4), prefix - 96),
            _ => (network, prefix),
        };
        Some(Self { network, prefix })
    }

    /// The network of exactly `ip`.
    pub fn single(ip: IpAddr) -> Self {
        let network = canonical(ip);
        Self {
            network,
            prefix: full_prefix(network),
        }
    }

    /// Parses an address or `<address>/<prefix>` (spaces around either
    /// part allowed).
    pub fn parse(text: &str) -> Result<Self, NetworkError> {
        let text = text.trim();
        if let Ok(ip) = text.parse::<IpAddr>() {
            return Ok(Self::single(ip));
        }
        let (address, prefix) = text.split_once('/').ok_or(NetworkError::NotValid)?;
        let network = address
            .trim()
            .parse::<IpAddr>()
            .map_err(|_| NetworkError::NoValidAddress)?;
        let prefix: u8 = prefix
            .trim()
            .parse()
            .map_err(|_| NetworkError::NoValidPrefix)?;
        Self::new(network, prefix).ok_or(NetworkError::PrefixTooLong)
    }

    /// Whether `ip` is in this network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        // An IPv4 address and its mapped IPv6 form are one address.
        let mapped = match canonical(ip) {
            IpAddr::V4(v4) => IpAddr::V6(v4.to_ipv6_mapped()),
            v6 => v6,
        };
        self.contains_exactly(canonical(ip)) || self.contains_exactly(mapped)
    }

    fn contains_exactly(&self, ip: IpAddr) -> bool {
        match (ip, self.network) {
            (IpAddr::V4(ip), IpAddr::V4(network)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(ip) & mask == u32::from(network) & mask
            }
            (IpAddr::V6(ip), IpAddr::V6(network)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(ip) & mask == u128::from(network) & mask
            }
            _ => false,
        }
    }

    pub fn address(&self) -> IpAddr {
        self.network
    }

    pub fn prefix(&self) -> u8 {
        self.prefix
    }
}

impl fmt::Display for IpNetwork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

fn full_prefix(ip: IpAddr) -> u8 {
    if ip.is_ipv4() { 32 } else { 128 }
}

/// IPv4-mapped IPv6 addresses as the IPv4 address they are.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn addresses_and_networks_parse_and_contain() {
        let net = IpNetwork::parse(" 10.0.0.0 / 8 ").unwrap();
        assert!(net.contains(ip("10.200.1.1")));
        assert!(net.contains(ip("::ffff:10.1.1.1")), "IPv4-mapped");
        assert!(!net.contains(ip("11.0.0.1")));
        assert!(!net.contains(ip("fd00::1")));
        let one = IpNetwork::parse("127.0.0.1").unwrap();
        assert_eq!(one.prefix(), 32);
        assert!(one.contains(ip("127.0.0.1")) && !one.contains(ip("127.0.0.2")));
        let all = IpNetwork::parse("0.0.0.0/0").unwrap();
        assert!(all.contains(ip("203.0.113.9")));
        let v6 = IpNetwork::parse("fd00::/8").unwrap();
        assert!(v6.contains(ip("fd12::1")) && !v6.contains(ip("fe80::1")));
        let mapped = IpNetwork::parse("::ffff:10.0.0.0/104").unwrap();
        assert_eq!(mapped, IpNetwork::parse("10.0.0.0/8").unwrap());
        assert!(mapped.contains(ip("10.9.9.9")) && mapped.contains(ip("::ffff:10.9.9.9")));
        let wide = IpNetwork::parse("::ffff:0.0.0.0/80").unwrap();
        assert!(
            wide.contains(ip("10.9.9.9")),
            "an IPv4 address is its mapped form"
        );
        assert_eq!(v6.to_string(), "fd00::/8");
    }

    #[test]
    fn what_is_not_a_network_says_why() {
        for (text, why) in [
            ("example.com", NetworkError::NotValid),
            ("", NetworkError::NotValid),
            ("10.0.0/8", NetworkError::NoValidAddress),
            ("10.0.0.0/x", NetworkError::NoValidPrefix),
            ("10.0.0.0/-1", NetworkError::NoValidPrefix),
            ("10.0.0.0/33", NetworkError::PrefixTooLong),
            ("fd00::/129", NetworkError::PrefixTooLong),
        ] {
            assert_eq!(IpNetwork::parse(text), Err(why), "{text}");
        }
    }
}
