//! The translation matrix over loopback: {Chat Completions, Messages, Responses} clients ×
//! {openai (Chat Completions), anthropic, openai with `api: responses`, azure_openai with
//! `api: responses`} routes × {stream, non-stream} × {plain text, tool calls (after text,
//! and alone), image input, reasoning, upstream error}, 144 cells, one table-driven loop
//! against one Sluice and one mock upstream.
//!
//! The mock answers each provider's wire format byte for byte (tool calls as OpenAI
//! `tool_calls` deltas / Anthropic `input_json_delta` fragments, reasoning as
//! `reasoning_content` / thinking blocks with a signature, mid-stream errors as each
//! provider sends them) and always names a dated model id that is neither the standard nor
//! the upstream model. Each cell reassembles what the client sees in its own dialect (text,
//! reasoning, tool names and arguments, stop reason, usage, model ids, error shape) and
//! compares it with what the mock sent; the input-side cells (images, tool calls and tool
//! results in the history, reasoning settings) also check what the provider received.
//!
//! The request bodies and the per-dialect readers ([`run_cell`]) are shared with the provider
//! battery (`provider_battery.rs`), which runs cells like these over every provider kind.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::client::{post_json, sse_events, StreamReader};
use crate::harness::{Mock, Sluice, KEY};

/// The model id the mock answers with (neither standard nor upstream model).
const ANSWERED: &str = "upstream-dated-2026-01-01";
const TEXT: &str = "héllo wörld, ünïcode ✓ 🚀";
const TOOL_TEXT: &str = "Let me check.";
const REASONING: &str = "First the weather, then the tïme. Done thinking.";
/// The input tokens the mock reports.
const PROMPT_TOKENS: u64 = 42;
/// How many of them the mock says were read from its prompt cache.
const CACHED_TOKENS: u64 = 30;
const ERROR_MESSAGE: &str = "mock upstream is overloaded";
/// A 1×1 PNG.
const PNG_B64: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";
const IMAGE_URL: &str = "https://images.example/cat.png";
/// The tool call and result in the history of the tool cells.
const PREV_CALL: &str = "call_prev1";
const PREV_RESULT: &str = "18°C and sunny";
/// The signed reasoning in the history of the Messages and Responses reasoning cells.
const PREV_THOUGHT: &str = "They greet me.";
const PREV_SIGNATURE: &str = "sig-prev-turn";

fn config(base_url: &str, root_url: &str) -> String {
    let health =
        "    health: {degraded_after_failures: 100000, unhealthy_after_failures: 100000}\n";
    format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\ntenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n  oa:\n    kind: openai\n    base_url: {base_url}\n    api_key: sk-provider-secret-oa\n    health_check: {{enabled: false}}\n{health}  claude:\n    kind: anthropic\n    base_url: {base_url}\n    api_key: sk-ant-provider-secret\n    health_check: {{enabled: false}}\n{health}  az:\n    kind: azure_openai\n    base_url: {root_url}\n    api_version: \"2024-10-21\"\n    api_key: az-provider-secret\n    health_check: {{enabled: false}}\n{health}models:\n  acme/gpt:\n    routes:\n      - provider: oa\n        upstream_model: gpt-mock-1\n  acme/claude:\n    default_max_tokens: 4096\n    routes:\n      - provider: claude\n        upstream_model: claude-mock-1\n  acme/gpt-resp:\n    routes:\n      - provider: oa\n        upstream_model: gpt-mock-1\n        api: responses\n  acme/az-resp:\n    routes:\n      - provider: az\n        upstream_model: az-mock-1\n        api: responses\n"
    )
}

/// The upstream dialect of a matrix column.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Up {
    /// OpenAI Chat Completions (`acme/gpt`).
    Chat,
    /// Anthropic Messages (`acme/claude`).
    Messages,
    /// OpenAI Responses, on OpenAI (`acme/gpt-resp`) and on Azure OpenAI (`acme/az-resp`).
    Responses,
}

