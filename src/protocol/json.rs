//! JSON helpers shared by the dialect modules: borrowed strings, the
//! first-element sequence reader, writing JSON straight into a `BytesMut`,
//! typed request decoding with field paths, and the error bodies/events of
//! every dialect.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use bytes::{BufMut, BytesMut};
use serde::de::{DeserializeOwned, Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use super::{invalid, ClientDialect, ErrorKind, ProtocolError, UpstreamDialect};

/// A JSON string borrowed from the input when it has no escapes, owned
/// otherwise (`Option<Cow<str>>` with `#[serde(borrow)]` would always own).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Str<'a>(pub(crate) Cow<'a, str>);

impl<'a> Str<'a> {
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Str<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V(PhantomData))
    }
}

/// `Option<Str>` as `&str`.
pub(crate) fn opt<'s>(s: &'s Option<Str<'_>>) -> Option<&'s str> {
    s.as_ref().map(Str::as_str)
}

/// The first element of a JSON array, the rest skipped without allocating
/// (stream chunks have one choice; `Vec` would allocate per event).
pub(crate) struct First<T>(pub(crate) Option<T>);

impl<T> Default for First<T> {
    fn default() -> Self {
        First(None)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for First<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = First<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array")
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<First<T>, E> {
                Ok(First(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<First<T>, A::Error> {
                let first = seq.next_element::<T>()?;
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(First(first))
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// A JSON array read into its first element inline and the rest in a
/// `Vec`: no allocation for the usual one-element array (a stream chunk's
/// `tool_calls`), every element kept (parallel tool calls in one chunk).
pub(crate) struct Few<T> {
    first: Option<T>,
    rest: Vec<T>,
}

impl<T> Default for Few<T> {
    fn default() -> Self {
        Few {
            first: None,
            rest: Vec::new(),
        }
    }
}

impl<T> IntoIterator for Few<T> {
    type Item = T;
    type IntoIter = std::iter::Chain<std::option::IntoIter<T>, std::vec::IntoIter<T>>;
    fn into_iter(self) -> Self::IntoIter {
        self.first.into_iter().chain(self.rest)
    }
}

impl<T> Few<T> {
    /// Appends `t` (the first one inline).
    pub(crate) fn push(&mut self, t: T) {
        if self.first.is_none() {
            self.first = Some(t);
        } else {
            self.rest.push(t);
        }
    }
}

// ---------------------------------------------------------------- direct JSON output
//
// The per-event frames of the stream encoders are written with these
// instead of serde: no `Serialize` machinery, no `io::Write` adapter, one
// `extend_from_slice` per run of plain bytes. The output is byte for byte
// what serde_json writes for the same values (the golden stream tests
// compare bytes).

/// What serde_json writes after a `\` for each byte (0 = the byte is copied,
/// `u` = `\u00XX`): `"`, `\` and the control characters below 0x20.
static ESCAPE: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 0x20 {
        t[i] = b'u';
        i += 1;
    }
    t[0x08] = b'b';
    t[0x09] = b't';
    t[0x0A] = b'n';
    t[0x0C] = b'f';
    t[0x0D] = b'r';
    t[b'"' as usize] = b'"';
    t[b'\\' as usize] = b'\\';
    t
};

/// Appends `s` JSON-escaped, without the quotes (serde_json's escaping).
pub(crate) fn push_escaped(out: &mut BytesMut, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let b = s.as_bytes();
    out.reserve(b.len() + 2);
    let mut start = 0;
    for (i, &c) in b.iter().enumerate() {
        let e = ESCAPE[c as usize];
        if e == 0 {
            continue;
        }
        out.extend_from_slice(&b[start..i]);
        if e == b'u' {
            out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[(c >> 4) as usize],
                HEX[(c & 0xF) as usize],
            ]);
        } else {
            out.extend_from_slice(&[b'\\', e]);
        }
        start = i + 1;
    }
    out.extend_from_slice(&b[start..]);
}

/// Appends `s` as a JSON string (quoted, escaped).
pub(crate) fn push_str(out: &mut BytesMut, s: &str) {
    out.extend_from_slice(b"\"");
    push_escaped(out, s);
    out.extend_from_slice(b"\"");
}

/// Appends `n` in decimal.
pub(crate) fn push_u64(out: &mut BytesMut, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

/// Appends `event: {name}\ndata: ` (the frame's JSON and `\n\n` follow).
pub(crate) fn push_sse_head(out: &mut BytesMut, name: &str) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
}

/// Serializes `v` into `out` (never fails for the plain structs used here:
/// `BytesMut` writes cannot fail and no map has non-string keys).
pub(crate) fn write_json<T: Serialize + ?Sized>(out: &mut BytesMut, v: &T) {
    let start = out.len();
    if serde_json::to_writer((&mut *out).writer(), v).is_err() {
        out.truncate(start);
        out.extend_from_slice(b"null");
    }
}

/// `v` as a JSON byte vector.
pub(crate) fn to_vec<T: Serialize + ?Sized>(v: &T) -> Vec<u8> {
    let mut out = BytesMut::with_capacity(256);
    write_json(&mut out, v);
    out.to_vec()
}

/// Appends `event: {name}\ndata: {json}\n\n`.
pub(crate) fn write_sse<T: Serialize + ?Sized>(out: &mut BytesMut, name: &str, v: &T) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    write_json(out, v);
    out.extend_from_slice(b"\n\n");
}

/// Appends `data: {json}\n\n`.
pub(crate) fn write_data<T: Serialize + ?Sized>(out: &mut BytesMut, v: &T) {
    out.extend_from_slice(b"data: ");
    write_json(out, v);
    out.extend_from_slice(b"\n\n");
}

/// Decodes a client request body into typed wire structs, naming the
/// offending field path on error (`messages[2].content`).
pub(crate) fn decode_client<T: DeserializeOwned>(body: &[u8]) -> Result<T, ProtocolError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        // Broken JSON is not a field's fault: say so (its path would end in `?`, a key not
        // read yet).
        if matches!(
            e.inner().classify(),
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof
        ) {
            return invalid(
                "body",
                format!("request body is not valid JSON: {}", e.inner()),
            );
        }
        let path = e.path().to_string();
        // A key not read yet (`?`): the object that holds it is named.
        let path = path.trim_end_matches(".?").trim_end_matches('?');
        let field = if path.is_empty() || path == "." {
            "body".to_owned()
        } else {
            path.to_owned()
        };
        invalid(field, e.inner().to_string())
    })
}

