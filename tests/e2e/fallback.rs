//! Fallback before the first byte, never after: several mock providers on loopback with
//! scripted failures (503, 429 + `Retry-After`, refused connection, stall before the head,
//! silence before the first event, close before the first event, death mid-stream).
//!
//! Each test asserts which provider served (`x-sluice-provider`, `x-sluice-fallback-depth`),
//! the exact client-visible bytes (no trace of the failed provider, `model` = the standard
//! id), how often each upstream was called (the single same-route retry for connect errors
//! and 502/503 happens only on the last available route: with another candidate available,
//! falling back at once is faster), and the fallback metrics.
//!
//! The helpers here (`config`, `Metrics`, `chat_hits`, ...) are shared with `routing` and
//! `health`.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::client::{post_json, sse_events, sse_text, Response};
use crate::harness::{dead_url, Mock, Sluice, KEY};

/// The standard model every helper config serves.
pub(crate) const MODEL: &str = "acme/chat";

/// A provider of a helper config: id, `base_url`, extra lines under `providers.<id>`
/// (indented 4 spaces).
pub(crate) struct P<'a>(pub &'a str, pub &'a str, pub &'a str);

/// A config with `providers` (probes off unless `extra` turns them on) and the model
/// `acme/chat` routed to each provider in order (`priority` 1, 2, ..., upstream model
/// `<id>-model`). `server` lines go under `server:`, `model` lines under `models.acme/chat`
/// (indented 4 spaces).
pub(crate) fn config(server: &str, providers: &[P<'_>], model: &str) -> String {
    let mut routes = String::new();
    for (i, P(id, _, _)) in providers.iter().enumerate() {
        routes.push_str(&format!(
            "      - provider: {id}\n        upstream_model: {id}-model\n        priority: {}\n",
            i + 1
        ));
    }
    config_with_routes(server, providers, &format!("{model}    routes:\n{routes}"))
}

/// As [`config`], with the lines under `models.acme/chat` given whole. Same-route retries are
/// off (`retry: {max_attempts_per_route: 1}`) unless `server` sets `retry:` itself: these
/// tests are about fallback and health; `tests/e2e/retry.rs` covers the retry policy.
pub(crate) fn config_with_routes(server: &str, providers: &[P<'_>], model_body: &str) -> String {
    let server = if server.contains("retry:") {
        server.to_string()
    } else {
        format!("{server}  retry: {{max_attempts_per_route: 1}}\n")
    };
    let mut y = format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\n{server}tenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n"
    );
    for P(id, url, extra) in providers {
        let probe = if extra.contains("health_check") {
            ""
        } else {
            "    health_check: {enabled: false}\n"
        };
        y.push_str(&format!(
            "  {id}:\n    kind: openai\n    base_url: {url}\n    api_key: sk-provider-secret-{id}\n{probe}{extra}"
        ));
    }
    y.push_str(&format!("models:\n  {MODEL}:\n{model_body}"));
    y
}

/// A chat body for `acme/chat`; `extra` is spliced in as further top-level fields
/// (e.g. `,"mock":{...}`).
pub(crate) fn body(stream: bool, extra: &str) -> String {
    format!(
        r#"{{"model":"{MODEL}","stream":{stream},"messages":[{{"role":"user","content":"hi"}}]{extra}}}"#
    )
}

/// The mock's recorded chat requests (probe `GET`s left out).
pub(crate) fn chat_log(mock: &Mock) -> Vec<Value> {
    mock.log()
        .into_iter()
        .filter(|r| {
            r["path"]
                .as_str()
                .is_some_and(|p| p.ends_with("/chat/completions"))
        })
        .collect()
}

/// How many chat requests the mock received.
pub(crate) fn chat_hits(mock: &Mock) -> usize {
    chat_log(mock).len()
}

/// POSTs a chat completion with extra request headers.
pub(crate) fn chat_with_headers(sluice: &Sluice, headers: &[(&str, &str)], body: &str) -> Response {
    let auth = format!("Bearer {KEY}");
    let mut h = vec![("authorization", auth.as_str())];
    h.extend_from_slice(headers);
    post_json(sluice.addr, "/v1/chat/completions", &h, body)
}

/// A scrape of `/metrics`.
pub(crate) struct Metrics(pub String);

impl Metrics {
    pub(crate) fn scrape(sluice: &Sluice) -> Metrics {
        Metrics(sluice.metrics())
    }

    /// The value of the sample `name` whose labels include all of `labels` (any order);
    /// 0 when absent (for counters: a labelled counter appears with its first event).
    pub(crate) fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get_opt(name, labels).unwrap_or(0.0)
    }

    /// As [`Metrics::get`], `None` when no such sample exists (for gauges).
    pub(crate) fn get_opt(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.0
            .lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                let (n, rest) = series.split_once('{').unwrap_or((series, "}"));
                if n != name {
                    return None;
                }
                let all = labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")));
                all.then(|| value.parse().ok()).flatten()
            })
    }
}

