//! Provider wire formats, byte for byte: JSON bodies, SSE events and error shapes of
//! OpenAI Chat Completions and Anthropic Messages, plus SSE framing variants and the
//! cutting of events into separate writes.
//!
//! References: <https://platform.openai.com/docs/api-reference/chat/streaming>,
//! <https://platform.openai.com/docs/api-reference/chat/object>,
//! <https://docs.anthropic.com/en/api/messages-streaming>,
//! <https://docs.anthropic.com/en/api/messages>.

use serde_json::Value;

use super::behavior::Split;

/// Which provider API a request is addressed to (Azure OpenAI is `OpenAi` with
/// [`ReplyMeta::azure`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Provider {
    OpenAi,
    Anthropic,
    /// The Gemini API ([`super::cloud`]).
    Gemini,
}

/// JSON string literal (quoted, escaped).
pub(crate) fn js(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_string())
}

/// Everything about one reply that is shared by all its events.
#[derive(Debug, Clone)]
pub(crate) struct ReplyMeta {
    pub provider: Provider,
    pub id: String,
    pub created: u64,
    pub model: String,
    pub prompt_tokens: u64,
    /// Prompt tokens read from the cache (part of `prompt_tokens`), if the answer says.
    pub cached_tokens: Option<u64>,
    /// Prompt tokens written to the cache (part of `prompt_tokens`; Anthropic only).
    pub cache_write_tokens: u64,
    /// OpenAI `finish_reason` / Anthropic `stop_reason`.
    pub finish_reason: String,
    /// `stream_options.include_usage` was requested (adds `"usage":null` to chunks).
    pub include_usage: bool,
    /// Emit the final usage chunk (requested or forced).
    pub usage_chunk: bool,
    /// Reasoning and tool calls of the answer (`reasoning`, `tool_calls` knobs).
    pub extras: Extras,
    /// An Azure OpenAI request (`/openai/deployments/...`): OpenAI's format with Azure's content-filter
    /// annotations.
    pub azure: bool,
    /// A Bedrock invoke request (`/model/{id}/invoke...`): Anthropic's events in AWS's
    /// binary event-stream framing ([`super::bedrock`]).
    pub bedrock: bool,
    /// A Bedrock Converse request (`/model/{id}/converse...`, with `bedrock`): the answer and
    /// events in the Converse shape ([`super::converse`]).
    pub converse: bool,
    /// An OpenAI Responses request (`{prefix}/responses`, Azure's `/openai/v1/responses`):
    /// the answer and events in the Responses shape ([`super::responses`]).
    pub responses: bool,
}

/// Most characters in one streamed tool-argument fragment (OpenAI `arguments`, Anthropic
/// `partial_json`): the argument text arrives in several pieces, as from the providers.
pub(crate) const ARGUMENT_FRAGMENT_CHARS: usize = 7;

/// One tool call as the mock answers it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolCallOut {
    /// Call id (`call_…` / `toolu_…`).
    pub id: String,
    /// Function name.
    pub name: String,
    /// Arguments JSON text.
    pub arguments: String,
}

impl ToolCallOut {
    /// The argument text cut into fragments of at most [`ARGUMENT_FRAGMENT_CHARS`]
    /// characters (none for an empty text).
    pub(crate) fn fragments(&self) -> Vec<&str> {
        let mut out = Vec::new();
        let mut start = 0;
        for (n, (i, _)) in self.arguments.char_indices().enumerate() {
            if n > 0 && n % ARGUMENT_FRAGMENT_CHARS == 0 {
                out.push(&self.arguments[start..i]);
                start = i;
            }
        }
        if start < self.arguments.len() {
            out.push(&self.arguments[start..]);
        }
        out
    }

    /// The arguments as a JSON value (Anthropic `input`); `{}` when they are not JSON.
    fn input(&self) -> Value {
        serde_json::from_str(&self.arguments).unwrap_or_else(|_| Value::Object(Default::default()))
    }
}

/// Reasoning and tool calls of one answer, besides its text.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Extras {
    /// Reasoning words, each keeping its trailing whitespace (empty = no reasoning).
    pub reasoning: Vec<String>,
    /// Anthropic thinking signature.
    pub signature: String,
    /// Tool calls in order.
    pub tool_calls: Vec<ToolCallOut>,
}

impl Extras {
    /// Neither reasoning nor tool calls.
    pub(crate) fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.tool_calls.is_empty()
    }

    /// Content tokens the extras count for: reasoning words, tool-call starts and
    /// argument fragments.
    pub(crate) fn tokens(&self) -> u64 {
        let tools: usize = self
            .tool_calls
            .iter()
            .map(|t| 1 + t.fragments().len())
            .sum();
        (self.reasoning.len() + tools) as u64
    }
}

