//! Owns what Anthropic Messages is on the wire besides its request and response bodies
//! (<https://docs.anthropic.com/en/docs/build-with-claude/streaming>): what its clients
//! get from Sluice itself ([`WIRE`]), its same-dialect fast path ([`FAST_PATH`]) and the
//! keys that carry its generated text ([`TEXT_KEYS`]).

use crate::protocol::wire::Terminal;
use crate::protocol::wire::{ClientWire, FastPath, Finish, GatewayErrorBody, InBandError};
use crate::protocol::UpstreamDialect;
use crate::sse::{self, ModelPath};

/// What a Messages client gets from Sluice itself: `event: ping` heartbeats (what
/// Anthropic sends), Anthropic's error bodies, its 529.
pub static WIRE: ClientWire = ClientWire {
    heartbeat: b"event: ping\ndata: {\"type\":\"ping\"}\n\n",
    gateway_error_body: GatewayErrorBody::Dialect,
    openai_error_frame: false,
    keeps_529: true,
    fast_path: Some(&FAST_PATH),
};

/// Messages in and out: the stream ends with `event: message_stop`, finishes with
/// `message_delta`, pings (`event: ping`), names the model in `message_start`'s
/// `message.model` (a whole answer in its top-level `model`); an in-band error is an
/// `event: error`.
pub static FAST_PATH: FastPath = FastPath {
    terminal: Terminal::Event("message_stop"),
    terminator: b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    keepalive: Some("ping"),
    error_event: "error",
    error_events: &[],
    error_data_prefix: None,
    decode_error: in_band_error,
    has_content: sse::has_content_anthropic_first,
    finish: Finish::Event("message_delta"),
    requested_usage: None,
    stream_model: ModelPath::new(&["message", "model"]),
    body_model: ModelPath::new(&["model"]),
    forwarding: None,
};

/// The members that carry generated text in Messages events and bodies (`text`,
/// `thinking`, `partial_json`).
pub const TEXT_KEYS: &[&[u8]] = &[b"\"text\"", b"\"thinking\"", b"\"partial_json\""];

/// An in-band `event: error` of an Anthropic stream: typed by its canonical kind, no
/// provider type kept.
#[cold]
fn in_band_error(data: &[u8]) -> InBandError {
    let (kind, message) = crate::protocol::decode_error_body(UpstreamDialect::Messages, 502, data);
    InBandError {
        kind,
        error_type: String::new(),
        message,
    }
}
