//! Tests of the protocol layer: golden requests and responses per dialect,
//! golden streams split at every byte, and the translation matrix
//! {chat, messages, responses} client × {chat, messages} upstream ×
//! {stream, non-stream} × {text, tool call, image, reasoning, error}.
//!
//! Expected values are hand-written wire JSON; the client-side reassemblers
//! below parse client frames independently of the encoders.

mod fixtures;
mod mappings;
mod matrix;
mod requests;
mod responses_upstream;
mod splits;
mod streams;

use bytes::BytesMut;
use serde_json::Value;

use super::{ClientDialect, StreamOptions, StreamTranslator, UpstreamDialect};
use crate::sse::SseNormalizer;

/// Standard model echoed to clients in the tests (differs from every
/// upstream model id in the fixtures).
pub(super) const STANDARD: &str = "house-model";

pub(super) fn opts(include_usage: bool) -> StreamOptions {
    StreamOptions {
        model: STANDARD.into(),
        created: 1_700_000_000,
        include_usage,
        echo: Default::default(),
        clock: || 1_700_000_001,
    }
}

/// Runs `wire` (upstream SSE bytes) through the normalizer cut into pieces
/// of `piece` bytes (0 = one piece) and the translator; returns the client
/// bytes.
pub(super) fn translate(
    upstream: UpstreamDialect,
    client: ClientDialect,
    wire: &[u8],
    piece: usize,
    include_usage: bool,
) -> Vec<u8> {
    let mut t = StreamTranslator::new(upstream, client, &opts(include_usage)).unwrap();
    let mut norm = SseNormalizer::new(1 << 20);
    let mut out = BytesMut::new();
    let pieces: Vec<&[u8]> = if piece == 0 {
        vec![wire]
    } else {
        wire.chunks(piece).collect()
    };
    let feed = |norm: &mut SseNormalizer, out: &mut BytesMut, t: &mut StreamTranslator| {
        while let Some(ev) = norm.next_event() {
            let Some(data) = ev.data() else { continue };
            if let Err(e) = t.on_event(ev.event_name(), &data, out) {
                t.error(e.kind(), &e.to_string(), out);
            }
        }
    };
    for p in pieces {
        norm.push(p).unwrap();
        feed(&mut norm, &mut out, &mut t);
    }
    norm.finish().unwrap();
    feed(&mut norm, &mut out, &mut t);
    out.to_vec()
}

/// Client SSE bytes → (event name, JSON data) per frame; `[DONE]` becomes
/// `(None, "[DONE]")`.
pub(super) fn frames(bytes: &[u8]) -> Vec<(Option<String>, Value)> {
    let text = std::str::from_utf8(bytes).unwrap();
    assert!(
        text.is_empty() || text.ends_with("\n\n"),
        "frames end with a blank line"
    );
    let mut out = Vec::new();
    for frame in text.split("\n\n").filter(|f| !f.is_empty()) {
        if frame.starts_with(':') {
            continue;
        }
        let mut name = None;
        let mut data = String::new();
        for line in frame.lines() {
            if let Some(n) = line.strip_prefix("event: ") {
                name = Some(n.to_owned());
            } else if let Some(d) = line.strip_prefix("data: ") {
                data.push_str(d);
            } else {
                panic!("unexpected line {line:?}");
            }
        }
        let v = if data == "[DONE]" {
            Value::String(data)
        } else {
            serde_json::from_str(&data).unwrap()
        };
        out.push((name, v));
    }
    out
}

/// What a client reassembles from a stream or body, parsed by hand from
/// the client's wire format.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Seen {
    pub text: String,
    pub reasoning: String,
    pub signature: String,
    /// (id, name, arguments JSON text)
    pub tools: Vec<(String, String, String)>,
    pub stop: String,
    /// (input, output, cached) as the client's dialect reports them
    pub usage: (u64, u64, u64),
    pub model: String,
    pub error: Option<String>,
}

/// Reassembles a Chat Completions client stream.
pub(super) fn seen_chat(bytes: &[u8]) -> Seen {
    let mut s = Seen::default();
    let fr = frames(bytes);
    for (name, v) in &fr {
        if name.as_deref() == Some("error") {
            s.error = Some(v["error"]["type"].as_str().unwrap().to_owned());
            continue;
        }
        if v == "[DONE]" {
            continue;
        }
        assert_eq!(v["object"], "chat.completion.chunk");
        s.model = v["model"].as_str().unwrap().to_owned();
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            s.usage = (
                u["prompt_tokens"].as_u64().unwrap(),
                u["completion_tokens"].as_u64().unwrap(),
                u["prompt_tokens_details"]["cached_tokens"]
                    .as_u64()
                    .unwrap(),
            );
        }
        for c in v["choices"].as_array().unwrap() {
            let d = &c["delta"];
            if let Some(t) = d["content"].as_str() {
                s.text.push_str(t);
            }
            if let Some(t) = d["reasoning_content"].as_str() {
                s.reasoning.push_str(t);
            }
            for tc in d["tool_calls"].as_array().into_iter().flatten() {
                let i = tc["index"].as_u64().unwrap() as usize;
                if let Some(id) = tc["id"].as_str() {
                    assert_eq!(i, s.tools.len());
                    s.tools.push((
                        id.to_owned(),
                        tc["function"]["name"].as_str().unwrap().to_owned(),
                        String::new(),
                    ));
                }
                s.tools[i]
                    .2
                    .push_str(tc["function"]["arguments"].as_str().unwrap());
            }
            if let Some(f) = c["finish_reason"].as_str() {
                s.stop = f.to_owned();
            }
        }
    }
    if s.error.is_none() {
        assert_eq!(fr.last().unwrap().1, "[DONE]");
    }
    s
}

