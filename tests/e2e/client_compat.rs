//! Client compatibility found by trying Sluice as a new user would: percent-encoded model ids
//! (the SDKs encode the `/` of `acme/chat`), HTTP/1.0 streaming, preferences that exclude every
//! route, and access-log lines that client text cannot forge.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::harness::client::{get, post_json};
use crate::harness::{basic_config, Mock, Sluice, KEY};

#[test]
fn a_percent_encoded_model_id_is_found() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&basic_config(&mock.base_url(), ""));
    let auth = format!("Bearer {KEY}");
    let r = get(
        sluice.addr,
        "/v1/models/acme%2Fchat",
        &[("authorization", &auth)],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["id"], "acme/chat");
    // An unknown id is a 404 whose message echoes at most 256 characters of it.
    let long = "x".repeat(5000);
    let r = get(
        sluice.addr,
        &format!("/v1/models/{long}"),
        &[("authorization", &auth)],
    );
    assert_eq!(r.status, 404);
    assert!(r.body.len() < 1000, "error body of {} bytes", r.body.len());
}

#[test]
fn an_http_1_0_client_gets_a_close_delimited_stream() {
    let mock = Mock::start(r#"{"tokens":3}"#);
    let sluice = Sluice::start(&basic_config(&mock.base_url(), ""));
    let body = r#"{"model":"acme/chat","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let mut s = TcpStream::connect(sluice.addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.0\r\nauthorization: Bearer {KEY}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read until close");
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").expect("head");
    assert!(head.contains(" 200 "), "{head}");
    assert!(
        !head.to_ascii_lowercase().contains("transfer-encoding"),
        "{head}"
    );
    assert!(body.starts_with("data: {"), "{body}");
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
}

#[test]
fn a_preference_that_excludes_every_route_is_a_client_error() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&basic_config(&mock.base_url(), ""));
    let r = sluice.chat(
        r#"{"model":"acme/chat","messages":[{"role":"user","content":"x"}],"provider":{"ignore":["p1"]}}"#,
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "provider");
    assert_eq!(mock.hits(), 0);
}

#[test]
fn client_text_cannot_forge_access_log_lines() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&basic_config(&mock.base_url(), ""));
    let forged =
        "x\\n2026-11-30T01:00:00.000Z\\u00a0INFO\\u00a0sluice::access\\u00a0request_id=forged";
    let r = post_json(
        sluice.addr,
        "/v1/chat/completions",
        &[("authorization", &format!("Bearer {KEY}"))],
        &format!(r#"{{"model":"{forged}","messages":[{{"role":"user","content":"x"}}]}}"#),
    );
    assert_eq!(r.status, 404, "{}", r.text());
    // The access line itself (ASCII spaces around its target). The refusal's log line, which
    // quotes the model and also says `status=404`, comes first, so wait for this one.
    let is_access = |l: &str| l.contains(" sluice::access request_id=") && l.contains("status=404");
    let end = std::time::Instant::now() + Duration::from_secs(5);
    let log = loop {
        let log = sluice.log();
        if log.lines().any(is_access) || std::time::Instant::now() > end {
            break log;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let line = log
        .lines()
        .find(|l| is_access(l))
        .unwrap_or_else(|| panic!("no access line:\n{log}"));
    assert!(line.contains(r#"standard_model="x\n2026"#), "{line}");
    assert!(
        !log.lines()
            .any(|l| l.starts_with("2026-11-30T01:00:00.000Z")),
        "a forged line reached the log:\n{log}"
    );
}

#[test]
fn a_malformed_chunked_body_gets_a_json_400() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&basic_config(&mock.base_url(), ""));
    let mut s = TcpStream::connect(sluice.addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\nZZ\r\n{{}}\r\n0\r\n\r\n"
    )
    .expect("write");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read until close");
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").expect("a response");
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
    let v: serde_json::Value = serde_json::from_str(body).expect("JSON error body");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert_eq!(mock.hits(), 0);
}