impl Up {
    fn of(model: &str) -> Up {
        match model {
            "acme/claude" => Up::Messages,
            "acme/gpt-resp" | "acme/az-resp" => Up::Responses,
            _ => Up::Chat,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Client {
    Chat,
    Messages,
    Responses,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Scenario {
    Text,
    Tool,
    /// Parallel tool calls and no text (OpenAI names the role in the first tool chunk).
    ToolOnly,
    Image,
    Reasoning,
    Error,
}

/// The tool calls the mock answers with: (name, arguments); two of them, so parallel.
fn answered_tools() -> Vec<(&'static str, Value)> {
    vec![
        ("get_weather", json!({"city": "Zürich", "unit": "c"})),
        ("get_time", json!({"tz": "Europe/Zurich", "24h": true})),
    ]
}

/// The mock's behaviour for a scenario (stream errors are mid-stream error events,
/// non-stream errors an error status).
fn behavior(s: Scenario, stream: bool) -> String {
    let v = match s {
        Scenario::Text | Scenario::Image => json!({"text": TEXT}),
        Scenario::Tool | Scenario::ToolOnly => {
            let calls: Vec<Value> = answered_tools()
                .into_iter()
                .map(|(name, arguments)| json!({"name": name, "arguments": arguments}))
                .collect();
            if s == Scenario::Tool {
                json!({"text": TOOL_TEXT, "tool_calls": calls})
            } else {
                json!({"tool_calls": calls})
            }
        }
        Scenario::Reasoning => json!({"text": TEXT, "reasoning": REASONING}),
        Scenario::Error if stream => json!({"text": TEXT, "error_after_tokens": 2,
            "error_type": "overloaded_error", "error_message": ERROR_MESSAGE}),
        Scenario::Error => json!({"status": 529, "error_message": ERROR_MESSAGE}),
    };
    let mut v = v;
    v["answer_model"] = json!(ANSWERED);
    // Every event reaches Sluice cut inside its multi-byte characters.
    v["split"] = json!("mid_utf8");
    v["prompt_tokens"] = json!(PROMPT_TOKENS);
    v["cached_tokens"] = json!(CACHED_TOKENS);
    v.to_string()
}

impl Client {
    /// The endpoint the client posts to.
    pub(crate) fn path(self) -> &'static str {
        match self {
            Client::Chat => "/v1/chat/completions",
            Client::Messages => "/v1/messages",
            Client::Responses => "/v1/responses",
        }
    }

    /// The request body of a cell, in the client's own dialect.
    #[expect(
        clippy::too_many_lines,
        reason = "one request body per scenario and client, side by side"
    )]
    pub(crate) fn body(self, s: Scenario, model: &str, stream: bool) -> Value {
        let weather_schema = json!({"type": "object",
            "properties": {"city": {"type": "string"}}, "required": ["city"]});
        let b = match self {
            Client::Chat => {
                let mut b = json!({"model": model, "stream": stream,
                    "messages": [{"role": "system", "content": "be brief"},
                                 {"role": "user", "content": "hi"}]});
                if stream {
                    b["stream_options"] = json!({"include_usage": true});
                }
                match s {
                    Scenario::Image => {
                        b["messages"][1]["content"] = json!([
                            {"type": "text", "text": "what is this?"},
                            {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{PNG_B64}")}},
                            {"type": "image_url", "image_url": {"url": IMAGE_URL}}]);
                    }
                    Scenario::Tool | Scenario::ToolOnly => {
                        b["tools"] = json!([{"type": "function", "function": {
                            "name": "get_weather", "description": "Weather of a city",
                            "parameters": weather_schema}}]);
                        b["tool_choice"] = json!("auto");
                        b["messages"] = json!([
                            {"role": "system", "content": "be brief"},
                            {"role": "user", "content": "weather in Paris?"},
                            {"role": "assistant", "content": null, "tool_calls": [{"id": PREV_CALL,
                                "type": "function", "function": {"name": "get_weather",
                                "arguments": "{\"city\":\"Paris\"}"}}]},
                            {"role": "tool", "tool_call_id": PREV_CALL, "content": PREV_RESULT},
                            {"role": "user", "content": "and Zürich, and the time?"}]);
                    }
                    Scenario::Reasoning => {
                        b["reasoning_effort"] = json!("low");
                        b["max_completion_tokens"] = json!(2048);
                    }
                    Scenario::Text | Scenario::Error => {}
                }
                b
            }
            Client::Messages => {
                let mut b = json!({"model": model, "max_tokens": 2048, "system": "be brief",
                    "stream": stream, "messages": [{"role": "user", "content": "hi"}]});
                match s {
                    Scenario::Image => {
                        b["messages"][0]["content"] = json!([
                            {"type": "text", "text": "what is this?"},
                            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64}},
                            {"type": "image", "source": {"type": "url", "url": IMAGE_URL}}]);
                    }
                    Scenario::Tool | Scenario::ToolOnly => {
                        b["tools"] = json!([{"name": "get_weather",
                            "description": "Weather of a city", "input_schema": weather_schema}]);
                        b["tool_choice"] = json!({"type": "auto"});
                        b["messages"] = json!([
                            {"role": "user", "content": "weather in Paris?"},
                            {"role": "assistant", "content": [{"type": "tool_use", "id": PREV_CALL,
                                "name": "get_weather", "input": {"city": "Paris"}}]},
                            {"role": "user", "content": [
                                {"type": "tool_result", "tool_use_id": PREV_CALL, "content": PREV_RESULT},
                                {"type": "text", "text": "and Zürich, and the time?"}]}]);
                    }
                    Scenario::Reasoning => {
                        b["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
                        // A signed thinking block from an earlier turn.
                        b["messages"] = json!([
                            {"role": "user", "content": "hello"},
                            {"role": "assistant", "content": [
                                {"type": "thinking", "thinking": PREV_THOUGHT, "signature": PREV_SIGNATURE},
                                {"type": "text", "text": "Hi!"}]},
                            {"role": "user", "content": "hi"}]);
                    }
                    Scenario::Text | Scenario::Error => {}
                }
                b
            }
            Client::Responses => {
                let mut b = json!({"model": model, "instructions": "be brief", "input": "hi",
                    "stream": stream});
                match s {
                    Scenario::Image => {
                        b["input"] = json!([{"role": "user", "content": [
                            {"type": "input_text", "text": "what is this?"},
                            {"type": "input_image", "image_url": format!("data:image/png;base64,{PNG_B64}")},
                            {"type": "input_image", "image_url": IMAGE_URL}]}]);
                    }
                    Scenario::Tool | Scenario::ToolOnly => {
                        b["tools"] = json!([{"type": "function", "name": "get_weather",
                            "description": "Weather of a city", "parameters": weather_schema}]);
                        b["tool_choice"] = json!("auto");
                        b["input"] = json!([
                            {"role": "user", "content": "weather in Paris?"},
                            {"type": "function_call", "call_id": PREV_CALL, "name": "get_weather",
                                "arguments": "{\"city\":\"Paris\"}"},
                            {"type": "function_call_output", "call_id": PREV_CALL, "output": PREV_RESULT},
                            {"role": "user", "content": "and Zürich, and the time?"}]);
                    }
                    Scenario::Reasoning => {
                        b["reasoning"] = json!({"effort": "low"});
                        b["max_output_tokens"] = json!(2048);
                        // A reasoning item with encrypted content from an earlier turn.
                        b["input"] = json!([
                            {"role": "user", "content": "hello"},
                            {"type": "reasoning", "id": "rs_prev", "summary": [
                                {"type": "summary_text", "text": PREV_THOUGHT}],
                                "encrypted_content": PREV_SIGNATURE},
                            {"type": "message", "role": "assistant", "content": [
                                {"type": "output_text", "text": "Hi!"}]},
                            {"role": "user", "content": "hi"}]);
                    }
                    Scenario::Text | Scenario::Error => {}
                }
                b
            }
        };
        b
    }

    /// The virtual key the way the client's own SDK sends it (plus Anthropic's version).
    pub(crate) fn headers(self) -> Vec<(&'static str, String)> {
        match self {
            Client::Messages => vec![
                ("x-api-key", KEY.to_string()),
                ("anthropic-version", "2023-06-01".to_string()),
            ],
            Client::Chat | Client::Responses => vec![("authorization", format!("Bearer {KEY}"))],
        }
    }
}

/// (event name, data JSON) of every SSE event; `[DONE]` and comments are left out, but
/// `[DONE]` is reported by `done`.
fn events(body: &[u8]) -> Vec<(Option<String>, Value)> {
    sse_events(body)
        .iter()
        .filter(|e| !e.starts_with(':'))
        .filter_map(|e| {
            let mut name = None;
            let mut data = String::new();
            for line in e.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_string());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data.push_str(d);
                }
            }
            if data == "[DONE]" {
                return None;
            }
            let v = serde_json::from_str(&data)
                .unwrap_or_else(|e| panic!("event data is not JSON ({e}): {data:?}"));
            Some((name, v))
        })
        .collect()
}

/// What a client reassembles from one answer.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    pub(crate) text: String,
    pub(crate) reasoning: String,
    /// Thinking signature / Responses `encrypted_content`, when the dialect carries one.
    pub(crate) signature: String,
    /// (call id, name, arguments text) in order.
    pub(crate) tools: Vec<(String, String, String)>,
    pub(crate) stop: String,
    pub(crate) input_tokens: u64,
    pub(crate) output_tokens: u64,
    pub(crate) reasoning_tokens: u64,
    pub(crate) cached_tokens: u64,
    pub(crate) models: Vec<String>,
    /// (error type, message) of an error body or in-stream error event.
    pub(crate) error: Option<(String, String)>,
}

