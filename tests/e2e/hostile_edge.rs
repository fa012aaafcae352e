//! Hostile input at the edge (issue 11), over raw loopback sockets to a real Sluice:
//!
//! - head limits: `server.max_uri_bytes` (414), `server.max_request_headers` and
//!   `server.max_request_header_bytes` (431), in the client's dialect, the connection closed
//!   after the answer; the defaults (Nginx's 8 KiB request line, 32 KiB head); heads past
//!   Pingora's own ceilings (256 fields, 1 MiB) and on keep-alive connections;
//! - `server.per_ip`: the request rate (429 + `Retry-After`, before authentication) and the
//!   connection cap (closed before a byte is read), both in `sluice_rejected_total{reason}`;
//! - `server.trusted_proxies`: `X-Forwarded-For` decides the client (`client=` in the access
//!   log, the per-IP rate key) only when the socket peer is trusted;
//! - hop-by-hop headers and the client's credentials never reach the provider.

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::harness::{basic_config, eventually, Mock, Response, Sluice, KEY};
use crate::hostile::{connect, read_response, read_until_closed};

/// Sends `raw` on a fresh connection and reads one response.
fn send(addr: SocketAddr, raw: &str) -> (Response, TcpStream) {
    let mut sock = connect(addr);
    sock.write_all(raw.as_bytes()).expect("write request");
    let mut r = BufReader::new(sock.try_clone().expect("clone"));
    (read_response(&mut r), sock)
}

/// A `GET` of `target` with `extra` header lines (each ending in CRLF), authenticated.
fn get_raw(target: &str, extra: &str) -> String {
    format!(
        "GET {target} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {KEY}\r\n{extra}\r\n"
    )
}

/// A `POST` to `path` with a small JSON body and `extra` header lines.
fn post_raw(path: &str, extra: &str) -> String {
    let body =
        r#"{"model":"acme/chat","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#;
    format!(
        "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nx-api-key: {KEY}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{extra}\r\n{body}",
        body.len()
    )
}

/// `n` header lines `x-pad-i: value`.
fn pad_headers(n: usize, value: &str) -> String {
    (0..n).map(|i| format!("x-pad-{i}: {value}\r\n")).collect()
}

/// Asserts `r` is the refusal `status` closing its connection, and returns its JSON body.
fn refused(r: &Response, mut sock: TcpStream, status: u16) -> serde_json::Value {
    assert_eq!(r.status, status, "{}", r.text());
    assert_eq!(r.header("connection"), Some("close"), "{:?}", r.headers);
    assert!(
        read_until_closed(&mut sock, Duration::from_secs(5)).is_empty(),
        "nothing follows the refusal"
    );
    r.json()
}

