//! Owns the decoding of Bedrock's binary stream framing: the
//! `application/vnd.amazon.eventstream` body of `InvokeModelWithResponseStream`, turned into
//! the SSE events of the dialect the route speaks, so the rest of the stream path (the SSE
//! normalizer, the model echo, the dialect translators, metering) is the one every provider
//! uses.
//!
//! The framing (AWS's event-stream encoding): each message is a 12-byte prelude (total
//! length u32 BE, headers length u32 BE, prelude CRC32), the headers (name length u8, name,
//! value type u8, value), the payload and a message CRC32, all big-endian. The crate
//! `aws-smithy-eventstream` ([`read_message_from`]) checks both CRCs and parses the
//! headers; this module only finds message boundaries (chunks may split a message
//! anywhere, or carry several) and bounds a message's size.
//!
//! What a message means, by its `:message-type` header:
//! - `event` with `:event-type: chunk`: the payload is `{"bytes":"<base64>"}` (Bedrock may
//!   add a padding member `"p"`), the base64 holding one Anthropic Messages stream event's
//!   data JSON; it becomes `event: {type}\ndata: {json}\n\n` (`message_stop` without the
//!   `amazon-bedrock-invocationMetrics` member Bedrock adds, its other members kept: the
//!   client cannot tell Bedrock answered).
//! - `event` of a Converse stream (a decoder made with [`EventStreamDecoder::converse`]):
//!   the payload is the event's JSON itself (no base64; Bedrock may add a padding member
//!   `"p"`), named by `:event-type` (`messageStart`, `contentBlockDelta`, `metadata`, ...);
//!   it becomes `event: {event type}\ndata: {json}\n\n` (the `converse` submodule), read by
//!   [`crate::protocol::converse::StreamDecoder`].
//! - `exception` with `:exception-type` (`modelStreamErrorException`,
//!   `throttlingException`, `internalServerException`, `serviceUnavailableException`,
//!   `validationException`, `modelTimeoutException`) and a `{"message": ...}` payload: it
//!   becomes an Anthropic `error` event typed by [`exception_error_type`], which the stream
//!   path turns into the client's in-stream error (or a fallback before the first event).
//! - `error` (`:error-code`, `:error-message` headers): the same, typed `api_error`.
//!
//! References: <https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_InvokeModelWithResponseStream.html>
//! (the `chunk` event and the exceptions of the response stream),
//! <https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_ConverseStreamOutput.html>
//! (the Converse stream's events and exceptions),
//! <https://docs.aws.amazon.com/transcribe/latest/dg/streaming-setting-up.html#streaming-event-stream>
//! (the event-stream message format), the `aws-smithy-eventstream` crate (its reference
//! implementation in the Rust SDK).

use aws_smithy_eventstream::frame::read_message_from;
use aws_smithy_types::event_stream::{HeaderValue, Message};
use base64_simd::AsOut as _;
use bytes::{Buf, BytesMut};

mod converse;

/// Bytes of a message's prelude (total length, headers length, prelude CRC).
const PRELUDE_BYTES: usize = 12;
/// Smallest valid message: prelude plus the message CRC.
const MIN_MESSAGE_BYTES: usize = 16;
/// Headroom over `max_event_bytes` for a message's framing, headers and base64 growth.
const FRAMING_SLACK_BYTES: usize = 4096;

/// Why an event-stream body cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventStreamError {
    /// A message announced more bytes than the limit (`server.max_event_bytes`, in decoded
    /// event bytes, with framing slack).
    #[error("an event-stream message of {announced} bytes is over the limit of {limit} bytes")]
    TooLarge {
        /// Length from the prelude, bytes.
        announced: usize,
        /// The limit, bytes.
        limit: usize,
    },
    /// A message is malformed: a CRC mismatch, bad header types, a length under the
    /// minimum, a payload that is not the documented JSON, invalid base64.
    #[error("malformed event-stream message: {0}")]
    Malformed(String),
    /// The body ended inside a message.
    #[error("the event stream ended in the middle of a message")]
    Truncated,
}

