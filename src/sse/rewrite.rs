//! The model echo: the response's own `model` member gets the standard model id, whatever
//! id the provider answered with, without parsing the JSON.

use bytes::BytesMut;

use super::normalize::SseEvent;

/// Where a dialect's response names its model: a path of object member keys from the
/// top-level object, the last one being the model member itself.
///
/// * Chat Completions (chunks and bodies): `{"model":…}` — [`ModelPath::CHAT_COMPLETIONS`].
/// * Anthropic Messages stream `message_start`: `{"message":{"model":…}}` —
///   `ModelPath::new(&["message", "model"])`.
/// * Responses API stream events: `{"response":{"model":…}}` —
///   `ModelPath::new(&["response", "model"])`.
///
/// Only objects are followed (never array elements), and only the first member with a
/// path key at each level is considered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelPath(&'static [&'static str]);

impl ModelPath {
    /// The top-level `model` member (OpenAI Chat Completions chunks and bodies).
    pub const CHAT_COMPLETIONS: ModelPath = ModelPath(&["model"]);

    /// A path of member keys, outermost first; the last key names the model member.
    /// Keys are compared with the raw (unescaped) key text, so they must be plain ASCII
    /// without characters JSON escapes.
    ///
    /// # Panics
    /// At compile time (in a `const`) or construction if `keys` is empty.
    pub const fn new(keys: &'static [&'static str]) -> Self {
        assert!(
            !keys.is_empty(),
            "a model path names at least the model member"
        );
        ModelPath(keys)
    }
}

/// Replaces the value of the response's own model member with the standard model id inside
/// JSON text: SSE events ([`rewrite_event`](Self::rewrite_event)) or whole JSON bodies
/// ([`rewrite_json`](Self::rewrite_json)).
///
/// The provider may answer any id (`gpt-4o-mini` → `gpt-4o-mini-2024-07-18`, dated
/// Anthropic snapshots, Azure deployment names, vLLM model paths): the value is replaced
/// whatever it is. Only the member the [`ModelPath`] names is touched: a structural byte
/// scan walks the JSON members from the top-level object (skipping strings with `memchr`,
/// so a `"model"` inside string content with escaped quotes never matches; skipping nested
/// values, so a `"model"` key inside tool-call arguments or any other nested object does not
/// match either) and stops right after the model value; the rest of the text is copied with
/// one `extend_from_slice`. Only a string value is replaced (a `null` or malformed value is
/// left alone); its spacing and the rest of the text stay byte for byte.
///
/// Allocation-free: the output goes into the caller's reused buffer. Per stream, an
/// [`EchoMemo`] makes the common case a byte comparison: the events of one stream name the
/// model behind the same bytes (`data: {"id":"chatcmpl-…","object":…,"created":…,"model":`).
#[derive(Debug, Clone)]
pub struct ModelRewriter {
    path: ModelPath,
    /// The quoted, escaped standard model id.
    replacement: Vec<u8>,
}

impl ModelRewriter {
    /// A rewriter of the Chat Completions top-level `model` member to `standard_model`
    /// (a plain, unescaped string).
    pub fn new(standard_model: &str) -> Self {
        Self::at(ModelPath::CHAT_COMPLETIONS, standard_model)
    }

    /// A rewriter of the model member at `path` to `standard_model`.
    pub fn at(path: ModelPath, standard_model: &str) -> Self {
        ModelRewriter {
            path,
            replacement: super::json_string(standard_model).into_bytes(),
        }
    }

    /// Appends the whole JSON text `input` (a non-stream body, or one SSE data payload) to
    /// `out`, with the model member's string value replaced. Text that is not JSON, or has no
    /// such member, is copied unchanged.
    pub fn rewrite_json(&self, input: &[u8], out: &mut BytesMut) {
        match locate(input, self.path.0) {
            Some((a, b)) => self.splice(input, a, b, out),
            None => out.extend_from_slice(input),
        }
    }

    /// Appends one normalized SSE event (its raw bytes, see [`SseEvent::raw`]) to `out`,
    /// with the model member of its data payload replaced. The JSON is the event's data:
    /// one `data:` line (the hot path, scanned in place), or several joined with `\n` (the
    /// member is located in the joined text and mapped back to its line).
    ///
    /// `memo` is the stream's [`EchoMemo`]: when the event's bytes up to where the previous
    /// event's model value began are the same, the value begins there too (the scan is a
    /// left-to-right function of those bytes), so only its end is searched.
    pub fn rewrite_event(&self, ev: &SseEvent<'_>, memo: &mut EchoMemo, out: &mut BytesMut) {
        let raw = ev.raw();
        let span = match ev.data_line_count() {
            0 => None,
            1 => {
                let (da, db) = ev.first_data_span();
                let data_end = raw.get(..db).unwrap_or_default();
                let p = memo.prefix.len();
                let remembered = (p > da && data_end.get(p) == Some(&b'"'))
                    .then(|| raw.get(..p))
                    .flatten()
                    .filter(|head| *head == memo.prefix.as_slice())
                    .and_then(|_| string_end(data_end, p))
                    .map(|end| (p, end));
                remembered.or_else(|| {
                    let found = raw
                        .get(da..db)
                        .and_then(|d| locate(d, self.path.0))
                        .map(|(a, b)| (da + a, da + b));
                    memo.prefix.clear();
                    if let Some((a, _)) = found {
                        if a <= MEMO_MAX_BYTES {
                            memo.prefix
                                .extend_from_slice(raw.get(..a).unwrap_or_default());
                        }
                    }
                    found
                })
            }
            _ => locate_multi_line(ev, self.path.0),
        };
        match span {
            Some((a, b)) => self.splice(raw, a, b, out),
            None => out.extend_from_slice(raw),
        }
    }

