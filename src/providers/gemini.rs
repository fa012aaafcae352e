//! Owns how Sluice addresses the Gemini API (`kind: gemini`): the model method URLs
//! (`/models/{model}:generateContent`, `/models/{model}:streamGenerateContent?alt=sse`), the
//! `x-goog-api-key` header, and telling a rejected key from a bad request (Google answers an
//! invalid key with 400 `INVALID_ARGUMENT`, reason `API_KEY_INVALID`). The wire format is
//! the protocol layer's [`crate::protocol::gemini`] dialect, which Vertex AI's Gemini
//! models share (only the address and the credential differ there).
//!
//! References: <https://ai.google.dev/api/generate-content> (methods, `alt=sse`),
//! <https://ai.google.dev/gemini-api/docs/api-key> (`x-goog-api-key`),
//! <https://ai.google.dev/gemini-api/docs/troubleshooting> and
//! <https://cloud.google.com/apis/design/errors> (error model, `ErrorInfo.reason`).

use std::borrow::Cow;

use pingora::http::RequestHeader;

use super::adapter::{Adapter, Credential};
use crate::config::kinds::push_segment;
use crate::config::Provider;
use crate::protocol::UpstreamDialect;

/// The default `base_url` of `kind: gemini`.
pub const DEFAULT_BASE_URL: &str = crate::config::kinds::GEMINI_BASE_URL;

/// The request header carrying a Gemini API key.
pub const API_KEY_HEADER: &str = "x-goog-api-key";

/// The method path for `model` under the base URL: `:streamGenerateContent?alt=sse` (each
/// SSE `data:` one `GenerateContentResponse`) for a stream, `:generateContent` otherwise.
/// A leading `models/` in the configured model is accepted (Google's resource name).
pub fn method_path(model: &str, stream: bool) -> String {
    let model = model.strip_prefix("models/").unwrap_or(model);
    let mut p = String::with_capacity(48 + model.len());
    p.push_str("/models/");
    push_segment(&mut p, model);
    p.push_str(if stream {
        ":streamGenerateContent?alt=sse"
    } else {
        ":generateContent"
    });
    p
}

/// Whether an error body says the API key was rejected (`ErrorInfo.reason`
/// `API_KEY_INVALID`, which Google sends with HTTP 400): the gateway's credential, not the
/// client's request, so it is treated as a 401.
pub fn key_rejected(body: &[u8]) -> bool {
    memchr::memmem::find(body, b"API_KEY_INVALID").is_some()
}

/// The adapter of `kind: gemini`: the Gemini dialect at the model's method, the key in
/// `x-goog-api-key`; a rejected key (400 `API_KEY_INVALID`) counts as a 401.
#[derive(Debug)]
pub struct Gemini;

impl Adapter for Gemini {
    fn base_dialect(&self) -> UpstreamDialect {
        UpstreamDialect::Gemini
    }

    fn path(&self, _: &Provider, upstream_model: &str, stream: bool) -> Cow<'static, str> {
        method_path(upstream_model, stream).into()
    }

    fn authorize(
        &self,
        provider: &Provider,
        _: &Credential,
        req: &mut RequestHeader,
        _: &[u8],
    ) -> pingora::Result<()> {
        if let Some(k) = &provider.api_key {
            req.insert_header(API_KEY_HEADER, k.expose())?;
        }
        Ok(())
    }

    fn error_status(&self, status: u16, body: &[u8]) -> u16 {
        if status == 400 && key_rejected(body) {
            401
        } else {
            status
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_paths() {
        assert_eq!(
            method_path("gemini-2.5-flash", true),
            "/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
        );
        assert_eq!(
            method_path("models/gemini-2.5-pro", false),
            "/models/gemini-2.5-pro:generateContent"
        );
        assert!(key_rejected(
            br#"{"error":{"code":400,"status":"INVALID_ARGUMENT","details":[{"reason":"API_KEY_INVALID"}]}}"#
        ));
        assert!(!key_rejected(br#"{"error":{"code":400}}"#));
    }

    #[test]
    fn base_url_defaults_to_the_gemini_api() {
        let c = super::super::azure::tests::config("    kind: gemini\n    api_key: k\n")
            .expect("valid");
        let p = &c.providers["p"];
        let ep = p.endpoint.as_ref().expect("endpoint");
        assert_eq!(
            (ep.host.as_str(), ep.port, ep.tls, ep.base_path.as_str()),
            ("generativelanguage.googleapis.com", 443, true, "/v1beta")
        );
        assert_eq!(
            p.health_check.as_ref().map(|h| h.path.as_str()),
            Some("/models")
        );
        assert_eq!(
            super::super::request_path(p, "gemini-2.5-pro", false),
            "/models/gemini-2.5-pro:generateContent"
        );
    }
}
