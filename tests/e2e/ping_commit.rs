//! A Messages-dialect upstream's `ping` is chatter, not the answer's first event: a `ping`
//! before `message_start` must not commit the response. A provider that pings and then fails
//! before `message_start` is still invisible to the client: Sluice falls back to the next
//! route before the first byte, for a Messages client (same-dialect fast path, where the
//! events are forwarded) and for a Chat Completions client (translated path) alike.

use std::time::Duration;

use crate::harness::client::{sse_events, sse_text, StreamReader};
use crate::harness::{Mock, Sluice, KEY};

/// Two Anthropic providers for `acme/claude`: `p1` first, `p2` second.
fn config(p1: &str, p2: &str) -> String {
    format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\n  retry: {{max_attempts_per_route: 1}}\ntenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n  p1:\n    kind: anthropic\n    base_url: {p1}\n    api_key: sk-ant-provider-secret-1\n    health_check: {{enabled: false}}\n  p2:\n    kind: anthropic\n    base_url: {p2}\n    api_key: sk-ant-provider-secret-2\n    health_check: {{enabled: false}}\nmodels:\n  acme/claude:\n    routes:\n      - provider: p1\n        upstream_model: claude-mock-1\n        priority: 1\n      - provider: p2\n        upstream_model: claude-mock-2\n        priority: 2\n"
    )
}

/// The text deltas of a Messages stream, concatenated.
fn messages_text(body: &[u8]) -> String {
    let mut text = String::new();
    for e in sse_events(body) {
        for line in e.lines() {
            if let Some(d) = line.strip_prefix("data: ") {
                let v: serde_json::Value = serde_json::from_str(d).expect("event JSON");
                if let Some(t) = v["delta"]["text"].as_str() {
                    text.push_str(t);
                }
            }
        }
    }
    text
}

#[test]
fn a_ping_before_message_start_does_not_commit_and_a_later_failure_falls_back() {
    // p1: head, then pings every 50 ms for 300 ms, then closes before `message_start`.
    let p1 = Mock::start(
        r#"{"first_event_delay_ms":300,"ping_interval_ms":50,"close_before_first_event":true}"#,
    );
    let p2 = Mock::start(r#"{"tokens":2}"#);
    for (path, body, auth) in [
        (
            "/v1/messages",
            r#"{"model":"acme/claude","max_tokens":64,"messages":[{"role":"user","content":"hi"}],"stream":true}"#,
            ("x-api-key", KEY.to_string()),
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"acme/claude","messages":[{"role":"user","content":"hi"}],"stream":true}"#,
            ("authorization", format!("Bearer {KEY}")),
        ),
    ] {
        // A fresh gateway per client: p1's failure must not make it rest for the next one.
        let sluice = Sluice::start(&config(&p1.base_url(), &p2.base_url()));
        let headers = [
            (auth.0, auth.1.as_str()),
            ("anthropic-version", "2023-06-01"),
        ];
        let mut s = StreamReader::open(sluice.addr, path, &headers, body);
        assert_eq!(s.status, 200, "{path}");
        assert_eq!(s.header("x-sluice-provider"), Some("p2"), "{path}");
        assert_eq!(s.header("x-sluice-fallback-depth"), Some("1"), "{path}");
        let out = s.read_to_end(Duration::from_secs(10));
        let text = String::from_utf8_lossy(&out);
        assert!(!text.contains("error"), "{path}: {text}");
        if path == "/v1/messages" {
            let events = sse_events(&out);
            assert!(
                events[0].starts_with("event: message_start"),
                "{path}: the stream opens with message_start: {text}"
            );
            assert!(text.contains("event: message_stop"), "{path}: {text}");
            assert_eq!(messages_text(&out), "tok0 tok1 ", "{path}");
        } else {
            assert_eq!(sse_text(&out), "tok0 tok1 ", "{path}");
            assert!(text.contains("data: [DONE]"), "{path}: {text}");
        }
    }
    // p1 was asked once per client; each time it failed before its first event.
    assert_eq!(p1.hits(), 2);
}
