//! Golden request translations and the refused fields, per dialect.

use serde_json::{json, Value};

use crate::protocol::{
    decode_request, encode_request, error_body, ClientDialect, ProtocolError, UpstreamDialect,
    UpstreamOptions,
};

const OPTS: UpstreamOptions<'static> = UpstreamOptions {
    model: "claude-up",
    default_max_tokens: 4096,
    stream_usage: true,
    placement: crate::protocol::ModelPlacement::Body,
    thinking: None,
};

fn translate(
    from: ClientDialect,
    to: UpstreamDialect,
    body: Value,
) -> Result<Value, ProtocolError> {
    let req = decode_request(from, body.to_string().as_bytes())?;
    let out = encode_request(to, &req, &OPTS)?;
    Ok(serde_json::from_slice(&out).unwrap())
}

fn refused(from: ClientDialect, to: UpstreamDialect, body: Value) -> (String, bool) {
    let e = translate(from, to, body).unwrap_err();
    assert!(e.is_client_error(), "{e}");
    assert_eq!(e.status(), 400);
    (
        e.field().unwrap().to_owned(),
        matches!(e, ProtocolError::Unsupported { .. }),
    )
}

#[test]
fn chat_to_messages_golden() {
    let got = translate(
        ClientDialect::ChatCompletions,
        UpstreamDialect::Messages,
        json!({
            "model": "house", "stream": true, "stream_options": {"include_usage": true},
            "temperature": 1.5, "top_p": 0.9, "stop": "END", "user": "u-1", "seed": 7,
            "parallel_tool_calls": false, "max_tokens": 50,
            "messages": [
                {"role": "system", "content": "Be terse."},
                {"role": "developer", "content": [{"type": "text", "text": "No emoji."}]},
                {"role": "user", "content": "Read this", "name": "ann"},
                {"role": "user", "content": [{"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBER", "filename": "a.pdf"}}]},
                {"role": "assistant", "content": "Calling.", "tool_calls": [
                    {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": "{\"x\":1}"}},
                    {"id": "call_b", "type": "function", "function": {"name": "g", "arguments": ""}}]},
                {"role": "tool", "tool_call_id": "call_a", "content": "one"},
                {"role": "tool", "tool_call_id": "call_b", "content": [{"type": "text", "text": "two"}]},
                {"role": "user", "content": "thanks"}
            ],
            "tools": [{"type": "function", "function": {"name": "f", "description": "F", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}},
                      {"type": "function", "function": {"name": "g"}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}}
        }),
    )
    .unwrap();
    let want = json!({
        "model": "claude-up", "max_tokens": 50, "stream": true,
        "system": [{"type": "text", "text": "Be terse."}, {"type": "text", "text": "No emoji."}],
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "Read this"},
                {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBER"}, "title": "a.pdf"}]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Calling."},
                {"type": "tool_use", "id": "call_a", "name": "f", "input": {"x": 1}},
                {"type": "tool_use", "id": "call_b", "name": "g", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_a", "content": "one"},
                {"type": "tool_result", "tool_use_id": "call_b", "content": "two"},
                {"type": "text", "text": "thanks"}]}
        ],
        "tools": [{"name": "f", "description": "F", "input_schema": {"type": "object", "properties": {"x": {"type": "integer"}}}},
                  {"name": "g", "input_schema": {"type": "object", "properties": {}}}],
        "tool_choice": {"type": "tool", "name": "f", "disable_parallel_tool_use": true},
        "temperature": 1.0, "top_p": 0.9, "stop_sequences": ["END"],
        "metadata": {"user_id": "u-1"}
    });
    assert_eq!(got, want);
}

#[test]
fn messages_to_chat_golden() {
    let got = translate(
        ClientDialect::Messages,
        UpstreamDialect::ChatCompletions,
        json!({
            "model": "house", "max_tokens": 64, "stream": true, "top_k": 5,
            "system": [{"type": "text", "text": "Sys", "cache_control": {"type": "ephemeral"}}],
            "metadata": {"user_id": "u-2"}, "stop_sequences": ["\n\nHuman:"],
            "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "look", "input": {"q": "x"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "found"}], "is_error": false},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/"}}]}
            ],
            "tools": [{"name": "look", "description": "Look", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "auto", "disable_parallel_tool_use": true}
        }),
    )
    .unwrap();
    let want = json!({
        "model": "claude-up",
        "messages": [
            {"role": "system", "content": "Sys"},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            {"role": "assistant", "content": "Let me look.", "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "look", "arguments": "{\"q\":\"x\"}"}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "found"},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/"}}]}
        ],
        "tools": [{"type": "function", "function": {"name": "look", "description": "Look", "parameters": {"type": "object"}}}],
        "parallel_tool_calls": false, "tool_choice": "auto",
        "max_completion_tokens": 64, "stop": ["\n\nHuman:"], "user": "u-2",
        "stream": true, "stream_options": {"include_usage": true}
    });
    assert_eq!(got, want);
}

