//! The edge settings of `server:` after validation: limits on the request head
//! (`max_request_header_bytes`, `max_request_headers`, `max_uri_bytes`), the per-client-IP
//! limits (`per_ip:`) and the proxies whose `X-Forwarded-For` is believed
//! (`trusted_proxies:`). The YAML fields are in [`super::schema::ServerSection`]; the checks
//! that use them live in `crate::edge::screen` (head limits, per-IP rate),
//! `crate::edge::connection` (per-IP connection cap) and `crate::client_ip`.

use std::net::IpAddr;

use serde::Deserialize;

use super::ConfigError;

/// Default `server.max_request_header_bytes`: 32 KiB, Nginx's `large_client_header_buffers 4 8k`
/// (four buffers of 8 KiB hold the whole head).
pub const DEFAULT_MAX_REQUEST_HEADER_BYTES: usize = 32 * 1024;

/// Default `server.max_request_headers` (Apache's `LimitRequestFields`; Nginx counts none).
pub const DEFAULT_MAX_REQUEST_HEADERS: usize = 100;

/// Default `server.max_uri_bytes`: 8 KiB, one of Nginx's `large_client_header_buffers`
/// (the request line must fit in one).
pub const DEFAULT_MAX_URI_BYTES: usize = 8 * 1024;

/// Pingora 0.9.1's own ceiling on header fields (`MAX_HEADERS` in
/// `pingora-core/src/protocols/http/v1/common.rs`): a head with more is answered 400 by
/// Pingora before Sluice sees it, so `server.max_request_headers` may not exceed it.
pub const PINGORA_MAX_HEADERS: usize = 256;

/// Pingora 0.9.1's own ceiling on the head's size (`MAX_HEADER_SIZE`, same file, bytes):
/// past it Pingora answers 400, so `server.max_request_header_bytes` may not exceed it.
pub const PINGORA_MAX_HEADER_SIZE: usize = 1_048_575;

/// `server.per_ip:`: limits per client IP, applied before authentication. Absent: none.
#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct PerIpSection {
    /// Open connections one socket peer may hold (default 256). Connections from a
    /// `trusted_proxies` address are not capped (they carry many clients).
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Sustained requests per second of one client IP (default 100; IPv6 clients count per
    /// /64).
    #[serde(default = "default_requests_per_second")]
    pub requests_per_second: u32,
    /// Requests one client IP may send at once (default 200): at most `burst` requests in
    /// any `burst / requests_per_second` seconds. At least `requests_per_second`.
    #[serde(default = "default_burst")]
    pub burst: u32,
}

fn default_max_connections() -> usize {
    256
}
fn default_requests_per_second() -> u32 {
    100
}
fn default_burst() -> u32 {
    200
}

/// Validated `server.per_ip`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerIpSettings {
    /// Open connections per socket peer.
    pub max_connections: usize,
    /// Sustained requests per second per client IP.
    pub requests_per_second: u32,
    /// Requests per client IP in any `burst / requests_per_second` seconds.
    pub burst: u32,
}

/// A network, `address/prefix` (`10.0.0.0/8`, `::1/128`; a bare address is a /32 or /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    /// The network address (bits past `prefix` are zero).
    addr: IpAddr,
    /// Prefix length in bits.
    prefix: u8,
}

impl Cidr {
    /// Parses `a.b.c.d/n`, `x::y/n` or a bare address.
    ///
    /// # Errors
    /// A message naming what is wrong (bad address, prefix over 32 or 128).
    pub fn parse(s: &str) -> Result<Self, String> {
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = a
            .trim()
            .parse()
            .map_err(|_| format!("`{s}` is not an address or a network like 10.0.0.0/8"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            None => max,
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|n| *n <= max)
                .ok_or_else(|| format!("`{s}`: the prefix length must be 0 to {max}"))?,
        };
        Ok(Self {
            addr: mask(addr, prefix),
            prefix,
        })
    }

    /// Whether `ip` is in this network (an IPv4-mapped IPv6 address counts as its IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        ip.is_ipv4() == self.addr.is_ipv4() && mask(ip, self.prefix) == self.addr
    }
}

