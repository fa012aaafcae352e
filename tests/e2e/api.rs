//! The OpenAI-compatible API surface over real sockets: non-streaming answers, what the
//! provider receives (model, credentials, body), every client-facing error with its status
//! and OpenAI JSON shape (<https://platform.openai.com/docs/guides/error-codes>), provider-key
//! hygiene, `GET /v1/models`, and the admin listener (`/healthz`, `/readyz`, `/metrics`).

use crate::harness::client::{get, post_json, request, Response};
use crate::harness::eventually;
use crate::harness::{basic_config, dead_url, Mock, Sluice, KEY};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const PROVIDER_KEY: &str = "sk-provider-secret-p1";
const ID: &str = "chatcmpl-e2e-unary";
const CREATED: u64 = 1_700_000_001;

fn bearer() -> String {
    format!("Bearer {KEY}")
}

fn chat_body(stream: bool, mock: &str) -> String {
    let mock = if mock.is_empty() {
        String::new()
    } else {
        format!(r#","mock":{mock}"#)
    };
    format!(
        r#"{{"model":"acme/chat","stream":{stream},"messages":[{{"role":"user","content":"say something"}}]{mock}}}"#
    )
}

/// `basic_config` with extra lines under `providers.p1` (indented 4 spaces).
fn config_with_provider_lines(base_url: &str, server: &str, provider: &str) -> String {
    basic_config(base_url, server).replace(
        &format!("    api_key: {PROVIDER_KEY}\n"),
        &format!("    api_key: {PROVIDER_KEY}\n{provider}"),
    )
}

/// Asserts the OpenAI error shape and returns the `error` object.
fn assert_error(r: &Response, status: u16, etype: &str, code: Option<&str>) -> serde_json::Value {
    assert_eq!(r.status, status, "status; body: {}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(
        r.header("content-length").and_then(|v| v.parse().ok()),
        Some(r.body.len()),
        "content-length"
    );
    assert!(r.header("x-request-id").is_some_and(|v| !v.is_empty()));
    let v = r.json();
    let obj = v.as_object().expect("object");
    assert_eq!(obj.len(), 1, "only `error` at the top: {v}");
    let e = &v["error"];
    let keys: Vec<&str> = e
        .as_object()
        .expect("error object")
        .keys()
        .map(String::as_str)
        .collect();
    for k in ["message", "type", "param", "code"] {
        assert!(keys.contains(&k), "error.{k} missing: {v}");
    }
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "message: {v}"
    );
    assert_eq!(e["type"], etype, "type: {v}");
    match code {
        Some(c) => assert_eq!(e["code"], c, "code: {v}"),
        None => assert!(e["code"].is_null() || e["code"].is_string(), "code: {v}"),
    }
    assert!(
        !r.text().contains(PROVIDER_KEY),
        "provider key leaked: {}",
        r.text()
    );
    e.clone()
}

/// Sends raw request bytes and reads one `Content-Length` response (bounded waits).
fn raw_exchange(addr: SocketAddr, req: &[u8]) -> Response {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    // The peer may answer (and close) before the whole body was written.
    let _ = s.write_all(req);
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).expect("status line");
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h).expect("header");
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .expect("content-length");
    let mut body = vec![0; len];
    r.read_exact(&mut body).expect("body");
    Response {
        status,
        headers,
        body,
    }
}

