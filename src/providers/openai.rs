//! Owns the OpenAI Chat Completions wire format on the upstream side
//! (<https://platform.openai.com/docs/api-reference/chat/create>): its endpoint path (and the
//! Responses endpoint's, for a route with `api: responses`), and
//! reading an OpenAI-shaped error body
//! (<https://platform.openai.com/docs/guides/error-codes>).

use std::borrow::Cow;

use pingora::http::RequestHeader;

use super::adapter::{Adapter, Credential};
use crate::config::Provider;
use crate::protocol::UpstreamDialect;

/// Path of the endpoint under the base URL.
pub const CHAT_COMPLETIONS_PATH: &str = "/chat/completions";

/// Path of the Responses endpoint under the base URL
/// (<https://platform.openai.com/docs/api-reference/responses/create>), for a route with
/// `api: responses`.
pub const RESPONSES_PATH: &str = "/responses";

/// Extracts `(type, code, message)` from an upstream error body in OpenAI's shape
/// (`{"error":{"message","type","code"}}`), or a plain-text/other-JSON body. The shape is
/// the Chat Completions dialect's: [`crate::protocol::chat::error_parts`].
pub fn error_parts(status: u16, body: &[u8]) -> (String, Option<String>, String) {
    crate::protocol::chat::error_parts(status, body)
}

/// The OpenAI error type for a status ([`crate::protocol::chat::default_type`]).
pub fn default_type(status: u16) -> &'static str {
    crate::protocol::chat::default_type(status)
}

/// The adapter of `kind: openai`: OpenAI-compatible Chat Completions, `Authorization:
/// Bearer` with the provider key.
#[derive(Debug)]
pub struct OpenAi;

impl Adapter for OpenAi {
    fn base_dialect(&self) -> UpstreamDialect {
        UpstreamDialect::ChatCompletions
    }

    fn path(&self, _: &Provider, _: &str, _: bool) -> Cow<'static, str> {
        CHAT_COMPLETIONS_PATH.into()
    }

    fn responses_path(&self, _: &Provider) -> Option<Cow<'static, str>> {
        Some(RESPONSES_PATH.into())
    }

    fn authorize(
        &self,
        provider: &Provider,
        _: &Credential,
        req: &mut RequestHeader,
        _: &[u8],
    ) -> pingora::Result<()> {
        authorize_bearer(provider, req)
    }
}

/// `Authorization: Bearer` with the provider key, when it has one.
///
/// # Errors
/// If the key is not a valid header value.
pub fn authorize_bearer(provider: &Provider, req: &mut RequestHeader) -> pingora::Result<()> {
    if let Some(k) = &provider.api_key {
        req.insert_header("authorization", format!("Bearer {}", k.expose()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config whose one route (`models.m.routes[0]`) goes to a provider of `kind` (its
    /// `extra` lines) with `api`.
    fn route_config(
        kind: &str,
        extra: &str,
        api: &str,
    ) -> Result<crate::config::Config, crate::config::ConfigError> {
        let yaml = format!(
            "tenants:\n  t: {{}}\nvirtual_keys:\n  - key: sk-sluice-api-00001\n    tenant: t\nproviders:\n  p:\n    kind: {kind}\n    base_url: http://127.0.0.1:9/v1\n{extra}models:\n  m:\n    routes:\n      - provider: p\n        upstream_model: u\n        api: {api}\n"
        );
        crate::config::Config::parse(std::path::Path::new("sluice.yaml"), &yaml)
    }

    #[test]
    fn a_route_chooses_responses_on_openai_and_azure_and_nowhere_else() {
        use crate::protocol::UpstreamDialect;
        let c = route_config("openai", "", "responses").expect("openai");
        let r = &c.models["m"].routes[0];
        assert_eq!(r.dialect(), UpstreamDialect::Responses);
        assert_eq!(r.path(true), RESPONSES_PATH);
        let c = route_config("openai", "", "chat_completions").expect("openai");
        let r = &c.models["m"].routes[0];
        assert_eq!(r.dialect(), UpstreamDialect::ChatCompletions);
        assert_eq!(r.path(false), CHAT_COMPLETIONS_PATH);
        let c = route_config(
            "azure_openai",
            "    api_version: \"2024-10-21\"\n",
            "responses",
        )
        .expect("azure");
        let r = &c.models["m"].routes[0];
        assert_eq!(r.dialect(), UpstreamDialect::Responses);
        assert_eq!(r.path(true), "/openai/v1/responses");
        for (kind, extra) in [("anthropic", ""), ("gemini", "")] {
            let e = route_config(kind, extra, "responses").expect_err(kind);
            assert_eq!(e.key_path, "models.m.routes[0].api", "{kind}: {e}");
            assert_eq!(e.line, Some(13), "{kind}: the route's line: {e}");
            assert!(e.message.contains("openai"), "{kind}: {e}");
        }
        // Chat Completions is every OpenAI route's default, and any kind may say it.
        assert!(route_config("anthropic", "", "chat_completions").is_ok());
    }

    #[test]
    fn the_responses_side_endpoints_go_to_a_responses_route_with_the_owned_members_changed() {
        use crate::providers::{responses_endpoint_body, ResponsesEndpoint};
        let c = route_config("openai", "", "responses").expect("openai");
        let r = &c.models["m"].routes[0];
        assert_eq!(
            r.responses_endpoint_path(ResponsesEndpoint::InputTokens)
                .as_deref(),
            Some("/responses/input_tokens")
        );
        assert_eq!(
            r.responses_endpoint_path(ResponsesEndpoint::Compact)
                .as_deref(),
            Some("/responses/compact")
        );
        let az = route_config(
            "azure_openai",
            "    api_version: \"2024-10-21\"\n",
            "responses",
        )
        .expect("azure");
        assert_eq!(
            az.models["m"].routes[0]
                .responses_endpoint_path(ResponsesEndpoint::Compact)
                .as_deref(),
            Some("/openai/v1/responses/compact")
        );
        let chat = route_config("openai", "", "chat_completions").expect("chat");
        assert_eq!(
            chat.models["m"].routes[0].responses_endpoint_path(ResponsesEndpoint::InputTokens),
            None,
            "a Chat Completions route answers locally"
        );
        let body = serde_json::json!({"model": "m", "input": "hi", "previous_response_id": "resp_1",
            "provider": {"only": ["p"]}, "instructions": "be brief", "x_new": 1});
        let out = responses_endpoint_body(r, body.as_object().expect("object")).expect("body");
        let got: serde_json::Value = serde_json::from_slice(&out).expect("JSON");
        assert_eq!(
            got,
            serde_json::json!({"model": "u", "input": "hi", "instructions": "be brief", "x_new": 1})
        );
    }

    #[test]
    fn error_shapes() {
        let (t, c, m) = error_parts(429, br#"{"error":{"message":"slow down","type":"rate_limit_error","code":"rate_limit_exceeded"}}"#);
        assert_eq!(
            (t.as_str(), c.as_deref(), m.as_str()),
            ("rate_limit_error", Some("rate_limit_exceeded"), "slow down")
        );
        let (t, c, m) = error_parts(502, b"Bad Gateway");
        assert_eq!(
            (t.as_str(), c, m.as_str()),
            ("api_error", None, "upstream returned HTTP 502: Bad Gateway")
        );
    }
}
