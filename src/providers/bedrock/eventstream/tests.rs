//! Event-stream decoding: messages built with the crate's encoder (the framing's reference
//! implementation), cut at every byte boundary.

use aws_smithy_eventstream::frame::write_message_to;
use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
use base64::Engine as _;
use bytes::BytesMut;

use super::*;

fn message(headers: &[(&str, &str)], payload: &[u8]) -> Vec<u8> {
    let headers = headers
        .iter()
        .map(|(k, v)| {
            Header::new(
                (*k).to_string(),
                HeaderValue::String((*v).to_string().into()),
            )
        })
        .collect();
    let mut out = Vec::new();
    write_message_to(
        &Message::new_from_parts(headers, payload.to_vec()),
        &mut out,
    )
    .unwrap();
    out
}

fn chunk(json: &str) -> Vec<u8> {
    let b64 = base64::engine::general_purpose::STANDARD.encode(json);
    message(
        &[
            (":event-type", "chunk"),
            (":content-type", "application/json"),
            (":message-type", "event"),
        ],
        format!(r#"{{"bytes":"{b64}","p":"abcdefghij"}}"#).as_bytes(),
    )
}

const START: &str = r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-6","content":[],"stop_reason":null,"usage":{"input_tokens":12,"output_tokens":1}}}"#;
const DELTA: &str =
    r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"héllo"}}"#;
const STOP: &str = r#"{"type":"message_stop","amazon-bedrock-invocationMetrics":{"inputTokenCount":12,"outputTokenCount":3,"invocationLatency":100,"firstByteLatency":30}}"#;

fn transcript() -> Vec<u8> {
    let mut all = chunk(START);
    all.extend(chunk(DELTA));
    all.extend(chunk(STOP));
    all
}

/// The SSE of [`transcript`]: `message_stop` without Bedrock's invocation metrics.
fn expected() -> String {
    format!(
        "event: message_start\ndata: {START}\n\nevent: content_block_delta\ndata: {DELTA}\n\nevent: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n"
    )
}

fn decode_in(pieces: &[&[u8]]) -> Result<String, EventStreamError> {
    let mut d = EventStreamDecoder::new(64 * 1024);
    let mut out = BytesMut::new();
    for p in pieces {
        d.push(p, &mut out)?;
    }
    d.finish()?;
    Ok(String::from_utf8(out.to_vec()).unwrap())
}

#[test]
fn chunk_boundaries_at_every_byte_give_the_same_events() {
    let all = transcript();
    assert_eq!(decode_in(&[&all]).unwrap(), expected());
    for cut in 0..=all.len() {
        let (a, b) = all.split_at(cut);
        assert_eq!(decode_in(&[a, b]).unwrap(), expected(), "cut at {cut}");
    }
    // Two cuts: every cut of the first message combined with every cut of the second.
    let first = chunk(START).len();
    for c1 in (1..first).step_by(3) {
        for c2 in (first..all.len()).step_by(5) {
            let pieces = [&all[..c1], &all[c1..c2], &all[c2..]];
            assert_eq!(decode_in(&pieces).unwrap(), expected(), "cuts {c1} {c2}");
        }
    }
    let bytewise: Vec<&[u8]> = all.chunks(1).collect();
    assert_eq!(decode_in(&bytewise).unwrap(), expected());
}

#[test]
fn exceptions_become_anthropic_error_events() {
    let mut all = chunk(START);
    all.extend(message(
        &[
            (":exception-type", "modelStreamErrorException"),
            (":content-type", "application/json"),
            (":message-type", "exception"),
        ],
        br#"{"message":"The model stream broke.","originalStatusCode":500}"#,
    ));
    let out = decode_in(&[&all]).unwrap();
    let tail = out.split("\n\n").nth(1).unwrap();
    assert_eq!(
        tail,
        r#"event: error
data: {"error":{"message":"modelStreamErrorException: The model stream broke.","type":"api_error"},"type":"error"}"#
    );
    for (name, ty) in [
        ("throttlingException", "rate_limit_error"),
        ("ThrottlingException", "rate_limit_error"),
        ("serviceUnavailableException", "overloaded_error"),
        ("internalServerException", "api_error"),
        ("modelTimeoutException", "timeout_error"),
        ("validationException", "invalid_request_error"),
    ] {
        assert_eq!(exception_error_type(name), ty, "{name}");
    }
}

