//! Owns authenticating a request: extracting the virtual key a client presents
//! (`Authorization: Bearer …` or `x-api-key`). The key table it is checked against is the
//! config snapshot's ([`crate::config::keys`], re-exported here): config never depends on
//! auth, so the arrow points down the request path (auth → config).

pub use crate::config::keys::{hash_key, Caller, KeyTable};

/// Extracts the presented key from `Authorization: Bearer <key>` or `x-api-key: <key>`.
pub fn presented_key(authorization: Option<&[u8]>, x_api_key: Option<&[u8]>) -> Option<String> {
    if let Some(v) = authorization.and_then(|v| std::str::from_utf8(v).ok()) {
        let v = v.trim();
        // The scheme is case-insensitive (RFC 9110 11.1); `Bearer` alone carries no token.
        let token = match v.split_once(|c: char| c.is_ascii_whitespace()) {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("bearer") => rest.trim(),
            None if v.eq_ignore_ascii_case("bearer") => "",
            _ => v,
        };
        if !token.is_empty() {
            return Some(token.to_string());
        }
    }
    x_api_key
        .and_then(|v| std::str::from_utf8(v).ok())
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extracts_bearer_or_x_api_key() {
        assert_eq!(
            presented_key(Some(b"Bearer sk-1"), None).as_deref(),
            Some("sk-1")
        );
        assert_eq!(presented_key(None, Some(b"sk-2")).as_deref(), Some("sk-2"));
        assert_eq!(
            presented_key(Some(b"Bearer "), Some(b"sk-3")).as_deref(),
            Some("sk-3")
        );
        assert_eq!(presented_key(None, None), None);
        assert_eq!(
            presented_key(Some(b"BEARER  sk-4 "), None).as_deref(),
            Some("sk-4")
        );
        assert_eq!(presented_key(Some(b"bearer"), None), None);
    }
}
