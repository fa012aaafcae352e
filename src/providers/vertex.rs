//! Owns how Sluice addresses Google Vertex AI (`kind: vertex`): which dialect a model speaks
//! there, the publisher model URLs, and the body envelope of Claude models. The credential
//! is a service-account key exchanged for an OAuth2 access token
//! ([`super::google_auth`], cached and refreshed by [`super::token`]) and sent as
//! `Authorization: Bearer`.
//!
//! - **Claude** (an upstream model whose id starts with `claude`) speaks Anthropic Messages:
//!   `POST {base}/projects/{project}/locations/{region}/publishers/anthropic/models/{model}:rawPredict`,
//!   or `:streamRawPredict` for a stream (SSE, the body keeps `stream: true`). The body is
//!   the Messages body without `model` (the URL names it) and with `anthropic_version:
//!   "vertex-2023-10-16"` ([`ANTHROPIC_VERSION`]).
//!   <https://cloud.google.com/vertex-ai/generative-ai/docs/partner-models/claude/use-claude>
//! - **Gemini** (every other model) speaks the Gemini dialect ([`crate::protocol::gemini`]):
//!   `.../publishers/google/models/{model}:generateContent`, or
//!   `:streamGenerateContent?alt=sse`.
//!   <https://cloud.google.com/vertex-ai/docs/reference/rest/v1/projects.locations.publishers.models/generateContent>
//!
//! The default base URL is the regional endpoint `https://{region}-aiplatform.googleapis.com/v1`
//! (`https://aiplatform.googleapis.com/v1` for region `global`). Errors from Google's front
//! end (quota, credentials, unknown model) come in Google's error model
//! (`{"error":{"code","message","status"}}`, <https://cloud.google.com/apis/design/errors>),
//! errors from Claude itself in Anthropic's; the protocol layer reads both.

use std::borrow::Cow;

use pingora::http::RequestHeader;

use super::adapter::{Adapter, Credential};
use super::google_auth::ServiceAccountFetcher;
use super::token::TokenCache;
use crate::config::kinds::push_segment;
pub use crate::config::vertex::{default_base_url, valid_name, VertexAccount};
use crate::config::Provider;
use crate::protocol::{ModelPlacement, UpstreamDialect};

/// The `anthropic_version` body member Claude on Vertex AI requires.
pub const ANTHROPIC_VERSION: &str = "vertex-2023-10-16";

/// Whether Vertex AI serves `model` as an Anthropic publisher model (Claude).
pub fn is_claude(model: &str) -> bool {
    model.starts_with("claude")
}

/// The wire dialect of `model` on Vertex AI: Messages for Claude, Gemini otherwise.
pub fn dialect(model: &str) -> UpstreamDialect {
    if is_claude(model) {
        UpstreamDialect::Messages
    } else {
        UpstreamDialect::Gemini
    }
}

/// Where the request body names the model: Claude's body takes `anthropic_version` instead
/// of `model` (the URL names it); a Gemini body never names it.
pub fn model_placement(model: &str) -> ModelPlacement {
    if is_claude(model) {
        ModelPlacement::Path {
            anthropic_version: ANTHROPIC_VERSION,
            dropped: &[],
        }
    } else {
        ModelPlacement::Body
    }
}

/// The method path of `model` under the base URL (see the module doc), the model
/// percent-encoded as one path segment (`@` kept).
pub fn method_path(account: &VertexAccount, model: &str, stream: bool) -> String {
    let (publisher, method) = match (is_claude(model), stream) {
        (true, false) => ("anthropic", ":rawPredict"),
        (true, true) => ("anthropic", ":streamRawPredict"),
        (false, false) => ("google", ":generateContent"),
        (false, true) => ("google", ":streamGenerateContent?alt=sse"),
    };
    let mut p = String::with_capacity(96 + model.len());
    p.push_str("/projects/");
    push_segment(&mut p, &account.project);
    p.push_str("/locations/");
    push_segment(&mut p, &account.region);
    p.push_str("/publishers/");
    p.push_str(publisher);
    p.push_str("/models/");
    // `@` (a Claude version, `claude-sonnet-4-5@20250929`) stays literal, as Google writes it.
    for (i, piece) in model.split('@').enumerate() {
        if i > 0 {
            p.push('@');
        }
        push_segment(&mut p, piece);
    }
    p.push_str(method);
    p
}

/// The adapter of `kind: vertex`: Claude models in Messages (the model in the URL, the
/// `anthropic-beta` header taken), the others in the Gemini dialect, under the project and
/// region; the credential is a bearer token from the service-account key, cached and
/// refreshed in the background ([`super::token::TokenCache`]).
#[derive(Debug)]
pub struct Vertex;

impl Adapter for Vertex {
    fn base_dialect(&self) -> UpstreamDialect {
        UpstreamDialect::Gemini
    }

    fn dialect(&self, upstream_model: &str) -> UpstreamDialect {
        dialect(upstream_model)
    }

