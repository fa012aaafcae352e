//! Cheap byte-level inspection of streaming chunk JSON: token usage and
//! "carries generated content".

use memchr::memmem::Finder;
use serde::Deserialize;
use std::sync::OnceLock;

/// Token usage reported by an upstream, in tokens.
///
/// From OpenAI's `"usage":{"prompt_tokens":N,"completion_tokens":M}` (chat
/// completions; sent in the last chunk when
/// `stream_options.include_usage` is set) or Anthropic / OpenAI-Responses
/// `"usage":{"input_tokens":N,"output_tokens":M}`. A field missing from the
/// object is `0`: Anthropic sends input tokens in `message_start` and the
/// final output count in `message_delta`, so callers should merge reports
/// (e.g. take the max of each field) rather than overwrite.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt / input tokens.
    pub input_tokens: u64,
    /// Completion / output tokens.
    pub output_tokens: u64,
}

#[derive(Deserialize)]
struct RawUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
}

fn finder(
    cell: &'static OnceLock<Finder<'static>>,
    needle: &'static [u8],
) -> &'static Finder<'static> {
    cell.get_or_init(|| Finder::new(needle))
}

/// Extracts token usage from one chunk's JSON data (an SSE data payload or
/// a whole non-streaming body).
///
/// Cheap: a single `memmem` scan for `"usage"`; only when it is followed by
/// `:` and an object (not `null`) is that object's byte span located and
/// deserialized with `serde_json` (the rest of the chunk is never parsed).
/// Returns `None` if there is no usage object or it has none of the known
/// fields as unsigned integers. If several `"usage"` members exist, the
/// first usable one wins.
pub fn extract_usage(data: &[u8]) -> Option<Usage> {
    static USAGE: OnceLock<Finder<'static>> = OnceLock::new();
    let usage = finder(&USAGE, b"\"usage\"");
    for pos in usage.find_iter(data) {
        let Some(rest) = data.get(pos + usage.needle().len()..) else {
            break;
        };
        let Some(value) = member_value(rest) else {
            continue;
        };
        if value.first() != Some(&b'{') {
            continue; // null or malformed
        }
        let Some(end) = object_end(value) else {
            continue;
        };
        let Ok(raw) = serde_json::from_slice::<RawUsage>(value.get(..end).unwrap_or_default())
        else {
            continue;
        };
        let input = raw.prompt_tokens.or(raw.input_tokens);
        let output = raw.completion_tokens.or(raw.output_tokens);
        if input.is_none() && output.is_none() {
            continue;
        }
        return Some(Usage {
            input_tokens: input.unwrap_or(0),
            output_tokens: output.unwrap_or(0),
        });
    }
    None
}

/// Hands each `usage` member's object of one chunk's JSON data (an SSE data payload or a
/// whole non-streaming body) to `merge`, in order, until `merge` takes one (returns true);
/// returns whether one was taken. Dialect-free: the caller reads the object in its
/// dialect's terms (see `protocol::merge_chunk_usage`). As cheap as [`extract_usage`]: one
/// `memmem` scan, `null` usage members skipped, only the object's bytes handed on.
pub fn usage_object(data: &[u8], mut merge: impl FnMut(&[u8]) -> bool) -> bool {
    static USAGE: OnceLock<Finder<'static>> = OnceLock::new();
    let usage = finder(&USAGE, b"\"usage\"");
    for pos in usage.find_iter(data) {
        let Some(rest) = data.get(pos + usage.needle().len()..) else {
            break;
        };
        let Some(value) = member_value(rest) else {
            continue;
        };
        if value.first() != Some(&b'{') {
            continue; // null or malformed
        }
        let Some(end) = object_end(value) else {
            continue;
        };
        if merge(value.get(..end).unwrap_or_default()) {
            return true;
        }
    }
    false
}