#[test]
fn broken_framing_is_refused() {
    let mut all = chunk(DELTA);
    // A flipped payload byte: the message CRC no longer matches.
    let i = all.len() - 10;
    all[i] ^= 0x01;
    assert!(matches!(
        decode_in(&[&all]),
        Err(EventStreamError::Malformed(_))
    ));
    // Cut short: the end of the body is inside a message.
    let ok = chunk(DELTA);
    assert_eq!(
        decode_in(&[&ok[..ok.len() - 1]]),
        Err(EventStreamError::Truncated)
    );
    // Over the limit: refused from the prelude, before the bytes arrive.
    let mut d = EventStreamDecoder::new(16);
    let mut out = BytesMut::new();
    assert!(matches!(
        d.push(&(100_000u32).to_be_bytes(), &mut out),
        Err(EventStreamError::TooLarge { .. })
    ));
    // A payload without `bytes`, and an event JSON without `type`.
    let no_bytes = message(
        &[(":event-type", "chunk"), (":message-type", "event")],
        b"{}",
    );
    assert!(matches!(
        decode_in(&[&no_bytes]),
        Err(EventStreamError::Malformed(_))
    ));
    let b64 = base64::engine::general_purpose::STANDARD.encode(r#"{"index":0}"#);
    let untyped = message(
        &[(":event-type", "chunk"), (":message-type", "event")],
        format!(r#"{{"bytes":"{b64}"}}"#).as_bytes(),
    );
    assert!(matches!(
        decode_in(&[&untyped]),
        Err(EventStreamError::Malformed(_))
    ));
}

#[test]
fn other_member_orders_and_multi_line_json_are_read() {
    let json = "{\"index\":0,\n \"type\":\"content_block_stop\"}";
    let b64 = base64::engine::general_purpose::STANDARD.encode(json);
    let msg = message(
        &[(":event-type", "chunk"), (":message-type", "event")],
        format!(r#"{{ "p": "xyz", "bytes": "{b64}" }}"#).as_bytes(),
    );
    assert_eq!(
        decode_in(&[&msg]).unwrap(),
        "event: content_block_stop\ndata: {\"index\":0,  \"type\":\"content_block_stop\"}\n\n"
    );
    // Unknown event types are skipped.
    let other = message(
        &[(":event-type", "somethingNew"), (":message-type", "event")],
        b"{}",
    );
    assert_eq!(decode_in(&[&other]).unwrap(), "");
}

#[test]
fn the_fast_path_keeps_one_line_long_types_and_the_events_before_a_bad_one() {
    // `type` first, raw newlines further on: decoded into the output, made one line there.
    let json = "{\"type\":\"content_block_delta\",\n\"index\":0,\r\n\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}";
    let mut all = chunk(json);
    // A type too long for the peeked prefix: read by the scratch-buffer path.
    let long = r#"{"type":"an_event_type_longer_than_the_peeked_prefix","index":1}"#;
    all.extend(chunk(long));
    assert_eq!(
        decode_in(&[&all]).unwrap(),
        format!(
            "event: content_block_delta\ndata: {}\n\nevent: an_event_type_longer_than_the_peeked_prefix\ndata: {long}\n\n",
            json.replace(['\n', '\r'], " ")
        )
    );
    // Base64 that breaks after the peeked prefix: the good event stays, the bad one is
    // not half written.
    let b64 = base64::engine::general_purpose::STANDARD.encode(DELTA);
    let broken = format!("{}!{}", &b64[..60], &b64[61..]);
    let bad = message(
        &[(":event-type", "chunk"), (":message-type", "event")],
        format!(r#"{{"bytes":"{broken}"}}"#).as_bytes(),
    );
    let mut d = EventStreamDecoder::new(64 * 1024);
    let mut out = BytesMut::new();
    let mut both = chunk(DELTA);
    both.extend(bad);
    assert!(matches!(
        d.push(&both, &mut out),
        Err(EventStreamError::Malformed(_))
    ));
    assert_eq!(
        String::from_utf8(out.to_vec()).unwrap(),
        format!("event: content_block_delta\ndata: {DELTA}\n\n")
    );
}
