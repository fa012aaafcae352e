//! Golden bodies of the Converse converters, and ConverseStream through every client
//! dialect's encoder.

use bytes::BytesMut;
use serde_json::{json, Value};

use super::super::{
    ClientDialect, ErrorKind, Message, OutputItem, Part, Request, ResponseFormat, Role, Source,
    StopReason, StreamEvent, StreamOptions, StreamTranslator, Tool, ToolCall, ToolChoice,
    UpstreamOptions,
};
use super::*;

fn opts() -> UpstreamOptions<'static> {
    UpstreamOptions {
        model: "amazon.nova-pro-v1:0",
        default_max_tokens: 4096,
        stream_usage: true,
        placement: crate::protocol::ModelPlacement::Body,
        thinking: None,
    }
}

fn encode(req: &Request) -> Value {
    serde_json::from_slice(&encode_request(req, &opts()).expect("encodes")).expect("JSON")
}

fn user(parts: Vec<Part>) -> Message {
    Message {
        role: Role::User,
        parts,
    }
}

#[test]
fn request_golden_body() {
    let req = Request {
        model: "acme/nova".into(),
        system: vec!["be brief".into()],
        messages: vec![
            user(vec![
                Part::Text("what is here?".into()),
                Part::Image(Source::Base64 {
                    media_type: "image/png".into(),
                    data: "iVBORw0K".into(),
                }),
            ]),
            Message {
                role: Role::Assistant,
                parts: vec![
                    Part::Reasoning {
                        text: "hmm".into(),
                        signature: None,
                    },
                    Part::ToolCall(ToolCall {
                        id: "call_1".into(),
                        name: "look".into(),
                        arguments: r#"{"zoom":2}"#.into(),
                    }),
                ],
            },
            user(vec![Part::ToolResult {
                call_id: "call_1".into(),
                content: vec![Part::Text("a cat".into())],
                is_error: false,
            }]),
            // Two user turns in a row (a Chat client's tool message, then its text) are one
            // Converse message.
            user(vec![
                Part::Text(String::new()),
                Part::Text("and now?".into()),
            ]),
        ],
        tools: vec![Tool {
            name: "look".into(),
            description: Some("Look closer".into()),
            parameters: json!({"type":"object","properties":{"zoom":{"type":"integer"}}}),
            strict: Some(true),
            origin: Default::default(),
        }],
        tool_choice: Some(ToolChoice::Function("look".into())),
        max_output_tokens: Some(100),
        temperature: Some(0.5),
        top_p: Some(0.9),
        stop: vec!["END".into()],
        user: Some("u-1".into()),
        ..Request::default()
    };
    assert_eq!(
        encode(&req),
        json!({
            "messages": [
                {"role": "user", "content": [
                    {"text": "what is here?"},
                    {"image": {"format": "png", "source": {"bytes": "iVBORw0K"}}}
                ]},
                {"role": "assistant", "content": [
                    {"toolUse": {"toolUseId": "call_1", "name": "look", "input": {"zoom": 2}}}
                ]},
                {"role": "user", "content": [
                    {"toolResult": {"toolUseId": "call_1", "content": [{"text": "a cat"}], "status": "success"}},
                    {"text": "and now?"}
                ]}
            ],
            "system": [{"text": "be brief"}],
            "inferenceConfig": {"maxTokens": 100, "temperature": 0.5, "topP": 0.9, "stopSequences": ["END"]},
            "toolConfig": {
                "tools": [{"toolSpec": {"name": "look", "description": "Look closer",
                    "inputSchema": {"json": {"type":"object","properties":{"zoom":{"type":"integer"}}}}}}],
                "toolChoice": {"tool": {"name": "look"}}
            }
        })
    );
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one case per tool choice, document and refusal, each checked the same way"
)]
fn tool_choices_errors_documents_and_refusals() {
    let tool = Tool {
        name: "f".into(),
        description: None,
        parameters: Value::Null,
        strict: None,
        origin: Default::default(),
    };
    let base = Request {
        messages: vec![user(vec![Part::Text("hi".into())])],
        tools: vec![tool],
        ..Request::default()
    };
    for (choice, want) in [
        (Some(ToolChoice::Auto), Some(json!({"auto": {}}))),
        (Some(ToolChoice::Required), Some(json!({"any": {}}))),
        (None, None),
    ] {
        let v = encode(&Request {
            tool_choice: choice.clone(),
            ..base.clone()
        });
        assert_eq!(
            v["toolConfig"].get("toolChoice"),
            want.as_ref(),
            "{choice:?}"
        );
        assert_eq!(
            v["toolConfig"]["tools"][0]["toolSpec"]["inputSchema"]["json"],
            json!({"type": "object", "properties": {}})
        );
    }
    // `none` without tool blocks in the history: no tools at all.
    let v = encode(&Request {
        tool_choice: Some(ToolChoice::None),
        ..base.clone()
    });
    assert!(v.get("toolConfig").is_none(), "{v}");

    // A failed tool call; a PDF with a title Converse would refuse as a name.
    let v = encode(&Request {
        messages: vec![user(vec![
            Part::ToolResult {
                call_id: "t1".into(),
                content: vec![],
                is_error: true,
            },
            Part::Document {
                source: Source::Base64 {
                    media_type: "application/pdf".into(),
                    data: "JVBER".into(),
                },
                title: Some("q3_report.pdf".into()),
            },
        ])],
        ..Request::default()
    });
    assert_eq!(
        v["messages"][0]["content"],
        json!([
            {"toolResult": {"toolUseId": "t1", "content": [{"json": {}}], "status": "error"}},
            {"document": {"format": "pdf", "name": "q3 report pdf", "source": {"bytes": "JVBER"}}}
        ])
    );

    let refused = |req: Request, field: &str| {
        let e = encode_request(&req, &opts()).unwrap_err();
        assert!(e.is_client_error(), "{e}");
        assert_eq!(e.field(), Some(field), "{e}");
    };
    refused(
        Request {
            messages: vec![user(vec![Part::Image(Source::Url(
                "https://x/y.png".into(),
            ))])],
            ..Request::default()
        },
        "messages[0].content[0]",
    );
    refused(
        Request {
            messages: vec![user(vec![Part::Image(Source::Base64 {
                media_type: "image/tiff".into(),
                data: "AA".into(),
            })])],
            ..Request::default()
        },
        "messages[0].content[0]",
    );
    refused(Request::default(), "messages");

    // Call ids Converse would refuse are rewritten, alike in the call and its result.
    let long = format!("call:{}", "x".repeat(80));
    let v = encode(&Request {
        messages: vec![
            user(vec![Part::Text("go".into())]),
            Message {
                role: Role::Assistant,
                parts: vec![Part::ToolCall(ToolCall {
                    id: long.clone(),
                    name: "f".into(),
                    arguments: String::new(),
                })],
            },
            user(vec![Part::ToolResult {
                call_id: long,
                content: vec![Part::Text("ok".into())],
                is_error: false,
            }]),
        ],
        temperature: Some(1.7),
        ..base.clone()
    });
    let id = v["messages"][1]["content"][0]["toolUse"]["toolUseId"]
        .as_str()
        .expect("id");
    assert_eq!(id.len(), 64, "{id}");
    assert!(id.starts_with("call_xxx"), "{id}");
    assert_eq!(
        v["messages"][1]["content"][0]["toolUse"]["input"],
        json!({})
    );
    assert_eq!(
        v["messages"][2]["content"][0]["toolResult"]["toolUseId"],
        id
    );
    assert_eq!(v["inferenceConfig"]["temperature"], 1.0);
}

