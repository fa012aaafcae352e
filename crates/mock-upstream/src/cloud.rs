//! The cloud providers' wire formats, byte for byte: Azure OpenAI's additions to Chat
//! Completions (its paths, the `api-key` header and `api-version` query, the
//! `prompt_filter_results` chunk, per-choice `content_filter_results`, the `content_filter`
//! 400, its 401/404 bodies) and the Gemini API (`models/{model}:generateContent` and
//! `:streamGenerateContent?alt=sse`, the `x-goog-api-key` header, `GenerateContentResponse`
//! bodies and chunks, Google's error model).
//!
//! References: <https://learn.microsoft.com/azure/ai-services/openai/reference>,
//! <https://learn.microsoft.com/azure/ai-services/openai/concepts/content-filter>,
//! <https://ai.google.dev/api/generate-content>,
//! <https://ai.google.dev/gemini-api/docs/troubleshooting>,
//! <https://cloud.google.com/apis/design/errors>. Google writes its JSON with `": "` after
//! a member name (streams: one line per chunk, `\r\n\r\n` between events; whole bodies:
//! indented by two spaces).

use std::io;

use serde::Serialize;
use serde_json::{json, Value};

use super::h1::Request;
use super::wire::{ReplyMeta, ToolCallOut};

// ---------------------------------------------------------------- Azure OpenAI

/// Azure's content-filter annotation of one prompt or choice with nothing filtered.
pub(crate) const AZURE_FILTER_RESULTS: &str = concat!(
    r#"{"hate":{"filtered":false,"severity":"safe"},"#,
    r#""self_harm":{"filtered":false,"severity":"safe"},"#,
    r#""sexual":{"filtered":false,"severity":"safe"},"#,
    r#""violence":{"filtered":false,"severity":"safe"}}"#
);

/// Whether a request addresses Azure OpenAI (`/openai/deployments/...`, `/openai/models`,
/// the v1 API's `/openai/v1/responses`; another path under an OpenAI-compatible prefix such
/// as `/openai/v1/...` is not Azure).
pub(crate) fn is_azure(req: &Request) -> bool {
    let path = req.path();
    path.starts_with("/openai/deployments/")
        || path.starts_with("/openai/v1/responses")
        || path.trim_end_matches('/') == "/openai/models"
}

/// The first chunk of an Azure stream: the prompt's filter results, no choices.
pub(crate) fn azure_prompt_filter_chunk() -> String {
    format!(
        r#"{{"choices":[],"created":0,"id":"","model":"","object":"","prompt_filter_results":[{{"prompt_index":0,"content_filter_results":{AZURE_FILTER_RESULTS}}}]}}"#
    )
}

/// `choices` (a JSON array text of OpenAI choices) with Azure's `content_filter_results`
/// added to its first choice.
pub(crate) fn azure_choices(choices: &str) -> String {
    match choices.strip_prefix("[{") {
        Some(rest) => format!("[{{\"content_filter_results\":{AZURE_FILTER_RESULTS},{rest}"),
        None => choices.to_string(),
    }
}

/// A non-stream `chat.completion` with Azure's filter annotations (prompt and choice).
pub(crate) fn azure_completion(openai: &str) -> String {
    let with_choice = openai.replacen(
        "\"choices\":[{",
        &format!("\"choices\":[{{\"content_filter_results\":{AZURE_FILTER_RESULTS},"),
        1,
    );
    with_choice.replacen(
        "\"usage\":",
        &format!("\"prompt_filter_results\":[{{\"prompt_index\":0,\"content_filter_results\":{AZURE_FILTER_RESULTS}}}],\"usage\":"),
        1,
    )
}

/// Azure's 400 for a prompt its content filter blocked (`code: content_filter`, the
/// filter results under `innererror`).
pub(crate) fn azure_content_filter_error() -> String {
    concat!(
        r#"{"error":{"message":"The response was filtered due to the prompt triggering Azure OpenAI's content management policy. Please modify your prompt and retry. To learn more about our content filtering policies please read our documentation: https://go.microsoft.com/fwlink/?linkid=2198766","#,
        r#""type":null,"param":"prompt","code":"content_filter","status":400,"innererror":{"code":"ResponsibleAIPolicyViolation","content_filter_result":{"#,
        r#""hate":{"filtered":false,"severity":"safe"},"jailbreak":{"filtered":false,"detected":false},"self_harm":{"filtered":false,"severity":"safe"},"#,
        r#""sexual":{"filtered":false,"severity":"safe"},"violence":{"filtered":true,"severity":"medium"}}}}}"#
    )
    .to_string()
}

