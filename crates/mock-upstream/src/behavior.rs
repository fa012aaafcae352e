//! Behaviour knobs ("scenarios") of the mock upstream: what a response looks like,
//! how slowly it is written, and how it fails.
//!
//! A [`Behavior`] is set at three levels, highest precedence first: per request
//! (the JSON body field `"mock"`, or the `x-mock-behavior` header), process-wide
//! (`POST /_mock/behavior`), and at startup (CLI `--behavior`). Levels merge field by
//! field: a knob set at a higher level wins, unset knobs fall through. In demo mode
//! ([`super::MockState::demo`]) only the startup level exists: no client steers the demo.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// How each SSE event (or non-stream body) is cut into separate TCP writes / HTTP chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    /// One write (one HTTP chunk) per SSE event (default).
    #[default]
    None,
    /// Each event goes out in 2-3 pieces, cut in the middle of lines.
    MidLine,
    /// Each event is cut inside every multi-byte UTF-8 character it contains
    /// (events without one are cut mid-line). Without `text`, tokens become `"tök{i} "`
    /// so that there is a multi-byte character to cut.
    MidUtf8,
    /// One byte per write (and per HTTP chunk), flushed each.
    Bytewise,
    /// The events written between two pauses (token delays, stalls, the end) go out in one
    /// write and one HTTP chunk: a provider that delivers many events per read.
    Burst,
    /// Each write is cut at arbitrary byte positions (pieces of 1 to 29 bytes, lengths
    /// varying deterministically), blind to the framing: Bedrock's binary event-stream
    /// messages arrive split inside their prelude, headers, payload and CRCs.
    Arbitrary,
}