// ---------------------------------------------------------------- OpenAI

/// The `usage` object of an OpenAI answer; with reasoning it carries
/// `completion_tokens_details.reasoning_tokens` (DeepSeek, vLLM).
fn openai_usage(m: &ReplyMeta, completion_tokens: u64) -> String {
    let details = if m.extras.reasoning.is_empty() {
        String::new()
    } else {
        format!(
            ",\"completion_tokens_details\":{{\"reasoning_tokens\":{}}}",
            m.extras.reasoning.len()
        )
    };
    let cached = match m.cached_tokens {
        Some(n) => format!(",\"prompt_tokens_details\":{{\"cached_tokens\":{n}}}"),
        None => String::new(),
    };
    format!(
        "{{\"prompt_tokens\":{},\"completion_tokens\":{},\"total_tokens\":{}{cached}{details}}}",
        m.prompt_tokens,
        completion_tokens,
        m.prompt_tokens + completion_tokens
    )
}

/// Full non-stream `chat.completion` object. With tool calls and no text, `content` is
/// `null` (as OpenAI sends it); reasoning goes in `reasoning_content`.
pub(crate) fn openai_completion(m: &ReplyMeta, text: &str, completion_tokens: u64) -> String {
    let body = openai_completion_plain(m, text, completion_tokens);
    if m.azure {
        super::cloud::azure_completion(&body)
    } else {
        body
    }
}

fn openai_completion_plain(m: &ReplyMeta, text: &str, completion_tokens: u64) -> String {
    let x = &m.extras;
    let content = if text.is_empty() && !x.tool_calls.is_empty() {
        "null".to_string()
    } else {
        js(text)
    };
    let reasoning = if x.reasoning.is_empty() {
        String::new()
    } else {
        format!(",\"reasoning_content\":{}", js(&x.reasoning.concat()))
    };
    let tools = if x.tool_calls.is_empty() {
        String::new()
    } else {
        let calls: Vec<String> = x
            .tool_calls
            .iter()
            .map(|t| {
                format!(
                    "{{\"id\":{},\"type\":\"function\",\"function\":{{\"name\":{},\"arguments\":{}}}}}",
                    js(&t.id),
                    js(&t.name),
                    js(&t.arguments)
                )
            })
            .collect();
        format!(",\"tool_calls\":[{}]", calls.join(","))
    };
    format!(
        concat!(
            "{{\"id\":{},\"object\":\"chat.completion\",\"created\":{},\"model\":{},",
            "\"choices\":[{{\"index\":0,\"message\":{{\"role\":\"assistant\",\"content\":{}{}{},",
            "\"refusal\":null,\"annotations\":[]}},\"logprobs\":null,\"finish_reason\":{}}}],",
            "\"usage\":{},\"system_fingerprint\":\"fp_mock\"}}"
        ),
        js(&m.id),
        m.created,
        js(&m.model),
        content,
        reasoning,
        tools,
        js(&m.finish_reason),
        openai_usage(m, completion_tokens),
    )
}

fn openai_chunk(m: &ReplyMeta, choices: &str, usage: &str) -> String {
    let azure;
    let choices = if m.azure {
        azure = super::cloud::azure_choices(choices);
        azure.as_str()
    } else {
        choices
    };
    format!(
        "{{\"id\":{},\"object\":\"chat.completion.chunk\",\"created\":{},\"model\":{},\"system_fingerprint\":\"fp_mock\",\"choices\":{}{}}}",
        js(&m.id),
        m.created,
        js(&m.model),
        choices,
        usage
    )
}

fn usage_null(m: &ReplyMeta) -> &'static str {
    if m.include_usage {
        ",\"usage\":null"
    } else {
        ""
    }
}

/// First chunk: `delta: {"role":"assistant","content":""}`.
pub(crate) fn openai_role_chunk(m: &ReplyMeta) -> String {
    openai_chunk(
        m,
        "[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]",
        usage_null(m),
    )
}

/// One content token chunk.
pub(crate) fn openai_token_chunk(m: &ReplyMeta, token: &str) -> String {
    let choices = format!(
        "[{{\"index\":0,\"delta\":{{\"content\":{}}},\"logprobs\":null,\"finish_reason\":null}}]",
        js(token)
    );
    openai_chunk(m, &choices, usage_null(m))
}

