//! Routing over real sockets: the capability filter (and the 503 naming the missing
//! capability), the client's provider preference (body field and header; unknown names are a
//! 400; the field never goes upstream), the strategies (`priority` ties spread by weight,
//! `lowest_cost` for this request, `lowest_latency`, a key's strategy override), a split
//! config (`include:` of a folder with one file per provider, with `file:line` errors), and
//! one config snapshot per request (a reload mid-stream leaves the open stream alone).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::fallback::{
    assert_clean_stream, body, chat_hits, chat_log, chat_with_headers, config, config_with_routes,
    Metrics, MODEL, P,
};
use crate::harness::client::Response;
use crate::harness::{Mock, Sluice, TempDir};

fn served_by(r: &Response) -> &str {
    assert_eq!(r.status, 200, "{}", r.text());
    r.header("x-sluice-provider").unwrap_or("")
}

fn routes(lines: &[(&str, &str)]) -> String {
    let mut s = String::from("    routes:\n");
    for (id, extra) in lines {
        s.push_str(&format!(
            "      - provider: {id}\n        upstream_model: {id}-model\n{extra}"
        ));
    }
    s
}

#[test]
fn routes_lacking_a_needed_capability_are_skipped() {
    let p1 = Mock::start(r#"{"tokens":2}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let sluice = Sluice::start(&config_with_routes(
        "",
        &[P("p1", &p1.base_url(), ""), P("p2", &p2.base_url(), "")],
        &routes(&[
            ("p1", "        priority: 1\n        capabilities: []\n"),
            ("p2", "        priority: 2\n"),
        ]),
    ));
    let plain = sluice.chat(&body(false, ""));
    assert_eq!(served_by(&plain), "p1");
    for (what, extra) in [
        (
            "tools",
            r#","tools":[{"type":"function","function":{"name":"f"}}]"#,
        ),
        ("tool_choice", r#","tool_choice":"auto""#),
        (
            "json_schema",
            r#","response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{}}}"#,
        ),
    ] {
        let r = sluice.chat(&body(false, extra));
        assert_eq!(served_by(&r), "p2", "{what}");
        assert_eq!(
            r.header("x-sluice-fallback-depth"),
            Some("0"),
            "{what}: skipping is not a fallback"
        );
    }
    let vision = format!(
        r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":[{{"type":"text","text":"what is this"}},{{"type":"image_url","image_url":{{"url":"data:image/png;base64,AAAA"}}}}]}}]}}"#
    );
    assert_eq!(served_by(&sluice.chat(&vision)), "p2");
    assert_eq!(chat_hits(&p1), 1);
    assert_eq!(chat_hits(&p2), 4);
    assert_eq!(
        Metrics::scrape(&sluice).get("sluice_fallback_total", &[]),
        0.0
    );
}

#[test]
fn no_route_with_a_capability_is_a_503_naming_it() {
    let p1 = Mock::start("{}");
    let p2 = Mock::start("{}");
    let sluice = Sluice::start(&config_with_routes(
        "",
        &[P("p1", &p1.base_url(), ""), P("p2", &p2.base_url(), "")],
        &routes(&[
            ("p1", "        capabilities: [tools]\n"),
            ("p2", "        capabilities: [vision]\n"),
        ]),
    ));
    let r = sluice.chat(&body(
        false,
        r#","response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{}}}"#,
    ));
    assert_eq!(r.status, 503, "{}", r.text());
    let v = r.json();
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("capability `json_schema`"), "{v}");
    assert_eq!(v["error"]["code"], "no_route_available");
    // Each capability exists, but never on the same route.
    let both = format!(
        r#"{{"model":"{MODEL}","tools":[{{"type":"function","function":{{"name":"f"}}}}],"messages":[{{"role":"user","content":[{{"type":"image_url","image_url":{{"url":"x"}}}}]}}]}}"#
    );
    let r = sluice.chat(&both);
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(
        r.text().contains("all requested capabilities"),
        "{}",
        r.text()
    );
    assert_eq!(chat_hits(&p1) + chat_hits(&p2), 0);
}