/// Whether a Chat Completions chunk's JSON is the usage-only chunk that
/// `stream_options.include_usage` adds at the end: a `"choices"` member whose value is an
/// empty array (every other chunk has one choice). A byte check; call it only for a chunk
/// that carries a usage object.
pub fn is_usage_only_chunk(data: &[u8]) -> bool {
    static CHOICES: OnceLock<Finder<'static>> = OnceLock::new();
    let key = finder(&CHOICES, b"\"choices\"");
    key.find_iter(data).any(|pos| {
        let rest = data.get(pos + key.needle().len()..).unwrap_or_default();
        match member_value(rest) {
            Some([b'[', after @ ..]) => trim_ws_start(after).first() == Some(&b']'),
            _ => false,
        }
    })
}

/// Whether a chunk's JSON carries generated output — used to stamp
/// time-to-first-token and to count output events.
///
/// Approximation (a byte check, no JSON parsing; escaped quotes inside
/// string content never match because the needles include the quotes):
/// true if any of these members is present with a non-empty value:
///
/// * `"content"`, `"reasoning_content"`, `"reasoning"`, `"refusal"`,
///   `"arguments"` with a string value other than `""` (OpenAI chat deltas,
///   common reasoning extensions, tool-call argument fragments);
/// * `"tool_calls"` with an array value other than `[]`;
/// * Anthropic `"text_delta"`, `"thinking_delta"` or `"input_json_delta"`
///   (a `content_block_delta` event).
///
/// `null` values, the role-only first chunk (`"content":""`) and usage-only
/// chunks yield false. It does not check *where* the member is (e.g. a
/// non-streaming body's `"message":{"content":"…"}` also counts).
pub fn has_content(data: &[u8]) -> bool {
    static CONTENT: OnceLock<Finder<'static>> = OnceLock::new();
    static REASONING_CONTENT: OnceLock<Finder<'static>> = OnceLock::new();
    static REASONING: OnceLock<Finder<'static>> = OnceLock::new();
    static REFUSAL: OnceLock<Finder<'static>> = OnceLock::new();
    static ARGUMENTS: OnceLock<Finder<'static>> = OnceLock::new();
    static TOOL_CALLS: OnceLock<Finder<'static>> = OnceLock::new();

    let string_keys: [(&'static OnceLock<Finder<'static>>, &'static [u8]); 5] = [
        (&CONTENT, b"\"content\""),
        (&REASONING_CONTENT, b"\"reasoning_content\""),
        (&REASONING, b"\"reasoning\""),
        (&REFUSAL, b"\"refusal\""),
        (&ARGUMENTS, b"\"arguments\""),
    ];
    for (cell, needle) in string_keys {
        if member_non_empty(data, finder(cell, needle), b'"', b'"') {
            return true;
        }
    }
    if member_non_empty(data, finder(&TOOL_CALLS, b"\"tool_calls\""), b'[', b']') {
        return true;
    }
    anthropic_delta(data)
}

/// [`has_content`] with its Anthropic check first: the same answer, found
/// with one search for a Messages `content_block_delta` (the OpenAI member
/// searches, which never match there, run only for the other events).
pub fn has_content_anthropic_first(data: &[u8]) -> bool {
    anthropic_delta(data) || has_content(data)
}

/// Anthropic: `{"type":"content_block_delta","delta":{"type":"text_delta",...}}`
/// (or `thinking_delta`, `input_json_delta`).
fn anthropic_delta(data: &[u8]) -> bool {
    static ANTHROPIC_DELTA: OnceLock<Finder<'static>> = OnceLock::new();
    let delta = finder(&ANTHROPIC_DELTA, b"_delta\"");
    delta.find_iter(data).any(|pos| {
        let head = data.get(..pos).unwrap_or_default();
        head.ends_with(b"\"text")
            || head.ends_with(b"\"thinking")
            || head.ends_with(b"\"input_json")
    })
}

/// Whether a Chat Completions chunk's JSON reports a finish reason: some
/// `"finish_reason"` member with a string value (`"stop"`, `"length"`,
/// `"tool_calls"`, …), not `null`. A byte check like [`has_content`]: a quoted
/// key inside string content has escaped quotes and never matches.
///
/// A stream that ends without any such chunk (and without `[DONE]`) broke
/// off; one that has it is complete even if `[DONE]` is missing.
pub fn has_finish_reason(data: &[u8]) -> bool {
    static FINISH_REASON: OnceLock<Finder<'static>> = OnceLock::new();
    let key = finder(&FINISH_REASON, b"\"finish_reason\"");
    key.find_iter(data).any(|pos| {
        let rest = data.get(pos + key.needle().len()..).unwrap_or_default();
        matches!(member_value(rest), Some([b'"', ..]))
    })
}

/// Whether some occurrence of the key `key` is followed by `:` and a value
/// starting with `open` whose next non-whitespace byte is not `close`.
fn member_non_empty(data: &[u8], key: &Finder<'_>, open: u8, close: u8) -> bool {
    key.find_iter(data).any(|pos| {
        let rest = data.get(pos + key.needle().len()..).unwrap_or_default();
        match member_value(rest) {
            Some([first, after @ ..]) if *first == open => {
                let after = if open == b'"' {
                    after
                } else {
                    trim_ws_start(after)
                };
                after.first().is_some_and(|&b| b != close)
            }
            _ => false,
        }
    })
}

/// Strips leading JSON whitespace.
#[inline]
fn trim_ws_start(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t' | b'\n' | b'\r', rest @ ..] = s {
        s = rest;
    }
    s
}

