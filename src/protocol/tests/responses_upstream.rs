//! OpenAI Responses as an upstream dialect: its stream and its whole answers read into every
//! other client dialect (reasoning with its `encrypted_content`, tool calls, usage with
//! cached and reasoning tokens, `response.incomplete`, `response.failed` and `error`), the
//! canonical request encoded for it, and the passthrough body's gateway-owned members.
//! Upstream bytes are hand-written in OpenAI's shape
//! (<https://platform.openai.com/docs/api-reference/responses-streaming>).

use serde_json::{json, Value};

use super::{seen, translate};
use crate::protocol::{
    decode_request, decode_response, dropped_toward, encode_request, merge_usage, ClientDialect,
    ModelPlacement, OutputItem, ProtocolError, StopReason, UpstreamDialect, UpstreamOptions, Usage,
};

const UP: UpstreamDialect = UpstreamDialect::Responses;

/// One SSE event of a Responses stream (name = type).
fn ev(ty: &str, mut data: Value) -> String {
    data["type"] = ty.into();
    format!("event: {ty}\ndata: {data}\n\n")
}

fn usage() -> Value {
    json!({"input_tokens": 40, "input_tokens_details": {"cached_tokens": 30},
        "output_tokens": 12, "output_tokens_details": {"reasoning_tokens": 5},
        "total_tokens": 52})
}

/// A stream with a reasoning item (two summary deltas, encrypted content), a text message
/// and a function call whose arguments come in two fragments; `last` ends it.
fn stream(last: &str) -> Vec<u8> {
    let snapshot = |status: &str, usage: Value| {
        json!({"id": "resp_abc", "object": "response", "created_at": 1, "status": status,
            "model": "gpt-5-2025-08-07", "output": [], "usage": usage})
    };
    let mut s = String::new();
    s += &ev(
        "response.created",
        json!({"response": snapshot("in_progress", Value::Null)}),
    );
    s += &ev(
        "response.in_progress",
        json!({"response": snapshot("in_progress", Value::Null)}),
    );
    s += &ev(
        "response.output_item.added",
        json!({"output_index": 0, "item": {"id": "rs_1", "type": "reasoning", "summary": []}}),
    );
    s += &ev(
        "response.reasoning_summary_part.added",
        json!({"item_id": "rs_1", "summary_index": 0}),
    );
    s += &ev(
        "response.reasoning_summary_text.delta",
        json!({"item_id": "rs_1", "delta": "Think "}),
    );
    s += &ev(
        "response.reasoning_summary_text.delta",
        json!({"item_id": "rs_1", "delta": "hard."}),
    );
    s += &ev(
        "response.output_item.done",
        json!({"output_index": 0, "item": {
        "id": "rs_1", "type": "reasoning", "encrypted_content": "gAAAA-enc",
        "summary": [{"type": "summary_text", "text": "Think hard."}]}}),
    );
    s += &ev(
        "response.output_item.added",
        json!({"output_index": 1, "item": {"id": "msg_1", "type": "message", "content": []}}),
    );
    s += &ev(
        "response.output_text.delta",
        json!({"item_id": "msg_1", "delta": "Hé"}),
    );
    s += &ev(
        "response.output_text.delta",
        json!({"item_id": "msg_1", "delta": "llo"}),
    );
    s += &ev("response.an_event_from_the_future", json!({"x": 1}));
    s += &ev(
        "response.output_item.added",
        json!({"output_index": 2, "item": {
        "id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "get_weather",
        "arguments": ""}}),
    );
    s += &ev(
        "response.function_call_arguments.delta",
        json!({"item_id": "fc_1", "delta": "{\"city\":"}),
    );
    s += &ev(
        "response.function_call_arguments.delta",
        json!({"item_id": "fc_1", "delta": "\"Paris\"}"}),
    );
    s += &ev(
        "response.output_item.done",
        json!({"output_index": 2, "item": {
        "id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "get_weather",
        "arguments": "{\"city\":\"Paris\"}"}}),
    );
    s += last;
    s.into_bytes()
}

fn completed() -> String {
    ev(
        "response.completed",
        json!({"response": {"id": "resp_abc", "status": "completed", "model": "gpt-5",
        "output": [{"type": "function_call", "call_id": "call_1", "name": "get_weather",
            "arguments": "{}"}], "usage": usage()}}),
    )
}