/// Behaviour knobs of the mock upstream. Every field is optional; `None` means
/// "inherit from the lower-precedence level, else the documented default".
///
/// Wire formats follow the provider references:
/// <https://platform.openai.com/docs/api-reference/chat/streaming>,
/// <https://platform.openai.com/docs/api-reference/chat/object>,
/// <https://docs.anthropic.com/en/api/messages-streaming>,
/// <https://docs.anthropic.com/en/api/messages>.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Behavior {
    /// Number of generated tokens `"tok0 "`, `"tok1 "`, … (default 5). Ignored when `text` is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// Reply text; split into whitespace-delimited tokens, each keeping its trailing whitespace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Delay before each content token event, in ms (default 0; 20 in demo mode).
    /// For non-stream responses the head is delayed by `tokens * token_delay_ms` in total.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_delay_ms: Option<u64>,
    /// Delay after the request was read and before the response head is written, in ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_byte_delay_ms: Option<u64>,
    /// Delay after the response head and before the first SSE event (non-stream: before
    /// the body), in ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_event_delay_ms: Option<u64>,
    /// Respond with this HTTP status and a provider-shaped error JSON (unless 2xx).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Error body override: a JSON string is sent verbatim (may be non-JSON text),
    /// any other JSON value is serialized.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_body: Option<serde_json::Value>,
    /// Message inside the default provider-shaped error body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
    /// `Retry-After` header value in seconds, sent with error statuses.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_s: Option<u64>,
    /// The first N requests with this (effective) behaviour get `status` (default 503);
    /// later ones succeed. Counted per process, keyed by `fail_key` or the behaviour itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fail_first: Option<u64>,
    /// Name of the `fail_first` counter (default: the serialized effective behaviour).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fail_key: Option<String>,
    /// Read the request, then send nothing until the peer closes (bounded by `stall_max_ms`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stall: Option<bool>,
    /// Stream N content tokens, then go silent (bounded by `stall_max_ms`).
    /// Non-stream: send the head and half of the body, then go silent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stall_after_tokens: Option<u64>,
    /// Upper bound of any stall, in ms (default 600000); afterwards the connection is closed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stall_max_ms: Option<u64>,
    /// Stream N content tokens, then close the TCP connection without the chunked terminator.
    /// Non-stream: send the head and half of the body, then close.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drop_after_tokens: Option<u64>,
    /// Send the 200 response head, then close the connection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub close_before_first_event: Option<bool>,
    /// When the mock closes abruptly (`drop_after_tokens`, `close_before_first_event`),
    /// send a TCP RST (SO_LINGER 0) instead of a FIN.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reset: Option<bool>,
    /// After N content tokens, emit a provider-shaped error event and end the stream
    /// (OpenAI: `data: {"error":…}`; Anthropic: `event: error`), without `[DONE]`.
    /// Bedrock: an event-stream exception message named by `error_type` (default by
    /// `status`); with 0 it is the stream's first message, before `message_start`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_after_tokens: Option<u64>,
    /// Use `\r\n` line endings in the SSE stream.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub crlf: Option<bool>,
    /// Use bare `\r` line endings in the SSE stream.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lone_cr: Option<bool>,
    /// How events are cut into separate writes / HTTP chunks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub split: Option<Split>,
    /// Emit SSE comment events `: OPENROUTER PROCESSING` before every event.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comments: Option<bool>,
    /// Split each event's JSON across two `data:` lines (cut after the first top-level comma).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub multi_line_data: Option<bool>,
    /// Add `event: chunk` lines to OpenAI events (Anthropic events always carry names).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_names: Option<bool>,
    /// Write `data:` / `event:` without the space after the colon.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_space: Option<bool>,
    /// `true`: the final OpenAI usage chunk even without `stream_options.include_usage`;
    /// `false`: none even when asked (a provider that never reports usage in streams).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<bool>,
    /// Slow-reader mode: stream ~1 KiB content chunks as fast as the peer reads until this
    /// many response body bytes were written, then finish normally.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_bytes: Option<u64>,
    /// Extra response headers (name → value) on every response.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headers: Option<BTreeMap<String, String>>,
    /// Drift: what a provider's next API version might add, for the gateway's transparency
    /// tests (see [`Drift`]). OpenAI and Anthropic wire formats (Bedrock InvokeModel and
    /// Vertex AI Claude included); ignored by Gemini and Converse answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drift: Option<Drift>,
    /// Demo mode: reply `"Hello from Sluice's built-in demo provider. You said: <last user
    /// message, first 200 chars>"`, one token per word, `token_delay_ms` default 20.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub demo: Option<bool>,
    /// Fixed response id (default `chatcmpl-mock…` / `msg_mock…`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Fixed `created` timestamp, Unix seconds (default: now).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created: Option<u64>,
    /// Override of `finish_reason` (OpenAI, default `stop`) / `stop_reason` (Anthropic, default `end_turn`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
    /// Override of the prompt/input token count (default: words in the request messages, min 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<u64>,
    /// Model ids listed by `GET …/models` (default `["mock-model"]`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    /// Answer with `Connection: close` and close the connection after the response.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub close: Option<bool>,
    /// With `text`: play a model that starts its answer again when asked to continue a cut
    /// one: the answer is the request's last assistant message (the text so far that a
    /// continuation request carries, none in an ordinary request) followed by `text`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restart_answer: Option<bool>,
    /// The model id the answer names (every chunk, every body) instead of the one asked
    /// for, as real providers do (`gpt-4o-mini` → `gpt-4o-mini-2024-07-18`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer_model: Option<String>,
    /// Stream: after N content tokens, write the first half of the next event's bytes, then
    /// end the body cleanly (chunked terminator): a truncated last event.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truncate_after_tokens: Option<u64>,
    /// Stream: after N content tokens, one extra event whose `data:` line is not JSON
    /// (`{"id":"mock-malformed","choices":[{"delta":{"content":"lost"}` cut short), then the
    /// stream goes on as usual: a provider's malformed event.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub malformed_event_after_tokens: Option<u64>,
    /// Content tokens carry invalid UTF-8: `tok{i}` followed by the raw bytes `C3 28 FF`
    /// (a lead byte without its continuation, then a byte never valid in UTF-8); a client
    /// decoding as WHATWG SSE does sees `tok{i}\u{FFFD}(\u{FFFD}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invalid_utf8: Option<bool>,
    /// Stream: after the content tokens, end the body cleanly with no finish reason and no
    /// terminator (OpenAI: no finish chunk, usage chunk or `[DONE]`; Anthropic: no
    /// `content_block_stop`, `message_delta` or `message_stop`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_finish: Option<bool>,
    /// Stream: send the finish reason (and usage), then end the body cleanly without the
    /// terminator (OpenAI: no `[DONE]`; Anthropic: no `message_stop`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_done: Option<bool>,
    /// Compress chat answers and error bodies with this `Content-Encoding`: `gzip`, `deflate` (zlib),
    /// `deflate-raw` (raw deflate sent as `deflate`), `br`, `zstd`; any other name is sent
    /// as the header over an uncompressed body. Streams are flushed after every event.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_encoding: Option<String>,
    /// The first content token is this many bytes (`x` repeated) instead of `tok0 `: one
    /// huge event (a large tool call or reasoning block).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub big_token_bytes: Option<u64>,
    /// Stream: during every token delay and during `first_event_delay_ms` (so before
    /// Anthropic's `message_start`) send a keepalive every N ms (Anthropic `event: ping`;
    /// OpenAI a `: ping` comment), upstream chatter that carries no content.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ping_interval_ms: Option<u64>,
    /// The error `type` in error bodies and in-band error events (default: from the
    /// status, e.g. Anthropic 529 `overloaded_error`, 429 `rate_limit_error`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_type: Option<String>,
    /// Answer every chat request with an SSE stream (`text/event-stream`), also one that
    /// asked for `stream: false`: a provider that ignores the flag.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream_always: Option<bool>,
    /// Answer every chat request that asked for a stream with the whole JSON answer
    /// (`application/json`) instead: a provider that ignores `stream: true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub json_always: Option<bool>,
    /// Answer every chat request with `200` and this body, verbatim (an HTML error page or
    /// text under a success status), with the `content_type` knob's `Content-Type`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer_body: Option<String>,
    /// The `Content-Type` of an `answer_body` answer (default `application/json`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// OpenAI Chat Completions answers carry this many choices (more than asked): choice
    /// `i` ≥ 1 is a copy of choice 0 marked `alt{i}` (`content` starts `alt{i}-`, tool call
    /// ids `call_alt{i}_…`, names `alt{i}_…`). Streams send each of choice 0's chunks, then
    /// the same chunk for every other index.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub choices: Option<u64>,
    /// Stream: start the body with a UTF-8 byte order mark (`EF BB BF`), which the WHATWG
    /// SSE decoder strips; with `split: bytewise` it arrives split across chunks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bom: Option<bool>,
    /// Answer with these tool calls (in order; two or more are parallel tool calls), after
    /// the reasoning and the text. Without `text` and `tokens` the answer has no text. The
    /// finish reason defaults to `tool_calls` (OpenAI) / `tool_use` (Anthropic). Streamed as
    /// OpenAI `tool_calls` deltas (index, id, type and `function.name` first, then
    /// `arguments` fragments) or Anthropic `tool_use` blocks (`input_json_delta` with
    /// `partial_json` fragments); each fragment counts as one content token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<MockToolCall>>,
    /// Play a model that uses one tool once (see the `tool_loop` module): a request that
    /// carries a tool result is answered with text quoting it; one that offers tools and
    /// carries no result, with one call of an offered tool (a shell tool by preference,
    /// called with `echo sluice-tool-ok`); in every provider dialect, stream or not.
    /// `text` and `tool_calls`, when set, win.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_loop: Option<bool>,
    /// With `tool_loop`: the text the answer that calls the tool starts with (as a model
    /// that says what it is about to do). The Vercel AI SDK's Responses provider then names
    /// that text by `item_reference` in its next request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_loop_text: Option<String>,
    /// Answer with this reasoning before the text, one word per event: OpenAI-compatible
    /// `reasoning_content` (as DeepSeek and vLLM send it, with
    /// `completion_tokens_details.reasoning_tokens` in the usage), Anthropic a `thinking`
    /// block (`thinking_delta` events, then a `signature_delta`). Each word counts as one
    /// content token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    /// The Anthropic thinking `signature` sent with `reasoning` (default
    /// `mock-signature-<response id>`); OpenAI-compatible answers carry none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    /// Prompt tokens read from the provider's prompt cache (part of the prompt tokens, at
    /// most all of them): OpenAI `prompt_tokens_details.cached_tokens`; Anthropic
    /// `cache_read_input_tokens`, with `input_tokens` counting only the rest, as Anthropic
    /// does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u64>,
    /// Prompt tokens written to the provider's prompt cache (part of the prompt tokens, at
    /// most those not read from it): Anthropic `cache_creation_input_tokens`, with
    /// `input_tokens` counting only the rest; OpenAI-compatible answers have no such field.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_write_tokens: Option<u64>,
    /// Act like a provider's prompt cache: a request whose system prompt and first message
    /// this mock process has answered before reports its prompt tokens but those of its last
    /// message as read from the cache (`cached_tokens`, when that knob is unset). The process
    /// remembers at most [`super::PROMPT_CACHE_ENTRIES`] prefixes (then starts afresh);
    /// `POST /_mock/reset` forgets them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_cache: Option<bool>,
    /// The provider key the cloud APIs accept (Azure `api-key`, Gemini `x-goog-api-key`):
    /// another key gets the provider's rejection (Azure 401, Gemini 400 `API_KEY_INVALID`).
    /// Unset: any non-empty key is accepted (a missing one is still rejected).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// Azure OpenAI: answer the `content_filter` 400 (the prompt was filtered).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_filter: Option<bool>,
    /// Google OAuth2 token endpoint (`POST /token`): the service-account public key (PEM
    /// `PUBLIC KEY`, SPKI) that assertions must be signed with (RS256). Without it every
    /// assertion is refused (`invalid_grant`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_public_key: Option<String>,
    /// Google OAuth2 token endpoint: lifetime of the access tokens it issues, seconds
    /// (`expires_in`; default 3599). Vertex AI paths refuse a token past it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_lifetime_s: Option<u64>,
    /// Google OAuth2 token endpoint: answer every token request with this HTTP status and
    /// an OAuth2 error body instead of a token (a failing endpoint).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_status: Option<u16>,
}