/// A chunk with one choice whose `delta` is the JSON object `delta`.
fn openai_delta_chunk(m: &ReplyMeta, delta: &str) -> String {
    let choices =
        format!("[{{\"index\":0,\"delta\":{delta},\"logprobs\":null,\"finish_reason\":null}}]");
    openai_chunk(m, &choices, usage_null(m))
}

/// One reasoning chunk, DeepSeek style: `delta: {"content":null,"reasoning_content":…}`.
pub(crate) fn openai_reasoning_chunk(m: &ReplyMeta, word: &str) -> String {
    openai_delta_chunk(
        m,
        &format!("{{\"content\":null,\"reasoning_content\":{}}}", js(word)),
    )
}

/// The chunk that starts tool call `index`: its id, type and name with empty arguments.
/// As the first chunk of an answer without text it also carries the role (and
/// `content: null`), as OpenAI sends it.
pub(crate) fn openai_tool_start_chunk(
    m: &ReplyMeta,
    index: usize,
    call: &ToolCallOut,
    with_role: bool,
) -> String {
    let call = format!(
        "[{{\"index\":{index},\"id\":{},\"type\":\"function\",\"function\":{{\"name\":{},\"arguments\":\"\"}}}}]",
        js(&call.id),
        js(&call.name)
    );
    let delta = if with_role {
        format!(
            "{{\"role\":\"assistant\",\"content\":null,\"tool_calls\":{call},\"refusal\":null}}"
        )
    } else {
        format!("{{\"tool_calls\":{call}}}")
    };
    openai_delta_chunk(m, &delta)
}

/// A chunk with one fragment of tool call `index`'s arguments.
pub(crate) fn openai_tool_arguments_chunk(m: &ReplyMeta, index: usize, fragment: &str) -> String {
    openai_delta_chunk(
        m,
        &format!(
            "{{\"tool_calls\":[{{\"index\":{index},\"function\":{{\"arguments\":{}}}}}]}}",
            js(fragment)
        ),
    )
}

/// Final chunk with an empty delta and the finish reason.
pub(crate) fn openai_finish_chunk(m: &ReplyMeta) -> String {
    let choices = format!(
        "[{{\"index\":0,\"delta\":{{}},\"logprobs\":null,\"finish_reason\":{}}}]",
        js(&m.finish_reason)
    );
    openai_chunk(m, &choices, usage_null(m))
}

/// The `choices` knob: choice `i` of an OpenAI answer or chunk made from the choice 0 in
/// `data` (its `index`, and its content, tool call ids and names marked `alt{i}`); `None`
/// when `data` has no choice 0 (the usage chunk, another dialect).
pub(crate) fn other_choice(data: &str, i: u64) -> Option<String> {
    const OPEN: &str = "\"choices\":[{\"index\":0,";
    data.contains(OPEN).then(|| {
        data.replace(OPEN, &format!("\"choices\":[{{\"index\":{i},"))
            .replace("\"content\":\"", &format!("\"content\":\"alt{i}-"))
            .replace("\"id\":\"call_", &format!("\"id\":\"call_alt{i}_"))
            .replace("\"name\":\"", &format!("\"name\":\"alt{i}_"))
    })
}

/// The `choices` knob on a whole OpenAI answer: `n` choices, the others made from choice 0
/// as [`other_choice`] makes them.
pub(crate) fn with_choices(body: &str, n: u64) -> String {
    const OPEN: &str = "\"choices\":[";
    const CLOSE: &str = "],\"usage\"";
    let (Some(start), Some(end)) = (body.find(OPEN), body.find(CLOSE)) else {
        return body.to_string();
    };
    let first = &body[start + OPEN.len()..end];
    let mut choices = first.to_string();
    for i in 1..n {
        let copy = format!("\"choices\":[{first}");
        if let Some(other) = other_choice(&copy, i) {
            choices.push(',');
            choices.push_str(&other[OPEN.len()..]);
        }
    }
    format!("{}{choices}{}", &body[..start + OPEN.len()], &body[end..])
}

/// Usage chunk with `"choices":[]`.
pub(crate) fn openai_usage_chunk(m: &ReplyMeta, completion_tokens: u64) -> String {
    let usage = format!(",\"usage\":{}", openai_usage(m, completion_tokens));
    openai_chunk(m, "[]", &usage)
}

fn openai_error_kind(status: u16) -> (&'static str, Option<&'static str>) {
    match status {
        401 => ("invalid_request_error", Some("invalid_api_key")),
        403 => (
            "invalid_request_error",
            Some("unsupported_country_region_territory"),
        ),
        404 => ("invalid_request_error", Some("model_not_found")),
        429 => ("requests", Some("rate_limit_exceeded")),
        400..=499 => ("invalid_request_error", None),
        _ => ("server_error", None),
    }
}