#[test]
fn response_golden_decode() {
    let body = br#"{"output":{"message":{"role":"assistant","content":[
        {"reasoningContent":{"reasoningText":{"text":"think","signature":"sig"}}},
        {"text":"Let me look."},
        {"toolUse":{"toolUseId":"tooluse_abc","name":"look","input":{"zoom":2}}}]}},
        "stopReason":"tool_use",
        "usage":{"inputTokens":10,"outputTokens":7,"totalTokens":27,"cacheReadInputTokens":8,"cacheWriteInputTokens":2},
        "metrics":{"latencyMs":321}}"#;
    let r = decode_response(body, 1_700_000_000).expect("decodes");
    assert!(r.id.starts_with("converse-"), "{}", r.id);
    assert_eq!(r.created, 1_700_000_000);
    assert_eq!(
        r.output,
        vec![
            OutputItem::Reasoning {
                text: "think".into(),
                signature: Some("sig".into())
            },
            OutputItem::Text("Let me look.".into()),
            OutputItem::ToolCall(ToolCall {
                id: "tooluse_abc".into(),
                name: "look".into(),
                arguments: r#"{"zoom":2}"#.into()
            }),
        ]
    );
    assert_eq!(r.stop_reason, StopReason::ToolUse);
    assert_eq!(
        (
            r.usage.input_tokens,
            r.usage.output_tokens,
            r.usage.cache_read_tokens,
            r.usage.cache_write_tokens
        ),
        (20, 7, 8, 2)
    );
    for (wire, want) in [
        ("end_turn", StopReason::EndTurn),
        ("max_tokens", StopReason::MaxTokens),
        ("stop_sequence", StopReason::StopSequence),
        ("guardrail_intervened", StopReason::ContentFilter),
        ("content_filtered", StopReason::ContentFilter),
        ("model_context_window_exceeded", StopReason::MaxTokens),
    ] {
        assert_eq!(stop_from_wire(wire), want, "{wire}");
    }
    assert!(decode_response(b"{}", 0).is_err());
    assert!(decode_response(b"<html>", 0).is_err());
    // The usage of a body, as metering reads it.
    let mut u = crate::protocol::Usage::default();
    assert!(crate::protocol::merge_chunk_usage(
        super::super::UpstreamDialect::Converse,
        body,
        &mut u
    ));
    assert_eq!((u.input_tokens, u.cache_read_tokens), (20, 8));
}