/// Splits a `data:` URL into (media type, base64 payload).
pub(crate) fn parse_data_url<'u>(
    url: &'u str,
    field: &str,
) -> Result<Option<(&'u str, &'u str)>, ProtocolError> {
    if !has_prefix_ci(url, "data:") {
        return Ok(None);
    }
    let rest = url.get(5..).unwrap_or("");
    let (meta, data) = rest
        .split_once(',')
        .ok_or_else(|| invalid(field, "malformed data URL (missing `,`)"))?;
    let mut params = meta.split(';');
    let media_type = params.next().unwrap_or("");
    if !params.any(|p| p.eq_ignore_ascii_case("base64")) {
        return Err(super::unsupported(
            field,
            "only base64-encoded data URLs are supported",
        ));
    }
    if media_type.is_empty() {
        return Err(invalid(field, "data URL has no media type"));
    }
    Ok(Some((media_type, data)))
}

/// An image URL as a canonical source: `data:` URLs become base64, http(s)
/// URLs stay URLs, anything else is refused.
pub(crate) fn image_source(url: &str, field: &str) -> Result<super::Source, ProtocolError> {
    if let Some((media_type, data)) = parse_data_url(url, field)? {
        return Ok(super::Source::Base64 {
            media_type: media_type.to_owned(),
            data: data.to_owned(),
        });
    }
    if has_prefix_ci(url, "https://") || has_prefix_ci(url, "http://") {
        return Ok(super::Source::Url(url.to_owned()));
    }
    Err(invalid(field, "expected a data: URL or an http(s) URL"))
}

/// `data:{media_type};base64,{data}`.
pub(crate) fn data_url(media_type: &str, data: &str) -> String {
    format!("data:{media_type};base64,{data}")
}

fn has_prefix_ci(s: &str, prefix: &str) -> bool {
    s.len() >= prefix.len() && s.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
}

/// `s` with `prefix` unless it already starts with it.
pub(crate) fn prefixed(prefix: &str, s: &str) -> String {
    if s.starts_with(prefix) {
        s.to_owned()
    } else {
        format!("{prefix}{s}")
    }
}

// ---------------------------------------------------------------- errors

/// Anthropic error type of a kind.
pub(crate) fn anthropic_type(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::InvalidRequest => "invalid_request_error",
        ErrorKind::Authentication => "authentication_error",
        ErrorKind::Permission => "permission_error",
        ErrorKind::Billing => "billing_error",
        ErrorKind::NotFound => "not_found_error",
        ErrorKind::RequestTooLarge => "request_too_large",
        ErrorKind::RateLimit => "rate_limit_error",
        ErrorKind::Api => "api_error",
        ErrorKind::Overloaded => "overloaded_error",
        ErrorKind::Timeout => "timeout_error",
    }
}

