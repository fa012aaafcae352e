//! Conversation state served by Sluice (issue 29, item 2): `store`, `previous_response_id`,
//! `item_reference`, `GET`/`DELETE /v1/responses/{id}` and `/input_items`, kept on the
//! ledger's database. Real Sluice processes and mock upstreams over loopback; what reached
//! the upstream is read from the mock's request log, what is stored from the HTTP API and
//! the database file.

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::client::{request, sse_events};
use crate::harness::{eventually, Mock, Response, Sluice, StreamReader, KEY};
use crate::ledger::Postgres;

/// The second tenant's virtual key.
const KEY_B: &str = "sk-sluice-test-tenant-b-0002";

/// Sluice with tenants `t` ([`KEY`]) and `u` ([`KEY_B`]), `providers` (YAML, indented two
/// spaces) and `models`, and `extra` top-level sections.
fn config(providers: &str, models: &str, extra: &str) -> String {
    format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\n  retry: {{max_attempts_per_route: 1}}\ntenants:\n  t: {{}}\n  u: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\n  - key: {KEY_B}\n    tenant: u\nproviders:\n{providers}models:\n{models}{extra}"
    )
}

/// One OpenAI provider `oa` on `mock` behind `acme/gpt`.
fn openai_config(mock: &Mock, extra: &str) -> String {
    config(
        &format!(
            "  oa:\n    kind: openai\n    base_url: {}\n    api_key: sk-provider-oa\n    health_check: {{enabled: false}}\n",
            mock.base_url()
        ),
        "  acme/gpt:\n    routes:\n      - {provider: oa, upstream_model: gpt-mock-1}\n",
        extra,
    )
}

fn auth(key: &str) -> String {
    format!("Bearer {key}")
}

/// `POST /v1/responses` (not streamed).
fn create(s: &Sluice, key: &str, body: &Value) -> Response {
    request(
        s.addr,
        "POST",
        "/v1/responses",
        &[("authorization", &auth(key))],
        body.to_string().as_bytes(),
    )
}

/// `POST /v1/responses` streamed: the `response` of its `response.completed` event.
fn create_streamed(s: &Sluice, key: &str, body: &Value) -> Value {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let mut r = StreamReader::open(
        s.addr,
        "/v1/responses",
        &[("authorization", &auth(key))],
        &body.to_string(),
    );
    assert_eq!(r.status, 200);
    let raw = r.read_to_end(Duration::from_secs(10));
    sse_events(&raw)
        .iter()
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|v| v["type"] == "response.completed")
        .map(|v| v["response"].clone())
        .unwrap_or_else(|| panic!("no response.completed: {}", String::from_utf8_lossy(&raw)))
}

/// `method` on `/v1/responses/{path}`.
fn call(s: &Sluice, key: &str, method: &str, path: &str) -> Response {
    request(
        s.addr,
        method,
        &format!("/v1/responses/{path}"),
        &[("authorization", &auth(key))],
        b"",
    )
}

/// Waits until `key`'s tenant sees response `id` (it is written just after the answer).
fn wait_stored(s: &Sluice, key: &str, id: &str) -> Value {
    let mut last = None;
    let ok = eventually(Duration::from_secs(5), || {
        let r = call(s, key, "GET", id);
        let ok = r.status == 200;
        last = Some(r);
        ok
    });
    let r = last.expect("asked");
    assert!(ok, "{id} not stored: {} {}", r.status, r.text());
    r.json()
}

