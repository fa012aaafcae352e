//! Owns what a client of OpenAI Responses gets from Sluice itself ([`WIRE`]). A route that
//! speaks Responses (`routes[].api: responses`) is reached by the same-dialect fast path
//! ([`super::upstream::FAST_PATH`]).

use crate::protocol::wire::{ClientWire, GatewayErrorBody};
use crate::sse;

/// What a Responses client gets from Sluice itself: SSE comment heartbeats, OpenAI's full
/// error body for a budget refusal and the Responses error body otherwise, the Responses
/// `error` event mid-stream.
pub static WIRE: ClientWire = ClientWire {
    heartbeat: sse::KEEPALIVE_COMMENT,
    gateway_error_body: GatewayErrorBody::OpenAiForBudget,
    openai_error_frame: false,
    keeps_529: false,
    fast_path: Some(&super::upstream::FAST_PATH),
};