/// Incremental decoder of one event-stream body into SSE bytes (see the module docs).
/// Reused buffers: after warm-up it allocates only what the crate's message parser does
/// (`read_message_from`: the header vector, each header's name and value, the payload: 8
/// allocations per `chunk` message, none of them avoidable from outside the crate, whose
/// CRC-computing reader copies every `copy_to_bytes` whatever the source buffer).
#[derive(Debug)]
pub struct EventStreamDecoder {
    /// Bytes of an incomplete message carried over from earlier chunks.
    pending: BytesMut,
    /// Most bytes one message may announce.
    max_message_bytes: usize,
    /// The base64-decoded event JSON of the message being converted.
    json: Vec<u8>,
    /// What an `event` message carries: an InvokeModel `chunk` or a Converse event.
    payload: Payload,
}

/// The payload of a stream's `event` messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Payload {
    /// `InvokeModelWithResponseStream`: `chunk` events with base64 Anthropic event JSON.
    Chunk,
    /// `ConverseStream`: the event JSON itself, named by `:event-type`.
    Converse,
}

impl EventStreamDecoder {
    /// A decoder whose events may decode to at most `max_event_bytes` of JSON each.
    pub fn new(max_event_bytes: usize) -> Self {
        Self {
            pending: BytesMut::new(),
            // Base64 is 4/3 of the JSON; headers and the `{"bytes":...}` wrapper add a little.
            max_message_bytes: max_event_bytes
                .saturating_mul(4)
                .div_ceil(3)
                .saturating_add(FRAMING_SLACK_BYTES),
            json: Vec::new(),
            payload: Payload::Chunk,
        }
    }

    /// A decoder of a `ConverseStream` body (see the module docs), events of at most
    /// `max_event_bytes` each.
    pub fn converse(max_event_bytes: usize) -> Self {
        Self {
            payload: Payload::Converse,
            ..Self::new(max_event_bytes)
        }
    }

    /// Decodes the complete messages in `chunk` (with what earlier chunks left), appending
    /// one SSE event per message to `out`; an incomplete tail is kept for the next call.
    ///
    /// # Errors
    /// [`EventStreamError::TooLarge`] or [`EventStreamError::Malformed`]; `out` then holds
    /// the events of the messages before the bad one.
    pub fn push(&mut self, chunk: &[u8], out: &mut BytesMut) -> Result<(), EventStreamError> {
        let mut rest = chunk;
        if !self.pending.is_empty() {
            // Complete the carried-over message with only the bytes of `chunk` it lacks;
            // the messages after it are read from `chunk` itself.
            if self.pending.len() < 4 {
                let take = (4 - self.pending.len()).min(rest.len());
                self.pending.extend_from_slice(&rest[..take]);
                rest = &rest[take..];
            }
            let Some(total) = self.announced_len(&self.pending)? else {
                return Ok(());
            };
            let take = (total - self.pending.len()).min(rest.len());
            self.pending.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if self.pending.len() < total {
                return Ok(());
            }
            // Lent to `convert` and given back (its capacity kept for the next straddler).
            let msg = std::mem::take(&mut self.pending);
            let converted = self.convert(&msg, out);
            self.pending = msg;
            self.pending.clear();
            converted?;
        }
        // Whole messages straight from the chunk, no copy into `pending`.
        while let Some(len) = self.complete_len(rest)? {
            let (msg, tail) = rest.split_at(len);
            self.convert(msg, out)?;
            rest = tail;
        }
        self.pending.extend_from_slice(rest);
        Ok(())
    }

    /// The verdict at the end of the body.
    ///
    /// # Errors
    /// [`EventStreamError::Truncated`] when a partial message is left.
    pub fn finish(&self) -> Result<(), EventStreamError> {
        if self.pending.is_empty() {
            Ok(())
        } else {
            Err(EventStreamError::Truncated)
        }
    }