/// OpenAI error object `{"error":{"message","type","param","code"}}`.
pub(crate) fn openai_error(status: u16, message: &str) -> String {
    let (ty, code) = openai_error_kind(status);
    format!(
        "{{\"error\":{{\"message\":{},\"type\":{},\"param\":null,\"code\":{}}}}}",
        js(message),
        js(ty),
        code.map(js).unwrap_or_else(|| "null".to_string())
    )
}

// ---------------------------------------------------------------- Anthropic

/// Full non-stream Messages response: a `thinking` block (with its signature) for
/// reasoning, the `text` block (left out when empty and there are tool calls), one
/// `tool_use` block per tool call.
pub(crate) fn anthropic_message(m: &ReplyMeta, text: &str, output_tokens: u64) -> String {
    let x = &m.extras;
    let mut blocks = Vec::new();
    if !x.reasoning.is_empty() {
        blocks.push(format!(
            "{{\"type\":\"thinking\",\"thinking\":{},\"signature\":{}}}",
            js(&x.reasoning.concat()),
            js(&x.signature)
        ));
    }
    if !text.is_empty() || x.tool_calls.is_empty() {
        blocks.push(format!("{{\"type\":\"text\",\"text\":{}}}", js(text)));
    }
    for t in &x.tool_calls {
        blocks.push(format!(
            "{{\"type\":\"tool_use\",\"id\":{},\"name\":{},\"input\":{}}}",
            js(&t.id),
            js(&t.name),
            t.input()
        ));
    }
    format!(
        concat!(
            "{{\"id\":{},\"type\":\"message\",\"role\":\"assistant\",\"model\":{},",
            "\"content\":[{}],\"stop_reason\":{},",
            "\"stop_sequence\":null,\"usage\":{{{},\"output_tokens\":{}}}}}"
        ),
        js(&m.id),
        js(&m.model),
        blocks.join(","),
        js(&m.finish_reason),
        anthropic_input_usage(m),
        output_tokens
    )
}

/// `content_block_start` of a text block at `index`.
pub(crate) fn anthropic_text_start(index: usize) -> String {
    format!("{{\"type\":\"content_block_start\",\"index\":{index},\"content_block\":{{\"type\":\"text\",\"text\":\"\"}}}}")
}

/// `content_block_start` of a thinking block at `index`.
pub(crate) fn anthropic_thinking_start(index: usize) -> String {
    format!("{{\"type\":\"content_block_start\",\"index\":{index},\"content_block\":{{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}}}}")
}

/// `content_block_start` of a `tool_use` block at `index` (empty `input`).
pub(crate) fn anthropic_tool_start(index: usize, call: &ToolCallOut) -> String {
    format!(
        "{{\"type\":\"content_block_start\",\"index\":{index},\"content_block\":{{\"type\":\"tool_use\",\"id\":{},\"name\":{},\"input\":{{}}}}}}",
        js(&call.id),
        js(&call.name)
    )
}

/// `content_block_delta` at `index` with `delta` (a JSON object).
fn anthropic_block_delta(index: usize, delta: &str) -> String {
    format!("{{\"type\":\"content_block_delta\",\"index\":{index},\"delta\":{delta}}}")
}

/// `text_delta` at `index`.
pub(crate) fn anthropic_text_delta(index: usize, text: &str) -> String {
    anthropic_block_delta(
        index,
        &format!("{{\"type\":\"text_delta\",\"text\":{}}}", js(text)),
    )
}

/// `thinking_delta` at `index`.
pub(crate) fn anthropic_thinking_delta(index: usize, thinking: &str) -> String {
    anthropic_block_delta(
        index,
        &format!(
            "{{\"type\":\"thinking_delta\",\"thinking\":{}}}",
            js(thinking)
        ),
    )
}

/// `signature_delta` at `index` (the end of a thinking block).
pub(crate) fn anthropic_signature_delta(index: usize, signature: &str) -> String {
    anthropic_block_delta(
        index,
        &format!(
            "{{\"type\":\"signature_delta\",\"signature\":{}}}",
            js(signature)
        ),
    )
}

/// `input_json_delta` at `index` with one `partial_json` fragment.
pub(crate) fn anthropic_json_delta(index: usize, fragment: &str) -> String {
    anthropic_block_delta(
        index,
        &format!(
            "{{\"type\":\"input_json_delta\",\"partial_json\":{}}}",
            js(fragment)
        ),
    )
}

/// `content_block_stop` at `index`.
pub(crate) fn anthropic_block_stop(index: usize) -> String {
    format!("{{\"type\":\"content_block_stop\",\"index\":{index}}}")
}