    fn path(&self, provider: &Provider, upstream_model: &str, stream: bool) -> Cow<'static, str> {
        match &provider.vertex {
            Some(account) => method_path(account, upstream_model, stream).into(),
            None => "/".into(),
        }
    }

    fn placement(&self, upstream_model: &str) -> ModelPlacement {
        model_placement(upstream_model)
    }

    /// One cache per account (see [`crate::config::vertex::TokenSource::cache_key`]): the
    /// same key at the same endpoint keeps its token, and its refresh task, across reloads.
    fn credential(&self, provider: &Provider) -> Credential {
        let Some(src) = &provider.token_source else {
            return Credential::None;
        };
        let (connect, first_byte) = (provider.timeouts.connect, provider.timeouts.first_byte);
        Credential::Token(TokenCache::shared(&src.cache_key, || {
            TokenCache::new(
                &provider.id,
                Box::new(ServiceAccountFetcher::new(
                    src.account.clone(),
                    src.url.clone(),
                    src.endpoint.clone(),
                    src.path.clone(),
                    connect,
                )),
                connect + first_byte,
            )
        }))
    }

    /// Nothing here: the bearer token comes with the [`super::Target`]
    /// ([`super::Target::apply_bearer`]).
    fn authorize(
        &self,
        _: &Provider,
        _: &Credential,
        _: &mut RequestHeader,
        _: &[u8],
    ) -> pingora::Result<()> {
        Ok(())
    }

    fn takes_beta_header(&self, upstream_model: &str) -> bool {
        is_claude(upstream_model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    #[test]
    fn claude_bodies_name_the_version_not_the_model() {
        let placement = model_placement("claude-sonnet-4-6");
        assert_eq!(
            placement,
            ModelPlacement::Path {
                anthropic_version: "vertex-2023-10-16",
                dropped: &[],
            }
        );
        assert_eq!(model_placement("gemini-2.5-pro"), ModelPlacement::Body);
        // As the client sent it (a Messages client)…
        let client: Value = json!({"model": "acme/claude", "anthropic_version": "x",
            "stream": true, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
        let out = super::super::passthrough_body_placed(
            client.as_object().expect("object"),
            "claude-sonnet-4-6",
            false,
            placement,
        )
        .expect("body");
        let v: Value = serde_json::from_slice(&out).expect("JSON");
        assert!(v.get("model").is_none(), "{v}");
        assert_eq!(v["anthropic_version"], ANTHROPIC_VERSION, "{v}");
        assert_eq!(v["stream"], true, "{v}");
        // …or translated from another client API.
        let canonical = crate::protocol::decode_request(
            crate::protocol::ClientDialect::ChatCompletions,
            br#"{"model":"acme/claude","messages":[{"role":"user","content":"hi"}]}"#,
        )
        .expect("request");
        let opts = crate::protocol::UpstreamOptions {
            model: "claude-sonnet-4-6",
            default_max_tokens: 64,
            stream_usage: true,
            placement,
            thinking: None,
        };
        let out = crate::protocol::encode_request(UpstreamDialect::Messages, &canonical, &opts)
            .expect("encoded");
        let v: Value = serde_json::from_slice(&out).expect("JSON");
        assert!(v.get("model").is_none(), "{v}");
        assert_eq!(v["anthropic_version"], ANTHROPIC_VERSION, "{v}");
        assert_eq!(v["max_tokens"], 64, "{v}");
    }

    #[test]
    fn googles_platform_errors_are_read_for_claude_too() {
        let (kind, message) = crate::protocol::decode_error_body(
            UpstreamDialect::Messages,
            429,
            br#"{"error":{"code":429,"message":"Quota exceeded for aiplatform.googleapis.com/online_prediction_requests_per_base_model","status":"RESOURCE_EXHAUSTED"}}"#,
        );
        assert_eq!(kind, crate::protocol::ErrorKind::RateLimit);
        assert!(message.starts_with("Quota exceeded"), "{message}");
        let (kind, _) = crate::protocol::decode_error_body(
            UpstreamDialect::Messages,
            400,
            br#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: Field required"}}"#,
        );
        assert_eq!(kind, crate::protocol::ErrorKind::InvalidRequest);
    }

    #[test]
    fn claude_and_gemini_addresses() {
        let a = VertexAccount {
            project: "my-project".into(),
            region: "us-central1".into(),
        };
        assert_eq!(
            method_path(&a, "claude-sonnet-4-6", false),
            "/projects/my-project/locations/us-central1/publishers/anthropic/models/claude-sonnet-4-6:rawPredict"
        );
        assert_eq!(
            method_path(&a, "claude-sonnet-4-6@20250929", true),
            "/projects/my-project/locations/us-central1/publishers/anthropic/models/claude-sonnet-4-6@20250929:streamRawPredict"
        );
        assert_eq!(
            method_path(&a, "gemini-2.5-pro", true),
            "/projects/my-project/locations/us-central1/publishers/google/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
        );
        assert_eq!(
            method_path(&a, "gemini-2.5-pro", false),
            "/projects/my-project/locations/us-central1/publishers/google/models/gemini-2.5-pro:generateContent"
        );
        assert_eq!(dialect("claude-opus-4-1"), UpstreamDialect::Messages);
        assert_eq!(dialect("gemini-2.5-flash"), UpstreamDialect::Gemini);
        assert_eq!(
            default_base_url("europe-west4"),
            "https://europe-west4-aiplatform.googleapis.com/v1"
        );
        assert_eq!(
            default_base_url("global"),
            "https://aiplatform.googleapis.com/v1"
        );
        assert!(valid_name("us-central1"));
        assert!(!valid_name("US"));
        assert!(!valid_name("a/b"));
        assert!(!valid_name(""));
    }
}