/// What Azure answers before looking at the body: 404 without `api-version`, 401 without
/// an `api-key` (or with another key than `expected_key`, when set).
pub(crate) fn azure_gate(req: &Request, expected_key: Option<&str>) -> Option<(u16, String)> {
    // The v1 API (`/openai/v1/...`, Responses among it) takes no `api-version`.
    let has_version = req.path().starts_with("/openai/v1/")
        || query_param(req, "api-version").is_some_and(|v| !v.is_empty());
    if !has_version {
        return Some((
            404,
            r#"{"error":{"code":"404","message": "Resource not found"}}"#.to_string(),
        ));
    }
    let key = req.header("api-key").filter(|k| !k.is_empty());
    let accepted = match (key, expected_key) {
        (None, _) => false,
        (Some(k), Some(want)) => k == want,
        (Some(_), None) => true,
    };
    (!accepted).then(|| {
        (
            401,
            r#"{"error":{"code":"401","message":"Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key for an active subscription and use a correct regional API endpoint for your resource."}}"#
                .to_string(),
        )
    })
}

fn query_param<'r>(req: &'r Request, name: &str) -> Option<&'r str> {
    let query = req.target.split_once('?')?.1;
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k == name).then_some(v)
    })
}

// ---------------------------------------------------------------- Gemini

/// A Gemini generate call: `(model, stream, alt=sse)` from
/// `.../models/{model}:generateContent` or `...:streamGenerateContent`.
pub(crate) fn gemini_method(req: &Request) -> Option<(String, bool, bool)> {
    let path = req.path();
    let (_, rest) = path.rsplit_once("/models/")?;
    let (model, method) = rest.rsplit_once(':')?;
    let stream = match method {
        "generateContent" => false,
        "streamGenerateContent" => true,
        _ => return None,
    };
    let sse = query_param(req, "alt") == Some("sse");
    Some((model.to_string(), stream, sse))
}

/// What Google answers before looking at the body: 403 `PERMISSION_DENIED` without a key
/// (`x-goog-api-key` header or `key` query), 400 `INVALID_ARGUMENT` with reason
/// `API_KEY_INVALID` for another key than `expected_key` (when set).
pub(crate) fn gemini_gate(req: &Request, expected_key: Option<&str>) -> Option<(u16, String)> {
    let key = req
        .header("x-goog-api-key")
        .or_else(|| query_param(req, "key"))
        .filter(|k| !k.is_empty());
    match (key, expected_key) {
        (None, _) => Some((
            403,
            gemini_error(
                403,
                "Method doesn't allow unregistered callers (callers without established identity). Please use API Key or other form of API consumer identity to call this API.",
                None,
            ),
        )),
        (Some(k), Some(want)) if k != want => {
            let body = json!({"error": {
                "code": 400,
                "message": "API key not valid. Please pass a valid API key.",
                "status": "INVALID_ARGUMENT",
                "details": [{
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": "API_KEY_INVALID",
                    "domain": "googleapis.com",
                    "metadata": {"service": "generativelanguage.googleapis.com"}
                }]
            }});
            Some((400, pretty(&body)))
        }
        _ => None,
    }
}

/// The `google.rpc.Code` name of an HTTP status.
fn gemini_status_name(status: u16) -> &'static str {
    match status {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        409 => "ABORTED",
        429 => "RESOURCE_EXHAUSTED",
        499 => "CANCELLED",
        501 => "UNIMPLEMENTED",
        503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ => "INTERNAL",
    }
}

/// Google's error body `{"error": {"code", "message", "status"}}` (`status_name` overrides
/// the status's name: the `error_type` knob).
pub(crate) fn gemini_error(status: u16, message: &str, status_name: Option<&str>) -> String {
    pretty(&json!({"error": {
        "code": status,
        "message": message,
        "status": status_name.unwrap_or(gemini_status_name(status)),
    }}))
}

/// Google's error object as one stream chunk (`data: {"error": {...}}`, on one line).
pub(crate) fn gemini_error_chunk(status: u16, message: &str, status_name: Option<&str>) -> String {
    line(&json!({"error": {
        "code": status,
        "message": message,
        "status": status_name.unwrap_or(gemini_status_name(status)),
    }}))
}