/// A ConverseStream answer with reasoning, text and a tool call, as SSE after the framing
/// decoder.
fn stream_events() -> Vec<(&'static str, &'static str)> {
    vec![
        ("messageStart", r#"{"role":"assistant","p":"abc"}"#),
        (
            "contentBlockDelta",
            r#"{"contentBlockIndex":0,"delta":{"reasoningContent":{"text":"hmm"}}}"#,
        ),
        (
            "contentBlockDelta",
            r#"{"contentBlockIndex":0,"delta":{"reasoningContent":{"signature":"sig"}}}"#,
        ),
        ("contentBlockStop", r#"{"contentBlockIndex":0}"#),
        (
            "contentBlockDelta",
            r#"{"contentBlockIndex":1,"delta":{"text":"Hé"}}"#,
        ),
        (
            "contentBlockDelta",
            r#"{"contentBlockIndex":1,"delta":{"text":"llo"}}"#,
        ),
        ("contentBlockStop", r#"{"contentBlockIndex":1}"#),
        (
            "contentBlockStart",
            r#"{"contentBlockIndex":2,"start":{"toolUse":{"toolUseId":"tooluse_1","name":"look"}}}"#,
        ),
        (
            "contentBlockDelta",
            r#"{"contentBlockIndex":2,"delta":{"toolUse":{"input":"{\"zoom\""}}}"#,
        ),
        (
            "contentBlockDelta",
            r#"{"contentBlockIndex":2,"delta":{"toolUse":{"input":":2}"}}}"#,
        ),
        ("contentBlockStop", r#"{"contentBlockIndex":2}"#),
        ("messageStop", r#"{"stopReason":"tool_use"}"#),
        (
            "metadata",
            r#"{"usage":{"inputTokens":5,"outputTokens":9,"totalTokens":14,"cacheReadInputTokens":3},"metrics":{"latencyMs":40}}"#,
        ),
    ]
}

#[test]
fn stream_events_become_canonical_events() {
    let mut d = StreamDecoder::new();
    let mut seen: Vec<String> = Vec::new();
    for (name, data) in stream_events() {
        d.decode(Some(name), data.as_bytes(), &mut |ev: &StreamEvent<'_>| {
            seen.push(match ev {
                StreamEvent::Start { id, .. } => {
                    assert!(id.starts_with("converse-"));
                    "start".into()
                }
                StreamEvent::TextDelta(t) => format!("text {t}"),
                StreamEvent::ReasoningDelta(t) => format!("reasoning {t}"),
                StreamEvent::ReasoningSignature(s) => format!("signature {s}"),
                StreamEvent::ToolCallStart { index, id, name } => {
                    format!("call {index} {id} {name}")
                }
                StreamEvent::ToolArgumentsDelta { index, fragment } => {
                    format!("args {index} {fragment}")
                }
                StreamEvent::Usage(u) => format!(
                    "usage {} {} {}",
                    u.input_tokens, u.output_tokens, u.cache_read_tokens
                ),
                StreamEvent::Stop { reason, .. } => format!("stop {reason:?}"),
                StreamEvent::End => "end".into(),
            });
            Ok(())
        })
        .expect("decodes");
    }
    assert_eq!(
        seen,
        [
            "start",
            "reasoning hmm",
            "signature sig",
            "text Hé",
            "text llo",
            "call 0 tooluse_1 look",
            r#"args 0 {"zoom""#,
            "args 0 :2}",
            "stop ToolUse",
            "usage 8 9 3",
            "end",
        ]
    );
}

#[test]
fn stream_errors_are_upstream_errors() {
    let mut d = StreamDecoder::new();
    let err = d
        .decode(
            Some("error"),
            br#"{"type":"error","error":{"type":"rate_limit_error","message":"throttlingException: slow down"}}"#,
            &mut |_: &StreamEvent<'_>| Ok(()),
        )
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RateLimit);
    assert_eq!(err.message(), "throttlingException: slow down");
    let err = d
        .decode(
            Some("contentBlockDelta"),
            br#"{"contentBlockIndex":4,"delta":{"toolUse":{"input":"{}"}}}"#,
            &mut |_: &StreamEvent<'_>| Ok(()),
        )
        .unwrap_err();
    assert!(matches!(err, ProtocolError::InvalidUpstream(_)), "{err}");
}

/// The stream through each client dialect's encoder: text, the tool call, the stop and the
/// usage come out in the client's terms.
#[test]
fn every_client_dialect_gets_the_converse_stream() {
    let opts = StreamOptions {
        model: "acme/nova".into(),
        created: 1,
        include_usage: true,
        echo: Default::default(),
        clock: || 2,
    };
    for client in [
        ClientDialect::ChatCompletions,
        ClientDialect::Messages,
        ClientDialect::Responses,
    ] {
        let mut t = StreamTranslator::new(super::super::UpstreamDialect::Converse, client, &opts)
            .expect("translates");
        let mut out = BytesMut::new();
        for (name, data) in stream_events() {
            t.on_event(Some(name), data.as_bytes(), &mut out)
                .expect("translates");
        }
        assert!(t.is_finished(), "{client:?}");
        assert_eq!(t.usage().input_tokens, 8, "{client:?}");
        let text = String::from_utf8(out.to_vec()).expect("UTF-8");
        assert!(text.contains("acme/nova"), "{client:?}: {text}");
        assert!(text.contains("tooluse_1"), "{client:?}: {text}");
        let (stop, done) = match client {
            ClientDialect::ChatCompletions => ("\"finish_reason\":\"tool_calls\"", "data: [DONE]"),
            ClientDialect::Messages => ("\"stop_reason\":\"tool_use\"", "event: message_stop"),
            _ => ("\"type\":\"function_call\"", "response.completed"),
        };
        assert!(text.contains(stop), "{client:?}: {text}");
        assert!(text.contains(done), "{client:?}: {text}");
        assert!(text.contains("llo"), "{client:?}: {text}");
    }
}

/// A history with a tool call and its result: a summarising turn without `tools`, the same
/// turn with `tool_choice: none` and the tools, and one with the tools and `auto`.
fn tool_history(tools: Vec<Tool>, tool_choice: Option<ToolChoice>) -> Request {
    Request {
        messages: vec![
            user(vec![Part::Text("weather and time in Paris?".into())]),
            Message {
                role: Role::Assistant,
                parts: vec![
                    Part::ToolCall(ToolCall {
                        id: "call_1".into(),
                        name: "get_weather".into(),
                        arguments: r#"{"city":"Paris"}"#.into(),
                    }),
                    Part::ToolCall(ToolCall {
                        id: "call_2".into(),
                        name: "get_time".into(),
                        arguments: "{}".into(),
                    }),
                    Part::ToolCall(ToolCall {
                        id: "call_3".into(),
                        name: "get_weather".into(),
                        arguments: r#"{"city":"Lyon"}"#.into(),
                    }),
                ],
            },
            user(vec![
                Part::ToolResult {
                    call_id: "call_1".into(),
                    content: vec![Part::Text("sunny".into())],
                    is_error: false,
                },
                Part::ToolResult {
                    call_id: "call_2".into(),
                    content: vec![Part::Text("noon".into())],
                    is_error: false,
                },
                Part::ToolResult {
                    call_id: "call_3".into(),
                    content: vec![Part::Text("rain".into())],
                    is_error: false,
                },
                Part::Text("Summarise the conversation.".into()),
            ]),
        ],
        tools,
        tool_choice,
        ..Request::default()
    }
}

#[test]
fn tool_history_without_tools_gets_a_synthesized_tool_config() {
    let permissive = json!({"json": {"type": "object", "properties": {}}});
    // No tools offered (a summarising or compaction turn): one spec per tool the history
    // names, in order of first use, and no toolChoice.
    let v = encode(&tool_history(vec![], None));
    assert_eq!(
        v["toolConfig"],
        json!({"tools": [
            {"toolSpec": {"name": "get_weather", "inputSchema": permissive}},
            {"toolSpec": {"name": "get_time", "inputSchema": permissive}}
        ]}),
        "{v}"
    );

    // `tool_choice: none` with tools: Converse has no `none`, so the toolConfig the history
    // needs lists only the tools the history names (the request's own definition where it
    // has one), without a toolChoice; the drop of `none` is recorded.
    let weather = Tool {
        name: "get_weather".into(),
        description: Some("Weather of a city".into()),
        parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
        strict: None,
        origin: Default::default(),
    };
    let unused = Tool {
        name: "send_mail".into(),
        parameters: json!({"type": "object"}),
        ..Tool::default()
    };
    let req = tool_history(
        vec![weather.clone(), unused.clone()],
        Some(ToolChoice::None),
    );
    let v = encode(&req);
    assert_eq!(
        v["toolConfig"],
        json!({"tools": [
            {"toolSpec": {"name": "get_weather", "description": "Weather of a city",
                "inputSchema": {"json": {"type": "object", "properties": {"city": {"type": "string"}}}}}},
            {"toolSpec": {"name": "get_time", "inputSchema": permissive}}
        ]}),
        "{v}"
    );
    let dropped =
        crate::protocol::dropped_toward(crate::protocol::UpstreamDialect::Converse, &req, &opts());
    assert_eq!(
        dropped.iter().map(|d| d.field.as_str()).collect::<Vec<_>>(),
        ["tool_choice"],
        "{dropped:?}"
    );
    // Without tool blocks, `none` leaves the tools out: nothing is dropped.
    let plain = Request {
        messages: vec![user(vec![Part::Text("hi".into())])],
        tools: vec![weather.clone()],
        tool_choice: Some(ToolChoice::None),
        ..Request::default()
    };
    assert!(encode(&plain).get("toolConfig").is_none());
    assert!(crate::protocol::dropped_toward(
        crate::protocol::UpstreamDialect::Converse,
        &plain,
        &opts()
    )
    .is_empty());

    // Tools offered with another choice: the client's tools as they are.
    let v = encode(&tool_history(vec![weather, unused], Some(ToolChoice::Auto)));
    let names: Vec<&str> = v["toolConfig"]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["toolSpec"]["name"].as_str())
        .collect();
    assert_eq!(names, ["get_weather", "send_mail"], "{v}");
    assert_eq!(v["toolConfig"]["toolChoice"], json!({"auto": {}}));
}

#[test]
fn structured_output_goes_as_output_config_text_format() {
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let base = Request {
        messages: vec![user(vec![Part::Text("hi".into())])],
        ..Request::default()
    };
    let v = encode(&Request {
        response_format: Some(ResponseFormat::JsonSchema {
            name: "numbers".into(),
            schema: schema.clone(),
            strict: Some(true),
            description: Some("Some numbers.".into()),
        }),
        ..base.clone()
    });
    // Bedrock takes the schema as a JSON string.
    assert_eq!(
        v["outputConfig"],
        json!({"textFormat": {"type": "json_schema", "structure": {"jsonSchema": {
            "schema": schema.to_string(), "name": "numbers", "description": "Some numbers."}}}}),
        "{v}"
    );
    // JSON mode has no Converse counterpart: left out (recorded by `dropped_toward`).
    let req = Request {
        response_format: Some(ResponseFormat::JsonObject),
        source: Some(ClientDialect::ChatCompletions),
        ..base
    };
    let v = encode(&req);
    assert!(v.get("outputConfig").is_none(), "{v}");
    let dropped =
        crate::protocol::dropped_toward(crate::protocol::UpstreamDialect::Converse, &req, &opts());
    assert_eq!(dropped.len(), 1, "{dropped:?}");
    assert_eq!(dropped[0].field, "response_format");
}
