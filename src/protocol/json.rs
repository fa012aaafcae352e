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

use super::{invalid, Dialect, ErrorKind, ProtocolError};

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
        let path = e.path().to_string();
        let field = if path == "." { "body".to_owned() } else { path };
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

pub(crate) fn decode_error_body(
    _dialect: Dialect,
    status: u16,
    body: &[u8],
) -> (ErrorKind, String) {
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
    dialect: Dialect,
    status: u16,
    message: &str,
    param: Option<&str>,
) -> Vec<u8> {
    let kind = ErrorKind::from_status(status);
    match dialect {
        Dialect::Messages => to_vec(&AnthropicErrorBody {
            ty: "error",
            error: AnthropicErrorInner {
                ty: anthropic_type(kind),
                message,
            },
        }),
        Dialect::ChatCompletions | Dialect::Responses => to_vec(&OpenAiErrorBody {
            error: OpenAiErrorInner {
                message,
                ty: openai_type(kind),
                param,
                code: None,
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
    dialect: Dialect,
    kind: ErrorKind,
    message: &str,
    sequence_number: u64,
    out: &mut BytesMut,
) {
    match dialect {
        Dialect::Messages => write_sse(
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
        Dialect::ChatCompletions => write_sse(
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
        Dialect::Responses => write_sse(
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
