//! Ledger attribution (issue 30, item 15): a stream cut by the shutdown grace has its own
//! outcome (`shutdown`, not `upstream_error`); a translated answer Sluice cannot read (502)
//! names its provider and upstream model; token counts are not requests in
//! `sluice usage --summary`; `--limit N` gives the newest N records; `--since` at or after
//! `--until` is an error, not an empty answer.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::cancellation::chat_body;
use crate::harness::{post_json, Mock, Sluice, KEY};
use crate::ledger::{records, usage, wait_records};
use crate::timeouts::config;

fn by_id<'a>(recs: &'a [Value], id: &str) -> &'a Value {
    recs.iter()
        .find(|r| r["request_id"] == id)
        .unwrap_or_else(|| panic!("no record {id}: {recs:#?}"))
}

#[test]
fn a_stream_cut_by_the_shutdown_grace_is_recorded_as_shutdown() {
    let mock = Mock::start("{}");
    let mut sluice = Sluice::start(&config(
        "  shutdown_grace_ms: 300\n",
        &[("p1", &mock.base_url(), "")],
    ));
    let mut long = crate::harness::client::StreamReader::open(
        sluice.addr,
        "/v1/chat/completions",
        &[
            ("authorization", &format!("Bearer {KEY}")),
            ("x-request-id", "cut-1"),
        ],
        &chat_body(true, r#"{"tokens":1000,"token_delay_ms":50}"#),
    );
    assert_eq!(long.status, 200);
    long.read_until(b"tok1", Duration::from_secs(5));
    sluice.signal("TERM");
    let body = long.read_to_end(Duration::from_secs(5));
    assert!(String::from_utf8_lossy(&body).contains("\"code\":\"shutdown\""));
    assert!(sluice.wait_exit(Duration::from_secs(10)).is_some());
    let recs = records(sluice.dir.path(), &sluice.config_path, &[]);
    let r = by_id(&recs, "cut-1");
    assert_eq!(r["outcome"], "shutdown", "{r}");
    assert_eq!(r["provider"], "p1", "{r}");
}

#[test]
fn an_unreadable_translated_answer_names_its_provider_in_the_ledger() {
    let mock = Mock::start(r#"{"answer_body": "<html>gateway says hello</html>"}"#);
    let sluice = Sluice::start(&config("", &[("p1", &mock.base_url(), "")]));
    // A Messages client on an OpenAI route: the answer is translated, and cannot be read.
    let r = post_json(
        sluice.addr,
        "/v1/messages",
        &[
            ("x-api-key", KEY),
            ("anthropic-version", "2023-06-01"),
            ("x-request-id", "unreadable-1"),
        ],
        r#"{"model":"acme/chat","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(r.status, 502, "{}", r.text());
    let recs = wait_records(sluice.dir.path(), &sluice.config_path, 1);
    let rec = by_id(&recs, "unreadable-1");
    assert_eq!(rec["provider"], "p1", "{rec}");
    assert_eq!(rec["upstream_model"], "mock-small-v1", "{rec}");
    assert_eq!(rec["outcome"], "upstream_error", "{rec}");
}

#[test]
fn usage_counts_no_token_count_as_a_request_and_limit_gives_the_newest() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&config("", &[("p1", &mock.base_url(), "")]));
    for i in 0..3 {
        let r = post_json(
            sluice.addr,
            "/v1/chat/completions",
            &[
                ("authorization", &format!("Bearer {KEY}")),
                ("x-request-id", &format!("gen-{i}")),
            ],
            &chat_body(false, "{}"),
        );
        assert_eq!(r.status, 200);
        // Distinct arrival times, so "newest" is well defined.
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = post_json(
        sluice.addr,
        "/v1/messages/count_tokens",
        &[
            ("x-api-key", KEY),
            ("anthropic-version", "2023-06-01"),
            ("x-request-id", "count-1"),
        ],
        r#"{"model":"acme/chat","messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let recs = wait_records(sluice.dir.path(), &sluice.config_path, 4);
    assert_eq!(by_id(&recs, "count-1")["outcome"], "count_tokens");

    let dir = sluice.dir.path();
    let cfg = &sluice.config_path;
    let summary: Value =
        serde_json::from_str(&usage(dir, cfg, &["--summary", "--format", "json"])).expect("json");
    let row = &summary[0];
    assert_eq!(row["requests"], 3, "{summary}");

    // `--limit 2`: the two newest, oldest first.
    let newest = records(dir, cfg, &["--limit", "2"]);
    let ids: Vec<&str> = newest
        .iter()
        .map(|r| r["request_id"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(ids, ["gen-2", "count-1"], "{newest:#?}");

    // `--since` after `--until`: an error that says so, not an empty table.
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .current_dir(dir)
        .args(["usage", "-c"])
        .arg(cfg)
        .args(["--since", "2026-12-02", "--until", "2026-12-01"])
        .output()
        .expect("run sluice usage");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not before --until"), "{err}");
}
