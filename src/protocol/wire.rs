//! Owns the vocabulary in which each dialect describes its own wire, so that the layers
//! above (the stream pipe, the unary exchange, the responder, the head guard, metering)
//! read a description instead of matching on a dialect:
//!
//! * [`ClientWire`]: what a client of a dialect gets from Sluice itself: the idle heartbeat,
//!   which error body shape the gateway's own errors take, how the in-stream error event is
//!   framed, whether Anthropic's 529 stays a 529;
//! * [`FastPath`]: the same dialect in and out, forwarded untranslated: how its stream ends
//!   (terminal event, terminator), its keepalive chatter, its in-band error, the content,
//!   finish and requested-usage probes (byte scans of [`crate::sse`], no JSON parse), and
//!   where its answers name the model ([`FastPath::rewriter`], the one model echo of both
//!   the stream and the whole-body path), and what of a forwarded request the gateway owns
//!   besides `model` ([`Forwarding`]).
//!
//! Each dialect module owns its values ([`super::chat::WIRE`], [`super::chat::FAST_PATH`],
//! [`super::messages::WIRE`], [`super::messages::FAST_PATH`], [`super::responses::WIRE`],
//! [`super::responses::upstream::FAST_PATH`]);
//! [`ClientDialect::wire`] is the one place that picks them.

use crate::sse::{ModelPath, ModelRewriter};

use super::{ClientDialect, ErrorKind};

/// What a client of one dialect gets from Sluice itself (not from a provider).
#[derive(Debug)]
pub struct ClientWire {
    /// The idle heartbeat frame of a committed stream (Messages: `event: ping`, the others
    /// an SSE comment).
    pub heartbeat: &'static [u8],
    /// Which body the gateway's own errors (auth, limits, routing, upstream failures) take.
    pub gateway_error_body: GatewayErrorBody,
    /// The in-stream error event is OpenAI's `event: error` frame with the gateway's error
    /// type and the stream error's reason as `code` ([`crate::sse::openai_error_event`]),
    /// not the dialect's own error event.
    pub openai_error_frame: bool,
    /// Anthropic's 529 (`overloaded`) stays a 529 (the dialect's API has it); otherwise it
    /// becomes a 503.
    pub keeps_529: bool,
    /// The same-dialect fast path, when some provider speaks this dialect (`None`:
    /// every answer is translated).
    pub fast_path: Option<&'static FastPath>,
}

/// The shape of the body a gateway error takes for a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatewayErrorBody {
    /// OpenAI's full error body, `code` included (`GatewayError::to_json`).
    OpenAi,
    /// OpenAI's full body for a budget refusal (its `insufficient_quota` / `budget_exceeded`
    /// is what OpenAI's SDKs and tooling branch on), the dialect's own body otherwise.
    OpenAiForBudget,
    /// The dialect's own error body ([`super::error_body`]).
    Dialect,
}

impl GatewayErrorBody {
    /// Whether an error (`budget`: a budget refusal) gets OpenAI's full body.
    pub fn openai(self, budget: bool) -> bool {
        match self {
            GatewayErrorBody::OpenAi => true,
            GatewayErrorBody::OpenAiForBudget => budget,
            GatewayErrorBody::Dialect => false,
        }
    }
}

/// How the last event of a complete stream is recognized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Terminal {
    /// The `data: [DONE]` sentinel (OpenAI).
    Done,
    /// An event of this name (Messages `message_stop`).
    Event(&'static str),
    /// An event of any of these names (Responses `response.completed`, `response.incomplete`).
    Events(&'static [&'static str]),
}

/// How the event that finishes the answer (a stream with it and without its terminal
/// event is complete) is recognized.
#[derive(Debug, Clone, Copy)]
pub enum Finish {
    /// An event of this name (Messages `message_delta`).
    Event(&'static str),
    /// An event of any of these names (Responses: the terminal events themselves).
    Events(&'static [&'static str]),
    /// A byte probe of the event's data (Chat: a `"finish_reason"` with a string value).
    Probe(fn(&[u8]) -> bool),
}

/// Usage Sluice asked the provider for although the client did not (Chat's
/// `stream_options.include_usage`), and how it is hidden from the client again.
#[derive(Debug, Clone, Copy)]
pub struct RequestedUsage {
    /// Whether a chunk that carries a usage object carries nothing else (not forwarded).
    pub usage_only_chunk: fn(&[u8]) -> bool,
    /// How every other event ends while usage is on (`,"usage":null}` + the event's blank
    /// line); replaced by `}` and the blank line.
    pub null_usage_end: &'static [u8],
}