#[test]
fn non_streaming_answer_is_rewritten() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&basic_config(&mock.base_url(), ""));
    let r = sluice.chat(&chat_body(
        false,
        &format!(r#"{{"text":"héllo 世界 🚀","id":"{ID}","created":{CREATED},"prompt_tokens":3}}"#),
    ));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(
        r.header("content-length").and_then(|v| v.parse().ok()),
        Some(r.body.len())
    );
    assert!(r.header("transfer-encoding").is_none());
    assert!(r.header("x-request-id").is_some_and(|v| v.len() == 16));
    // Byte-exact: the mock's body with `model` replaced by the standard id.
    let expected = format!(
        concat!(
            r#"{{"id":"{ID}","object":"chat.completion","created":{CREATED},"model":"acme/chat","#,
            r#""choices":[{{"index":0,"message":{{"role":"assistant","content":"héllo 世界 🚀","#,
            r#""refusal":null,"annotations":[]}},"logprobs":null,"finish_reason":"stop"}}],"#,
            r#""usage":{{"prompt_tokens":3,"completion_tokens":3,"total_tokens":6}},"#,
            r#""system_fingerprint":"fp_mock"}}"#
        ),
        ID = ID,
        CREATED = CREATED
    );
    assert_eq!(r.text(), expected);
    let v = r.json();
    assert_eq!(v["model"], "acme/chat");
    assert_eq!(v["usage"]["total_tokens"], 6);
    // However the upstream body is cut into chunks, the answer is the same.
    for split in ["mid_line", "mid_utf8", "bytewise"] {
        let r = sluice.chat(&chat_body(
            false,
            &format!(
                r#"{{"text":"héllo 世界 🚀","id":"{ID}","created":{CREATED},"prompt_tokens":3,"split":"{split}"}}"#
            ),
        ));
        assert_eq!(r.status, 200);
        assert_eq!(r.text(), expected, "split {split}");
    }

    // A client request id is echoed.
    let r = post_json(
        sluice.addr,
        "/v1/chat/completions",
        &[("authorization", &bearer()), ("x-request-id", "unary-1")],
        &chat_body(false, ""),
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-request-id"), Some("unary-1"));
    // The access log line carries the id, tenant, models, provider and status.
    let found = eventually(Duration::from_secs(5), || {
        sluice.log().lines().any(|l| {
            l.contains("request_id=unary-1")
                && l.contains("tenant=t")
                && l.contains("standard_model=acme/chat")
                && l.contains("upstream_model=mock-small-v1")
                && l.contains("provider=p1")
                && l.contains("status=200")
        })
    });
    assert!(found, "access log line; log:\n{}", sluice.log());
}

#[test]
fn the_provider_sees_its_model_and_key_never_the_clients() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&basic_config(&mock.base_url(), ""));

    // Bearer auth, non-stream and stream.
    let body = chat_body(false, "");
    assert_eq!(sluice.chat(&body).status, 200);
    let s = sluice
        .chat_stream(&chat_body(true, ""))
        .read_to_end(Duration::from_secs(10));
    assert!(String::from_utf8_lossy(&s).ends_with("data: [DONE]\n\n"));
    // x-api-key auth.
    let r = post_json(
        sluice.addr,
        "/v1/chat/completions",
        &[("x-api-key", KEY)],
        &body,
    );
    assert_eq!(r.status, 200, "x-api-key auth: {}", r.text());

    let log = mock.log();
    assert_eq!(log.len(), 3);
    for rec in &log {
        assert_eq!(rec["model"], "mock-small-v1");
        assert_eq!(rec["path"], "/v1/chat/completions");
        assert_eq!(
            rec["headers"]["authorization"],
            format!("Bearer {PROVIDER_KEY}")
        );
        assert!(rec["headers"].get("x-api-key").is_none(), "{rec}");
        // The client's key is nowhere: not in a header, not in the body.
        for h in rec["all_headers"].as_array().expect("headers") {
            assert!(!h.to_string().contains(KEY), "client key forwarded: {h}");
        }
        assert!(!rec["body"].as_str().expect("body").contains(KEY));
        // Content-Length matches what was sent; the body is the client's with the model swapped.
        let len: u64 = rec["headers"]["content-length"]
            .as_str()
            .and_then(|v| v.parse().ok())
            .expect("content-length");
        assert_eq!(len, rec["body_bytes"].as_u64().expect("body_bytes"));
        let sent: serde_json::Value =
            serde_json::from_str(rec["body"].as_str().expect("body")).expect("json");
        assert_eq!(sent["messages"][0]["content"], "say something");
    }
    assert_eq!(
        log[0]["body_bytes"].as_u64(),
        Some((body.len() - "acme/chat".len() + "mock-small-v1".len()) as u64)
    );
    assert_eq!(log[1]["stream"], true);
}

