//! Model-name rewriting in JSON text without parsing the JSON.

use bytes::BytesMut;
use memchr::memmem::Finder;

/// Rewrites the upstream model name to the public (standard) model id inside
/// JSON text — SSE events (`data: {...}` lines) or whole JSON bodies.
///
/// Every object member `"model"<ws>:<ws>"<upstream_model>"` (at any nesting
/// depth) becomes `"model"<ws>:<ws>"<standard_model>"`; the original spacing
/// is kept. A match counts only if the quoted upstream name is preceded
/// (skipping JSON whitespace) by `:`, then the key `"model"`, then `{` or
/// `,`, so the same name as another key's value (`"id":"<name>"`) or inside
/// string content (where quotes are escaped as `\"`) is left alone.
///
/// Both names are JSON-escaped at construction (`"` → `\"`, `\` → `\\`,
/// control characters), matching what a standard JSON encoder emits; an
/// upstream that escapes the name differently (e.g. `\u002f` for `/`) is
/// not matched.
///
/// Search uses a precompiled `memchr::memmem::Finder` for the quoted
/// upstream name; when it does not occur the input is copied with a single
/// `extend_from_slice`.
#[derive(Debug, Clone)]
pub struct ModelRewriter {
    /// `None` when upstream and standard names are equal (no-op).
    finder: Option<Finder<'static>>,
    /// The quoted, escaped standard name.
    replacement: Vec<u8>,
}

impl ModelRewriter {
    /// Builds a rewriter from the upstream model name (as the upstream puts
    /// it in responses) to the standard model id exposed to clients. Names
    /// are plain (unescaped) strings.
    pub fn new(upstream_model: &str, standard_model: &str) -> Self {
        let replacement = super::json_string(standard_model).into_bytes();
        let finder = (upstream_model != standard_model).then(|| {
            let needle = super::json_string(upstream_model);
            Finder::new(needle.as_bytes()).into_owned()
        });
        ModelRewriter {
            finder,
            replacement,
        }
    }

    /// Whether this rewriter never changes anything (names are equal).
    pub fn is_noop(&self) -> bool {
        self.finder.is_none()
    }

    /// Appends `input` to `out`, with every `"model"` member whose value is
    /// the upstream name replaced by the standard name. `input` may be any
    /// byte slice (an SSE event's raw bytes or a whole JSON body); it is not
    /// validated as JSON.
    pub fn rewrite_into(&self, input: &[u8], out: &mut BytesMut) {
        let Some(finder) = &self.finder else {
            out.extend_from_slice(input);
            return;
        };
        let needle_len = finder.needle().len();
        let mut copied = 0;
        for pos in finder.find_iter(input) {
            let Some(prefix) = input.get(..pos) else {
                break;
            };
            if !is_model_member_value(prefix) {
                continue;
            }
            if copied == 0 {
                out.reserve(input.len() + self.replacement.len());
            }
            out.extend_from_slice(input.get(copied..pos).unwrap_or_default());
            out.extend_from_slice(&self.replacement);
            copied = pos + needle_len;
        }
        out.extend_from_slice(input.get(copied..).unwrap_or_default());
    }
}

/// Strips trailing JSON whitespace.
#[inline]
fn trim_ws_end(mut s: &[u8]) -> &[u8] {
    while let [rest @ .., b' ' | b'\t' | b'\n' | b'\r'] = s {
        s = rest;
    }
    s
}

/// Whether `prefix` (text before a string value) ends with
/// `{|, <ws> "model" <ws> : <ws>`.
#[inline]
fn is_model_member_value(prefix: &[u8]) -> bool {
    let Some(before_colon) = trim_ws_end(prefix).strip_suffix(b":") else {
        return false;
    };
    let Some(before_key) = trim_ws_end(before_colon).strip_suffix(b"\"model\"") else {
        return false;
    };
    matches!(trim_ws_end(before_key).last(), Some(b'{' | b','))
}
