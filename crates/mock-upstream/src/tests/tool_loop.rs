//! The `tool_loop` knob: one tool call for a request that offers tools, then text quoting
//! the tool result, in every dialect the mock speaks (over a socket for Chat Completions,
//! Messages and Gemini, stream and not; the request reading for Converse, whose answers are
//! the Messages answer re-encoded).

use serde_json::{json, Value};

use super::{call, post, server, Client};
use crate::tool_loop::apply;
use crate::{Behavior, DONE_MARKER, TOOL_MARKER};

fn looping() -> Behavior {
    Behavior {
        tool_loop: Some(true),
        ..Behavior::default()
    }
}

/// The behaviour the knob makes of `body`.
fn applied(body: &Value) -> Behavior {
    let mut b = looping();
    let _ = apply(&mut b, body);
    b
}

fn call_of(b: &Behavior) -> (String, Value) {
    let calls = b.tool_calls.as_ref().expect("a tool call");
    assert_eq!(calls.len(), 1, "{calls:?}");
    (calls[0].name.clone(), calls[0].arguments.clone())
}

/// The `data:` payloads of an SSE body (LF framing), `[DONE]` left out.
fn data(body: &[u8]) -> Vec<Value> {
    std::str::from_utf8(body)
        .expect("utf-8")
        .split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d.trim_end_matches('\r')).expect("event JSON"))
        .collect()
}

#[test]
fn prefers_shell_tools_by_name_in_every_dialect() {
    let schema = json!({"type": "object", "properties": {"command": {"type": "string"}},
        "required": ["command"]});
    // Claude Code (Messages): Bash among others, not first.
    let b = applied(
        &json!({"messages": [{"role": "user", "content": "go"}], "tools": [
        {"name": "Read", "input_schema": {"type": "object", "required": ["file_path"],
            "properties": {"file_path": {"type": "string"}}}},
        {"type": "web_search_20250305", "name": "web_search"},
        {"name": "Bash", "input_schema": schema}]}),
    );
    let (name, args) = call_of(&b);
    assert_eq!(name, "Bash");
    assert_eq!(args["command"], format!("echo {TOOL_MARKER}"));
    // Codex through the gateway (Chat Completions): exec_command over shell.
    let b = applied(
        &json!({"messages": [{"role": "user", "content": "go"}], "tools": [
        {"type": "function", "function": {"name": "shell", "parameters": schema}},
        {"type": "function", "function": {"name": "exec_command", "parameters": schema}}]}),
    );
    assert_eq!(
        call_of(&b),
        ("exec_command".into(), json!({"cmd": "echo sluice-tool-ok"}))
    );
    // Converse: a namespaced (flattened) name still matches.
    let b = applied(
        &json!({"messages": [{"role": "user", "content": [{"text": "go"}]}],
        "toolConfig": {"tools": [{"toolSpec": {"name": "tools__exec_command",
            "inputSchema": {"json": schema}}}]}}),
    );
    assert_eq!(call_of(&b).0, "tools__exec_command");
    // Gemini: function declarations.
    let b = applied(
        &json!({"contents": [{"role": "user", "parts": [{"text": "go"}]}],
        "tools": [{"functionDeclarations": [{"name": "Bash", "parametersJsonSchema": schema}]}]}),
    );
    assert_eq!(call_of(&b).0, "Bash");
}

