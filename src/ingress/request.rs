//! Owns the downstream request body: reading it once, bounded by
//! `server.max_request_body_bytes` (413 past it), by the process-wide
//! `server.max_buffered_request_bytes` (503, see [`crate::backpressure::buffers`]) and by
//! `server.body_read_timeout_ms` (408), and parsing the OpenAI Chat Completions request
//! (<https://platform.openai.com/docs/api-reference/chat/create>) into an
//! [`InferenceRequest`]: model, stream flag, capabilities used, provider preference.
//!
//! The buffer grows as bytes arrive (doubling, never past the announced `Content-Length`),
//! and so does its reservation against the global bound (twice the buffer: the body is
//! parsed and re-serialized per attempt): a client announcing a large body and sending
//! little costs little memory and holds little of the bound, so idle connections that
//! announce large bodies cannot lock other clients out. A body whose announced size
//! cannot fit in what is left of the bound right now is refused at its head (before
//! `100 Continue`), without reserving anything.
//!
//! The parsed body and its reservation live in the request's [`Payload`], which a stream
//! lets go of at its commit ([`InferenceRequest::release_payload`]): nothing is replayed
//! after the first byte, so a held stream keeps neither its prompt nor its share of the
//! bound (unless its model continues after a break, which re-encodes the request).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use pingora::proxy::Session;
use serde_json::{Map, Value};
use tokio::time::Instant;

use crate::backpressure::buffers::COPIES_PER_BODY_BYTE;
use crate::backpressure::{BufferReservation, BuffersFull, RequestBuffers};
use crate::config::{Capability, Config};
use crate::error::GatewayError;
use crate::protocol::{self, ClientDialect};
use crate::routing::{Preference, RouteNeeds};

/// Header carrying the same JSON as the body's `provider` field.
pub const PREFERENCE_HEADER: &str = "x-sluice-provider-preference";

/// Default output bound for cost estimates when the request sets none (tokens).
const DEFAULT_MAX_OUTPUT_TOKENS: u64 = 1024;

/// First buffer capacity of a body, bytes (smaller when the body is announced smaller).
const INITIAL_BODY_CAPACITY: usize = 16 * 1024;

/// Why the body could not be read.
#[derive(Debug)]
pub enum BodyError {
    /// Over the limit (bytes).
    TooLarge(usize),
    /// The process-wide request buffer bound would be passed.
    BuffersFull(BuffersFull),
    /// The whole body did not arrive within this.
    TimedOut(Duration),
    /// The client went away (closed, reset, or stopped sending).
    Downstream(Box<pingora::Error>),
    /// The client is there but its body framing is broken (a bad chunk size, say): a 400.
    Malformed(String),
}

/// Sorts a body read error: framing errors are the client's request, the rest its connection.
fn body_error(e: Box<pingora::Error>) -> BodyError {
    use pingora::ErrorType::{ConnectionClosed, ReadError, ReadTimedout};
    match e.etype() {
        ConnectionClosed | ReadError | ReadTimedout => BodyError::Downstream(e),
        _ => BodyError::Malformed(e.to_string().trim().to_string()),
    }
}

/// The bounds of one body read.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    /// Largest body, bytes (`server.max_request_body_bytes`).
    pub max_bytes: usize,
    /// Bound on all requests' reserved body bytes (`server.max_buffered_request_bytes`).
    pub max_buffered: usize,
    /// Time allowed for the whole body (`server.body_read_timeout_ms`).
    pub timeout: Duration,
}

impl BodyLimits {
    /// The limits of `config.server`.
    pub fn of(config: &Config) -> Self {
        Self {
            max_bytes: config.server.max_request_body_bytes,
            max_buffered: config.server.max_buffered_request_bytes,
            timeout: config.server.body_read_timeout,
        }
    }
}

/// A body read whole, with the reservation that accounts for it. Keep the reservation as
/// long as the body is held in any form (raw or parsed).
#[derive(Debug)]
pub struct HeldBody {
    /// The body bytes.
    pub bytes: Bytes,
    /// Its share of `server.max_buffered_request_bytes`.
    pub reservation: BufferReservation,
}