#[test]
fn responses_to_chat_golden() {
    let got = translate(
        ClientDialect::Responses,
        UpstreamDialect::ChatCompletions,
        json!({
            "model": "house", "instructions": "Be kind.", "store": false, "max_output_tokens": 77,
            "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": true}},
            "input": [
                {"type": "message", "role": "developer", "content": "Dev note"},
                {"role": "user", "content": [{"type": "input_text", "text": "Q"},
                    {"type": "input_file", "filename": "r.pdf", "file_data": "data:application/pdf;base64,JVB"}]},
                {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "thought"}], "encrypted_content": "enc"},
                {"role": "assistant", "content": [{"type": "output_text", "text": "A"}]},
                {"type": "function_call", "call_id": "call_9", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_9", "output": "ok"}
            ],
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": false}],
            "tool_choice": {"type": "function", "name": "f"}, "stream": true
        }),
    )
    .unwrap();
    let want = json!({
        "model": "claude-up",
        "messages": [
            {"role": "system", "content": "Be kind."},
            {"role": "system", "content": "Dev note"},
            {"role": "user", "content": [{"type": "text", "text": "Q"},
                {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVB", "filename": "r.pdf"}}]},
            {"role": "assistant", "content": "A", "tool_calls": [
                {"id": "call_9", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_9", "content": "ok"}
        ],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": false}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "max_completion_tokens": 77,
        "response_format": {"type": "json_schema", "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": true}},
        "stream": true, "stream_options": {"include_usage": true}
    });
    assert_eq!(got, want);
}

#[test]
fn responses_reasoning_history_keeps_signature_for_messages() {
    let got = translate(
        ClientDialect::Responses,
        UpstreamDialect::Messages,
        json!({"model": "m", "input": [
            {"role": "user", "content": "Q"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "t"}], "encrypted_content": "sig-1"},
            {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{\"a\":[1]}"},
            {"type": "function_call_output", "call_id": "call_1", "output": [{"type": "input_text", "text": "r"}]}
        ]}),
    )
    .unwrap();
    assert_eq!(
        got["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "Q"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "t", "signature": "sig-1"},
                {"type": "tool_use", "id": "call_1", "name": "f", "input": {"a": [1]}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "r"}]}
        ])
    );
}

#[test]
fn chat_reasoning_history_without_signature_is_dropped_for_messages() {
    let got = translate(
        ClientDialect::ChatCompletions,
        UpstreamDialect::Messages,
        json!({"model": "m", "messages": [
            {"role": "user", "content": "Q"},
            {"role": "assistant", "content": "A", "reasoning_content": "unsigned"},
            {"role": "user", "content": "Q2"}]}),
    )
    .unwrap();
    assert_eq!(
        got["messages"][1],
        json!({"role": "assistant", "content": [{"type": "text", "text": "A"}]})
    );
}

#[test]
fn thinking_budget_is_capped_below_max_tokens() {
    let got = translate(
        ClientDialect::ChatCompletions,
        UpstreamDialect::Messages,
        json!({"model": "m", "reasoning_effort": "high", "max_tokens": 4000,
               "messages": [{"role": "user", "content": "Q"}]}),
    )
    .unwrap();
    assert_eq!(
        got["thinking"],
        json!({"type": "adaptive"}),
        "a current Claude model takes adaptive thinking"
    );
    assert_eq!(got["output_config"], json!({"effort": "high"}));
    let req = decode_request(
        ClientDialect::ChatCompletions,
        br#"{"model":"m","reasoning_effort":"high","max_tokens":4000,"messages":[{"role":"user","content":"Q"}]}"#,
    )
    .unwrap();
    let got: Value = serde_json::from_slice(
        &encode_request(UpstreamDialect::Messages, &req, &BUDGET_OPTS).unwrap(),
    )
    .unwrap();
    assert_eq!(
        got["thinking"],
        json!({"type": "enabled", "budget_tokens": 3999})
    );
    let got = translate(
        ClientDialect::Messages,
        UpstreamDialect::ChatCompletions,
        json!({"model": "m", "max_tokens": 9000, "thinking": {"type": "enabled", "budget_tokens": 2000},
               "messages": [{"role": "user", "content": "Q"}]}),
    )
    .unwrap();
    assert_eq!(got["reasoning_effort"], "low");
}