/// Reassembles a Messages client stream, checking block bracketing.
pub(super) fn seen_messages(bytes: &[u8]) -> Seen {
    let mut s = Seen::default();
    let mut open: Option<(u64, String)> = None;
    let mut next_index = 0;
    let fr = frames(bytes);
    for (name, v) in &fr {
        let name = name.as_deref().unwrap();
        assert_eq!(v["type"], name, "event name matches type");
        match name {
            "message_start" => {
                s.model = v["message"]["model"].as_str().unwrap().to_owned();
                assert!(v["message"]["id"].as_str().unwrap().starts_with("msg_"));
            }
            "content_block_start" => {
                assert!(open.is_none(), "previous block closed");
                let i = v["index"].as_u64().unwrap();
                assert_eq!(i, next_index);
                next_index += 1;
                let b = &v["content_block"];
                let ty = b["type"].as_str().unwrap().to_owned();
                if ty == "tool_use" {
                    s.tools.push((
                        b["id"].as_str().unwrap().to_owned(),
                        b["name"].as_str().unwrap().to_owned(),
                        String::new(),
                    ));
                }
                open = Some((i, ty));
            }
            "content_block_delta" => {
                let (i, ty) = open.as_ref().unwrap();
                assert_eq!(v["index"].as_u64().unwrap(), *i);
                let d = &v["delta"];
                match d["type"].as_str().unwrap() {
                    "text_delta" => {
                        assert_eq!(ty, "text");
                        s.text.push_str(d["text"].as_str().unwrap())
                    }
                    "thinking_delta" => {
                        assert_eq!(ty, "thinking");
                        s.reasoning.push_str(d["thinking"].as_str().unwrap())
                    }
                    "signature_delta" => s.signature.push_str(d["signature"].as_str().unwrap()),
                    "input_json_delta" => s
                        .tools
                        .last_mut()
                        .unwrap()
                        .2
                        .push_str(d["partial_json"].as_str().unwrap()),
                    other => panic!("delta {other}"),
                }
            }
            "content_block_stop" => {
                assert_eq!(v["index"].as_u64().unwrap(), open.take().unwrap().0);
            }
            "message_delta" => {
                s.stop = v["delta"]["stop_reason"].as_str().unwrap().to_owned();
                let u = &v["usage"];
                s.usage = (
                    u["input_tokens"].as_u64().unwrap(),
                    u["output_tokens"].as_u64().unwrap(),
                    u["cache_read_input_tokens"].as_u64().unwrap(),
                );
            }
            "message_stop" => assert!(open.is_none()),
            "error" => s.error = Some(v["error"]["type"].as_str().unwrap().to_owned()),
            other => panic!("unexpected event {other}"),
        }
    }
    s
}

/// Reassembles a Responses client stream, checking sequence numbers and
/// that the final response repeats what the deltas said.
pub(super) fn seen_responses(bytes: &[u8]) -> Seen {
    let mut s = Seen::default();
    let fr = frames(bytes);
    for (n, (name, v)) in fr.iter().enumerate() {
        let name = name.as_deref().unwrap();
        assert_eq!(v["type"], name);
        assert_eq!(v["sequence_number"].as_u64().unwrap(), n as u64);
        match name {
            "response.output_text.delta" => s.text.push_str(v["delta"].as_str().unwrap()),
            "response.reasoning_summary_text.delta" => {
                s.reasoning.push_str(v["delta"].as_str().unwrap())
            }
            "response.output_item.added" if v["item"]["type"] == "function_call" => s.tools.push((
                v["item"]["call_id"].as_str().unwrap().to_owned(),
                v["item"]["name"].as_str().unwrap().to_owned(),
                String::new(),
            )),
            "response.function_call_arguments.delta" => s
                .tools
                .last_mut()
                .unwrap()
                .2
                .push_str(v["delta"].as_str().unwrap()),
            "response.completed" | "response.incomplete" | "response.failed" => {
                let r = &v["response"];
                s.model = r["model"].as_str().unwrap().to_owned();
                s.stop = r["status"].as_str().unwrap().to_owned();
                if let Some(reason) = r["incomplete_details"]["reason"].as_str() {
                    s.stop = format!("{}:{reason}", s.stop);
                }
                if name != "response.failed" {
                    let u = &r["usage"];
                    s.usage = (
                        u["input_tokens"].as_u64().unwrap(),
                        u["output_tokens"].as_u64().unwrap(),
                        u["input_tokens_details"]["cached_tokens"].as_u64().unwrap(),
                    );
                    // The final response repeats the streamed output.
                    let mut text = String::new();
                    for item in r["output"].as_array().unwrap() {
                        if item["type"] == "message" {
                            text.push_str(item["content"][0]["text"].as_str().unwrap());
                        }
                        if item["type"] == "reasoning" {
                            if let Some(sig) = item["encrypted_content"].as_str() {
                                s.signature.push_str(sig);
                            }
                        }
                    }
                    assert_eq!(text, s.text);
                }
            }
            "error" => s.error = Some(v["code"].as_str().unwrap().to_owned()),
            _ => {}
        }
    }
    s
}

/// Reassembles a client stream of any dialect.
pub(super) fn seen(client: ClientDialect, bytes: &[u8]) -> Seen {
    match client {
        ClientDialect::ChatCompletions => seen_chat(bytes),
        ClientDialect::Messages => seen_messages(bytes),
        ClientDialect::Responses => seen_responses(bytes),
    }
}