    /// The length of the message at the start of `buf` if all of it is there.
    fn complete_len(&self, buf: &[u8]) -> Result<Option<usize>, EventStreamError> {
        Ok(self
            .announced_len(buf)?
            .filter(|&total| buf.len() >= total.max(PRELUDE_BYTES)))
    }

    /// The length the message at the start of `buf` announces (`None` before its first
    /// 4 bytes), checked against the minimum and the limit.
    fn announced_len(&self, buf: &[u8]) -> Result<Option<usize>, EventStreamError> {
        let Some(prefix) = buf.get(..4) else {
            return Ok(None);
        };
        let mut len_bytes = [0u8; 4];
        len_bytes.copy_from_slice(prefix);
        let total = u32::from_be_bytes(len_bytes) as usize;
        if total < MIN_MESSAGE_BYTES {
            return Err(EventStreamError::Malformed(format!(
                "message length {total} is under the minimum of {MIN_MESSAGE_BYTES}"
            )));
        }
        if total > self.max_message_bytes {
            return Err(EventStreamError::TooLarge {
                announced: total,
                limit: self.max_message_bytes,
            });
        }
        Ok(Some(total))
    }

    /// Parses one complete message (CRCs checked by the crate) and appends its SSE event.
    fn convert(&mut self, bytes: &[u8], out: &mut BytesMut) -> Result<(), EventStreamError> {
        let mut buf = bytes;
        let msg =
            read_message_from(&mut buf).map_err(|e| EventStreamError::Malformed(e.to_string()))?;
        if buf.has_remaining() {
            return Err(EventStreamError::Malformed(
                "bytes after the message CRC".into(),
            ));
        }
        match string_header(&msg, ":message-type").unwrap_or("event") {
            "event" => match string_header(&msg, ":event-type") {
                Some(name) if self.payload == Payload::Converse => {
                    converse::converse_event(name, msg.payload(), out)
                }
                Some("chunk") => self.chunk_event(msg.payload(), out),
                // Events Bedrock may add later: nothing for the client.
                _ => Ok(()),
            },
            "exception" => {
                let name = string_header(&msg, ":exception-type").unwrap_or("exception");
                let message = payload_message(msg.payload())
                    .unwrap_or_else(|| format!("Bedrock stream exception {name}"));
                write_error_event(exception_error_type(name), name, &message, out);
                Ok(())
            }
            "error" => {
                let code = string_header(&msg, ":error-code").unwrap_or("error");
                let message = string_header(&msg, ":error-message").unwrap_or(code);
                write_error_event("api_error", code, message, out);
                Ok(())
            }
            other => Err(EventStreamError::Malformed(format!(
                "unknown :message-type `{other}`"
            ))),
        }
    }

    /// A `chunk` event: base64-decodes the event JSON and writes it as an SSE event named
    /// by its `type`. The type is read from the first bytes of the JSON (a prefix of the
    /// base64 decoded on the stack), then the JSON is decoded straight into `out`; only an
    /// event whose `type` is not its first member goes through the scratch buffer.
    fn chunk_event(&mut self, payload: &[u8], out: &mut BytesMut) -> Result<(), EventStreamError> {
        let b64 = chunk_bytes(payload)
            .ok_or_else(|| EventStreamError::Malformed("chunk payload has no `bytes`".into()))?;
        let mut head = [0u8; TYPE_PEEK_BYTES];
        let head = decoded_head(b64, &mut head)?;
        let name = match leading_type(head) {
            Some("message_stop") => {
                // Bedrock adds `amazon-bedrock-invocationMetrics` (its own token counts and
                // latencies) to the stop event; Anthropic's has no such member, and the
                // client must not tell which provider answered. Every other member passes
                // (once per stream: decoded whole).
                self.json.clear();
                BASE64
                    .decode_append(b64, &mut self.json)
                    .map_err(|e| EventStreamError::Malformed(format!("chunk `bytes`: {e}")))?;
                message_stop(&self.json, out);
                return Ok(());
            }
            Some(name) => name,
            None => return self.chunk_event_slow(b64, out),
        };
        let json_len = BASE64
            .decoded_length(b64)
            .map_err(|e| EventStreamError::Malformed(format!("chunk `bytes`: {e}")))?;
        let event_start = out.len();
        out.reserve(json_len + name.len() + 16);
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\ndata: ");
        let json_start = out.len();
        out.resize(json_start + json_len, 0);
        if let Err(e) = BASE64.decode(b64, out[json_start..].as_out()) {
            out.truncate(event_start);
            return Err(EventStreamError::Malformed(format!("chunk `bytes`: {e}")));
        }
        one_line_in_place(&mut out[json_start..]);
        out.extend_from_slice(b"\n\n");
        Ok(())
    }

