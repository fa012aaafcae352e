//! Owns a matched passthrough request on Pingora's native proxy path, phase by phase (the
//! [`Gateway`](crate::proxy::Gateway) hooks call in here when `ctx.passthrough` is set):
//!
//! | phase | does |
//! |---|---|
//! | `request_filter` ([`admit`]) | the prefix redirect; refuse dot segments (400) and a declared body over the route's limit (413); pin the route; hand the request to the native path |
//! | `upstream_peer` ([`peer`]) | the next healthy upstream not tried yet (round robin, or the consistent hash of `hash_header` / the client IP); 503 when none is healthy |
//! | `fail_to_connect` ([`connect_failed`]) | a refused or timed-out connect tries the next upstream |
//! | `error_while_proxy` ([`proxy_failed`]) | Pingora's retry rule (idempotent requests, not past the retry buffer); a failure on a pooled connection may retry the same upstream |
//! | `upstream_request_filter` ([`upstream_request`]) | `strip_prefix`; the forwarding headers ([`super::forward`]) |
//! | `request_body_filter` ([`request_body`]) | the body's size (413) and time (408) limits while it streams |
//! | `response_filter` ([`response_head`]) | the response head in the client's HTTP/1.x version |
//! | `fail_to_proxy` ([`fail`]) | a short `text/plain` answer: 502 (upstream failed), 504 (upstream timed out), 503, 413, 408 |
//!
//! Everything else is Pingora's: the response streams through unbuffered (SSE and chunked
//! bodies chunk by chunk, with backpressure), hop-by-hop headers are stripped, WebSocket
//! upgrades are forwarded, and the client's `Authorization` (the upstream's own auth) is passed
//! on unchanged.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::proxy::{FailToProxy, Session};
use pingora::upstreams::peer::HttpPeer;
use pingora::{Error, ErrorSource, ErrorType};

use super::{Match, Route};
use crate::config::passthrough::Balance;
use crate::config::{Config, LogFormat};

/// How long an idle pooled connection to a passthrough upstream is kept.
const UPSTREAM_IDLE: std::time::Duration = std::time::Duration::from_secs(60);

/// Per-request passthrough state: the whole context of a request on a passthrough route
/// (the proxy shell keeps it beside its own and hands it to the hooks below).
#[derive(Debug)]
pub struct PassCtx {
    /// The request id (taken over from the shell, which set it before the route matched).
    pub request_id: String,
    /// When the request head arrived.
    pub received: Instant,
    /// Final downstream status Sluice wrote itself (0: the upstream's, or nothing written).
    pub status: u16,
    /// The access log's outcome label when not plain `ok`/`error`: `redirect`, `rejected`,
    /// `client_abort`, `no_upstream`, `upstream_error`, `upstream_timeout`.
    pub label: &'static str,
    /// `server.body_read_timeout_ms` of the pinned snapshot: the body's deadline from `received`.
    body_read_timeout: Duration,
    /// `server.log_format` of the pinned snapshot.
    log_format: LogFormat,
    /// The route the request matched (pinned: a reload does not change it).
    pub route: Arc<Route>,
    /// Upstreams tried so far, in order.
    pub tried: Vec<SocketAddr>,
    /// The upstream of the current (last) attempt.
    pub upstream: Option<SocketAddr>,
    /// What consistent hashing hashes (empty for round robin).
    hash_key: Vec<u8>,
    /// The TCP peer's IP (`None` for a Unix-socket peer): the hop Sluice appends to
    /// `X-Forwarded-For` and `Forwarded` (each proxy appends the address it received from).
    peer_ip: Option<IpAddr>,
    /// The request's host as the client sent it (`Host`, or the URI's authority).
    host: Option<String>,
    /// Request body bytes received so far.
    body_bytes: usize,
}

impl PassCtx {
    /// Whether Pingora's error log should stay quiet about this request's error: a client
    /// that left, or a request refused for its body (413, 408), is normal traffic (counted
    /// and access-logged).
    pub fn quiet_error(&self) -> bool {
        matches!(self.label, "client_abort" | "rejected")
    }

    /// `server.log_format` of the snapshot the request was pinned to.
    pub fn log_format(&self) -> LogFormat {
        self.log_format
    }
}

/// What the proxy shell knows of a request when it matches a passthrough route.
#[derive(Debug)]
pub struct Start<'a> {
    /// The config snapshot pinned for the request.
    pub config: &'a Config,
    /// When the request head arrived.
    pub received: Instant,
    /// The request id (moved into the [`PassCtx`]).
    pub request_id: String,
    /// The client's address as the edge screening resolved it (`None`: not resolved).
    pub client_ip: Option<IpAddr>,
}

