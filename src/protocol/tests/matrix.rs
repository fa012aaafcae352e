//! The translation matrix: {chat, messages, responses} client ×
//! {chat, messages} upstream × {stream, non-stream} × {text, tool call,
//! image input, reasoning, upstream error}. Same-dialect pairs are not
//! translated (the proxy's fast path) and are skipped.

use serde_json::{json, Value};

use super::fixtures::{
    chat_body, chat_stream, messages_body, messages_stream, Scenario, ALL, TEXT,
};
use super::{seen, translate, Seen, STANDARD};
use crate::protocol::{
    decode_request, decode_response, encode_request, encode_response, error_body, ClientDialect,
    ProtocolError, UpstreamDialect, UpstreamOptions,
};

const CLIENTS: [ClientDialect; 3] = [
    ClientDialect::ChatCompletions,
    ClientDialect::Messages,
    ClientDialect::Responses,
];
const UPSTREAMS: [UpstreamDialect; 2] =
    [UpstreamDialect::ChatCompletions, UpstreamDialect::Messages];

fn upstream_stream(up: UpstreamDialect, s: Scenario) -> String {
    match up {
        UpstreamDialect::ChatCompletions => chat_stream(s),
        _ => messages_stream(s),
    }
}

fn upstream_body(up: UpstreamDialect, s: Scenario) -> String {
    match up {
        UpstreamDialect::ChatCompletions => chat_body(s),
        _ => messages_body(s),
    }
}