fn s(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

fn chat_nonstream(v: &Value, out: &mut Seen) {
    let msg = &v["choices"][0]["message"];
    out.text = s(&msg["content"]);
    out.reasoning = s(&msg["reasoning_content"]);
    for t in msg["tool_calls"].as_array().into_iter().flatten() {
        assert_eq!(t["type"], "function", "{v}");
        out.tools.push((
            s(&t["id"]),
            s(&t["function"]["name"]),
            s(&t["function"]["arguments"]),
        ));
    }
    out.models.push(s(&v["model"]));
    out.stop = s(&v["choices"][0]["finish_reason"]);
    out.input_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
    out.output_tokens = v["usage"]["completion_tokens"].as_u64().unwrap_or(0);
    out.cached_tokens = v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    out.reasoning_tokens = v["usage"]["completion_tokens_details"]["reasoning_tokens"]
        .as_u64()
        .unwrap_or(0);
}

fn chat_stream(raw: &str, body: &[u8], out: &mut Seen) {
    let mut by_index: BTreeMap<u64, (String, String, String)> = BTreeMap::new();
    for (name, d) in events(body) {
        if let Some(e) = d.get("error") {
            out.error = Some((s(&e["type"]), s(&e["message"])));
            continue;
        }
        // Azure OpenAI's prompt annotation chunk (no choices, `object: ""`), relayed as
        // Azure sends it: the OpenAI SDKs skip it, so does the reader.
        if d.get("prompt_filter_results").is_some() && d["choices"] == json!([]) {
            continue;
        }
        assert!(name.is_none(), "chat chunks carry no event name: {raw}");
        assert_eq!(d["object"], "chat.completion.chunk", "{raw}");
        out.models.push(s(&d["model"]));
        let c = &d["choices"][0];
        if let Some(t) = c["delta"]["content"].as_str() {
            out.text.push_str(t);
        }
        if let Some(t) = c["delta"]["reasoning_content"].as_str() {
            out.reasoning.push_str(t);
        }
        for t in c["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let i = t["index"].as_u64().expect("tool call index");
            let e = by_index.entry(i).or_default();
            if let Some(id) = t["id"].as_str() {
                assert!(e.0.is_empty(), "tool call {i} started twice: {raw}");
                e.0 = id.into();
                assert_eq!(t["type"], "function", "{raw}");
            }
            if let Some(n) = t["function"]["name"].as_str() {
                e.1.push_str(n);
            }
            if let Some(a) = t["function"]["arguments"].as_str() {
                e.2.push_str(a);
            }
        }
        if let Some(r) = c["finish_reason"].as_str() {
            out.stop = r.into();
        }
        if let Some(n) = d["usage"]["completion_tokens"].as_u64() {
            out.output_tokens = n;
            out.input_tokens = d["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
            out.cached_tokens = d["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0);
            out.reasoning_tokens = d["usage"]["completion_tokens_details"]["reasoning_tokens"]
                .as_u64()
                .unwrap_or(0);
        }
    }
    out.tools = by_index.into_values().collect();
    if out.error.is_none() {
        assert!(raw.ends_with("data: [DONE]\n\n"), "{raw}");
    } else {
        assert!(
            !raw.contains("[DONE]"),
            "an errored stream is not [DONE]: {raw}"
        );
    }
}

fn messages_content(blocks: &Value, out: &mut Seen) {
    for b in blocks.as_array().expect("content") {
        match b["type"].as_str() {
            Some("text") => out.text.push_str(&s(&b["text"])),
            Some("thinking") => {
                out.reasoning.push_str(&s(&b["thinking"]));
                out.signature.push_str(&s(&b["signature"]));
            }
            Some("tool_use") => {
                assert!(b["input"].is_object(), "{b}");
                out.tools
                    .push((s(&b["id"]), s(&b["name"]), b["input"].to_string()));
            }
            other => panic!("unexpected block {other:?}: {b}"),
        }
    }
}

fn messages_nonstream(v: &Value, out: &mut Seen) {
    assert_eq!(v["type"], "message", "{v}");
    assert_eq!(v["role"], "assistant", "{v}");
    messages_content(&v["content"], out);
    out.models.push(s(&v["model"]));
    out.stop = s(&v["stop_reason"]);
    out.input_tokens = v["usage"]["input_tokens"].as_u64().unwrap_or(0);
    out.output_tokens = v["usage"]["output_tokens"].as_u64().unwrap_or(0);
    out.cached_tokens = v["usage"]["cache_read_input_tokens"].as_u64().unwrap_or(0);
}

#[expect(
    clippy::too_many_lines,
    reason = "one check per field of the transcript, in wire order"
)]
fn messages_stream(raw: &str, body: &[u8], out: &mut Seen) {
    // index -> (type, text/thinking/json, signature, id, name, stopped)
    #[derive(Default)]
    struct Block {
        ty: String,
        acc: String,
        sig: String,
        id: String,
        name: String,
        stopped: bool,
    }
    let mut blocks: BTreeMap<u64, Block> = BTreeMap::new();
    let evs = events(body);
    let mut last = String::new();
    for (name, d) in &evs {
        assert_eq!(
            name.as_deref(),
            d["type"].as_str(),
            "event name = type: {raw}"
        );
        last = s(&d["type"]);
        match d["type"].as_str() {
            Some("message_start") => {
                out.models.push(s(&d["message"]["model"]));
                let u = &d["message"]["usage"];
                out.input_tokens = u["input_tokens"].as_u64().unwrap_or(0);
                out.cached_tokens = u["cache_read_input_tokens"].as_u64().unwrap_or(0);
            }
            Some("content_block_start") => {
                let i = d["index"].as_u64().expect("index");
                assert_eq!(
                    i,
                    blocks.len() as u64,
                    "blocks count from 0 in order: {raw}"
                );
                assert!(
                    blocks.values().all(|b| b.stopped),
                    "a block starts before the previous one stopped: {raw}"
                );
                let cb = &d["content_block"];
                blocks.insert(
                    i,
                    Block {
                        ty: s(&cb["type"]),
                        id: s(&cb["id"]),
                        name: s(&cb["name"]),
                        ..Block::default()
                    },
                );
            }
            Some("content_block_delta") => {
                let i = d["index"].as_u64().expect("index");
                let b = blocks
                    .get_mut(&i)
                    .unwrap_or_else(|| panic!("delta for no block: {raw}"));
                assert!(!b.stopped, "delta after stop: {raw}");
                let delta = &d["delta"];
                match (b.ty.as_str(), delta["type"].as_str()) {
                    ("text", Some("text_delta")) => b.acc.push_str(&s(&delta["text"])),
                    ("thinking", Some("thinking_delta")) => {
                        b.acc.push_str(&s(&delta["thinking"]));
                    }
                    ("thinking", Some("signature_delta")) => {
                        b.sig.push_str(&s(&delta["signature"]));
                    }
                    ("tool_use", Some("input_json_delta")) => {
                        b.acc.push_str(&s(&delta["partial_json"]));
                    }
                    (ty, dt) => panic!("delta {dt:?} in a {ty} block: {raw}"),
                }
            }
            Some("content_block_stop") => {
                let i = d["index"].as_u64().expect("index");
                let b = blocks
                    .get_mut(&i)
                    .unwrap_or_else(|| panic!("stop of no block: {raw}"));
                assert!(!b.stopped, "stopped twice: {raw}");
                b.stopped = true;
            }
            Some("message_delta") => {
                out.stop = s(&d["delta"]["stop_reason"]);
                out.output_tokens = d["usage"]["output_tokens"].as_u64().unwrap_or(0);
                // Cumulative: a translated stream may know the input only at the end.
                if let Some(n) = d["usage"]["input_tokens"].as_u64() {
                    out.input_tokens = n;
                }
                if let Some(n) = d["usage"]["cache_read_input_tokens"].as_u64() {
                    out.cached_tokens = n;
                }
            }
            Some("error") => {
                out.error = Some((s(&d["error"]["type"]), s(&d["error"]["message"])));
            }
            Some("ping" | "message_stop") => {}
            other => panic!("unknown Messages event {other:?}: {raw}"),
        }
    }
    for b in blocks.values() {
        match b.ty.as_str() {
            "text" => out.text.push_str(&b.acc),
            "thinking" => {
                out.reasoning.push_str(&b.acc);
                out.signature.push_str(&b.sig);
            }
            "tool_use" => out
                .tools
                .push((b.id.clone(), b.name.clone(), b.acc.clone())),
            other => panic!("unexpected block type {other}: {raw}"),
        }
    }
    if out.error.is_none() {
        assert_eq!(last, "message_stop", "{raw}");
        assert!(
            blocks.values().all(|b| b.stopped),
            "every block stopped: {raw}"
        );
    } else {
        assert_eq!(last, "error", "{raw}");
    }
}

fn responses_output(output: &Value, out: &mut Seen) {
    for item in output.as_array().expect("output") {
        match item["type"].as_str() {
            Some("message") => {
                assert_eq!(item["role"], "assistant", "{item}");
                for c in item["content"].as_array().expect("content") {
                    assert_eq!(c["type"], "output_text", "{item}");
                    out.text.push_str(&s(&c["text"]));
                }
            }
            Some("reasoning") => {
                for p in item["summary"].as_array().into_iter().flatten() {
                    out.reasoning.push_str(&s(&p["text"]));
                }
                for p in item["content"].as_array().into_iter().flatten() {
                    out.reasoning.push_str(&s(&p["text"]));
                }
                out.signature.push_str(&s(&item["encrypted_content"]));
            }
            Some("function_call") => {
                assert!(
                    s(&item["id"]).starts_with("fc"),
                    "function_call item ids start with fc: {item}"
                );
                out.tools
                    .push((s(&item["call_id"]), s(&item["name"]), s(&item["arguments"])));
            }
            other => panic!("unexpected output item {other:?}: {item}"),
        }
    }
}

fn responses_nonstream(v: &Value, out: &mut Seen) {
    assert_eq!(v["object"], "response", "{v}");
    responses_output(&v["output"], out);
    out.models.push(s(&v["model"]));
    out.stop = s(&v["status"]);
    out.input_tokens = v["usage"]["input_tokens"].as_u64().unwrap_or(0);
    out.output_tokens = v["usage"]["output_tokens"].as_u64().unwrap_or(0);
    out.cached_tokens = v["usage"]["input_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    out.reasoning_tokens = v["usage"]["output_tokens_details"]["reasoning_tokens"]
        .as_u64()
        .unwrap_or(0);
}

fn responses_stream(raw: &str, body: &[u8], out: &mut Seen) {
    let mut seq = Vec::new();
    let mut streamed = Seen::default();
    // output_index -> (call id, name, arguments from deltas)
    let mut calls: BTreeMap<u64, (String, String, String)> = BTreeMap::new();
    let mut final_response = None;
    for (name, d) in events(body) {
        assert_eq!(
            name.as_deref(),
            d["type"].as_str(),
            "event name = type: {raw}"
        );
        seq.push(d["sequence_number"].as_u64().expect("sequence_number"));
        if let Some(m) = d["response"]["model"].as_str() {
            out.models.push(m.into());
        }
        match d["type"].as_str() {
            Some("response.output_text.delta") => streamed.text.push_str(&s(&d["delta"])),
            Some("response.reasoning_summary_text.delta" | "response.reasoning_text.delta") => {
                streamed.reasoning.push_str(&s(&d["delta"]));
            }
            Some("response.output_item.added") if d["item"]["type"] == "function_call" => {
                let i = d["output_index"].as_u64().expect("output_index");
                calls.insert(
                    i,
                    (
                        s(&d["item"]["call_id"]),
                        s(&d["item"]["name"]),
                        String::new(),
                    ),
                );
            }
            Some("response.function_call_arguments.delta") => {
                let i = d["output_index"].as_u64().expect("output_index");
                let c = calls
                    .get_mut(&i)
                    .unwrap_or_else(|| panic!("arguments for no call: {raw}"));
                c.2.push_str(&s(&d["delta"]));
            }
            Some("response.function_call_arguments.done") => {
                let i = d["output_index"].as_u64().expect("output_index");
                assert_eq!(calls[&i].2, s(&d["arguments"]), "done = deltas: {raw}");
            }
            Some("response.completed" | "response.incomplete") => {
                final_response = Some(d["response"].clone());
            }
            Some("response.failed") => {
                let e = &d["response"]["error"];
                out.error = Some((s(&e["code"]), s(&e["message"])));
            }
            Some("error") => {
                out.error = Some((s(&d["code"]), s(&d["message"])));
            }
            _ => {}
        }
    }
    let expected: Vec<u64> = (0..seq.len() as u64).collect();
    assert_eq!(seq, expected, "sequence numbers count from 0: {raw}");
    if out.error.is_some() {
        out.text = streamed.text;
        assert!(final_response.is_none(), "{raw}");
        return;
    }
    let fin = final_response.unwrap_or_else(|| panic!("no response.completed: {raw}"));
    responses_nonstream(&fin, out);
    // What the deltas said is what the final response says.
    assert_eq!(streamed.text, out.text, "{raw}");
    assert_eq!(streamed.reasoning, out.reasoning, "{raw}");
    let streamed_calls: Vec<_> = calls.into_values().collect();
    assert_eq!(streamed_calls, out.tools, "{raw}");
}

/// What a `client` reassembles from the SSE body of a whole stream in its dialect (the
/// per-dialect readers' checks included: a Responses stream's `sequence_number`s count from 0
/// without a gap, a Messages stream's blocks start and stop in order, a Chat stream ends with
/// `[DONE]`). Shared with `resumable.rs`, which feeds it a stream put together from a cut
/// connection and its resumption.
pub(crate) fn reassemble(client: Client, body: &[u8]) -> Seen {
    let raw = String::from_utf8_lossy(body).into_owned();
    let mut seen = Seen::default();
    match client {
        Client::Chat => chat_stream(&raw, body, &mut seen),
        Client::Messages => messages_stream(&raw, body, &mut seen),
        Client::Responses => responses_stream(&raw, body, &mut seen),
    }
    seen
}

/// Sends one cell's request; returns status, body and what the client reassembled.
pub(crate) fn run_cell(
    sluice: &Sluice,
    client: Client,
    body: &Value,
    stream: bool,
) -> (u16, String, Seen) {
    let owned = client.headers();
    let headers: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let text = body.to_string();
    let (status, bytes) = if stream {
        let mut r = StreamReader::open(sluice.addr, client.path(), &headers, &text);
        let status = r.status;
        if status == 200 {
            assert_eq!(
                r.header("content-type"),
                Some("text/event-stream; charset=utf-8")
            );
        }
        (status, r.read_to_end(Duration::from_secs(10)))
    } else {
        let r = post_json(sluice.addr, client.path(), &headers, &text);
        (r.status, r.body)
    };
    let raw = String::from_utf8_lossy(&bytes).into_owned();
    let mut seen = Seen::default();
    if status != 200 {
        let v: Value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("error body is not JSON ({e}): {raw}"));
        if client == Client::Messages {
            assert_eq!(v["type"], "error", "{raw}");
        } else {
            assert!(v.get("type").is_none(), "{raw}");
        }
        seen.error = Some((s(&v["error"]["type"]), s(&v["error"]["message"])));
        return (status, raw, seen);
    }
    match (client, stream) {
        (Client::Chat, false) => {
            chat_nonstream(&serde_json::from_slice(&bytes).expect("JSON"), &mut seen)
        }
        (_, true) => seen = reassemble(client, &bytes),
        (Client::Messages, false) => {
            messages_nonstream(&serde_json::from_slice(&bytes).expect("JSON"), &mut seen);
        }
        (Client::Responses, false) => {
            responses_nonstream(&serde_json::from_slice(&bytes).expect("JSON"), &mut seen);
        }
    }
    (status, raw, seen)
}

/// The output tokens the mock reports: one per text word, reasoning word, tool-call start
/// and argument fragment (of at most 7 characters).
fn expected_output_tokens(s: Scenario) -> u64 {
    let words = |t: &str| t.split_whitespace().count() as u64;
    match s {
        Scenario::Text | Scenario::Image | Scenario::Error => words(TEXT),
        Scenario::Reasoning => words(TEXT) + words(REASONING),
        Scenario::Tool | Scenario::ToolOnly => {
            let calls: u64 = answered_tools()
                .iter()
                .map(|(_, a)| 1 + (a.to_string().chars().count() as u64).div_ceil(7))
                .sum();
            let text = if s == Scenario::Tool {
                words(TOOL_TEXT)
            } else {
                0
            };
            text + calls
        }
    }
}

fn expected_stop(client: Client, s: Scenario) -> &'static str {
    match (client, s) {
        (Client::Chat, Scenario::Tool | Scenario::ToolOnly) => "tool_calls",
        (Client::Chat, _) => "stop",
        (Client::Messages, Scenario::Tool | Scenario::ToolOnly) => "tool_use",
        (Client::Messages, _) => "end_turn",
        (Client::Responses, _) => "completed",
    }
}

