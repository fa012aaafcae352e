//! The smallest client dialect: a decoder into Sluice's canonical request and an encoder
//! from its canonical answer ([`sluice::protocol`]).
//!
//! Every client dialect (Chat Completions, Messages, Responses) is exactly these two
//! converters plus its stream encoder; any provider is then reachable, because every
//! upstream dialect converts from and to the same canonical model. This toy dialect takes
//! `{"model": "...", "prompt": "..."}` and answers `{"model": "...", "text": "..."}`; here
//! its request goes to an Anthropic Messages provider and a Chat Completions answer comes
//! back, both through the canonical model, with no network.

use serde_json::{json, Value};
use sluice::protocol::{
    self, Message, ModelPlacement, OutputItem, Part, Request, Response, Role, UpstreamDialect,
    UpstreamOptions,
};

/// The toy dialect's request decoder.
fn decode(body: &[u8]) -> Result<Request, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let field = |name: &str| {
        v.get(name)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| format!("`{name}` is required"))
    };
    Ok(Request {
        model: field("model")?,
        messages: vec![Message {
            role: Role::User,
            parts: vec![Part::Text(field("prompt")?)],
        }],
        ..Request::default()
    })
}

/// The toy dialect's answer encoder: the answer's text items, joined.
fn encode(resp: &Response) -> Value {
    let text: String = resp
        .output
        .iter()
        .filter_map(|o| match o {
            OutputItem::Text(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    json!({"model": resp.model, "text": text})
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let canonical = decode(br#"{"model":"example/chat","prompt":"Say hi."}"#)?;
    let opts = UpstreamOptions {
        model: "claude-small",
        default_max_tokens: 256,
        stream_usage: false,
        placement: ModelPlacement::Body,
        thinking: None,
    };
    let upstream = protocol::encode_request(UpstreamDialect::Messages, &canonical, &opts)?;
    println!(
        "to a Messages provider: {}",
        String::from_utf8_lossy(&upstream)
    );

    let answer = br#"{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-small","choices":[{"index":0,"message":{"role":"assistant","content":"Hi!"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}"#;
    let mut resp = protocol::decode_response(UpstreamDialect::ChatCompletions, answer, 1)?;
    resp.model = canonical.model.clone();
    println!("to the client: {}", encode(&resp));
    Ok(())
}

// Run: cargo run --example client_dialect