/// The `drift` knob: members and events no gateway knows yet.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Drift {
    /// Members added to the top-level object of a whole answer and of every streamed
    /// event's data (a member of the same name is replaced).
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub members: serde_json::Map<String, serde_json::Value>,
    /// Events written, in order, right before the stream's first content event.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<DriftEvent>,
}

/// One event of [`Drift::events`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriftEvent {
    /// The SSE `event:` name (none: a data-only event, as OpenAI streams are).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// The event's data, sent as compact JSON.
    pub data: serde_json::Value,
}

impl Drift {
    /// `data` with [`Drift::members`] merged into its top-level object; other data (`[DONE]`,
    /// non-objects) unchanged.
    pub(crate) fn apply(&self, data: &str) -> String {
        if self.members.is_empty() {
            return data.to_string();
        }
        match serde_json::from_str::<serde_json::Value>(data) {
            Ok(serde_json::Value::Object(mut o)) => {
                for (k, v) in &self.members {
                    o.insert(k.clone(), v.clone());
                }
                serde_json::Value::Object(o).to_string()
            }
            _ => data.to_string(),
        }
    }
}

/// One tool call of the `tool_calls` knob.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MockToolCall {
    /// Function name.
    pub name: String,
    /// Arguments: a JSON object (sent as its compact JSON text), or a JSON string sent
    /// verbatim as the argument text; absent = `{}`.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub arguments: serde_json::Value,
    /// Call id (default `call_mock<n>_<i>` for OpenAI, `toolu_mock<n>_<i>` for Anthropic).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

