//! Golden bodies of the Gemini converters.

use serde_json::{json, Value};

use super::super::{
    Message, OutputItem, Part, Request, ResponseFormat, Role, Source, StopReason, StreamEvent,
    Tool, ToolCall, ToolChoice, UpstreamOptions, Usage,
};
use super::*;

fn opts() -> UpstreamOptions<'static> {
    UpstreamOptions {
        model: "gemini-2.5-flash",
        default_max_tokens: 4096,
        stream_usage: true,
        placement: crate::protocol::ModelPlacement::Body,
        thinking: None,
    }
}

fn encode(req: &Request) -> Value {
    serde_json::from_slice(&encode_request(req, &opts()).expect("encodes")).expect("JSON")
}

#[test]
fn request_golden_body() {
    let req = Request {
        model: "acme/g".into(),
        system: vec!["be brief".into()],
        messages: vec![
            Message {
                role: Role::User,
                parts: vec![
                    Part::Text("what is here?".into()),
                    Part::Image(Source::Base64 {
                        media_type: "image/png".into(),
                        data: "iVBORw0K".into(),
                    }),
                ],
            },
            Message {
                role: Role::Assistant,
                parts: vec![Part::ToolCall(ToolCall {
                    id: "call_1".into(),
                    name: "look".into(),
                    arguments: r#"{"zoom":2}"#.into(),
                })],
            },
            Message {
                role: Role::User,
                parts: vec![Part::ToolResult {
                    call_id: "call_1".into(),
                    content: vec![Part::Text("a cat".into())],
                    is_error: false,
                }],
            },
        ],
        tools: vec![Tool {
            name: "look".into(),
            description: Some("Look closer".into()),
            parameters: json!({"type":"object","properties":{"zoom":{"type":"integer"}}}),
            strict: None,
            origin: Default::default(),
        }],
        tool_choice: Some(ToolChoice::Function("look".into())),
        max_output_tokens: Some(100),
        temperature: Some(0.5),
        top_p: Some(0.9),
        stop: vec!["END".into()],
        response_format: Some(ResponseFormat::JsonObject),
        ..Request::default()
    };
    assert_eq!(
        encode(&req),
        json!({
            "contents": [
                {"role": "user", "parts": [
                    {"text": "what is here?"},
                    {"inlineData": {"mimeType": "image/png", "data": "iVBORw0K"}}
                ]},
                {"role": "model", "parts": [{"functionCall": {"name": "look", "args": {"zoom": 2}}}]},
                {"role": "user", "parts": [
                    {"functionResponse": {"name": "look", "response": {"output": "a cat"}}}
                ]}
            ],
            "systemInstruction": {"parts": [{"text": "be brief"}]},
            "tools": [{"functionDeclarations": [{
                "name": "look",
                "description": "Look closer",
                "parametersJsonSchema": {"type":"object","properties":{"zoom":{"type":"integer"}}}
            }]}],
            "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["look"]}},
            "generationConfig": {
                "maxOutputTokens": 100,
                "temperature": 0.5,
                "topP": 0.9,
                "stopSequences": ["END"],
                "responseMimeType": "application/json"
            }
        })
    );
}

#[test]
fn refused_and_error_results() {
    let url = Request {
        messages: vec![Message {
            role: Role::User,
            parts: vec![Part::Image(Source::Url("https://x/y.png".into()))],
        }],
        ..Request::default()
    };
    let e = encode_request(&url, &opts()).unwrap_err();
    assert_eq!(e.field(), Some("messages[0].content[0]"));
    let orphan = Request {
        messages: vec![Message {
            role: Role::User,
            parts: vec![Part::ToolResult {
                call_id: "nope".into(),
                content: vec![],
                is_error: false,
            }],
        }],
        ..Request::default()
    };
    assert!(encode_request(&orphan, &opts())
        .unwrap_err()
        .is_client_error());
    let failed = Request {
        messages: vec![
            Message {
                role: Role::Assistant,
                parts: vec![Part::ToolCall(ToolCall {
                    id: "c".into(),
                    name: "f".into(),
                    arguments: "{}".into(),
                })],
            },
            Message {
                role: Role::User,
                parts: vec![Part::ToolResult {
                    call_id: "c".into(),
                    content: vec![Part::Text("boom".into())],
                    is_error: true,
                }],
            },
        ],
        ..Request::default()
    };
    assert_eq!(
        encode(&failed)["contents"][1]["parts"][0]["functionResponse"]["response"],
        json!({"error": "boom"})
    );
}

