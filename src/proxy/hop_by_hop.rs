//! Owns which downstream headers may never travel to an upstream: the hop-by-hop fields of
//! RFC 9110 §7.6.1 (`Connection`, `Keep-Alive`, `Proxy-Connection`, `Proxy-Authenticate`,
//! `Proxy-Authorization`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`, and every field
//! the `Connection` header names) and the client's credentials for Sluice
//! (`Authorization`, `x-api-key`: a virtual key is Sluice's, never a provider's).
//!
//! The LLM endpoints build each upstream head from scratch (`providers::request_head`), so
//! none of these can pass there; a route that forwards the client's head (passthrough)
//! calls [`strip_request`] on it before anything goes upstream. Framing
//! (`Transfer-Encoding`, `Content-Length`) is then Pingora's to set for the upstream hop.

use http::header::{HeaderName, CONNECTION};
use pingora::http::{RequestHeader, ResponseHeader};

/// The hop-by-hop fields every message loses (lower case).
pub const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// The client credentials for Sluice, never forwarded (lower case).
pub const CLIENT_CREDENTIALS: [&str; 2] = ["authorization", "x-api-key"];

/// The field names listed in `Connection` values (comma-separated tokens), which are
/// hop-by-hop too.
fn named_in_connection(headers: &http::HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect()
}

/// Removes the hop-by-hop fields and the client's credentials from a request head about to
/// be forwarded upstream.
pub fn strip_request(req: &mut RequestHeader) {
    for name in named_in_connection(&req.headers) {
        req.remove_header(&name);
    }
    for name in HOP_BY_HOP.iter().chain(CLIENT_CREDENTIALS.iter()) {
        req.remove_header(*name);
    }
}

/// Removes the hop-by-hop fields from an upstream response head about to be forwarded to
/// the client (framing is then set for the downstream hop).
pub fn strip_response(resp: &mut ResponseHeader) {
    for name in named_in_connection(&resp.headers) {
        resp.remove_header(&name);
    }
    for name in HOP_BY_HOP {
        resp.remove_header(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_fields_and_credentials_are_removed_the_rest_kept() {
        let mut r = RequestHeader::build("POST", b"/x", None).unwrap();
        for (k, v) in [
            ("host", "a"),
            ("connection", "keep-alive, X-Secret-Hop"),
            ("x-secret-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-authorization", "Basic eA=="),
            ("te", "trailers"),
            ("trailer", "x-t"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("proxy-connection", "keep-alive"),
            ("authorization", "Bearer sk-virtual"),
            ("x-api-key", "sk-virtual"),
            ("x-end-to-end", "kept"),
        ] {
            r.append_header(k, v).unwrap();
        }
        strip_request(&mut r);
        let left: Vec<&str> = r.headers.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["host", "x-end-to-end"]);

        let mut resp = ResponseHeader::build(200, None).unwrap();
        resp.append_header("connection", "close, x-drop").unwrap();
        resp.append_header("x-drop", "1").unwrap();
        resp.append_header("content-type", "text/plain").unwrap();
        strip_response(&mut resp);
        let left: Vec<&str> = resp.headers.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["content-type"]);
    }
}