/// Given the bytes right after a quoted key, returns the bytes starting at
/// its value (`<ws> : <ws>` skipped), or `None` if no `:` follows (the
/// quoted text was a value, not a key).
#[inline]
fn member_value(after_key: &[u8]) -> Option<&[u8]> {
    match trim_ws_start(after_key) {
        [b':', rest @ ..] => Some(trim_ws_start(rest)),
        _ => None,
    }
}

/// Length of the JSON object starting at `s[0] == b'{'` (through its
/// matching `}`), honoring strings and escapes; `None` if unterminated.
fn object_end(s: &[u8]) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (i, &b) in s.iter().enumerate() {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod metering_tests {
    use super::*;
    use crate::protocol::merge_chunk_usage as merge_usage;
    use crate::protocol::{UpstreamDialect, Usage};

    #[test]
    fn chat_usage_is_read_with_every_class_and_replaces() {
        let mut u = Usage::default();
        assert!(!merge_usage(
            UpstreamDialect::ChatCompletions,
            br#"{"choices":[{"delta":{"content":"x"}}],"usage":null}"#,
            &mut u
        ));
        let last = br#"{"id":"c","choices":[],"usage":{"prompt_tokens":40,"completion_tokens":9,"total_tokens":49,"prompt_tokens_details":{"cached_tokens":15},"completion_tokens_details":{"reasoning_tokens":3}}}"#;
        assert!(merge_usage(UpstreamDialect::ChatCompletions, last, &mut u));
        assert_eq!(
            u,
            Usage {
                input_tokens: 40,
                output_tokens: 9,
                cache_read_tokens: 15,
                cache_write_tokens: 0,
                reasoning_tokens: 3,
            }
        );
        assert!(is_usage_only_chunk(last));
        assert!(!is_usage_only_chunk(
            br#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":1}}"#
        ));
        assert!(is_usage_only_chunk(br#"{"choices": [ ],"usage":{}}"#));
    }

    #[test]
    fn anthropic_usage_merges_message_start_and_the_cumulative_message_delta() {
        let mut u = Usage::default();
        let start = br#"{"type":"message_start","message":{"id":"m","content":[],"usage":{"input_tokens":25,"cache_creation_input_tokens":5,"cache_read_input_tokens":15,"output_tokens":1}}}"#;
        assert!(merge_usage(UpstreamDialect::Messages, start, &mut u));
        let delta = br#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":9}}"#;
        assert!(merge_usage(UpstreamDialect::Messages, delta, &mut u));
        // Canonical input includes the cache reads and writes.
        assert_eq!(
            u,
            Usage {
                input_tokens: 45,
                output_tokens: 9,
                cache_read_tokens: 15,
                cache_write_tokens: 5,
                reasoning_tokens: 0,
            }
        );
    }
}