#[test]
fn head_limits_answer_414_and_431_in_the_client_dialect_and_close() {
    let mock = Mock::start("{}");
    let s = Sluice::start(&basic_config(
        &mock.base_url(),
        "  max_uri_bytes: 256\n  max_request_headers: 20\n  max_request_header_bytes: 4096\n",
    ));

    // 414: OpenAI's shape on an OpenAI path (and by default).
    let long = format!("/v1/models?q={}", "a".repeat(300));
    let (r, sock) = send(s.addr, &get_raw(&long, ""));
    let v = refused(&r, sock, 414);
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert_eq!(v["error"]["code"], "uri_too_long", "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("256"),
        "{v}"
    );

    // 431, too many fields: Anthropic's shape on /v1/messages.
    let (r, sock) = send(s.addr, &post_raw("/v1/messages", &pad_headers(20, "1")));
    let v = refused(&r, sock, 431);
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("20"),
        "{v}"
    );

    // 431, too many bytes (one 5000-byte field): OpenAI's shape with its code.
    let big = format!("x-big: {}\r\n", "b".repeat(5000));
    let (r, sock) = send(s.addr, &post_raw("/v1/chat/completions", &big));
    let v = refused(&r, sock, 431);
    assert_eq!(v["error"]["code"], "header_too_large", "{v}");

    // Just under every limit: served.
    let (r, _) = send(
        s.addr,
        &get_raw(
            &format!("/v1/models?q={}", "a".repeat(200)),
            &pad_headers(15, "1"),
        ),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(mock.hits(), 0, "no refused request reached the provider");

    for (reason, n) in [
        ("uri_too_long", 1.0),
        ("too_many_headers", 1.0),
        ("header_too_large", 1.0),
    ] {
        assert_eq!(
            s.metric(&format!(r#"sluice_rejected_total{{reason="{reason}"}}"#)),
            n,
            "{reason}"
        );
    }
}

#[test]
fn default_head_limits_follow_nginx_8k_request_line_and_32k_head() {
    let mock = Mock::start("{}");
    let s = Sluice::start(&basic_config(&mock.base_url(), ""));
    // An 8 KiB target fits; one byte more does not.
    let ok = format!("/v1/models?q={}", "a".repeat(8192 - 13));
    assert_eq!(ok.len(), 8192);
    assert_eq!(send(s.addr, &get_raw(&ok, "")).0.status, 200);
    let (r, sock) = send(s.addr, &get_raw(&format!("{ok}a"), ""));
    refused(&r, sock, 414);
    // A 24 KiB head fits in 32 KiB; a 40 KiB one does not.
    let (r, _) = send(
        s.addr,
        &get_raw("/v1/models", &pad_headers(24, &"v".repeat(1000))),
    );
    assert_eq!(r.status, 200);
    let (r, sock) = send(
        s.addr,
        &get_raw("/v1/models", &pad_headers(40, &"v".repeat(1000))),
    );
    refused(&r, sock, 431);
    // 100 fields are allowed (the 2 of `get_raw` + 98), 101 are not.
    assert_eq!(
        send(s.addr, &get_raw("/v1/models", &pad_headers(98, "1")))
            .0
            .status,
        200
    );
    let (r, sock) = send(s.addr, &get_raw("/v1/models", &pad_headers(99, "1")));
    refused(&r, sock, 431);
}

#[test]
fn heads_past_pingoras_own_ceilings_get_431_too_and_are_not_buffered_whole() {
    let mock = Mock::start("{}");
    let s = Sluice::start(&basic_config(&mock.base_url(), ""));
    // 300 fields: Pingora alone answers more than 256 with a bare 400.
    let (r, sock) = send(s.addr, &post_raw("/v1/messages", &pad_headers(300, "1")));
    let v = refused(&r, sock, 431);
    assert_eq!(v["type"], "error", "Anthropic's shape: {v}");
    // A 2 MiB head (past Pingora's 1 MiB): refused once 32 KiB have arrived. The client's
    // writes may fail once Sluice stops reading; the answer is there either way.
    let mut sock = connect(s.addr);
    let head = get_raw("/v1/models", &pad_headers(2048, &"v".repeat(1024)));
    let writer = {
        let mut w = sock.try_clone().unwrap();
        std::thread::spawn(move || w.write_all(head.as_bytes()).is_ok())
    };
    let mut r = BufReader::new(sock.try_clone().unwrap());
    let resp = read_response(&mut r);
    assert_eq!(resp.status, 431, "{}", resp.text());
    assert_eq!(resp.json()["error"]["code"], "header_too_large");
    drop(r);
    let _ = read_until_closed(&mut sock, Duration::from_secs(10));
    let _ = writer.join();
    // On a keep-alive connection, the second head is scanned too.
    let mut sock = connect(s.addr);
    sock.write_all(get_raw("/v1/models", "").as_bytes())
        .unwrap();
    let mut r = BufReader::new(sock.try_clone().unwrap());
    assert_eq!(read_response(&mut r).status, 200);
    let long = format!("/v1/models?q={}", "a".repeat(40_000));
    sock.write_all(get_raw(&long, "").as_bytes()).unwrap();
    let resp = read_response(&mut r);
    assert_eq!(resp.status, 414, "{}", resp.text());
    assert_eq!(
        s.metric(r#"sluice_rejected_total{reason="too_many_headers"}"#),
        1.0
    );
    assert_eq!(
        s.metric(r#"sluice_rejected_total{reason="header_too_large"}"#),
        1.0
    );
    assert_eq!(
        s.metric(r#"sluice_rejected_total{reason="uri_too_long"}"#),
        1.0
    );
    let log = s.log();
    assert!(
        !log.lines().any(|l| l.contains(" ERROR ")),
        "refusals are not errors: {log}"
    );
}

/// An unauthenticated `GET /v1/models` (401 when admitted) with `extra` header lines.
fn anonymous(extra: &str) -> String {
    format!("GET /v1/models HTTP/1.1\r\nhost: 127.0.0.1\r\n{extra}\r\n")
}

#[test]
fn the_per_ip_rate_answers_429_with_retry_after_before_authentication() {
    let mock = Mock::start("{}");
    let s = Sluice::start(&basic_config(
        &mock.base_url(),
        "  per_ip: {requests_per_second: 2, burst: 4}\n",
    ));
    // The burst is admitted (and fails authentication), the next is refused before it.
    for i in 0..4 {
        let (r, _) = send(s.addr, &anonymous(""));
        assert_eq!(r.status, 401, "request {i}: {}", r.text());
    }
    let (r, sock) = send(s.addr, &anonymous(""));
    let retry: u64 = r
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    let v = refused(&r, sock, 429);
    assert_eq!(v["error"]["type"], "rate_limit_error", "{v}");
    assert_eq!(v["error"]["code"], "per_ip_rate", "{v}");
    // burst 4 at 2/s: windows of 2 s; sure after the rest of this one and the next.
    assert!((2..=4).contains(&retry), "Retry-After {retry}");
    // An authenticated request is refused as well: the limit comes first.
    let (r, _) = send(s.addr, &get_raw("/v1/models", ""));
    assert_eq!(r.status, 429);
    assert_eq!(
        s.metric(r#"sluice_rejected_total{reason="per_ip_rate"}"#),
        2.0
    );
    // After Retry-After, admitted again.
    std::thread::sleep(Duration::from_secs(retry) + Duration::from_millis(100));
    let (r, _) = send(s.addr, &get_raw("/v1/models", ""));
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn the_per_ip_connection_cap_closes_connections_past_it_before_reading() {
    let mock = Mock::start("{}");
    let s = Sluice::start(&basic_config(
        &mock.base_url(),
        "  per_ip: {max_connections: 3}\n",
    ));
    // Three keep-alive connections, each served once and held open.
    let held: Vec<(TcpStream, BufReader<TcpStream>)> = (0..3)
        .map(|_| {
            let sock = connect(s.addr);
            (&sock)
                .write_all(get_raw("/v1/models", "").as_bytes())
                .unwrap();
            let mut r = BufReader::new(sock.try_clone().unwrap());
            assert_eq!(read_response(&mut r).status, 200);
            (sock, r)
        })
        .collect();
    // The fourth is closed without an answer.
    let mut fourth = connect(s.addr);
    let _ = fourth.write_all(get_raw("/v1/models", "").as_bytes());
    assert!(read_until_closed(&mut fourth, Duration::from_secs(5)).is_empty());
    assert_eq!(
        s.metric(r#"sluice_rejected_total{reason="per_ip_connections"}"#),
        1.0
    );
    // The held ones still serve.
    let (mut sock, mut r) = held.into_iter().next().unwrap();
    sock.write_all(get_raw("/v1/models", "").as_bytes())
        .unwrap();
    assert_eq!(read_response(&mut r).status, 200);
    // Closing one frees its place.
    drop(r);
    drop(sock);
    assert!(eventually(Duration::from_secs(5), || {
        let mut c = connect(s.addr);
        c.set_read_timeout(Some(Duration::from_secs(2))).ok();
        if c.write_all(get_raw("/v1/models", "").as_bytes()).is_err() {
            return false;
        }
        let mut line = String::new();
        std::io::BufRead::read_line(&mut BufReader::new(c), &mut line).is_ok()
            && line.starts_with("HTTP/1.1 200")
    }));
}

/// The `client=` field of the access line of request `id`.
fn logged_client(s: &Sluice, id: &str) -> String {
    let needle = format!("request_id={id} ");
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(line) = s.log().lines().find(|l| l.contains(&needle)) {
            return line
                .split_whitespace()
                .find_map(|f| f.strip_prefix("client="))
                .unwrap_or_else(|| panic!("no client= in {line}"))
                .to_string();
        }
        assert!(Instant::now() < end, "no access line for {id}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn x_forwarded_for_is_believed_only_from_trusted_proxies() {
    let mock = Mock::start("{}");
    let xff = "x-forwarded-for: 6.6.6.6, 203.0.113.7\r\n";
    // Loopback is a trusted proxy: the rightmost untrusted hop is the client (the forged
    // 6.6.6.6 the client put in front is not believed).
    let trusting = Sluice::start(&basic_config(
        &mock.base_url(),
        "  trusted_proxies: [10.0.0.0/8, 127.0.0.1/32]\n  per_ip: {requests_per_second: 1, burst: 3}\n",
    ));
    let (r, _) = send(
        trusting.addr,
        &get_raw("/v1/models", &format!("{xff}x-request-id: via-proxy\r\n")),
    );
    assert_eq!(r.status, 200);
    assert_eq!(logged_client(&trusting, "via-proxy"), "203.0.113.7");
    // The per-IP rate keys on that client, not on the proxy: 203.0.113.7 has used its
    // burst after two more, 203.0.113.8 has not.
    assert_eq!(
        send(trusting.addr, &get_raw("/v1/models", xff)).0.status,
        200
    );
    assert_eq!(
        send(trusting.addr, &get_raw("/v1/models", xff)).0.status,
        200
    );
    assert_eq!(
        send(trusting.addr, &get_raw("/v1/models", xff)).0.status,
        429
    );
    let other = "x-forwarded-for: 203.0.113.8\r\n";
    assert_eq!(
        send(trusting.addr, &get_raw("/v1/models", other)).0.status,
        200
    );

    // Nothing trusted (the default), or only other networks: the peer is the client.
    for extra in ["", "  trusted_proxies: [10.0.0.0/8]\n"] {
        let s = Sluice::start(&basic_config(&mock.base_url(), extra));
        let (r, _) = send(
            s.addr,
            &get_raw("/v1/models", &format!("{xff}x-request-id: direct\r\n")),
        );
        assert_eq!(r.status, 200);
        assert_eq!(logged_client(&s, "direct"), "127.0.0.1", "{extra:?}");
    }
}

#[test]
fn hop_by_hop_headers_and_client_credentials_never_reach_the_provider() {
    let mock = Mock::start("{}");
    let s = Sluice::start(&basic_config(&mock.base_url(), ""));
    let body = r#"{"model":"acme/chat","messages":[{"role":"user","content":"hi"}]}"#;
    // A chunked body (Transfer-Encoding is hop-by-hop too), both credential headers, and
    // every hop-by-hop field, one named only by `Connection`.
    let raw = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {KEY}\r\nx-api-key: {KEY}\r\ncontent-type: application/json\r\nconnection: keep-alive, x-secret-hop\r\nx-secret-hop: hop-value\r\nkeep-alive: timeout=5\r\nproxy-authorization: Basic cHJveHk6c2VjcmV0\r\nproxy-connection: keep-alive\r\nte: trailers\r\ntrailer: x-checksum\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
        body.len()
    );
    let (r, _) = send(s.addr, &raw);
    assert_eq!(r.status, 200, "{}", r.text());
    let log = mock.log();
    assert_eq!(log.len(), 1);
    let headers = log[0]["all_headers"].as_array().expect("headers");
    for h in headers {
        let name = h[0].as_str().unwrap().to_ascii_lowercase();
        let value = h[1].as_str().unwrap();
        assert!(
            ![
                "keep-alive",
                "x-secret-hop",
                "proxy-authorization",
                "proxy-connection",
                "te",
                "trailer",
                "transfer-encoding",
                "upgrade",
                "x-api-key",
            ]
            .contains(&name.as_str()),
            "forwarded: {name}: {value}"
        );
        assert!(
            !value.contains(KEY) && !value.contains("hop-value") && !value.contains("x-secret-hop"),
            "client value forwarded: {name}: {value}"
        );
    }
    // The provider got its own key, not the client's.
    assert_eq!(
        log[0]["headers"]["authorization"],
        "Bearer sk-provider-secret-p1"
    );
}
