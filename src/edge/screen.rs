//! Owns the screening of hostile input at the edge, before authentication: the limits on the
//! request head (`server.max_request_header_bytes` and `server.max_request_headers`: 431,
//! `server.max_uri_bytes`: 414), the per-client-IP request rate (`server.per_ip`: 429 with
//! `Retry-After`) and the per-IP connection cap ([`ConnectionCap`], used by
//! [`crate::edge::connection`]). Every refusal is counted in `sluice_rejected_total{reason}`
//! (`header_too_large`, `too_many_headers`, `uri_too_long`, `per_ip_rate`,
//! `per_ip_connections`).
//!
//! Memory is fixed whatever the number of clients: the rate is a pingora-limits [`Rate`]
//! (a count-min sketch, 2 × 4 × 1024 counters, sliding-window estimate as in the tenant
//! limits) and the connection count an [`Inflight`] (4 × 8192 counters). A hash collision can
//! only make a count too high (an innocent client sharing all four counters with a heavy one
//! is refused too), never too low. IPv6 clients count per /64 (one subscriber's usual
//! allocation), IPv4 per address.
//!
//! Head limits are checked twice: as the head arrives, by [`crate::edge::head_guard`] (raw bytes
//! and lines, before Pingora buffers or parses more: Pingora's own ceilings, 256 fields and
//! 1 MiB answered with a bare 400, are never reached), and exactly here, on the parsed head
//! (the target as sent, the field count, the head's wire size), with the 431/414 in the
//! client's dialect and the connection closed after it.

use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use pingora::http::RequestHeader;
use pingora_limits::inflight::{Guard, Inflight};
use pingora_limits::rate::{Rate, RateComponents, PROPORTIONAL_RATE_ESTIMATE_CALC_FN};

use pingora::proxy::Session;

use crate::client_ip::client_ip;
use crate::config::edge::{EdgeSettings, PerIpSettings};
use crate::error::GatewayError;
use crate::metrics::metrics;
use crate::proxy::ctx::RequestCtx;

/// Screens one request before anything else reads it: resolves the client's address into
/// `ctx.client_ip`, then checks the head limits and the per-IP rate. A refused request is
/// answered here, in the dialect its path implies (OpenAI's shape unless it is an Anthropic
/// path), and its connection is closed after the answer (its body is never read). Returns
/// whether it was refused.
pub async fn refuse(session: &mut Session, ctx: &mut RequestCtx) -> bool {
    let edge = &ctx.config.server.edge;
    let req = session.req_header();
    let peer = session
        .client_addr()
        .and_then(|a| a.as_inet())
        .map(std::net::SocketAddr::ip);
    let client = peer.map(|p| client_ip(p, &req.headers, &edge.trusted_proxies));
    ctx.client_ip = client;
    let verdict = check_head(req, edge).and_then(|()| match client {
        Some(ip) => check_rate(ip, edge),
        None => Ok(()),
    });
    let Err(err) = verdict else {
        return false;
    };
    let path = req.uri.path();
    ctx.dialect = crate::ingress::endpoints::dialect_of(path.strip_prefix("/v1").unwrap_or(path));
    session.set_keepalive(None);
    // A write failure means the client left; nothing more to do either way.
    let _ = crate::ingress::respond::write_error(session, ctx, &err).await;
    true
}

/// The length of a request head as it is on the wire in HTTP/1.1: request line
/// (`METHOD SP target SP HTTP/1.1 CRLF`), each field (`name: value CRLF`) and the final CRLF.
pub fn head_bytes(req: &RequestHeader) -> usize {
    let line = req.method.as_str().len() + 1 + req.raw_path().len() + 1 + 8 + 2;
    let fields: usize = req
        .headers
        .iter()
        .map(|(k, v)| k.as_str().len() + 2 + v.len() + 2)
        .sum();
    line + fields + 2
}