/// OpenAI error type of a kind.
pub(crate) fn openai_type(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::InvalidRequest | ErrorKind::RequestTooLarge => "invalid_request_error",
        ErrorKind::Authentication => "authentication_error",
        ErrorKind::Permission => "permission_error",
        ErrorKind::Billing => "insufficient_quota",
        ErrorKind::NotFound => "not_found_error",
        ErrorKind::RateLimit => "rate_limit_error",
        ErrorKind::Api | ErrorKind::Timeout => "api_error",
        ErrorKind::Overloaded => "overloaded_error",
    }
}

/// Kind of a known error type name (Anthropic's or OpenAI's).
pub(crate) fn kind_of_type(ty: &str) -> Option<ErrorKind> {
    Some(match ty {
        "invalid_request_error" => ErrorKind::InvalidRequest,
        "request_too_large" => ErrorKind::RequestTooLarge,
        "authentication_error" => ErrorKind::Authentication,
        "permission_error" | "billing_error" => ErrorKind::Permission,
        "not_found_error" => ErrorKind::NotFound,
        "rate_limit_error" | "insufficient_quota" => ErrorKind::RateLimit,
        "overloaded_error" => ErrorKind::Overloaded,
        "timeout_error" => ErrorKind::Timeout,
        "api_error" | "server_error" => ErrorKind::Api,
        _ => return None,
    })
}

#[derive(Deserialize)]
pub(crate) struct ErrorObj<'a> {
    #[serde(rename = "type", borrow, default)]
    pub(crate) ty: Option<Str<'a>>,
    #[serde(borrow, default)]
    pub(crate) message: Option<Str<'a>>,
    #[serde(borrow, default)]
    pub(crate) code: Option<Str<'a>>,
}

impl ErrorObj<'_> {
    /// The canonical upstream error (type wins over the fallback kind).
    pub(crate) fn to_error(&self, fallback: ErrorKind) -> ProtocolError {
        let kind = opt(&self.ty)
            .and_then(kind_of_type)
            .or_else(|| opt(&self.code).and_then(kind_of_type))
            .unwrap_or(fallback);
        ProtocolError::Upstream {
            kind,
            message: opt(&self.message)
                .unwrap_or("upstream reported an error")
                .to_owned(),
        }
    }
}

/// The `message` (or `Message`) of a Bedrock error body.
fn bedrock_message(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Body {
        #[serde(alias = "Message")]
        message: Option<String>,
    }
    serde_json::from_slice::<Body>(body).ok()?.message
}

pub(crate) fn decode_error_body(
    dialect: UpstreamDialect,
    status: u16,
    body: &[u8],
) -> (ErrorKind, String) {
    if dialect == UpstreamDialect::Gemini {
        if let Some(e) = super::gemini::decode_error_body(status, body) {
            return e;
        }
    }
    // Bedrock's errors are `{"message": ...}`, typed by their status.
    if dialect == UpstreamDialect::Converse {
        if let Some(message) = bedrock_message(body) {
            return (ErrorKind::from_status(status), message);
        }
    }
    // Claude behind Google's front end (Vertex AI): the platform's errors are Google's.
    if dialect == UpstreamDialect::Messages {
        if let Some(e) = super::gemini::decode_platform_error_body(status, body) {
            return e;
        }
    }
    #[derive(Deserialize)]
    struct Envelope<'a> {
        #[serde(borrow, default)]
        error: Option<ErrorObj<'a>>,
    }
    let fallback = ErrorKind::from_status(status);
    if let Ok(Envelope { error: Some(e) }) = serde_json::from_slice::<Envelope<'_>>(body) {
        if let ProtocolError::Upstream { kind, message } = e.to_error(fallback) {
            return (kind, message);
        }
    }
    const MAX_BODY: usize = 512;
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    let message = if text.is_empty() {
        format!("upstream returned HTTP {status}")
    } else {
        let mut cut = text.len().min(MAX_BODY);
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        let ellipsis = if cut < text.len() { "…" } else { "" };
        format!(
            "upstream returned HTTP {status}: {}{ellipsis}",
            &text[..cut]
        )
    };
    (fallback, message)
}

#[derive(Serialize)]
struct AnthropicErrorBody<'a> {
    #[serde(rename = "type")]
    ty: &'static str,
    error: AnthropicErrorInner<'a>,
}

#[derive(Serialize)]
struct AnthropicErrorInner<'a> {
    #[serde(rename = "type")]
    ty: &'static str,
    message: &'a str,
}

#[derive(Serialize)]
struct OpenAiErrorBody<'a> {
    error: OpenAiErrorInner<'a>,
}

