//! OpenAI Responses as the mock speaks it (`POST {prefix}/responses`, and Azure OpenAI's
//! `POST /openai/v1/responses`): the whole answer
//! (<https://platform.openai.com/docs/api-reference/responses/object>) and the stream's
//! events (<https://platform.openai.com/docs/api-reference/responses-streaming>), byte for
//! byte in OpenAI's shape: `response.created`, `response.in_progress`, per output item
//! `response.output_item.added`, its parts and deltas and `response.output_item.done`,
//! then `response.completed` (or `response.incomplete` for a `length` finish) with the
//! usage, cached and reasoning tokens included. Reasoning comes as a `reasoning` item with
//! a summary and `encrypted_content` (the `signature` knob), tool calls as `function_call`
//! items; a failure mid-stream is `response.failed`. The side endpoints answer too:
//! `POST {prefix}/responses/input_tokens` (<https://platform.openai.com/docs/api-reference/responses/input-tokens>)
//! with the `prompt_tokens` knob (else the request's estimate), and
//! `POST {prefix}/responses/compact` (<https://platform.openai.com/docs/api-reference/responses/compact>)
//! with one `compaction` item.

use serde_json::{json, Value};

use super::wire::ReplyMeta;

/// What one stream event is to the stream writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Before any content (`response.created`, `response.in_progress`).
    Prelude,
    /// A content token (a delta, or a tool call's start).
    Token,
    /// Bookkeeping between tokens (item and part starts and ends).
    Other,
}

/// One event: its name (also its `type`), its data, its role.
pub(crate) type Event = (&'static str, String, Role);

/// The item ids of an answer.
fn ids(m: &ReplyMeta) -> (String, String) {
    let bare = m.id.trim_start_matches("resp_");
    (format!("rs_{bare}"), format!("msg_{bare}"))
}

/// `status` and `incomplete_details` of a finish reason.
fn status(m: &ReplyMeta) -> (&'static str, Value) {
    match m.finish_reason.as_str() {
        "length" | "max_output_tokens" => ("incomplete", json!({"reason": "max_output_tokens"})),
        "content_filter" => ("incomplete", json!({"reason": "content_filter"})),
        _ => ("completed", Value::Null),
    }
}

/// The `usage` object: `output_tokens` counts the content tokens, reasoning included.
fn usage(m: &ReplyMeta, output_tokens: u64) -> Value {
    let reasoning = m.extras.reasoning.len() as u64;
    json!({
        "input_tokens": m.prompt_tokens,
        "input_tokens_details": {"cached_tokens": m.cached_tokens.unwrap_or(0)},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": m.prompt_tokens + output_tokens
    })
}

/// The output items of the answer, as `response.output_item.done` gives them.
fn output(m: &ReplyMeta, text: &str) -> Vec<Value> {
    let (rs, msg) = ids(m);
    let x = &m.extras;
    let mut out = Vec::new();
    if !x.reasoning.is_empty() {
        out.push(json!({
            "id": rs, "type": "reasoning", "encrypted_content": x.signature,
            "summary": [{"type": "summary_text", "text": x.reasoning.concat()}]
        }));
    }
    if !text.is_empty() || x.tool_calls.is_empty() {
        out.push(json!({
            "id": msg, "type": "message", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": text}]
        }));
    }
    for c in &x.tool_calls {
        out.push(json!({
            "id": format!("fc_{}", c.id), "type": "function_call", "status": "completed",
            "arguments": c.arguments, "call_id": c.id, "name": c.name
        }));
    }
    out
}

/// The response object as OpenAI writes it today (every member of its reference, the
/// request's settings at their defaults): `status` as given, `output` and `usage` when
/// final, `completed_at` once completed.
fn snapshot(
    m: &ReplyMeta,
    status: &str,
    output: Vec<Value>,
    usage: Value,
    incomplete: Value,
) -> Value {
    let completed_at = if status == "completed" {
        json!(m.created)
    } else {
        Value::Null
    };
    json!({
        "id": m.id, "object": "response", "created_at": m.created, "status": status,
        "completed_at": completed_at, "presence_penalty": 0.0, "frequency_penalty": 0.0,
        "safety_identifier": null, "prompt_cache_key": null, "prompt_cache_retention": null,
        "billing": {"payer": "developer"}, "background": false, "error": null, "incomplete_details": incomplete,
        "instructions": null, "max_output_tokens": null, "max_tool_calls": null,
        "model": m.model, "output": output, "parallel_tool_calls": true,
        "previous_response_id": null, "reasoning": {"effort": null, "summary": null},
        "service_tier": "default", "store": false, "temperature": 1.0,
        "text": {"format": {"type": "text"}, "verbosity": "medium"}, "tool_choice": "auto",
        "tools": [], "top_logprobs": 0, "top_p": 1.0, "truncation": "disabled",
        "usage": usage, "user": null, "metadata": {}
    })
}

/// The whole (non-stream) answer with `text` and `n` content tokens.
pub(crate) fn answer(m: &ReplyMeta, text: &str, n: u64) -> String {
    let (st, incomplete) = status(m);
    snapshot(m, st, output(m, text), usage(m, n), incomplete).to_string()
}

/// The events of a streamed answer made of `text` tokens, in order, each with its
/// `sequence_number`; the last one is the final `response.completed` (or
/// `response.incomplete`).
#[expect(
    clippy::too_many_lines,
    reason = "one answer's events in the order OpenAI sends them"
)]
pub(crate) fn events(m: &ReplyMeta, text: &[String]) -> Vec<Event> {
    let mut seq = 0u64;
    let mut evs: Vec<Event> = Vec::new();
    let mut push = |name: &'static str, mut v: Value, role: Role| {
        if let Value::Object(o) = &mut v {
            o.insert("type".into(), name.into());
            o.insert("sequence_number".into(), seq.into());
        }
        seq += 1;
        evs.push((name, v.to_string(), role));
    };
    let in_progress = || snapshot(m, "in_progress", Vec::new(), Value::Null, Value::Null);
    push(
        "response.created",
        json!({"response": in_progress()}),
        Role::Prelude,
    );
    push(
        "response.in_progress",
        json!({"response": in_progress()}),
        Role::Prelude,
    );
    let (rs, msg) = ids(m);
    let x = &m.extras;
    let full = text.concat();
    let items = output(m, &full);
    let mut index = 0usize;
    if !x.reasoning.is_empty() {
        push(
            "response.output_item.added",
            json!({"output_index": index, "item": {"id": rs, "type": "reasoning", "summary": []}}),
            Role::Other,
        );
        let part = |t: &str| json!({"type": "summary_text", "text": t});
        push(
            "response.reasoning_summary_part.added",
            json!({"item_id": rs, "output_index": index, "summary_index": 0, "part": part("")}),
            Role::Other,
        );
        for w in &x.reasoning {
            push(
                "response.reasoning_summary_text.delta",
                json!({"item_id": rs, "output_index": index, "summary_index": 0, "delta": w}),
                Role::Token,
            );
        }
        let all = x.reasoning.concat();
        push(
            "response.reasoning_summary_text.done",
            json!({"item_id": rs, "output_index": index, "summary_index": 0, "text": all}),
            Role::Other,
        );
        push(
            "response.reasoning_summary_part.done",
            json!({"item_id": rs, "output_index": index, "summary_index": 0, "part": part(&all)}),
            Role::Other,
        );
        push(
            "response.output_item.done",
            json!({"output_index": index, "item": items[index]}),
            Role::Other,
        );
        index += 1;
    }
    if !full.is_empty() || x.tool_calls.is_empty() {
        let part =
            |t: &str| json!({"type": "output_text", "annotations": [], "logprobs": [], "text": t});
        push(
            "response.output_item.added",
            json!({"output_index": index, "item": {
                "id": msg, "type": "message", "status": "in_progress", "role": "assistant",
                "content": []
            }}),
            Role::Other,
        );
        push(
            "response.content_part.added",
            json!({"item_id": msg, "output_index": index, "content_index": 0, "part": part("")}),
            Role::Other,
        );
        for t in text {
            push(
                "response.output_text.delta",
                json!({"item_id": msg, "output_index": index, "content_index": 0, "delta": t, "logprobs": []}),
                Role::Token,
            );
        }
        push(
            "response.output_text.done",
            json!({"item_id": msg, "output_index": index, "content_index": 0, "text": full, "logprobs": []}),
            Role::Other,
        );
        push(
            "response.content_part.done",
            json!({"item_id": msg, "output_index": index, "content_index": 0, "part": part(&full)}),
            Role::Other,
        );
        push(
            "response.output_item.done",
            json!({"output_index": index, "item": items[index]}),
            Role::Other,
        );
        index += 1;
    }
    for c in &x.tool_calls {
        let fc = format!("fc_{}", c.id);
        push(
            "response.output_item.added",
            json!({"output_index": index, "item": {
                "id": fc, "type": "function_call", "status": "in_progress", "arguments": "",
                "call_id": c.id, "name": c.name
            }}),
            Role::Token,
        );
        for f in c.fragments() {
            push(
                "response.function_call_arguments.delta",
                json!({"item_id": fc, "output_index": index, "delta": f}),
                Role::Token,
            );
        }
        push(
            "response.function_call_arguments.done",
            json!({"item_id": fc, "output_index": index, "arguments": c.arguments}),
            Role::Other,
        );
        push(
            "response.output_item.done",
            json!({"output_index": index, "item": items[index]}),
            Role::Other,
        );
        index += 1;
    }
    // The content tokens: reasoning words, text tokens, tool-call starts and fragments.
    let n = text.len() as u64 + x.tokens();
    let (st, incomplete) = status(m);
    let name = if st == "incomplete" {
        "response.incomplete"
    } else {
        "response.completed"
    };
    push(
        name,
        json!({"response": snapshot(m, st, items, usage(m, n), incomplete)}),
        Role::Other,
    );
    evs
}

