//! The Responses API's objects and events as the specification's schemas say (issue 29,
//! items 1 and 4), on every provider kind: the Response object of a non-streaming answer
//! and of every `response.*` event carries each member the Open Responses `ResponseResource`
//! schema requires, with its type (numbers where the schema says number, never `null`), the
//! request's values echoed; every stream event carries its schema's required members; a
//! reasoning item has a string `encrypted_content` or none; ids are unique per response.
//! Then `POST /v1/responses/input_tokens` (an estimate) and `POST /v1/responses/compact`
//! (400 without a model, else 501).
//!
//! The requests are the Open Responses compliance suite's (basic, streaming, system prompt,
//! tool calling, multi-turn), and the checks are written from the specification's schemas
//! (<https://www.openresponses.org/specification>, `ResponseResource`, `ItemField`, the
//! streaming events): the suite itself cannot be fetched here, see `benches/README.md`.

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::client::{post_json, sse_events, StreamReader};
use crate::harness::KEY;
use crate::provider_battery::{
    anthropic_rig, azure_openai_rig, bedrock_claude_rig, bedrock_converse_rig, gemini_rig,
    openai_rig, vertex_claude_rig, vertex_gemini_rig, Rig, MODEL,
};

/// What a JSON value must be.
#[derive(Clone, Copy)]
enum Ty {
    Str,
    Int,
    Num,
    Bool,
    Obj,
    Arr,
    /// The constant string.
    Is(&'static str),
    /// `null` or the type.
    OrNull(&'static Ty),
    /// A string or an array (`instructions`).
    StrOrArr,
    /// A string or an object (`tool_choice`).
    StrOrObj,
}

fn is(v: &Value, ty: Ty) -> bool {
    match ty {
        Ty::Str => v.is_string(),
        Ty::Int => v.is_u64() || v.is_i64(),
        Ty::Num => v.is_number(),
        Ty::Bool => v.is_boolean(),
        Ty::Obj => v.is_object(),
        Ty::Arr => v.is_array(),
        Ty::Is(s) => v == s,
        Ty::OrNull(t) => v.is_null() || is(v, *t),
        Ty::StrOrArr => v.is_string() || v.is_array(),
        Ty::StrOrObj => v.is_string() || v.is_object(),
    }
}

/// Checks that `v` has each member of `members` with its type; pushes what differs.
fn members(errors: &mut Vec<String>, at: &str, v: &Value, members: &[(&str, Ty)]) {
    for (k, ty) in members {
        match v.get(k) {
            None => errors.push(format!("{at}.{k}: missing")),
            Some(m) if !is(m, *ty) => errors.push(format!("{at}.{k}: wrong type: {m}")),
            Some(_) => {}
        }
    }
}

/// The `ResponseResource` schema's required members.
const RESPONSE: &[(&str, Ty)] = &[
    ("id", Ty::Str),
    ("object", Ty::Is("response")),
    ("created_at", Ty::Int),
    ("completed_at", Ty::OrNull(&Ty::Int)),
    ("status", Ty::Str),
    ("incomplete_details", Ty::OrNull(&Ty::Obj)),
    ("model", Ty::Str),
    ("previous_response_id", Ty::OrNull(&Ty::Str)),
    ("instructions", Ty::OrNull(&Ty::StrOrArr)),
    ("output", Ty::Arr),
    ("error", Ty::OrNull(&Ty::Obj)),
    ("tools", Ty::Arr),
    ("tool_choice", Ty::StrOrObj),
    ("truncation", Ty::Str),
    ("parallel_tool_calls", Ty::Bool),
    ("text", Ty::Obj),
    ("top_p", Ty::Num),
    ("presence_penalty", Ty::Num),
    ("frequency_penalty", Ty::Num),
    ("top_logprobs", Ty::Int),
    ("temperature", Ty::Num),
    ("reasoning", Ty::OrNull(&Ty::Obj)),
    ("user", Ty::OrNull(&Ty::Str)),
    ("usage", Ty::OrNull(&Ty::Obj)),
    ("max_output_tokens", Ty::OrNull(&Ty::Int)),
    ("max_tool_calls", Ty::OrNull(&Ty::Int)),
    ("store", Ty::Bool),
    ("background", Ty::Bool),
    ("service_tier", Ty::Str),
    ("metadata", Ty::Obj),
    ("safety_identifier", Ty::OrNull(&Ty::Str)),
    ("prompt_cache_key", Ty::OrNull(&Ty::Str)),
];

/// Checks one output item against its schema (`Message`, `FunctionCall`, `ReasoningBody`).
fn item(errors: &mut Vec<String>, at: &str, it: &Value) {
    match it["type"].as_str() {
        Some("message") => {
            let m = [
                ("id", Ty::Str),
                ("status", Ty::Str),
                ("role", Ty::Str),
                ("content", Ty::Arr),
            ];
            members(errors, at, it, &m);
            for (i, part) in it["content"].as_array().into_iter().flatten().enumerate() {
                part_(errors, &format!("{at}.content[{i}]"), part);
            }
        }
        Some("function_call") => members(
            errors,
            at,
            it,
            &[
                ("id", Ty::Str),
                ("call_id", Ty::Str),
                ("name", Ty::Str),
                ("arguments", Ty::Str),
                ("status", Ty::Str),
            ],
        ),
        Some("reasoning") => {
            members(errors, at, it, &[("id", Ty::Str), ("summary", Ty::Arr)]);
            if let Some(e) = it.get("encrypted_content") {
                if !e.is_string() {
                    errors.push(format!(
                        "{at}.encrypted_content: a string or no member: {e}"
                    ));
                }
            }
        }
        other => errors.push(format!("{at}: unexpected item type {other:?}")),
    }
}

/// Checks an `output_text` content part (`annotations` and `logprobs` are required).
fn part_(errors: &mut Vec<String>, at: &str, p: &Value) {
    members(
        errors,
        at,
        p,
        &[
            ("type", Ty::Is("output_text")),
            ("text", Ty::Str),
            ("annotations", Ty::Arr),
            ("logprobs", Ty::Arr),
        ],
    );
}

/// Checks a whole Response object; `done`: the answer is complete (output, usage and
/// `completed_at` are there).
fn response(errors: &mut Vec<String>, at: &str, r: &Value, done: bool) {
    members(errors, at, r, RESPONSE);
    for (i, it) in r["output"].as_array().into_iter().flatten().enumerate() {
        item(errors, &format!("{at}.output[{i}]"), it);
    }
    if done {
        members(
            errors,
            &format!("{at}.usage"),
            &r["usage"],
            &[
                ("input_tokens", Ty::Int),
                ("output_tokens", Ty::Int),
                ("total_tokens", Ty::Int),
                ("input_tokens_details", Ty::Obj),
                ("output_tokens_details", Ty::Obj),
            ],
        );
        if r["status"] == "completed" && !r["completed_at"].is_u64() {
            errors.push(format!("{at}.completed_at: an integer once completed"));
        }
    } else if !r["usage"].is_null() || !r["completed_at"].is_null() {
        errors.push(format!("{at}: usage and completed_at are null in progress"));
    }
}

/// Checks one stream event against its schema's required members.
fn event(errors: &mut Vec<String>, ev: &Value) {
    let ty = ev["type"].as_str().unwrap_or("?");
    let at = format!("event {ty}");
    members(errors, &at, ev, &[("sequence_number", Ty::Int)]);
    let located = [("item_id", Ty::Str), ("output_index", Ty::Int)];
    match ty {
        "response.created" | "response.in_progress" => {
            response(errors, &at, &ev["response"], false);
        }
        "response.completed" | "response.incomplete" | "response.failed" => {
            response(errors, &at, &ev["response"], true);
        }
        "response.output_item.added" | "response.output_item.done" => {
            members(
                errors,
                &at,
                ev,
                &[("output_index", Ty::Int), ("item", Ty::Obj)],
            );
            item(errors, &format!("{at}.item"), &ev["item"]);
        }
        "response.content_part.added" | "response.content_part.done" => {
            members(errors, &at, ev, &located);
            members(
                errors,
                &at,
                ev,
                &[("content_index", Ty::Int), ("part", Ty::Obj)],
            );
            part_(errors, &format!("{at}.part"), &ev["part"]);
        }
        "response.output_text.delta" => {
            members(errors, &at, ev, &located);
            let m = [
                ("content_index", Ty::Int),
                ("delta", Ty::Str),
                ("logprobs", Ty::Arr),
            ];
            members(errors, &at, ev, &m);
        }
        "response.output_text.done" => {
            members(errors, &at, ev, &located);
            let m = [
                ("content_index", Ty::Int),
                ("text", Ty::Str),
                ("logprobs", Ty::Arr),
            ];
            members(errors, &at, ev, &m);
        }
        "response.function_call_arguments.delta" => {
            members(errors, &at, ev, &located);
            members(errors, &at, ev, &[("delta", Ty::Str)]);
        }
        "response.function_call_arguments.done" => {
            members(errors, &at, ev, &located);
            members(errors, &at, ev, &[("arguments", Ty::Str)]);
        }
        "response.reasoning_summary_part.added" | "response.reasoning_summary_part.done" => {
            members(errors, &at, ev, &located);
            members(
                errors,
                &at,
                ev,
                &[("summary_index", Ty::Int), ("part", Ty::Obj)],
            );
        }
        "response.reasoning_summary_text.delta" => {
            members(errors, &at, ev, &located);
            members(
                errors,
                &at,
                ev,
                &[("summary_index", Ty::Int), ("delta", Ty::Str)],
            );
        }
        "response.reasoning_summary_text.done" => {
            members(errors, &at, ev, &located);
            members(
                errors,
                &at,
                ev,
                &[("summary_index", Ty::Int), ("text", Ty::Str)],
            );
        }
        other => errors.push(format!("unexpected event {other}")),
    }
}

/// The compliance suite's weather tool (no `strict`: the echo gives it `null`).
fn weather_tool() -> Value {
    json!({"type": "function", "name": "get_weather",
        "description": "Get the current weather for a location",
        "parameters": {"type": "object", "properties": {"location": {"type": "string"}},
            "required": ["location"]}})
}

/// A request with every echoed member set to a value other than its default.
fn echoing_request(stream: bool) -> Value {
    json!({
        "model": MODEL, "stream": stream,
        "instructions": "You are a pirate.",
        "input": [
            {"type": "message", "role": "user", "content": "My name is Alice."},
            {"type": "message", "role": "assistant", "content": "Ahoy Alice!"},
            {"type": "message", "role": "user", "content": "What's the weather like in San Francisco?"}
        ],
        "tools": [weather_tool()], "tool_choice": "auto", "parallel_tool_calls": false,
        "temperature": 0.25, "top_p": 0.5, "max_output_tokens": 300,
        "metadata": {"ticket": "T-1"}, "user": "alice", "safety_identifier": "u-77",
        "prompt_cache_key": "pck-1", "store": false,
        "text": {"format": {"type": "text"}, "verbosity": "low"}
    })
}

/// The members [`echoing_request`] must find again in the Response object.
fn check_echo(errors: &mut Vec<String>, at: &str, r: &Value) {
    let want = [
        ("instructions", json!("You are a pirate.")),
        ("temperature", json!(0.25)),
        ("top_p", json!(0.5)),
        ("max_output_tokens", json!(300)),
        ("tool_choice", json!("auto")),
        ("parallel_tool_calls", json!(false)),
        ("metadata", json!({"ticket": "T-1"})),
        ("user", json!("alice")),
        ("safety_identifier", json!("u-77")),
        ("prompt_cache_key", json!("pck-1")),
        ("store", json!(false)),
        (
            "text",
            json!({"format": {"type": "text"}, "verbosity": "low"}),
        ),
        ("model", json!(MODEL)),
    ];
    for (k, v) in want {
        if r[k] != v {
            errors.push(format!("{at}.{k}: echoed {} instead of {v}", r[k]));
        }
    }
    let mut tool = weather_tool();
    tool["strict"] = Value::Null;
    if r["tools"] != json!([tool]) {
        errors.push(format!("{at}.tools: echoed {}", r["tools"]));
    }
}

/// Every check against one kind's rig, non-streaming and streaming; fails with every
/// difference found.
fn run(kind: &str, rig: &Rig) {
    let mut behavior = rig.base.clone();
    behavior["text"] = json!("Arr, it is foggy.");
    behavior["reasoning"] = json!("Checking the weather tool.");
    behavior["tool_calls"] = json!([{"name": "get_weather", "arguments": {"location": "SF"}}]);
    rig.mock.set_behavior(&behavior.to_string());
    let auth = format!("Bearer {KEY}");
    let headers = [("authorization", auth.as_str())];
    let mut errors = Vec::new();

    // Non-streaming, twice: each answer has its own id.
    let mut ids = Vec::new();
    for _ in 0..2 {
        let body = echoing_request(false).to_string();
        let r = post_json(rig.sluice.addr, "/v1/responses", &headers, &body);
        assert_eq!(r.status, 200, "{kind}: {}", r.text());
        let v = r.json();
        response(&mut errors, "body", &v, true);
        check_echo(&mut errors, "body", &v);
        if !v["output"]
            .as_array()
            .is_some_and(|o| o.iter().any(|i| i["type"] == "function_call"))
        {
            errors.push(format!("body: no function_call item: {v}"));
        }
        ids.push(v["id"].as_str().unwrap_or_default().to_string());
    }
    if ids[0] == ids[1] || !ids[0].starts_with("resp_") {
        errors.push(format!("response ids not unique: {ids:?}"));
    }

    // Streaming: every event, in sequence; created/in_progress/completed echo the request.
    let body = echoing_request(true).to_string();
    let mut s = StreamReader::open(
        rig.sluice.addr,
        "/v1/responses",
        &[
            ("authorization", &auth),
            ("content-type", "application/json"),
        ],
        &body,
    );
    assert_eq!(s.status, 200, "{kind}");
    let raw = s.read_to_end(Duration::from_secs(10));
    let events: Vec<Value> = sse_events(&raw)
        .iter()
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect();
    assert!(
        events.len() > 6,
        "{kind}: {}",
        String::from_utf8_lossy(&raw)
    );
    for (n, ev) in events.iter().enumerate() {
        event(&mut errors, ev);
        if ev["sequence_number"] != json!(n) {
            errors.push(format!(
                "event {n}: sequence_number {}",
                ev["sequence_number"]
            ));
        }
        if let Some(r) = ev.get("response") {
            check_echo(&mut errors, &format!("event {}", ev["type"]), r);
        }
    }
    let names: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    for want in [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ] {
        if !names.contains(&want) {
            errors.push(format!("stream: no {want} in {names:?}"));
        }
    }
    let created = &events[0]["response"]["id"];
    if events
        .iter()
        .any(|e| e.get("response").is_some_and(|r| &r["id"] != created))
    {
        errors.push("stream: the response id changes between events".into());
    }

    assert!(errors.is_empty(), "{kind}:\n{}", errors.join("\n"));
}

macro_rules! spec_per_kind {
    ($($kind:ident => $rig:path;)+) => {
        $(
            #[test]
            fn $kind() {
                let rig = $rig();
                run(stringify!($kind), &rig);
            }
        )+
    };
}

spec_per_kind! {
    openai => openai_rig;
    anthropic => anthropic_rig;
    azure_openai => azure_openai_rig;
    gemini => gemini_rig;
    vertex_claude => vertex_claude_rig;
    vertex_gemini => vertex_gemini_rig;
    bedrock_claude => bedrock_claude_rig;
    bedrock_converse => bedrock_converse_rig;
}

/// Reasoning items: `encrypted_content` is the signature when the provider gave one and no
/// member otherwise (an OpenAI-compatible `reasoning_content` carries none), never `null`.
#[test]
fn reasoning_items_have_a_string_or_no_encrypted_content() {
    for (rig, signed) in [(openai_rig(), false), (anthropic_rig(), true)] {
        let mut behavior = rig.base.clone();
        behavior["text"] = json!("Done.");
        behavior["reasoning"] = json!("Thinking it over.");
        rig.mock.set_behavior(&behavior.to_string());
        let body = json!({"model": MODEL, "input": "hi"}).to_string();
        let auth = format!("Bearer {KEY}");
        let r = post_json(
            rig.sluice.addr,
            "/v1/responses",
            &[("authorization", &auth)],
            &body,
        );
        let v = r.json();
        let rs = v["output"]
            .as_array()
            .and_then(|o| o.iter().find(|i| i["type"] == "reasoning"))
            .unwrap_or_else(|| panic!("a reasoning item: {v}"));
        assert_eq!(rs.get("encrypted_content").is_some(), signed, "{rs}");
        if signed {
            assert!(rs["encrypted_content"].is_string(), "{rs}");
        }
    }
}

/// `POST /v1/responses/input_tokens`: the local estimate in OpenAI's shape; the body is a
/// `POST /v1/responses` body; errors in OpenAI's shape.
#[test]
fn input_tokens_is_estimated() {
    let rig = openai_rig();
    let auth = format!("Bearer {KEY}");
    let headers = [("authorization", auth.as_str())];
    let small = json!({"model": MODEL, "input": "Say hello."}).to_string();
    let big = json!({"model": MODEL, "instructions": "Be brief.", "input": "Say hello. ".repeat(200), "tools": [weather_tool()]}).to_string();
    let a = post_json(
        rig.sluice.addr,
        "/v1/responses/input_tokens",
        &headers,
        &small,
    );
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.header("x-sluice-token-count"), Some("estimate"));
    let a = a.json();
    assert_eq!(a["object"], "response.input_tokens", "{a}");
    let b = post_json(
        rig.sluice.addr,
        "/v1/responses/input_tokens",
        &headers,
        &big,
    )
    .json();
    let (na, nb) = (
        a["input_tokens"].as_u64().unwrap(),
        b["input_tokens"].as_u64().unwrap(),
    );
    assert!(na > 0 && nb > na + 200, "{na} {nb}");
    assert!(rig.model_calls().is_empty(), "an estimate calls no model");
    let bad = post_json(
        rig.sluice.addr,
        "/v1/responses/input_tokens",
        &headers,
        r#"{"input":"x"}"#,
    );
    assert_eq!(bad.status, 400, "{}", bad.text());
    assert_eq!(bad.json()["error"]["param"], "model");
    let unknown = json!({"model": "acme/nope", "input": "x"}).to_string();
    let nf = post_json(
        rig.sluice.addr,
        "/v1/responses/input_tokens",
        &headers,
        &unknown,
    );
    assert_eq!(nf.status, 404, "{}", nf.text());
}

/// `POST /v1/responses/compact`: 400 without a model (the suite's compact-missing-model),
/// 404 for an unknown one, 401 without a key, else 501 naming the model; no model is called.
#[test]
fn compact_is_checked_then_not_implemented() {
    let rig = anthropic_rig();
    let auth = format!("Bearer {KEY}");
    let headers = [("authorization", auth.as_str())];
    let post =
        |h: &[(&str, &str)], b: &str| post_json(rig.sluice.addr, "/v1/responses/compact", h, b);
    let missing = post(
        &headers,
        r#"{"input":[{"role":"user","content":"Compact this."}]}"#,
    );
    assert_eq!(missing.status, 400, "{}", missing.text());
    assert_eq!(missing.json()["error"]["param"], "model");
    let body =
        json!({"model": MODEL, "input": [{"role": "user", "content": "We launch Tuesday."}]})
            .to_string();
    assert_eq!(post(&[], &body).status, 401);
    let nf = post(
        &headers,
        &json!({"model": "acme/nope", "input": []}).to_string(),
    );
    assert_eq!(nf.status, 404, "{}", nf.text());
    let r = post(&headers, &body);
    assert_eq!(r.status, 501, "{}", r.text());
    let v = r.json();
    assert!(
        v["error"]["message"].as_str().unwrap().contains(MODEL),
        "{v}"
    );
    assert!(rig.model_calls().is_empty());
    let get = crate::harness::client::get(rig.sluice.addr, "/v1/responses/compact", &headers);
    assert_eq!(get.status, 405, "{}", get.text());
}
