//! Owns the [`Adapter`] trait: everything one provider kind does at run time, behind one
//! seam. A kind is its upstream dialect per model, the request path, where the body names
//! the model, the credential it signs with, the client headers it takes, how its error
//! answers read and how its stream is framed. Each kind implements it in its own file
//! (`openai.rs`, `anthropic.rs`, `azure.rs`, `gemini.rs`, `vertex.rs`, `bedrock/`,
//! `demo.rs`) and registers it in `providers::adapter`; the provider registry
//! ([`super::registry::Registry`]) resolves it once per provider at load, with the
//! provider's live credential.

use std::borrow::Cow;
use std::sync::Arc;

use pingora::connectors::L4Connect;
use pingora::http::RequestHeader;

use super::bedrock::eventstream::EventStreamDecoder;
use crate::config::Provider;
use crate::protocol::{ModelPlacement, UpstreamDialect};

/// What one provider kind does at run time. The defaults are an SSE provider that names
/// the model in the body, takes no client header and whose error answers read as its
/// dialect's.
pub trait Adapter: Send + Sync + std::fmt::Debug {
    /// The kind's own dialect: the one [`Adapter::dialect`] answers for a model with no
    /// dialect of its own.
    fn base_dialect(&self) -> UpstreamDialect;

    /// The wire API the provider serves `upstream_model` in.
    fn dialect(&self, upstream_model: &str) -> UpstreamDialect {
        let _ = upstream_model;
        self.base_dialect()
    }

    /// The path (and query) of the inference endpoint for one request, appended to the
    /// base path.
    fn path(&self, provider: &Provider, upstream_model: &str, stream: bool) -> Cow<'static, str>;

    /// The path (and query) of the provider's OpenAI Responses endpoint, for a route that
    /// chose it (`routes[].api: responses`); `None` for a kind without one (the config
    /// refuses the choice there).
    fn responses_path(&self, provider: &Provider) -> Option<Cow<'static, str>> {
        let _ = provider;
        None
    }

    /// Where a request body for `upstream_model` names the model, and so its shape.
    fn placement(&self, upstream_model: &str) -> ModelPlacement {
        let _ = upstream_model;
        ModelPlacement::Body
    }

    /// The `Accept` of a streamed request (the provider's stream media type).
    fn stream_accept(&self) -> &'static str {
        "text/event-stream"
    }

    /// The live credential of `provider`, built once per provider when the registry is
    /// (a SigV4 signer, a token cache); [`Credential::None`] for a static key or none.
    fn credential(&self, provider: &Provider) -> Credential {
        let _ = provider;
        Credential::None
    }

    /// Adds the provider's credential to a request whose body is `body` (the exact bytes
    /// sent; empty for a `GET`). Runs after every other header is set (a signature covers
    /// the headers before it).
    ///
    /// # Errors
    /// If the key is not a valid header value, or the request cannot be signed.
    fn authorize(
        &self,
        provider: &Provider,
        credential: &Credential,
        req: &mut RequestHeader,
        body: &[u8],
    ) -> pingora::Result<()>;

    /// Whether a request for `upstream_model` takes the client's `anthropic-beta` header.
    fn takes_beta_header(&self, upstream_model: &str) -> bool {
        let _ = upstream_model;
        false
    }

    /// The request body with the client's `anthropic-beta` opt-ins, for a kind that takes
    /// them in the body; `body` as is for every other.
    ///
    /// # Errors
    /// If the body is no JSON object.
    fn add_client_betas(
        &self,
        upstream_model: &str,
        body: Vec<u8>,
        anthropic_beta: &str,
    ) -> serde_json::Result<Vec<u8>> {
        let _ = (upstream_model, anthropic_beta);
        Ok(body)
    }

    /// The status an upstream error answer counts as, from its status and body.
    fn error_status(&self, status: u16, body: &[u8]) -> u16 {
        let _ = body;
        status
    }

    /// An upstream error answer's `(type, code, message)` in OpenAI's terms.
    fn error_parts(
        &self,
        upstream: UpstreamDialect,
        status: u16,
        body: &[u8],
    ) -> (String, Option<String>, String) {
        error_parts(upstream, status, body)
    }

    /// The decoder of the provider's stream framing for a stream in `dialect`, when it is
    /// not SSE; `max_event_bytes` bounds one decoded event.
    fn unframer(
        &self,
        dialect: UpstreamDialect,
        max_event_bytes: usize,
    ) -> Option<EventStreamDecoder> {
        let _ = (dialect, max_event_bytes);
        None
    }

    /// Whether the provider counts tokens itself (`POST /v1/messages/count_tokens`).
    fn counts_tokens(&self) -> bool {
        false
    }

    /// The connector of a provider served in-process (no address to dial).
    fn connector(&self) -> Option<Arc<dyn L4Connect + Send + Sync>> {
        None
    }
}

/// A provider's live credential, built once per provider by its adapter
/// ([`Adapter::credential`]) and held by the registry.
#[derive(Debug, Default)]
pub enum Credential {
    /// A static key from the config, or none.
    #[default]
    None,
    /// AWS SigV4 (Bedrock): the signer of the provider's region and credentials.
    Sigv4(super::bedrock::sigv4::Signer),
    /// A bearer token exchanged for the provider's credential at run time (Vertex AI),
    /// shared by its requests and refreshed in the background.
    Token(Arc<super::token::TokenCache>),
}

impl Credential {
    /// The token cache, when the credential is one.
    pub fn token_cache(&self) -> Option<&Arc<super::token::TokenCache>> {
        match self {
            Self::Token(c) => Some(c),
            _ => None,
        }
    }
}

/// An upstream error body's `(type, code, message)` in OpenAI's terms, whatever dialect the
/// provider speaks: OpenAI-compatible bodies (Chat Completions, Responses) keep their own type and code
/// ([`super::openai::error_parts`]), the others are decoded by the protocol layer and typed by
/// their canonical kind.
pub fn error_parts(
    upstream: UpstreamDialect,
    status: u16,
    body: &[u8],
) -> (String, Option<String>, String) {
    match upstream {
        UpstreamDialect::ChatCompletions | UpstreamDialect::Responses => {
            super::openai::error_parts(status, body)
        }
        up => {
            let (kind, message) = crate::protocol::decode_error_body(up, status, body);
            (kind.openai_type().to_string(), None, message)
        }
    }
}