/// Reads the whole request body within `limits`, reserving its bytes in `buffers`.
///
/// # Errors
/// [`BodyError::TooLarge`] as soon as the limit is passed (or announced by `Content-Length`);
/// [`BodyError::BuffersFull`] when the body does not fit in the global bound (its
/// announced length checked before reading, its buffer as it grows); [`BodyError::TimedOut`] past
/// `limits.timeout`; [`BodyError::Downstream`] when the client fails;
/// [`BodyError::Malformed`] when the body framing is invalid.
pub async fn read_body(
    session: &mut Session,
    limits: BodyLimits,
    buffers: &RequestBuffers,
) -> Result<HeldBody, BodyError> {
    let deadline = Instant::now() + limits.timeout;
    let announced = session
        .req_header()
        .headers
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<usize>().ok());
    if announced.is_some_and(|n| n > limits.max_bytes) {
        return Err(BodyError::TooLarge(limits.max_bytes));
    }
    // Fast failure: an announced body that cannot fit now is refused before it is sent.
    // Nothing is reserved for bytes that have not arrived (see the module doc).
    if let Some(n) = announced {
        let would_hold = buffers
            .held()
            .saturating_add(n.saturating_mul(COPIES_PER_BODY_BYTE));
        if would_hold > limits.max_buffered {
            return Err(BodyError::BuffersFull(BuffersFull {
                max_bytes: limits.max_buffered,
            }));
        }
    }
    let mut reservation = buffers
        .reserve(0, limits.max_buffered)
        .map_err(BodyError::BuffersFull)?;
    // A client that sent `Expect: 100-continue` (curl does for bodies over 1 MiB) waits for
    // this before sending the body; without it, it stalls for its expect timeout (1 s).
    let expects_continue = session
        .req_header()
        .headers
        .get("expect")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    if expects_continue {
        session
            .downstream_session
            .write_continue_response()
            .await
            .map_err(BodyError::Downstream)?;
    }
    // Pingora's own limit is per read (60 s by default); past the whole-body deadline it must
    // not end the read first, or a stalled client would get no 408.
    session
        .downstream_session
        .set_read_timeout(Some(limits.timeout + Duration::from_secs(1)));
    // Pingora holds a chunked or over-long body to the announced length; the cap keeps the
    // buffer's growth within it.
    let cap = announced.unwrap_or(limits.max_bytes);
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let chunk = match tokio::time::timeout_at(deadline, session.read_request_body()).await {
            Err(_) => return Err(BodyError::TimedOut(limits.timeout)),
            Ok(Ok(Some(chunk))) => chunk,
            Ok(Ok(None)) => {
                return Ok(HeldBody {
                    bytes: Bytes::from(buf),
                    reservation,
                })
            }
            Ok(Err(e)) => return Err(body_error(e)),
        };
        let need = buf.len() + chunk.len();
        if need > limits.max_bytes {
            return Err(BodyError::TooLarge(limits.max_bytes));
        }
        if need > buf.capacity() {
            let target = grown_capacity(buf.capacity(), need, cap);
            reservation
                .ensure(
                    target.saturating_mul(COPIES_PER_BODY_BYTE),
                    limits.max_buffered,
                )
                .map_err(BodyError::BuffersFull)?;
            buf.reserve_exact(target - buf.len());
        }
        buf.extend_from_slice(&chunk);
    }
}

/// The next capacity of a body buffer of `capacity` that must hold `need` bytes: at least
/// double (amortized growth), at least [`INITIAL_BODY_CAPACITY`], never past `cap` (the
/// announced length, or the body limit) unless `need` itself is past it.
fn grown_capacity(capacity: usize, need: usize, cap: usize) -> usize {
    need.max(capacity.saturating_mul(2))
        .max(INITIAL_BODY_CAPACITY.min(cap))
        .min(cap.max(need))
}

/// A parsed inference request, in any client dialect: what routing, admission and the
/// stream need (small, kept for the request's life) and its [`Payload`] (the parsed body,
/// replayed to every attempt and released once it can no longer be replayed: see
/// [`release_payload`](Self::release_payload)).
#[derive(Debug)]
pub struct InferenceRequest {
    /// The wire API the client spoke (chosen by the endpoint).
    pub dialect: ClientDialect,
    /// The parsed body, until it is released.
    payload: ArcSwapOption<Payload>,
    /// The client's `anthropic-beta` header, forwarded to Anthropic and Claude on Vertex AI
    /// (the header) and to Claude on Bedrock (the body member `anthropic_beta`).
    pub anthropic_beta: Option<String>,
    /// The standard model asked for.
    pub model: String,
    /// `"stream": true`.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// What the request needs from a route.
    pub needs: RouteNeeds,
    /// The client's provider preference.
    pub preference: Option<Preference>,
    /// The body's `models` (OpenRouter style: tried after `model`, see
    /// [`crate::engine::fallback`]), removed from the body; empty when absent.
    pub models: Vec<String>,
    /// Size of the body as received, bytes (chooses how the input estimate is computed).
    pub body_bytes: usize,
    /// The input-token estimate, computed on first use: read it with
    /// [`estimated_input_tokens`](Self::estimated_input_tokens).
    input_estimate: OnceLock<u64>,
    /// What the estimate counts, kept in place of a released payload when the estimate may
    /// still be asked for ([`release_payload`](Self::release_payload)).
    input_sample: OnceLock<protocol::tokens::TextSample>,
}

/// What of a request every attempt is built from: the parsed body and its canonical form,
/// with the share of `server.max_buffered_request_bytes` that accounts for them. Shared
/// (`Arc`) so that an attempt serializes from it without a lock, and freed, reservation
/// and all, when the request lets go of it and the last attempt that read it is done.
#[derive(Debug)]
pub struct Payload {
    /// The client's dialect (what `body` is decoded as).
    dialect: ClientDialect,
    /// The request object as sent (forwarded with `model` replaced per attempt when the
    /// upstream speaks the client's dialect).
    pub body: Map<String, Value>,
    /// The canonical request, decoded once per request (not per attempt) for translation,
    /// on the first translated attempt (a route of the client's own dialect forwards `body`
    /// and never needs it, nor refuses what only another dialect cannot carry). Read it with
    /// [`canonical`](Self::canonical).
    canonical: OnceLock<Result<protocol::Request, protocol::ProtocolError>>,
    /// The body's buffer reservation ([`InferenceRequest::hold_reservation`]), released with
    /// the payload.
    reservation: OnceLock<BufferReservation>,
}

