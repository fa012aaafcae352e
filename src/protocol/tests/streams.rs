//! Golden streams: exact client bytes for the main directions, and the same
//! output whatever the upstream byte split (every byte boundary, so every
//! cut inside a token, a JSON string and a multi-byte UTF-8 character).

use bytes::BytesMut;

use super::fixtures::{chat_stream, messages_stream, Scenario, ALL};
use super::{frames, opts, translate};
use crate::protocol::{heartbeat, ClientDialect, ProtocolError, StreamTranslator, UpstreamDialect};

#[test]
fn every_byte_split_gives_the_same_output() {
    for (up, client) in [
        (UpstreamDialect::Messages, ClientDialect::ChatCompletions),
        (UpstreamDialect::Messages, ClientDialect::Responses),
        (UpstreamDialect::ChatCompletions, ClientDialect::Messages),
        (UpstreamDialect::ChatCompletions, ClientDialect::Responses),
    ] {
        for s in ALL {
            let wire = match up {
                UpstreamDialect::ChatCompletions => chat_stream(s),
                _ => messages_stream(s),
            };
            let whole = translate(up, client, wire.as_bytes(), 0, true);
            for piece in 1..=3 {
                assert_eq!(
                    translate(up, client, wire.as_bytes(), piece, true),
                    whole,
                    "{up:?}->{client:?} {s:?} piece {piece}"
                );
            }
            // Cut exactly inside each multi-byte character.
            let bytes = wire.as_bytes();
            for (i, b) in bytes.iter().enumerate() {
                if *b >= 0xC0 {
                    let mut t = StreamTranslator::new(up, client, &opts(true)).unwrap();
                    let mut norm = crate::sse::SseNormalizer::new(1 << 20);
                    let mut out = BytesMut::new();
                    for part in [&bytes[..=i], &bytes[i + 1..]] {
                        norm.push(part).unwrap();
                        while let Some(ev) = norm.next_event() {
                            let data = ev.data().unwrap();
                            if let Err(e) = t.on_event(ev.event_name(), &data, &mut out) {
                                t.error(e.kind(), &e.to_string(), &mut out);
                            }
                        }
                    }
                    assert_eq!(out.to_vec(), whole, "cut inside UTF-8 at {i}");
                }
            }
        }
    }
}