    /// Appends `input` with `input[a..b]` replaced by the standard id.
    #[inline]
    fn splice(&self, input: &[u8], a: usize, b: usize, out: &mut BytesMut) {
        out.extend_from_slice(input.get(..a).unwrap_or_default());
        out.extend_from_slice(&self.replacement);
        out.extend_from_slice(input.get(b..).unwrap_or_default());
    }
}

/// Longest event prefix an [`EchoMemo`] keeps, bytes.
const MEMO_MAX_BYTES: usize = 512;

/// Per-stream memo of [`ModelRewriter::rewrite_event`]: the raw bytes of the last event up
/// to where its model value began (at most 512 bytes; empty when it had none). Reused, so
/// it allocates once per stream.
#[derive(Debug, Default, Clone)]
pub struct EchoMemo {
    prefix: Vec<u8>,
}

/// The model span of a multi-line data event, in raw event coordinates.
#[cold]
fn locate_multi_line(ev: &SseEvent<'_>, path: &[&str]) -> Option<(usize, usize)> {
    let data = ev.data()?;
    let (s, e) = locate(&data, path)?;
    // A JSON string never spans a line (a raw newline in a string is not JSON), so the
    // span lies within one data line's value: find it.
    let raw = ev.raw();
    let mut joined = 0usize;
    let mut line_start = 0usize;
    for line in raw.split(|&b| b == b'\n') {
        let here = line_start;
        line_start += line.len() + 1;
        let Some(after) = line.strip_prefix(b"data") else {
            continue;
        };
        let skip = match after {
            [] => 4,
            [b':', b' ', ..] => 6,
            [b':', ..] => 5,
            _ => continue,
        };
        let len = line.len().saturating_sub(skip);
        if s >= joined && e <= joined + len {
            let base = here + skip - joined;
            return Some((base + s, base + e));
        }
        joined += len + 1;
    }
    None
}

/// Skips JSON whitespace from `i`.
#[inline]
fn skip_ws(s: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = s.get(i) {
        i += 1;
    }
    i
}

/// `s[i] == b'"'`: the index just past the string's closing (unescaped) quote.
#[inline]
fn string_end(s: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    loop {
        let k = j + memchr::memchr2(b'"', b'\\', s.get(j..)?)?;
        if s.get(k) == Some(&b'\\') {
            j = k + 2;
        } else {
            return Some(k + 1);
        }
    }
}

/// Skips one JSON value starting at `i` (after whitespace): the index just past it.
fn value_end(s: &[u8], i: usize) -> Option<usize> {
    match s.get(i)? {
        b'"' => string_end(s, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            loop {
                match s.get(j)? {
                    b'"' => {
                        j = string_end(s, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
        }
        _ => {
            // A number, `true`, `false` or `null`: up to the next delimiter.
            let rest = s.get(i..)?;
            let n = rest
                .iter()
                .position(|b| matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
                .unwrap_or(rest.len());
            Some(i + n)
        }
    }
}

/// The span (quotes included) of the string value at `path` in the JSON text `s`, or
/// `None` when the text is not an object holding such a string member.
fn locate(s: &[u8], path: &[&str]) -> Option<(usize, usize)> {
    let mut i = skip_ws(s, 0);
    if s.get(i) != Some(&b'{') {
        return None;
    }
    let mut level = 0usize;
    i += 1;
    loop {
        // Inside an object on the path, before a member (or its closing brace).
        i = skip_ws(s, i);
        match s.get(i)? {
            b'"' => {}
            _ => return None, // `}` (not found) or not JSON
        }
        let key_end = string_end(s, i)?;
        let key = s.get(i + 1..key_end - 1)?;
        i = skip_ws(s, key_end);
        if s.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(s, i + 1);
        let wanted = path.get(level)?;
        if key == wanted.as_bytes() {
            if level + 1 == path.len() {
                return match s.get(i) {
                    Some(b'"') => Some((i, string_end(s, i)?)),
                    _ => None,
                };
            }
            if s.get(i) == Some(&b'{') {
                level += 1;
                i += 1;
                continue;
            }
            return None;
        }
        i = skip_ws(s, value_end(s, i)?);
        match s.get(i)? {
            b',' => i += 1,
            _ => return None, // `}`: this object has no such member
        }
    }
}