#[test]
fn unknown_tools_get_their_required_arguments_only() {
    let b = applied(
        &json!({"messages": [{"role": "user", "content": "go"}], "tools": [
        {"type": "function", "function": {"name": "two", "parameters": {"type": "object",
            "required": ["a", "b"], "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}}},
        {"type": "function", "function": {"name": "one", "parameters": {"type": "object",
            "required": ["mode"], "properties": {"mode": {"type": "string", "enum": ["fast", "slow"]},
                "extra": {"type": "string"}}}}}]}),
    );
    assert_eq!(call_of(&b), ("one".into(), json!({"mode": "fast"})));
}

#[test]
fn a_tool_result_in_any_dialect_is_answered_with_text_quoting_it() {
    let result = format!("{TOOL_MARKER}\n  second   line");
    let quoted = format!("{DONE_MARKER} {TOOL_MARKER} second line");
    let tools = json!([{"type": "function", "function": {"name": "exec_command"}}]);
    let bodies = [
        // Chat Completions.
        json!({"tools": tools, "messages": [{"role": "user", "content": "go"},
            {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "exec_command", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": result}]}),
        // Messages, the content as blocks.
        json!({"tools": [{"name": "Bash", "input_schema": {}}], "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                "content": [{"type": "text", "text": result}]}]}]}),
        // Converse.
        json!({"messages": [{"role": "user", "content": [{"toolResult": {"toolUseId": "t1",
            "content": [{"text": result}]}}]}]}),
        // Gemini.
        json!({"contents": [{"role": "user", "parts": [{"functionResponse": {"name": "Bash",
            "response": {"output": result}}}]}]}),
    ];
    for body in bodies {
        let b = applied(&body);
        assert_eq!(b.tool_calls, None, "{body}");
        assert_eq!(b.text.as_deref(), Some(quoted.as_str()), "{body}");
    }
}

#[test]
fn without_tools_or_with_explicit_knobs_it_changes_nothing() {
    let plain = json!({"messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(applied(&plain), looping());
    let mut b = Behavior {
        text: Some("mine".into()),
        ..looping()
    };
    let with_result = json!({"messages": [{"role": "tool", "content": "x"}]});
    assert_eq!(apply(&mut b, &with_result).as_deref(), Some("x"));
    assert_eq!(b.text.as_deref(), Some("mine"));
}

#[tokio::test]
async fn chat_completions_loop_over_the_socket() {
    let srv = server(looping()).await;
    let tools = json!([{"type": "function", "function": {"name": "exec_command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}]);
    let first = json!({"model": "m", "tools": tools,
        "messages": [{"role": "user", "content": "run it"}]});
    let v = call(&srv, "/v1/chat/completions", &first).await.json();
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    let tc = &v["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(tc["function"]["name"], "exec_command");
    assert_eq!(
        tc["function"]["arguments"],
        json!({"cmd": "echo sluice-tool-ok"}).to_string()
    );
    // Streamed: the call's name and argument fragments.
    let mut s = first.clone();
    s["stream"] = json!(true);
    let events = data(&call(&srv, "/v1/chat/completions", &s).await.body);
    let args: String = events
        .iter()
        .filter_map(|e| e.pointer("/choices/0/delta/tool_calls/0/function/arguments"))
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(args, json!({"cmd": "echo sluice-tool-ok"}).to_string());
    // The result comes back: text quoting it.
    let mut second = first;
    second["messages"] = json!([{"role": "user", "content": "run it"},
        {"role": "assistant", "tool_calls": [tc]},
        {"role": "tool", "tool_call_id": tc["id"], "content": "sluice-tool-ok\n"}]);
    second["stream"] = json!(true);
    let events = data(&call(&srv, "/v1/chat/completions", &second).await.body);
    let text: String = events
        .iter()
        .filter_map(|e| e.pointer("/choices/0/delta/content"))
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(text, format!("{DONE_MARKER} {TOOL_MARKER}"));
    // The log tells which request carried the result, and which got the call.
    let log = srv.state().log();
    assert_eq!(log.len(), 3);
    assert_eq!(log[0].tool_result, None);
    assert!(log[0].behavior.tool_calls.is_some());
    assert_eq!(log[2].tool_result.as_deref(), Some(TOOL_MARKER));
}

#[tokio::test]
async fn messages_loop_over_the_socket() {
    let srv = server(looping()).await;
    let first = json!({"model": "claude", "max_tokens": 100, "stream": true,
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": "run it"}]});
    let events = data(&call(&srv, "/v1/messages", &first).await.body);
    let start = events
        .iter()
        .find(|e| e.pointer("/content_block/type") == Some(&json!("tool_use")))
        .expect("a tool_use block");
    assert_eq!(start["content_block"]["name"], "Bash");
    let partial: String = events
        .iter()
        .filter_map(|e| e.pointer("/delta/partial_json"))
        .filter_map(Value::as_str)
        .collect();
    let input: Value = serde_json::from_str(&partial).expect("input JSON");
    assert_eq!(input["command"], "echo sluice-tool-ok");
    assert!(events
        .iter()
        .any(|e| e.pointer("/delta/stop_reason") == Some(&json!("tool_use"))));
    let mut second = first;
    second["stream"] = json!(false);
    second["messages"] = json!([{"role": "user", "content": "run it"},
        {"role": "assistant", "content": [start["content_block"].clone()]},
        {"role": "user", "content": [{"type": "tool_result",
            "tool_use_id": start["content_block"]["id"], "content": "sluice-tool-ok"}]}]);
    let v = call(&srv, "/v1/messages", &second).await.json();
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(
        v["content"][0]["text"],
        format!("{DONE_MARKER} {TOOL_MARKER}")
    );
}

#[tokio::test]
async fn gemini_loop_over_the_socket() {
    let srv = server(looping()).await;
    let gm = "/v1beta/models/gemini-2.5-flash";
    let first = json!({"contents": [{"role": "user", "parts": [{"text": "run it"}]}],
        "tools": [{"functionDeclarations": [{"name": "Bash",
            "parameters": {"type": "object"}}]}]});
    let mut c = Client::connect(srv.addr()).await;
    let path = format!("{gm}:streamGenerateContent?alt=sse");
    c.send(&post(&path, &first, "x-goog-api-key: k\r\n")).await;
    let r = c.read_response().await;
    assert_eq!(r.status, 200, "{}", r.text());
    let events = data(&r.body);
    let fc = events
        .iter()
        .find_map(|e| e.pointer("/candidates/0/content/parts/0/functionCall"))
        .expect("a function call");
    assert_eq!(fc["name"], "Bash");
    assert_eq!(fc["args"]["command"], "echo sluice-tool-ok");
    let mut second = first;
    second["contents"] = json!([{"role": "user", "parts": [{"text": "run it"}]},
        {"role": "model", "parts": [{"functionCall": fc}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "Bash",
            "response": {"output": "sluice-tool-ok"}}}]}]);
    let mut c = Client::connect(srv.addr()).await;
    c.send(&post(
        &format!("{gm}:generateContent"),
        &second,
        "x-goog-api-key: k\r\n",
    ))
    .await;
    let v = c.read_response().await.json();
    assert_eq!(
        v["candidates"][0]["content"]["parts"][0]["text"],
        format!("{DONE_MARKER} {TOOL_MARKER}")
    );
}