/// Checks `req` against the head limits of `edge`.
///
/// # Errors
/// [`GatewayError::UriTooLong`] (414) or [`GatewayError::HeaderTooLarge`] (431), counted in
/// `sluice_rejected_total`.
pub fn check_head(req: &RequestHeader, edge: &EdgeSettings) -> Result<(), GatewayError> {
    let uri = req.raw_path().len();
    let err = if uri > edge.max_uri_bytes {
        GatewayError::UriTooLong {
            limit_bytes: edge.max_uri_bytes,
        }
    } else if req.headers.len() > edge.max_request_headers {
        GatewayError::HeaderTooLarge {
            message: format!(
                "the request has {} header fields, more than the limit of {}",
                req.headers.len(),
                edge.max_request_headers
            ),
            reason: "too_many_headers",
        }
    } else {
        let n = head_bytes(req);
        if n <= edge.max_request_header_bytes {
            return Ok(());
        }
        GatewayError::HeaderTooLarge {
            message: format!(
                "the request head is {n} bytes, more than the limit of {}",
                edge.max_request_header_bytes
            ),
            reason: "header_too_large",
        }
    };
    metrics()
        .rejected_total
        .with_label_values(&[err.metric_label()])
        .inc();
    Err(err)
}

/// The per-IP counting key: an IPv4 address (tagged into a range no unicast /64 uses), or an
/// IPv6 address's /64.
fn ip_key(ip: IpAddr) -> u64 {
    match ip.to_canonical() {
        IpAddr::V4(v4) => 0xffff_ffff_0000_0000 | u64::from(u32::from(v4)),
        IpAddr::V6(v6) => (u128::from(v6) >> 64) as u64,
    }
}

/// One per-IP rate window: the settings it was built for and its counters.
struct RateWindow {
    settings: PerIpSettings,
    rate: Rate,
}

/// The process's per-IP request rate, rebuilt when a reload changes `server.per_ip`.
fn rate_window(p: PerIpSettings) -> Arc<RateWindow> {
    static CURRENT: OnceLock<Mutex<Option<Arc<RateWindow>>>> = OnceLock::new();
    let mut cur = CURRENT
        .get_or_init(|| Mutex::new(None))
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match cur.as_ref() {
        Some(w) if w.settings == p => w.clone(),
        _ => {
            // `burst` requests per window of `burst / requests_per_second` seconds.
            let window =
                Duration::from_secs_f64(f64::from(p.burst) / f64::from(p.requests_per_second))
                    .max(Duration::from_millis(1));
            let w = Arc::new(RateWindow {
                settings: p,
                rate: Rate::new(window),
            });
            *cur = Some(w.clone());
            w
        }
    }
}

/// Counts one request of client `ip` against `server.per_ip`.
///
/// # Errors
/// [`GatewayError::RateLimited`] (`per_ip_rate`, 429 with `Retry-After`) when `ip` sent
/// `burst` requests within the last `burst / requests_per_second` seconds (a refused request
/// counts nothing), counted in `sluice_rejected_total{reason="per_ip_rate"}`.
pub fn check_rate(ip: IpAddr, edge: &EdgeSettings) -> Result<(), GatewayError> {
    let Some(p) = edge.per_ip else {
        return Ok(());
    };
    let w = rate_window(p);
    let key = ip_key(ip);
    // Observe first and refund when over: concurrent requests can only over-reject.
    w.rate.observe(&key, 1);
    let (count, wait) = w.rate.rate_with(&key, |c: RateComponents| {
        let count = PROPORTIONAL_RATE_ESTIMATE_CALC_FN(c) * c.interval.as_secs_f64();
        (count, sure_wait(c))
    });
    // (Float noise of the estimate's x/÷ window on a whole count does not count.)
    if count <= f64::from(p.burst) + 1e-6 {
        return Ok(());
    }
    w.rate.observe(&key, -1);
    metrics()
        .rejected_total
        .with_label_values(&["per_ip_rate"])
        .inc();
    Err(GatewayError::RateLimited {
        message: format!(
            "too many requests from this address: the limit is {} per second (bursts of {})",
            p.requests_per_second, p.burst
        ),
        reason: "per_ip_rate",
        retry_after: wait,
    })
}

