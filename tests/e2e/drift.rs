//! Drift (issue 28): provider APIs change every month, so the same dialect in and out must be
//! a passthrough. For each same-dialect pair (Chat Completions to OpenAI and to Azure OpenAI;
//! Messages to Anthropic, to Claude on Bedrock (InvokeModel) and to Claude on Vertex AI;
//! Responses to OpenAI's and Azure OpenAI's Responses API), a
//! property test adds random unknown members, enum values, tool types and content blocks to a
//! valid request, and random unknown members and events to the provider's answer (the mock's
//! `drift` knob), then checks that they reach the other side equal as JSON values, streamed
//! and not. Only what the gateway owns may differ: `model` (the upstream model going up, the
//! standard model coming back), the members the provider's placement rules move out of the
//! body (Bedrock's and Vertex's `model` and `stream`, their `anthropic_version`; Bedrock's
//! `service_tier`, which it refuses and the `x-sluice-dropped` header then names),
//! Chat's `stream_options` (Sluice asks for the usage chunk), and Responses' `store` (always
//! `false`) and `include` (`reasoning.encrypted_content` added).
//!
//! Cases per pair: `PROPTEST_CASES` (default 8), each a streamed and a whole request.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{json, Map, Value};

use crate::harness::{post_json, KEY};
use crate::provider_battery::{self as battery, Rig, MODEL};

/// The members the gateway owns in a same-dialect request body (see the module doc;
/// Responses: `store` is `false` and `include` asks for encrypted reasoning).
const GATEWAY_OWNED: [&str; 7] = [
    "model",
    "stream",
    "anthropic_version",
    "stream_options",
    "service_tier",
    "store",
    "include",
];

/// A member name no API has: never one the gateway knows.
fn unknown_key() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9_]{0,9}".prop_map(|k| format!("x_drift_{k}"))
}

/// An enum value no API has.
fn unknown_enum() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9_]{0,9}".prop_map(|k| format!("drift_{k}"))
}

/// Any JSON value: nested arrays and objects of strings (escapes and non-ASCII included),
/// integers, floats, booleans and nulls.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1.0e12f64..1.0e12).prop_map(Value::from),
        "[a-zA-Z0-9 éü✓🚀\"\\\\/\n\t]{0,16}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-z_]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Unknown members: a small object of [`unknown_key`] → [`any_json`].
fn members() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::btree_map(unknown_key(), any_json(), 1..4)
        .prop_map(|m| m.into_iter().collect())
}

/// What one case adds: to the request (top-level members, a member on each message, a
/// content block, a tool and enum values of unknown kinds) and to the answer (members on
/// the body and on every event, and whole events).
#[derive(Debug, Clone)]
struct Case {
    top: Map<String, Value>,
    message_member: Map<String, Value>,
    block_type: String,
    block_body: Map<String, Value>,
    tool_type: String,
    tool_body: Map<String, Value>,
    enum_value: String,
    answer_members: Map<String, Value>,
    events: Vec<(String, Map<String, Value>)>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        (members(), members(), unknown_enum(), members()),
        (unknown_enum(), members(), unknown_enum(), members()),
        prop::collection::vec((unknown_enum(), members()), 1..3),
    )
        .prop_map(
            |(
                (top, message_member, block_type, block_body),
                (tool_type, tool_body, enum_value, answer_members),
                events,
            )| Case {
                top,
                message_member,
                block_type,
                block_body,
                tool_type,
                tool_body,
                enum_value,
                answer_members,
                events,
            },
        )
}

/// The client dialect of a pair.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Dialect {
    Chat,
    Messages,
    Responses,
}

impl Dialect {
    fn path(self) -> &'static str {
        match self {
            Dialect::Chat => "/v1/chat/completions",
            Dialect::Messages => "/v1/messages",
            Dialect::Responses => "/v1/responses",
        }
    }
}