#[test]
fn refused_fields_name_the_field() {
    let m = |extra: Value| {
        let mut b = json!({"model": "m", "messages": [{"role": "user", "content": "Q"}]});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    assert_eq!(
        refused(
            ClientDialect::ChatCompletions,
            UpstreamDialect::Messages,
            m(json!({"n": 2}))
        ),
        ("n".into(), true)
    );
    assert_eq!(
        refused(
            ClientDialect::ChatCompletions,
            UpstreamDialect::Messages,
            m(json!({"logprobs": true}))
        ),
        ("logprobs".into(), true)
    );
    assert_eq!(
        refused(
            ClientDialect::ChatCompletions,
            UpstreamDialect::Messages,
            m(json!({"functions": [{"name": "f"}]}))
        ),
        ("functions".into(), true)
    );
    let r = |extra: Value| {
        let mut b = json!({"model": "m", "input": "Q"});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    for (extra, field) in [
        (json!({"conversation": "conv_1"}), "conversation"),
        (json!({"background": true}), "background"),
    ] {
        assert_eq!(
            refused(
                ClientDialect::Responses,
                UpstreamDialect::Messages,
                r(extra)
            ),
            (field.into(), true),
            "{field}"
        );
    }
    // `previous_response_id` and `store` were handled before decoding (the response store,
    // `crate::conversation::expand`): the decoder reads past them; an item reference left
    // unresolved is refused by its path.
    let ok = decode_request(
        ClientDialect::Responses,
        br#"{"model":"m","input":"Q","store":true,"previous_response_id":"resp_1"}"#,
    )
    .unwrap();
    assert_eq!(ok.messages.len(), 1);
    let e = decode_request(
        ClientDialect::Responses,
        br#"{"model":"m","input":[{"type":"item_reference","id":"fc_1"}]}"#,
    )
    .unwrap_err();
    assert_eq!(e.field(), Some("input[0].type"), "{e}");
    // Malformed input names the path.
    let e = decode_request(
        ClientDialect::Messages,
        br#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#,
    )
    .unwrap_err();
    assert!(e.to_string().contains("max_tokens"), "{e}");
    let e = decode_request(
        ClientDialect::Messages,
        br#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text"}]}]}"#,
    )
    .unwrap_err();
    assert_eq!(e.field(), Some("messages[0].content[0]"));
}

/// The dropped fields of a request of `from` (decoded, nothing refused).
fn dropped(from: ClientDialect, body: &Value) -> Vec<String> {
    let req = decode_request(from, body.to_string().as_bytes()).unwrap();
    req.dropped.into_iter().map(|d| d.field).collect()
}

#[test]
fn what_has_no_counterpart_is_dropped_with_a_record_never_refused() {
    // Messages: server tools, MCP servers, containers, unknown blocks, sources, members,
    // thinking types and efforts.
    let got = dropped(
        ClientDialect::Messages,
        &json!({"model": "m", "max_tokens": 5,
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "x"},
                {"type": "search_result", "source": "s", "title": "t", "content": []},
                {"type": "image", "source": {"type": "file", "file_id": "f"}}]}],
            "tools": [{"type": "code_execution_20250522", "name": "code_execution"},
                      {"name": "f", "input_schema": {"type": "object"}}],
            "mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}],
            "container": "c", "context_management": {"edits": []},
            "output_config": {"effort": "ultra", "task_budget": 5},
            "tool_choice": {"type": "sometimes"}}),
    );
    assert_eq!(
        got,
        [
            "mcp_servers",
            "container",
            "context_management",
            "messages[0].content[1]",
            "messages[0].content[2].source",
            "tools[0]",
            "tool_choice.type",
            "output_config.effort",
            "output_config.task_budget"
        ]
    );
    let got = dropped(
        ClientDialect::Messages,
        &json!({"model": "m", "max_tokens": 5, "thinking": {"type": "sometimes"},
            "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(got, ["thinking.type"]);
    // Chat: non-function tools, unknown efforts and members (hosted search is mapped).
    let got = dropped(
        ClientDialect::ChatCompletions,
        &json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "custom", "custom": {"name": "c"}}],
            "web_search_options": {}, "reasoning_effort": "ultra", "seed": 1,
            "tool_choice": {"type": "allowed_tools", "allowed_tools": {}}}),
    );
    assert_eq!(got, ["seed", "tools[0]", "tool_choice", "reasoning_effort"]);
    // Responses: hosted tools, unknown items, parts and members.
    let got = dropped(
        ClientDialect::Responses,
        &json!({"model": "m", "include": ["reasoning.encrypted_content"],
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "x"},
                                                   {"type": "input_audio", "input_audio": {}}]},
                      {"type": "web_search_call", "id": "ws_1", "status": "completed"}],
            "tools": [{"type": "web_search", "external_web_access": false}],
            "reasoning": {"effort": "ultra"}}),
    );
    assert_eq!(
        got,
        [
            "input[0].content[1]",
            "input[1]",
            "include",
            "tools[0]",
            "reasoning.effort"
        ]
    );
}