/// How long until a refused client is sure to be admitted, whatever other clients do
/// meanwhile: until both of `Rate`'s windows holding its requests have passed. `Rate` starts
/// its next window lazily, at the first request (from any client) after the current one
/// ends, and that window begins with the previous one's count undecayed; only once two
/// windows have passed since the current one started are both counts cleared. So: the rest
/// of the current window plus one more.
fn sure_wait(c: RateComponents) -> Duration {
    let w = c.interval.as_secs_f64();
    Duration::from_secs_f64(((2.0 - c.current_interval_fraction) * w).max(0.001))
}

/// The per-IP connection cap (`server.per_ip.max_connections`): one per process.
pub struct ConnectionCap {
    open: Inflight,
}

impl std::fmt::Debug for ConnectionCap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionCap").finish_non_exhaustive()
    }
}

impl Default for ConnectionCap {
    fn default() -> Self {
        Self::new()
    }
}

/// An admitted connection: holds its place in the count until dropped.
pub struct ConnectionSlot {
    _guard: Option<Guard>,
}

impl std::fmt::Debug for ConnectionSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionSlot").finish_non_exhaustive()
    }
}

impl ConnectionCap {
    /// An empty count.
    pub fn new() -> Self {
        Self {
            open: Inflight::new(),
        }
    }

    /// Admits a connection from socket peer `peer` under `edge`: always when `server.per_ip`
    /// is absent or `peer` is a trusted proxy (nothing is counted then). `None` when `peer`
    /// already holds `max_connections` connections, counted in
    /// `sluice_rejected_total{reason="per_ip_connections"}`: the caller closes the
    /// connection without reading it.
    pub fn admit(&self, peer: IpAddr, edge: &EdgeSettings) -> Option<ConnectionSlot> {
        let Some(p) = edge.per_ip else {
            return Some(ConnectionSlot { _guard: None });
        };
        if edge.trusted_proxies.contains(peer) {
            return Some(ConnectionSlot { _guard: None });
        }
        let (guard, n) = self.open.incr(ip_key(peer), 1);
        if usize::try_from(n).unwrap_or(0) > p.max_connections {
            drop(guard);
            metrics()
                .rejected_total
                .with_label_values(&["per_ip_connections"])
                .inc();
            return None;
        }
        Some(ConnectionSlot {
            _guard: Some(guard),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(path: &str, headers: &[(&str, &str)]) -> RequestHeader {
        let mut r = RequestHeader::build("GET", path.as_bytes(), None).unwrap();
        for (k, v) in headers {
            r.append_header(k.to_string(), *v).unwrap();
        }
        r
    }

    #[test]
    fn head_bytes_counts_the_wire_form() {
        let r = req("/v1/models", &[("host", "a"), ("x-a", "bc")]);
        // "GET /v1/models HTTP/1.1\r\n" + "host: a\r\n" + "x-a: bc\r\n" + "\r\n"
        assert_eq!(head_bytes(&r), 25 + 9 + 9 + 2);
    }

    #[test]
    fn head_limits_pick_414_then_431() {
        let edge = EdgeSettings {
            max_request_header_bytes: 1024,
            max_request_headers: 3,
            max_uri_bytes: 64,
            ..EdgeSettings::default()
        };
        assert!(check_head(&req("/ok", &[("a", "1")]), &edge).is_ok());
        let long = format!("/{}", "a".repeat(64));
        assert_eq!(
            check_head(&req(&long, &[]), &edge).unwrap_err().status(),
            414
        );
        let many = [("a", "1"), ("b", "1"), ("c", "1"), ("d", "1")];
        assert_eq!(
            check_head(&req("/", &many), &edge).unwrap_err().status(),
            431
        );
        let big = "v".repeat(1100);
        assert_eq!(
            check_head(&req("/", &[("a", &big)]), &edge)
                .unwrap_err()
                .status(),
            431
        );
    }

    #[test]
    fn ipv6_counts_per_64_and_ipv4_per_address() {
        let k = |s: &str| ip_key(s.parse().unwrap());
        assert_eq!(k("2001:db8:1:2::1"), k("2001:db8:1:2:ffff::9"));
        assert_ne!(k("2001:db8:1:2::1"), k("2001:db8:1:3::1"));
        assert_ne!(k("192.0.2.1"), k("192.0.2.2"));
        assert_eq!(k("::ffff:192.0.2.1"), k("192.0.2.1"));
    }
}