/// The request's addresses: (the TCP peer, the client). The client is
/// [`client_ip`](crate::client_ip::client_ip) with `server.trusted_proxies`: the peer
/// itself, or the first untrusted `X-Forwarded-For` hop when the peer is a trusted proxy. The
/// edge screening resolved it into `start.client_ip` already (the per-IP limits and the access
/// log use the same address); it is resolved here only when that did not happen. Both are
/// `None` for a Unix-socket peer.
fn addresses(session: &Session, start: &Start<'_>) -> (Option<IpAddr>, Option<IpAddr>) {
    let peer = session
        .client_addr()
        .and_then(|a| a.as_inet())
        .map(std::net::SocketAddr::ip);
    let client = start.client_ip.or_else(|| {
        peer.map(|p| {
            crate::client_ip::client_ip(
                p,
                &session.req_header().headers,
                &start.config.server.edge.trusted_proxies,
            )
        })
    });
    (peer, client)
}

/// What consistent hashing hashes: the `hash_header`'s value when set and present, else the
/// client's address (behind trusted proxies the real client's, so that one client sticks to
/// one upstream whichever proxy it came through); empty for round robin.
fn hash_key(balance: &Balance, headers: &http::HeaderMap, client: Option<IpAddr>) -> Vec<u8> {
    match balance {
        Balance::RoundRobin => Vec::new(),
        Balance::ConsistentHash { header } => header
            .as_deref()
            .and_then(|h| headers.get(h))
            .map(|v| v.as_bytes().to_vec())
            .or_else(|| client.map(|ip| ip.to_string().into_bytes()))
            .unwrap_or_default(),
    }
}

/// Whether `path` has a `.` or `..` segment, percent-encoded or not.
fn has_dot_segment(path: &str) -> bool {
    path.split('/').any(|s| {
        let s = s.to_ascii_lowercase().replace("%2e", ".");
        s == "." || s == ".."
    })
}

/// Writes a short `text/plain` answer (with `location` for a redirect).
async fn respond(
    session: &mut Session,
    status: u16,
    text: &str,
    location: Option<&str>,
) -> pingora::Result<()> {
    let body = Bytes::from(format!("{text}\n"));
    let mut h = ResponseHeader::build(status, Some(4))?;
    h.insert_header("content-type", "text/plain; charset=utf-8")?;
    h.insert_header("content-length", body.len().to_string())?;
    h.insert_header("cache-control", "no-store")?;
    if let Some(l) = location {
        h.insert_header("location", l)?;
    }
    session.write_response_header(Box::new(h), false).await?;
    session.write_response_body(Some(body), true).await?;
    Ok(())
}

/// `request_filter` of a matched request: fills `slot` with the request's [`PassCtx`]; then
/// `Ok(true)` when answered here (a redirect or a refusal), `Ok(false)` to proxy it.
///
/// # Errors
/// A write error toward the client (it left).
pub async fn admit(
    session: &mut Session,
    slot: &mut Option<PassCtx>,
    start: Start<'_>,
    m: Match,
) -> pingora::Result<bool> {
    let (route, redirect) = match m {
        Match::Redirect { route, prefix } => (route, Some(prefix)),
        Match::Route(r) => (r, None),
    };
    let host = {
        let req = session.req_header();
        req.uri
            .authority()
            .map(|a| a.as_str().to_string())
            .or_else(|| {
                req.headers
                    .get(http::header::HOST)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
            })
    };
    let (peer_ip, client_ip) = addresses(session, &start);
    let hash_key = hash_key(
        &route.spec.balance,
        &session.req_header().headers,
        client_ip,
    );
    let max = route.spec.max_request_body_bytes;
    let p = slot.insert(PassCtx {
        request_id: start.request_id,
        received: start.received,
        status: 0,
        label: "",
        body_read_timeout: start.config.server.body_read_timeout,
        log_format: start.config.server.log_format,
        route,
        tried: Vec::new(),
        upstream: None,
        hash_key,
        peer_ip,
        host,
        body_bytes: 0,
    });
    if let Some(prefix) = redirect {
        let location = match session.req_header().uri.query() {
            Some(q) => format!("{prefix}?{q}"),
            None => prefix,
        };
        if !session.is_body_done() {
            session.set_keepalive(None);
        }
        p.status = 301;
        p.label = "redirect";
        respond(session, 301, "moved permanently", Some(&location))
            .await
            .map_err(|e| e.into_down())?;
        return Ok(true);
    }
    let refusal = if has_dot_segment(session.req_header().uri.path()) {
        Some((400, "the path has a `.` or `..` segment"))
    } else if session
        .req_header()
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .is_some_and(|n| n > max as u64)
    {
        Some((413, "the request body is too large"))
    } else {
        None
    };
    if let Some((status, text)) = refusal {
        // The body was not read: the connection cannot carry another request.
        session.set_keepalive(None);
        p.status = status;
        p.label = "rejected";
        respond(session, status, text, None)
            .await
            .map_err(|e| e.into_down())?;
        return Ok(true);
    }
    Ok(false)
}