const BUDGET_OPTS: UpstreamOptions<'static> = UpstreamOptions {
    thinking: Some(crate::protocol::ThinkingForm::Budget),
    ..OPTS
};

#[test]
fn claude_thinking_takes_the_form_of_the_model() {
    use crate::protocol::ThinkingForm;
    for (id, form) in [
        ("claude-opus-4-7", ThinkingForm::Adaptive),
        ("claude-sonnet-4-6", ThinkingForm::Adaptive),
        ("claude-opus-4-6@20260101", ThinkingForm::Adaptive),
        (
            "us.anthropic.claude-sonnet-4-6-v1:0",
            ThinkingForm::Adaptive,
        ),
        ("claude-sonnet-5", ThinkingForm::Adaptive),
        ("house-model", ThinkingForm::Adaptive),
        ("claude-sonnet-4-5-20250929", ThinkingForm::Budget),
        ("claude-opus-4-1", ThinkingForm::Budget),
        ("claude-opus-4-20250514", ThinkingForm::Budget),
        (
            "anthropic.claude-3-7-sonnet-20250219-v1:0",
            ThinkingForm::Budget,
        ),
        ("claude-3-5-haiku@20241022", ThinkingForm::Budget),
        ("claude-haiku-4-5", ThinkingForm::Budget),
    ] {
        assert_eq!(ThinkingForm::for_model(id), form, "{id}");
    }
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "every direction of the effort and thinking mapping, one assertion per line"
)]
fn adaptive_thinking_and_every_effort_cross_every_direction() {
    // Claude Code's first request: adaptive thinking with an effort, display omitted.
    let claude_code = json!({"model": "m", "max_tokens": 32000,
        "thinking": {"type": "adaptive", "display": "omitted"},
        "output_config": {"effort": "high"},
        "messages": [{"role": "user", "content": "Q"}]});
    let got = translate(
        ClientDialect::Messages,
        UpstreamDialect::ChatCompletions,
        claude_code.clone(),
    )
    .unwrap();
    assert_eq!(got["reasoning_effort"], "high");
    // Toward a current Claude model (adaptive by default): adaptive with the effort.
    let got = translate(
        ClientDialect::Messages,
        UpstreamDialect::Messages,
        claude_code.clone(),
    )
    .unwrap();
    assert_eq!(
        got["thinking"],
        json!({"type": "adaptive", "display": "omitted"})
    );
    assert_eq!(got["output_config"], json!({"effort": "high"}));
    // Every effort level, both vendors' names.
    for (effort, chat, claude) in [
        ("none", Some("none"), None),
        ("minimal", Some("minimal"), Some("low")),
        ("low", Some("low"), Some("low")),
        ("medium", Some("medium"), Some("medium")),
        ("high", Some("high"), Some("high")),
        ("xhigh", Some("xhigh"), Some("xhigh")),
        ("max", Some("xhigh"), Some("max")),
    ] {
        let body = json!({"model": "m", "max_tokens": 64000,
            "thinking": {"type": "adaptive"}, "output_config": {"effort": effort},
            "messages": [{"role": "user", "content": "Q"}]});
        let got = translate(
            ClientDialect::Messages,
            UpstreamDialect::ChatCompletions,
            body,
        )
        .unwrap();
        assert_eq!(got["reasoning_effort"].as_str(), chat, "{effort}");
        for from in [ClientDialect::ChatCompletions, ClientDialect::Responses] {
            let body = match from {
                ClientDialect::Responses => {
                    json!({"model": "m", "input": "Q", "reasoning": {"effort": effort}})
                }
                _ => json!({"model": "m", "reasoning_effort": effort,
                            "messages": [{"role": "user", "content": "Q"}]}),
            };
            let got = translate(from, UpstreamDialect::Messages, body).unwrap();
            assert_eq!(
                got["output_config"]["effort"].as_str(),
                claude,
                "{effort} from {from:?}"
            );
            let thinking = if claude.is_some() {
                json!({"type": "adaptive"})
            } else {
                json!({"type": "disabled"})
            };
            assert_eq!(got["thinking"], thinking, "{effort} from {from:?}");
        }
    }
    // An older Claude model takes a budget.
    let req = decode_request(
        ClientDialect::Responses,
        br#"{"model":"m","input":"Q","reasoning":{"effort":"xhigh"},"max_output_tokens":40000}"#,
    )
    .unwrap();
    let got: Value = serde_json::from_slice(
        &encode_request(UpstreamDialect::Messages, &req, &BUDGET_OPTS).unwrap(),
    )
    .unwrap();
    assert_eq!(
        got["thinking"],
        json!({"type": "enabled", "budget_tokens": 32768})
    );
    assert!(got.get("output_config").is_none());
    // Gemini: a level for Gemini 3, a budget before it.
    let req = decode_request(ClientDialect::Messages, claude_code.to_string().as_bytes()).unwrap();
    for (model, want) in [
        ("gemini-3-pro-preview", json!({"thinkingLevel": "high"})),
        ("gemini-2.5-pro", json!({"thinkingBudget": 24576})),
    ] {
        let opts = UpstreamOptions { model, ..OPTS };
        let got: Value =
            serde_json::from_slice(&encode_request(UpstreamDialect::Gemini, &req, &opts).unwrap())
                .unwrap();
        assert_eq!(got["generationConfig"]["thinkingConfig"], want, "{model}");
    }
    // Converse: Claude's own fields for a Claude model, recorded as dropped for another.
    let opts = UpstreamOptions {
        model: "us.anthropic.claude-opus-4-7-v1:0",
        ..OPTS
    };
    let got: Value =
        serde_json::from_slice(&encode_request(UpstreamDialect::Converse, &req, &opts).unwrap())
            .unwrap();
    assert_eq!(
        got["additionalModelRequestFields"],
        json!({"thinking": {"type": "adaptive", "display": "omitted"}, "output_config": {"effort": "high"}})
    );
    let opts = UpstreamOptions {
        model: "amazon.nova-pro-v1:0",
        ..OPTS
    };
    assert!(
        crate::protocol::dropped_toward(UpstreamDialect::Converse, &req, &opts)
            .iter()
            .any(|d| d.field == "thinking")
    );
}

