//! Golden streams with multi-byte characters inside tool-call argument
//! fragments and reasoning deltas (the fixtures' are ASCII there), cut at
//! every byte and inside every byte of every multi-byte character: each
//! decoder (Chat, Messages) gives the same client bytes whatever the cut, and
//! the client reassembles the characters intact.

use bytes::BytesMut;

use super::fixtures::{chat_stream, messages_stream, Scenario};
use super::{opts, seen, translate};
use crate::protocol::{ClientDialect, StreamTranslator, UpstreamDialect};
use crate::sse::SseNormalizer;

const CITY: &str = "Zürich ✓";
const THOUGHT: &str = "Thïnk 🤔 ";

/// The fixture stream of `s` from `up`, with multi-byte text where the
/// arguments and the reasoning are.
fn wire(up: UpstreamDialect, s: Scenario) -> String {
    let w = match up {
        UpstreamDialect::ChatCompletions => chat_stream(s),
        _ => messages_stream(s),
    };
    let w = w.replace("Paris", CITY).replace("Think ", THOUGHT);
    assert!(w.contains(CITY) || w.contains(THOUGHT), "{w}");
    w
}

/// Translates `bytes` fed as the given pieces.
fn translate_cut(up: UpstreamDialect, client: ClientDialect, pieces: &[&[u8]]) -> Vec<u8> {
    let mut t = StreamTranslator::new(up, client, &opts(true)).unwrap();
    let mut norm = SseNormalizer::new(1 << 20);
    let mut out = BytesMut::new();
    for part in pieces {
        norm.push(part).unwrap();
        while let Some(ev) = norm.next_event() {
            let data = ev.data().unwrap();
            if let Err(e) = t.on_event(ev.event_name(), &data, &mut out) {
                t.error(e.kind(), &e.to_string(), &mut out);
            }
        }
    }
    norm.finish().unwrap();
    while let Some(ev) = norm.next_event() {
        let data = ev.data().unwrap();
        t.on_event(ev.event_name(), &data, &mut out).unwrap();
    }
    out.to_vec()
}

#[test]
fn multi_byte_arguments_and_reasoning_survive_every_cut() {
    for up in [UpstreamDialect::ChatCompletions, UpstreamDialect::Messages] {
        for client in [
            ClientDialect::ChatCompletions,
            ClientDialect::Messages,
            ClientDialect::Responses,
        ] {
            if client.same_as(up) {
                continue;
            }
            for s in [Scenario::Tool, Scenario::Reasoning] {
                let w = wire(up, s);
                let bytes = w.as_bytes();
                let whole = translate(up, client, bytes, 0, true);
                let got = seen(client, &whole);
                if s == Scenario::Tool {
                    let args: serde_json::Value = serde_json::from_str(&got.tools[0].2).unwrap();
                    assert_eq!(args["city"], CITY, "{up:?}->{client:?}");
                } else {
                    assert!(
                        got.reasoning.starts_with(THOUGHT),
                        "{up:?}->{client:?}: {got:?}"
                    );
                }
                // Every byte boundary (mid-token, mid-JSON-string, mid-character).
                for piece in [1, 2, 5] {
                    assert_eq!(
                        translate(up, client, bytes, piece, true),
                        whole,
                        "{up:?}->{client:?} {s:?} piece {piece}"
                    );
                }
                // Two pieces, cut after each byte of each multi-byte character.
                for i in 0..bytes.len() - 1 {
                    if bytes[i] >= 0x80 && bytes[i + 1] & 0xC0 == 0x80 {
                        let out = translate_cut(up, client, &[&bytes[..=i], &bytes[i + 1..]]);
                        assert_eq!(out, whole, "{up:?}->{client:?} {s:?}: cut at {i}");
                    }
                }
            }
        }
    }
}
