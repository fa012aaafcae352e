//! Answers no client chokes on (issue 30, items 8 to 13): a non-JSON 200 is a provider
//! failure on every client dialect; a non-JSON event inside a stream never reaches the
//! client; a provider that ignores `stream: true` still gives the client a stream; an answer
//! with more choices than asked is translated from choice 0 only; upstream keepalives reach a
//! translated stream's client; the head timeouts fit non-stream and stream requests, and a
//! timed-out attempt is recorded against its provider at its estimated cost.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::dialect_matrix::{run_cell, Client, Scenario, Seen};
use crate::harness::client::sse_events;
use crate::harness::{Mock, Sluice, StreamReader, KEY};
use crate::ledger::wait_records;
use crate::sdk::run_python;

const CLIENTS: [Client; 3] = [Client::Chat, Client::Messages, Client::Responses];
const TEXT: &str = "tout va bien, ünïcode ✓";
const HTML: &str = "<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>";

/// OpenAI-kind providers `(id, base_url, extra provider lines)` behind `acme/chat` in order
/// (`upstream_model` `<id>-model`, 1000 USD per million input tokens), `server` lines under
/// `server:`.
fn config(server: &str, providers: &[(&str, &str, &str)]) -> String {
    let mut y = format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\n  retry: {{max_attempts_per_route: 1}}\n{server}tenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n"
    );
    for (id, url, extra) in providers {
        y.push_str(&format!(
            "  {id}:\n    kind: openai\n    base_url: {url}\n    api_key: sk-{id}\n    health_check: {{enabled: false}}\n{extra}"
        ));
    }
    y.push_str("models:\n  acme/chat:\n    default_max_tokens: 1024\n    routes:\n");
    for (i, (id, _, _)) in providers.iter().enumerate() {
        y.push_str(&format!(
            "      - provider: {id}\n        upstream_model: {id}-model\n        priority: {}\n        input_usd_per_mtok: 1000\n",
            i + 1
        ));
    }
    y
}

/// One request of `client` for `acme/chat` (a plain text turn, or one offering a tool).
fn cell(sluice: &Sluice, client: Client, scenario: Scenario, stream: bool) -> (u16, String, Seen) {
    run_cell(
        sluice,
        client,
        &client.body(scenario, "acme/chat", stream),
        stream,
    )
}

fn p1_health(sluice: &Sluice) -> f64 {
    sluice.metric(r#"sluice_provider_health{provider="p1",route="p1/p1-model"}"#)
}

// ------------------------------------------------------------------ item 8

#[test]
fn a_non_json_200_falls_back_on_every_client_dialect_and_rests_the_route() {
    // Chat: the issue's case, HTML under `application/json`; the others HTML and plain text.
    let cases = [
        (Client::Chat, "application/json", HTML),
        (Client::Messages, "text/html", HTML),
        (
            Client::Responses,
            "text/plain",
            "upstream connect error or disconnect",
        ),
    ];
    for (client, content_type, body) in cases {
        let bad =
            Mock::start(&json!({"answer_body": body, "content_type": content_type}).to_string());
        let good = Mock::start(&json!({"text": TEXT}).to_string());
        let sluice = Sluice::start(&config(
            "",
            &[
                (
                    "p1",
                    &bad.base_url(),
                    "    health: {unhealthy_after_failures: 1, cooldown_ms: 60000}\n",
                ),
                ("p2", &good.base_url(), ""),
            ],
        ));
        let (status, raw, seen) = cell(&sluice, client, Scenario::Text, false);
        assert_eq!(status, 200, "{client:?}: {raw}");
        assert_eq!(seen.text, TEXT, "{client:?}: {raw}");
        assert_eq!(
            sluice.metric(
                r#"sluice_fallback_total{from_provider="p1",model="acme/chat",reason="protocol",to_provider="p2"}"#
            ),
            1.0,
            "{client:?}"
        );
        // The route is marked unhealthy: the next request does not try it.
        assert_eq!(p1_health(&sluice), 2.0, "{client:?}");
        let (status, raw, _) = cell(&sluice, client, Scenario::Text, false);
        assert_eq!(status, 200, "{client:?}: {raw}");
        assert_eq!(
            bad.hits(),
            1,
            "{client:?}: the resting route was tried again"
        );
        assert!(
            sluice.log().contains("unreadable upstream answer"),
            "{client:?}: {}",
            sluice.log()
        );
    }
}

#[test]
fn a_non_json_200_with_no_fallback_is_a_502_recorded_as_an_upstream_error() {
    let bad = Mock::start(&json!({"answer_body": HTML}).to_string());
    let sluice = Sluice::start(&config(
        "",
        &[(
            "p1",
            &bad.base_url(),
            "    health: {degraded_after_failures: 1000, unhealthy_after_failures: 1000}\n",
        )],
    ));
    for client in CLIENTS {
        let (status, raw, seen) = cell(&sluice, client, Scenario::Text, false);
        assert_eq!(status, 502, "{client:?}: {raw}");
        let (_, message) = seen.error.expect("an error body");
        assert!(message.contains("`p1`"), "{client:?}: {message}");
        assert!(
            message.contains("unreadable answer"),
            "{client:?}: {message}"
        );
        assert!(
            !message.contains("nginx"),
            "upstream bytes leaked: {message}"
        );
    }
    let recs = wait_records(sluice.dir.path(), &sluice.config_path, 3);
    assert_eq!(recs.len(), 3, "{recs:#?}");
    for r in &recs {
        assert_eq!(r["outcome"], "upstream_error", "{r}");
        assert_eq!(r["status"], 502, "{r}");
        assert_eq!(r["provider"], "p1", "{r}");
        assert_eq!(r["upstream_model"], "p1-model", "{r}");
    }
    assert_eq!(
        sluice.metric(r#"sluice_upstream_attempts_total{outcome="protocol",provider="p1"}"#),
        3.0
    );
}

// ------------------------------------------------------------------ item 9

/// The official `openai` Python SDK streaming one chat completion: prints the text.
const SDK_STREAM: &str = r#"
import sys
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1], api_key=sys.argv[2], max_retries=0)
text = ""
for chunk in client.chat.completions.create(
        model="acme/chat", stream=True,
        messages=[{"role": "user", "content": "hi"}]):
    if chunk.choices and chunk.choices[0].delta.content:
        text += chunk.choices[0].delta.content