/// `ip` with every bit past the first `prefix` cleared.
pub fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let m = u32::MAX
                .checked_shl(32 - u32::from(prefix.min(32)))
                .unwrap_or(0);
            IpAddr::V4((bits & m).into())
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let m = u128::MAX
                .checked_shl(128 - u32::from(prefix.min(128)))
                .unwrap_or(0);
            IpAddr::V6((bits & m).into())
        }
    }
}

/// `server.trusted_proxies`: the networks whose `X-Forwarded-For` is believed. Empty (the
/// default): none, the socket peer is the client.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<Cidr>);

impl TrustedProxies {
    /// The networks `cidrs`.
    pub fn new(cidrs: Vec<Cidr>) -> Self {
        Self(cidrs)
    }

    /// Whether `ip` is a trusted proxy.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|c| c.contains(ip))
    }

    /// Whether no proxy is trusted.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The edge part of `server:` after validation.
#[derive(Debug, Clone)]
pub struct EdgeSettings {
    /// Largest request head (request line and header fields), bytes; past it 431.
    pub max_request_header_bytes: usize,
    /// Most header fields in a request; past it 431.
    pub max_request_headers: usize,
    /// Longest request target (path and query as sent), bytes; past it 414.
    pub max_uri_bytes: usize,
    /// Per-client-IP limits, if configured.
    pub per_ip: Option<PerIpSettings>,
    /// Proxies whose `X-Forwarded-For` is believed.
    pub trusted_proxies: TrustedProxies,
}

impl Default for EdgeSettings {
    fn default() -> Self {
        Self {
            max_request_header_bytes: DEFAULT_MAX_REQUEST_HEADER_BYTES,
            max_request_headers: DEFAULT_MAX_REQUEST_HEADERS,
            max_uri_bytes: DEFAULT_MAX_URI_BYTES,
            per_ip: None,
            trusted_proxies: TrustedProxies::default(),
        }
    }
}

/// The YAML values [`edge_settings`] validates (fields of `server:`).
#[derive(Debug, Clone)]
pub struct EdgeSection<'a> {
    /// `server.max_request_header_bytes`.
    pub max_request_header_bytes: usize,
    /// `server.max_request_headers`.
    pub max_request_headers: usize,
    /// `server.max_uri_bytes`.
    pub max_uri_bytes: usize,
    /// `server.per_ip`.
    pub per_ip: Option<&'a PerIpSection>,
    /// `server.trusted_proxies`.
    pub trusted_proxies: &'a [String],
}