/// The bodies the mock received, as text.
fn upstream_bodies(mock: &Mock) -> Vec<String> {
    mock.log()
        .iter()
        .filter(|r| r["method"] == "POST")
        .map(|r| r["body"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn a_three_turn_conversation_continues_across_a_fallback_from_anthropic_to_gemini() {
    let anthropic = Mock::start(r#"{"text":"ALPHA-ANSWER from claude"}"#);
    let gemini = Mock::start(r#"{"text":"GAMMA-ANSWER from gemini"}"#);
    let providers = format!(
        "  a:\n    kind: anthropic\n    base_url: http://{}/v1\n    api_key: sk-ant-x\n    health_check: {{enabled: false}}\n  g:\n    kind: gemini\n    base_url: http://{}/v1beta\n    api_key: g-key\n    health_check: {{enabled: false}}\n",
        anthropic.addr, gemini.addr
    );
    let models = "  acme/m:\n    default_max_tokens: 256\n    routes:\n      - {provider: a, upstream_model: claude-x, priority: 1}\n      - {provider: g, upstream_model: gemini-2.5-flash, priority: 2}\n";
    let sluice = Sluice::start(&config(&providers, models, ""));

    // Turn 1 on the Anthropic route (store defaults to true).
    let r1 = create(
        &sluice,
        KEY,
        &json!({"model": "acme/m", "instructions": "Be brief.", "input": "turn one ALPHA-Q"}),
    );
    assert_eq!(r1.status, 200, "{}", r1.text());
    assert_eq!(r1.header("x-sluice-provider"), Some("a"));
    let r1 = r1.json();
    let id1 = r1["id"].as_str().unwrap().to_string();
    assert_eq!(
        wait_stored(&sluice, KEY, &id1),
        r1,
        "GET returns what the client got"
    );

    // The Anthropic upstream now fails before its first byte: turn 2 (streamed) falls back
    // to Gemini, which must see turn 1 whole.
    anthropic.set_behavior(r#"{"status":503}"#);
    let r2 = create_streamed(
        &sluice,
        KEY,
        &json!({"model": "acme/m", "previous_response_id": id1, "input": "turn two BRAVO-Q"}),
    );
    let id2 = r2["id"].as_str().unwrap().to_string();
    assert_ne!(id1, id2);
    let g = upstream_bodies(&gemini);
    assert_eq!(g.len(), 1, "{g:?}");
    let (a1, a2, a3) = (
        g[0].find("turn one ALPHA-Q"),
        g[0].find("ALPHA-ANSWER from claude"),
        g[0].find("turn two BRAVO-Q"),
    );
    assert!(
        a1.is_some() && a1 < a2 && a2 < a3,
        "turn 2's upstream request lacks turn 1 in order: {}",
        g[0]
    );
    assert!(
        !g[0].contains("Be brief."),
        "instructions are not carried over: {}",
        g[0]
    );
    assert_eq!(
        wait_stored(&sluice, KEY, &id2),
        r2,
        "a stream stores its completed event's response"
    );

    // Turn 3 (not streamed) continues turn 2: the whole chain, oldest first.
    let r3 = create(
        &sluice,
        KEY,
        &json!({"model": "acme/m", "previous_response_id": id2, "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "turn three CHARLIE-Q"}]}
        ]}),
    );
    assert_eq!(r3.status, 200, "{}", r3.text());
    assert_eq!(r3.header("x-sluice-provider"), Some("g"));
    let g = upstream_bodies(&gemini);
    let last = &g[1];
    let order = [
        "turn one ALPHA-Q",
        "ALPHA-ANSWER from claude",
        "turn two BRAVO-Q",
        "GAMMA-ANSWER from gemini",
        "turn three CHARLIE-Q",
    ]
    .map(|s| last.find(s));
    assert!(
        order.iter().all(Option::is_some) && order.windows(2).all(|w| w[0] < w[1]),
        "turn 3's upstream request lacks the conversation in order ({order:?}): {last}"
    );
    // Each response lists only its own input.
    let id3 = r3.json()["id"].as_str().unwrap().to_string();
    wait_stored(&sluice, KEY, &id3);
    let items = call(&sluice, KEY, "GET", &format!("{id3}/input_items?order=asc")).json();
    assert_eq!(items["object"], "list");
    assert_eq!(items["data"].as_array().unwrap().len(), 1, "{items}");
    assert_eq!(
        items["data"][0]["content"][0]["text"],
        "turn three CHARLIE-Q"
    );
    assert_eq!(items["has_more"], false);
    assert_eq!(items["first_id"], items["data"][0]["id"]);
}

#[test]
fn item_references_to_a_function_call_and_its_output_are_resolved() {
    let mock = Mock::start(
        r#"{"text":"", "tool_calls":[{"name":"get_weather","arguments":{"city":"Bern"},"id":"call_wx1"}]}"#,
    );
    let sluice = Sluice::start(&openai_config(&mock, ""));
    let tools = json!([{"type": "function", "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    // Turn 1: the model calls the tool.
    let r1 = create(
        &sluice,
        KEY,
        &json!({"model": "acme/gpt", "input": "weather in Bern?", "tools": tools}),
    );
    assert_eq!(r1.status, 200, "{}", r1.text());
    let r1 = r1.json();
    let fc = r1["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "function_call")
        .unwrap_or_else(|| panic!("no function call: {r1}"))
        .clone();
    let fc_id = fc["id"].as_str().unwrap().to_string();
    let call_id = fc["call_id"].as_str().unwrap().to_string();
    wait_stored(&sluice, KEY, r1["id"].as_str().unwrap());

    // Turn 2: the call by reference, its output inline.
    mock.set_behavior(r#"{"text":"It is sunny in Bern."}"#);
    let r2 = create(
        &sluice,
        KEY,
        &json!({"model": "acme/gpt", "tools": tools, "input": [
            {"type": "item_reference", "id": fc_id},
            {"type": "function_call_output", "call_id": call_id, "output": "SUNNY-17C"}
        ]}),
    );
    assert_eq!(r2.status, 200, "{}", r2.text());
    let body = upstream_bodies(&mock).pop().unwrap();
    let up: Value = serde_json::from_str(&body).unwrap();
    let msgs = up["messages"].as_array().unwrap();
    assert_eq!(msgs[0]["tool_calls"][0]["id"], call_id.as_str(), "{body}");
    assert_eq!(msgs[0]["tool_calls"][0]["function"]["name"], "get_weather");
    assert_eq!(msgs[1]["role"], "tool");
    assert_eq!(msgs[1]["content"], "SUNNY-17C");
    // The stored input has the call itself, not the reference.
    let id2 = r2.json()["id"].as_str().unwrap().to_string();
    wait_stored(&sluice, KEY, &id2);
    let items = call_items(&sluice, &id2, "order=asc");
    assert_eq!(items["data"][0]["type"], "function_call", "{items}");
    assert_eq!(items["data"][0]["id"], fc_id.as_str());
    let output_id = items["data"][1]["id"].as_str().unwrap().to_string();
    // Paging: one at a time, `after` the first.
    let page = call_items(&sluice, &id2, "order=asc&limit=1");
    assert_eq!(
        (page["has_more"].clone(), page["last_id"].clone()),
        (json!(true), json!(fc_id))
    );
    let page = call_items(&sluice, &id2, &format!("order=asc&limit=1&after={fc_id}"));
    assert_eq!(page["data"][0]["id"], output_id.as_str());
    assert_eq!(page["has_more"], false);

    // Turn 3: both by reference (the output by the id the listing gave it).
    mock.set_behavior(r#"{"text":"Done."}"#);
    let r3 = create(
        &sluice,
        KEY,
        &json!({"model": "acme/gpt", "tools": tools, "store": false, "input": [
            {"type": "item_reference", "id": fc_id},
            {"type": "item_reference", "id": output_id},
            {"role": "user", "content": "thanks"}
        ]}),
    );
    assert_eq!(r3.status, 200, "{}", r3.text());
    let up: Value = serde_json::from_str(&upstream_bodies(&mock).pop().unwrap()).unwrap();
    let msgs = up["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 3, "{up}");
    assert_eq!(msgs[1]["content"], "SUNNY-17C");
    assert_eq!(msgs[2]["role"], "user");
    assert!(msgs[2]["content"].to_string().contains("thanks"), "{up}");
    // `store: false` stored nothing.
    let id3 = r3.json()["id"].as_str().unwrap().to_string();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(call(&sluice, KEY, "GET", &id3).status, 404);

    // An unknown reference is a 404 naming it; nothing goes upstream.
    let before = mock.hits();
    let r = create(
        &sluice,
        KEY,
        &json!({"model": "acme/gpt", "input": [{"type": "item_reference", "id": "fc_nope"}]}),
    );
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(r.text().contains("fc_nope"), "{}", r.text());
    assert_eq!(mock.hits(), before);
}

fn call_items(s: &Sluice, id: &str, query: &str) -> Value {
    let r = call(s, KEY, "GET", &format!("{id}/input_items?{query}"));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// The error body with the id asked for replaced, for comparing two 404s.
fn masked(r: &Response, id: &str) -> (u16, String) {
    (r.status, r.text().replace(id, "ID"))
}

#[test]
fn another_tenants_response_is_exactly_an_unknown_one() {
    let mock = Mock::start(r#"{"text":"SECRET-OF-T"}"#);
    let sluice = Sluice::start(&openai_config(&mock, ""));
    let r = create(&sluice, KEY, &json!({"model": "acme/gpt", "input": "hi"}));
    assert_eq!(r.status, 200, "{}", r.text());
    let id = r.json()["id"].as_str().unwrap().to_string();
    wait_stored(&sluice, KEY, &id);
    let unknown = "resp_does_not_exist_0";
    for (method, path_of) in [
        ("GET", (|i: &str| i.to_string()) as fn(&str) -> String),
        ("GET", |i: &str| format!("{i}/input_items")),
        ("DELETE", |i: &str| i.to_string()),
    ] {
        let theirs = call(&sluice, KEY_B, method, &path_of(&id));
        let none = call(&sluice, KEY_B, method, &path_of(unknown));
        assert_eq!(theirs.status, 404, "{method} {}", theirs.text());
        assert_eq!(masked(&theirs, &id), masked(&none, unknown), "{method}");
        assert!(!theirs.text().contains("SECRET-OF-T"));
    }
    let theirs = create(
        &sluice,
        KEY_B,
        &json!({"model": "acme/gpt", "input": "more", "previous_response_id": id}),
    );
    let none = create(
        &sluice,
        KEY_B,
        &json!({"model": "acme/gpt", "input": "more", "previous_response_id": unknown}),
    );
    assert_eq!(theirs.status, 400, "{}", theirs.text());
    assert_eq!(theirs.json()["error"]["param"], "previous_response_id");
    assert_eq!(masked(&theirs, &id), masked(&none, unknown));
    // Unauthenticated: 401, not a hint either way.
    let anon = request(sluice.addr, "GET", &format!("/v1/responses/{id}"), &[], b"");
    assert_eq!(anon.status, 401);
    // The other tenant's DELETE deleted nothing.
    assert_eq!(call(&sluice, KEY, "GET", &id).status, 200);
    // A tenant sees its own.
    let mine = create(
        &sluice,
        KEY_B,
        &json!({"model": "acme/gpt", "input": "u's own"}),
    );
    let mine_id = mine.json()["id"].as_str().unwrap().to_string();
    wait_stored(&sluice, KEY_B, &mine_id);
    assert_eq!(call(&sluice, KEY, "GET", &mine_id).status, 404);
}

#[test]
fn delete_removes_the_row_from_the_database_file() {
    let mock = Mock::start(r#"{"text":"to be deleted"}"#);
    let sluice = Sluice::start(&openai_config(&mock, ""));
    let r = create(
        &sluice,
        KEY,
        &json!({"model": "acme/gpt", "input": "DELETE-ME-Q"}),
    );
    let id = r.json()["id"].as_str().unwrap().to_string();
    wait_stored(&sluice, KEY, &id);
    let db = sluice.dir.path().join("sluice-usage.db");
    let rows = |sql: &str| -> i64 {
        let c = rusqlite::Connection::open(&db).expect("open the database");
        c.query_row(sql, [&id], |r| r.get(0)).expect("count")
    };
    assert_eq!(
        rows("SELECT COUNT(*) FROM stored_responses WHERE id = ?1"),
        1
    );
    assert!(rows("SELECT COUNT(*) FROM stored_response_items WHERE response_id = ?1") >= 2);
    let d = call(&sluice, KEY, "DELETE", &id);
    assert_eq!(d.status, 200, "{}", d.text());
    assert_eq!(
        d.json(),
        json!({"id": id, "object": "response", "deleted": true})
    );
    assert_eq!(
        rows("SELECT COUNT(*) FROM stored_responses WHERE id = ?1"),
        0
    );
    assert_eq!(
        rows("SELECT COUNT(*) FROM stored_response_items WHERE response_id = ?1"),
        0
    );
    assert_eq!(call(&sluice, KEY, "GET", &id).status, 404);
    assert_eq!(call(&sluice, KEY, "DELETE", &id).status, 404);
    let r = create(
        &sluice,
        KEY,
        &json!({"model": "acme/gpt", "input": "again", "previous_response_id": id}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("not found"), "{}", r.text());
}

#[test]
fn retention_expires_by_age_and_evicts_the_oldest_over_the_tenants_bytes() {
    let mock = Mock::start(r#"{"text":"short-lived"}"#);
    let sluice = Sluice::start(&openai_config(
        &mock,
        "response_store:\n  max_age_secs: 1\n  sweep_interval_secs: 1\n",
    ));
    let r = create(
        &sluice,
        KEY,
        &json!({"model": "acme/gpt", "input": "AGE-Q"}),
    );
    let id = r.json()["id"].as_str().unwrap().to_string();
    wait_stored(&sluice, KEY, &id);
    std::thread::sleep(Duration::from_millis(1300));
    assert_eq!(call(&sluice, KEY, "GET", &id).status, 404, "expired by age");
    let r = create(
        &sluice,
        KEY,
        &json!({"model": "acme/gpt", "input": "x", "previous_response_id": id}),
    );
    assert_eq!(r.status, 400, "an expired response is not continued");
    assert!(
        eventually(Duration::from_secs(5), || sluice
            .metric_opt(r#"sluice_response_store_evictions_total{reason="age"}"#)
            .is_some_and(|v| v >= 1.0)),
        "the sweep deleted nothing:\n{}",
        sluice.metrics()
    );
    let db = sluice.dir.path().join("sluice-usage.db");
    let c = rusqlite::Connection::open(&db).unwrap();
    let left: i64 = c
        .query_row(
            "SELECT COUNT(*) FROM stored_responses WHERE id = ?1",
            [&id],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(left, 0, "the sweep deleted the row");
    drop(sluice);

    // Bytes: each response is some 900 bytes; 2500 per tenant keeps two.
    let sluice = Sluice::start(&openai_config(
        &mock,
        "response_store:\n  max_bytes_per_tenant: 2500\n",
    ));
    let mut ids = Vec::new();
    for i in 0..4 {
        let r = create(
            &sluice,
            KEY,
            &json!({"model": "acme/gpt", "input": format!("BYTES-{i}")}),
        );
        let id = r.json()["id"].as_str().unwrap().to_string();
        wait_stored(&sluice, KEY, &id);
        ids.push(id);
    }
    let other = create(
        &sluice,
        KEY_B,
        &json!({"model": "acme/gpt", "input": "u keeps hers"}),
    );
    let other = other.json()["id"].as_str().unwrap().to_string();
    wait_stored(&sluice, KEY_B, &other);
    assert_eq!(
        call(&sluice, KEY, "GET", &ids[0]).status,
        404,
        "the oldest went first"
    );
    assert_eq!(call(&sluice, KEY, "GET", &ids[3]).status, 200);
    let bytes = sluice.gauge(r#"sluice_response_store_bytes{tenant="t"}"#);
    assert!(bytes > 0.0 && bytes <= 2500.0, "{bytes}");
    assert!(sluice.metric(r#"sluice_response_store_evictions_total{reason="bytes"}"#) >= 1.0);
    assert_eq!(
        call(&sluice, KEY_B, "GET", &other).status,
        200,
        "another tenant's budget is its own"
    );
}

#[test]
fn stored_bodies_never_reach_the_log_even_at_debug() {
    let mock = Mock::start(r#"{"text":"ANSWER-MARKER-7731"}"#);
    let sluice = Sluice::start_with_env(
        &openai_config(&mock, ""),
        &[(
            "RUST_LOG",
            "debug,pingora=info,h2=info,rustls=info,hyper=info",
        )],
    );
    let r = create(
        &sluice,
        KEY,
        &json!({"model": "acme/gpt", "input": "PROMPT-MARKER-4410"}),
    );
    let id = r.json()["id"].as_str().unwrap().to_string();
    wait_stored(&sluice, KEY, &id);
    let r = create_streamed(
        &sluice,
        KEY,
        &json!({"model": "acme/gpt", "input": "SECOND-MARKER-9", "previous_response_id": id}),
    );
    let id2 = r["id"].as_str().unwrap().to_string();
    wait_stored(&sluice, KEY, &id2);
    call(&sluice, KEY, "GET", &format!("{id2}/input_items"));
    call(&sluice, KEY, "DELETE", &id);
    let log = sluice.log();
    assert!(
        log.contains("response stored id="),
        "the debug line is there: {log}"
    );
    for marker in [
        "ANSWER-MARKER-7731",
        "PROMPT-MARKER-4410",
        "SECOND-MARKER-9",
    ] {
        assert!(!log.contains(marker), "{marker} in the log:\n{log}");
    }
}

#[test]
fn with_the_store_off_state_fields_keep_their_400_naming_the_field() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&openai_config(&mock, "response_store:\n  enabled: false\n"));
    for (body, param) in [
        (
            json!({"model": "acme/gpt", "input": "hi", "previous_response_id": "resp_1"}),
            "previous_response_id",
        ),
        (
            json!({"model": "acme/gpt", "input": "hi", "store": true}),
            "store",
        ),
        (
            json!({"model": "acme/gpt", "input": [{"type": "item_reference", "id": "fc_1"}]}),
            "input[0].type",
        ),
        (
            json!({"model": "acme/gpt", "input": "hi", "conversation": "conv_1"}),
            "conversation",
        ),
    ] {
        let r = create(&sluice, KEY, &body);
        assert_eq!(r.status, 400, "{body}");
        assert_eq!(r.json()["error"]["param"], param, "{}", r.text());
    }
    // The default (`store` unset) is answered and not stored.
    let r = create(&sluice, KEY, &json!({"model": "acme/gpt", "input": "hi"}));
    assert_eq!(r.status, 200, "{}", r.text());
    let id = r.json()["id"].as_str().unwrap().to_string();
    assert_eq!(call(&sluice, KEY, "GET", &id).status, 404);
    assert_eq!(mock.hits(), 1);
    // No table was created: the store never opened the database.
    let db = sluice.dir.path().join("sluice-usage.db");
    let c = rusqlite::Connection::open(&db).unwrap();
    let tables: i64 = c
        .query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE name = 'stored_responses'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(tables, 0);
}

#[test]
fn two_replicas_on_one_postgres_share_a_conversation() {
    let pg = Postgres::start();
    let mock = Mock::start(r#"{"text":"PG-ANSWER"}"#);
    let extra = format!("ledger:\n  url: {}\n", pg.url());
    let a = Sluice::start(&openai_config(&mock, &extra));
    let b = Sluice::start(&openai_config(&mock, &extra));
    // Turn 1 on replica a (streamed), turn 2 on b, turn 3 on a again.
    let r1 = create_streamed(
        &a,
        KEY,
        &json!({"model": "acme/gpt", "input": "PG turn one"}),
    );
    let id1 = r1["id"].as_str().unwrap().to_string();
    assert_eq!(wait_stored(&b, KEY, &id1), r1, "b reads what a stored");
    let r2 = create(
        &b,
        KEY,
        &json!({"model": "acme/gpt", "input": "PG turn two", "previous_response_id": id1}),
    );
    assert_eq!(r2.status, 200, "{}", r2.text());
    let id2 = r2.json()["id"].as_str().unwrap().to_string();
    wait_stored(&a, KEY, &id2);
    let r3 = create(
        &a,
        KEY,
        &json!({"model": "acme/gpt", "input": "PG turn three", "previous_response_id": id2}),
    );
    assert_eq!(r3.status, 200, "{}", r3.text());
    let last = upstream_bodies(&mock).pop().unwrap();
    let up: Value = serde_json::from_str(&last).unwrap();
    let texts: Vec<String> = up["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].to_string())
        .collect();
    assert_eq!(texts.len(), 5, "{last}");
    for (i, want) in [
        "PG turn one",
        "PG-ANSWER",
        "PG turn two",
        "PG-ANSWER",
        "PG turn three",
    ]
    .iter()
    .enumerate()
    {
        assert!(texts[i].contains(want), "message {i} {}: {last}", texts[i]);
    }
    // Another tenant, on either replica: unknown. A delete on b is seen by a.
    assert_eq!(call(&b, KEY_B, "GET", &id2).status, 404);
    assert_eq!(call(&b, KEY, "DELETE", &id1).status, 200);
    assert_eq!(call(&a, KEY, "GET", &id1).status, 404);
    assert!(
        a.log().contains("response store: postgres://"),
        "{}",
        a.log()
    );
}