#[test]
fn a_responses_stream_reaches_chat_and_messages_clients_whole_at_every_split() {
    let wire = stream(&completed());
    for piece in [0, 1, 7] {
        let chat = seen(
            ClientDialect::ChatCompletions,
            &translate(UP, ClientDialect::ChatCompletions, &wire, piece, true),
        );
        assert_eq!(chat.text, "Héllo", "piece {piece}");
        assert_eq!(chat.reasoning, "Think hard.");
        assert_eq!(
            chat.tools,
            [(
                "call_1".to_string(),
                "get_weather".to_string(),
                "{\"city\":\"Paris\"}".to_string()
            )]
        );
        assert_eq!(chat.stop, "tool_calls");
        assert_eq!(chat.usage, (40, 12, 30));
        assert_eq!(chat.model, super::STANDARD);

        let msgs = seen(
            ClientDialect::Messages,
            &translate(UP, ClientDialect::Messages, &wire, piece, true),
        );
        assert_eq!(msgs.reasoning, "Think hard.");
        assert_eq!(
            msgs.signature, "gAAAA-enc",
            "encrypted_content is the signature"
        );
        assert_eq!(msgs.text, "Héllo");
        assert_eq!(msgs.tools.len(), 1);
        assert_eq!(msgs.stop, "tool_use");
        // Anthropic's input_tokens leave the cache reads out.
        assert_eq!(msgs.usage, (10, 12, 30));
    }
}

#[test]
fn an_incomplete_stream_is_a_length_stop_and_failures_are_in_band_errors() {
    let incomplete = ev(
        "response.incomplete",
        json!({"response": {"status": "incomplete",
        "incomplete_details": {"reason": "max_output_tokens"}, "output": [], "usage": usage()}}),
    );
    // No tool call in this one: only text.
    let wire = {
        let full = String::from_utf8(stream("")).unwrap();
        let cut = full.find("event: response.output_item.added\ndata: {\"item\":{\"arguments\"");
        let mut s = full[..cut.unwrap_or(full.len())].to_string();
        s += &incomplete;
        s.into_bytes()
    };
    let chat = seen(
        ClientDialect::ChatCompletions,
        &translate(UP, ClientDialect::ChatCompletions, &wire, 0, true),
    );
    assert_eq!(chat.stop, "length");
    assert_eq!(chat.usage, (40, 12, 30));

    let failed = ev(
        "response.failed",
        json!({"response": {"status": "failed",
        "error": {"code": "server_error", "message": "The model broke."}}}),
    );
    let msgs = seen(
        ClientDialect::Messages,
        &translate(UP, ClientDialect::Messages, &stream(&failed), 0, true),
    );
    assert_eq!(msgs.error.as_deref(), Some("api_error"));
    let error = ev(
        "error",
        json!({"code": "rate_limit_error", "message": "slow", "param": null}),
    );
    let chat = seen(
        ClientDialect::ChatCompletions,
        &translate(UP, ClientDialect::ChatCompletions, &stream(&error), 0, true),
    );
    assert_eq!(chat.error.as_deref(), Some("rate_limit_error"));
}

