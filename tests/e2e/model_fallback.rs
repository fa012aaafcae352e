//! Model-level fallbacks, the context-window fallback, `retry-after-ms` and malformed
//! events (issue 12), over loopback with scripted mock providers:
//!
//! - `models.<id>.fallback_models`: every route of the model failed → the next model; the
//!   answer names the model that answered, `x-sluice-fallback-depth` counts across models,
//!   `sluice_fallback_total{reason="model_fallback"}`, the access line's `answered_model` and
//!   `failures`, tokens metered under the model that answered;
//! - the body's `models` (OpenRouter style): used, never forwarded; an unknown or disallowed
//!   model is refused with the `model`'s 404 in the client's dialect;
//! - context-length 400s (OpenAI `context_length_exceeded`, Anthropic "prompt is too long")
//!   through the chat and messages dialects: to `context_fallback_models` or a larger route
//!   of the same model, never to the regular fallbacks; without one the provider's error;
//! - a content-policy 400 stays final; `retry-after-ms` reaches the client and rests the route
//!   for its (shorter) length; a malformed event passes through, is counted, and the stream
//!   completes.
//!
//! Every test asserts the requests each mock saw.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::fallback::Metrics;
use crate::harness::client::{post_json, sse_events, sse_text, Response};
use crate::harness::{eventually, Mock, Sluice, KEY};

/// A provider of [`cfg`]: id, kind (`openai` / `anthropic`), base URL.
struct Prov<'a>(&'a str, &'a str, &'a str);

/// A config with `providers` (probes off, failures never rest a route unless a
/// `Retry-After` says so, no same-route retries), the tenant `t` (its `allowed_models` when
/// given) and `models` given whole (lines under `models:`, indented 2).
fn cfg(providers: &[Prov<'_>], models: &str, allowed: Option<&str>) -> String {
    let mut y = format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\n  retry: {{max_attempts_per_route: 1}}\ntenants:\n  t: {}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n",
        allowed.map_or("{}".to_string(), |a| format!("{{allowed_models: [{a}]}}"))
    );
    for Prov(id, kind, url) in providers {
        y.push_str(&format!(
            "  {id}:\n    kind: {kind}\n    base_url: {url}\n    api_key: sk-provider-secret-{id}\n    health_check: {{enabled: false}}\n    health: {{degraded_after_failures: 1000, unhealthy_after_failures: 1000}}\n"
        ));
    }
    y.push_str("models:\n");
    y.push_str(models);
    y
}

/// `models.<id>` with one route per provider (priority in order, upstream model
/// `<provider>-model`) and `extra` lines (indented 4).
fn model(id: &str, providers: &[&str], extra: &str) -> String {
    let mut y = format!("  {id}:\n{extra}    routes:\n");
    for (i, p) in providers.iter().enumerate() {
        y.push_str(&format!(
            "      - {{provider: {p}, upstream_model: {p}-model, priority: {}}}\n",
            i + 1
        ));
    }
    y
}

/// Inference requests the mock received (chat completions or messages; probes left out).
fn hits(mock: &Mock) -> usize {
    mock.log()
        .iter()
        .filter(|r| {
            r["path"]
                .as_str()
                .is_some_and(|p| p.ends_with("/chat/completions") || p.ends_with("/messages"))
        })
        .count()
}

/// The bodies of the inference requests the mock received.
fn bodies(mock: &Mock) -> Vec<Value> {
    mock.log()
        .iter()
        .filter_map(|r| serde_json::from_str(r["body"].as_str()?).ok())
        .collect()
}

fn chat(sluice: &Sluice, model: &str, stream: bool, extra: &str) -> Response {
    sluice.chat(&format!(
        r#"{{"model":"{model}","stream":{stream},"messages":[{{"role":"user","content":"hi"}}]{extra}}}"#
    ))
}

fn messages(sluice: &Sluice, model: &str, stream: bool, extra: &str) -> Response {
    post_json(
        sluice.addr,
        "/v1/messages",
        &[("x-api-key", KEY), ("anthropic-version", "2023-06-01")],
        &format!(
            r#"{{"model":"{model}","max_tokens":64,"stream":{stream},"messages":[{{"role":"user","content":"hi"}}]{extra}}}"#
        ),
    )
}