#[test]
fn a_one_mib_request_body_passes() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&basic_config(&mock.base_url(), ""));
    let filler = "a".repeat(1024 * 1024);
    for stream in [false, true] {
        let body = format!(
            r#"{{"model":"acme/chat","stream":{stream},"messages":[{{"role":"user","content":"{filler}"}}]}}"#
        );
        assert!(body.len() > 1024 * 1024);
        mock.reset();
        let r = sluice.chat(&body);
        assert_eq!(r.status, 200, "stream={stream}: {}", r.text());
        let log = mock.log();
        assert_eq!(log.len(), 1);
        // Only `model` changed, and a stream asks for usage (metering).
        let usage = if stream {
            r#","stream_options":{"include_usage":true}"#.len()
        } else {
            0
        };
        let expected = (body.len() - "acme/chat".len() + "mock-small-v1".len() + usage) as u64;
        assert_eq!(log[0]["body_bytes"].as_u64(), Some(expected));
        assert_eq!(
            log[0]["headers"]["content-length"],
            expected.to_string(),
            "upstream Content-Length"
        );
    }
}

#[test]
fn client_errors_have_openai_shape_and_status() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&basic_config(&mock.base_url(), ""));
    let auth = bearer();
    let post = |headers: &[(&str, &str)], body: &str| {
        post_json(sluice.addr, "/v1/chat/completions", headers, body)
    };

    let e = assert_error(
        &post(
            &[("authorization", &auth)],
            r#"{"model":"acme/chat","messages":["#,
        ),
        400,
        "invalid_request_error",
        None,
    );
    assert!(e["message"].as_str().unwrap_or("").contains("JSON"), "{e}");

    let e = assert_error(
        &post(
            &[("authorization", &auth)],
            r#"{"messages":[{"role":"user","content":"x"}]}"#,
        ),
        400,
        "invalid_request_error",
        None,
    );
    assert_eq!(e["param"], "model");

    let e = assert_error(
        &post(&[], &chat_body(false, "")),
        401,
        "authentication_error",
        Some("invalid_api_key"),
    );
    assert!(
        e["message"].as_str().unwrap_or("").contains("API key"),
        "{e}"
    );
    assert_error(
        &post(
            &[("authorization", "Bearer sk-sluice-nope")],
            &chat_body(false, ""),
        ),
        401,
        "authentication_error",
        Some("invalid_api_key"),
    );
    assert_error(
        &post(&[("x-api-key", "sk-sluice-nope")], &chat_body(false, "")),
        401,
        "authentication_error",
        Some("invalid_api_key"),
    );
    // A virtual key that is a prefix or extension of the real one is not the real one.
    let longer = format!("Bearer {KEY}0");
    assert_eq!(
        post(&[("authorization", &longer)], &chat_body(false, "")).status,
        401
    );

    let e = assert_error(
        &post(
            &[("authorization", &auth)],
            r#"{"model":"acme/nope","messages":[{"role":"user","content":"x"}]}"#,
        ),
        404,
        "invalid_request_error",
        Some("model_not_found"),
    );
    assert!(e["message"].as_str().unwrap_or("").contains("acme/nope"));

    assert_error(
        &get(sluice.addr, "/v1/nope", &[("authorization", &auth)]),
        404,
        "invalid_request_error",
        Some("not_found"),
    );
    assert_error(
        &post_json(sluice.addr, "/v2/chat", &[("authorization", &auth)], "{}"),
        404,
        "invalid_request_error",
        Some("not_found"),
    );

    let r = get(
        sluice.addr,
        "/v1/chat/completions",
        &[("authorization", &auth)],
    );
    assert_error(&r, 405, "invalid_request_error", Some("method_not_allowed"));
    assert_eq!(r.header("allow"), Some("POST"));
    let r = request(
        sluice.addr,
        "DELETE",
        "/v1/models",
        &[("authorization", &auth)],
        b"",
    );
    assert_error(&r, 405, "invalid_request_error", Some("method_not_allowed"));
    assert_eq!(r.header("allow"), Some("GET"));

    // None of these reached the provider.
    assert_eq!(mock.hits(), 0);
}