/// Google's message for a status, as the Gemini API words it.
pub(crate) fn gemini_default_message(status: u16) -> String {
    match status {
        429 => "Resource has been exhausted (e.g. check quota).".to_string(),
        503 => "The model is overloaded. Please try again later.".to_string(),
        500 => "An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting".to_string(),
        504 => "Deadline expired before operation could complete.".to_string(),
        _ => format!("mock upstream error (HTTP {status})"),
    }
}

/// Writes JSON the way Google's API front end does in streams: `": "` after a name.
struct GoogleLine;

impl serde_json::ser::Formatter for GoogleLine {
    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }
}

/// A `GenerateContentResponse` in Google's member order (serde keeps struct order; a
/// `serde_json::Map` would sort the names).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResponseOut<'a> {
    candidates: [CandidateOut<'a>; 1],
    #[serde(skip_serializing_if = "Option::is_none")]
    usage_metadata: Option<UsageOut>,
    model_version: &'a str,
    response_id: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CandidateOut<'a> {
    content: ContentOut<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    finish_reason: Option<&'a str>,
    index: u32,
}

#[derive(Serialize)]
struct ContentOut<'a> {
    parts: Vec<PartOut<'a>>,
    role: &'static str,
}

#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
struct PartOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thought: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    function_call: Option<CallOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thought_signature: Option<String>,
}

#[derive(Serialize)]
struct CallOut<'a> {
    name: &'a str,
    args: Value,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct UsageOut {
    prompt_token_count: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    candidates_token_count: Option<u64>,
    total_token_count: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    cached_content_token_count: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_tokens_details: Option<[ModalityOut; 1]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thoughts_token_count: Option<u64>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ModalityOut {
    modality: &'static str,
    token_count: u64,
}

/// `usageMetadata` after `output` content tokens (thoughts counted apart).
fn gemini_usage(m: &ReplyMeta, output: u64) -> UsageOut {
    let thoughts = m.extras.reasoning.len() as u64;
    UsageOut {
        prompt_token_count: m.prompt_tokens,
        candidates_token_count: Some(output.saturating_sub(thoughts)),
        total_token_count: m.prompt_tokens + output,
        cached_content_token_count: m.cached_tokens,
        prompt_tokens_details: Some([ModalityOut {
            modality: "TEXT",
            token_count: m.prompt_tokens,
        }]),
        thoughts_token_count: (thoughts > 0).then_some(thoughts),
    }
}

/// The running usage of a chunk before the end: the prompt only, as Gemini reports it.
fn prompt_usage(m: &ReplyMeta) -> UsageOut {
    UsageOut {
        prompt_token_count: m.prompt_tokens,
        candidates_token_count: None,
        total_token_count: m.prompt_tokens,
        cached_content_token_count: None,
        prompt_tokens_details: None,
        thoughts_token_count: None,
    }
}

/// One `GenerateContentResponse` with `parts`, optionally a finish reason and usage.
fn gemini_chunk<'a>(
    m: &'a ReplyMeta,
    parts: Vec<PartOut<'a>>,
    finish: bool,
    usage: UsageOut,
) -> ResponseOut<'a> {
    ResponseOut {
        candidates: [CandidateOut {
            content: ContentOut {
                parts,
                role: "model",
            },
            finish_reason: finish.then_some(m.finish_reason.as_str()),
            index: 0,
        }],
        usage_metadata: m.usage_chunk.then_some(usage),
        model_version: &m.model,
        response_id: &m.id,
    }
}

/// A function-call part with its `thoughtSignature` (thinking models sign every call
/// part): standard base64, as Google's, derived from the response id and the call.
fn call_part<'a>(m: &ReplyMeta, i: usize, call: &'a ToolCallOut) -> PartOut<'a> {
    let args: Value =
        serde_json::from_str(&call.arguments).unwrap_or_else(|_| Value::Object(Default::default()));
    PartOut {
        function_call: Some(CallOut {
            name: &call.name,
            args,
        }),
        thought_signature: Some(thought_signature(m, i)),
        ..PartOut::default()
    }
}

/// The mock's `thoughtSignature` of call `i`: base64 alphabet with `+`, `/` and padding.
pub(crate) fn thought_signature(m: &ReplyMeta, i: usize) -> String {
    let hex: String = m.id.bytes().map(|b| format!("{b:02x}")).collect();
    format!("CiQB{hex}+/{i}w==")
}