#[derive(Serialize)]
struct OpenAiErrorInner<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    ty: &'static str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

pub(crate) fn error_body(
    dialect: ClientDialect,
    status: u16,
    message: &str,
    param: Option<&str>,
    code: Option<&str>,
) -> Vec<u8> {
    let kind = ErrorKind::from_status(status);
    match dialect {
        ClientDialect::Messages => to_vec(&AnthropicErrorBody {
            ty: "error",
            error: AnthropicErrorInner {
                // Anthropic answers 402 with `billing_error`.
                ty: if status == 402 {
                    "billing_error"
                } else {
                    anthropic_type(kind)
                },
                message,
            },
        }),
        ClientDialect::ChatCompletions | ClientDialect::Responses => to_vec(&OpenAiErrorBody {
            error: OpenAiErrorInner {
                message,
                ty: openai_type(kind),
                param,
                code,
            },
        }),
    }
}

#[derive(Serialize)]
struct ResponsesErrorEvent<'a> {
    #[serde(rename = "type")]
    ty: &'static str,
    sequence_number: u64,
    code: &'static str,
    message: &'a str,
    param: Option<&'a str>,
}

/// Writes the in-stream error event; `sequence_number` is used by Responses.
pub(crate) fn error_event(
    dialect: ClientDialect,
    kind: ErrorKind,
    message: &str,
    sequence_number: u64,
    out: &mut BytesMut,
) {
    match dialect {
        ClientDialect::Messages => write_sse(
            out,
            "error",
            &AnthropicErrorBody {
                ty: "error",
                error: AnthropicErrorInner {
                    ty: anthropic_type(kind),
                    message,
                },
            },
        ),
        ClientDialect::ChatCompletions => write_sse(
            out,
            "error",
            &OpenAiErrorBody {
                error: OpenAiErrorInner {
                    message,
                    ty: openai_type(kind),
                    param: None,
                    code: Some(openai_type(kind)),
                },
            },
        ),
        ClientDialect::Responses => write_sse(
            out,
            "error",
            &ResponsesErrorEvent {
                ty: "error",
                sequence_number,
                code: openai_type(kind),
                message,
                param: None,
            },
        ),
    }
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;
    use proptest::prelude::*;

    use super::{push_str, push_u64};

    #[derive(Debug, serde::Deserialize)]
    #[expect(dead_code, reason = "only decoded")]
    struct Probe {
        a: u32,
        #[serde(default)]
        b: Vec<u32>,
    }

    #[test]
    fn a_decode_error_names_the_field_and_broken_json_says_so_never_a_question_mark() {
        let msg = |body: &[u8]| super::decode_client::<Probe>(body).unwrap_err().to_string();
        for broken in [&b"{\"a\":1,"[..], b"{\"a\":1,}", b"{\"a\":1, \"b\":[1,"] {
            let m = msg(broken);
            assert!(!m.contains('?'), "{m}");
            assert!(m.contains("not valid JSON"), "{m}");
        }
        assert!(
            msg(b"{\"a\":\"x\"}").starts_with("invalid `a`:"),
            "{}",
            msg(b"{\"a\":\"x\"}")
        );
        assert!(msg(b"{\"b\":[1,\"x\"]}").starts_with("invalid `b[1]`:"));
    }

    proptest! {
        /// The hand-written frames rely on this: `push_str` writes what
        /// serde_json writes, for any string (controls, quotes, backslashes,
        /// multi-byte characters).
        #[test]
        fn push_str_is_serde_json_escaping(s in "(?s).{0,40}|[\\x00-\\x20\"\\\\/\\x7f]{0,10}") {
            let mut out = BytesMut::new();
            push_str(&mut out, &s);
            let want = serde_json::to_string(&s).unwrap();
            prop_assert_eq!(&out[..], want.as_bytes());
        }

        #[test]
        fn push_u64_is_decimal(n in any::<u64>()) {
            let mut out = BytesMut::new();
            push_u64(&mut out, n);
            let want = n.to_string();
            prop_assert_eq!(&out[..], want.as_bytes());
        }
    }

    #[test]
    fn push_str_escapes_every_control_character() {
        for c in 0u8..=0x7f {
            let s = (c as char).to_string();
            let mut out = BytesMut::new();
            push_str(&mut out, &s);
            assert_eq!(
                &out[..],
                serde_json::to_string(&s).unwrap().as_bytes(),
                "{c:#x}"
            );
        }
        let mut out = BytesMut::new();
        push_u64(&mut out, 0);
        push_u64(&mut out, u64::MAX);
        assert_eq!(&out[..], b"018446744073709551615");
    }
}