/// A token-count answer (`POST /v1/messages/count_tokens`,
/// <https://docs.anthropic.com/en/api/messages-count-tokens>).
pub(crate) fn anthropic_token_count(input_tokens: u64) -> String {
    format!("{{\"input_tokens\":{input_tokens}}}")
}

/// The top-level members Anthropic's token-count endpoint accepts (and the mock's own
/// `mock` knob).
const COUNT_TOKENS_FIELDS: &[&str] = &[
    "model",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "thinking",
    "mcp_servers",
    "context_management",
    "output_config",
    "output_format",
    "mock",
];

/// Why Anthropic would refuse a token-count body with a 400 (its messages): no object, no
/// `model` string, no `messages` array, or a member it does not take (`max_tokens: Extra
/// inputs are not permitted`: generation-only members are refused there).
pub(crate) fn count_tokens_refusal(body: Option<&Value>) -> Option<String> {
    let Some(Value::Object(map)) = body else {
        return Some("request body must be a JSON object".into());
    };
    if !map.get("model").is_some_and(Value::is_string) {
        return Some("model: Field required".into());
    }
    if !map.get("messages").is_some_and(Value::is_array) {
        return Some("messages: Field required".into());
    }
    map.keys()
        .find(|k| !COUNT_TOKENS_FIELDS.contains(&k.as_str()))
        .map(|k| format!("{k}: Extra inputs are not permitted"))
}

/// `message_start` event data.
pub(crate) fn anthropic_message_start(m: &ReplyMeta) -> String {
    format!(
        concat!(
            "{{\"type\":\"message_start\",\"message\":{{\"id\":{},\"type\":\"message\",",
            "\"role\":\"assistant\",\"content\":[],\"model\":{},\"stop_reason\":null,",
            "\"stop_sequence\":null,\"usage\":{{{},\"output_tokens\":1}}}}}}"
        ),
        js(&m.id),
        js(&m.model),
        anthropic_input_usage(m)
    )
}

/// The input fields of an Anthropic `usage` object: `input_tokens`, and with cache reads or
/// writes `cache_creation_input_tokens` and `cache_read_input_tokens` (`input_tokens` then
/// counts only the uncached rest).
fn anthropic_input_usage(m: &ReplyMeta) -> String {
    match (m.cached_tokens, m.cache_write_tokens) {
        (None, 0) => format!("\"input_tokens\":{}", m.prompt_tokens),
        (read, write) => {
            let read = read.unwrap_or(0);
            format!(
                "\"input_tokens\":{},\"cache_creation_input_tokens\":{write},\"cache_read_input_tokens\":{read}",
                m.prompt_tokens - read - write
            )
        }
    }
}

/// `ping` event data.
pub(crate) const ANTHROPIC_PING: &str = "{\"type\":\"ping\"}";
/// `message_stop` event data.
pub(crate) const ANTHROPIC_MESSAGE_STOP: &str = "{\"type\":\"message_stop\"}";

/// `message_delta` event data.
pub(crate) fn anthropic_message_delta(m: &ReplyMeta, output_tokens: u64) -> String {
    format!(
        "{{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":{},\"stop_sequence\":null}},\"usage\":{{\"output_tokens\":{}}}}}",
        js(&m.finish_reason),
        output_tokens
    )
}

fn anthropic_error_type(status: u16) -> &'static str {
    match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

/// Anthropic error object `{"type":"error","error":{"type","message"}}`.
pub(crate) fn anthropic_error(status: u16, message: &str) -> String {
    format!(
        "{{\"type\":\"error\",\"error\":{{\"type\":{},\"message\":{}}}}}",
        js(anthropic_error_type(status)),
        js(message)
    )
}

/// Provider-shaped error body for `status`.
pub(crate) fn error_body(provider: Provider, status: u16, message: &str) -> String {
    match provider {
        Provider::OpenAi => openai_error(status, message),
        Provider::Anthropic => anthropic_error(status, message),
        Provider::Gemini => super::cloud::gemini_error(status, message, None),
    }
}

/// Provider-shaped error body for `status` whose error `type` is `error_type` when given.
pub(crate) fn error_body_typed(
    provider: Provider,
    status: u16,
    message: &str,
    error_type: Option<&str>,
) -> String {
    let Some(ty) = error_type else {
        return error_body(provider, status, message);
    };
    match provider {
        Provider::OpenAi => format!(
            "{{\"error\":{{\"message\":{},\"type\":{},\"param\":null,\"code\":null}}}}",
            js(message),
            js(ty)
        ),
        Provider::Anthropic => format!(
            "{{\"type\":\"error\",\"error\":{{\"type\":{},\"message\":{}}}}}",
            js(ty),
            js(message)
        ),
        Provider::Gemini => super::cloud::gemini_error(status, message, Some(ty)),
    }
}