/// What the client must see, in its own dialect's words (hand-written).
fn expected(client: ClientDialect, up: UpstreamDialect, s: Scenario) -> Seen {
    use ClientDialect::*;
    let stop = |chat: &str, messages: &str, responses: &str| match client {
        ChatCompletions => chat.to_owned(),
        Messages => messages.to_owned(),
        Responses => responses.to_owned(),
    };
    let usage = match client {
        Messages => (20, 12, 10),
        _ => (30, 12, 10),
    };
    let mut e = Seen {
        model: STANDARD.into(),
        usage,
        ..Seen::default()
    };
    match s {
        Scenario::Text | Scenario::Image => {
            e.text = TEXT.into();
            e.stop = stop("stop", "end_turn", "completed");
        }
        Scenario::Tool => {
            e.text = "Let me check.".into();
            e.tools = vec![
                (
                    "call_1".into(),
                    "get_weather".into(),
                    r#"{"city":"Paris"}"#.into(),
                ),
                ("call_2".into(), "get_time".into(), r#"{"tz":"CET"}"#.into()),
            ];
            e.stop = stop("tool_calls", "tool_use", "completed");
        }
        Scenario::Reasoning => {
            e.text = "2".into();
            e.reasoning = "Think 1+1.".into();
            e.stop = stop("stop", "end_turn", "completed");
            if up == UpstreamDialect::Messages && client == Responses {
                e.signature = "sig-abc".into();
            }
        }
        Scenario::Error => {
            e.text = "Hel".into();
            e.error = Some("overloaded_error".into());
            e.usage = (0, 0, 0);
            e.stop = match client {
                Responses => "failed".into(),
                _ => String::new(),
            };
        }
    }
    e
}

/// Tool arguments compared as JSON values (whitespace may differ).
fn normalize(mut s: Seen) -> Seen {
    for t in &mut s.tools {
        let v: Value = serde_json::from_str(&t.2).unwrap();
        t.2 = v.to_string();
    }
    s
}

#[test]
fn stream_matrix() {
    for client in CLIENTS {
        for up in UPSTREAMS {
            if client.same_as(up) {
                continue;
            }
            for s in ALL {
                let wire = upstream_stream(up, s);
                for piece in [0, 1, 7] {
                    let out = translate(up, client, wire.as_bytes(), piece, true);
                    let mut got = normalize(seen(client, &out));
                    if s == Scenario::Error {
                        got.usage = (0, 0, 0);
                        got.model = STANDARD.into();
                    }
                    let want = normalize(expected(client, up, s));
                    assert_eq!(got, want, "{client:?} <- {up:?} {s:?} piece {piece}");
                }
            }
        }
    }
}

/// Reassembles a non-stream client body (hand-parsed per dialect).
fn seen_body(client: ClientDialect, body: &[u8]) -> Seen {
    let v: Value = serde_json::from_slice(body).unwrap();
    let mut s = Seen::default();
    match client {
        ClientDialect::ChatCompletions => {
            if let Some(e) = v.get("error") {
                s.error = Some(e["type"].as_str().unwrap().into());
                return s;
            }
            assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
            s.model = v["model"].as_str().unwrap().into();
            let m = &v["choices"][0]["message"];
            s.text = m["content"].as_str().unwrap_or("").into();
            s.reasoning = m["reasoning_content"].as_str().unwrap_or("").into();
            for t in m["tool_calls"].as_array().into_iter().flatten() {
                s.tools.push((
                    t["id"].as_str().unwrap().into(),
                    t["function"]["name"].as_str().unwrap().into(),
                    t["function"]["arguments"].as_str().unwrap().into(),
                ));
            }
            s.stop = v["choices"][0]["finish_reason"].as_str().unwrap().into();
            let u = &v["usage"];
            s.usage = (
                u["prompt_tokens"].as_u64().unwrap(),
                u["completion_tokens"].as_u64().unwrap(),
                u["prompt_tokens_details"]["cached_tokens"]
                    .as_u64()
                    .unwrap(),
            );
        }
        ClientDialect::Messages => {
            if v["type"] == "error" {
                s.error = Some(v["error"]["type"].as_str().unwrap().into());
                return s;
            }
            assert!(v["id"].as_str().unwrap().starts_with("msg_"));
            s.model = v["model"].as_str().unwrap().into();
            for b in v["content"].as_array().unwrap() {
                match b["type"].as_str().unwrap() {
                    "text" => s.text.push_str(b["text"].as_str().unwrap()),
                    "thinking" => {
                        s.reasoning.push_str(b["thinking"].as_str().unwrap());
                        s.signature.push_str(b["signature"].as_str().unwrap());
                    }
                    "tool_use" => s.tools.push((
                        b["id"].as_str().unwrap().into(),
                        b["name"].as_str().unwrap().into(),
                        b["input"].to_string(),
                    )),
                    other => panic!("block {other}"),
                }
            }
            s.stop = v["stop_reason"].as_str().unwrap().into();
            let u = &v["usage"];
            s.usage = (
                u["input_tokens"].as_u64().unwrap(),
                u["output_tokens"].as_u64().unwrap(),
                u["cache_read_input_tokens"].as_u64().unwrap(),
            );
        }
        ClientDialect::Responses => {
            if let Some(e) = v.get("error").filter(|e| !e.is_null()) {
                s.error = Some(e["type"].as_str().unwrap().into());
                return s;
            }
            assert!(v["id"].as_str().unwrap().starts_with("resp_"));
            assert_eq!(v["object"], "response");
            s.model = v["model"].as_str().unwrap().into();
            for it in v["output"].as_array().unwrap() {
                match it["type"].as_str().unwrap() {
                    "message" => s.text.push_str(it["content"][0]["text"].as_str().unwrap()),
                    "reasoning" => {
                        for p in it["summary"].as_array().unwrap() {
                            s.reasoning.push_str(p["text"].as_str().unwrap());
                        }
                        if let Some(sig) = it["encrypted_content"].as_str() {
                            s.signature.push_str(sig);
                        }
                    }
                    "function_call" => s.tools.push((
                        it["call_id"].as_str().unwrap().into(),
                        it["name"].as_str().unwrap().into(),
                        it["arguments"].as_str().unwrap().into(),
                    )),
                    other => panic!("item {other}"),
                }
            }
            s.stop = v["status"].as_str().unwrap().into();
            let u = &v["usage"];
            s.usage = (
                u["input_tokens"].as_u64().unwrap(),
                u["output_tokens"].as_u64().unwrap(),
                u["input_tokens_details"]["cached_tokens"].as_u64().unwrap(),
            );
        }
    }
    s
}

#[test]
fn non_stream_matrix() {
    for client in CLIENTS {
        for up in UPSTREAMS {
            if client.same_as(up) {
                continue;
            }
            for s in ALL {
                let body = upstream_body(up, s);
                let out = match decode_response(up, body.as_bytes(), 1_700_000_000) {
                    Ok(mut r) => {
                        r.model = STANDARD.into();
                        encode_response(client, &r)
                    }
                    Err(e @ ProtocolError::Upstream { .. }) => {
                        error_body(client, e.status(), &e.to_string(), None, None)
                    }
                    Err(e) => panic!("{e}"),
                };
                let got = normalize(seen_body(client, &out));
                let mut want = normalize(expected(client, up, s));
                if s == Scenario::Error {
                    want = Seen {
                        error: Some("overloaded_error".into()),
                        ..Seen::default()
                    };
                }
                assert_eq!(got, want, "{client:?} <- {up:?} {s:?}");
            }
        }
    }
}

/// Client request of the scenario in the client's dialect (hand-written).
fn client_request(client: ClientDialect, s: Scenario) -> Value {
    let img_url = "https://example.com/cat.png";
    match (client, s) {
        (ClientDialect::ChatCompletions, Scenario::Image) => json!({"model": "m", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What is it?"},
             {"type": "image_url", "image_url": {"url": img_url}},
             {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0K"}}]}]}),
        (ClientDialect::ChatCompletions, Scenario::Tool) => json!({"model": "m", "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
            "tool_choice": "required"}),
        (ClientDialect::ChatCompletions, Scenario::Reasoning) => {
            json!({"model": "m", "reasoning_effort": "high", "max_completion_tokens": 32000,
                   "messages": [{"role": "user", "content": "1+1?"}]})
        }
        (ClientDialect::ChatCompletions, _) => {
            json!({"model": "m", "messages": [{"role": "user", "content": "Hi"}]})
        }
        (ClientDialect::Messages, Scenario::Image) => {
            json!({"model": "m", "max_tokens": 100, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What is it?"},
             {"type": "image", "source": {"type": "url", "url": img_url}},
             {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0K"}}]}]})
        }
        (ClientDialect::Messages, Scenario::Tool) => {
            json!({"model": "m", "max_tokens": 100, "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"}]}],
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any"}})
        }
        (ClientDialect::Messages, Scenario::Reasoning) => json!({"model": "m", "max_tokens": 32000,
            "thinking": {"type": "enabled", "budget_tokens": 24576},
            "messages": [{"role": "user", "content": "1+1?"}]}),
        (ClientDialect::Messages, _) => {
            json!({"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "Hi"}]})
        }
        (ClientDialect::Responses, Scenario::Image) => json!({"model": "m", "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "What is it?"},
             {"type": "input_image", "image_url": img_url},
             {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0K"}]}]}),
        (ClientDialect::Responses, Scenario::Tool) => json!({"model": "m", "input": [
            {"role": "user", "content": "Weather?"},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}],
            "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
            "tool_choice": "required"}),
        (ClientDialect::Responses, Scenario::Reasoning) => {
            json!({"model": "m", "max_output_tokens": 32000,
            "reasoning": {"effort": "high"}, "input": "1+1?"})
        }
        (ClientDialect::Responses, _) => json!({"model": "m", "input": "Hi"}),
    }
}

/// The upstream request the scenario must produce (hand-written).
fn expected_upstream(up: UpstreamDialect, s: Scenario, client: ClientDialect) -> Value {
    let img_url = "https://example.com/cat.png";
    let max = if client == ClientDialect::Messages {
        100
    } else {
        4096
    };
    match (up, s) {
        (UpstreamDialect::ChatCompletions, Scenario::Image) => json!({"model": "up", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What is it?"},
             {"type": "image_url", "image_url": {"url": img_url}},
             {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0K"}}]}],
             "max_completion_tokens": 100}),
        (UpstreamDialect::ChatCompletions, Scenario::Tool) => json!({"model": "up", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
            "tool_choice": "required", "max_completion_tokens": 100}),
        (UpstreamDialect::ChatCompletions, Scenario::Reasoning) => json!({"model": "up",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "1+1?"}]}],
            "max_completion_tokens": 32000, "reasoning_effort": "high"}),
        (UpstreamDialect::ChatCompletions, _) => json!({"model": "up",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
            "max_completion_tokens": 100}),
        (_, Scenario::Image) => json!({"model": "up", "max_tokens": max, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What is it?"},
             {"type": "image", "source": {"type": "url", "url": img_url}},
             {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0K"}}]}]}),
        (_, Scenario::Tool) => json!({"model": "up", "max_tokens": max, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"}]}],
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any"}}),
        (_, Scenario::Reasoning) => json!({"model": "up", "max_tokens": 32000,
            "thinking": {"type": "adaptive"}, "output_config": {"effort": "high"},
            "messages": [{"role": "user", "content": [{"type": "text", "text": "1+1?"}]}]}),
        (_, _) => json!({"model": "up", "max_tokens": max,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}),
    }
}

#[test]
fn request_matrix() {
    for client in CLIENTS {
        for up in UPSTREAMS {
            if client.same_as(up) {
                continue;
            }
            for s in ALL {
                let body = client_request(client, s).to_string();
                let req = decode_request(client, body.as_bytes()).unwrap();
                let opts = UpstreamOptions {
                    model: "up",
                    default_max_tokens: 4096,
                    stream_usage: true,
                    placement: crate::protocol::ModelPlacement::Body,
                    thinking: None,
                };
                let out = encode_request(up, &req, &opts).unwrap();
                let got: Value = serde_json::from_slice(&out).unwrap();
                let mut want = expected_upstream(up, s, client);
                // Only a Messages client sends max_tokens (100) in the plain cells.
                if up == UpstreamDialect::ChatCompletions
                    && client != ClientDialect::Messages
                    && s != Scenario::Reasoning
                {
                    want.as_object_mut()
                        .unwrap()
                        .remove("max_completion_tokens");
                }
                assert_eq!(got, want, "{client:?} -> {up:?} {s:?}");
            }
        }
    }
}

/// Every upstream dialect, for the cells that reach them all.
const ALL_UPSTREAMS: [UpstreamDialect; 5] = [
    UpstreamDialect::ChatCompletions,
    UpstreamDialect::Messages,
    UpstreamDialect::Gemini,
    UpstreamDialect::Converse,
    UpstreamDialect::Responses,
];

fn cell_opts() -> UpstreamOptions<'static> {
    UpstreamOptions {
        model: "up",
        default_max_tokens: 4096,
        stream_usage: true,
        placement: crate::protocol::ModelPlacement::Body,
        thinking: None,
    }
}

/// The schema of the structured-output cells.
fn answer_schema() -> Value {
    json!({"type": "object", "properties": {"answer": {"type": "string"}},
        "required": ["answer"], "additionalProperties": false})
}

/// A request for JSON matching [`answer_schema`], in the client's dialect (hand-written).
fn structured_request(client: ClientDialect) -> Value {
    let schema = answer_schema();
    match client {
        ClientDialect::ChatCompletions => json!({"model": "m",
            "messages": [{"role": "user", "content": "Q"}],
            "response_format": {"type": "json_schema",
                "json_schema": {"name": "answer", "schema": schema}}}),
        ClientDialect::Messages => json!({"model": "m", "max_tokens": 100,
            "messages": [{"role": "user", "content": "Q"}],
            "output_config": {"format": {"type": "json_schema", "schema": schema}}}),
        ClientDialect::Responses => json!({"model": "m", "input": "Q",
            "text": {"format": {"type": "json_schema", "name": "answer", "schema": schema}}}),
    }
}

/// Where the upstream dialect carries the structured output, and how (hand-written): the
/// member and its value. Anthropic names no schema: a Messages client's gets `output`.
fn structured_upstream(up: UpstreamDialect, client: ClientDialect) -> (&'static str, Value) {
    let schema = answer_schema();
    let name = if client == ClientDialect::Messages {
        "output"
    } else {
        "answer"
    };
    match up {
        UpstreamDialect::ChatCompletions => (
            "response_format",
            json!({"type": "json_schema", "json_schema": {"name": name, "schema": schema}}),
        ),
        UpstreamDialect::Messages => (
            "output_config",
            json!({"format": {"type": "json_schema", "schema": schema}}),
        ),
        UpstreamDialect::Gemini => (
            "generationConfig",
            json!({"responseMimeType": "application/json", "responseJsonSchema": schema}),
        ),
        UpstreamDialect::Converse => (
            "outputConfig",
            json!({"textFormat": {"type": "json_schema", "structure": {"jsonSchema": {
                "schema": schema.to_string(), "name": name}}}}),
        ),
        UpstreamDialect::Responses => (
            "text",
            json!({"format": {"type": "json_schema", "name": name, "schema": schema}}),
        ),
    }
}

#[test]
fn structured_output_request_matrix() {
    for client in CLIENTS {
        for up in ALL_UPSTREAMS {
            if client.same_as(up) {
                continue;
            }
            let body = structured_request(client).to_string();
            let req = decode_request(client, body.as_bytes()).unwrap();
            let opts = cell_opts();
            assert!(
                crate::protocol::dropped_toward(up, &req, &opts).is_empty(),
                "{client:?} -> {up:?}: nothing dropped"
            );
            let mut got: Value =
                serde_json::from_slice(&encode_request(up, &req, &opts).unwrap()).unwrap();
            if let Some(g) = got["generationConfig"].as_object_mut() {
                // A Messages client's `max_tokens` shares Gemini's generationConfig.
                g.remove("maxOutputTokens");
            }
            let (member, want) = structured_upstream(up, client);
            assert_eq!(got[member], want, "{client:?} -> {up:?}: {got}");
        }
    }
}

/// An answer whose text is the JSON the schema asked for, in the upstream's dialect.
fn json_answer(up: UpstreamDialect, text: &str) -> String {
    let t = Value::from(text);
    match up {
        UpstreamDialect::ChatCompletions => json!({"id": "chatcmpl-1", "object": "chat.completion",
            "created": 1, "model": "up", "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": t}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}),
        UpstreamDialect::Messages => json!({"id": "msg_1", "type": "message",
            "role": "assistant", "model": "up", "content": [{"type": "text", "text": t}],
            "stop_reason": "end_turn", "stop_sequence": null,
            "usage": {"input_tokens": 3, "output_tokens": 4}}),
        UpstreamDialect::Gemini => json!({"candidates": [{"content": {"role": "model",
            "parts": [{"text": t}]}, "finishReason": "STOP"}],
            "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 4,
                "totalTokenCount": 7}, "modelVersion": "up"}),
        UpstreamDialect::Converse => json!({"output": {"message": {"role": "assistant",
            "content": [{"text": t}]}}, "stopReason": "end_turn",
            "usage": {"inputTokens": 3, "outputTokens": 4, "totalTokens": 7}}),
        UpstreamDialect::Responses => json!({"id": "resp_1", "object": "response",
            "created_at": 1, "status": "completed", "model": "up", "output": [{"id": "msg_1",
            "type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": t, "annotations": []}]}],
            "usage": {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7}}),
    }
    .to_string()
}

#[test]
fn structured_output_answer_matrix() {
    let text = r#"{"answer":"4"}"#;
    for client in CLIENTS {
        for up in ALL_UPSTREAMS {
            if client.same_as(up) {
                continue;
            }
            let mut r = decode_response(up, json_answer(up, text).as_bytes(), 1).unwrap();
            r.model = STANDARD.into();
            let got = seen_body(client, &encode_response(client, &r));
            assert_eq!(got.text, text, "{client:?} <- {up:?}");
            assert!(got.tools.is_empty(), "{client:?} <- {up:?}");
        }
    }
}

/// A turn with a tool call and its result in the history and no tools (a summarising or
/// compaction turn), in the client's dialect; with `none`, the tools and `tool_choice:
/// none` besides.
fn tool_history_request(client: ClientDialect, none: bool) -> Value {
    let mut b = match client {
        ClientDialect::ChatCompletions => json!({"model": "m", "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "user", "content": "Summarise."}]}),
        ClientDialect::Messages => json!({"model": "m", "max_tokens": 100, "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"},
                {"type": "text", "text": "Summarise."}]}]}),
        ClientDialect::Responses => json!({"model": "m", "input": [
            {"role": "user", "content": "Weather?"},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"role": "user", "content": "Summarise."}]}),
    };
    if none {
        let (tools, choice) = match client {
            ClientDialect::ChatCompletions => (
                json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
                       {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]),
                json!("none"),
            ),
            ClientDialect::Messages => (
                json!([{"name": "get_weather", "input_schema": {"type": "object"}},
                       {"name": "get_time", "input_schema": {"type": "object"}}]),
                json!({"type": "none"}),
            ),
            ClientDialect::Responses => (
                json!([{"type": "function", "name": "get_weather", "parameters": {"type": "object"}},
                       {"type": "function", "name": "get_time", "parameters": {"type": "object"}}]),
                json!("none"),
            ),
        };
        b["tools"] = tools;
        b["tool_choice"] = choice;
    }
    b
}

#[test]
fn converse_tool_history_matrix() {
    for client in CLIENTS {
        for none in [false, true] {
            let body = tool_history_request(client, none).to_string();
            let req = decode_request(client, body.as_bytes()).unwrap();
            let opts = cell_opts();
            let got: Value = serde_json::from_slice(
                &encode_request(UpstreamDialect::Converse, &req, &opts).unwrap(),
            )
            .unwrap();
            // The client's schema where it gave the tool, else a permissive one; only the
            // tools the history calls, never a toolChoice.
            let schema = if none {
                json!({"type": "object"})
            } else {
                json!({"type": "object", "properties": {}})
            };
            assert_eq!(
                got["toolConfig"],
                json!({"tools": [{"toolSpec": {"name": "get_weather",
                    "inputSchema": {"json": schema}}}]}),
                "{client:?} none={none}: {got}"
            );
            assert_eq!(
                got["messages"][1]["content"][0]["toolUse"]["name"], "get_weather",
                "{client:?}: {got}"
            );
            let dropped: Vec<String> =
                crate::protocol::dropped_toward(UpstreamDialect::Converse, &req, &opts)
                    .into_iter()
                    .map(|d| d.field)
                    .collect();
            let want: &[&str] = if none { &["tool_choice"] } else { &[] };
            assert_eq!(dropped, want, "{client:?} none={none}");
        }
    }
}