/// A valid request of `dialect` with everything `c` adds.
fn request(dialect: Dialect, c: &Case, stream: bool) -> Value {
    let with = |base: Value, extra: &Map<String, Value>| {
        let Value::Object(mut base) = base else {
            unreachable!("a JSON object literal")
        };
        for (k, v) in extra {
            base.insert(k.clone(), v.clone());
        }
        Value::Object(base)
    };
    let block = with(json!({"type": c.block_type}), &c.block_body);
    let tool = with(json!({"type": c.tool_type}), &c.tool_body);
    let mut body = match dialect {
        Dialect::Chat => json!({
            "model": MODEL,
            "stream": stream,
            "messages": [
                with(json!({"role": "system", "content": "Be brief."}), &c.message_member),
                with(json!({"role": "user", "content": [{"type": "text", "text": "héllo"}, block]}), &c.message_member),
            ],
            "tools": [
                {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
                tool
            ],
            "tool_choice": {"type": c.enum_value},
            "reasoning_effort": c.enum_value,
            "service_tier": c.enum_value,
        }),
        Dialect::Messages => json!({
            "model": MODEL,
            "stream": stream,
            "max_tokens": 64,
            "messages": [
                with(json!({"role": "user", "content": [{"type": "text", "text": "héllo", "cache_control": {"type": c.enum_value}}, block]}), &c.message_member),
            ],
            "tools": [
                {"name": "get_time", "input_schema": {"type": "object"}},
                tool
            ],
            "tool_choice": {"type": c.enum_value},
            "thinking": {"type": c.enum_value},
            "service_tier": c.enum_value,
        }),
        Dialect::Responses => json!({
            "model": MODEL,
            "stream": stream,
            "instructions": "Be brief.",
            "input": [
                with(json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "héllo"}, block]}), &c.message_member),
            ],
            "tools": [
                {"type": "function", "name": "get_time", "parameters": {"type": "object"}},
                tool
            ],
            "tool_choice": {"type": c.enum_value},
            "reasoning": {"effort": c.enum_value},
            "service_tier": c.enum_value,
        }),
    };
    if stream && dialect == Dialect::Chat {
        body["stream_options"] = json!({"include_usage": true});
    }
    let obj = body.as_object_mut().expect("object");
    for (k, v) in &c.top {
        obj.insert(k.clone(), v.clone());
    }
    body
}

/// The mock behaviour that adds `c`'s answer drift (over the rig's own knobs).
fn behavior(rig: &Rig, dialect: Dialect, c: &Case) -> String {
    let events: Vec<Value> = c
        .events
        .iter()
        .map(|(name, data)| {
            let mut d = data.clone();
            match dialect {
                // OpenAI streams are data-only.
                Dialect::Chat => json!({"data": Value::Object(d)}),
                Dialect::Messages | Dialect::Responses => {
                    d.insert("type".into(), Value::from(name.as_str()));
                    json!({"event": name, "data": Value::Object(d)})
                }
            }
        })
        .collect();
    let mut b = rig.base.clone();
    b["text"] = json!("drift ok");
    b["drift"] = json!({"members": c.answer_members, "events": events});
    b.to_string()
}

/// `v` without the members the gateway owns.
fn without_owned(v: &Value) -> Value {
    let mut o = v.as_object().cloned().expect("a JSON object");
    for k in GATEWAY_OWNED {
        o.remove(k);
    }
    Value::Object(o)
}

/// The SSE events of a stream: (event name, data).
fn sse_events(body: &str) -> Vec<(Option<String>, String)> {
    let mut out = Vec::new();
    for block in body.replace("\r\n", "\n").split("\n\n") {
        let mut name = None;
        let mut data = Vec::new();
        for line in block.lines() {
            if let Some(n) = line.strip_prefix("event:") {
                name = Some(n.trim().to_string());
            } else if let Some(d) = line.strip_prefix("data:") {
                data.push(d.strip_prefix(' ').unwrap_or(d).to_string());
            }
        }
        if !data.is_empty() {
            out.push((name, data.join("\n")));
        }
    }
    out
}