#[test]
fn messages_to_chat_golden_bytes() {
    let out = translate(
        UpstreamDialect::Messages,
        ClientDialect::ChatCompletions,
        messages_stream(Scenario::Text).as_bytes(),
        0,
        false,
    );
    let head = r#"data: {"id":"chatcmpl-msg_up1","object":"chat.completion.chunk","created":1700000000,"model":"house-model","choices":[{"index":0,"delta":"#;
    let want = [
        format!("{head}{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"),
        format!("{head}{{\"content\":\"Hel\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"),
        format!("{head}{{\"content\":\"lo, wö\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"),
        format!("{head}{{\"content\":\"rld 🦀\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"),
        format!("{head}{{\"content\":\"!\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"),
        format!("{head}{{}},\"logprobs\":null,\"finish_reason\":\"stop\"}}]}}\n\n"),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    assert_eq!(String::from_utf8(out).unwrap(), want);
}

#[test]
fn chat_to_messages_golden_bytes() {
    let out = translate(
        UpstreamDialect::ChatCompletions,
        ClientDialect::Messages,
        chat_stream(Scenario::Tool).as_bytes(),
        0,
        true,
    );
    let d = |i: u32, delta: &str| {
        format!("event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":{i},\"delta\":{delta}}}\n\n")
    };
    let want = [
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_chatcmpl-up1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"house-model\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":0,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":0,\"output_tokens\":0}}}\n\n".to_owned(),
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n".to_owned(),
        d(0, r#"{"type":"text_delta","text":"Let me check."}"#),
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n".to_owned(),
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"call_1\",\"name\":\"get_weather\",\"input\":{}}}\n\n".to_owned(),
        d(1, r#"{"type":"input_json_delta","partial_json":"{\"ci"}"#),
        d(1, r#"{"type":"input_json_delta","partial_json":"ty\": \"Paris\"}"}"#),
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n".to_owned(),
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":2,\"content_block\":{\"type\":\"tool_use\",\"id\":\"call_2\",\"name\":\"get_time\",\"input\":{}}}\n\n".to_owned(),
        d(2, r#"{"type":"input_json_delta","partial_json":"{\"tz\":"}"#),
        d(2, r#"{"type":"input_json_delta","partial_json":"\"CET\"}"}"#),
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":2}\n\n".to_owned(),
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"input_tokens\":20,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":10,\"output_tokens\":12}}\n\n".to_owned(),
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n".to_owned(),
    ]
    .concat();
    assert_eq!(String::from_utf8(out).unwrap(), want);
}

#[test]
fn chat_to_responses_event_sequence() {
    let out = translate(
        UpstreamDialect::ChatCompletions,
        ClientDialect::Responses,
        chat_stream(Scenario::Tool).as_bytes(),
        0,
        false,
    );
    let names: Vec<String> = frames(&out).into_iter().map(|f| f.0.unwrap()).collect();
    let want = [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ];
    assert_eq!(names, want);
    let fr = frames(&out);
    assert_eq!(
        fr[0].1["response"]["id"],
        "resp_00000000000000000000000000000000"
    );
    assert_eq!(fr[0].1["response"]["status"], "in_progress");
    assert_eq!(fr[0].1["response"]["model"], "house-model");
    assert_eq!(
        fr[11].1,
        serde_json::json!({"type": "response.function_call_arguments.done", "sequence_number": 11,
            "item_id": "fc_call_1", "output_index": 1, "arguments": "{\"city\": \"Paris\"}"})
    );
    let done = &fr[18].1["response"];
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"][2]["call_id"], "call_2");
    assert_eq!(done["output"][2]["arguments"], "{\"tz\":\"CET\"}");
}

#[test]
fn max_tokens_stream_is_incomplete_for_responses() {
    let wire = messages_stream(Scenario::Text).replace("end_turn", "max_tokens");
    let out = translate(
        UpstreamDialect::Messages,
        ClientDialect::Responses,
        wire.as_bytes(),
        0,
        true,
    );
    let last = frames(&out).pop().unwrap();
    assert_eq!(last.0.as_deref(), Some("response.incomplete"));
    assert_eq!(
        last.1["response"]["incomplete_details"],
        serde_json::json!({"reason": "max_output_tokens"})
    );
}

#[test]
fn upstream_error_event_maps_to_client_error_frames() {
    let mut t = StreamTranslator::new(
        UpstreamDialect::Messages,
        ClientDialect::ChatCompletions,
        &opts(false),
    )
    .unwrap();
    let mut out = BytesMut::new();
    let e = t
        .on_event(
            Some("error"),
            br#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#,
            &mut out,
        )
        .unwrap_err();
    assert_eq!(
        e,
        ProtocolError::Upstream {
            kind: crate::protocol::ErrorKind::RateLimit,
            message: "slow down".into()
        }
    );
    t.error(e.kind(), "slow down", &mut out);
    assert_eq!(
        String::from_utf8(out.to_vec()).unwrap(),
        "event: error\ndata: {\"error\":{\"message\":\"slow down\",\"type\":\"rate_limit_error\",\"param\":null,\"code\":\"rate_limit_error\"}}\n\n"
    );
    assert!(t.is_finished());
    // Messages clients get Anthropic's shape.
    let mut t = StreamTranslator::new(
        UpstreamDialect::ChatCompletions,
        ClientDialect::Messages,
        &opts(false),
    )
    .unwrap();
    let mut out = BytesMut::new();
    t.error(crate::protocol::ErrorKind::Overloaded, "busy", &mut out);
    assert_eq!(
        String::from_utf8(out.to_vec()).unwrap(),
        "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"busy\"}}\n\n"
    );
}

#[test]
fn same_dialect_is_not_translated_and_heartbeats_are_per_dialect() {
    assert!(StreamTranslator::new(
        UpstreamDialect::Messages,
        ClientDialect::Messages,
        &opts(true)
    )
    .is_none());
    // A Responses upstream (refused here at run time before) is no `UpstreamDialect`.
    assert_eq!(
        heartbeat(ClientDialect::Messages),
        b"event: ping\ndata: {\"type\":\"ping\"}\n\n"
    );
    assert_eq!(
        heartbeat(ClientDialect::ChatCompletions),
        b": keepalive\n\n"
    );
}

#[test]
fn garbage_upstream_data_is_an_upstream_fault() {
    let mut t = StreamTranslator::new(
        UpstreamDialect::ChatCompletions,
        ClientDialect::Messages,
        &opts(true),
    )
    .unwrap();
    let mut out = BytesMut::new();
    let e = t.on_event(None, b"{not json", &mut out).unwrap_err();
    assert!(matches!(e, ProtocolError::InvalidUpstream(_)));
    assert!(!e.is_client_error());
    assert_eq!(e.status(), 502);
}

#[test]
fn content_events_count_generated_output_only() {
    let mut t = StreamTranslator::new(
        UpstreamDialect::Messages,
        ClientDialect::ChatCompletions,
        &opts(false),
    )
    .unwrap();
    let mut norm = crate::sse::SseNormalizer::new(1 << 20);
    let mut out = BytesMut::new();
    norm.push(messages_stream(Scenario::Tool).as_bytes())
        .unwrap();
    let mut seen_first_at = None;
    let mut n = 0;
    while let Some(ev) = norm.next_event() {
        n += 1;
        t.on_event(ev.event_name(), &ev.data().unwrap(), &mut out)
            .unwrap();
        if seen_first_at.is_none() && t.content_events() > 0 {
            seen_first_at = Some(n);
        }
    }
    // message_start, content_block_start, then the first text_delta (event 3).
    assert_eq!(seen_first_at, Some(3));
    // 1 text delta + 2 tool starts + 2 + 2 non-empty argument fragments.
    assert_eq!(t.content_events(), 7);
    let e = ProtocolError::Upstream {
        kind: crate::protocol::ErrorKind::Overloaded,
        message: "Overloaded".into(),
    };
    assert_eq!(e.message(), "Overloaded");
    assert_eq!(e.status(), 529);
}

#[test]
fn a_stream_stopped_without_its_terminator_is_finished_once() {
    // The Anthropic stream up to `message_delta` (stop reason), without `message_stop`.
    let wire = messages_stream(Scenario::Text);
    let cut = wire
        .find("event: message_stop")
        .expect("message_stop in the fixture");
    for client in [ClientDialect::ChatCompletions, ClientDialect::Responses] {
        let mut t = StreamTranslator::new(UpstreamDialect::Messages, client, &opts(true)).unwrap();
        let mut norm = crate::sse::SseNormalizer::new(1 << 20);
        let mut out = BytesMut::new();
        norm.push(&wire.as_bytes()[..cut]).unwrap();
        while let Some(ev) = norm.next_event() {
            let data = ev.data().unwrap();
            t.on_event(ev.event_name(), &data, &mut out).unwrap();
        }
        assert!(t.has_stop_reason() && !t.is_finished(), "{client:?}");
        t.finish(&mut out).unwrap();
        assert!(t.is_finished(), "{client:?}");
        let len = out.len();
        t.finish(&mut out).unwrap();
        assert_eq!(out.len(), len, "{client:?}: finish is idempotent");
        // The same bytes as the whole stream with its terminator.
        let whole = translate(UpstreamDialect::Messages, client, wire.as_bytes(), 0, true);
        assert_eq!(out.to_vec(), whole, "{client:?}");
    }
}
