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

/// Whether a request addresses Azure OpenAI (`/openai/deployments/...`, `/openai/models`).
pub(crate) fn is_azure(req: &Request) -> bool {
    req.path().starts_with("/openai/")
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
    let has_version = query_param(req, "api-version").is_some_and(|v| !v.is_empty());
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

fn line(v: &Value) -> String {
    let mut out = Vec::with_capacity(256);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, GoogleLine);
    if v.serialize(&mut ser).is_err() {
        return String::new();
    }
    String::from_utf8(out).unwrap_or_default()
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

/// `usageMetadata` after `output` content tokens (thoughts counted apart).
fn gemini_usage(m: &ReplyMeta, output: u64) -> Value {
    let thoughts = m.extras.reasoning.len() as u64;
    let candidates = output.saturating_sub(thoughts);
    let mut u = json!({
        "promptTokenCount": m.prompt_tokens,
        "candidatesTokenCount": candidates,
        "totalTokenCount": m.prompt_tokens + output,
    });
    if let Some(c) = m.cached_tokens {
        u["cachedContentTokenCount"] = c.into();
    }
    if thoughts > 0 {
        u["thoughtsTokenCount"] = thoughts.into();
    }
    u["promptTokensDetails"] = json!([{"modality": "TEXT", "tokenCount": m.prompt_tokens}]);
    u
}

/// One `GenerateContentResponse` with `parts`, optionally a finish reason and usage.
fn gemini_chunk(m: &ReplyMeta, parts: Value, finish: bool, usage: Option<Value>) -> Value {
    let mut candidate = json!({"content": {"parts": parts, "role": "model"}});
    if finish {
        candidate["finishReason"] = m.finish_reason.as_str().into();
    }
    candidate["index"] = 0.into();
    let mut v = json!({"candidates": [candidate]});
    if let Some(u) = usage.filter(|_| m.usage_chunk) {
        v["usageMetadata"] = u;
    }
    v["modelVersion"] = m.model.as_str().into();
    v["responseId"] = m.id.as_str().into();
    v
}

fn call_part(call: &ToolCallOut) -> Value {
    let args: Value =
        serde_json::from_str(&call.arguments).unwrap_or_else(|_| Value::Object(Default::default()));
    json!({"functionCall": {"name": call.name, "args": args}})
}

/// The running usage of a chunk before the end: the prompt only, as Gemini reports it.
fn prompt_usage(m: &ReplyMeta) -> Value {
    json!({"promptTokenCount": m.prompt_tokens, "totalTokenCount": m.prompt_tokens})
}

/// A stream chunk with one text part (`thought`: a reasoning part).
pub(crate) fn gemini_text_chunk(m: &ReplyMeta, text: &str, thought: bool) -> String {
    let part = if thought {
        json!({"text": text, "thought": true})
    } else {
        json!({"text": text})
    };
    line(&gemini_chunk(
        m,
        json!([part]),
        false,
        Some(prompt_usage(m)),
    ))
}

/// A stream chunk with one whole function call (Gemini sends calls whole).
pub(crate) fn gemini_call_chunk(m: &ReplyMeta, call: &ToolCallOut) -> String {
    line(&gemini_chunk(
        m,
        json!([call_part(call)]),
        false,
        Some(prompt_usage(m)),
    ))
}

/// The last chunk: an empty text part, the finish reason and the final usage after `sent`
/// content tokens.
pub(crate) fn gemini_finish_chunk(m: &ReplyMeta, sent: u64) -> String {
    line(&gemini_chunk(
        m,
        json!([{"text": ""}]),
        true,
        Some(gemini_usage(m, sent)),
    ))
}

/// A whole non-stream `GenerateContentResponse`: reasoning (a `thought` part), text, one
/// part per function call.
pub(crate) fn gemini_response(m: &ReplyMeta, text: &str, output_tokens: u64) -> String {
    let mut parts = Vec::new();
    if !m.extras.reasoning.is_empty() {
        parts.push(json!({"text": m.extras.reasoning.concat(), "thought": true}));
    }
    if !text.is_empty() || m.extras.tool_calls.is_empty() {
        parts.push(json!({"text": text}));
    }
    parts.extend(m.extras.tool_calls.iter().map(call_part));
    pretty(&gemini_chunk(
        m,
        Value::Array(parts),
        true,
        Some(gemini_usage(m, output_tokens)),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

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