    /// A `chunk` event whose JSON does not start with its `type`: decoded into the scratch
    /// buffer, the type read by serde.
    fn chunk_event_slow(&mut self, b64: &[u8], out: &mut BytesMut) -> Result<(), EventStreamError> {
        self.json.clear();
        BASE64
            .decode_append(b64, &mut self.json)
            .map_err(|e| EventStreamError::Malformed(format!("chunk `bytes`: {e}")))?;
        let name = event_type(&self.json)
            .ok_or_else(|| EventStreamError::Malformed("chunk event JSON has no `type`".into()))?;
        if name == "message_stop" {
            message_stop(&self.json, out);
            return Ok(());
        }
        out.reserve(self.json.len() + name.len() + 16);
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\ndata: ");
        push_one_line(&self.json, out);
        out.extend_from_slice(b"\n\n");
        Ok(())
    }
}

/// The base64 of a `chunk` payload: standard alphabet, padded (decoded with SIMD where
/// the CPU has it).
const BASE64: base64_simd::Base64 = base64_simd::STANDARD;

/// Writes Bedrock's `message_stop` event (its data JSON `json`) as Anthropic's: without the
/// `amazon-bedrock-invocationMetrics` member, every other member as Bedrock sent it (a stop
/// event that is not a JSON object becomes `{"type":"message_stop"}`). Once per stream.
fn message_stop(json: &[u8], out: &mut BytesMut) {
    out.extend_from_slice(b"event: message_stop\ndata: ");
    match serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(json) {
        Ok(mut event) => {
            event.remove("amazon-bedrock-invocationMetrics");
            let data = serde_json::Value::Object(event).to_string();
            out.extend_from_slice(data.as_bytes());
        }
        Err(_) => out.extend_from_slice(b"{\"type\":\"message_stop\"}"),
    }
    out.extend_from_slice(b"\n\n");
}

/// Bytes of an event JSON decoded to read its `type`: `{"type":"content_block_delta"` is
/// 29, the longest of Anthropic's stream events.
const TYPE_PEEK_BYTES: usize = 36;

/// The first up to [`TYPE_PEEK_BYTES`] bytes of the JSON that `b64` encodes: all of it when
/// short, else the decoded prefix of whole 4-character groups (no padding in a prefix).
fn decoded_head<'h>(
    b64: &[u8],
    head: &'h mut [u8; TYPE_PEEK_BYTES],
) -> Result<&'h [u8], EventStreamError> {
    const PEEK_CHARS: usize = TYPE_PEEK_BYTES / 3 * 4;
    let src = if b64.len() <= PEEK_CHARS {
        b64
    } else {
        &b64[..PEEK_CHARS]
    };
    BASE64
        .decode(src, head[..].as_out())
        .map(|h| &*h)
        .map_err(|e| EventStreamError::Malformed(format!("chunk `bytes`: {e}")))
}

/// The `type` of an event JSON that starts with it (`{"type":"content_block_delta",...`),
/// read from its first bytes.
fn leading_type(head: &[u8]) -> Option<&str> {
    let rest = head.strip_prefix(br#"{"type":""#)?;
    let end = memchr::memchr(b'"', rest)?;
    std::str::from_utf8(&rest[..end]).ok()
}

/// The value of a string header.
fn string_header<'m>(msg: &'m Message, name: &str) -> Option<&'m str> {
    msg.headers()
        .iter()
        .find(|h| h.name().as_str() == name)
        .and_then(|h| match h.value() {
            HeaderValue::String(s) => Some(s.as_str()),
            _ => None,
        })
}