/// `upstream_peer`: the upstream of the next attempt.
///
/// # Errors
/// 503 when no upstream is healthy, 502 when every healthy one was tried.
pub fn peer(p: &mut PassCtx) -> pingora::Result<Box<HttpPeer>> {
    let spec = &p.route.spec;
    let Some(addr) = p.route.balancer.select(&p.hash_key, &p.tried) else {
        return Err(if p.tried.is_empty() {
            Error::explain(
                ErrorType::HTTPStatus(503),
                "no healthy passthrough upstream",
            )
        } else {
            Error::explain(
                ErrorType::HTTPStatus(502),
                "every healthy passthrough upstream failed",
            )
        });
    };
    p.tried.push(addr);
    p.upstream = Some(addr);
    let (tls, sni) = match &spec.tls {
        Some(t) => (true, t.sni.clone()),
        None => (false, String::new()),
    };
    let mut peer = HttpPeer::new(addr, tls, sni);
    let o = &mut peer.options;
    o.connection_timeout = Some(spec.connect_timeout);
    o.total_connection_timeout = Some(spec.connect_timeout);
    o.read_timeout = Some(spec.read_timeout);
    o.write_timeout = Some(spec.write_timeout);
    o.idle_timeout = Some(UPSTREAM_IDLE);
    if let Some(t) = &spec.tls {
        o.verify_cert = t.verify;
        o.verify_hostname = t.verify;
    }
    Ok(Box::new(peer))
}

/// `fail_to_connect`: retry on the next upstream while one is left.
pub fn connect_failed(p: &PassCtx, mut e: Box<Error>) -> Box<Error> {
    let untried = p.route.spec.upstreams.iter().any(|a| !p.tried.contains(a));
    e.set_retry(untried);
    e
}

/// `error_while_proxy`: Pingora's default rule (no retry for a non-idempotent method or a
/// body past the retry buffer; a `ReusedOnly` error retried only on a pooled connection).
/// A retry after a failure on a pooled connection may pick the same upstream again (the
/// connection was stale, not the upstream).
pub fn proxy_failed(
    session: &Session,
    p: Option<&mut PassCtx>,
    peer: &HttpPeer,
    e: Box<Error>,
    client_reused: bool,
) -> Box<Error> {
    let mut e = e.more_context(format!("Peer: {peer}"));
    if !session.req_header().method.is_idempotent() || session.as_ref().retry_buffer_truncated() {
        e.set_retry(false);
    } else {
        e.retry.decide_reuse(client_reused);
    }
    if let Some(p) = p {
        if client_reused && e.retry() {
            p.tried.pop();
        }
    }
    e
}

/// `upstream_request_filter`: the path (`strip_prefix`) and the forwarding headers.
///
/// # Errors
/// An invalid rewritten path or header (from malformed input Pingora let through).
pub fn upstream_request(
    session: &Session,
    p: &PassCtx,
    req: &mut RequestHeader,
) -> pingora::Result<()> {
    if p.route.spec.strip_prefix {
        if let Some(prefix) = p.route.spec.path_prefix.as_deref() {
            let path = req.uri.path();
            let rest = path.strip_prefix(prefix).unwrap_or(path);
            let mut target = if rest.starts_with('/') {
                rest.to_string()
            } else {
                format!("/{rest}")
            };
            if let Some(q) = req.uri.query() {
                target.push('?');
                target.push_str(q);
            }
            let uri = http::Uri::builder()
                .path_and_query(target)
                .build()
                .map_err(|e| Error::because(ErrorType::InternalError, "strip_prefix", e))?;
            req.set_uri(uri);
        }
    }
    let tls = session.digest().is_some_and(|d| d.ssl_digest.is_some());
    super::forward::apply(
        req,
        p.peer_ip,
        p.host.as_deref(),
        if tls { "https" } else { "http" },
    )
}