#[test]
fn request_body_over_the_limit_is_413() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&basic_config(
        &mock.base_url(),
        "  max_request_body_bytes: 2048\n",
    ));
    let big = format!(
        r#"{{"model":"acme/chat","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "b".repeat(4096)
    );
    // Announced by Content-Length.
    let e = assert_error(
        &sluice.chat(&big),
        413,
        "invalid_request_error",
        Some("request_too_large"),
    );
    assert!(e["message"].as_str().unwrap_or("").contains("2048"), "{e}");

    // A much bigger announced body (1 MiB) is refused before it is read.
    let huge = format!(
        r#"{{"model":"acme/chat","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "h".repeat(1024 * 1024)
    );
    let mut req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {KEY}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        huge.len()
    )
    .into_bytes();
    req.extend_from_slice(huge.as_bytes());
    let r = raw_exchange(sluice.addr, &req);
    assert_error(&r, 413, "invalid_request_error", Some("request_too_large"));

    // Chunked, no Content-Length: found while reading.
    let mut req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {KEY}\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    .into_bytes();
    for piece in big.as_bytes().chunks(1000) {
        req.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        req.extend_from_slice(piece);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\n");
    let r = raw_exchange(sluice.addr, &req);
    assert_error(&r, 413, "invalid_request_error", Some("request_too_large"));

    // Just under the limit still works (chunked too).
    let small = chat_body(false, "");
    let mut req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {KEY}\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n{:x}\r\n{small}\r\n0\r\n\r\n",
        small.len()
    )
    .into_bytes();
    let r = raw_exchange(sluice.addr, &req);
    assert_eq!(r.status, 200, "{}", r.text());
    req.clear();
    assert_eq!(mock.hits(), 1);
}

#[test]
fn upstream_unreachable_is_502() {
    let base = dead_url();
    let sluice = Sluice::start(&basic_config(&base, ""));
    for stream in [false, true] {
        let e = assert_error(
            &sluice.chat(&chat_body(stream, "")),
            502,
            "api_error",
            Some("upstream_unavailable"),
        );
        assert!(e["message"].as_str().unwrap_or("").contains("p1"), "{e}");
    }
    assert!(!sluice.log().contains(PROVIDER_KEY));
}

#[test]
fn upstream_header_timeout_is_504() {
    let mock = Mock::start(r#"{"first_byte_delay_ms":2000}"#);
    let sluice = Sluice::start(&config_with_provider_lines(
        &mock.base_url(),
        "",
        "    first_byte_timeout_ms: 300\n",
    ));
    for stream in [false, true] {
        let t0 = Instant::now();
        let e = assert_error(
            &sluice.chat(&chat_body(stream, "")),
            504,
            "api_error",
            Some("upstream_timeout"),
        );
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(290) && took < Duration::from_millis(1800),
            "504 after {took:?}"
        );
        assert!(e["message"].as_str().unwrap_or("").contains("300"), "{e}");
    }
}