/// The `response.failed` event (number `seq`) of an answer that failed with `status`.
/// Its `error.code` is `code` (the `error_type` knob) or one for the status.
pub(crate) fn failed_event(
    m: &ReplyMeta,
    seq: u64,
    status: u16,
    code: Option<&str>,
    message: &str,
) -> String {
    let code = code.unwrap_or(match status {
        429 => "rate_limit_exceeded",
        400..=499 => "invalid_prompt",
        _ => "server_error",
    });
    let mut r = snapshot(m, "failed", Vec::new(), Value::Null, Value::Null);
    r["error"] = json!({"code": code, "message": message});
    json!({"type": "response.failed", "sequence_number": seq, "response": r}).to_string()
}

/// `POST /responses/input_tokens`'s answer.
pub(crate) fn input_tokens(n: u64) -> String {
    json!({"object": "response.input_tokens", "input_tokens": n}).to_string()
}

/// `POST /responses/compact`'s answer: one `compaction` item whose `encrypted_content` names
/// the answer (`mock-compaction-{id}`), and the usage.
pub(crate) fn compaction(m: &ReplyMeta) -> String {
    let bare = m.id.trim_start_matches("resp_");
    json!({
        "id": m.id, "object": "response.compaction", "created_at": m.created, "model": m.model,
        "output": [{"id": format!("cmp_{bare}"), "type": "compaction",
            "encrypted_content": format!("mock-compaction-{}", m.id)}],
        "usage": usage(m, 1)
    })
    .to_string()
}