// ---------------------------------------------------------------- failure bytes

/// ASCII marker put in token text where the `invalid_utf8` knob puts invalid bytes.
pub(crate) const INVALID_UTF8_MARKER: &str = "~INVALID~";
/// What replaces [`INVALID_UTF8_MARKER`] on the wire: a 2-byte lead without its
/// continuation byte, `(`, then `FF` (never valid in UTF-8).
pub(crate) const INVALID_UTF8_BYTES: &[u8] = b"\xC3(\xFF";

/// `bytes` with every [`INVALID_UTF8_MARKER`] replaced by [`INVALID_UTF8_BYTES`].
pub(crate) fn inject_invalid_utf8(bytes: &[u8]) -> Vec<u8> {
    let marker = INVALID_UTF8_MARKER.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut rest = bytes;
    while let Some(i) = rest.windows(marker.len()).position(|w| w == marker) {
        out.extend_from_slice(&rest[..i]);
        out.extend_from_slice(INVALID_UTF8_BYTES);
        rest = &rest[i + marker.len()..];
    }
    out.extend_from_slice(rest);
    out
}

/// A content coding the mock answers in (`content_encoding` knob): compresses body pieces
/// as they are written, flushing after each so that every SSE event can be decoded as soon
/// as it arrives.
pub(crate) enum BodyEncoder {
    /// `gzip`.
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    /// `deflate` (zlib).
    Zlib(flate2::write::ZlibEncoder<Vec<u8>>),
    /// `deflate` carrying a raw deflate stream.
    RawDeflate(flate2::write::DeflateEncoder<Vec<u8>>),
    /// `br`.
    Brotli(Box<brotli::CompressorWriter<Vec<u8>>>),
    /// `zstd`.
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

impl BodyEncoder {
    /// The encoder for a knob value and the `Content-Encoding` header to send; `(None,
    /// name)` for a name the mock does not compress with (sent as is, body uncompressed).
    pub(crate) fn for_name(name: &str) -> (Option<BodyEncoder>, String) {
        use flate2::Compression;
        let enc = match name {
            "gzip" => BodyEncoder::Gzip(flate2::write::GzEncoder::new(
                Vec::new(),
                Compression::default(),
            )),
            "deflate" => BodyEncoder::Zlib(flate2::write::ZlibEncoder::new(
                Vec::new(),
                Compression::default(),
            )),
            "deflate-raw" => BodyEncoder::RawDeflate(flate2::write::DeflateEncoder::new(
                Vec::new(),
                Compression::default(),
            )),
            "br" => BodyEncoder::Brotli(Box::new(brotli::CompressorWriter::new(
                Vec::new(),
                4096,
                5,
                22,
            ))),
            "zstd" => match zstd::stream::write::Encoder::new(Vec::new(), 3) {
                Ok(e) => BodyEncoder::Zstd(e),
                Err(_) => return (None, name.to_string()),
            },
            _ => return (None, name.to_string()),
        };
        let header = if name == "deflate-raw" {
            "deflate"
        } else {
            name
        };
        (Some(enc), header.to_string())
    }

    fn inner(&mut self) -> &mut Vec<u8> {
        match self {
            BodyEncoder::Gzip(e) => e.get_mut(),
            BodyEncoder::Zlib(e) => e.get_mut(),
            BodyEncoder::RawDeflate(e) => e.get_mut(),
            BodyEncoder::Brotli(e) => e.get_mut(),
            BodyEncoder::Zstd(e) => e.get_mut(),
        }
    }

    /// Compresses `data` and flushes: the coded bytes to write now.
    pub(crate) fn encode(&mut self, data: &[u8]) -> std::io::Result<Vec<u8>> {
        use std::io::Write;
        match self {
            BodyEncoder::Gzip(e) => e.write_all(data).and_then(|()| e.flush())?,
            BodyEncoder::Zlib(e) => e.write_all(data).and_then(|()| e.flush())?,
            BodyEncoder::RawDeflate(e) => e.write_all(data).and_then(|()| e.flush())?,
            BodyEncoder::Brotli(e) => e.write_all(data).and_then(|()| e.flush())?,
            BodyEncoder::Zstd(e) => e.write_all(data).and_then(|()| e.flush())?,
        }
        Ok(std::mem::take(self.inner()))
    }

