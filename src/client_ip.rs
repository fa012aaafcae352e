//! Owns who the client is: [`client_ip`] resolves the address a request comes from, taking
//! `X-Forwarded-For` into account only when the socket peer is one of
//! `server.trusted_proxies`. The per-IP limits ([`crate::edge::screen`]), the access log (`client=`)
//! and the `X-Forwarded-For` Sluice sends to passthrough upstreams all use it.
//!
//! The rule is Nginx's `real_ip_recursive on` (and RFC 7239 §5.2's advice): walk the
//! `X-Forwarded-For` hops from the right (the one the trusted peer added last) and stop at the
//! first address that is not a trusted proxy; that is the client. A client can prepend any
//! addresses it likes, so nothing left of the first untrusted hop is believed.

use std::net::{IpAddr, SocketAddr};

use http::HeaderMap;

use crate::config::edge::TrustedProxies;

/// The client address of a request that arrived from socket peer `peer` with `headers`.
///
/// - `peer` not in `trusted`: `peer` (its `X-Forwarded-For` is ignored; the header may be
///   forged).
/// - `peer` in `trusted`: the rightmost `X-Forwarded-For` hop that is not in `trusted`, reading
///   every `X-Forwarded-For` field in order as one comma-separated list; when every hop is
///   trusted, the leftmost one; when there is no header, `peer`. A hop that is not an address
///   (`unknown`, an obfuscated identifier, garbage) ends the walk: the hop to its right (the
///   last one a trusted proxy vouched for) is the answer.
///
/// Hops may carry a port (`192.0.2.1:4711`, `[2001:db8::1]:4711`); IPv4-mapped IPv6 addresses
/// are returned as IPv4. Allocates nothing.
pub fn client_ip(peer: IpAddr, headers: &HeaderMap, trusted: &TrustedProxies) -> IpAddr {
    let peer = peer.to_canonical();
    if trusted.is_empty() || !trusted.contains(peer) {
        return peer;
    }
    let mut client = peer;
    // Fields right to left, hops in each right to left.
    for field in headers.get_all("x-forwarded-for").iter().rev() {
        let Ok(list) = field.to_str() else {
            return client;
        };
        for hop in list.rsplit(',') {
            let hop = hop.trim();
            if hop.is_empty() {
                continue;
            }
            let Some(ip) = parse_hop(hop) else {
                return client;
            };
            client = ip;
            if !trusted.contains(ip) {
                return ip;
            }
        }
    }
    client
}

/// One `X-Forwarded-For` hop: an address, optionally with a port.
fn parse_hop(hop: &str) -> Option<IpAddr> {
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    hop.parse::<SocketAddr>()
        .ok()
        .map(|s| s.ip().to_canonical())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::edge::Cidr;

    fn trusted(cidrs: &[&str]) -> TrustedProxies {
        TrustedProxies::new(cidrs.iter().map(|c| Cidr::parse(c).unwrap()).collect())
    }

    fn headers(xff: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in xff {
            h.append("x-forwarded-for", v.parse().unwrap());
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_claims() {
        let t = trusted(&["10.0.0.0/8"]);
        let h = headers(&["203.0.113.9"]);
        assert_eq!(client_ip(ip("198.51.100.1"), &h, &t), ip("198.51.100.1"));
        assert_eq!(
            client_ip(ip("198.51.100.1"), &h, &TrustedProxies::default()),
            ip("198.51.100.1")
        );
    }

    #[test]
    fn a_trusted_peer_gives_the_rightmost_untrusted_hop() {
        let t = trusted(&["10.0.0.0/8", "127.0.0.1/32"]);
        // The client forged the first hop; 10.1.1.1 is an inner proxy.
        let h = headers(&["6.6.6.6, 203.0.113.9, 10.1.1.1"]);
        assert_eq!(client_ip(ip("127.0.0.1"), &h, &t), ip("203.0.113.9"));
        // Several fields are one list, in order.
        let h = headers(&["6.6.6.6", "203.0.113.9", "10.1.1.1"]);
        assert_eq!(client_ip(ip("10.0.0.2"), &h, &t), ip("203.0.113.9"));
        // All hops trusted: the leftmost.
        let h = headers(&["10.9.9.9, 10.1.1.1"]);
        assert_eq!(client_ip(ip("10.0.0.2"), &h, &t), ip("10.9.9.9"));
        // No header: the peer.
        assert_eq!(
            client_ip(ip("10.0.0.2"), &HeaderMap::new(), &t),
            ip("10.0.0.2")
        );
    }

    #[test]
    fn ports_mapped_addresses_and_garbage() {
        let t = trusted(&["127.0.0.1/32"]);
        let h = headers(&["[2001:db8::1]:4711"]);
        assert_eq!(client_ip(ip("127.0.0.1"), &h, &t), ip("2001:db8::1"));
        let h = headers(&["192.0.2.1:4711"]);
        assert_eq!(client_ip(ip("::ffff:127.0.0.1"), &h, &t), ip("192.0.2.1"));
        let h = headers(&["::ffff:192.0.2.7"]);
        assert_eq!(client_ip(ip("127.0.0.1"), &h, &t), ip("192.0.2.7"));
        // `unknown` ends the walk at the last vouched-for hop: the peer here.
        let h = headers(&["192.0.2.1, unknown"]);
        assert_eq!(client_ip(ip("127.0.0.1"), &h, &t), ip("127.0.0.1"));
    }
}