#[test]
fn response_golden_decode() {
    let body = br#"{"candidates": [{"content": {"parts": [{"text": "thinking...", "thought": true},{"text": "Hi "},{"text": "there"},{"functionCall": {"name": "look","args": {"zoom": 3}}}],"role": "model"},"finishReason": "STOP","index": 0}],"usageMetadata": {"promptTokenCount": 12,"candidatesTokenCount": 5,"totalTokenCount": 21,"cachedContentTokenCount": 4,"thoughtsTokenCount": 4},"modelVersion": "gemini-2.5-flash","responseId": "resp-1"}"#;
    let r = decode_response(body, 7).expect("decodes");
    assert_eq!(r.id, "resp-1");
    assert_eq!(r.model, "gemini-2.5-flash");
    assert_eq!(r.created, 7);
    assert_eq!(r.stop_reason, StopReason::ToolUse);
    assert_eq!(
        r.usage,
        Usage {
            input_tokens: 12,
            output_tokens: 9,
            cache_read_tokens: 4,
            cache_write_tokens: 0,
            reasoning_tokens: 4,
        }
    );
    assert_eq!(r.output.len(), 4);
    assert_eq!(
        r.output[0],
        OutputItem::Reasoning {
            text: "thinking...".into(),
            signature: None
        }
    );
    assert_eq!(r.output[1], OutputItem::Text("Hi ".into()));
    match &r.output[3] {
        OutputItem::ToolCall(c) => {
            assert_eq!(c.name, "look");
            assert_eq!(c.arguments, r#"{"zoom":3}"#);
            assert!(c.id.starts_with("call_"), "{}", c.id);
        }
        o => panic!("{o:?}"),
    }
    for (wire, stop) in [
        ("MAX_TOKENS", StopReason::MaxTokens),
        ("SAFETY", StopReason::ContentFilter),
        ("RECITATION", StopReason::ContentFilter),
        ("STOP", StopReason::EndTurn),
        ("OTHER", StopReason::EndTurn),
    ] {
        assert_eq!(stop_from_wire(wire, false), stop, "{wire}");
    }
    let blocked = br#"{"promptFeedback": {"blockReason": "SAFETY"},"usageMetadata": {"promptTokenCount": 3}}"#;
    let r = decode_response(blocked, 0).expect("decodes");
    assert_eq!(r.stop_reason, StopReason::ContentFilter);
    assert!(r.output.is_empty());
}

#[test]
fn google_errors_map_to_kinds() {
    use super::super::ErrorKind;
    for (status, name, kind) in [
        (429, "RESOURCE_EXHAUSTED", ErrorKind::RateLimit),
        (503, "UNAVAILABLE", ErrorKind::Overloaded),
        (400, "INVALID_ARGUMENT", ErrorKind::InvalidRequest),
        (403, "PERMISSION_DENIED", ErrorKind::Permission),
        (500, "INTERNAL", ErrorKind::Api),
        (504, "DEADLINE_EXCEEDED", ErrorKind::Timeout),
    ] {
        let body = format!(
            r#"{{"error": {{"code": {status},"message": "m {name}","status": "{name}"}}}}"#
        );
        assert_eq!(
            decode_error_body(status, body.as_bytes()),
            Some((kind, format!("m {name}"))),
            "{name}"
        );
    }
    assert!(decode_error_body(502, b"<html>").is_none());
}

#[test]
fn stream_chunks_become_canonical_events() {
    let mut d = StreamDecoder::new();
    let mut seen: Vec<String> = Vec::new();
    let chunks: [&[u8]; 3] = [
        br#"{"candidates": [{"content": {"parts": [{"text": "Hel"}],"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": 5,"candidatesTokenCount": 1,"totalTokenCount": 6},"modelVersion": "gemini-2.5-flash","responseId": "r1"}"#,
        br#"{"candidates": [{"content": {"parts": [{"functionCall": {"name": "f","args": {"a": 1}}}],"role": "model"},"index": 0}],"modelVersion": "gemini-2.5-flash","responseId": "r1"}"#,
        br#"{"candidates": [{"content": {"parts": [{"text": ""}],"role": "model"},"finishReason": "STOP","index": 0}],"usageMetadata": {"promptTokenCount": 5,"candidatesTokenCount": 3,"totalTokenCount": 8},"modelVersion": "gemini-2.5-flash","responseId": "r1"}"#,
    ];
    for c in chunks {
        d.decode(None, c, &mut |ev: &StreamEvent<'_>| {
            seen.push(match ev {
                StreamEvent::Start { id, model, usage } => {
                    format!("start {id} {model} {}", usage.input_tokens)
                }
                StreamEvent::TextDelta(t) => format!("text {t}"),
                StreamEvent::ToolCallStart { index, name, id } => {
                    assert!(id.starts_with("call_"));
                    format!("call {index} {name}")
                }
                StreamEvent::ToolArgumentsDelta { index, fragment } => {
                    format!("args {index} {fragment}")
                }
                StreamEvent::Usage(u) => format!("usage {} {}", u.input_tokens, u.output_tokens),
                StreamEvent::Stop { reason, .. } => format!("stop {reason:?}"),
                other => format!("{other:?}"),
            });
            Ok(())
        })
        .expect("decodes");
    }
    assert_eq!(
        seen,
        [
            "start r1 gemini-2.5-flash 5",
            "text Hel",
            "usage 5 1",
            "call 0 f",
            r#"args 0 {"a":1}"#,
            "usage 5 3",
            "stop ToolUse",
        ]
    );
    let err = d
        .decode(
            None,
            br#"{"error": {"code": 503,"message": "The model is overloaded.","status": "UNAVAILABLE"}}"#,
            &mut |_: &StreamEvent<'_>| Ok(()),
        )
        .unwrap_err();
    assert_eq!(err.kind(), super::super::ErrorKind::Overloaded);
    assert_eq!(err.message(), "The model is overloaded.");
}