/// Content of the message parts of an upstream request, whatever the dialect (a string
/// content becomes one text part).
fn parts(msg: &Value) -> Vec<Value> {
    match &msg["content"] {
        Value::String(t) => vec![json!({"type": "text", "text": t})],
        Value::Array(a) => a.clone(),
        _ => Vec::new(),
    }
}

fn text_of(content: &Value) -> String {
    match content {
        Value::String(t) => t.clone(),
        Value::Array(a) => a.iter().map(|p| s(&p["text"])).collect(),
        _ => String::new(),
    }
}

/// Checks what the provider received for the input-side cells.
#[expect(
    clippy::too_many_lines,
    reason = "one check per field of the transcript, in wire order"
)]
fn check_upstream(cell: &str, scenario: Scenario, client: Client, anthropic: bool, sent: &Value) {
    let msgs = sent["messages"].as_array().expect("messages");
    match scenario {
        Scenario::Image => {
            let last = msgs.last().expect("a message");
            let ps = parts(last);
            if anthropic {
                assert!(
                    ps.contains(&json!({"type": "image", "source": {"type": "base64",
                        "media_type": "image/png", "data": PNG_B64}})),
                    "{cell}: base64 image: {sent}"
                );
                assert!(
                    ps.contains(
                        &json!({"type": "image", "source": {"type": "url", "url": IMAGE_URL}})
                    ),
                    "{cell}: URL image: {sent}"
                );
            } else {
                let urls: Vec<String> = ps
                    .iter()
                    .filter(|p| p["type"] == "image_url")
                    .map(|p| s(&p["image_url"]["url"]))
                    .collect();
                assert_eq!(
                    urls,
                    vec![
                        format!("data:image/png;base64,{PNG_B64}"),
                        IMAGE_URL.to_string()
                    ],
                    "{cell}: {sent}"
                );
            }
            assert!(
                ps.iter()
                    .any(|p| p["type"] == "text" && p["text"] == "what is this?"),
                "{cell}: {sent}"
            );
        }
        Scenario::Tool | Scenario::ToolOnly => {
            let tool = &sent["tools"][0];
            let prev_args = json!({"city": "Paris"});
            if anthropic {
                assert_eq!(tool["name"], "get_weather", "{cell}: {sent}");
                assert_eq!(
                    tool["input_schema"]["required"],
                    json!(["city"]),
                    "{cell}: {sent}"
                );
                assert_eq!(
                    sent["tool_choice"],
                    json!({"type": "auto"}),
                    "{cell}: {sent}"
                );
                let call = msgs
                    .iter()
                    .filter(|m| m["role"] == "assistant")
                    .flat_map(parts)
                    .find(|p| p["type"] == "tool_use")
                    .unwrap_or_else(|| panic!("{cell}: no tool_use in the history: {sent}"));
                assert_eq!(call["id"], PREV_CALL, "{cell}");
                assert_eq!(call["name"], "get_weather", "{cell}");
                assert_eq!(call["input"], prev_args, "{cell}");
                let result = msgs
                    .iter()
                    .filter(|m| m["role"] == "user")
                    .flat_map(parts)
                    .find(|p| p["type"] == "tool_result")
                    .unwrap_or_else(|| panic!("{cell}: no tool_result: {sent}"));
                assert_eq!(result["tool_use_id"], PREV_CALL, "{cell}");
                assert_eq!(text_of(&result["content"]), PREV_RESULT, "{cell}: {sent}");
            } else {
                assert_eq!(tool["type"], "function", "{cell}: {sent}");
                assert_eq!(tool["function"]["name"], "get_weather", "{cell}: {sent}");
                assert_eq!(
                    tool["function"]["parameters"]["required"],
                    json!(["city"]),
                    "{cell}: {sent}"
                );
                assert_eq!(sent["tool_choice"], "auto", "{cell}: {sent}");
                let call = msgs
                    .iter()
                    .filter(|m| m["role"] == "assistant")
                    .flat_map(|m| m["tool_calls"].as_array().cloned().unwrap_or_default())
                    .next()
                    .unwrap_or_else(|| panic!("{cell}: no tool call in the history: {sent}"));
                assert_eq!(call["id"], PREV_CALL, "{cell}");
                assert_eq!(call["type"], "function", "{cell}");
                assert_eq!(call["function"]["name"], "get_weather", "{cell}");
                let args: Value = serde_json::from_str(&s(&call["function"]["arguments"]))
                    .unwrap_or_else(|e| panic!("{cell}: arguments not JSON ({e}): {sent}"));
                assert_eq!(args, prev_args, "{cell}");
                let result = msgs
                    .iter()
                    .find(|m| m["role"] == "tool")
                    .unwrap_or_else(|| panic!("{cell}: no tool message: {sent}"));
                assert_eq!(result["tool_call_id"], PREV_CALL, "{cell}");
                assert_eq!(text_of(&result["content"]), PREV_RESULT, "{cell}: {sent}");
            }
            let last = msgs.last().expect("a message");
            assert_eq!(last["role"], "user", "{cell}: {sent}");
            assert!(
                parts(last)
                    .iter()
                    .any(|p| p["text"] == "and Zürich, and the time?"),
                "{cell}: {sent}"
            );
        }
        Scenario::Reasoning => {
            if anthropic {
                assert_eq!(sent["thinking"]["type"], "enabled", "{cell}: {sent}");
                let budget = sent["thinking"]["budget_tokens"].as_u64().unwrap_or(0);
                assert!(budget >= 1024, "{cell}: {sent}");
                assert!(
                    budget < sent["max_tokens"].as_u64().unwrap_or(0),
                    "{cell}: the budget is below max_tokens: {sent}"
                );
            } else {
                assert_eq!(sent["reasoning_effort"], "low", "{cell}: {sent}");
            }
            if client != Client::Chat {
                // The earlier turn's signed reasoning: kept for Anthropic (it verifies the
                // signature), dropped for OpenAI-compatible providers (no reasoning input).
                let assistant = msgs
                    .iter()
                    .find(|m| m["role"] == "assistant")
                    .unwrap_or_else(|| panic!("{cell}: no assistant turn: {sent}"));
                let ps = parts(assistant);
                if anthropic {
                    assert_eq!(
                        ps.first(),
                        Some(&json!({"type": "thinking", "thinking": PREV_THOUGHT,
                            "signature": PREV_SIGNATURE})),
                        "{cell}: {sent}"
                    );
                } else {
                    assert!(!sent.to_string().contains(PREV_SIGNATURE), "{cell}: {sent}");
                }
                assert!(
                    ps.iter().any(|p| p["type"] == "text" && p["text"] == "Hi!"),
                    "{cell}: {sent}"
                );
            }
        }
        Scenario::Text | Scenario::Error => {}
    }
}