/// An upstream's in-band error event, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InBandError {
    /// Canonical kind (the client's in-stream error event is typed by it).
    pub kind: ErrorKind,
    /// The provider's own OpenAI error type, when its body names one (empty: none).
    pub error_type: String,
    /// The provider's message.
    pub message: String,
}

/// A dialect's same-dialect fast path: events forwarded as they are, with the model echo
/// rewritten. Every probe is a byte scan of one event (no JSON parse, no allocation).
#[derive(Debug)]
pub struct FastPath {
    /// How the stream's last event is recognized (nothing after it is for the client).
    pub terminal: Terminal,
    /// The terminal event Sluice adds when the stream finished without it.
    pub terminator: &'static [u8],
    /// The event name of the provider's keepalive chatter (Messages `ping`): it never
    /// commits the answer and is dropped before the first data event.
    pub keepalive: Option<&'static str>,
    /// The event name of an in-band error.
    pub error_event: &'static str,
    /// Further event names of in-band errors (Responses `response.failed`; empty for most).
    pub error_events: &'static [&'static str],
    /// A data payload that starts with this is an in-band error too, whatever its event
    /// name (OpenAI-compatible servers send `data: {"error":…}`).
    pub error_data_prefix: Option<&'static [u8]>,
    /// Reads an in-band error event's data (cold: once per stream at most).
    pub decode_error: fn(&[u8]) -> InBandError,
    /// Whether an event's data carries generated content (TTFT, content events).
    pub has_content: fn(&[u8]) -> bool,
    /// The event that finishes the answer.
    pub finish: Finish,
    /// Usage Sluice may have asked for on the client's behalf (`None`: it never does).
    pub requested_usage: Option<RequestedUsage>,
    /// Where stream events name the model.
    pub stream_model: ModelPath,
    /// Where a whole (non-stream) answer names the model.
    pub body_model: ModelPath,
    /// What a forwarded request body has changed besides `model` (`None`: nothing).
    pub forwarding: Option<&'static Forwarding>,
}

/// How a [`Forwarding`] sets a member: its value from the client's own (if it sent one).
pub type SetMember = fn(Option<&serde_json::Value>) -> serde_json::Value;

/// The top-level members of a client's request that the gateway owns in this dialect
/// besides `model`, and so changes when it forwards the body untranslated (Responses:
/// `previous_response_id` left out, `store: false`, `include` gains
/// `reasoning.encrypted_content`).
#[derive(Debug)]
pub struct Forwarding {
    /// Members left out.
    pub dropped: &'static [&'static str],
    /// Members set: the name and the value from the client's own (if it sent one).
    pub set: &'static [(&'static str, SetMember)],
}

impl FastPath {
    /// Whether an event (its name, its data) is the stream's terminal event.
    #[inline]
    pub fn is_terminal(&self, event: Option<&str>, is_done: bool) -> bool {
        match self.terminal {
            Terminal::Done => is_done,
            Terminal::Event(name) => event == Some(name),
            Terminal::Events(names) => event.is_some_and(|e| names.contains(&e)),
        }
    }

    /// Whether an event is the provider's keepalive chatter.
    #[inline]
    pub fn is_keepalive(&self, event: Option<&str>) -> bool {
        self.keepalive.is_some_and(|k| event == Some(k))
    }

    /// Whether an event is an in-band error.
    #[inline]
    pub fn is_error(&self, event: Option<&str>, data: &[u8]) -> bool {
        event == Some(self.error_event)
            || event.is_some_and(|e| self.error_events.contains(&e))
            || self.error_data_prefix.is_some_and(|p| data.starts_with(p))
    }

    /// Whether an event finishes the answer.
    #[inline]
    pub fn is_finish(&self, event: Option<&str>, data: &[u8]) -> bool {
        match self.finish {
            Finish::Event(name) => event == Some(name),
            Finish::Events(names) => event.is_some_and(|e| names.contains(&e)),
            Finish::Probe(probe) => probe(data),
        }
    }

    /// The model echo of this dialect's answers: `stream` events or a whole body, naming
    /// `standard_model` whatever model the provider answered with. The one model-rewrite
    /// mechanism of the untranslated path (the translated path encodes the model itself).
    pub fn rewriter(&self, stream: bool, standard_model: &str) -> ModelRewriter {
        let path = if stream {
            self.stream_model
        } else {
            self.body_model
        };
        ModelRewriter::at(path, standard_model)
    }
}

impl ClientDialect {
    /// What a client of this dialect gets from Sluice itself, the fast path included.
    pub fn wire(self) -> &'static ClientWire {
        match self {
            ClientDialect::ChatCompletions => &super::chat::WIRE,
            ClientDialect::Messages => &super::messages::WIRE,
            ClientDialect::Responses => &super::responses::WIRE,
        }
    }
}