#[test]
fn thought_signatures_travel_in_the_call_id_and_come_back() {
    let sig = "CiQBjz1rX+/a9w==";
    let id = call_id(2, None, Some(sig));
    assert!(id.starts_with("call_") && !id.contains('+') && !id.contains('/') && !id.contains('='));
    assert!(
        id.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
        "{id}"
    );
    assert_eq!(signature_of(&id).as_deref(), Some(sig));
    assert_eq!(call_id(0, Some("fc-1"), None), "fc-1");
    assert!(signature_of(&call_id(0, None, None)).is_none());
    for other in [
        "call_abc",
        "toolu_01",
        "call_0123456789abcdef_x_sig",
        "call_0123456789abcdef_1_a+b",
    ] {
        assert!(signature_of(other).is_none(), "{other}");
    }
    let body = br#"{"candidates": [{"content": {"parts": [{"functionCall": {"name": "f","args": {}},"thoughtSignature": "CiQBjz1rX+/a9w=="}],"role": "model"},"finishReason": "STOP"}]}"#;
    let r = decode_response(body, 0).expect("decodes");
    let OutputItem::ToolCall(c) = &r.output[0] else {
        panic!("{:?}", r.output)
    };
    let req = Request {
        messages: vec![
            Message {
                role: Role::Assistant,
                parts: vec![Part::ToolCall(c.clone())],
            },
            Message {
                role: Role::User,
                parts: vec![Part::ToolResult {
                    call_id: c.id.clone(),
                    content: vec![Part::Text("{\"ok\":true}".into())],
                    is_error: false,
                }],
            },
        ],
        ..Request::default()
    };
    let v = encode(&req);
    assert_eq!(
        v["contents"][0]["parts"][0],
        json!({"functionCall": {"name": "f", "args": {}}, "thoughtSignature": sig})
    );
    assert_eq!(
        v["contents"][1]["parts"][0]["functionResponse"],
        json!({"name": "f", "response": {"ok": true}})
    );
}