fn three_providers() -> (Mock, Mock, Mock, Sluice) {
    let p1 = Mock::start(r#"{"tokens":2}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let p3 = Mock::start(r#"{"tokens":2}"#);
    let many = "    health: {degraded_after_failures: 1000, unhealthy_after_failures: 1000}\n";
    let sluice = Sluice::start(&config(
        "",
        &[
            P("p1", &p1.base_url(), many),
            P("p2", &p2.base_url(), many),
            P("p3", &p3.base_url(), many),
        ],
        "",
    ));
    (p1, p2, p3, sluice)
}

#[test]
fn the_clients_provider_preference_is_honoured() {
    let (p1, p2, p3, sluice) = three_providers();
    let pref = |p: &str| body(false, &format!(r#","provider":{p}"#));
    assert_eq!(served_by(&sluice.chat(&body(false, ""))), "p1");
    assert_eq!(served_by(&sluice.chat(&pref(r#"{"only":["p2"]}"#))), "p2");
    assert_eq!(
        served_by(&sluice.chat(&pref(r#"{"ignore":["p1","p2"]}"#))),
        "p3"
    );
    assert_eq!(
        served_by(&sluice.chat(&pref(r#"{"order":["p3","p1"]}"#))),
        "p3"
    );
    // The field is the gateway's own: it never reaches a provider.
    for rec in chat_log(&p2).iter().chain(chat_log(&p3).iter()) {
        let sent: serde_json::Value =
            serde_json::from_str(rec["body"].as_str().unwrap_or("{}")).expect("body JSON");
        assert!(sent.get("provider").is_none(), "{sent}");
    }
    // The same JSON as a header.
    let r = chat_with_headers(
        &sluice,
        &[("x-sluice-provider-preference", r#"{"only":["p3"]}"#)],
        &body(false, ""),
    );
    assert_eq!(served_by(&r), "p3");

    // Unknown provider names are a 400 (body and header), and nothing goes upstream.
    let before = chat_hits(&p1) + chat_hits(&p2) + chat_hits(&p3);
    let r = sluice.chat(&pref(r#"{"order":["p2","nope"]}"#));
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("nope"), "{}", r.text());
    let r = chat_with_headers(
        &sluice,
        &[("x-sluice-provider-preference", r#"{"ignore":["zz"]}"#)],
        &body(false, ""),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let r = sluice.chat(&pref(r#"{"only":["p1"],"sort":"price"}"#));
    assert_eq!(r.status, 400, "unknown preference fields: {}", r.text());
    // Everything excluded by the client's own preference: a 400 saying why.
    let r = sluice.chat(&pref(r#"{"only":["p1"],"ignore":["p1"]}"#));
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("preference"), "{}", r.text());
    assert_eq!(chat_hits(&p1) + chat_hits(&p2) + chat_hits(&p3), before);
}

#[test]
fn allow_fallbacks_false_tries_only_the_first_candidate() {
    let (p1, p2, p3, sluice) = three_providers();
    p1.set_behavior(r#"{"status":500}"#);
    let r = sluice.chat(&body(true, r#","provider":{"allow_fallbacks":false}"#));
    assert_eq!(r.status, 500, "{}", r.text());
    assert_eq!((chat_hits(&p1), chat_hits(&p2), chat_hits(&p3)), (1, 0, 0));
    // With fallbacks (the default) and an order: p1 fails, the next in order serves.
    let r = sluice.chat(&body(false, r#","provider":{"order":["p1","p3"]}"#));
    assert_eq!(served_by(&r), "p3");
    assert_eq!(r.header("x-sluice-fallback-depth"), Some("1"));
}

#[test]
fn lowest_cost_picks_the_cheapest_route_for_this_request() {
    let p1 = Mock::start(r#"{"tokens":1}"#);
    let p2 = Mock::start(r#"{"tokens":1}"#);
    // p1: cheap input, dear output; p2: the opposite.
    let sluice = Sluice::start(&config_with_routes(
        "",
        &[P("p1", &p1.base_url(), ""), P("p2", &p2.base_url(), "")],
        &format!(
            "    strategy: lowest_cost\n{}",
            routes(&[
                (
                    "p1",
                    "        priority: 1\n        input_usd_per_mtok: 0.1\n        output_usd_per_mtok: 10\n"
                ),
                (
                    "p2",
                    "        priority: 2\n        input_usd_per_mtok: 10\n        output_usd_per_mtok: 0.1\n"
                ),
            ])
        ),
    ));
    // ~10k input tokens, 1 output token: p1 is far cheaper.
    let long = "x".repeat(40_000);
    let big_in = format!(
        r#"{{"model":"{MODEL}","max_tokens":1,"messages":[{{"role":"user","content":"{long}"}}]}}"#
    );
    // A few input tokens, up to 10k output tokens: p2 is far cheaper.
    let big_out = body(false, r#","max_tokens":10000"#);
    for _ in 0..3 {
        assert_eq!(served_by(&sluice.chat(&big_in)), "p1");
        assert_eq!(served_by(&sluice.chat(&big_out)), "p2");
    }
}

#[test]
fn a_keys_strategy_overrides_the_models() {
    let p1 = Mock::start(r#"{"tokens":1}"#);
    let p2 = Mock::start(r#"{"tokens":1}"#);
    let key2 = "sk-sluice-test-cheap-0002";
    let yaml = config_with_routes(
        "",
        &[P("p1", &p1.base_url(), ""), P("p2", &p2.base_url(), "")],
        &routes(&[
            ("p1", "        priority: 1\n        input_usd_per_mtok: 5\n"),
            (
                "p2",
                "        priority: 2\n        input_usd_per_mtok: 0.5\n",
            ),
        ]),
    )
    .replace(
        "    tenant: t\n",
        &format!("    tenant: t\n  - key: {key2}\n    tenant: t\n    strategy: lowest_cost\n"),
    );
    let sluice = Sluice::start(&yaml);
    assert_eq!(served_by(&sluice.chat(&body(false, ""))), "p1");
    let r = crate::harness::post_json(
        sluice.addr,
        "/v1/chat/completions",
        &[("authorization", &format!("Bearer {key2}"))],
        &body(false, ""),
    );
    assert_eq!(served_by(&r), "p2");
}

#[test]
fn priority_ties_are_spread_by_weight() {
    let p1 = Mock::start(r#"{"tokens":1}"#);
    let p2 = Mock::start(r#"{"tokens":1}"#);
    let p3 = Mock::start(r#"{"tokens":1}"#);
    let sluice = Sluice::start(&config_with_routes(
        "",
        &[
            P("p1", &p1.base_url(), ""),
            P("p2", &p2.base_url(), ""),
            P("p3", &p3.base_url(), ""),
        ],
        &routes(&[
            ("p1", "        priority: 5\n        weight: 3\n"),
            ("p2", "        priority: 5\n        weight: 1\n"),
            ("p3", "        priority: 6\n        weight: 100\n"),
        ]),
    ));
    let n = 400;
    for _ in 0..n {
        let r = sluice.chat(&body(false, ""));
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-sluice-fallback-depth"), Some("0"));
    }
    let (a, b, c) = (chat_hits(&p1), chat_hits(&p2), chat_hits(&p3));
    eprintln!("weights 3:1 over {n} requests: p1 {a}, p2 {b}, p3 {c}");
    assert_eq!(a + b, n);
    assert_eq!(c, 0, "a lower priority is only a fallback");
    // Expected 300:100; binomial sd ~8.7, so ±50 is over 5 sd.
    assert!((250..=350).contains(&a), "p1 {a} of {n}");
}

#[test]
fn lowest_latency_prefers_the_route_with_the_lower_recent_ttft() {
    let p1 = Mock::start(r#"{"tokens":1,"first_byte_delay_ms":150}"#);
    let p2 = Mock::start(r#"{"tokens":1}"#);
    let sluice = Sluice::start(&config(
        "",
        &[P("p1", &p1.base_url(), ""), P("p2", &p2.base_url(), "")],
        "    strategy: lowest_latency\n",
    ));
    // No samples yet: priority decides; then each route has one sample and p2 is faster.
    let order: Vec<String> = (0..6)
        .map(|_| served_by(&sluice.chat(&body(false, ""))).to_string())
        .collect();
    assert_eq!(order, ["p1", "p2", "p2", "p2", "p2", "p2"]);
}

/// Copies `from` into `to` recursively, replacing `(old, new)` pairs in every file.
fn copy_dir(from: &Path, to: &Path, subst: &[(&str, &str)]) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read fixture dir") {
        let entry = entry.expect("entry");
        let dest = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &dest, subst);
        } else {
            let mut text = std::fs::read_to_string(entry.path()).expect("read fixture");
            for (old, new) in subst {
                text = text.replace(old, new);
            }
            std::fs::write(dest, text).expect("write fixture copy");
        }
    }
}

fn fixture(rel: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/config")
        .join(rel)
}

/// `sluice -t -c FILE`: (success, stderr + stdout).
fn validate(file: &Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["-t", "-c"])
        .arg(file)
        .env_remove("RUST_LOG")
        .output()
        .expect("run sluice -t");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    (out.status.success(), text)
}

#[test]
fn a_split_config_validates_and_serves() {
    let (ok, text) = validate(&fixture("split/sluice.yaml"));
    assert!(ok, "{text}");
    assert!(text.contains("2 models, 2 providers"), "{text}");

    let p1 = Mock::start(r#"{"tokens":2}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let dir = TempDir::new("split");
    copy_dir(
        &fixture("split/providers.d"),
        &dir.path().join("providers.d"),
        &[
            ("http://127.0.0.1:18001/v1", &p1.base_url()),
            ("http://127.0.0.1:18002/v1", &p2.base_url()),
        ],
    );
    let main = std::fs::read_to_string(fixture("split/sluice.yaml"))
        .expect("main fixture")
        .replace("127.0.0.1:18080", "{listen}")
        .replace("127.0.0.1:19090", "{admin}")
        .replace(
            "  - providers.d\n",
            &format!("  - {}\n", dir.path().join("providers.d").display()),
        );
    let sluice = Sluice::start(&main);
    // acme/chat: priority, p1 first.
    let mut s = sluice.chat_stream(&body(true, ""));
    let bytes = s.read_to_end(Duration::from_secs(10));
    assert_eq!(s.header("x-sluice-provider"), Some("p1"));
    assert_clean_stream(&String::from_utf8_lossy(&bytes), "tok0 tok1 ");
    // acme/chat-cheap: lowest_cost, p2 is cheaper; the standard id comes back.
    let r = sluice.chat(&body(false, "").replace(MODEL, "acme/chat-cheap"));
    assert_eq!(served_by(&r), "p2");
    assert_eq!(r.json()["model"], "acme/chat-cheap");
    assert_eq!(chat_log(&p2)[0]["model"], "p2-model");
    // Falls back across files: p1 down, p2 serves acme/chat.
    p1.set_behavior(r#"{"status":500}"#);
    let r = sluice.chat(&body(false, ""));
    assert_eq!(served_by(&r), "p2");
    assert_eq!(r.header("x-sluice-fallback-depth"), Some("1"));
}

#[test]
fn a_split_config_with_a_bad_route_names_the_file_and_line() {
    let (ok, text) = validate(&fixture("split-bad/sluice.yaml"));
    assert!(!ok, "{text}");
    let expected = "providers.d/p9.yaml:6:9: models.acme/chat.routes[0].provider: unknown provider `p8` (known: p1)";
    assert!(text.contains(expected), "{text}");
    // The fixture states the error it expects.
    let stated = std::fs::read_to_string(fixture("split-bad/providers.d/p9.yaml")).expect("read");
    assert!(stated.contains(expected), "fixture comment out of date");

    // A provider file naming a standard model the main file does not list (a typo).
    let dir = TempDir::new("split-typo");
    copy_dir(&fixture("split"), dir.path(), &[]);
    std::fs::write(
        dir.path().join("providers.d/p3.yaml"),
        "providers:\n  p3:\n    kind: openai\n    base_url: http://127.0.0.1:18003/v1\nmodels:\n  acme/chta:\n    routes:\n      - provider: p3\n        upstream_model: p3-model\n",
    )
    .expect("write");
    let (ok, text) = validate(&dir.path().join("sluice.yaml"));
    assert!(!ok, "{text}");
    assert!(
        text.contains("providers.d/p3.yaml:6:3: models.acme/chta: unknown standard model `acme/chta` (known: acme/chat, acme/chat-cheap"),
        "{text}"
    );
}

#[test]
fn a_reload_mid_stream_leaves_the_open_stream_on_its_snapshot() {
    let p1 = Mock::start(r#"{"tokens":20,"token_delay_ms":100}"#);
    let p2 = Mock::start(r#"{"tokens":2}"#);
    let before = config(
        "",
        &[P("p1", &p1.base_url(), ""), P("p2", &p2.base_url(), "")],
        "",
    );
    let sluice = Sluice::start(&before);
    let mut s = sluice.chat_stream(&body(true, ""));
    assert_eq!(s.header("x-sluice-provider"), Some("p1"));
    let mut got = s.next_piece(Duration::from_secs(5)).expect("first event");

    // p1 leaves the config entirely; acme/chat now goes to p2 only.
    sluice.rewrite_config(&config("", &[P("p2", &p2.base_url(), "")], ""));
    sluice.signal("HUP");
    let reloaded = crate::fallback::eventually(Duration::from_secs(5), || {
        Metrics::scrape(&sluice).get("sluice_config_reloads_total", &[("result", "ok")]) >= 1.0
    });
    assert!(reloaded, "{}", sluice.log());
    // New requests see the new snapshot while the old stream is still open.
    let r = sluice.chat(&body(false, ""));
    assert_eq!(served_by(&r), "p2");
    assert!(!s.is_done(), "the stream outlived the reload");
    got.extend(s.read_to_end(Duration::from_secs(10)));
    assert_clean_stream(
        &String::from_utf8_lossy(&got),
        &(0..20).map(|i| format!("tok{i} ")).collect::<String>(),
    );
    assert_eq!(chat_hits(&p1), 1);
}
