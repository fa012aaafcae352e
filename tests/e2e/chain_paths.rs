//! The paths a request takes beyond its model's own routes (issue 30, items 4 to 7), over
//! loopback with scripted mock providers:
//!
//! - a hedge finds its partner among the routes of `fallback_models` (the primary's first
//!   token slow, the fallback model answers fast), and a stream cut mid-way continues on a
//!   fallback model's route;
//! - the continuation's seam: a restart of the answer is trimmed (the text once), a clean
//!   continuation joins as it is or with a space after a sentence's end, and a restart that
//!   diverges ends the stream with the error event; `sluice_continuation_seams_total`;
//! - a 404 "model not found" falls back to the next route and rests the route; no upstream
//!   model id reaches a client in a relayed error;
//! - `x-sluice-served-model` on every answer, and `report_served_model` naming the route's
//!   `display_model` in the answer's `model`.
//!
//! Every test asserts the requests each mock saw.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::fallback::{chat_hits, chat_log, Metrics};
use crate::harness::client::{sse_events, sse_text};
use crate::harness::{Mock, Sluice, KEY};

const READ: Duration = Duration::from_secs(10);

/// A config with `providers` (id, base URL; OpenAI kind, probes off, failures never rest a
/// route by count, no same-route retries) and `models` given whole (lines under `models:`,
/// indented 2).
fn cfg(providers: &[(&str, &Mock)], models: &str) -> String {
    let mut y = format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\n  retry: {{max_attempts_per_route: 1}}\ntenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n"
    );
    for (id, mock) in providers {
        y.push_str(&format!(
            "  {id}:\n    kind: openai\n    base_url: {}\n    api_key: sk-provider-secret-{id}\n    health_check: {{enabled: false}}\n    health: {{degraded_after_failures: 1000, unhealthy_after_failures: 1000}}\n",
            mock.base_url()
        ));
    }
    y.push_str("models:\n");
    y.push_str(models);
    y
}

/// `models.<id>` with `extra` lines (indented 4) and one route per `(provider, route
/// lines)`, priority in order, upstream model `<provider>-model`.
fn model(id: &str, extra: &str, routes: &[(&str, &str)]) -> String {
    let mut y = format!("  {id}:\n{extra}    routes:\n");
    for (i, (p, more)) in routes.iter().enumerate() {
        y.push_str(&format!(
            "      - provider: {p}\n        upstream_model: {p}-model\n        priority: {}\n{more}",
            i + 1
        ));
    }
    y
}

fn chat_body(model: &str, stream: bool) -> String {
    format!(
        r#"{{"model":"{model}","stream":{stream},"stream_options":{{"include_usage":true}},"messages":[{{"role":"user","content":"Tell me about gateways"}}]}}"#
    )
}