/// Validates the edge fields of `server:`; `err(key, message)` builds the error.
///
/// # Errors
/// A limit of 0 or over Pingora's ceiling, a URI limit over the head limit, a per-IP rate of
/// 0 or a burst below it, a `trusted_proxies` entry that is not an address or network.
pub fn edge_settings(
    s: &EdgeSection<'_>,
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<EdgeSettings, ConfigError> {
    if s.max_request_header_bytes < 1024 || s.max_request_header_bytes > PINGORA_MAX_HEADER_SIZE {
        return Err(err(
            "server.max_request_header_bytes",
            format!("must be 1024 to {PINGORA_MAX_HEADER_SIZE} (Pingora's own limit)"),
        ));
    }
    if s.max_request_headers == 0 || s.max_request_headers > PINGORA_MAX_HEADERS {
        return Err(err(
            "server.max_request_headers",
            format!("must be 1 to {PINGORA_MAX_HEADERS} (Pingora's own limit)"),
        ));
    }
    if s.max_uri_bytes < 64 || s.max_uri_bytes > s.max_request_header_bytes {
        return Err(err(
            "server.max_uri_bytes",
            format!(
                "must be 64 to server.max_request_header_bytes ({}): the request line is part of the head",
                s.max_request_header_bytes
            ),
        ));
    }
    let per_ip = match s.per_ip {
        None => None,
        Some(p) => {
            if p.max_connections == 0 {
                return Err(err(
                    "server.per_ip.max_connections",
                    "must be greater than 0".into(),
                ));
            }
            if p.requests_per_second == 0 {
                return Err(err(
                    "server.per_ip.requests_per_second",
                    "must be greater than 0".into(),
                ));
            }
            if p.burst < p.requests_per_second {
                return Err(err(
                    "server.per_ip.burst",
                    format!(
                        "must be at least server.per_ip.requests_per_second ({})",
                        p.requests_per_second
                    ),
                ));
            }
            Some(PerIpSettings {
                max_connections: p.max_connections,
                requests_per_second: p.requests_per_second,
                burst: p.burst,
            })
        }
    };
    let mut cidrs = Vec::with_capacity(s.trusted_proxies.len());
    for (i, c) in s.trusted_proxies.iter().enumerate() {
        cidrs.push(Cidr::parse(c).map_err(|m| err(&format!("server.trusted_proxies[{i}]"), m))?);
    }
    Ok(EdgeSettings {
        max_request_header_bytes: s.max_request_header_bytes,
        max_request_headers: s.max_request_headers,
        max_uri_bytes: s.max_uri_bytes,
        per_ip,
        trusted_proxies: TrustedProxies::new(cidrs),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    const MINIMAL: &str = "server:\n  listen: 127.0.0.1:8080\n  admin_listen: 127.0.0.1:9090\n%EDGE%tenants:\n  t: {}\nvirtual_keys:\n  - key: sk-sluice-edge-0001\n    tenant: t\nproviders:\n  p:\n    kind: openai\n    base_url: http://127.0.0.1:18000/v1\n    api_key: k\nmodels:\n  m:\n    routes:\n      - provider: p\n        upstream_model: u\n";

    fn parse(edge: &str) -> Result<super::super::Config, ConfigError> {
        super::super::Config::parse(
            std::path::Path::new("sluice.yaml"),
            &MINIMAL.replace("%EDGE%", edge),
        )
    }

    #[test]
    fn edge_keys_default_like_nginx_and_are_checked_with_their_key_paths() {
        let c = parse("").unwrap();
        let e = &c.server.edge;
        assert_eq!(
            (
                e.max_request_header_bytes,
                e.max_request_headers,
                e.max_uri_bytes
            ),
            (32768, 100, 8192)
        );
        assert!(e.per_ip.is_none() && e.trusted_proxies.is_empty());
        let c = parse("  per_ip: {}\n  trusted_proxies: [10.0.0.0/8, '::1']\n").unwrap();
        assert_eq!(
            c.server.edge.per_ip,
            Some(PerIpSettings {
                max_connections: 256,
                requests_per_second: 100,
                burst: 200
            })
        );
        assert!(c.server.edge.trusted_proxies.contains(ip("::1")));
        for (yaml, key) in [
            (
                "  trusted_proxies: [10.0.0.0/8, 10.0.0.0/40]\n",
                "server.trusted_proxies[1]",
            ),
            (
                "  per_ip: {requests_per_second: 10, burst: 5}\n",
                "server.per_ip.burst",
            ),
            (
                "  per_ip: {max_connections: 0}\n",
                "server.per_ip.max_connections",
            ),
            ("  max_request_headers: 300\n", "server.max_request_headers"),
            (
                "  max_request_header_bytes: 2000000\n",
                "server.max_request_header_bytes",
            ),
            ("  max_uri_bytes: 40000\n", "server.max_uri_bytes"),
        ] {
            let e = parse(yaml).unwrap_err();
            assert_eq!(e.key_path, key, "{yaml}: {e}");
        }
        let e = parse("  per_ip: {max_conns: 3}\n").unwrap_err();
        assert!(e.to_string().contains("max_conns"), "{e}");
    }

    #[test]
    fn cidrs_match_their_networks_only() {
        let c = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(c.contains(ip("10.255.1.2")));
        assert!(!c.contains(ip("11.0.0.1")));
        assert!(c.contains(ip("::ffff:10.1.2.3")), "IPv4-mapped IPv6");
        assert!(!c.contains(ip("::1")));
        let host = Cidr::parse("127.0.0.1").unwrap();
        assert!(host.contains(ip("127.0.0.1")) && !host.contains(ip("127.0.0.2")));
        let v6 = Cidr::parse("fd00::/8").unwrap();
        assert!(v6.contains(ip("fd12::1")) && !v6.contains(ip("fe80::1")));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains(ip("8.8.8.8")));
        // Host bits are cleared, as `ip route` does.
        assert_eq!(
            Cidr::parse("10.1.2.3/8").unwrap(),
            Cidr::parse("10.0.0.0/8").unwrap()
        );
        assert!(Cidr::parse("10.0.0.0/33").is_err());
        assert!(Cidr::parse("example.com/8").is_err());
    }
}