impl Payload {
    /// The payload slot of a request of `dialect` whose parsed body is `body` (and
    /// `canonical`, when decoded at parse time).
    fn slot(
        dialect: ClientDialect,
        body: Map<String, Value>,
        canonical: OnceLock<Result<protocol::Request, protocol::ProtocolError>>,
    ) -> ArcSwapOption<Payload> {
        ArcSwapOption::from_pointee(Payload {
            dialect,
            body,
            canonical,
            reservation: OnceLock::new(),
        })
    }

    /// The canonical request, decoded from `body` on first use.
    ///
    /// # Errors
    /// What the protocol layer refuses in the client's request (a 400 naming the field).
    pub fn canonical(&self) -> Result<&protocol::Request, &protocol::ProtocolError> {
        self.canonical
            .get_or_init(|| {
                let bytes = serde_json::to_vec(&self.body)
                    .map_err(|e| protocol::ProtocolError::InvalidUpstream(e.to_string()))?;
                protocol::decode_request(self.dialect, &bytes)
            })
            .as_ref()
    }

    /// The canonical request if it was decoded already (never decodes).
    pub fn decoded(&self) -> Option<&protocol::Request> {
        self.canonical.get().and_then(|c| c.as_ref().ok())
    }

    /// The input-token estimate of this body ([`protocol::tokens::estimate_input_tokens`]).
    /// A Chat Completions body is estimated through its canonical request (the one already
    /// decoded for a translated attempt, else a temporary one, so that an OpenAI-compatible
    /// route does not keep a second copy of the request); one over
    /// [`CANONICAL_ESTIMATE_BYTES`], or one the protocol layer refuses (it may still go as is
    /// to an OpenAI-compatible route), from the parsed JSON in place
    /// ([`estimate_json_tokens`]).
    fn estimate(&self, body_bytes: usize) -> u64 {
        match self.canonical.get() {
            Some(Ok(c)) => protocol::tokens::estimate_input_tokens(c),
            Some(Err(_)) => estimate_json_tokens(&self.body),
            None => estimate_lazy(self.dialect, body_bytes, &self.body),
        }
    }

    /// What the estimate counts of this body, with at most about `budget_bytes` of its text
    /// kept ([`protocol::tokens::TextSample`]): from the canonical request where it was
    /// decoded, else from the parsed JSON ([`sample_json`]).
    fn sample(&self, budget_bytes: usize) -> protocol::tokens::TextSample {
        let mut sample = protocol::tokens::TextSample::new(budget_bytes);
        match self.canonical.get() {
            Some(Ok(c)) => protocol::tokens::sample_input(c, &mut sample),
            Some(Err(_)) | None => sample_json(&self.body, &mut sample),
        }
        sample.shrink_to_fit();
        sample
    }
}

impl InferenceRequest {
    /// What a translated answer reflects of the client's request (its tool forms, whether it
    /// wants reasoning text), from the canonical request when one was decoded (a request
    /// forwarded untranslated reflects nothing: its answer is the provider's own).
    pub fn echo(&self) -> protocol::ClientEcho {
        self.payload()
            .and_then(|p| p.decoded().map(protocol::Request::echo))
            .unwrap_or_default()
    }

    /// The parsed body, `None` once released ([`release_payload`](Self::release_payload)):
    /// after a stream's commit, where no attempt is made any more (mid-stream continuation,
    /// which makes one, keeps it).
    pub fn payload(&self) -> Option<Arc<Payload>> {
        self.payload.load_full()
    }

    /// Makes `reservation` (the body's share of `server.max_buffered_request_bytes`) live
    /// as long as the payload: released with it. A second reservation is dropped at once.
    pub fn hold_reservation(&self, reservation: BufferReservation) {
        if let Some(p) = self.payload.load().as_ref() {
            let _ = p.reservation.set(reservation);
        }
    }

    /// Lets go of the payload (the parsed body, its canonical form and their buffer
    /// reservation), for a stream that committed: nothing will be sent upstream again, so
    /// the body is not kept for the stream's life (for a 32 KiB prompt, ~32 KiB of a held
    /// stream's memory and 64 KiB of the global request-buffer bound).
    ///
    /// What [`estimated_input_tokens`](Self::estimated_input_tokens) answers afterwards, if
    /// it was not computed already (budgets, token limits and `lowest_cost` routing compute
    /// it whole before the commit): `provider_input`, the input tokens the provider reported
    /// before the commit (Anthropic's `message_start`), when it did; else a
    /// [`TextSample`](protocol::tokens::TextSample) of the body kept in its place (at most
    /// [`RELEASE_SAMPLE_BYTES`](protocol::tokens::RELEASE_SAMPLE_BYTES) of its text, copied,
    /// not tokenized: the tokenizer runs over it only if the estimate is asked for, for an
    /// answer that ends without the provider's input figure or a cancelled hedge).
    pub fn release_payload(&self, provider_input: Option<u64>) {
        if self.input_estimate.get().is_none() {
            match provider_input {
                Some(n) => {
                    let _ = self.input_estimate.set(n);
                }
                None => {
                    if let Some(p) = self.payload.load().as_ref() {
                        let _ = self
                            .input_sample
                            .set(p.sample(protocol::tokens::RELEASE_SAMPLE_BYTES));
                    }
                }
            }
        }
        self.payload.store(None);
    }