/// Checks what a Responses provider received for the input-side cells: the conversation as
/// `input` items, reasoning given back as a `reasoning` item with its `encrypted_content`,
/// `store: false` and encrypted reasoning asked for.
fn check_upstream_responses(cell: &str, scenario: Scenario, client: Client, sent: &Value) {
    let items = sent["input"].as_array().cloned().unwrap_or_default();
    assert_eq!(sent["store"], false, "{cell}: {sent}");
    let of_type = |ty: &str| -> Vec<Value> {
        items
            .iter()
            .filter(|i| i["type"] == ty || (ty == "message" && i["role"].is_string()))
            .cloned()
            .collect()
    };
    match scenario {
        Scenario::Image => {
            let last = items.last().expect("an item");
            let ps = parts(last);
            let urls: Vec<String> = ps
                .iter()
                .filter(|p| p["type"] == "input_image")
                .map(|p| s(&p["image_url"]))
                .collect();
            assert_eq!(
                urls,
                vec![
                    format!("data:image/png;base64,{PNG_B64}"),
                    IMAGE_URL.to_string()
                ],
                "{cell}: {sent}"
            );
            assert!(
                ps.iter()
                    .any(|p| p["type"] == "input_text" && p["text"] == "what is this?"),
                "{cell}: {sent}"
            );
        }
        Scenario::Tool | Scenario::ToolOnly => {
            let tool = &sent["tools"][0];
            assert_eq!(tool["type"], "function", "{cell}: {sent}");
            assert_eq!(tool["name"], "get_weather", "{cell}: {sent}");
            assert_eq!(
                tool["parameters"]["required"],
                json!(["city"]),
                "{cell}: {sent}"
            );
            assert_eq!(sent["tool_choice"], "auto", "{cell}: {sent}");
            let call = of_type("function_call")
                .into_iter()
                .next()
                .unwrap_or_else(|| panic!("{cell}: no function_call item: {sent}"));
            assert_eq!(call["call_id"], PREV_CALL, "{cell}");
            assert_eq!(call["name"], "get_weather", "{cell}");
            let args: Value = serde_json::from_str(&s(&call["arguments"]))
                .unwrap_or_else(|e| panic!("{cell}: arguments not JSON ({e}): {sent}"));
            assert_eq!(args, json!({"city": "Paris"}), "{cell}");
            let result = of_type("function_call_output")
                .into_iter()
                .next()
                .unwrap_or_else(|| panic!("{cell}: no function_call_output: {sent}"));
            assert_eq!(result["call_id"], PREV_CALL, "{cell}");
            assert_eq!(text_of(&result["output"]), PREV_RESULT, "{cell}: {sent}");
            let last = items.last().expect("an item");
            assert_eq!(last["role"], "user", "{cell}: {sent}");
            assert!(
                last.to_string().contains("and Zürich, and the time?"),
                "{cell}: {sent}"
            );
        }
        Scenario::Reasoning => {
            assert_eq!(sent["reasoning"]["effort"], "low", "{cell}: {sent}");
            assert!(
                sent["include"]
                    .as_array()
                    .is_some_and(|i| i.contains(&json!("reasoning.encrypted_content"))),
                "{cell}: {sent}"
            );
            if client != Client::Chat {
                // The earlier turn's reasoning goes back with its encrypted content.
                let r = of_type("reasoning")
                    .into_iter()
                    .next()
                    .unwrap_or_else(|| panic!("{cell}: no reasoning item: {sent}"));
                assert_eq!(r["encrypted_content"], PREV_SIGNATURE, "{cell}: {sent}");
                assert_eq!(r["summary"][0]["text"], PREV_THOUGHT, "{cell}: {sent}");
                assert!(sent.to_string().contains("Hi!"), "{cell}: {sent}");
            }
        }
        Scenario::Text | Scenario::Error => {}
    }
}

