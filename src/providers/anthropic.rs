//! The Anthropic Messages API on the upstream side: where its endpoint is and which
//! version header it needs (<https://docs.anthropic.com/en/api/messages>,
//! <https://docs.anthropic.com/en/api/versioning>). Translation to and from the other
//! dialects lives in the protocol layer ([`crate::protocol::messages`]).

/// Value of the `anthropic-version` request header the gateway must send.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// Path of the Messages endpoint, appended to a provider `base_url` that
/// already ends with `/v1` (e.g. `https://api.anthropic.com/v1`).
pub const MESSAGES_PATH: &str = "/messages";

/// Path of the token-count endpoint (<https://docs.anthropic.com/en/api/messages-count-tokens>),
/// appended to the base URL like [`MESSAGES_PATH`].
pub const COUNT_TOKENS_PATH: &str = "/messages/count_tokens";