/// One case through `rig`: the request's drift reaches the provider, the answer's drift
/// reaches the client. `Err` names what differed.
fn check(rig: &Rig, dialect: Dialect, c: &Case, stream: bool) -> Result<(), String> {
    rig.mock.reset();
    rig.mock.set_behavior(&behavior(rig, dialect, c));
    let sent = request(dialect, c, stream);
    let auth = format!("Bearer {KEY}");
    let r = post_json(
        rig.sluice.addr,
        dialect.path(),
        &[
            ("authorization", &auth),
            ("anthropic-version", "2023-06-01"),
        ],
        &sent.to_string(),
    );
    if r.status != 200 {
        return Err(format!("status {}: {}", r.status, r.text()));
    }
    // What the provider's placement rules left out is named to the client.
    let placed_out = rig.marker == "/invoke";
    if r.header("x-sluice-dropped").is_some() != placed_out
        || (placed_out && r.header("x-sluice-dropped") != Some("service_tier"))
    {
        return Err(format!(
            "x-sluice-dropped: {:?}",
            r.header("x-sluice-dropped")
        ));
    }
    // The request, as the provider got it.
    let calls = rig.model_calls();
    let [call] = &calls[..] else {
        return Err(format!("{} model calls: {calls:?}", calls.len()));
    };
    let got: Value = serde_json::from_str(call["body"].as_str().unwrap_or(""))
        .map_err(|e| format!("provider got no JSON: {e}"))?;
    if without_owned(&got) != without_owned(&sent) {
        return Err(format!(
            "request changed on its way:\n sent {}\n  got {}",
            without_owned(&sent),
            without_owned(&got)
        ));
    }
    // The answer, as the client got it.
    let text = r.text();
    if !stream {
        let v: Value = serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))?;
        for (k, want) in &c.answer_members {
            if v.get(k) != Some(want) {
                return Err(format!("answer member {k}: want {want}, got {v}"));
            }
        }
        if v["model"] != MODEL {
            return Err(format!("model not rewritten: {v}"));
        }
        return Ok(());
    }
    let events = sse_events(&text);
    let mut drift_seen = Vec::new();
    for (name, data) in &events {
        if data == "[DONE]" {
            continue;
        }
        let v: Value =
            serde_json::from_str(data).map_err(|e| format!("event data not JSON ({e}): {data}"))?;
        let is_drift = c.events.iter().any(|(n, d)| {
            let mut want = d.clone();
            if dialect != Dialect::Chat {
                want.insert("type".into(), Value::from(n.as_str()));
                name.as_deref() == Some(n.as_str()) && v == Value::Object(want)
            } else {
                v == Value::Object(want)
            }
        });
        if is_drift {
            drift_seen.push(v);
            continue;
        }
        for (k, want) in &c.answer_members {
            if v.get(k) != Some(want) {
                return Err(format!("event {name:?} lost member {k}: {data}"));
            }
        }
    }
    if drift_seen.len() != c.events.len() {
        return Err(format!(
            "{} of {} unknown events reached the client:\n{text}",
            drift_seen.len(),
            c.events.len()
        ));
    }
    Ok(())
}

/// Runs the property for one pair: every case, streamed and whole.
fn run(rig: Rig, dialect: Dialect) {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8u32);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&case(), |c| {
        for stream in [false, true] {
            check(&rig, dialect, &c, stream)
                .map_err(|e| TestCaseError::fail(format!("stream={stream}: {e}")))?;
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{dialect:?} → {}: {e}", rig.marker);
    }
}

#[test]
fn chat_to_openai_passes_what_it_does_not_know() {
    run(battery::openai_rig(), Dialect::Chat);
}

#[test]
fn chat_to_azure_openai_passes_what_it_does_not_know() {
    run(battery::azure_openai_rig(), Dialect::Chat);
}

#[test]
fn messages_to_anthropic_passes_what_it_does_not_know() {
    run(battery::anthropic_rig(), Dialect::Messages);
}

#[test]
fn messages_to_bedrock_claude_passes_what_it_does_not_know() {
    run(battery::bedrock_claude_rig(), Dialect::Messages);
}

#[test]
fn messages_to_vertex_claude_passes_what_it_does_not_know() {
    run(battery::vertex_claude_rig(), Dialect::Messages);
}

#[test]
fn responses_to_openai_responses_passes_what_it_does_not_know() {
    run(battery::openai_responses_rig(), Dialect::Responses);
}

#[test]
fn responses_to_azure_responses_passes_what_it_does_not_know() {
    run(battery::azure_responses_rig(), Dialect::Responses);
}
