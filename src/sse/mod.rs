//! The SSE hot path: everything Sluice does to a streaming response body on
//! its way from the upstream to the client, per upstream chunk.
//!
//! This module owns:
//!
//! * [`SseNormalizer`] — incremental re-framing of raw upstream body chunks
//!   (arbitrary boundaries) into complete, normalized `text/event-stream`
//!   events ([`SseEvent`]), with bounded memory ([`SseError`]).
//! * [`ModelRewriter`] / [`ModelPath`] — the model echo: the value of the
//!   response's own `model` member, whatever id the provider answered, becomes
//!   the standard model id inside JSON text (SSE events or whole JSON bodies),
//!   located by a structural byte scan, not a JSON parse.
//! * [`extract_usage`] / [`Usage`] — cheap token-usage extraction from a
//!   chunk's JSON (OpenAI and Anthropic field names).
//! * [`usage_object`] — the provider's `usage` objects of a chunk, found by one byte
//!   scan; the protocol layer reads them in the upstream dialect's terms
//!   (`protocol::merge_chunk_usage`).
//! * [`has_content`] — a cheap "does this chunk carry generated output" check
//!   (used for time-to-first-token and output-event counting);
//!   [`has_finish_reason`] — "does this chunk end the answer" (a stream that
//!   ends without it broke off).
//! * [`repair_utf8`] — the same UTF-8 repair for a whole non-stream body.
//! * [`openai_error_event`] and [`KEEPALIVE_COMMENT`] — the frames Sluice
//!   itself injects into a committed stream.
//!
//! Format sources: the SSE event-stream interpretation rules of the WHATWG
//! HTML standard
//! (<https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation>)
//! and OpenAI's chat-completions streaming reference
//! (<https://platform.openai.com/docs/api-reference/chat/streaming>).
//!
//! The module is self-contained: it depends only on `bytes`, `memchr`,
//! `serde` and `serde_json`, never on other Sluice modules.
#![warn(missing_docs)]

mod normalize;
mod rewrite;
mod usage;

#[cfg(test)]
mod tests;

pub use normalize::{SseError, SseEvent, SseNormalizer};
pub use rewrite::{EchoMemo, ModelPath, ModelRewriter};
pub use usage::{
    extract_usage, has_content, has_content_anthropic_first, has_finish_reason,
    is_usage_only_chunk, usage_object, Usage,
};

use bytes::Bytes;

/// A whole (non-stream) body as valid UTF-8: `None` when it already is (the fast path, one
/// `std::str::from_utf8` check), else the repaired copy, each maximal invalid subpart
/// replaced with U+FFFD (as `String::from_utf8_lossy` and the WHATWG UTF-8 decode do), with
/// the number of replacements.
pub fn repair_utf8(body: &[u8]) -> Option<(Vec<u8>, u64)> {
    if std::str::from_utf8(body).is_ok() {
        return None;
    }
    let mut out = Vec::with_capacity(body.len() + 8);
    let mut replaced = 0;
    for chunk in body.utf8_chunks() {
        out.extend_from_slice(chunk.valid().as_bytes());
        if !chunk.invalid().is_empty() {
            out.extend_from_slice("\u{FFFD}".as_bytes());
            replaced += 1;
        }
    }
    Some((out, replaced))
}

/// An SSE comment frame (`": keepalive\n\n"`) that clients ignore; written
/// downstream on idle streams to keep intermediaries from timing out.
///
/// Per the SSE spec a line starting with `:` is a comment and the blank line
/// ends the (empty) event, so no event is dispatched to the client.
pub const KEEPALIVE_COMMENT: &[u8] = b": keepalive\n\n";

/// Builds the SSE frame Sluice sends when a stream breaks after the response
/// was committed (status and headers already sent), in OpenAI's error shape:
///
/// ```text
/// event: error
/// data: {"error":{"message":"…","type":"…","code":"…"}}
///
/// ```
///
/// All three strings are JSON-escaped (via `serde_json`), so any UTF-8 input
/// is safe. The result always ends with the event-terminating blank line.
pub fn openai_error_event(message: &str, error_type: &str, code: &str) -> Bytes {
    let message = json_string(message);
    let error_type = json_string(error_type);
    let code = json_string(code);
    let mut out = Vec::with_capacity(64 + message.len() + error_type.len() + code.len());
    out.extend_from_slice(b"event: error\ndata: {\"error\":{\"message\":");
    out.extend_from_slice(message.as_bytes());
    out.extend_from_slice(b",\"type\":");
    out.extend_from_slice(error_type.as_bytes());
    out.extend_from_slice(b",\"param\":null,\"code\":");
    out.extend_from_slice(code.as_bytes());
    out.extend_from_slice(b"}}\n\n");
    Bytes::from(out)
}

/// `s` as a quoted, escaped JSON string literal (infallible).
pub(crate) fn json_string(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}