    /// The request's input tokens as estimated with the `o200k_base` tokenizer (see
    /// [`protocol::tokens::estimate_input_tokens`]), computed on the first call and cached:
    /// at most once per request, and only for what needs it (token rate limits, budgets,
    /// `lowest_cost` routing, the input figure of an answer without the provider's usage).
    /// Tokenizing is far dearer than relaying a short request (~1 ms for 32 KiB of prose),
    /// so nothing computes it unasked. A Chat Completions body is estimated through its
    /// canonical request (the one already decoded for a translated attempt, else a temporary
    /// one); one over 256 KiB, or one the protocol layer refuses, from its parsed JSON.
    ///
    /// After the payload was released ([`release_payload`](Self::release_payload)), the
    /// figure is the provider's input figure from before the commit, else counted from the
    /// sample kept in the payload's place; without either (a release that kept neither, which
    /// the pump does not make), the body's size at four bytes a token.
    pub fn estimated_input_tokens(&self) -> u64 {
        *self.input_estimate.get_or_init(|| {
            if let Some(p) = self.payload.load().as_ref() {
                return p.estimate(self.body_bytes);
            }
            self.input_sample.get().map_or(
                (self.body_bytes / 4) as u64,
                protocol::tokens::TextSample::tokens,
            )
        })
    }
}

/// Parses and validates a chat request body ([`parse_forwardable`] for Chat Completions).
///
/// # Errors
/// As [`parse_forwardable`].
pub fn parse_chat(
    body: &[u8],
    preference_header: Option<&[u8]>,
    config: &Config,
) -> Result<InferenceRequest, GatewayError> {
    parse_forwardable(
        ClientDialect::ChatCompletions,
        body,
        preference_header,
        config,
    )
}

/// The `model` a request body names, read tolerantly for diagnostics when the body was
/// refused: the top-level `model` string of a JSON object (every other member is skipped
/// unread), cut to 256 bytes at a character boundary; `None` when the body is not a JSON
/// object or names no string `model`.
pub fn raw_model(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct ModelOnly<'a> {
        #[serde(borrow, default)]
        model: Option<std::borrow::Cow<'a, str>>,
    }
    let m = serde_json::from_slice::<ModelOnly<'_>>(body).ok()?.model?;
    let m = m.trim();
    if m.is_empty() {
        return None;
    }
    let mut end = m.len().min(256);
    while !m.is_char_boundary(end) {
        end -= 1;
    }
    Some(m[..end].to_string())
}

/// Parses and validates the body of a dialect some provider speaks (Chat Completions,
/// Messages), tolerantly: only what routing, limits, budgets and metering need is read
/// (`model`, `stream`, `messages`, the output limit, the capabilities used, Chat's
/// `stream_options.include_usage`); the rest stays as the client sent it, forwarded
/// untouched to a provider of the same dialect and decoded into the canonical request only
/// for a translated attempt ([`Payload::canonical`]). An unknown member, enum value, tool
/// type or content block is never refused here.
///
/// # Errors
/// 400 [`GatewayError::InvalidRequest`] for malformed JSON, a missing or non-string `model`,
/// a bad `stream`, `messages` (Messages: `max_tokens`) or provider preference (including
/// unknown provider names).
pub fn parse_forwardable(
    dialect: ClientDialect,
    body: &[u8],
    preference_header: Option<&[u8]>,
    config: &Config,
) -> Result<InferenceRequest, GatewayError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| GatewayError::invalid(format!("request body is not valid JSON: {e}"), None))?;
    let Value::Object(mut map) = value else {
        return Err(GatewayError::invalid(
            "request body must be a JSON object",
            None,
        ));
    };
    let model = match map.get("model") {
        Some(Value::String(m)) if !m.trim().is_empty() => m.clone(),
        Some(_) => {
            return Err(GatewayError::invalid(
                "`model` must be a non-empty string",
                Some("model"),
            ))
        }
        None => {
            return Err(GatewayError::invalid(
                "you must provide a `model` parameter",
                Some("model"),
            ))
        }
    };
    let stream = match map.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(GatewayError::invalid(
                "`stream` must be a boolean",
                Some("stream"),
            ))
        }
    };
    check_conversation(dialect, &map)?;
    let messages_dialect = dialect == ClientDialect::Messages;
    // Messages and Responses streams always carry usage; Chat's only when asked for.
    let include_usage = messages_dialect
        || dialect == ClientDialect::Responses
        || map
            .get("stream_options")
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool)
            .unwrap_or(false);

    let preference = preference(map.remove("provider"), preference_header, config)?;
    let models = crate::engine::fallback::body_models(map.remove("models"))?;

    let requested_max = if messages_dialect {
        match map.get("max_tokens") {
            Some(Value::Number(n)) if n.as_u64().is_some() => n.as_u64(),
            Some(_) => {
                return Err(GatewayError::invalid(
                    "`max_tokens` must be a non-negative integer",
                    Some("max_tokens"),
                ))
            }
            None => {
                return Err(GatewayError::invalid(
                    "invalid `max_tokens`: missing field `max_tokens`",
                    Some("max_tokens"),
                ))
            }
        }
    } else if dialect == ClientDialect::Responses {
        map.get("max_output_tokens").and_then(Value::as_u64)
    } else {
        map.get("max_completion_tokens")
            .or_else(|| map.get("max_tokens"))
            .and_then(Value::as_u64)
    };
    let needs = RouteNeeds {
        capabilities: capabilities(&map),
        // Filled by the caller when its routing strategy needs it.
        estimated_input_tokens: 0,
        max_output_tokens: requested_max.unwrap_or(DEFAULT_MAX_OUTPUT_TOKENS),
        requested_max_output_tokens: requested_max,
    };
    Ok(InferenceRequest {
        dialect,
        payload: Payload::slot(dialect, map, OnceLock::new()),
        anthropic_beta: None,
        model,
        stream,
        include_usage,
        needs,
        preference,
        models,
        body_bytes: body.len(),
        input_estimate: OnceLock::new(),
        input_sample: OnceLock::new(),
    })
}