/// Waits (up to 2 s) until the sample `name{labels}` reads `want`; returns the last value.
/// Some metrics are recorded just after the response's last byte was written, so a scrape
/// right after a response may be a moment early.
pub(crate) fn wait_metric(sluice: &Sluice, name: &str, labels: &[(&str, &str)], want: f64) -> f64 {
    let mut last = 0.0;
    eventually(Duration::from_secs(2), || {
        last = Metrics::scrape(sluice).get(name, labels);
        last == want
    });
    last
}

pub(crate) use crate::harness::eventually;

/// Asserts a served streaming answer: status, provider, depth, the text, clean bytes.
pub(crate) fn assert_served_stream(
    sluice: &Sluice,
    req: &str,
    provider: &str,
    depth: u32,
    text: &str,
) -> String {
    let mut s = sluice.chat_stream(req);
    let head = (s.status, s.headers.clone());
    let bytes = s.read_to_end(Duration::from_secs(10));
    let body = String::from_utf8_lossy(&bytes).into_owned();
    assert_eq!(head.0, 200, "{head:?} {body}");
    assert_eq!(s.header("x-sluice-provider"), Some(provider), "{head:?}");
    assert_eq!(
        s.header("x-sluice-fallback-depth"),
        Some(depth.to_string().as_str()),
        "{head:?}"
    );
    assert_clean_stream(&body, text);
    body
}

/// A complete OpenAI stream with `text`, every chunk naming the standard model and nothing
/// of any upstream (model names, provider keys, error text).
pub(crate) fn assert_clean_stream(body: &str, text: &str) {
    assert_eq!(sse_text(body.as_bytes()), text, "{body}");
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    for ev in sse_events(body.as_bytes()) {
        let Some(data) = ev.strip_prefix("data: ") else {
            panic!("unexpected event {ev:?} in {body}");
        };
        if data == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(data).expect("chunk JSON");
        assert_eq!(v["model"], MODEL, "{data}");
    }
    for trace in ["-model", "sk-provider", "error", "p1", "mock upstream"] {
        assert!(!body.contains(trace), "`{trace}` leaked into {body}");
    }
}

fn tokens(n: usize) -> String {
    (0..n).map(|i| format!("tok{i} ")).collect()
}

