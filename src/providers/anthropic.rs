//! The Anthropic Messages API on the upstream side: where its endpoint is and which
//! version header it needs (<https://docs.anthropic.com/en/api/messages>,
//! <https://docs.anthropic.com/en/api/versioning>). Translation to and from the other
//! dialects lives in the protocol layer ([`crate::protocol::messages`]).

use std::borrow::Cow;

use pingora::http::RequestHeader;

use super::adapter::{Adapter, Credential};
use crate::config::Provider;
use crate::protocol::UpstreamDialect;

/// Value of the `anthropic-version` request header the gateway must send.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// Path of the Messages endpoint, appended to a provider `base_url` that
/// already ends with `/v1` (e.g. `https://api.anthropic.com/v1`).
pub const MESSAGES_PATH: &str = "/messages";

/// Path of the token-count endpoint (<https://docs.anthropic.com/en/api/messages-count-tokens>),
/// appended to the base URL like [`MESSAGES_PATH`].
pub const COUNT_TOKENS_PATH: &str = "/messages/count_tokens";

/// The adapter of `kind: anthropic`: the Messages API, `x-api-key` and
/// `anthropic-version`; it takes the client's `anthropic-beta` header and counts tokens.
#[derive(Debug)]
pub struct Anthropic;

impl Adapter for Anthropic {
    fn base_dialect(&self) -> UpstreamDialect {
        UpstreamDialect::Messages
    }

    fn path(&self, _: &Provider, _: &str, _: bool) -> Cow<'static, str> {
        MESSAGES_PATH.into()
    }

    fn authorize(
        &self,
        provider: &Provider,
        _: &Credential,
        req: &mut RequestHeader,
        _: &[u8],
    ) -> pingora::Result<()> {
        if let Some(k) = &provider.api_key {
            req.insert_header("x-api-key", k.expose())?;
        }
        req.insert_header("anthropic-version", ANTHROPIC_VERSION)?;
        Ok(())
    }

    fn takes_beta_header(&self, _: &str) -> bool {
        true
    }

    fn counts_tokens(&self) -> bool {
        true
    }
}