/// The base64 text of a `{"bytes":"..."}` payload: the common shape read without a JSON
/// parse (base64 holds no quote or escape), any other spelling through serde.
fn chunk_bytes(payload: &[u8]) -> Option<&[u8]> {
    const PREFIX: &[u8] = br#"{"bytes":""#;
    if let Some(rest) = payload.strip_prefix(PREFIX) {
        let end = memchr::memchr(b'"', rest)?;
        return Some(&rest[..end]);
    }
    #[derive(serde::Deserialize)]
    struct Chunk<'a> {
        #[serde(borrow)]
        bytes: &'a str,
    }
    serde_json::from_slice::<Chunk<'_>>(payload)
        .ok()
        .map(|c| c.bytes.as_bytes())
}

/// The `type` of an Anthropic event JSON in any member order (serde; borrowed unless
/// escaped).
fn event_type(json: &[u8]) -> Option<std::borrow::Cow<'_, str>> {
    #[derive(serde::Deserialize)]
    struct Typed<'a> {
        #[serde(borrow)]
        r#type: std::borrow::Cow<'a, str>,
    }
    serde_json::from_slice::<Typed<'_>>(json)
        .ok()
        .map(|t| t.r#type)
}

/// The `message` (or `Message`) member of an exception payload.
fn payload_message(payload: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Body {
        #[serde(alias = "Message")]
        message: Option<String>,
    }
    serde_json::from_slice::<Body>(payload)
        .ok()
        .and_then(|b| b.message)
}

/// The Anthropic error type of a Bedrock stream exception (`:exception-type`, camel case
/// as Bedrock sends it, or the HTTP error names' Pascal case): throttling is
/// `rate_limit_error`, an unavailable service `overloaded_error`, a model timeout
/// `timeout_error`, a validation failure `invalid_request_error`, everything else
/// (`modelStreamErrorException`, `internalServerException`, ...) `api_error`.
pub fn exception_error_type(name: &str) -> &'static str {
    let lower = name.to_ascii_lowercase();
    match lower.trim_end_matches("exception") {
        "throttling" | "modelnotready" => "rate_limit_error",
        "serviceunavailable" => "overloaded_error",
        "modeltimeout" => "timeout_error",
        "validation" => "invalid_request_error",
        "accessdenied" => "permission_error",
        _ => "api_error",
    }
}

/// Appends an Anthropic `error` event: `{"type":"error","error":{"type":..,"message":..}}`,
/// the message prefixed with the exception's name.
fn write_error_event(error_type: &str, name: &str, message: &str, out: &mut BytesMut) {
    let data = serde_json::json!({
        "type": "error",
        "error": {"type": error_type, "message": format!("{name}: {message}")},
    });
    out.extend_from_slice(b"event: error\ndata: ");
    out.extend_from_slice(data.to_string().as_bytes());
    out.extend_from_slice(b"\n\n");
}

/// Turns the raw CR/LF of a JSON (whitespace between tokens, never inside strings) into
/// spaces, so that it is one SSE data line.
fn one_line_in_place(json: &mut [u8]) {
    if memchr::memchr2(b'\n', b'\r', json).is_some() {
        for b in json.iter_mut().filter(|b| **b == b'\n' || **b == b'\r') {
            *b = b' ';
        }
    }
}

/// Appends `json` as one SSE data line: raw CR/LF (JSON whitespace between tokens, never
/// inside strings) become spaces.
fn push_one_line(json: &[u8], out: &mut BytesMut) {
    if memchr::memchr2(b'\n', b'\r', json).is_none() {
        out.extend_from_slice(json);
        return;
    }
    out.extend(
        json.iter()
            .map(|&b| if b == b'\n' || b == b'\r' { b' ' } else { b }),
    );
}

#[cfg(test)]
mod tests;