#[test]
fn a_503_falls_back_at_once_when_another_route_is_available() {
    let p1 = Mock::start(r#"{"status":503}"#);
    let p2 = Mock::start(r#"{"tokens":3}"#);
    let sluice = Sluice::start(&config(
        "",
        &[P("p1", &p1.base_url(), ""), P("p2", &p2.base_url(), "")],
        "",
    ));
    assert_served_stream(&sluice, &body(true, ""), "p2", 1, &tokens(3));
    assert_eq!(
        chat_hits(&p1),
        1,
        "no same-route retry while p2 is available"
    );
    assert_eq!(chat_hits(&p2), 1);
    assert_eq!(chat_log(&p2)[0]["model"], "p2-model");
    let m = Metrics::scrape(&sluice);
    let fb = [
        ("model", MODEL),
        ("from_provider", "p1"),
        ("to_provider", "p2"),
        ("reason", "status_5xx"),
    ];
    assert_eq!(m.get("sluice_fallback_total", &fb), 1.0, "{}", m.0);
    assert_eq!(m.get("sluice_upstream_retries_total", &[]), 0.0);
    assert_eq!(
        wait_metric(&sluice, "sluice_fallback_depth_count", &[], 1.0),
        1.0
    );
    assert_eq!(
        Metrics::scrape(&sluice).get("sluice_fallback_depth_sum", &[]),
        1.0
    );
    // p1 is degraded (default: after 1 failure).
    assert_eq!(
        m.get(
            "sluice_provider_health",
            &[("provider", "p1"), ("route", "p1/p1-model")]
        ),
        1.0
    );
    assert_eq!(
        m.get(
            "sluice_provider_health",
            &[("provider", "p2"), ("route", "p2/p2-model")]
        ),
        0.0
    );
}

#[test]
fn every_retryable_status_falls_back() {
    let p1 = Mock::start("{}");
    let p2 = Mock::start(r#"{"tokens":2}"#);
    // Thresholds high enough that p1 stays healthy (first) through the whole table.
    let many = "    health: {degraded_after_failures: 1000, unhealthy_after_failures: 1000}\n";
    let sluice = Sluice::start(&config(
        "",
        &[P("p1", &p1.base_url(), many), P("p2", &p2.base_url(), "")],
        "",
    ));
    for (status, reason) in [
        (500, "status_5xx"),
        (502, "status_5xx"),
        (503, "status_5xx"),
        (504, "status_5xx"),
        (529, "status_5xx"),
        (408, "status_4xx"),
        (409, "status_4xx"),
        (429, "status_429"),
        (401, "status_4xx"),
        (403, "status_4xx"),
    ] {
        p1.reset();
        p2.reset();
        p1.set_behavior(&format!(r#"{{"status":{status}}}"#));
        let before = Metrics::scrape(&sluice).get(
            "sluice_fallback_total",
            &[("from_provider", "p1"), ("reason", reason)],
        );
        for stream in [true, false] {
            let r = sluice.chat(&body(stream, ""));
            assert_eq!(r.status, 200, "{status}: {}", r.text());
            assert_eq!(r.header("x-sluice-provider"), Some("p2"), "{status}");
            assert_eq!(r.header("x-sluice-fallback-depth"), Some("1"), "{status}");
            assert!(!r.text().contains("p1"), "{status}: {}", r.text());
        }
        assert_eq!(chat_hits(&p1), 2, "HTTP {status}");
        assert_eq!(chat_hits(&p2), 2, "HTTP {status}");
        let after = Metrics::scrape(&sluice).get(
            "sluice_fallback_total",
            &[("from_provider", "p1"), ("reason", reason)],
        );
        assert_eq!(after - before, 2.0, "HTTP {status}");
    }
    assert_eq!(
        Metrics::scrape(&sluice).get("sluice_upstream_retries_total", &[]),
        0.0
    );
}

#[test]
fn a_429_with_retry_after_falls_back_without_retry_and_rests_the_route() {
    let p1 = Mock::start(r#"{"status":429,"retry_after_s":30}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let many = "    health: {degraded_after_failures: 1000, unhealthy_after_failures: 1000}\n";
    let sluice = Sluice::start(&config(
        "",
        &[P("p1", &p1.base_url(), many), P("p2", &p2.base_url(), "")],
        "",
    ));
    assert_served_stream(&sluice, &body(true, ""), "p2", 1, &tokens(2));
    assert_eq!(chat_hits(&p1), 1, "no same-route retry on 429");
    // The Retry-After cool-down: p1 (still healthy, still first) is not asked again.
    assert_served_stream(&sluice, &body(true, ""), "p2", 0, &tokens(2));
    assert_eq!(chat_hits(&p1), 1);
    assert_eq!(chat_hits(&p2), 2);
    let m = Metrics::scrape(&sluice);
    assert_eq!(
        m.get(
            "sluice_fallback_total",
            &[
                ("model", MODEL),
                ("from_provider", "p1"),
                ("to_provider", "p2"),
                ("reason", "status_429")
            ]
        ),
        1.0
    );
    assert_eq!(
        m.get("sluice_upstream_retries_total", &[("provider", "p1")]),
        0.0
    );
}

#[test]
fn refused_connections_fall_back() {
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let sluice = Sluice::start(&config(
        "",
        &[
            P("p1", &dead_url(), ""),
            P("p3", &dead_url(), ""),
            P("p2", &p2.base_url(), ""),
        ],
        "",
    ));
    let t = Instant::now();
    assert_served_stream(&sluice, &body(true, ""), "p2", 2, &tokens(2));
    eprintln!("two refused providers + fallback: {:?}", t.elapsed());
    assert_eq!(chat_hits(&p2), 1);
    let m = Metrics::scrape(&sluice);
    for p in ["p1", "p3"] {
        assert_eq!(
            m.get(
                "sluice_upstream_attempts_total",
                &[("provider", p), ("outcome", "connect")]
            ),
            1.0,
            "{p}"
        );
    }
    assert_eq!(m.get("sluice_upstream_retries_total", &[]), 0.0);
    for (from, to) in [("p1", "p3"), ("p3", "p2")] {
        assert_eq!(
            m.get(
                "sluice_fallback_total",
                &[
                    ("from_provider", from),
                    ("to_provider", to),
                    ("reason", "connect")
                ]
            ),
            1.0,
            "{from}->{to}"
        );
    }
    assert_eq!(
        wait_metric(&sluice, "sluice_fallback_depth_sum", &[], 2.0),
        2.0
    );
}

#[test]
fn a_stall_before_the_response_head_falls_back_after_first_byte_timeout() {
    let p1 = Mock::start(r#"{"stall":true,"stall_max_ms":10000}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let sluice = Sluice::start(&config(
        "",
        &[
            P("p1", &p1.base_url(), "    first_byte_timeout_ms: 300\n"),
            P("p2", &p2.base_url(), ""),
        ],
        "",
    ));
    let t = Instant::now();
    assert_served_stream(&sluice, &body(true, ""), "p2", 1, &tokens(2));
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert_eq!(chat_hits(&p1), 1, "no retry after a timeout");
    // Sluice abandoned the stalled upstream request.
    let log = p1.wait_log(Duration::from_secs(2), |l| {
        l.iter().any(|r| r["peer_closed_at_ms"].is_u64())
    });
    assert!(log[0]["peer_closed_at_ms"].is_u64(), "{log:?}");
    assert_eq!(
        Metrics::scrape(&sluice).get(
            "sluice_fallback_total",
            &[("from_provider", "p1"), ("reason", "first_byte_timeout")]
        ),
        1.0
    );
}

#[test]
fn silence_after_the_head_falls_back_after_first_event_timeout() {
    let p1 = Mock::start(r#"{"first_event_delay_ms":5000}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let sluice = Sluice::start(&config(
        "",
        &[
            P("p1", &p1.base_url(), "    first_event_timeout_ms: 300\n"),
            P("p2", &p2.base_url(), ""),
        ],
        "",
    ));
    let t = Instant::now();
    let mut s = sluice.chat_stream(&body(true, ""));
    let head_after = s.head_at - s.sent_at;
    let bytes = s.read_to_end(Duration::from_secs(10));
    assert_eq!(s.header("x-sluice-provider"), Some("p2"));
    assert_eq!(s.header("x-sluice-fallback-depth"), Some("1"));
    assert_clean_stream(&String::from_utf8_lossy(&bytes), &tokens(2));
    // The head waited for p2's first event: p1's 200 never reached the client.
    assert!(head_after >= Duration::from_millis(300), "{head_after:?}");
    assert!(t.elapsed() < Duration::from_secs(3));
    assert_eq!(chat_hits(&p1), 1);
    assert_eq!(
        Metrics::scrape(&sluice).get(
            "sluice_fallback_total",
            &[("from_provider", "p1"), ("reason", "first_event_timeout")]
        ),
        1.0
    );
}

#[test]
fn the_models_ttft_budget_overrides_the_providers() {
    let p1 = Mock::start(r#"{"first_event_delay_ms":5000}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let sluice = Sluice::start(&config(
        "",
        &[P("p1", &p1.base_url(), ""), P("p2", &p2.base_url(), "")],
        "    first_event_timeout_ms: 250\n",
    ));
    let t = Instant::now();
    assert_served_stream(&sluice, &body(true, ""), "p2", 1, &tokens(2));
    // p1 was given the model's 250 ms, not the provider's default budget.
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(3),
        "{took:?}"
    );
}

#[test]
fn a_close_before_the_first_event_falls_back_without_retry() {
    let p1 = Mock::start(r#"{"close_before_first_event":true}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let sluice = Sluice::start(&config(
        "",
        &[P("p1", &p1.base_url(), ""), P("p2", &p2.base_url(), "")],
        "",
    ));
    assert_served_stream(&sluice, &body(true, ""), "p2", 1, &tokens(2));
    assert_eq!(chat_hits(&p1), 1);
    assert_eq!(
        Metrics::scrape(&sluice).get(
            "sluice_fallback_total",
            &[("from_provider", "p1"), ("reason", "protocol")]
        ),
        1.0
    );
}

#[test]
fn a_stream_that_dies_midway_ends_with_an_error_event_and_is_never_resent() {
    let p1 = Mock::start(r#"{"tokens":5,"drop_after_tokens":2}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let sluice = Sluice::start(&config(
        "",
        &[P("p1", &p1.base_url(), ""), P("p2", &p2.base_url(), "")],
        "",
    ));
    let mut s = sluice.chat_stream(&body(true, ""));
    assert_eq!(s.status, 200);
    assert_eq!(s.header("x-sluice-provider"), Some("p1"));
    assert_eq!(s.header("x-sluice-fallback-depth"), Some("0"));
    let bytes = s.read_to_end(Duration::from_secs(10));
    assert!(s.is_done(), "the stream ends cleanly (chunked terminator)");
    let text = String::from_utf8_lossy(&bytes).into_owned();
    assert_eq!(sse_text(&bytes), tokens(2), "{text}");
    let events = sse_events(&bytes);
    let last = events.last().expect("events");
    let data = last
        .strip_prefix("event: error\ndata: ")
        .unwrap_or_else(|| panic!("last event is an error event: {text}"));
    let v: Value = serde_json::from_str(data).expect("error JSON");
    assert!(v["error"]["message"].is_string(), "{v}");
    assert!(v["error"]["type"].is_string(), "{v}");
    assert!(!text.contains("[DONE]"), "{text}");
    assert!(!text.contains("p1-model"), "{text}");
    // No double billing: neither p1 again nor p2.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(chat_hits(&p1), 1);
    assert_eq!(chat_hits(&p2), 0);
    let m = Metrics::scrape(&sluice);
    assert_eq!(m.get("sluice_fallback_total", &[]), 0.0);
    assert_eq!(
        m.get(
            "sluice_stream_errors_total",
            &[("reason", "upstream_broken")]
        ),
        1.0
    );
}