#[test]
fn a_whole_answer_decodes_with_reasoning_calls_usage_and_its_status() {
    let body = json!({"id": "resp_1", "object": "response", "created_at": 7,
        "status": "completed", "model": "gpt-5", "output": [
            {"id": "rs_1", "type": "reasoning", "encrypted_content": "enc-1",
             "summary": [{"type": "summary_text", "text": "a"}, {"type": "summary_text", "text": "b"}]},
            {"id": "msg_1", "type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "Hi", "annotations": []}]},
            {"id": "ws_1", "type": "web_search_call", "status": "completed"},
            {"id": "fc_1", "type": "function_call", "call_id": "call_9", "name": "spawn",
             "namespace": "agents", "arguments": ""}],
        "usage": usage()});
    let r = decode_response(UP, body.to_string().as_bytes(), 99).unwrap();
    assert_eq!(r.created, 7);
    assert_eq!(
        r.output,
        [
            OutputItem::Reasoning {
                text: "a\n\nb".into(),
                signature: Some("enc-1".into())
            },
            OutputItem::Text("Hi".into()),
            OutputItem::ToolCall(crate::protocol::ToolCall {
                id: "call_9".into(),
                name: "agents__spawn".into(),
                arguments: "{}".into()
            }),
        ]
    );
    assert_eq!(r.stop_reason, StopReason::ToolUse);
    assert_eq!(
        r.usage,
        Usage {
            input_tokens: 40,
            output_tokens: 12,
            cache_read_tokens: 30,
            cache_write_tokens: 0,
            reasoning_tokens: 5
        }
    );
    let incomplete = json!({"id": "resp_2", "status": "incomplete", "model": "m",
        "incomplete_details": {"reason": "content_filter"}, "output": []});
    let r = decode_response(UP, incomplete.to_string().as_bytes(), 1).unwrap();
    assert_eq!(r.stop_reason, StopReason::ContentFilter);
    let error = json!({"error": {"message": "bad key", "type": "invalid_request_error"}});
    assert!(matches!(
        decode_response(UP, error.to_string().as_bytes(), 1),
        Err(ProtocolError::Upstream { .. })
    ));
    let mut u = Usage::default();
    assert!(merge_usage(UP, usage().to_string().as_bytes(), &mut u));
    assert_eq!((u.cache_read_tokens, u.reasoning_tokens), (30, 5));
}

fn opts() -> UpstreamOptions<'static> {
    UpstreamOptions {
        model: "gpt-5",
        default_max_tokens: 4096,
        stream_usage: true,
        placement: ModelPlacement::Body,
        thinking: None,
    }
}

#[test]
fn a_messages_history_with_signed_thinking_and_tools_becomes_responses_items() {
    let body = json!({"model": "m", "max_tokens": 100, "stream": true,
        "system": "Be brief.", "stop_sequences": ["END"],
        "thinking": {"type": "enabled", "budget_tokens": 8000},
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Use the tool.", "signature": "gAAAA-turn1"},
                {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "18°C"}]}]});
    let req = decode_request(ClientDialect::Messages, body.to_string().as_bytes()).unwrap();
    let got: Value = serde_json::from_slice(&encode_request(UP, &req, &opts()).unwrap()).unwrap();
    assert_eq!(
        got,
        json!({"model": "gpt-5", "instructions": "Be brief.", "input": [
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
            {"type": "reasoning", "encrypted_content": "gAAAA-turn1",
             "summary": [{"type": "summary_text", "text": "Use the tool."}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather",
             "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "18°C"}],
            "tools": [{"type": "function", "name": "get_weather",
                "parameters": {"type": "object"}, "strict": false}],
            "max_output_tokens": 100, "reasoning": {"effort": "medium"},
            "include": ["reasoning.encrypted_content"], "store": false, "stream": true})
    );
    let dropped: Vec<String> = dropped_toward(UP, &req, &opts())
        .into_iter()
        .map(|d| d.field)
        .collect();
    assert_eq!(dropped, ["stop_sequences"]);
}

#[test]
fn a_forwarded_responses_body_changes_only_what_the_gateway_owns() {
    let body = json!({"model": "acme/m", "input": "hi", "previous_response_id": "resp_old",
        "store": true, "include": ["message.output_text.logprobs"], "provider": {"only": ["p"]},
        "prompt_cache_key": "k", "a_member_from_the_future": {"x": [1]}});
    let fwd = crate::protocol::responses::upstream::FAST_PATH.forwarding;
    let out = crate::providers::passthrough_body_forwarded(
        body.as_object().unwrap(),
        "gpt-5",
        false,
        ModelPlacement::Body,
        fwd,
    )
    .unwrap();
    let got: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        got,
        json!({"model": "gpt-5", "input": "hi", "store": false,
            "include": ["message.output_text.logprobs", "reasoning.encrypted_content"],
            "prompt_cache_key": "k", "a_member_from_the_future": {"x": [1]}})
    );
    // A body without `include` or `store` gets both.
    let bare = json!({"model": "acme/m", "input": "hi"});
    let out = crate::providers::passthrough_body_forwarded(
        bare.as_object().unwrap(),
        "gpt-5",
        false,
        ModelPlacement::Body,
        fwd,
    )
    .unwrap();
    let got: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(got["store"], false);
    assert_eq!(got["include"], json!(["reasoning.encrypted_content"]));
}