/// The JSON `data:` payloads of an SSE body (comments and `[DONE]` left out).
fn datas(body: &[u8]) -> Vec<Value> {
    sse_events(body)
        .iter()
        .flat_map(|ev| {
            ev.lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter_map(|d| serde_json::from_str::<Value>(d).ok())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Streams a chat request for `model`: status, `x-sluice-provider`,
/// `x-sluice-served-model`, the whole body.
fn stream(sluice: &Sluice, model: &str) -> (u16, Option<String>, Option<String>, Vec<u8>) {
    let mut s = sluice.chat_stream(&chat_body(model, true));
    let status = s.status;
    let provider = s.header("x-sluice-provider").map(str::to_string);
    let served = s.header("x-sluice-served-model").map(str::to_string);
    let body = s.read_to_end(READ);
    (status, provider, served, body)
}

fn metric(sluice: &Sluice, name: &str, labels: &[(&str, &str)]) -> f64 {
    Metrics::scrape(sluice).get(name, labels)
}

fn seams(sluice: &Sluice, outcome: &str) -> f64 {
    metric(
        sluice,
        "sluice_continuation_seams_total",
        &[("model", "acme/chat"), ("outcome", outcome)],
    )
}

#[test]
fn a_slow_first_token_is_hedged_onto_a_fallback_models_route() {
    // acme/chat has one route, whose first event takes 3 s; its fallback model answers at once.
    let p1 = Mock::start(r#"{"first_event_delay_ms":3000,"tokens":2}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let models = format!(
        "{}{}",
        model(
            "acme/chat",
            "    hedge_after_ms: 200\n    retry: {max_attempts_per_route: 1, budget_ratio: 1.0}\n    fallback_models: [acme/backup]\n",
            &[("p1", "")]
        ),
        model("acme/backup", "", &[("p2", "")])
    );
    let sluice = Sluice::start(&cfg(&[("p1", &p1), ("p2", &p2)], &models));
    let t = Instant::now();
    let (status, provider, served, body) = stream(&sluice, "acme/chat");
    let took = t.elapsed();
    let text = String::from_utf8_lossy(&body);
    assert_eq!(status, 200, "{text}");
    assert!(
        took >= Duration::from_millis(190) && took < Duration::from_millis(2000),
        "served after {took:?}"
    );
    assert_eq!(provider.as_deref(), Some("p2"));
    // The fallback model answered, and says so.
    assert_eq!(served.as_deref(), Some("acme/backup"));
    assert_eq!(sse_text(&body), "tok0 tok1 ", "{text}");
    let chunks = datas(&body);
    assert!(
        !chunks.is_empty() && chunks.iter().all(|c| c["model"] == "acme/backup"),
        "{text}"
    );
    assert_eq!((chat_hits(&p1), chat_hits(&p2)), (1, 1));
    assert_eq!(chat_log(&p2)[0]["model"], "p2-model", "{:?}", chat_log(&p2));
    assert_eq!(
        metric(
            &sluice,
            "sluice_hedges_total",
            &[("model", "acme/chat"), ("outcome", "hedge_won")]
        ),
        1.0
    );
    assert_eq!(
        metric(
            &sluice,
            "sluice_upstream_attempts_total",
            &[("provider", "p1"), ("outcome", "hedge_cancelled")]
        ),
        1.0
    );
}

#[test]
fn a_stream_cut_mid_way_continues_on_a_fallback_models_route() {
    let p1 = Mock::start(r#"{"text":"The quick brown fox ","drop_after_tokens":2}"#);
    let p2 = Mock::start(r#"{"text":"brown fox jumps over the dog.","prompt_tokens":50}"#);
    let models = format!(
        "{}{}",
        model(
            "acme/chat",
            "    continue_on_break: true\n    fallback_models: [acme/backup]\n",
            &[("p1", "")]
        ),
        model("acme/backup", "", &[("p2", "")])
    );
    let sluice = Sluice::start(&cfg(&[("p1", &p1), ("p2", &p2)], &models));
    let (status, provider, _, body) = stream(&sluice, "acme/chat");
    let text = String::from_utf8_lossy(&body);
    assert_eq!(status, 200, "{text}");
    assert_eq!(provider.as_deref(), Some("p1"));
    assert_eq!(
        sse_text(&body),
        "The quick brown fox jumps over the dog.",
        "{text}"
    );
    assert!(
        text.contains(": sluice-continued provider=p2 reason=upstream_broken"),
        "{text}"
    );
    assert_eq!(text.matches("data: [DONE]").count(), 1, "{text}");
    assert!(!text.contains("\"error\""), "{text}");
    assert_eq!((chat_hits(&p1), chat_hits(&p2)), (1, 1));
    // The fallback model's route was asked for the rest, with the text so far.
    let req: Value =
        serde_json::from_str(chat_log(&p2)[0]["body"].as_str().expect("a body")).expect("JSON");
    assert_eq!(req["model"], "p2-model", "{req}");
    assert!(req.to_string().contains("The quick "), "{req}");
    assert_eq!(
        metric(
            &sluice,
            "sluice_stream_continuations_total",
            &[("model", "acme/chat"), ("outcome", "continued")]
        ),
        1.0
    );
    assert_eq!(seams(&sluice, "clean"), 1.0);
}

/// The answer the seam tests stream: 12 words, then 3.
const SAID: &str = "A gateway earns trust when the 3 a.m. page is still open.";
const REST: &str = "It closes later.";

#[test]
fn the_continuation_seam_trims_a_restart_keeps_word_boundaries_and_refuses_a_diverging_one() {
    // p1 is cut after its first sentence (12 words) and its trailing space; p2 continues.
    let cut_after_space = format!(r#"{{"text":"{SAID} {REST}","drop_after_tokens":12}}"#);
    let p1 = Mock::start(&cut_after_space);
    let p2 = Mock::start(&format!(r#"{{"text":"{REST}","restart_answer":true}}"#));
    let models = model(
        "acme/chat",
        "    continue_on_break: true\n",
        &[("p1", ""), ("p2", "")],
    );
    let sluice = Sluice::start(&cfg(&[("p1", &p1), ("p2", &p2)], &models));
    let whole = format!("{SAID} {REST}");
    let run = |sluice: &Sluice| {
        let (status, _, _, body) = stream(sluice, "acme/chat");
        assert_eq!(status, 200);
        body
    };

    // 1. p2 starts the answer again (the text so far, then the rest): the repeat is dropped.
    let body = run(&sluice);
    let text = String::from_utf8_lossy(&body);
    assert_eq!(sse_text(&body), whole, "{text}");
    assert_eq!(sse_text(&body).matches("A gateway").count(), 1, "{text}");
    // p2 was asked with the text so far and answered with it again.
    let req = chat_log(&p2)[0]["body"].as_str().unwrap().to_string();
    assert!(req.contains(SAID), "{req}");
    assert_eq!(seams(&sluice, "trimmed"), 1.0);

    // 2. A clean continuation joins as it is (the text so far ended in a space).
    p2.set_behavior(&format!(r#"{{"text":"{REST}"}}"#));
    let body = run(&sluice);
    assert_eq!(sse_text(&body), whole, "{}", String::from_utf8_lossy(&body));
    assert_eq!(seams(&sluice, "clean"), 1.0);

    // 3. Cut right after "open." (no space yet): a space is added before the next word...
    p1.set_behavior(&format!(r#"{{"text":"{SAID}","drop_after_tokens":12}}"#));
    let body = run(&sluice);
    assert_eq!(sse_text(&body), whole, "{}", String::from_utf8_lossy(&body));
    assert_eq!(seams(&sluice, "space_added"), 1.0);
    // ... also after a dropped restart ("…still open.A gateway…" was the doubled seam).
    p2.set_behavior(&format!(r#"{{"text":"{REST}","restart_answer":true}}"#));
    let body = run(&sluice);
    assert_eq!(sse_text(&body), whole, "{}", String::from_utf8_lossy(&body));
    assert_eq!(seams(&sluice, "trimmed"), 2.0);

    // 4. p2 starts the answer again and then says something else: no splice is right, the
    //    stream ends with the error event, and the client has the text once.
    p1.set_behavior(&cut_after_space);
    p2.set_behavior(r#"{"text":"A gateway earns trust when nobody is awake at all."}"#);
    let body = run(&sluice);
    let text = String::from_utf8_lossy(&body);
    assert_eq!(sse_text(&body), format!("{SAID} "), "{text}");
    assert!(text.contains("continuation_seam"), "{text}");
    assert!(text.contains("restarted the answer"), "{text}");
    assert!(!text.contains("nobody"), "{text}");
    assert_eq!(seams(&sluice, "refused"), 1.0);
    assert_eq!(
        metric(
            &sluice,
            "sluice_stream_errors_total",
            &[("reason", "continuation_seam")]
        ),
        1.0
    );
    assert_eq!((chat_hits(&p1), chat_hits(&p2)), (5, 5));
    assert_eq!(seams(&sluice, "clean"), 1.0);
    assert_eq!(seams(&sluice, "space_added"), 1.0);
}

const NOT_FOUND: &str = r#"{"status":404,"error_body":{"error":{"message":"The model `p1-model-2024-08-06` does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}}"#;

#[test]
fn a_404_model_not_found_falls_back_and_rests_the_route() {
    let p1 = Mock::start(NOT_FOUND);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let models = model("acme/chat", "", &[("p1", ""), ("p2", "")]);
    let sluice = Sluice::start(&cfg(&[("p1", &p1), ("p2", &p2)], &models));
    for stream in [false, true] {
        let r = sluice.chat(&chat_body("acme/chat", stream));
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-sluice-provider"), Some("p2"));
    }
    // The route rested after its first 404: the second request went to p2 alone.
    assert_eq!((chat_hits(&p1), chat_hits(&p2)), (1, 2));
    let m = Metrics::scrape(&sluice);
    assert_eq!(
        m.get_opt(
            "sluice_provider_health",
            &[("provider", "p1"), ("route", "p1/p1-model")]
        ),
        Some(2.0),
        "{}",
        m.0
    );
    assert_eq!(
        m.get(
            "sluice_upstream_attempts_total",
            &[("provider", "p1"), ("outcome", "model_not_found")]
        ),
        1.0
    );
    assert_eq!(
        m.get(
            "sluice_fallback_total",
            &[("from_provider", "p1"), ("reason", "model_not_found")]
        ),
        1.0,
        "{}",
        m.0
    );
}

#[test]
fn a_relayed_upstream_error_names_the_standard_model_never_the_upstream_id() {
    // A context-length 400 naming the route's dated upstream model.
    let p1 = Mock::start(
        r#"{"status":400,"error_body":{"error":{"message":"This model's (p1-model-2024-08-06) maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}}"#,
    );
    let models = model("acme/chat", "", &[("p1", "")]);
    let sluice = Sluice::start(&cfg(&[("p1", &p1)], &models));
    let r = sluice.chat(&chat_body("acme/chat", false));
    assert_eq!(r.status, 400, "{}", r.text());
    let text = r.text();
    assert!(!text.contains("p1-model"), "{text}");
    let v: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(
        v["error"]["message"],
        "This model's (acme/chat) maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.",
        "{v}"
    );
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    // The provider's own answer: the header names whose route gave it.
    assert_eq!(r.header("x-sluice-served-model"), Some("acme/chat"));
    // A model-not-found 404 with no route left: the client's 404 names no upstream model.
    p1.set_behavior(NOT_FOUND);
    let r = sluice.chat(&chat_body("acme/chat", false));
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(!r.text().contains("p1-model"), "{}", r.text());
    assert!(r.text().contains("acme/chat"), "{}", r.text());
    assert_eq!(chat_hits(&p1), 2);
}

#[test]
fn the_served_model_header_names_the_route_and_the_opt_in_puts_it_in_the_answer() {
    let p1 = Mock::start(r#"{"tokens":2,"answer_model":"p1-model-2025-01-01"}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let display = "        display_model: acme-large-2025\n";
    let models = format!(
        "{}{}{}",
        model("acme/chat", "", &[("p1", display)]),
        model(
            "acme/reported",
            "    report_served_model: true\n    fallback_models: [acme/plain]\n",
            &[("p1", display)]
        ),
        model("acme/plain", "", &[("p2", "")])
    );
    let sluice = Sluice::start(&cfg(&[("p1", &p1), ("p2", &p2)], &models));

    // Without the opt-in: the header names the route's display id, the body the standard model.
    let r = sluice.chat(&chat_body("acme/chat", false));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-sluice-served-model"), Some("acme-large-2025"));
    assert_eq!(r.json()["model"], "acme/chat");
    let (status, _, served, body) = stream(&sluice, "acme/chat");
    assert_eq!(status, 200);
    assert_eq!(served.as_deref(), Some("acme-large-2025"));
    assert!(datas(&body).iter().all(|c| c["model"] == "acme/chat"));

    // With it: the answer's `model` is the display id too, never the upstream id.
    let r = sluice.chat(&chat_body("acme/reported", false));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-sluice-served-model"), Some("acme-large-2025"));
    assert_eq!(r.json()["model"], "acme-large-2025");
    let (status, _, served, body) = stream(&sluice, "acme/reported");
    assert_eq!(status, 200);
    assert_eq!(served.as_deref(), Some("acme-large-2025"));
    let chunks = datas(&body);
    assert!(
        !chunks.is_empty() && chunks.iter().all(|c| c["model"] == "acme-large-2025"),
        "{}",
        String::from_utf8_lossy(&body)
    );
    assert!(!String::from_utf8_lossy(&body).contains("p1-model"));

    // A route without a display id: the standard model that served, here after a fallback.
    p1.set_behavior(r#"{"status":503}"#);
    let r = sluice.chat(&chat_body("acme/reported", false));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-sluice-served-model"), Some("acme/plain"));
    assert_eq!(r.json()["model"], "acme/plain");
    assert_eq!((chat_hits(&p1), chat_hits(&p2)), (5, 1));
}