fn text_part(text: &str, thought: bool) -> PartOut<'_> {
    PartOut {
        text: Some(text),
        thought: thought.then_some(true),
        ..PartOut::default()
    }
}

fn line<T: Serialize>(v: &T) -> String {
    let mut out = Vec::with_capacity(256);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, GoogleLine);
    if v.serialize(&mut ser).is_err() {
        return String::new();
    }
    String::from_utf8(out).unwrap_or_default()
}

fn pretty<T: Serialize>(v: &T) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

/// A stream chunk with one text part (`thought`: a reasoning part).
pub(crate) fn gemini_text_chunk(m: &ReplyMeta, text: &str, thought: bool) -> String {
    line(&gemini_chunk(
        m,
        vec![text_part(text, thought)],
        false,
        prompt_usage(m),
    ))
}

/// A stream chunk with one whole function call (Gemini sends calls whole).
pub(crate) fn gemini_call_chunk(m: &ReplyMeta, i: usize, call: &ToolCallOut) -> String {
    line(&gemini_chunk(
        m,
        vec![call_part(m, i, call)],
        false,
        prompt_usage(m),
    ))
}

/// The last chunk: an empty text part, the finish reason and the final usage after `sent`
/// content tokens.
pub(crate) fn gemini_finish_chunk(m: &ReplyMeta, sent: u64) -> String {
    line(&gemini_chunk(
        m,
        vec![text_part("", false)],
        true,
        gemini_usage(m, sent),
    ))
}

/// A whole non-stream `GenerateContentResponse`: reasoning (a `thought` part), text, one
/// part per function call.
pub(crate) fn gemini_response(m: &ReplyMeta, text: &str, output_tokens: u64) -> String {
    let reasoning = m.extras.reasoning.concat();
    let mut parts = Vec::new();
    if !reasoning.is_empty() {
        parts.push(text_part(&reasoning, true));
    }
    if !text.is_empty() || m.extras.tool_calls.is_empty() {
        parts.push(text_part(text, false));
    }
    parts.extend(
        m.extras
            .tool_calls
            .iter()
            .enumerate()
            .map(|(i, c)| call_part(m, i, c)),
    );
    pretty(&gemini_chunk(
        m,
        parts,
        true,
        gemini_usage(m, output_tokens),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_keep_googles_member_order() {
        let m = ReplyMeta {
            provider: super::super::wire::Provider::Gemini,
            id: "r1".into(),
            created: 0,
            model: "gemini-x".into(),
            prompt_tokens: 2,
            cached_tokens: None,
            cache_write_tokens: 0,
            finish_reason: "STOP".into(),
            include_usage: false,
            usage_chunk: true,
            extras: super::super::wire::Extras::default(),
            azure: false,
            bedrock: false,
            converse: false,
            responses: false,
        };
        assert_eq!(
            gemini_finish_chunk(&m, 3),
            concat!(
                r#"{"candidates": [{"content": {"parts": [{"text": ""}],"role": "model"},"finishReason": "STOP","index": 0}],"#,
                r#""usageMetadata": {"promptTokenCount": 2,"candidatesTokenCount": 3,"totalTokenCount": 5,"promptTokensDetails": [{"modality": "TEXT","tokenCount": 2}]},"#,
                r#""modelVersion": "gemini-x","responseId": "r1"}"#
            )
        );
    }

    #[test]
    fn google_json_lines_have_a_space_after_names() {
        assert_eq!(
            line(&json!({"a": [{"b": 1}], "c": "d"})),
            r#"{"a": [{"b": 1}],"c": "d"}"#
        );
    }

    #[test]
    fn azure_annotations_go_into_the_first_choice() {
        assert_eq!(
            azure_choices(r#"[{"index":0}]"#),
            format!(r#"[{{"content_filter_results":{AZURE_FILTER_RESULTS},"index":0}}]"#)
        );
        assert_eq!(azure_choices("[]"), "[]");
        let v: Value = serde_json::from_str(&azure_content_filter_error()).unwrap();
        assert_eq!(v["error"]["code"], "content_filter");
        let v: Value = serde_json::from_str(&azure_prompt_filter_chunk()).unwrap();
        assert_eq!(v["choices"], json!([]));
    }
}