#[test]
fn a_broken_non_stream_body_is_a_502_and_never_resent() {
    let p1 = Mock::start(r#"{"tokens":50,"drop_after_tokens":2}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let sluice = Sluice::start(&config(
        "",
        &[P("p1", &p1.base_url(), ""), P("p2", &p2.base_url(), "")],
        "",
    ));
    let r = sluice.chat(&body(false, ""));
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "api_error");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(chat_hits(&p1), 1);
    assert_eq!(chat_hits(&p2), 0);
    assert_eq!(
        Metrics::scrape(&sluice).get("sluice_upstream_retries_total", &[]),
        0.0
    );
}

#[test]
fn a_400_from_the_provider_is_returned_and_not_retried() {
    let p1 = Mock::start(
        r#"{"status":400,"error_message":"messages[0].content is too long for this model"}"#,
    );
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let sluice = Sluice::start(&config(
        "",
        &[P("p1", &p1.base_url(), ""), P("p2", &p2.base_url(), "")],
        "",
    ));
    for stream in [true, false] {
        let r = sluice.chat(&body(stream, ""));
        assert_eq!(r.status, 400, "{}", r.text());
        let v = r.json();
        assert_eq!(
            v["error"]["message"],
            "messages[0].content is too long for this model"
        );
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
    assert_eq!(chat_hits(&p1), 2);
    assert_eq!(chat_hits(&p2), 0);
    let m = Metrics::scrape(&sluice);
    assert_eq!(m.get("sluice_fallback_total", &[]), 0.0);
    // A 4xx about the request says nothing bad about the provider.
    assert_eq!(
        m.get(
            "sluice_provider_health",
            &[("provider", "p1"), ("route", "p1/p1-model")]
        ),
        0.0
    );
}

#[test]
fn a_one_mib_request_body_falls_back_whole() {
    let p1 = Mock::start(r#"{"status":503}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let sluice = Sluice::start(&config(
        "",
        &[P("p1", &p1.base_url(), ""), P("p2", &p2.base_url(), "")],
        "",
    ));
    let big = "x".repeat(1024 * 1024);
    let req = format!(
        r#"{{"model":"{MODEL}","stream":true,"messages":[{{"role":"user","content":"{big}"}}]}}"#
    );
    assert!(req.len() > 1024 * 1024);
    assert_served_stream(&sluice, &req, "p2", 1, &tokens(2));
    let l1 = chat_log(&p1);
    let l2 = chat_log(&p2);
    assert_eq!((l1.len(), l2.len()), (1, 1));
    // What the client sent, with only `model` changed (both upstream names are 8 bytes) and
    // the usage asked for (metering: `stream_options.include_usage`).
    let expected = req.len() - MODEL.len()
        + "p2-model".len()
        + r#","stream_options":{"include_usage":true}"#.len();
    assert_eq!(l1[0]["body_bytes"], expected as u64);
    assert_eq!(
        l2[0]["body_bytes"], expected as u64,
        "p2 got the whole body"
    );
    assert_eq!(l2[0]["model"], "p2-model");
    assert_eq!(l2[0]["headers"]["content-length"], expected.to_string());
}