/// `response_filter`: the response head speaks the client's HTTP/1.x version, not the
/// upstream's. Pingora writes the upstream head's version, so an HTTP/1.0 upstream that sends a
/// `Content-Length` would otherwise answer `HTTP/1.0` to an HTTP/1.1 client (which then
/// treats the connection as not persistent). An HTTP/1.0 client keeps `HTTP/1.0` heads
/// where the upstream's was 1.0; HTTP/2 clients are unaffected (Pingora converts the head).
pub fn response_head(session: &Session, resp: &mut ResponseHeader) {
    let client = session.req_header().version;
    if client == http::Version::HTTP_11 && resp.version != http::Version::HTTP_11 {
        resp.set_version(http::Version::HTTP_11);
    }
}

/// `request_body_filter`: counts the body against the route's size limit and the server's
/// body deadline (`server.body_read_timeout_ms`, from the end of the head). The bytes of an
/// upgraded connection (a WebSocket, `upgraded`) are not a body and count against neither.
///
/// # Errors
/// 413 past the size limit, 408 past the deadline.
pub fn request_body(p: &mut PassCtx, body: Option<&Bytes>, upgraded: bool) -> pingora::Result<()> {
    if upgraded {
        return Ok(());
    }
    let late = p.received.elapsed() > p.body_read_timeout;
    p.body_bytes = p.body_bytes.saturating_add(body.map_or(0, Bytes::len));
    if p.body_bytes > p.route.spec.max_request_body_bytes {
        return Err(Error::explain(
            ErrorType::HTTPStatus(413),
            "passthrough request body too large",
        ));
    }
    if late && body.is_some() {
        return Err(Error::explain(
            ErrorType::HTTPStatus(408),
            "passthrough request body too slow",
        ));
    }
    Ok(())
}

/// `fail_to_proxy` of a passthrough request: the answer when nothing was written yet, and
/// the access log's outcome.
pub async fn fail(session: &mut Session, p: &mut PassCtx, e: &Error) -> FailToProxy {
    let downstream = matches!(e.esource(), ErrorSource::Downstream);
    let (status, label, text) = match e.etype() {
        _ if downstream => (0, "client_abort", ""),
        ErrorType::HTTPStatus(503) => (503, "no_upstream", "no upstream is available"),
        ErrorType::HTTPStatus(502) => (502, "upstream_error", "the upstream failed"),
        ErrorType::HTTPStatus(413) => (413, "rejected", "the request body is too large"),
        ErrorType::HTTPStatus(408) => (408, "rejected", "the request body did not arrive in time"),
        ErrorType::HTTPStatus(c) => (*c, "error", "the request failed"),
        ErrorType::ConnectTimedout
        | ErrorType::ReadTimedout
        | ErrorType::WriteTimedout
        | ErrorType::TLSHandshakeTimedout => (504, "upstream_timeout", "the upstream timed out"),
        _ if matches!(e.esource(), ErrorSource::Upstream) => {
            (502, "upstream_error", "the upstream failed")
        }
        _ => (500, "error", "the request failed"),
    };
    p.label = label;
    if status == 0 || session.response_written().is_some() {
        return FailToProxy {
            error_code: 0,
            can_reuse_downstream: false,
        };
    }
    p.status = status;
    let code = match respond(session, status, text, None).await {
        Ok(()) => status,
        Err(_) => 0,
    };
    FailToProxy {
        error_code: code,
        can_reuse_downstream: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_key_is_the_header_else_the_client_address() {
        let by_ip = Balance::ConsistentHash { header: None };
        let by_user = Balance::ConsistentHash {
            header: Some("x-user".into()),
        };
        let client: Option<IpAddr> = Some("203.0.113.9".parse().expect("ip"));
        let mut h = http::HeaderMap::new();
        assert_eq!(hash_key(&by_ip, &h, client), b"203.0.113.9");
        assert_eq!(hash_key(&by_user, &h, client), b"203.0.113.9");
        h.insert("x-user", "u-1".parse().expect("value"));
        assert_eq!(hash_key(&by_user, &h, client), b"u-1");
        assert_eq!(hash_key(&by_ip, &h, None), b"");
        assert!(hash_key(&Balance::RoundRobin, &h, client).is_empty());
    }

    #[test]
    fn dot_segments_are_found_encoded_or_not() {
        for p in ["/ui/../x", "/ui/./x", "/ui/%2e%2E/x", "/ui/%2e/x", "/.."] {
            assert!(has_dot_segment(p), "{p}");
        }
        for p in ["/ui/", "/ui/a.b", "/ui/...", "/ui/.well-known/x"] {
            assert!(!has_dot_segment(p), "{p}");
        }
    }
}