    /// Ends the coded stream: its last bytes.
    pub(crate) fn finish(self) -> std::io::Result<Vec<u8>> {
        match self {
            BodyEncoder::Gzip(e) => e.finish(),
            BodyEncoder::Zlib(e) => e.finish(),
            BodyEncoder::RawDeflate(e) => e.finish(),
            BodyEncoder::Brotli(mut e) => {
                use std::io::Write;
                e.flush()?;
                let mut rest = std::mem::take(e.get_mut());
                rest.extend_from_slice(&e.into_inner());
                Ok(rest)
            }
            BodyEncoder::Zstd(e) => e.finish(),
        }
    }
}

/// Default error message for a status.
pub(crate) fn default_error_message(provider: Provider, status: u16) -> String {
    match (provider, status) {
        (Provider::Anthropic, 503 | 529) => "Overloaded".to_string(),
        (Provider::OpenAi, 429) => "Rate limit reached (mock upstream)".to_string(),
        (Provider::Gemini, _) => super::cloud::gemini_default_message(status),
        _ => format!("mock upstream error (HTTP {status})"),
    }
}

// ---------------------------------------------------------------- models

/// OpenAI-style model list.
pub(crate) fn model_list(models: &[String]) -> String {
    let items: Vec<String> = models
        .iter()
        .map(|m| {
            format!(
                "{{\"id\":{},\"object\":\"model\",\"created\":1686935002,\"owned_by\":\"sluice-mock\"}}",
                js(m)
            )
        })
        .collect();
    format!("{{\"object\":\"list\",\"data\":[{}]}}", items.join(","))
}

// ---------------------------------------------------------------- SSE framing

/// SSE framing options.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SseStyle {
    pub eol: &'static str,
    pub no_space: bool,
    pub multi_line: bool,
}

/// Byte index just after the first top-level comma of a JSON object, if any.
fn first_top_level_comma(json: &str) -> Option<usize> {
    let mut depth = 0i32;
    let mut in_str = false;
    let mut esc = false;
    for (i, b) in json.bytes().enumerate() {
        if in_str {
            if esc {
                esc = false;
            } else if b == b'\\' {
                esc = true;
            } else if b == b'"' {
                in_str = false;
            }
            continue;
        }
        match b {
            b'"' => in_str = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth -= 1,
            b',' if depth == 1 => return Some(i + 1),
            _ => {}
        }
    }
    None
}

/// Encode one SSE event: optional `event:` line, one or two `data:` lines, blank line.
pub(crate) fn encode_event(name: Option<&str>, data: &str, st: SseStyle) -> Vec<u8> {
    let sp = if st.no_space { "" } else { " " };
    let mut out = String::with_capacity(data.len() + 32);
    if let Some(n) = name {
        out.push_str("event:");
        out.push_str(sp);
        out.push_str(n);
        out.push_str(st.eol);
    }
    let cut = if st.multi_line {
        first_top_level_comma(data)
    } else {
        None
    };
    let parts: Vec<&str> = match cut {
        Some(c) if c < data.len() => vec![&data[..c], &data[c..]],
        _ => vec![data],
    };
    for p in parts {
        out.push_str("data:");
        out.push_str(sp);
        out.push_str(p);
        out.push_str(st.eol);
    }
    out.push_str(st.eol);
    out.into_bytes()
}

/// SSE comment event (`: OPENROUTER PROCESSING` + blank line).
pub(crate) fn encode_comment(st: SseStyle) -> Vec<u8> {
    format!(": OPENROUTER PROCESSING{}{}", st.eol, st.eol).into_bytes()
}

fn is_eol(b: u8) -> bool {
    b == b'\n' || b == b'\r'
}

fn is_cont(b: u8) -> bool {
    b & 0xC0 == 0x80
}

/// A cut at `p` is "mid-line" and on a char boundary.
fn good_mid_line_cut(bytes: &[u8], p: usize) -> bool {
    p > 0 && p < bytes.len() && !is_eol(bytes[p - 1]) && !is_eol(bytes[p]) && !is_cont(bytes[p])
}

fn mid_line_cuts(bytes: &[u8]) -> Vec<usize> {
    let mut cuts = Vec::new();
    for target in [3, bytes.len() / 2] {
        let mut p = target;
        while p > 0 && !good_mid_line_cut(bytes, p) {
            p -= 1;
        }
        if p > 0 && !cuts.contains(&p) {
            cuts.push(p);
        }
    }
    cuts.sort_unstable();
    cuts
}