print("TEXT=" + text)
"#;

#[test]
fn a_non_json_event_never_reaches_the_openai_sdk_and_unknown_json_events_still_pass() {
    // After the commit (token 1) and before it (token 0: the role chunk is the first event).
    for after in [0, 2] {
        let mock =
            Mock::start(&json!({"tokens": 4, "malformed_event_after_tokens": after}).to_string());
        let sluice = Sluice::start(&config("", &[("p1", &mock.base_url(), "")]));
        let base = format!("http://{}/v1", sluice.addr);
        let (ok, out) = run_python(&["-c", SDK_STREAM, &base, KEY], Duration::from_secs(60));
        assert!(ok, "after {after}: the SDK failed:\n{out}");
        assert!(
            out.contains("TEXT=tok0 tok1 tok2 tok3 "),
            "after {after}: {out}"
        );
        assert_eq!(
            sluice.metric(r#"sluice_sse_malformed_events_total{provider="p1"}"#),
            1.0,
            "after {after}"
        );
        assert!(
            sluice
                .log()
                .contains("dropped an upstream stream event that is not JSON"),
            "{}",
            sluice.log()
        );
    }

    // Same dialect: an unknown but valid JSON event still passes through untouched.
    let unknown = json!({"object": "chat.completion.annotation", "note": "from the future"});
    let mock = Mock::start(
        &json!({"tokens": 2, "malformed_event_after_tokens": 1,
            "drift": {"events": [{"data": unknown}]}})
        .to_string(),
    );
    let sluice = Sluice::start(&config("", &[("p1", &mock.base_url(), "")]));
    let mut s = sluice.chat_stream(
        r#"{"model":"acme/chat","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(s.status, 200);
    let body = String::from_utf8_lossy(&s.read_to_end(Duration::from_secs(10))).into_owned();
    assert!(body.contains(&unknown.to_string()), "{body}");
    assert!(!body.contains("mock-malformed"), "{body}");
    for e in sse_events(body.as_bytes()) {
        let data = e.strip_prefix("data: ").unwrap_or("[DONE]");
        assert!(
            data == "[DONE]" || serde_json::from_str::<Value>(data).is_ok(),
            "an event the client cannot parse: {e:?}"
        );
    }
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
}

// ------------------------------------------------------------------ item 10

#[test]
fn a_provider_that_ignores_stream_true_still_gives_every_client_a_stream() {
    let mock = Mock::start(&json!({"text": TEXT, "json_always": true}).to_string());
    let sluice = Sluice::start(&config("", &[("p1", &mock.base_url(), "")]));
    for client in CLIENTS {
        let (status, raw, seen) = cell(&sluice, client, Scenario::Text, true);
        assert_eq!(status, 200, "{client:?}: {raw}");
        assert!(seen.error.is_none(), "{client:?}: {raw}");
        assert_eq!(seen.text, TEXT, "{client:?}: {raw}");
        assert!(!seen.stop.is_empty(), "{client:?}: no stop reason: {raw}");
        assert!(seen.output_tokens > 0, "{client:?}: no usage: {raw}");
        assert!(
            seen.models.iter().all(|m| m == "acme/chat"),
            "{client:?}: {:?}",
            seen.models
        );
    }
    // Tool calls too.
    let calls = json!([{"name": "get_weather", "arguments": {"city": "Zürich"}}]);
    mock.set_behavior(&json!({"text": TEXT, "tool_calls": calls, "json_always": true}).to_string());
    for client in CLIENTS {
        let (status, raw, seen) = cell(&sluice, client, Scenario::Tool, true);
        assert_eq!(status, 200, "{client:?}: {raw}");
        assert_eq!(seen.tools.len(), 1, "{client:?}: {raw}");
        assert_eq!(seen.tools[0].1, "get_weather", "{client:?}: {raw}");
        let args: Value = serde_json::from_str(&seen.tools[0].2).expect("arguments JSON");
        assert_eq!(args, json!({"city": "Zürich"}), "{client:?}");
    }

    // An event stream labelled JSON is read as the stream it is.
    let chunk = |delta: &str, finish: &str| {
        format!(
            "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n"
        )
    };
    let sse = format!(
        "{}{}data: [DONE]\n\n",
        chunk(r#"{"role":"assistant","content":"labelled "}"#, "null"),
        chunk(r#"{"content":"wrongly"}"#, r#""stop""#)
    );
    mock.set_behavior(&json!({"answer_body": sse}).to_string());
    for client in CLIENTS {
        let (status, raw, seen) = cell(&sluice, client, Scenario::Text, true);
        assert_eq!(status, 200, "{client:?}: {raw}");
        assert_eq!(seen.text, "labelled wrongly", "{client:?}: {raw}");
    }

    // An unreadable JSON answer to a stream is a failed attempt that says what happened.
    mock.set_behavior(&json!({"answer_body": "{\"nothing\":true}"}).to_string());
    let (status, raw, seen) = cell(&sluice, Client::Chat, Scenario::Text, true);
    assert_eq!(status, 502, "{raw}");
    let (_, message) = seen.error.expect("an error body");
    assert!(message.contains("ignored `stream: true`"), "{message}");
}

// ------------------------------------------------------------------ item 11

#[test]
fn more_choices_than_asked_are_translated_from_choice_zero_only() {
    let calls = json!([{"name": "get_weather", "arguments": {"city": "Zürich"}},
                       {"name": "get_time", "arguments": {"tz": "UTC"}}]);
    let mock = Mock::start(
        &json!({"text": TEXT, "tool_calls": calls, "choices": 2, "usage": true}).to_string(),
    );
    let sluice = Sluice::start(&config("", &[("p1", &mock.base_url(), "")]));
    for client in [Client::Messages, Client::Responses] {
        for stream in [false, true] {
            let (status, raw, seen) = cell(&sluice, client, Scenario::Tool, stream);
            assert_eq!(status, 200, "{client:?} stream={stream}: {raw}");
            assert_eq!(seen.text, TEXT, "{client:?} stream={stream}: {raw}");
            let names: Vec<&str> = seen.tools.iter().map(|t| t.1.as_str()).collect();
            assert_eq!(
                names,
                ["get_weather", "get_time"],
                "{client:?} stream={stream}: {raw}"
            );
            assert!(!raw.contains("alt1"), "{client:?} stream={stream}: {raw}");
        }
    }
    // The same dialect passes every choice through untouched.
    let (status, raw, _) = cell(&sluice, Client::Chat, Scenario::Tool, false);
    assert_eq!(status, 200, "{raw}");
    let v: Value = serde_json::from_str(&raw).expect("JSON");
    assert_eq!(v["choices"].as_array().map(Vec::len), Some(2), "{raw}");
    let mut s = sluice.chat_stream(
        r#"{"model":"acme/chat","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(s.status, 200);
    let raw = String::from_utf8_lossy(&s.read_to_end(Duration::from_secs(10))).into_owned();
    assert!(raw.contains(r#""choices":[{"index":1,"#), "{raw}");
    assert!(raw.contains("alt1_get_time"), "{raw}");
}

// ------------------------------------------------------------------ item 12

/// An Anthropic-kind provider `claude` behind `acme/chat`, with `extra` provider lines.
fn anthropic_config(mock: &Mock, extra: &str) -> String {
    format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\ntenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n  claude:\n    kind: anthropic\n    base_url: {}\n    api_key: sk-ant-provider\n    health_check: {{enabled: false}}\n{extra}models:\n  acme/chat:\n    default_max_tokens: 1024\n    routes:\n      - provider: claude\n        upstream_model: claude-mock-1\n",
        mock.base_url()
    )
}

#[test]
fn upstream_pings_reach_a_translated_client_as_its_own_keepalives() {
    // Three seconds of thinking between tokens, Anthropic pinging every 250 ms; Sluice's own
    // heartbeat is far away (60 s), so only relayed pings can keep the client's line busy.
    let mock = Mock::start(
        &json!({"tokens": 2, "token_delay_ms": 3000, "ping_interval_ms": 250}).to_string(),
    );
    let sluice = Sluice::start(&anthropic_config(
        &mock,
        "    heartbeat_interval_ms: 60000\n",
    ));
    for (client, keepalive) in [
        (Client::Chat, ": keepalive"),
        (Client::Responses, ": keepalive"),
    ] {
        let body = client.body(Scenario::Text, "acme/chat", true).to_string();
        let owned: Vec<(&str, String)> = match client {
            Client::Messages => vec![("x-api-key", KEY.to_string())],
            _ => vec![("authorization", format!("Bearer {KEY}"))],
        };
        let headers: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let path = match client {
            Client::Chat => "/v1/chat/completions",
            _ => "/v1/responses",
        };
        let mut s = StreamReader::open(sluice.addr, path, &headers, &body);
        assert_eq!(s.status, 200, "{client:?}");
        let mut last = Instant::now();
        let mut longest = Duration::ZERO;
        let mut all = Vec::new();
        while let Some(piece) = s.next_piece(Duration::from_secs(10)) {
            longest = longest.max(last.elapsed());
            last = Instant::now();
            all.extend_from_slice(&piece);
        }
        let text = String::from_utf8_lossy(&all).into_owned();
        let beats = sse_events(&all).iter().filter(|e| *e == keepalive).count();
        // Two gaps of 3 s each: a keepalive at least every second of them.
        assert!(beats >= 4, "{client:?}: {beats} keepalives in {text}");
        assert!(
            longest < Duration::from_millis(1500),
            "{client:?}: the client saw nothing for {longest:?}: {text}"
        );
    }
    assert!(
        sluice.metric(r#"sluice_heartbeats_total{provider="claude"}"#) >= 8.0,
        "{}",
        sluice.metrics()
    );
}

// ------------------------------------------------------------------ item 13

#[test]
fn a_slow_non_stream_answer_outlives_the_stream_head_timeout() {
    // The stream head timeout 300 ms, the non-stream one 5 s; the provider takes 1 s.
    let mock = Mock::start(&json!({"text": TEXT, "first_byte_delay_ms": 1000}).to_string());
    let sluice = Sluice::start(&config(
        "  first_byte_timeout_ms: 300\n  non_stream_first_byte_timeout_ms: 5000\n",
        &[("p1", &mock.base_url(), "")],
    ));
    let (status, raw, seen) = cell(&sluice, Client::Chat, Scenario::Text, false);
    assert_eq!(status, 200, "{raw}");
    assert_eq!(seen.text, TEXT);
    let (status, raw, _) = cell(&sluice, Client::Chat, Scenario::Text, true);
    assert_eq!(status, 504, "a stream's head is due within 300 ms: {raw}");

    // `first_byte_timeout_ms` alone keeps meaning both, as before the non-stream key.
    let sluice = Sluice::start(&config(
        "  first_byte_timeout_ms: 300\n",
        &[("p1", &mock.base_url(), "")],
    ));
    let (status, raw, _) = cell(&sluice, Client::Chat, Scenario::Text, false);
    assert_eq!(status, 504, "{raw}");
}

#[test]
fn a_timed_out_attempt_is_recorded_with_its_provider_and_estimated_cost() {
    let mock = Mock::start(&json!({"text": TEXT, "first_byte_delay_ms": 3000}).to_string());
    let sluice = Sluice::start(&config(
        "  non_stream_first_byte_timeout_ms: 300\n",
        &[("p1", &mock.base_url(), "")],
    ));
    let (status, raw, _) = cell(&sluice, Client::Chat, Scenario::Text, false);
    assert_eq!(status, 504, "{raw}");
    let recs = wait_records(sluice.dir.path(), &sluice.config_path, 1);
    let r = &recs[0];
    assert_eq!(r["outcome"], "upstream_error", "{r}");
    assert_eq!(r["provider"], "p1", "{r}");
    assert_eq!(r["upstream_model"], "p1-model", "{r}");
    assert_eq!(r["estimated"], true, "{r}");
    let input = r["input_tokens"].as_u64().unwrap_or_default();
    assert!(input > 0, "{r}");
    // 1000 USD per million input tokens; the tenant is not charged for a 504.
    let cost = r["cost_usd"].as_f64().unwrap_or_default();
    #[expect(clippy::cast_precision_loss, reason = "a small token count")]
    let expected = input as f64 * 1e-3;
    assert!((cost - expected).abs() < 1e-9, "{r}");
    assert_eq!(r["charge_usd"], 0.0, "{r}");
}