/// Checks that a request has its conversation: Responses `input` (a string or a list of
/// items), the others a non-empty `messages` array; and that a Responses request does not use
/// the Conversations API (`conversation`). `previous_response_id`, `store` and
/// `item_reference` were resolved before ([`crate::conversation::expand`]: the history is in
/// `input`; with the store off they were refused there).
///
/// # Errors
/// A 400 naming `input`, `messages` or `conversation`.
fn check_conversation(
    dialect: ClientDialect,
    map: &Map<String, Value>,
) -> Result<(), GatewayError> {
    if dialect == ClientDialect::Responses {
        if !map.get("conversation").is_none_or(Value::is_null) {
            return Err(GatewayError::invalid(
                "unsupported `conversation`: the Conversations API is not supported; use previous_response_id or send the full input",
                Some("conversation"),
            ));
        }
        // Responses: `input`, a string or a list of items (the protocol layer reads them).
        match map.get("input") {
            Some(Value::String(_) | Value::Array(_)) => {}
            Some(_) => {
                return Err(GatewayError::invalid(
                    "`input` must be a string or an array of items",
                    Some("input"),
                ))
            }
            None => {
                return Err(GatewayError::invalid(
                    "you must provide `input`",
                    Some("input"),
                ))
            }
        }
    } else {
        match map.get("messages") {
            Some(Value::Array(a)) if !a.is_empty() => {}
            Some(Value::Array(_)) => {
                return Err(GatewayError::invalid(
                    "`messages` must not be empty",
                    Some("messages"),
                ))
            }
            _ => {
                return Err(GatewayError::invalid(
                    "you must provide `messages` (an array)",
                    Some("messages"),
                ))
            }
        }
    }
    Ok(())
}

/// Parses and validates a request body of `dialect` with [`parse_forwardable`] (every
/// client dialect is one some provider speaks: Chat Completions, Messages, and Responses on
/// a route with `api: responses`). The provider preference comes from the
/// [`PREFERENCE_HEADER`] header or a `provider` member.
///
/// # Errors
/// As [`parse_forwardable`]; what the protocol layer refuses in a request that is translated
/// (`previous_response_id` toward a provider that does not speak Responses, …) is a 400 of
/// the attempt that translates it.
pub fn parse_dialect(
    dialect: ClientDialect,
    body: &[u8],
    preference_header: Option<&[u8]>,
    config: &Config,
) -> Result<InferenceRequest, GatewayError> {
    parse_forwardable(dialect, body, preference_header, config)
}

/// What a canonical request needs from a route: the capabilities it uses (tools, vision,
/// JSON schema) and its output bound. The input estimate is left 0: a caller whose
/// routing strategy needs it fills it in ([`crate::routing::uses_input_estimate`]).
pub(crate) fn canonical_needs(canonical: &protocol::Request) -> RouteNeeds {
    let mut caps = Vec::new();
    if !canonical.tools.is_empty() || canonical.tool_choice.is_some() {
        caps.push(Capability::Tools);
    }
    let vision = canonical.messages.iter().any(|m| {
        m.parts
            .iter()
            .any(|p| matches!(p, protocol::Part::Image(_)))
    });
    if vision {
        caps.push(Capability::Vision);
    }
    if matches!(
        canonical.response_format,
        Some(protocol::ResponseFormat::JsonSchema { .. })
    ) {
        caps.push(Capability::JsonSchema);
    }
    RouteNeeds {
        capabilities: caps,
        estimated_input_tokens: 0,
        max_output_tokens: canonical
            .max_output_tokens
            .unwrap_or(DEFAULT_MAX_OUTPUT_TOKENS),
        requested_max_output_tokens: canonical.max_output_tokens,
    }
}

/// Chat bodies up to this size are estimated through their canonical request; larger ones
/// from the parsed JSON in place (decoding would copy every string of the body).
const CANONICAL_ESTIMATE_BYTES: usize = 256 * 1024;

/// Text tokenized at most per request estimate; the rest of a larger body is scaled from
/// the tokens per byte seen (bounded CPU on the request path).
const ESTIMATE_TEXT_BUDGET_BYTES: usize = 256 * 1024;

/// The input-token estimate of a Chat Completions or Messages request (`dialect`) whose
/// body had `body_bytes` bytes and whose canonical request was not decoded yet: a temporary canonical request
/// (decoded from `map` re-serialized, then dropped) counted with
/// [`protocol::tokens::estimate_input_tokens`]. A body over [`CANONICAL_ESTIMATE_BYTES`],
/// or one the protocol layer refuses, is estimated from `map` in place with
/// [`estimate_json_tokens`].
fn estimate_lazy(dialect: ClientDialect, body_bytes: usize, map: &Map<String, Value>) -> u64 {
    if body_bytes <= CANONICAL_ESTIMATE_BYTES {
        let decoded = serde_json::to_vec(map)
            .ok()
            .and_then(|b| protocol::decode_request(dialect, &b).ok());
        if let Some(c) = decoded {
            return protocol::tokens::estimate_input_tokens(&c);
        }
    }
    estimate_json_tokens(map)
}