#[test]
fn upstream_errors_are_normalized() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&basic_config(&mock.base_url(), ""));

    // An OpenAI-shaped 400 passes through with its status, type, code and message.
    let r = sluice.chat(&chat_body(
        false,
        r#"{"status":400,"error_body":{"error":{"message":"max_tokens is too large","type":"invalid_request_error","param":"max_tokens","code":"bad_max_tokens"}}}"#,
    ));
    let e = assert_error(&r, 400, "invalid_request_error", Some("bad_max_tokens"));
    assert_eq!(e["message"], "max_tokens is too large");
    // The mock's default 400 body for a stream too.
    let r = sluice.chat(&chat_body(
        true,
        r#"{"status":400,"error_message":"messages[0] is broken"}"#,
    ));
    let e = assert_error(&r, 400, "invalid_request_error", None);
    assert_eq!(e["message"], "messages[0] is broken");

    // A plain-text 500 becomes OpenAI JSON with status 500.
    let r = sluice.chat(&chat_body(
        false,
        r#"{"status":500,"error_body":"Internal meltdown <html>"}"#,
    ));
    let e = assert_error(&r, 500, "api_error", None);
    assert!(
        e["message"]
            .as_str()
            .unwrap_or("")
            .contains("Internal meltdown"),
        "{e}"
    );

    // 429 keeps its Retry-After.
    // (OpenAI's own 429 body says `"type":"requests"`; the provider's type passes through.)
    let r = sluice.chat(&chat_body(false, r#"{"status":429,"retry_after_s":7}"#));
    assert_error(&r, 429, "requests", Some("rate_limit_exceeded"));
    assert_eq!(r.header("retry-after"), Some("7"));
}

#[test]
fn provider_key_never_leaks() {
    let mock = Mock::start("{}");
    // Many failures in a row: keep passive health from benching the only provider.
    let sluice = Sluice::start(&config_with_provider_lines(
        &mock.base_url(),
        "",
        "    health: {degraded_after_failures: 1000, unhealthy_after_failures: 1000}\n",
    ));
    let echo = format!("Incorrect API key provided: {PROVIDER_KEY}. Find your key at ...");
    let echo_json = serde_json::to_string(&echo).expect("json");
    let cases = [
        // 4xx JSON body echoing the key (message and other fields).
        format!(
            r#"{{"status":400,"error_body":{{"error":{{"message":{echo_json},"type":"invalid_request_error","param":"{PROVIDER_KEY}","code":null}}}}}}"#
        ),
        format!(
            r#"{{"status":422,"error_body":{{"error":{{"message":"bad key","type":"{PROVIDER_KEY}","code":"{PROVIDER_KEY}"}}}}}}"#
        ),
        // The provider rejects the gateway's key.
        format!(r#"{{"status":401,"error_message":{echo_json}}}"#),
        format!(r#"{{"status":403,"error_message":{echo_json}}}"#),
        // Plain-text 5xx echoing it.
        format!(r#"{{"status":500,"error_body":{echo_json}}}"#),
        format!(r#"{{"status":503,"error_message":{echo_json}}}"#),
        // An in-band error event before the first token, and one mid-stream.
        format!(r#"{{"error_after_tokens":0,"error_message":{echo_json}}}"#),
        format!(r#"{{"error_after_tokens":2,"error_message":{echo_json}}}"#),
    ];
    for (i, mock_knobs) in cases.iter().enumerate() {
        for stream in [false, true] {
            let r = sluice.chat(&chat_body(stream, mock_knobs));
            let text = r.text();
            assert!(
                !text.contains(PROVIDER_KEY),
                "case {i} stream={stream}: key in response {text}"
            );
            for (k, v) in &r.headers {
                assert!(!v.contains(PROVIDER_KEY), "key in header {k}");
            }
            // (`error_after_tokens` only applies to streams.)
            if stream || i < 6 {
                assert!(
                    r.status >= 400 || text.contains("error"),
                    "case {i}: {text}"
                );
            }
        }
    }
    // A provider 401/403 is the gateway's problem, not the client's: 502.
    let r = sluice.chat(&chat_body(false, &cases[2]));
    assert_error(&r, 502, "api_error", Some("upstream_unavailable"));
    // Mid-stream: the stream ends with an SSE error event (after the committed 200).
    let mut s = sluice.chat_stream(&chat_body(true, &cases[7]));
    assert_eq!(s.status, 200);
    let body = String::from_utf8(s.read_to_end(Duration::from_secs(10))).expect("utf-8");
    assert!(body.contains("event: error\ndata: {\"error\""), "{body}");
    assert!(!body.contains(PROVIDER_KEY));
    assert!(body.contains("[redacted]"), "{body}");

    // And never in Sluice's log.
    std::thread::sleep(Duration::from_millis(200));
    let log = sluice.log();
    assert!(!log.is_empty());
    assert!(!log.contains(PROVIDER_KEY), "provider key in log:\n{log}");
}

#[test]
fn models_list_shows_what_the_key_may_use() {
    let mock = Mock::start("{}");
    let yaml = basic_config(&mock.base_url(), "")
        .replace(
            "virtual_keys:\n",
            "virtual_keys:\n  - key: sk-sluice-limited-0002\n    tenant: t\n    allowed_models: [acme/chat]\n",
        )
        + "  acme/other:\n    routes:\n      - provider: p1\n        upstream_model: mock-other\n";
    let sluice = Sluice::start(&yaml);

    let r = get(sluice.addr, "/v1/models", &[("authorization", &bearer())]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    let v = r.json();
    assert_eq!(v["object"], "list");
    let ids: Vec<&str> = v["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|m| m["id"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, ["acme/chat", "acme/other"]);
    for m in v["data"].as_array().expect("data") {
        assert_eq!(m["object"], "model");
        assert!(m["created"].is_u64());
        assert!(m["owned_by"].is_string());
    }

    // The limited key sees (and may use) only its model.
    let limited = "Bearer sk-sluice-limited-0002";
    let v = get(sluice.addr, "/v1/models", &[("authorization", limited)]).json();
    let ids: Vec<&str> = v["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|m| m["id"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, ["acme/chat"]);
    let r = post_json(
        sluice.addr,
        "/v1/chat/completions",
        &[("authorization", limited)],
        r#"{"model":"acme/other","messages":[{"role":"user","content":"x"}]}"#,
    );
    assert!(matches!(r.status, 403 | 404), "{}", r.status);

    // One model by id (ids contain a slash).
    let r = get(
        sluice.addr,
        "/v1/models/acme/chat",
        &[("authorization", &bearer())],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["id"], "acme/chat");
    assert_error(
        &get(
            sluice.addr,
            "/v1/models/acme/other",
            &[("authorization", limited)],
        ),
        404,
        "invalid_request_error",
        Some("model_not_found"),
    );

    // No key, wrong key.
    assert_error(
        &get(sluice.addr, "/v1/models", &[]),
        401,
        "authentication_error",
        Some("invalid_api_key"),
    );
    assert_error(
        &get(
            sluice.addr,
            "/v1/models",
            &[("authorization", "Bearer nope")],
        ),
        401,
        "authentication_error",
        Some("invalid_api_key"),
    );
    assert_eq!(mock.hits(), 0);
}

#[test]
fn admin_endpoints_and_request_metrics() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&basic_config(&mock.base_url(), ""));

    let r = get(sluice.admin, "/healthz", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "ok\n");
    let r = get(sluice.admin, "/readyz", &[]);
    assert_eq!(r.status, 200);
    assert!(r.text().starts_with("ready"), "{}", r.text());
    assert_eq!(get(sluice.admin, "/nope", &[]).status, 404);
    // The admin port does not serve the API, nor the API port the admin paths.
    assert_eq!(get(sluice.addr, "/metrics", &[]).status, 404);

    let ok = r#"sluice_requests_total{model="acme/chat",status="200"}"#;
    let not_found = r#"sluice_requests_total{model="none",status="404"}"#;
    assert_eq!(
        sluice.metric_opt(ok),
        Some(0.0),
        "exported at 0, not counted, before any request"
    );
    for i in 0..3 {
        let r = sluice.chat(&chat_body(i % 2 == 1, ""));
        assert_eq!(r.status, 200);
    }
    let r = sluice.chat(r#"{"model":"acme/nope","messages":[{"role":"user","content":"x"}]}"#);
    assert_eq!(r.status, 404);
    // Counted in the logging phase, just after the response: poll briefly.
    assert!(
        eventually(Duration::from_secs(5), || sluice.metric(ok) == 3.0),
        "requests_total: {}",
        sluice.metrics()
    );
    assert!(eventually(Duration::from_secs(5), || sluice
        .metric(not_found)
        >= 1.0));
    // Exactly 3: no double counting.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(sluice.metric(ok), 3.0);

    let metrics = sluice.metrics();
    assert!(metrics.contains("# TYPE sluice_requests_total counter"));
    assert!(metrics.contains("# TYPE sluice_active_streams gauge"));
    let active = r#"sluice_active_streams{tenant="t"}"#;
    assert!(metrics.contains(active), "{metrics}");
    assert_eq!(sluice.gauge(active), 0.0);

    // While a slow stream is open the gauge is 1, and back to 0 after.
    let mut s = sluice.chat_stream(&chat_body(true, r#"{"tokens":4,"token_delay_ms":250}"#));
    assert_eq!(s.status, 200);
    let _ = s.next_piece(Duration::from_secs(5));
    assert_eq!(sluice.gauge(active), 1.0);
    let _ = s.read_to_end(Duration::from_secs(10));
    assert!(eventually(Duration::from_secs(5), || sluice.gauge(active) == 0.0));
    assert!(eventually(Duration::from_secs(5), || sluice.metric(ok) == 4.0));
}

/// Reads one response head (status and header lines) from `r`.
fn read_head(r: &mut BufReader<TcpStream>) -> (u16, Vec<String>) {
    let mut lines = Vec::new();
    loop {
        let mut l = String::new();
        r.read_line(&mut l).expect("head line");
        let l = l.trim_end().to_string();
        if l.is_empty() {
            break;
        }
        lines.push(l);
    }
    let status = lines
        .first()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad head {lines:?}"));
    (status, lines)
}

#[test]
fn expect_100_continue_is_answered() {
    // curl sends `Expect: 100-continue` for bodies over 1 MiB and waits up to 1 s for it.
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&basic_config(
        &mock.base_url(),
        "  max_request_body_bytes: 4096\n",
    ));
    let body = chat_body(false, "");
    let head = |key: &str, len: usize| {
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {key}\r\ncontent-type: application/json\r\ncontent-length: {len}\r\nexpect: 100-continue\r\nconnection: close\r\n\r\n"
        )
    };
    let connect = || {
        let s = TcpStream::connect_timeout(&sluice.addr, Duration::from_secs(5)).expect("connect");
        // Bounded: a missing `100 Continue` fails the read well before curl's 1 s.
        s.set_read_timeout(Some(Duration::from_millis(800))).ok();
        s
    };

    // Good key: 100 first, then the body is sent and answered.
    let mut s = connect();
    s.write_all(head(KEY, body.len()).as_bytes()).expect("head");
    let mut r = BufReader::new(s.try_clone().expect("clone"));
    let (status, _) = read_head(&mut r);
    assert_eq!(status, 100, "interim response before the body");
    s.write_all(body.as_bytes()).expect("body");
    r.get_ref()
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok();
    let (status, lines) = read_head(&mut r);
    assert_eq!(status, 200, "{lines:?}");

    // A bad key or an announced body over the limit: the final answer comes at once, and the
    // body is never needed.
    for (key, len, want) in [("sk-nope", body.len(), 401), (KEY, 5000, 413)] {
        let mut s = connect();
        s.write_all(head(key, len).as_bytes()).expect("head");
        let mut r = BufReader::new(s);
        let (status, lines) = read_head(&mut r);
        assert_eq!(status, want, "{lines:?}");
    }
    assert_eq!(mock.hits(), 1);
}

#[test]
fn no_key_in_the_log_even_at_trace_level() {
    // Pingora's TRACE lines print whole request heads (the injected provider key, the
    // client's virtual key); Sluice drops them.
    let mock = Mock::start("{}");
    let sluice = Sluice::start_with_env(
        &basic_config(&mock.base_url(), ""),
        &[("RUST_LOG", "trace")],
    );
    assert_eq!(sluice.chat(&chat_body(false, "")).status, 200);
    let s = sluice
        .chat_stream(&chat_body(true, ""))
        .read_to_end(Duration::from_secs(10));
    assert!(String::from_utf8_lossy(&s).ends_with("data: [DONE]\n\n"));
    let r = sluice.chat(&chat_body(
        false,
        &format!(r#"{{"status":500,"error_body":"echo {PROVIDER_KEY}"}}"#),
    ));
    assert_eq!(r.status, 500);
    assert!(eventually(Duration::from_secs(5), || sluice
        .log()
        .matches("sluice::access")
        .count()
        >= 3));
    let log = sluice.log();
    assert!(log.contains("TRACE"), "trace logging is on");
    assert!(!log.contains(PROVIDER_KEY), "provider key in the trace log");
    assert!(!log.contains(KEY), "virtual key in the trace log");
}

/// With the Responses API's WebSocket mode off (`server.responses_websocket: false`; issue
/// 29, item 5; the mode itself is `responses_websocket.rs`), the upgrade gets a 426 in
/// OpenAI's error shape at once, so the client falls back to HTTP; HTTP still works on the
/// same path.
#[test]
fn a_websocket_upgrade_of_the_responses_api_is_a_426_when_the_mode_is_off() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&basic_config(
        &mock.base_url(),
        "  responses_websocket: false\n",
    ));
    let auth = bearer();
    let t = Instant::now();
    let r = request(
        sluice.addr,
        "GET",
        "/v1/responses",
        &[
            ("authorization", &auth),
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-version", "13"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ],
        b"",
    );
    // The Responses dialect's own error shape (no `code` for the gateway's errors).
    let v = assert_error(&r, 426, "invalid_request_error", None);
    assert!(
        v["message"]
            .as_str()
            .unwrap_or("")
            .contains("POST /v1/responses"),
        "{v}"
    );
    assert!(t.elapsed() < Duration::from_secs(5), "answered at once");
    assert_eq!(mock.hits(), 0);
    let r = post_json(
        sluice.addr,
        "/v1/responses",
        &[("authorization", &auth)],
        r#"{"model":"acme/chat","input":"hi"}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
}
