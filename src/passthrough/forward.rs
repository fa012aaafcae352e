//! Owns the forwarding headers a passthrough upstream receives, as Nginx's usual
//! `proxy_set_header` lines set them:
//!
//! - `X-Forwarded-For`: the client's own list (all its lines joined) with the peer IP
//!   appended (`$proxy_add_x_forwarded_for`);
//! - `Forwarded` (RFC 7239): the client's elements with `for=<peer>;host=<host>;proto=<proto>`
//!   appended (IPv6 and values that are not tokens quoted, §6);
//! - `X-Forwarded-Proto`: `http` or `https`, the downstream connection's (replacing the
//!   client's);
//! - `X-Forwarded-Host`: the request's `Host` (replacing the client's).
//!
//! The appended address is the TCP peer's, also behind a trusted proxy (RFC 7239 §5.2: each
//! proxy appends the address it received the request from, so the chain keeps the proxy's
//! hop and the client it named stays left of it). What the client sent before it is its own
//! claim and is passed on as such (the upstream trusts only the last element, which Sluice
//! added). The client address Sluice itself believes (`server.trusted_proxies`) is what
//! consistent hashing uses, see [`super::serve`].

use std::net::IpAddr;

use pingora::http::RequestHeader;

/// The field lines `existing` (of a list-valued header, in order) joined by `, `, each
/// trimmed and empty ones skipped, with a trailing `, ` when anything was written: the start
/// of a list the caller appends its own element to.
fn list_prefix<'a>(existing: impl Iterator<Item = &'a [u8]>) -> String {
    let mut out = String::new();
    for v in existing {
        let v = String::from_utf8_lossy(v);
        let v = v.trim();
        if !v.is_empty() {
            out.push_str(v);
            out.push_str(", ");
        }
    }
    out
}

/// The `X-Forwarded-For` value: `existing` (the client's lines, in order) joined by `, `,
/// then `peer`.
pub fn x_forwarded_for<'a>(existing: impl Iterator<Item = &'a [u8]>, peer: IpAddr) -> String {
    let mut out = list_prefix(existing);
    out.push_str(&peer.to_string());
    out
}

/// Whether `v` is an RFC 7230 token (a `Forwarded` value that needs no quotes).
fn is_token(v: &str) -> bool {
    !v.is_empty()
        && v.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'!' | b'#'
                        | b'$'
                        | b'%'
                        | b'&'
                        | b'\''
                        | b'*'
                        | b'+'
                        | b'-'
                        | b'.'
                        | b'^'
                        | b'_'
                        | b'`'
                        | b'|'
                        | b'~'
                )
        })
}

/// `v` as a `Forwarded` value: itself when a token, else a quoted string.
fn value(v: &str) -> String {
    if is_token(v) {
        v.to_string()
    } else {
        let mut q = String::with_capacity(v.len() + 2);
        q.push('"');
        for c in v.chars().filter(|c| !c.is_control()) {
            if c == '"' || c == '\\' {
                q.push('\\');
            }
            q.push(c);
        }
        q.push('"');
        q
    }
}

/// The `Forwarded` value: `existing` (the client's lines) joined by `, `, then this hop's
/// element `for=...;host=...;proto=...`.
pub fn forwarded<'a>(
    existing: impl Iterator<Item = &'a [u8]>,
    peer: IpAddr,
    host: Option<&str>,
    proto: &str,
) -> String {
    let mut out = list_prefix(existing);
    out.push_str("for=");
    match peer {
        IpAddr::V4(a) => out.push_str(&a.to_string()),
        IpAddr::V6(a) => out.push_str(&format!("\"[{a}]\"")),
    }
    if let Some(h) = host {
        out.push_str(";host=");
        out.push_str(&value(h));
    }
    out.push_str(";proto=");
    out.push_str(proto);
    out
}

/// Sets the four forwarding headers on the upstream request `req` for a client at `peer`
/// (`None`: a Unix-socket peer, which adds no address) on a `proto` (`http`/`https`)
/// connection; `host` is the request's `Host` as the client sent it.
///
/// # Errors
/// When a value cannot be a header (it is built from header values, so only for
/// malformed input Pingora let through).
pub fn apply(
    req: &mut RequestHeader,
    peer: Option<IpAddr>,
    host: Option<&str>,
    proto: &'static str,
) -> pingora::Result<()> {
    if let Some(ip) = peer {
        let xff = x_forwarded_for(
            req.headers
                .get_all("x-forwarded-for")
                .iter()
                .map(|v| v.as_bytes()),
            ip,
        );
        let fwd = forwarded(
            req.headers
                .get_all("forwarded")
                .iter()
                .map(|v| v.as_bytes()),
            ip,
            host,
            proto,
        );
        req.insert_header("x-forwarded-for", xff)?;
        req.insert_header("forwarded", fwd)?;
    }
    req.insert_header("x-forwarded-proto", proto)?;
    match host {
        Some(h) => req.insert_header("x-forwarded-host", h)?,
        None => {
            req.remove_header("x-forwarded-host");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peer_is_appended_to_what_the_client_sent() {
        let ip: IpAddr = "127.0.0.1".parse().expect("ip");
        assert_eq!(x_forwarded_for(std::iter::empty(), ip), "127.0.0.1");
        let lines: [&[u8]; 2] = [b"203.0.113.7", b" 10.0.0.1 "];
        assert_eq!(
            x_forwarded_for(lines.into_iter(), ip),
            "203.0.113.7, 10.0.0.1, 127.0.0.1"
        );
    }

    #[test]
    fn forwarded_quotes_v6_and_non_token_hosts() {
        let v6: IpAddr = "::1".parse().expect("ip");
        assert_eq!(
            forwarded(std::iter::empty(), v6, Some("ui.example.com:8080"), "https"),
            "for=\"[::1]\";host=\"ui.example.com:8080\";proto=https"
        );
        let v4: IpAddr = "192.0.2.1".parse().expect("ip");
        let lines: [&[u8]; 1] = [b"for=198.51.100.2"];
        assert_eq!(
            forwarded(lines.into_iter(), v4, Some("ui"), "http"),
            "for=198.51.100.2, for=192.0.2.1;host=ui;proto=http"
        );
        assert_eq!(
            forwarded(std::iter::empty(), v4, Some("a\"b"), "http"),
            "for=192.0.2.1;host=\"a\\\"b\";proto=http"
        );
    }

    #[test]
    fn apply_replaces_proto_and_host_and_appends_the_lists() {
        let mut req = RequestHeader::build("GET", b"/ui/", None).expect("req");
        req.append_header("x-forwarded-for", "1.2.3.4").expect("h");
        req.append_header("x-forwarded-proto", "https").expect("h");
        req.append_header("x-forwarded-host", "evil").expect("h");
        apply(
            &mut req,
            Some("127.0.0.1".parse().expect("ip")),
            Some("ui.example.com"),
            "http",
        )
        .expect("apply");
        let h = |n: &str| {
            req.headers
                .get(n)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        assert_eq!(h("x-forwarded-for").as_deref(), Some("1.2.3.4, 127.0.0.1"));
        assert_eq!(h("x-forwarded-proto").as_deref(), Some("http"));
        assert_eq!(h("x-forwarded-host").as_deref(), Some("ui.example.com"));
        assert_eq!(
            h("forwarded").as_deref(),
            Some("for=127.0.0.1;host=ui.example.com;proto=http")
        );
    }
}