#[test]
fn every_cell_of_the_translation_matrix() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&config(&mock.base_url(), &format!("http://{}", mock.addr)));
    let mut failures = Vec::new();
    let mut cells = 0;
    for scenario in [
        Scenario::Text,
        Scenario::Tool,
        Scenario::ToolOnly,
        Scenario::Image,
        Scenario::Reasoning,
        Scenario::Error,
    ] {
        for stream in [false, true] {
            mock.set_behavior(&behavior(scenario, stream));
            for client in [Client::Chat, Client::Messages, Client::Responses] {
                for model in ["acme/gpt", "acme/claude", "acme/gpt-resp", "acme/az-resp"] {
                    cells += 1;
                    let cell = format!("{scenario:?} {client:?}->{model} stream={stream}");
                    mock.reset();
                    let body = client.body(scenario, model, stream);
                    let up = Up::of(model);
                    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        check_cell(
                            &sluice, &mock, &cell, scenario, client, up, model, stream, &body,
                        )
                    }));
                    if let Err(e) = result {
                        let msg = crate::harness::panic_text(&*e).unwrap_or_default();
                        failures.push(format!("{cell}: {msg}"));
                    }
                }
            }
        }
    }
    assert_eq!(cells, 144);
    assert!(
        failures.is_empty(),
        "{} of {cells} cells failed:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[allow(clippy::too_many_arguments)]
#[expect(
    clippy::too_many_lines,
    reason = "one check per field of the transcript, in wire order"
)]
fn check_cell(
    sluice: &Sluice,
    mock: &Mock,
    cell: &str,
    scenario: Scenario,
    client: Client,
    up: Up,
    model: &str,
    stream: bool,
    body: &Value,
) {
    let anthropic = up == Up::Messages;
    let (status, raw, seen) = run_cell(sluice, client, body, stream);
    assert!(
        !raw.contains(ANSWERED),
        "{cell}: the answered model leaked: {raw}"
    );
    assert!(
        !raw.contains("-mock-1"),
        "{cell}: the upstream model leaked: {raw}"
    );

    // The provider got its own API, the upstream model, and the translated input.
    let log = mock.log();
    assert_eq!(log.len(), 1, "{cell}: one upstream request");
    let rec = &log[0];
    let path = s(&rec["path"]);
    let sent: Value = serde_json::from_str(rec["body"].as_str().expect("body copy"))
        .unwrap_or_else(|e| panic!("{cell}: upstream body not JSON: {e}"));
    match up {
        Up::Messages => {
            assert!(path.ends_with("/v1/messages"), "{cell}: {path}");
            assert_eq!(sent["model"], "claude-mock-1", "{cell}");
            assert!(sent["max_tokens"].as_u64().is_some(), "{cell}: {sent}");
        }
        Up::Chat => {
            assert!(path.ends_with("/v1/chat/completions"), "{cell}: {path}");
            assert_eq!(sent["model"], "gpt-mock-1", "{cell}");
        }
        Up::Responses if model == "acme/az-resp" => {
            assert_eq!(path, "/openai/v1/responses", "{cell}");
            assert_eq!(sent["model"], "az-mock-1", "{cell}");
        }
        Up::Responses => {
            assert!(path.ends_with("/v1/responses"), "{cell}: {path}");
            assert_eq!(sent["model"], "gpt-mock-1", "{cell}");
        }
    }
    assert_eq!(
        sent["stream"].as_bool().unwrap_or(false),
        stream,
        "{cell}: {sent}"
    );
    if up == Up::Responses {
        check_upstream_responses(cell, scenario, client, &sent);
    } else {
        check_upstream(cell, scenario, client, anthropic, &sent);
    }

    if scenario == Scenario::Error {
        let (ty, message) = seen
            .error
            .clone()
            .unwrap_or_else(|| panic!("{cell}: no error reached the client: {raw}"));
        assert!(
            message.contains(ERROR_MESSAGE),
            "{cell}: {message:?}: {raw}"
        );
        let want_type = match client {
            Client::Messages => "overloaded_error",
            // OpenAI's clients have no overload type of their own.
            Client::Chat | Client::Responses => "",
        };
        if !want_type.is_empty() {
            assert_eq!(ty, want_type, "{cell}: {raw}");
        } else {
            assert!(!ty.is_empty(), "{cell}: an error type: {raw}");
        }
        if stream {
            assert_eq!(status, 200, "{cell}: the stream was committed: {raw}");
            // The two tokens before the error arrived.
            assert!(
                !seen.text.is_empty() && TEXT.starts_with(&seen.text),
                "{cell}: text before the error {:?}: {raw}",
                seen.text
            );
        } else {
            // Anthropic's 529 is a 503 for OpenAI clients, whose API has no 529.
            let want = if client == Client::Messages { 529 } else { 503 };
            assert_eq!(status, want, "{cell}: {raw}");
        }
        return;
    }

    assert_eq!(status, 200, "{cell}: {raw}");
    assert!(seen.error.is_none(), "{cell}: {:?}: {raw}", seen.error);
    assert!(!seen.models.is_empty(), "{cell}: no model named: {raw}");
    assert!(
        seen.models.iter().all(|m| m == model),
        "{cell}: models {:?}: {raw}",
        seen.models
    );
    assert_eq!(seen.stop, expected_stop(client, scenario), "{cell}: {raw}");
    // Anthropic's input_tokens leave the cache reads out; OpenAI's include them.
    let want_input = if client == Client::Messages {
        PROMPT_TOKENS - CACHED_TOKENS
    } else {
        PROMPT_TOKENS
    };
    assert_eq!(seen.input_tokens, want_input, "{cell}: input usage: {raw}");
    assert_eq!(
        seen.cached_tokens, CACHED_TOKENS,
        "{cell}: cached tokens: {raw}"
    );
    assert_eq!(
        seen.output_tokens,
        expected_output_tokens(scenario),
        "{cell}: output usage: {raw}"
    );
    let want_text = match scenario {
        Scenario::Tool => TOOL_TEXT,
        Scenario::ToolOnly => "",
        _ => TEXT,
    };
    assert_eq!(seen.text, want_text, "{cell}: {raw}");

    if scenario == Scenario::Reasoning {
        assert_eq!(seen.reasoning, REASONING, "{cell}: reasoning: {raw}");
        // OpenAI-compatible providers count reasoning tokens; OpenAI clients are told.
        if up != Up::Messages && client != Client::Messages {
            assert_eq!(
                seen.reasoning_tokens,
                REASONING.split_whitespace().count() as u64,
                "{cell}: reasoning tokens: {raw}"
            );
        }
        // Anthropic's signature (Responses' `encrypted_content`) travels to the clients that
        // can carry it.
        if up != Up::Chat && client != Client::Chat {
            assert!(
                seen.signature.starts_with("mock-signature-"),
                "{cell}: signature {:?}: {raw}",
                seen.signature
            );
        }
    } else {
        assert!(seen.reasoning.is_empty(), "{cell}: {raw}");
    }

    if matches!(scenario, Scenario::Tool | Scenario::ToolOnly) {
        let want = answered_tools();
        assert_eq!(
            seen.tools.len(),
            want.len(),
            "{cell}: tool calls {:?}: {raw}",
            seen.tools
        );
        for ((id, name, args), (want_name, want_args)) in seen.tools.iter().zip(&want) {
            assert!(!id.is_empty(), "{cell}: a call id: {raw}");
            assert_eq!(name, want_name, "{cell}: {raw}");
            let got: Value = serde_json::from_str(args)
                .unwrap_or_else(|e| panic!("{cell}: arguments {args:?} are not JSON ({e}): {raw}"));
            assert_eq!(&got, want_args, "{cell}: {raw}");
        }
        assert_ne!(
            seen.tools[0].0, seen.tools[1].0,
            "{cell}: distinct call ids"
        );
    } else {
        assert!(seen.tools.is_empty(), "{cell}: {raw}");
    }
}