impl MockToolCall {
    /// The argument text as the mock sends it.
    pub(crate) fn arguments_text(&self) -> String {
        match &self.arguments {
            serde_json::Value::Null => "{}".to_string(),
            serde_json::Value::String(s) => s.clone(),
            v => v.to_string(),
        }
    }
}

macro_rules! merge_fields {
    ($hi:expr, $lo:expr, $($f:ident),* $(,)?) => {
        Behavior { $($f: $hi.$f.clone().or_else(|| $lo.$f.clone()),)* }
    };
}

impl Behavior {
    /// The behaviour of the built-in demo provider (`demo: true`).
    pub fn demo() -> Self {
        Behavior {
            demo: Some(true),
            ..Behavior::default()
        }
    }

    /// Parse a behaviour from JSON text (unknown fields are rejected).
    pub fn from_json(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// Field-wise merge: knobs set on `self` win, unset ones are taken from `lower`.
    pub fn merged_over(&self, lower: &Behavior) -> Behavior {
        merge_fields!(
            self,
            lower,
            tokens,
            text,
            token_delay_ms,
            first_byte_delay_ms,
            first_event_delay_ms,
            status,
            error_body,
            error_message,
            retry_after_s,
            fail_first,
            fail_key,
            stall,
            stall_after_tokens,
            stall_max_ms,
            drop_after_tokens,
            close_before_first_event,
            reset,
            error_after_tokens,
            crlf,
            lone_cr,
            split,
            comments,
            multi_line_data,
            event_names,
            no_space,
            usage,
            total_bytes,
            headers,
            drift,
            demo,
            id,
            created,
            finish_reason,
            prompt_tokens,
            models,
            close,
            restart_answer,
            answer_model,
            truncate_after_tokens,
            malformed_event_after_tokens,
            invalid_utf8,
            no_finish,
            no_done,
            content_encoding,
            big_token_bytes,
            ping_interval_ms,
            error_type,
            stream_always,
            json_always,
            answer_body,
            content_type,
            choices,
            bom,
            tool_calls,
            tool_loop,
            tool_loop_text,
            reasoning,
            signature,
            cached_tokens,
            cache_write_tokens,
            prompt_cache,
            api_key,
            content_filter,
            token_public_key,
            token_lifetime_s,
            token_status,
        )
    }

    pub(crate) fn flag(v: Option<bool>) -> bool {
        v.unwrap_or(false)
    }

    /// Effective delay before each token, in ms.
    pub(crate) fn token_delay(&self) -> u64 {
        self.token_delay_ms
            .unwrap_or(if Self::flag(self.demo) { 20 } else { 0 })
    }

    /// Effective split mode.
    pub(crate) fn split_mode(&self) -> Split {
        self.split.unwrap_or_default()
    }

    /// Effective stall bound, in ms.
    pub(crate) fn stall_max(&self) -> u64 {
        self.stall_max_ms.unwrap_or(600_000)
    }
}