/// The tokens of what [`sample_json`] counts of a Chat request's parsed JSON, with at most
/// [`ESTIMATE_TEXT_BUDGET_BYTES`] of text tokenized; later text is counted at the tokens per
/// byte of the text tokenized.
fn estimate_json_tokens(map: &Map<String, Value>) -> u64 {
    let mut sample = protocol::tokens::TextSample::new(ESTIMATE_TEXT_BUDGET_BYTES);
    sample_json(map, &mut sample);
    sample.tokens()
}

/// Adds what the estimate counts of a Chat request's parsed JSON to `sample`, as the
/// canonical request's estimate ([`protocol::tokens::sample_input`]) counts it: framing per
/// message; text content and `text` parts as text; an `image_url` (or `input_image`) part as
/// an image ([`IMAGE_TOKENS`](protocol::tokens::IMAGE_TOKENS)) and a `file` part with PDF
/// data as a PDF ([`PDF_TOKENS`](protocol::tokens::PDF_TOKENS)); a tool call's function name
/// and arguments, a tool result's `tool_call_id`; each tool as the JSON of its name,
/// description and parameters. Anything else in a message's content is walked for its
/// string values (a `data:` URL counted as an image or a PDF).
fn sample_json(map: &Map<String, Value>, sample: &mut protocol::tokens::TextSample) {
    use protocol::tokens;
    fn strings(v: &Value, sample: &mut tokens::TextSample) {
        match v {
            Value::String(s) if s.starts_with("data:application/pdf") => {
                sample.fixed(tokens::PDF_TOKENS);
            }
            Value::String(s) if s.starts_with("data:") => sample.fixed(tokens::IMAGE_TOKENS),
            Value::String(s) => sample.text(s),
            Value::Array(a) => a.iter().for_each(|x| strings(x, sample)),
            Value::Object(o) => o.values().for_each(|x| strings(x, sample)),
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }
    fn part(p: &Value, sample: &mut tokens::TextSample) {
        match p.get("type").and_then(Value::as_str) {
            Some("text") => {
                if let Some(Value::String(t)) = p.get("text") {
                    sample.text(t);
                }
            }
            Some("image_url" | "input_image" | "image") => sample.fixed(tokens::IMAGE_TOKENS),
            Some("file")
                if p.pointer("/file/file_data")
                    .and_then(Value::as_str)
                    .is_some_and(|d| d.starts_with("data:application/pdf")) =>
            {
                sample.fixed(tokens::PDF_TOKENS);
            }
            _ => strings(p, sample),
        }
    }
    sample.fixed(tokens::REPLY_PRIMING_TOKENS);
    if let Some(Value::Array(msgs)) = map.get("messages") {
        for m in msgs {
            sample.fixed(tokens::MESSAGE_OVERHEAD_TOKENS);
            match m.get("content") {
                Some(Value::String(t)) => sample.text(t),
                Some(Value::Array(parts)) => parts.iter().for_each(|p| part(p, sample)),
                Some(other) => strings(other, sample),
                None => {}
            }
            if let Some(Value::Array(calls)) = m.get("tool_calls") {
                for c in calls {
                    for key in ["/function/name", "/function/arguments"] {
                        if let Some(Value::String(t)) = c.pointer(key) {
                            sample.text(t);
                        }
                    }
                }
            }
            if let Some(Value::String(id)) = m.get("tool_call_id") {
                sample.text(id);
            }
        }
    }
    // Responses: `instructions` and every string of `input` (items are walked as a whole).
    for k in ["instructions", "input"] {
        if let Some(v) = map.get(k) {
            sample.fixed(tokens::MESSAGE_OVERHEAD_TOKENS);
            strings(v, sample);
        }
    }
    if let Some(Value::Array(tools)) = map.get("tools") {
        for t in tools {
            let f = t.get("function").unwrap_or(t);
            sample.tool(&f.get("name"), &f.get("description"), &f.get("parameters"));
        }
    }
}

/// Capabilities the request uses.
fn capabilities(map: &Map<String, Value>) -> Vec<Capability> {
    let mut caps = Vec::new();
    let has = |k: &str| map.get(k).is_some_and(|v| !v.is_null());
    if has("tools") || has("tool_choice") || has("functions") {
        caps.push(Capability::Tools);
    }
    let vision = map
        .get("messages")
        .and_then(Value::as_array)
        .is_some_and(|msgs| {
            msgs.iter().any(|m| {
                m.get("content")
                    .and_then(Value::as_array)
                    .is_some_and(|parts| {
                        parts.iter().any(|p| {
                            matches!(
                                p.get("type").and_then(Value::as_str),
                                Some("image_url" | "image" | "input_image")
                            )
                        })
                    })
            })
        });
    // Responses: an `input_image` part in an `input` item.
    let vision = vision
        || map
            .get("input")
            .and_then(Value::as_array)
            .is_some_and(|items| {
                items.iter().any(|m| {
                    m.get("content")
                        .and_then(Value::as_array)
                        .is_some_and(|parts| {
                            parts.iter().any(|p| {
                                p.get("type").and_then(Value::as_str) == Some("input_image")
                            })
                        })
                })
            });
    if vision {
        caps.push(Capability::Vision);
    }
    // Chat's `response_format`, Messages' `output_config.format` (and its beta form,
    // `output_format`), Responses' `text.format`.
    let json_schema = [
        map.get("response_format"),
        map.get("output_config").and_then(|c| c.get("format")),
        map.get("output_format"),
        map.get("text").and_then(|t| t.get("format")),
    ]
    .into_iter()
    .flatten()
    .any(|f| f.get("type").and_then(Value::as_str) == Some("json_schema"));
    if json_schema {
        caps.push(Capability::JsonSchema);
    }
    caps
}

/// The per-request provider preference: the body's `provider` field (already removed from
/// the body) or, overriding it, the [`PREFERENCE_HEADER`] with the same JSON.
///
/// # Errors
/// A 400 naming `provider` for bad JSON or a provider the config does not know.
pub(crate) fn preference(
    field: Option<Value>,
    header: Option<&[u8]>,
    config: &Config,
) -> Result<Option<Preference>, GatewayError> {
    let mut preference = match field {
        None | Some(Value::Null) => None,
        Some(v) => Some(serde_json::from_value::<Preference>(v).map_err(|e| {
            GatewayError::invalid(format!("bad `provider` preference: {e}"), Some("provider"))
        })?),
    };
    if let Some(h) = header {
        let p: Preference = serde_json::from_slice(h).map_err(|e| {
            GatewayError::invalid(format!("bad {PREFERENCE_HEADER} header: {e}"), None)
        })?;
        preference = Some(p);
    }
    if let Some(p) = &preference {
        if let Some(unknown) = p.names().find(|n| !config.providers.contains_key(*n)) {
            return Err(GatewayError::invalid(
                format!("unknown provider `{unknown}` in provider preference"),
                Some("provider"),
            ));
        }
    }
    Ok(preference)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Config {
        Config::parse(std::path::Path::new("c.yaml"), "tenants:\n  t: {}\nvirtual_keys:\n  - key: sk-test-request-0001\n    tenant: t\nproviders:\n  a:\n    kind: openai\n    base_url: http://127.0.0.1:1/v1\nmodels:\n  m:\n    routes:\n      - provider: a\n        upstream_model: x\n")
        .unwrap()
    }

    #[test]
    fn parses_model_stream_and_capabilities() {
        let c = cfg();
        let r = parse_chat(
            br#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"tools":[{}],"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}],"response_format":{"type":"json_schema"}}"#,
            None,
            &c,
        )
        .unwrap();
        assert_eq!(r.model, "m");
        assert!(r.stream && r.include_usage);
        assert_eq!(
            r.needs.capabilities,
            vec![
                Capability::Tools,
                Capability::Vision,
                Capability::JsonSchema
            ]
        );
    }

    #[test]
    fn input_is_estimated_with_the_tokenizer_for_small_and_large_bodies() {
        let c = cfg();
        // Small: the canonical request's estimate (3 priming + 3 framing + 2 tokens).
        let r = parse_chat(
            br#"{"model":"m","messages":[{"role":"user","content":"hello world"}]}"#,
            None,
            &c,
        )
        .unwrap();
        assert!(
            r.input_estimate.get().is_none(),
            "nothing is tokenized at parse time"
        );
        assert_eq!(r.estimated_input_tokens(), 8);
        assert_eq!(r.input_estimate.get(), Some(&8));
        assert!(
            r.payload().unwrap().decoded().is_none(),
            "the estimate keeps no canonical copy of an OpenAI-compatible request"
        );
        // A request already decoded for a translated attempt is estimated from that copy.
        let translated = parse_chat(
            br#"{"model":"m","messages":[{"role":"user","content":"hello world"}]}"#,
            None,
            &c,
        )
        .unwrap();
        translated.payload().unwrap().canonical().unwrap();
        assert_eq!(translated.estimated_input_tokens(), 8);
        // Messages: estimated from the canonical request parsed with it.
        let messages = parse_dialect(
            ClientDialect::Messages,
            br#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hello world"}]}"#,
            None,
            &c,
        )
        .unwrap();
        assert_eq!(messages.estimated_input_tokens(), 8);
        // The in-place estimate agrees with the canonical one on plain text.
        let text = "The quick brown fox jumps over the lazy dog. ".repeat(50);
        let body = serde_json::json!({"model": "m", "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": text}]});
        let small = parse_chat(body.to_string().as_bytes(), None, &c).unwrap();
        let map = body.as_object().unwrap();
        assert_eq!(estimate_json_tokens(map), small.estimated_input_tokens());
        // Large (over the canonical limit) with an inline image: the image counts as one,
        // not as its base64 text; the text is counted, the rest scaled past the budget.
        let image = format!("data:image/png;base64,{}", "A".repeat(600_000));
        let big_text = "The quick brown fox jumps over the lazy dog. ".repeat(20_000);
        let body = serde_json::json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "text", "text": big_text},
            {"type": "image_url", "image_url": {"url": image}}]}]});
        let big = parse_chat(body.to_string().as_bytes(), None, &c).unwrap();
        let exact_text = protocol::tokens::text_tokens(&big_text);
        let n = big.estimated_input_tokens();
        let want = exact_text + protocol::tokens::IMAGE_TOKENS + 6;
        assert!(n.abs_diff(want) * 100 <= want * 3, "{n} vs {want}");
    }

    #[test]
    fn a_released_payload_frees_its_reservation_and_keeps_what_the_stream_still_needs() {
        let c = cfg();
        let mut text = String::new();
        for i in 0..3000 {
            text.push_str(&format!("word{} is number {i}, ", i % 37));
        }
        let body = serde_json::json!({"model": "m", "stream": true, "messages": [
            {"role": "user", "content": text}]})
        .to_string();
        let whole = parse_chat(body.as_bytes(), None, &c)
            .unwrap()
            .estimated_input_tokens();
        let buffers = RequestBuffers::new();
        let reserve = || buffers.reserve(2 * body.len(), usize::MAX).unwrap();

        // The input still unknown: a sample of the body is kept (not tokenized), and the
        // body goes with its reservation.
        let r = parse_chat(body.as_bytes(), None, &c).unwrap();
        r.hold_reservation(reserve());
        assert_eq!(buffers.held(), 2 * body.len());
        r.release_payload(None);
        assert!(r.payload().is_none());
        assert_eq!(buffers.held(), 0, "the reservation goes with the body");
        assert!(r.input_estimate.get().is_none(), "nothing tokenized yet");
        let kept = r.input_sample.get().unwrap().heap_bytes();
        assert!(
            kept <= 2 * protocol::tokens::RELEASE_SAMPLE_BYTES,
            "{kept} bytes kept of a {} byte body",
            body.len()
        );
        let n = r.estimated_input_tokens();
        assert!(n.abs_diff(whole) * 100 <= whole * 3, "{n} vs {whole}");

        // An attempt still serializing from it keeps it (and the reservation) until done.
        // The provider had reported the input: that figure stands, nothing is sampled.
        let r = parse_chat(body.as_bytes(), None, &c).unwrap();
        r.hold_reservation(reserve());
        let in_flight = r.payload().unwrap();
        r.release_payload(Some(4321));
        assert!(r.payload().is_none());
        assert_eq!(buffers.held(), 2 * body.len());
        drop(in_flight);
        assert_eq!(buffers.held(), 0);
        assert!(r.input_sample.get().is_none());
        assert_eq!(r.estimated_input_tokens(), 4321);

        // An estimate computed whole before the commit (budgets, token limits) is kept.
        let r = parse_chat(body.as_bytes(), None, &c).unwrap();
        assert_eq!(r.estimated_input_tokens(), whole);
        r.release_payload(None);
        assert_eq!(r.estimated_input_tokens(), whole);
    }

    #[test]
    fn the_sample_of_a_chat_body_counts_images_tools_and_calls_as_the_canonical_estimate() {
        let c = cfg();
        let body = serde_json::json!({"model": "m", "stream": true,
            "tools": [{"type": "function", "function": {"name": "get_weather",
                "description": "Weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [
                    {"type": "text", "text": "What is in this picture, and the weather there?"},
                    {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]})
        .to_string();
        let whole = parse_chat(body.as_bytes(), None, &c)
            .unwrap()
            .estimated_input_tokens();
        assert!(whole > protocol::tokens::IMAGE_TOKENS, "{whole}");
        let r = parse_chat(body.as_bytes(), None, &c).unwrap();
        r.release_payload(None);
        let n = r.estimated_input_tokens();
        assert!(n.abs_diff(whole) <= 3, "sampled {n}, whole {whole}");
    }

    #[test]
    fn body_buffers_grow_with_the_bytes_never_past_the_announced_length() {
        // A 5 MB announcement allocates nothing up front: 16 KiB for the first bytes.
        assert_eq!(grown_capacity(0, 100, 5_000_000), INITIAL_BODY_CAPACITY);
        // Then doubling...
        assert_eq!(grown_capacity(16_384, 16_385, 5_000_000), 32_768);
        assert_eq!(grown_capacity(32_768, 100_000, 5_000_000), 100_000);
        // ...capped at the announced length.
        assert_eq!(grown_capacity(4_000_000, 4_100_000, 5_000_000), 5_000_000);
        // A small announced body gets exactly its size.
        assert_eq!(grown_capacity(0, 10, 300), 300);
        let mut cap = 0;
        let mut len = 0;
        while len < 5_000_000 {
            len = (len + 65_536).min(5_000_000);
            if len > cap {
                cap = grown_capacity(cap, len, 5_000_000);
            }
            assert!(cap >= len && cap <= 5_000_000, "{cap} for {len}");
        }
    }

    #[test]
    fn rejects_bad_input_with_400() {
        let c = cfg();
        for body in [
            &b"{"[..],
            b"[]",
            br#"{"messages":[{"role":"user","content":"x"}]}"#,
            br#"{"model":1,"messages":[]}"#,
            br#"{"model":"m"}"#,
        ] {
            let e = parse_chat(body, None, &c).unwrap_err();
            assert_eq!(e.status(), 400, "{body:?}");
        }
    }

    #[test]
    fn preference_is_removed_and_checked() {
        let c = cfg();
        let r = parse_chat(br#"{"model":"m","messages":[{"role":"user","content":"x"}],"provider":{"order":["a"]}}"#, None, &c).unwrap();
        assert!(r.payload().unwrap().body.get("provider").is_none());
        assert_eq!(r.preference.unwrap().order, vec!["a".to_string()]);
        let e = parse_chat(br#"{"model":"m","messages":[{"role":"user","content":"x"}],"provider":{"only":["zz"]}}"#, None, &c).unwrap_err();
        assert!(e.to_string().contains("zz"));
        let e = parse_chat(
            br#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#,
            Some(b"{\"ignore\":[\"q\"]}"),
            &c,
        )
        .unwrap_err();
        assert_eq!(e.status(), 400);
    }
}