#[test]
fn a_non_stream_request_falls_back_and_keeps_the_standard_model() {
    let p1 = Mock::start(r#"{"status":503}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let sluice = Sluice::start(&config(
        "",
        &[P("p1", &p1.base_url(), ""), P("p2", &p2.base_url(), "")],
        "",
    ));
    let r = sluice.chat(&body(false, ""));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-sluice-provider"), Some("p2"));
    assert_eq!(r.header("x-sluice-fallback-depth"), Some("1"));
    let v = r.json();
    assert_eq!(v["model"], MODEL);
    assert_eq!(v["choices"][0]["message"]["content"], tokens(2));
    assert!(!r.text().contains("-model"), "{}", r.text());
    assert_eq!(chat_hits(&p1), 1);
}

#[test]
fn when_every_provider_fails_the_last_error_is_returned() {
    let p1 = Mock::start(r#"{"status":500}"#);
    let p2 = Mock::start(r#"{"status":429,"retry_after_s":7}"#);
    let sluice = Sluice::start(&config(
        "",
        &[P("p1", &p1.base_url(), ""), P("p2", &p2.base_url(), "")],
        "",
    ));
    let r = sluice.chat(&body(true, ""));
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("7"));
    // The provider's own error, in OpenAI's shape.
    assert!(r.json()["error"]["message"].is_string(), "{}", r.text());
    assert!(!r.text().contains("p1"), "{}", r.text());
    assert_eq!((chat_hits(&p1), chat_hits(&p2)), (1, 1));
}

/// The fallback after an immediate 500 or 503 is served at depth 1 (the target on its added
/// time, <= the failing provider's own time + 1 ms, is measured in a release build by
/// `cargo bench --bench fallback`; a debug build on a shared machine cannot hold it).
#[test]
fn a_fallback_after_an_immediate_failure_is_served_at_depth_one() {
    let p500 = Mock::start(r#"{"status":500}"#);
    let p503 = Mock::start(r#"{"status":503}"#);
    let ok = Mock::start(r#"{"tokens":1}"#);
    let many = "    health: {degraded_after_failures: 100000, unhealthy_after_failures: 100000}\n";
    let routes = "    routes:\n      - provider: first\n        upstream_model: first-model\n        priority: 1\n      - provider: ok\n        upstream_model: ok-model\n        priority: 2\n";
    let base = |first_url: &str| {
        config_with_routes(
            "",
            &[P("first", first_url, many), P("ok", &ok.base_url(), "")],
            routes,
        )
    };
    let via500 = Sluice::start(&base(&p500.base_url()));
    let via503 = Sluice::start(&base(&p503.base_url()));
    for i in 0..5 {
        for s in [&via500, &via503] {
            let r = s.chat(&body(false, ""));
            assert_eq!(r.status, 200, "{}", r.text());
            assert_eq!(r.header("x-sluice-fallback-depth"), Some("1"));
            assert_eq!(r.header("x-sluice-provider"), Some("ok"));
            assert_eq!(r.json()["model"], "acme/chat", "request {i}");
        }
    }
    // Each failing provider was asked exactly once per request, never retried.
    assert_eq!((chat_hits(&p500), chat_hits(&p503)), (5, 5));
    assert_eq!(chat_hits(&ok), 10);
}