/// The access line of the request with `x-request-id` `id` (waits up to 5 s for it).
/// The access line of request `id` (bounded wait: 5 s).
pub(crate) fn access_line(sluice: &Sluice, id: &str) -> String {
    let needle = format!("request_id={id} ");
    let mut line = String::new();
    eventually(Duration::from_secs(5), || {
        line = sluice
            .log()
            .lines()
            .find(|l| l.contains(&needle) && l.contains("outcome="))
            .unwrap_or_default()
            .to_string();
        !line.is_empty()
    });
    line
}

const OPENAI_CONTEXT_400: &str = r#"{"status":400,"error_body":{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}}"#;
const ANTHROPIC_CONTEXT_400: &str = r#"{"status":400,"error_body":{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210004 tokens > 200000 maximum"}}}"#;

#[test]
fn a_cross_model_fallback_answers_under_the_model_that_answered() {
    let p1 = Mock::start(r#"{"status":503}"#);
    let p2 = Mock::start(r#"{"tokens":3}"#);
    let models = format!(
        "{}{}",
        model("acme/chat", &["p1"], "    fallback_models: [acme/backup]\n"),
        model("acme/backup", &["p2"], "    output_usd_per_mtok: 1000000\n")
    );
    let sluice = Sluice::start(&cfg(
        &[
            Prov("p1", "openai", &p1.base_url()),
            Prov("p2", "openai", &p2.base_url()),
        ],
        &models,
        None,
    ));
    let r = post_json(
        sluice.addr,
        "/v1/chat/completions",
        &[
            ("authorization", &format!("Bearer {KEY}")),
            ("x-request-id", "xmodel-1"),
        ],
        r#"{"model":"acme/chat","messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["model"], "acme/backup");
    assert_eq!(r.header("x-sluice-provider"), Some("p2"));
    assert_eq!(r.header("x-sluice-fallback-depth"), Some("1"));
    assert_eq!(r.header("x-sluice-attempts"), Some("2"));
    assert_eq!((hits(&p1), hits(&p2)), (1, 1));
    // Each route was asked for its own upstream model.
    assert_eq!(p1.log()[0]["model"], "p1-model");
    assert_eq!(p2.log()[0]["model"], "p2-model");

    // A stream: every chunk names the model that answered.
    let r = chat(&sluice, "acme/chat", true, "");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-sluice-fallback-depth"), Some("1"));
    assert_eq!(sse_text(&r.body), "tok0 tok1 tok2 ");
    let chunks: Vec<Value> = sse_events(&r.body)
        .iter()
        .filter_map(|e| serde_json::from_str(e.strip_prefix("data: ")?).ok())
        .collect();
    assert!(chunks.len() >= 3, "{}", r.text());
    assert!(
        chunks.iter().all(|c| c["model"] == "acme/backup"),
        "{}",
        r.text()
    );
    assert_eq!((hits(&p1), hits(&p2)), (2, 2));

    let m = Metrics::scrape(&sluice);
    assert_eq!(
        m.get(
            "sluice_fallback_total",
            &[
                ("model", "acme/chat"),
                ("from_provider", "p1"),
                ("to_provider", "p2"),
                ("reason", "model_fallback")
            ]
        ),
        2.0
    );
    // Metered under the model that answered (its sell price applied).
    assert!(
        m.get(
            "sluice_charge_usd_total",
            &[("tenant", "t"), ("model", "acme/backup")]
        ) >= 6.0,
        "{}",
        m.0
    );
    assert_eq!(
        m.get(
            "sluice_tokens_total",
            &[("tenant", "t"), ("model", "acme/chat"), ("kind", "output")]
        ),
        0.0
    );
    let line = access_line(&sluice, "xmodel-1");
    for want in [
        "standard_model=acme/chat",
        "answered_model=acme/backup",
        "provider=p2",
        "attempts=2",
        "failures=p1:status_5xx",
    ] {
        assert!(line.contains(want), "{want} in {line}");
    }
    // The ledger records the model that answered (the one whose prices were applied).
    let recs = crate::ledger::wait_records(sluice.dir.path(), &sluice.config_path, 2);
    let rec = recs
        .iter()
        .find(|r| r["request_id"] == "xmodel-1")
        .unwrap_or_else(|| panic!("no record: {recs:?}"));
    assert_eq!(rec["model"], "acme/backup", "{rec}");
    assert_eq!(rec["provider"], "p2", "{rec}");
    assert_eq!(rec["upstream_model"], "p2-model", "{rec}");
    assert_eq!(rec["fallback_depth"], 1, "{rec}");
    assert_eq!(rec["attempts"], 2, "{rec}");
    assert!(
        rec["charge_usd"].as_f64().is_some_and(|c| c >= 3.0),
        "{rec}"
    );
}

#[test]
fn a_model_whose_routes_all_rest_goes_straight_to_its_fallback_model() {
    // p1's 429 with a long Retry-After rests acme/chat's only route.
    let p1 = Mock::start(r#"{"status":429,"retry_after_s":30}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let models = format!(
        "{}{}",
        model("acme/chat", &["p1"], "    fallback_models: [acme/backup]\n"),
        model("acme/backup", &["p2"], "")
    );
    let sluice = Sluice::start(&cfg(
        &[
            Prov("p1", "openai", &p1.base_url()),
            Prov("p2", "openai", &p2.base_url()),
        ],
        &models,
        None,
    ));
    let r = chat(&sluice, "acme/chat", false, "");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["model"], "acme/backup");
    assert_eq!(r.header("x-sluice-fallback-depth"), Some("1"));
    assert_eq!((hits(&p1), hits(&p2)), (1, 1));
    // Resting: nothing is sent to p1; the fallback model answers at once (no route failed).
    let r = chat(&sluice, "acme/chat", true, "");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-sluice-provider"), Some("p2"));
    assert_eq!(r.header("x-sluice-fallback-depth"), Some("0"));
    assert!(
        r.text().contains(r#""model":"acme/backup""#),
        "{}",
        r.text()
    );
    assert_eq!((hits(&p1), hits(&p2)), (1, 2));
    // Without a fallback model the rest is the answer: 503 with the time left.
    let r = chat(&sluice, "acme/backup", false, "");
    assert_eq!(r.status, 200);
    let sluice_no_fb = Sluice::start(&cfg(
        &[Prov("p1", "openai", &p1.base_url())],
        &model("acme/chat", &["p1"], ""),
        None,
    ));
    let r = chat(&sluice_no_fb, "acme/chat", false, "");
    assert_eq!(r.status, 429, "{}", r.text());
    let r = chat(&sluice_no_fb, "acme/chat", false, "");
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.header("retry-after").is_some());
    assert_eq!((hits(&p1), hits(&p2)), (2, 3));
}

#[test]
fn the_body_models_list_is_used_never_forwarded_and_checked_against_the_key() {
    let p1 = Mock::start(r#"{"status":503}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let p3 = Mock::start(r#"{"tokens":2}"#);
    let models = format!(
        "{}{}{}",
        model("acme/chat", &["p1"], ""),
        model("acme/backup", &["p2"], ""),
        model("acme/secret", &["p3"], "")
    );
    let sluice = Sluice::start(&cfg(
        &[
            Prov("p1", "openai", &p1.base_url()),
            Prov("p2", "openai", &p2.base_url()),
            Prov("p3", "openai", &p3.base_url()),
        ],
        &models,
        Some("acme/chat, acme/backup"),
    ));
    let r = chat(&sluice, "acme/chat", false, r#","models":["acme/backup"]"#);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["model"], "acme/backup");
    assert_eq!(r.header("x-sluice-fallback-depth"), Some("1"));
    assert_eq!((hits(&p1), hits(&p2), hits(&p3)), (1, 1, 0));
    for b in bodies(&p1).iter().chain(bodies(&p2).iter()) {
        assert!(b.get("models").is_none(), "`models` went upstream: {b}");
    }
    // Without the field the model has no fallback: p1's 503 is the answer.
    let r = chat(&sluice, "acme/chat", false, "");
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!((hits(&p1), hits(&p2), hits(&p3)), (2, 1, 0));

    // A model the key may not use, or none at all: the 404 of an unknown `model`, before
    // anything goes upstream, in the client's dialect.
    for listed in ["acme/secret", "nope/none"] {
        let r = chat(
            &sluice,
            "acme/chat",
            false,
            &format!(r#","models":["{listed}"]"#),
        );
        assert_eq!(r.status, 404, "{}", r.text());
        assert_eq!(r.json()["error"]["code"], "model_not_found", "{}", r.text());
        assert!(r.text().contains(listed), "{}", r.text());
        let r = messages(
            &sluice,
            "acme/chat",
            false,
            &format!(r#","models":["{listed}"]"#),
        );
        assert_eq!(r.status, 404, "{}", r.text());
        assert_eq!(r.json()["type"], "error", "{}", r.text());
        assert_eq!(r.json()["error"]["type"], "not_found_error", "{}", r.text());
    }
    let r = chat(&sluice, "acme/chat", false, r#","models":"acme/backup""#);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "models");
    assert_eq!((hits(&p1), hits(&p2), hits(&p3)), (2, 1, 0));

    // The messages and responses dialects take the field too.
    let r = messages(&sluice, "acme/chat", false, r#","models":["acme/backup"]"#);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["model"], "acme/backup", "{}", r.text());
    assert_eq!((hits(&p1), hits(&p2), hits(&p3)), (3, 2, 0));
    let r = post_json(
        sluice.addr,
        "/v1/responses",
        &[("authorization", &format!("Bearer {KEY}"))],
        r#"{"model":"acme/chat","input":"hi","models":["acme/backup"]}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["model"], "acme/backup", "{}", r.text());
    let r = post_json(
        sluice.addr,
        "/v1/responses",
        &[("authorization", &format!("Bearer {KEY}"))],
        r#"{"model":"acme/chat","input":"hi","models":["acme/secret"]}"#,
    );
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!((hits(&p1), hits(&p2), hits(&p3)), (4, 3, 0));
    for b in bodies(&p1).iter().chain(bodies(&p2).iter()) {
        assert!(b.get("models").is_none(), "`models` went upstream: {b}");
    }
}

#[test]
fn a_context_length_400_goes_to_the_context_fallback_and_never_to_the_regular_ones() {
    // OpenAI's shape, through the chat dialect.
    let small = Mock::start(OPENAI_CONTEXT_400);
    let backup = Mock::start(r#"{"tokens":2}"#);
    let long = Mock::start(r#"{"tokens":2}"#);
    let models = format!(
        "{}{}{}",
        model(
            "acme/chat",
            &["small"],
            "    fallback_models: [acme/backup]\n    context_fallback_models: [acme/long]\n"
        ),
        model("acme/backup", &["backup"], ""),
        model("acme/long", &["long"], "")
    );
    let provs = |kind| {
        cfg(
            &[
                Prov("small", kind, &small.base_url()),
                Prov("backup", kind, &backup.base_url()),
                Prov("long", kind, &long.base_url()),
            ],
            &models,
            None,
        )
    };
    let sluice = Sluice::start(&provs("openai"));
    let r = chat(&sluice, "acme/chat", true, "");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-sluice-provider"), Some("long"));
    assert_eq!(r.header("x-sluice-fallback-depth"), Some("1"));
    assert_eq!(sse_text(&r.body), "tok0 tok1 ");
    assert!(r.text().contains(r#""model":"acme/long""#), "{}", r.text());
    assert_eq!((hits(&small), hits(&backup), hits(&long)), (1, 0, 1));
    let m = Metrics::scrape(&sluice);
    assert_eq!(
        m.get(
            "sluice_fallback_total",
            &[
                ("from_provider", "small"),
                ("to_provider", "long"),
                ("reason", "context_length")
            ]
        ),
        1.0
    );
    assert_eq!(
        m.get(
            "sluice_upstream_attempts_total",
            &[("provider", "small"), ("outcome", "context_length")]
        ),
        1.0
    );
    drop(sluice);

    // Anthropic's shape, through the messages dialect (Anthropic upstreams).
    for mock in [&small, &backup, &long] {
        mock.reset();
    }
    small.set_behavior(ANTHROPIC_CONTEXT_400);
    let sluice = Sluice::start(&provs("anthropic"));
    let r = messages(&sluice, "acme/chat", false, "");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["model"], "acme/long", "{}", r.text());
    assert_eq!(r.header("x-sluice-provider"), Some("long"));
    assert_eq!((hits(&small), hits(&backup), hits(&long)), (1, 0, 1));
    // ... and translated for a chat client.
    let r = chat(&sluice, "acme/chat", false, "");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["model"], "acme/long", "{}", r.text());
    assert_eq!((hits(&small), hits(&backup), hits(&long)), (2, 0, 2));
}

#[test]
fn a_context_length_400_goes_to_a_larger_route_of_the_same_model() {
    let small = Mock::start(OPENAI_CONTEXT_400);
    let smaller = Mock::start(r#"{"tokens":2}"#);
    let large = Mock::start(r#"{"tokens":2}"#);
    let models = "  acme/chat:\n    context_window_tokens: 8192\n    routes:\n      - {provider: small, upstream_model: s, priority: 1}\n      - {provider: smaller, upstream_model: xs, priority: 2, context_window_tokens: 4096}\n      - {provider: large, upstream_model: l, priority: 3, context_window_tokens: 131072}\n";
    let sluice = Sluice::start(&cfg(
        &[
            Prov("small", "openai", &small.base_url()),
            Prov("smaller", "openai", &smaller.base_url()),
            Prov("large", "openai", &large.base_url()),
        ],
        models,
        None,
    ));
    let r = chat(&sluice, "acme/chat", false, "");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["model"], "acme/chat");
    assert_eq!(r.header("x-sluice-provider"), Some("large"));
    assert_eq!(r.header("x-sluice-fallback-depth"), Some("1"));
    assert_eq!((hits(&small), hits(&smaller), hits(&large)), (1, 0, 1));
}

#[test]
fn without_a_context_fallback_the_client_gets_the_providers_error_in_its_dialect() {
    let p1 = Mock::start(OPENAI_CONTEXT_400);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let models = format!(
        "{}{}",
        model(
            "acme/chat",
            &["p1", "p2"],
            "    fallback_models: [acme/backup]\n"
        ),
        model("acme/backup", &["p2"], "")
    );
    let sluice = Sluice::start(&cfg(
        &[
            Prov("p1", "openai", &p1.base_url()),
            Prov("p2", "openai", &p2.base_url()),
        ],
        &models,
        None,
    ));
    let r = chat(&sluice, "acme/chat", false, "");
    assert_eq!(r.status, 400, "{}", r.text());
    let v = r.json();
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("maximum context length")));
    // Neither the other route (no declared window) nor the regular fallback was asked.
    assert_eq!((hits(&p1), hits(&p2)), (1, 0));
    // A messages client gets it in Anthropic's shape.
    let r = messages(&sluice, "acme/chat", false, "");
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["type"], "error");
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    assert!(r.text().contains("maximum context length"), "{}", r.text());
    assert_eq!((hits(&p1), hits(&p2)), (2, 0));
    drop(sluice);

    // Anthropic's "prompt is too long", through the messages dialect, no context fallback.
    let a1 = Mock::start(ANTHROPIC_CONTEXT_400);
    let a2 = Mock::start(r#"{"tokens":2}"#);
    let models = format!(
        "{}{}",
        model("acme/chat", &["a1"], "    fallback_models: [acme/backup]\n"),
        model("acme/backup", &["a2"], "")
    );
    let sluice = Sluice::start(&cfg(
        &[
            Prov("a1", "anthropic", &a1.base_url()),
            Prov("a2", "anthropic", &a2.base_url()),
        ],
        &models,
        None,
    ));
    let r = messages(&sluice, "acme/chat", true, "");
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    assert!(r.text().contains("prompt is too long"), "{}", r.text());
    let r = chat(&sluice, "acme/chat", false, "");
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("prompt is too long"), "{}", r.text());
    assert_eq!((hits(&a1), hits(&a2)), (2, 0));
}

#[test]
fn a_content_policy_400_stays_final() {
    let p1 = Mock::start(
        r#"{"status":400,"error_body":{"error":{"message":"Your request was rejected as a result of our safety system.","type":"invalid_request_error","param":null,"code":"content_policy_violation"}}}"#,
    );
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let p3 = Mock::start(r#"{"tokens":2}"#);
    let models = format!(
        "{}{}{}",
        model(
            "acme/chat",
            &["p1"],
            "    fallback_models: [acme/backup]\n    context_fallback_models: [acme/long]\n"
        ),
        model("acme/backup", &["p2"], ""),
        model("acme/long", &["p3"], "")
    );
    let sluice = Sluice::start(&cfg(
        &[
            Prov("p1", "openai", &p1.base_url()),
            Prov("p2", "openai", &p2.base_url()),
            Prov("p3", "openai", &p3.base_url()),
        ],
        &models,
        None,
    ));
    for stream in [false, true] {
        let r = chat(&sluice, "acme/chat", stream, "");
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(r.json()["error"]["code"], "content_policy_violation");
        assert_eq!(r.header("x-sluice-attempts"), Some("1"));
    }
    assert_eq!((hits(&p1), hits(&p2), hits(&p3)), (2, 0, 0));
}

#[test]
fn retry_after_ms_reaches_the_client_and_sets_the_routes_cool_down() {
    // `retry-after-ms: 1200` beside `Retry-After: 30`: the precise one wins.
    let p1 = Mock::start(
        r#"{"fail_first":1,"fail_key":"ra","status":429,"retry_after_s":30,"headers":{"retry-after-ms":"1200"},"tokens":2}"#,
    );
    let sluice = Sluice::start(&cfg(
        &[Prov("p1", "openai", &p1.base_url())],
        &model("acme/chat", &["p1"], ""),
        None,
    ));
    let r = chat(&sluice, "acme/chat", false, "");
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.header("retry-after-ms"), Some("1200"));
    assert_eq!(r.header("retry-after"), Some("2"));
    assert_eq!(hits(&p1), 1);
    // The route rests for 1.2 s (not 30 s): refused at once, with the time left.
    let r = chat(&sluice, "acme/chat", false, "");
    assert_eq!(r.status, 503, "{}", r.text());
    let left: u64 = r
        .header("retry-after-ms")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no retry-after-ms: {:?}", r.headers));
    assert!((1..=1200).contains(&left), "{left}");
    assert_eq!(hits(&p1), 1);
    let t = Instant::now();
    let mut r = chat(&sluice, "acme/chat", false, "");
    while r.status != 200 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(100));
        r = chat(&sluice, "acme/chat", false, "");
    }
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert_eq!(hits(&p1), 2);
}

#[test]
fn a_malformed_event_is_dropped_counted_and_never_ends_the_stream() {
    let oa = Mock::start(r#"{"tokens":3,"malformed_event_after_tokens":1}"#);
    let an = Mock::start(r#"{"tokens":3,"malformed_event_after_tokens":1}"#);
    let models = format!(
        "{}{}",
        model("acme/chat", &["oa"], ""),
        model("acme/claude", &["an"], "")
    );
    let sluice = Sluice::start(&cfg(
        &[
            Prov("oa", "openai", &oa.base_url()),
            Prov("an", "anthropic", &an.base_url()),
        ],
        &models,
        None,
    ));
    // Same dialect: the bad line never reaches the client (its SDK would fail on it), the
    // rest flows on.
    let r = chat(&sluice, "acme/chat", true, "");
    assert_eq!(r.status, 200, "{}", r.text());
    let text = r.text();
    assert!(!text.contains("mock-malformed"), "{text}");
    assert_eq!(sse_text(&r.body), "tok0 tok1 tok2 ");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    // Translated (Anthropic → chat): skipped, counted, the stream completes.
    let r = chat(&sluice, "acme/claude", true, "");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(sse_text(&r.body), "tok0 tok1 tok2 ");
    assert!(!r.text().contains("mock-malformed"), "{}", r.text());
    assert!(
        r.text().trim_end().ends_with("data: [DONE]"),
        "{}",
        r.text()
    );
    assert_eq!((hits(&oa), hits(&an)), (1, 1));
    let m = Metrics::scrape(&sluice);
    for p in ["oa", "an"] {
        assert_eq!(
            m.get("sluice_sse_malformed_events_total", &[("provider", p)]),
            1.0,
            "{p}"
        );
    }
    let stream_errors: f64 =
        m.0.lines()
            .filter(|l| l.starts_with("sluice_stream_errors_total"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum();
    assert_eq!(stream_errors, 0.0);
}