/// Cut `bytes` into the pieces that go out as separate writes / HTTP chunks.
pub(crate) fn split_pieces(bytes: &[u8], mode: Split) -> Vec<&[u8]> {
    let cuts: Vec<usize> = match mode {
        Split::None | Split::Burst => Vec::new(),
        Split::Bytewise => (1..bytes.len()).collect(),
        Split::Arbitrary => {
            // Piece lengths 1..=29 from a small linear congruential sequence seeded by the
            // length: arbitrary, yet the same for the same bytes (reproducible tests).
            let mut cuts = Vec::new();
            let mut x = bytes.len() as u64 | 1;
            let mut at = 0usize;
            loop {
                x = x
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                at += 1 + usize::try_from((x >> 33) % 29).unwrap_or(0);
                if at >= bytes.len() {
                    break cuts;
                }
                cuts.push(at);
            }
        }
        Split::MidLine => mid_line_cuts(bytes),
        Split::MidUtf8 => {
            let c: Vec<usize> = bytes
                .iter()
                .enumerate()
                .filter(|(_, b)| **b >= 0xC0)
                .map(|(i, _)| i + 1)
                .filter(|p| *p < bytes.len())
                .collect();
            if c.is_empty() {
                mid_line_cuts(bytes)
            } else {
                c
            }
        }
    };
    let mut pieces = Vec::with_capacity(cuts.len() + 1);
    let mut start = 0;
    for c in cuts {
        if c > start && c < bytes.len() {
            pieces.push(&bytes[start..c]);
            start = c;
        }
    }
    if start < bytes.len() {
        pieces.push(&bytes[start..]);
    }
    pieces
}

// ---------------------------------------------------------------- tokens and request bodies

/// Split text into whitespace-delimited tokens, each keeping its trailing whitespace
/// (leading whitespace stays with the first token). UTF-8 safe.
pub(crate) fn split_words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut seen_word = false;
    let mut in_ws = false;
    for ch in text.chars() {
        let ws = ch.is_whitespace();
        if !ws && in_ws && seen_word {
            out.push(std::mem::take(&mut cur));
        }
        if !ws {
            seen_word = true;
        }
        in_ws = ws;
        cur.push(ch);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Text of a message `content` (string, or array of parts with `text`).
fn content_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    }
}

/// Content of the last `role: "user"` message of an OpenAI / Anthropic request body.
pub(crate) fn last_user_message(body: &Value) -> String {
    last_message_of(body, "user")
}

/// The text of the last `assistant` message of an OpenAI or Anthropic request (empty when
/// there is none): the text so far of a continuation request (`restart_answer`).
pub(crate) fn last_assistant_message(body: &Value) -> String {
    last_message_of(body, "assistant")
}

fn last_message_of(body: &Value, role: &str) -> String {
    body.get("messages")
        .and_then(Value::as_array)
        .and_then(|msgs| {
            msgs.iter()
                .rev()
                .find(|m| m.get("role").and_then(Value::as_str) == Some(role))
        })
        .and_then(|m| m.get("content"))
        .map(content_text)
        .unwrap_or_default()
}

/// Deterministic prompt token estimate: words in all messages (and `system`), min 1.
/// The prompt prefix of a request for the `prompt_cache` knob: a hash of its `system` and
/// first message, and the word count of its last message (what a cache of the earlier
/// turns would not hold). `None` without messages.
pub(crate) fn prompt_prefix(body: &Value) -> Option<(u64, u64)> {
    use std::hash::{Hash, Hasher};
    let msgs = body.get("messages").and_then(Value::as_array)?;
    let first = msgs.first()?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    body.get("system").map(Value::to_string).hash(&mut h);
    first.to_string().hash(&mut h);
    let last_words = msgs
        .last()
        .and_then(|m| m.get("content"))
        .map_or(0, |c| content_text(c).split_whitespace().count() as u64);
    Some((h.finish(), last_words))
}

pub(crate) fn estimate_prompt_tokens(body: &Value) -> u64 {
    let mut n = 0u64;
    if let Some(msgs) = body.get("messages").and_then(Value::as_array) {
        for m in msgs {
            if let Some(c) = m.get("content") {
                n += content_text(c).split_whitespace().count() as u64;
            }
        }
    }
    if let Some(s) = body.get("system") {
        n += content_text(s).split_whitespace().count() as u64;
    }
    // Gemini: `contents[].parts` and `systemInstruction.parts`.
    if let Some(contents) = body.get("contents").and_then(Value::as_array) {
        for c in contents {
            if let Some(p) = c.get("parts") {
                n += content_text(p).split_whitespace().count() as u64;
            }
        }
    }
    if let Some(p) = body.pointer("/systemInstruction/parts") {
        n += content_text(p).split_whitespace().count() as u64;
    }
    n.max(1)
}