#[test]
fn system_messages_anywhere_join_the_system_prompt() {
    let got = translate(
        ClientDialect::Messages,
        UpstreamDialect::ChatCompletions,
        json!({"model": "m", "max_tokens": 5, "system": "first",
            "messages": [{"role": "user", "content": "Q"},
                         {"role": "system", "content": "Be brief now."},
                         {"role": "assistant", "content": "A"},
                         {"role": "user", "content": "Q2"}]}),
    )
    .unwrap();
    assert_eq!(
        got["messages"],
        json!([
            {"role": "system", "content": "first"},
            {"role": "system", "content": "Be brief now."},
            {"role": "user", "content": [{"type": "text", "text": "Q"}]},
            {"role": "assistant", "content": "A"},
            {"role": "user", "content": [{"type": "text", "text": "Q2"}]}
        ])
    );
}

#[test]
fn responses_namespace_and_custom_tools_become_functions_and_come_back_in_their_form() {
    let body = json!({"model": "m", "input": [
            {"role": "user", "content": "go"},
            {"type": "function_call", "call_id": "c1", "name": "spawn_agent", "namespace": "multi_agent_v1", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
            {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch"},
            {"type": "custom_tool_call_output", "call_id": "c2", "output": "done"}],
        "tools": [
            {"type": "namespace", "name": "multi_agent_v1", "description": "agents",
             "tools": [{"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}}]},
            {"type": "custom", "name": "apply_patch", "description": "Patch files.",
             "format": {"type": "grammar", "syntax": "lark", "definition": "start: x"}},
            {"type": "web_search", "external_web_access": false}]});
    let req = decode_request(ClientDialect::Responses, body.to_string().as_bytes()).unwrap();
    let names: Vec<&str> = req.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["multi_agent_v1__spawn_agent", "apply_patch"]);
    assert!(req.tools[1]
        .description
        .as_deref()
        .unwrap()
        .contains("lark grammar:\nstart: x"));
    assert_eq!(req.dropped[0].field, "tools[2]");
    let got: Value = serde_json::from_slice(
        &encode_request(UpstreamDialect::ChatCompletions, &req, &OPTS).unwrap(),
    )
    .unwrap();
    assert_eq!(
        got["messages"][1]["tool_calls"][0]["function"]["name"],
        "multi_agent_v1__spawn_agent"
    );
    assert_eq!(
        got["messages"][3]["tool_calls"][0]["function"]["arguments"],
        r#"{"input":"*** Begin Patch"}"#
    );
    // The answer gives the calls back in the client's form.
    let resp = crate::protocol::Response {
        id: "r".into(),
        model: "m".into(),
        output: vec![
            crate::protocol::OutputItem::ToolCall(crate::protocol::ToolCall {
                id: "c3".into(),
                name: "multi_agent_v1__spawn_agent".into(),
                arguments: "{}".into(),
            }),
            crate::protocol::OutputItem::ToolCall(crate::protocol::ToolCall {
                id: "c4".into(),
                name: "apply_patch".into(),
                arguments: r#"{"input":"*** End Patch"}"#.into(),
            }),
        ],
        ..Default::default()
    };
    let out: Value = serde_json::from_slice(&crate::protocol::encode_response_for(
        ClientDialect::Responses,
        &resp,
        &req.echo(),
    ))
    .unwrap();
    assert_eq!(out["output"][0]["name"], "spawn_agent");
    assert_eq!(out["output"][0]["namespace"], "multi_agent_v1");
    assert_eq!(out["output"][1]["type"], "custom_tool_call");
    assert_eq!(out["output"][1]["input"], "*** End Patch");
}

#[test]
fn error_bodies_per_dialect() {
    let cases = [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (529, "overloaded_error"),
    ];
    for (status, ty) in cases {
        let v: Value = serde_json::from_slice(&error_body(
            ClientDialect::Messages,
            status,
            "m",
            None,
            Some("c"),
        ))
        .unwrap();
        assert_eq!(
            v,
            json!({"type": "error", "error": {"type": ty, "message": "m"}})
        );
    }
    let v: Value = serde_json::from_slice(&error_body(
        ClientDialect::Responses,
        400,
        "bad",
        Some("store"),
        Some("invalid_request"),
    ))
    .unwrap();
    assert_eq!(
        v,
        json!({"error": {"message": "bad", "type": "invalid_request_error", "param": "store", "code": "invalid_request"}})
    );
    let (kind, msg) = crate::protocol::decode_error_body(
        UpstreamDialect::Messages,
        529,
        br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
    );
    assert_eq!(
        (kind, msg.as_str()),
        (crate::protocol::ErrorKind::Overloaded, "Overloaded")
    );
    let (kind, msg) =
        crate::protocol::decode_error_body(UpstreamDialect::ChatCompletions, 502, b"");
    assert_eq!(
        (kind, msg.as_str()),
        (
            crate::protocol::ErrorKind::Api,
            "upstream returned HTTP 502"
        )
    );
}

/// Hosted web search (issue 28): mapped to the target's own search where it has one
/// (Anthropic's server tool, Gemini's Google Search), dropped with a record where not
/// (Chat Completions, Converse), and dropped with a record when the client allows cached
/// results only (Codex's `external_web_access: false`).
#[test]
fn hosted_web_search_maps_to_the_targets_own_search() {
    use crate::protocol::dropped_toward;
    let responses = json!({
        "model": "m", "input": "news?",
        "tools": [
            {"type": "function", "name": "f", "parameters": {"type": "object"}},
            {"type": "web_search", "filters": {"allowed_domains": ["example.org"]},
             "user_location": {"type": "approximate", "country": "CH", "city": "Zürich"}}
        ]
    });
    let got = translate(
        ClientDialect::Responses,
        UpstreamDialect::Messages,
        responses.clone(),
    )
    .unwrap();
    assert_eq!(
        got["tools"][1],
        json!({"type": "web_search_20250305", "name": "web_search", "allowed_domains": ["example.org"],
               "user_location": {"type": "approximate", "country": "CH", "city": "Zürich"}}),
        "{got}"
    );
    let got = translate(
        ClientDialect::Responses,
        UpstreamDialect::Gemini,
        responses.clone(),
    )
    .unwrap();
    assert_eq!(got["tools"][1], json!({"googleSearch": {}}), "{got}");

    // Messages' server tool toward Gemini (the only tool) and Anthropic's settings kept.
    let messages = json!({
        "model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "news?"}],
        "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 3, "blocked_domains": ["spam.example"]}]
    });
    let got = translate(
        ClientDialect::Messages,
        UpstreamDialect::Gemini,
        messages.clone(),
    )
    .unwrap();
    assert_eq!(got["tools"], json!([{"googleSearch": {}}]), "{got}");
    let req = decode_request(ClientDialect::Messages, messages.to_string().as_bytes()).unwrap();
    assert!(req.dropped.is_empty(), "{:?}", req.dropped);
    let ws = req.web_search.as_ref().unwrap();
    assert_eq!(
        (ws.max_uses, ws.blocked_domains.clone()),
        (Some(3), vec!["spam.example".to_string()])
    );

    // Chat's web_search_options toward Anthropic, with its nested approximate location.
    let chat = json!({
        "model": "m", "messages": [{"role": "user", "content": "news?"}],
        "web_search_options": {"user_location": {"type": "approximate", "approximate": {"country": "GB", "city": "London"}}}
    });
    let got = translate(
        ClientDialect::ChatCompletions,
        UpstreamDialect::Messages,
        chat.clone(),
    )
    .unwrap();
    assert_eq!(
        got["tools"],
        json!([{"type": "web_search_20250305", "name": "web_search", "user_location": {"type": "approximate", "country": "GB", "city": "London"}}]),
        "{got}"
    );

    // No search on Converse or a Chat Completions upstream: recorded, named by the client's path.
    for (from, body, field) in [
        (ClientDialect::Responses, responses, "tools[1]"),
        (ClientDialect::ChatCompletions, chat, "web_search_options"),
    ] {
        let req = decode_request(from, body.to_string().as_bytes()).unwrap();
        for to in [UpstreamDialect::Converse, UpstreamDialect::ChatCompletions] {
            if from.same_as(to) {
                continue;
            }
            let d = dropped_toward(to, &req, &OPTS);
            assert!(d.iter().any(|d| d.field == field), "{from:?}→{to:?}: {d:?}");
        }
        for to in [UpstreamDialect::Messages, UpstreamDialect::Gemini] {
            assert!(
                dropped_toward(to, &req, &OPTS).is_empty(),
                "{from:?}→{to:?}"
            );
        }
    }

    // Codex: cached results only has no counterpart anywhere.
    let codex = json!({"model": "m", "input": "hi", "tools": [{"type": "web_search", "external_web_access": false}]});
    let req = decode_request(ClientDialect::Responses, codex.to_string().as_bytes()).unwrap();
    assert!(req.web_search.is_none());
    assert_eq!(req.dropped.len(), 1);
    assert_eq!(req.dropped[0].field, "tools[0]");
}

/// What a translation of `body` from `from` to `to` leaves out, by client field.
fn dropped_toward(from: ClientDialect, to: UpstreamDialect, body: &Value) -> Vec<String> {
    let req = decode_request(from, body.to_string().as_bytes()).unwrap();
    crate::protocol::dropped_toward(to, &req, &OPTS)
        .into_iter()
        .map(|d| d.field)
        .collect()
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one structured-output form per client dialect, toward every upstream, side by side"
)]
fn structured_output_crosses_every_direction() {
    let schema = json!({"type": "object", "properties": {"answer": {"type": "string"}},
        "required": ["answer"], "additionalProperties": false});
    let hi = json!([{"role": "user", "content": "Q"}]);
    // Anthropic's `output_config.format` (with the effort beside it) and the beta's
    // top-level `output_format`, toward OpenAI, Gemini and Converse.
    let current = json!({"model": "m", "max_tokens": 5, "messages": hi,
        "output_config": {"effort": "high", "format": {"type": "json_schema", "schema": schema}}});
    let beta = json!({"model": "m", "max_tokens": 5, "messages": hi,
        "output_format": {"type": "json_schema", "schema": schema}});
    for body in [&current, &beta] {
        assert!(dropped(ClientDialect::Messages, body).is_empty(), "{body}");
        let chat = translate(
            ClientDialect::Messages,
            UpstreamDialect::ChatCompletions,
            body.clone(),
        )
        .unwrap();
        assert_eq!(
            chat["response_format"],
            json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}),
            "{chat}"
        );
        let gemini = translate(
            ClientDialect::Messages,
            UpstreamDialect::Gemini,
            body.clone(),
        )
        .unwrap();
        assert_eq!(
            gemini["generationConfig"]["responseMimeType"],
            "application/json"
        );
        assert_eq!(gemini["generationConfig"]["responseJsonSchema"], schema);
        let converse = translate(
            ClientDialect::Messages,
            UpstreamDialect::Converse,
            body.clone(),
        )
        .unwrap();
        assert_eq!(
            converse["outputConfig"],
            json!({"textFormat": {"type": "json_schema", "structure": {"jsonSchema": {
                "schema": schema.to_string(), "name": "output"}}}}),
            "{converse}"
        );
    }
    // Both given: `output_config.format` wins, the beta's member is recorded as dropped.
    let mut both = current.clone();
    both["output_format"] = json!({"type": "json_schema", "schema": {"type": "object"}});
    assert_eq!(dropped(ClientDialect::Messages, &both), ["output_format"]);
    let chat = translate(
        ClientDialect::Messages,
        UpstreamDialect::ChatCompletions,
        both,
    )
    .unwrap();
    assert_eq!(chat["response_format"]["json_schema"]["schema"], schema);
    // A format Sluice does not know is recorded, never refused.
    let unknown = json!({"model": "m", "max_tokens": 5, "messages": hi,
        "output_config": {"format": {"type": "yaml"}}});
    assert_eq!(
        dropped(ClientDialect::Messages, &unknown),
        ["output_config.format"]
    );

    // Chat's `response_format` and Responses' `text.format` json_schema toward Anthropic:
    // `output_config.format`, beside the effort.
    let chat_body = json!({"model": "m", "messages": hi, "reasoning_effort": "high",
        "response_format": {"type": "json_schema", "json_schema": {"name": "answer",
            "schema": schema, "strict": true}}});
    let responses_body = json!({"model": "m", "input": "Q", "reasoning": {"effort": "high"},
        "text": {"format": {"type": "json_schema", "name": "answer", "schema": schema,
            "strict": true}}});
    for (from, body) in [
        (ClientDialect::ChatCompletions, &chat_body),
        (ClientDialect::Responses, &responses_body),
    ] {
        let got = translate(from, UpstreamDialect::Messages, body.clone()).unwrap();
        assert_eq!(
            got["output_config"],
            json!({"effort": "high", "format": {"type": "json_schema", "schema": schema}}),
            "{from:?}: {got}"
        );
        assert!(
            dropped_toward(from, UpstreamDialect::Messages, body).is_empty(),
            "{from:?}"
        );
        let got = translate(from, UpstreamDialect::Converse, body.clone()).unwrap();
        assert_eq!(
            got["outputConfig"],
            json!({"textFormat": {"type": "json_schema", "structure": {"jsonSchema": {
                "schema": schema.to_string(), "name": "answer"}}}}),
            "{from:?}: {got}"
        );
    }
    // A description goes to Converse; Anthropic has no member for it (recorded).
    let mut described = chat_body.clone();
    described["response_format"]["json_schema"]["description"] = json!("The answer.");
    let got = translate(
        ClientDialect::ChatCompletions,
        UpstreamDialect::Converse,
        described.clone(),
    )
    .unwrap();
    assert_eq!(
        got["outputConfig"]["textFormat"]["structure"]["jsonSchema"]["description"],
        "The answer."
    );
    assert_eq!(
        dropped_toward(
            ClientDialect::ChatCompletions,
            UpstreamDialect::Messages,
            &described
        ),
        ["response_format.json_schema.description"]
    );

    // JSON mode (any object) has no counterpart on Anthropic or Converse: the request goes
    // without it, and the drop is recorded in the client's words.
    for (from, body, field) in [
        (
            ClientDialect::ChatCompletions,
            json!({"model": "m", "messages": hi, "response_format": {"type": "json_object"}}),
            "response_format",
        ),
        (
            ClientDialect::Responses,
            json!({"model": "m", "input": "Q", "text": {"format": {"type": "json_object"}}}),
            "text.format",
        ),
    ] {
        for to in [UpstreamDialect::Messages, UpstreamDialect::Converse] {
            let got = translate(from, to, body.clone()).unwrap();
            assert!(
                got.get("output_config").is_none(),
                "{from:?}->{to:?}: {got}"
            );
            assert!(got.get("outputConfig").is_none(), "{from:?}->{to:?}: {got}");
            assert_eq!(dropped_toward(from, to, &body), [field], "{from:?}->{to:?}");
        }
    }
}