/// The JSON the structured-output cells' schema asks for, as the mock answers it.
const JSON_ANSWER: &str = r#"{"answer":"vier, ünïcode ✓"}"#;

/// Sluice with one provider of each upstream dialect, all on `mock`: OpenAI, Anthropic, the
/// Gemini API and Bedrock's Converse (signed by the environment's credentials).
fn every_dialect_config(mock: &Mock) -> String {
    let url = format!("http://{}", mock.addr);
    let health =
        "    health_check: {enabled: false}\n    health: {degraded_after_failures: 100000, unhealthy_after_failures: 100000}\n";
    format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\n  retry: {{max_attempts_per_route: 1}}\ntenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n  oa:\n    kind: openai\n    base_url: {url}/v1\n    api_key: sk-provider-secret-oa\n{health}  claude:\n    kind: anthropic\n    base_url: {url}/v1\n    api_key: sk-ant-provider-secret\n{health}  gem:\n    kind: gemini\n    base_url: {url}/v1beta\n    api_key: gemini-key\n{health}  br:\n    kind: bedrock\n    region: us-east-2\n    base_url: {url}\n    health: {{degraded_after_failures: 100000, unhealthy_after_failures: 100000}}\nmodels:\n  acme/gpt:\n    routes:\n      - {{provider: oa, upstream_model: gpt-mock-1}}\n  acme/claude:\n    default_max_tokens: 4096\n    routes:\n      - {{provider: claude, upstream_model: claude-mock-1}}\n  acme/gemini:\n    routes:\n      - {{provider: gem, upstream_model: gemini-2.5-flash}}\n  acme/nova:\n    routes:\n      - {{provider: br, upstream_model: \"{}\"}}\n",
        crate::bedrock_converse::NOVA
    )
}

/// One mock and a Sluice with [`every_dialect_config`] (the directory holds the AWS
/// credentials file).
fn every_dialect() -> (Mock, Sluice, crate::harness::TempDir) {
    let mock = Mock::start("{}");
    let dir = crate::harness::TempDir::new("every-dialect");
    let file = crate::bedrock::credentials_file(&dir);
    let env = crate::bedrock::env(&file);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let sluice = Sluice::start_with_env(&every_dialect_config(&mock), &env);
    (mock, sluice, dir)
}

/// A turn with the tool cells' call and result in its history and no tools (a summarising
/// or compaction turn, issue 28 item 5) reaches every provider from every client dialect;
/// Converse gets the `toolConfig` Bedrock requires for tool blocks (one spec per tool the
/// history calls), without which the mock answers Bedrock's 400.
#[test]
fn tool_history_without_tools_reaches_every_provider() {
    let (mock, sluice, _dir) = every_dialect();
    mock.set_behavior(&json!({"text": TEXT, "split": "mid_utf8"}).to_string());
    let mut failures = Vec::new();
    for client in [Client::Chat, Client::Messages, Client::Responses] {
        for model in ["acme/gpt", "acme/claude", "acme/gemini", "acme/nova"] {
            for stream in [false, true] {
                let cell = format!("{client:?}->{model} stream={stream}");
                mock.reset();
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let mut body = client.body(Scenario::Tool, model, stream);
                    let o = body.as_object_mut().expect("object");
                    o.remove("tools");
                    o.remove("tool_choice");
                    let (status, raw, seen) = run_cell(&sluice, client, &body, stream);
                    assert_eq!(status, 200, "{raw}");
                    assert_eq!(seen.text, TEXT, "{raw}");
                    let log = mock.log();
                    let rec = log.last().expect("an upstream request");
                    let sent: Value =
                        serde_json::from_str(rec["body"].as_str().expect("body copy"))
                            .expect("upstream JSON");
                    if model == "acme/nova" {
                        assert_eq!(
                            sent["toolConfig"],
                            json!({"tools": [{"toolSpec": {"name": "get_weather",
                                "inputSchema": {"json": {"type": "object", "properties": {}}}}}]}),
                            "{sent}"
                        );
                    }
                }));
                if let Err(e) = result {
                    let msg = crate::harness::panic_text(&*e).unwrap_or_default();
                    failures.push(format!("{cell}: {msg}"));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} cells failed:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// The schema of the structured-output cells.
fn answer_schema() -> Value {
    json!({"type": "object", "properties": {"answer": {"type": "string"}},
        "required": ["answer"], "additionalProperties": false})
}

/// A request for JSON matching [`answer_schema`], in the client's dialect: Chat's
/// `response_format`, Anthropic's `output_config.format`, Responses' `text.format`.
fn structured_body(client: Client, model: &str, stream: bool) -> Value {
    let schema = answer_schema();
    match client {
        Client::Chat => json!({"model": model, "stream": stream,
            "messages": [{"role": "user", "content": "2+2 in German?"}],
            "response_format": {"type": "json_schema",
                "json_schema": {"name": "answer", "schema": schema}}}),
        Client::Messages => json!({"model": model, "max_tokens": 200, "stream": stream,
            "messages": [{"role": "user", "content": "2+2 in German?"}],
            "output_config": {"format": {"type": "json_schema", "schema": schema}}}),
        Client::Responses => json!({"model": model, "stream": stream, "input": "2+2 in German?",
            "text": {"format": {"type": "json_schema", "name": "answer", "schema": schema}}}),
    }
}

/// The structured output the provider of `model` received, in its own member: `None` when
/// the body has none.
fn structured_sent(model: &str, sent: &Value) -> Option<Value> {
    let v = match model {
        "acme/gpt" => sent["response_format"]["json_schema"]["schema"].clone(),
        "acme/claude" => {
            let f = sent["output_config"].get("format")?;
            assert_eq!(f["type"], "json_schema", "{sent}");
            f["schema"].clone()
        }
        "acme/gemini" => {
            let g = &sent["generationConfig"];
            assert_eq!(g["responseMimeType"], "application/json", "{sent}");
            g["responseJsonSchema"].clone()
        }
        _ => {
            let f = sent.get("outputConfig")?.get("textFormat")?;
            assert_eq!(f["type"], "json_schema", "{sent}");
            // Bedrock takes the schema as a JSON string.
            f["structure"]["jsonSchema"]["schema"]
                .as_str()
                .map(|s| serde_json::from_str(s).expect("schema JSON"))
                .unwrap_or(Value::Null)
        }
    };
    (!v.is_null()).then_some(v)
}

/// Structured output crosses every direction (issue 28, item 6): each client dialect's
/// JSON Schema format reaches OpenAI, Anthropic, Gemini and Converse in the provider's own
/// member (the mock's request log shows it), streamed and not, and the JSON the model
/// writes comes back as the answer's text. JSON mode, which Anthropic and Converse lack,
/// goes without the format and the client is told in `x-sluice-dropped`.
#[test]
fn structured_output_reaches_every_provider_in_its_own_member() {
    let (mock, sluice, _dir) = every_dialect();
    mock.set_behavior(&json!({"text": JSON_ANSWER, "split": "mid_utf8"}).to_string());
    let mut failures = Vec::new();
    for client in [Client::Chat, Client::Messages, Client::Responses] {
        for model in ["acme/gpt", "acme/claude", "acme/gemini", "acme/nova"] {
            for stream in [false, true] {
                let cell = format!("{client:?}->{model} stream={stream}");
                mock.reset();
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let body = structured_body(client, model, stream);
                    let (status, raw, seen) = run_cell(&sluice, client, &body, stream);
                    assert_eq!(status, 200, "{raw}");
                    assert_eq!(seen.text, JSON_ANSWER, "{raw}");
                    let answer: Value = serde_json::from_str(&seen.text).expect("JSON text");
                    assert_eq!(answer["answer"], "vier, ünïcode ✓");
                    let log = mock.log();
                    let rec = log.last().expect("an upstream request");
                    let sent: Value =
                        serde_json::from_str(rec["body"].as_str().expect("body copy"))
                            .expect("upstream JSON");
                    assert_eq!(
                        structured_sent(model, &sent),
                        Some(answer_schema()),
                        "{sent}"
                    );
                }));
                if let Err(e) = result {
                    let msg = crate::harness::panic_text(&*e).unwrap_or_default();
                    failures.push(format!("{cell}: {msg}"));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} cells failed:\n{}",
        failures.len(),
        failures.join("\n\n")
    );

    // JSON mode toward Anthropic and Converse: answered without it, the drop named.
    for (client, body, field) in [
        (
            Client::Chat,
            json!({"messages": [{"role": "user", "content": "JSON please"}],
                "response_format": {"type": "json_object"}}),
            "response_format",
        ),
        (
            Client::Responses,
            json!({"input": "JSON please", "text": {"format": {"type": "json_object"}}}),
            "text.format",
        ),
    ] {
        for model in ["acme/claude", "acme/nova"] {
            mock.reset();
            let mut body = body.clone();
            body["model"] = model.into();
            let owned = client.headers();
            let headers: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let r = post_json(sluice.addr, client.path(), &headers, &body.to_string());
            assert_eq!(r.status, 200, "{client:?}->{model}: {}", r.text());
            assert_eq!(
                r.header("x-sluice-dropped"),
                Some(field),
                "{client:?}->{model}: {:?}",
                r.headers
            );
            let log = mock.log();
            let sent: Value =
                serde_json::from_str(log[0]["body"].as_str().expect("body")).expect("JSON");
            assert_eq!(structured_sent(model, &sent), None, "{sent}");
        }
    }
}
