//! Owns the opening handshake of a WebSocket on `GET /v1/responses` (RFC 6455 §4.2): which
//! upgrade requests are acceptable, and the `101 Switching Protocols` head that accepts one.
//! Authentication, the 426 of a disabled mode and every other refusal are the caller's
//! ([`super::serve`]); this module only reads and builds heads.

use pingora::http::{RequestHeader, ResponseHeader};

use crate::error::GatewayError;

/// The only protocol version RFC 6455 defines (`Sec-WebSocket-Version: 13`).
pub const VERSION: &str = "13";

/// Whether `req` asks for a WebSocket (`Upgrade: websocket`, any case).
pub fn wants_websocket(req: &RequestHeader) -> bool {
    req.headers
        .get("upgrade")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"))
}

/// Whether a comma-separated header holds `token` (case-insensitive), as `Connection:
/// keep-alive, Upgrade` does.
fn has_token(req: &RequestHeader, name: &str, token: &str) -> bool {
    req.headers.get_all(name).iter().any(|v| {
        v.to_str()
            .is_ok_and(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    })
}

/// Checks an upgrade request against RFC 6455 §4.2.1 and returns its `Sec-WebSocket-Key`.
///
/// # Errors
/// 400 (`invalid_request_error`, naming the header) for a method other than `GET`, a
/// `Connection` without `upgrade`, or a missing or malformed key (it must be the base64 of
/// 16 bytes); 426 for a `Sec-WebSocket-Version` other than 13 (the answer then carries
/// `Sec-WebSocket-Version: 13`, and OpenAI's clients fall back to HTTP).
pub fn check(req: &RequestHeader) -> Result<String, GatewayError> {
    if req.method != http::Method::GET {
        return Err(GatewayError::invalid(
            format!(
                "a WebSocket upgrade must be a GET request, not {}",
                req.method
            ),
            None,
        ));
    }
    if !has_token(req, "connection", "upgrade") {
        return Err(GatewayError::invalid(
            "a WebSocket upgrade needs `Connection: Upgrade`",
            Some("connection"),
        ));
    }
    let version = req
        .headers
        .get("sec-websocket-version")
        .map(|v| v.as_bytes());
    if version != Some(VERSION.as_bytes()) {
        return Err(GatewayError::UpgradeRequired(
            "only WebSocket version 13 is served (`Sec-WebSocket-Version: 13`)".into(),
        ));
    }
    let key = req
        .headers
        .get("sec-websocket-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .unwrap_or_default();
    // The key is the base64 of 16 random bytes: 24 characters ending in `==`.
    let well_formed = key.len() == 24
        && key.ends_with("==")
        && key[..22]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/');
    if !well_formed {
        return Err(GatewayError::invalid(
            "a WebSocket upgrade needs a `Sec-WebSocket-Key` (the base64 of 16 bytes)",
            Some("sec-websocket-key"),
        ));
    }
    Ok(key.to_string())
}

/// The `101 Switching Protocols` head accepting a handshake whose key is `key`:
/// `Upgrade: websocket`, `Connection: Upgrade` and `Sec-WebSocket-Accept` (the base64 SHA-1
/// of the key and RFC 6455's GUID), plus `x-request-id`.
///
/// # Errors
/// Only if a header cannot be built (never with the values used here).
pub fn accept_head(key: &str, request_id: &str) -> pingora::Result<ResponseHeader> {
    let mut h = ResponseHeader::build(101, Some(4))?;
    h.insert_header("upgrade", "websocket")?;
    h.insert_header("connection", "Upgrade")?;
    h.insert_header(
        "sec-websocket-accept",
        tungstenite::handshake::derive_accept_key(key.as_bytes()),
    )?;
    h.insert_header("x-request-id", request_id)?;
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: &str, headers: &[(&str, &str)]) -> RequestHeader {
        let mut r = RequestHeader::build(method, b"/v1/responses", None).unwrap();
        for (k, v) in headers {
            r.append_header(k.to_string(), *v).unwrap();
        }
        r
    }

    const GOOD: [(&str, &str); 4] = [
        ("upgrade", "websocket"),
        ("connection", "keep-alive, Upgrade"),
        ("sec-websocket-version", "13"),
        ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
    ];

    #[test]
    fn the_rfc_example_key_gets_the_rfc_accept_value() {
        let key = check(&req("GET", &GOOD)).unwrap();
        let head = accept_head(&key, "r1").unwrap();
        assert_eq!(head.status, 101);
        // RFC 6455 §1.3's worked example.
        assert_eq!(
            head.headers["sec-websocket-accept"],
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
        assert!(wants_websocket(&req("GET", &GOOD)));
    }

    #[test]
    fn malformed_handshakes_are_refused_with_the_header_named() {
        let without = |name: &str| {
            let h: Vec<(&str, &str)> = GOOD.iter().copied().filter(|(k, _)| *k != name).collect();
            check(&req("GET", &h)).unwrap_err()
        };
        assert_eq!(without("connection").status(), 400);
        assert_eq!(without("sec-websocket-key").status(), 400);
        assert_eq!(without("sec-websocket-version").status(), 426);
        assert_eq!(check(&req("POST", &GOOD)).unwrap_err().status(), 400);
        let mut bad_key = GOOD;
        bad_key[3] = ("sec-websocket-key", "short");
        assert_eq!(check(&req("GET", &bad_key)).unwrap_err().status(), 400);
        let mut v8 = GOOD;
        v8[2] = ("sec-websocket-version", "8");
        assert_eq!(check(&req("GET", &v8)).unwrap_err().status(), 426);
    }
}
