//! TLS and HTTP versions downstream (issue 11): certificates from a test CA made here
//! (rcgen) for two names; SNI picks each name's certificate (the first is the default);
//! ALPN negotiates h2 (and http/1.1 when that is all a client offers); TLS 1.1 is refused,
//! 1.2 and 1.3 served; failed handshakes are counted, not logged at ERROR, and a handshake
//! must finish within the head deadline; a streamed chat completion over h2 arrives event by event; a reset h2
//! stream cancels the upstream at once; a renewed certificate is served to new connections
//! after a reload while open ones are untouched, and a broken one is refused; h2c with prior
//! knowledge works on the plain listener; a reload that moves the TLS listener says an
//! upgrade is needed; `sluice -t` checks that certificate and key load and match. Upstream,
//! a provider's TLS certificate is verified (system store, or its `ca_file`), and a provider
//! that offers h2 gets HTTP/2: streams share a connection, a client that leaves resets its
//! stream upstream.

use std::io::{Read, Write};
use std::net::TcpStream as StdTcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use tokio_rustls::rustls::version::{TLS12, TLS13};
use tokio_rustls::rustls::ProtocolVersion;

use crate::cancellation::{
    aborts, assert_upstream_closed_promptly, chat_body, wait_metric, MockClock,
};
use crate::harness::client::sse_text;
use crate::harness::tls::{concat, connect, h2_handshake, runtime, Pki};
use crate::harness::{basic_config, eventually, get, Mock, Sluice, KEY};

/// `server:` lines of a TLS listener with `a.pem` (a.test, the default) and `b.pem`
/// (b.test) from `pki`.
fn tls_server(pki: &Pki, extra: &str) -> String {
    format!(
        "  tls_listen: {{tls_listen}}\n  tls:\n    certificates:\n      - {{cert_path: {}, key_path: {}, server_names: [a.test]}}\n      - cert_path: {}\n        key_path: {}\n        server_names: [b.test]\n{extra}",
        pki.path("a", "pem").display(),
        pki.path("a", "key").display(),
        pki.path("b", "pem").display(),
        pki.path("b", "key").display(),
    )
}

/// A CA with leaves for a.test (also valid for other.test) and b.test; their DERs.
fn two_names() -> (Pki, Vec<u8>, Vec<u8>) {
    let pki = Pki::new();
    let a = pki.issue("a", &["a.test", "other.test"]);
    let b = pki.issue("b", &["b.test"]);
    (pki, a, b)
}

#[test]
fn sni_picks_each_names_certificate_and_alpn_negotiates_h2_or_http1() {
    let mock = Mock::start("{}");
    let (pki, a, b) = two_names();
    let sluice = Sluice::start(&basic_config(&mock.base_url(), &tls_server(&pki, "")));
    let rt = runtime();
    rt.block_on(async {
        let h2 = pki.client(&[b"h2", b"http/1.1"], &[&TLS13, &TLS12]);
        for (sni, want, which) in [
            ("a.test", &a, "a"),
            ("b.test", &b, "b"),
            // A name no entry lists (a's certificate covers it, its config entry does not):
            // the first certificate, the default.
            ("other.test", &a, "a (the default)"),
        ] {
            let c = connect(sluice.tls_addr, sni, h2.clone())
                .await
                .unwrap_or_else(|e| panic!("{sni}: {e}"));
            assert_eq!(&c.peer_cert, want, "SNI {sni} should get certificate {which}");
            assert_eq!(c.alpn.as_deref(), Some(&b"h2"[..]), "ALPN for {sni}");
        }

        // An HTTP/1.1-only client gets http/1.1 and is served over TLS.
        let h1 = pki.client(&[b"http/1.1"], &[&TLS13]);
        let mut c = connect(sluice.tls_addr, "b.test", h1).await.expect("tls");
        assert_eq!(c.alpn.as_deref(), Some(&b"http/1.1"[..]));
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let req = format!(
            "GET /v1/models HTTP/1.1\r\nhost: b.test\r\nauthorization: Bearer {KEY}\r\nconnection: close\r\n\r\n"
        );
        c.stream.write_all(req.as_bytes()).await.expect("write");
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), c.stream.read_to_end(&mut out)).await;
        let text = String::from_utf8_lossy(&out);
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(text.contains("acme/chat"), "{text}");
    });
}

/// A TLS 1.1 ClientHello (legacy version 0x0302, no `supported_versions`), with SNI, groups,
/// point formats and signature algorithms, so that the version is the only thing wrong.
fn tls11_client_hello() -> Vec<u8> {
    let mut ext = Vec::new();
    let mut push_ext = |ty: u16, body: &[u8]| {
        ext.extend_from_slice(&ty.to_be_bytes());
        ext.extend_from_slice(&(body.len() as u16).to_be_bytes());
        ext.extend_from_slice(body);
    };
    let name = b"a.test";
    let mut sni = Vec::new();
    sni.extend_from_slice(&((name.len() + 3) as u16).to_be_bytes());
    sni.push(0);
    sni.extend_from_slice(&(name.len() as u16).to_be_bytes());
    sni.extend_from_slice(name);
    push_ext(0x0000, &sni);
    push_ext(0x000a, &[0, 4, 0x00, 0x1d, 0x00, 0x17]);
    push_ext(0x000b, &[1, 0]);
    push_ext(0x000d, &[0, 6, 0x04, 0x03, 0x08, 0x04, 0x04, 0x01]);
    let mut hello = vec![0x03, 0x02];
    hello.extend_from_slice(&[0x42; 32]);
    hello.push(0);
    // ECDHE-ECDSA-AES128-SHA, ECDHE-RSA-AES128-SHA, AES128-SHA.
    hello.extend_from_slice(&[0, 6, 0xc0, 0x09, 0xc0, 0x13, 0x00, 0x2f]);
    hello.extend_from_slice(&[1, 0]);
    hello.extend_from_slice(&(ext.len() as u16).to_be_bytes());
    hello.extend_from_slice(&ext);
    let mut hs = vec![0x01];
    hs.extend_from_slice(&(hello.len() as u32).to_be_bytes()[1..]);
    hs.extend_from_slice(&hello);
    let mut rec = vec![0x16, 0x03, 0x01];
    rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    rec.extend_from_slice(&hs);
    rec
}

#[test]
fn tls_1_1_is_refused_and_tls_1_2_and_1_3_are_served() {
    let mock = Mock::start("{}");
    let (pki, a, _) = two_names();
    let sluice = Sluice::start(&basic_config(&mock.base_url(), &tls_server(&pki, "")));

    let mut sock =
        StdTcpStream::connect_timeout(&sluice.tls_addr, Duration::from_secs(5)).expect("tcp");
    sock.set_read_timeout(Some(Duration::from_secs(5))).ok();
    sock.write_all(&tls11_client_hello()).expect("hello");
    let mut reply = Vec::new();
    let mut buf = [0u8; 1024];
    while let Ok(n) = sock.read(&mut buf) {
        if n == 0 {
            break;
        }
        reply.extend_from_slice(&buf[..n]);
    }
    // One record: an alert (21), fatal (2), protocol_version (70). No ServerHello (22).
    assert!(reply.len() >= 7, "reply {reply:?}");
    assert_eq!(
        reply[0], 21,
        "a TLS alert record, not a handshake: {reply:?}"
    );
    assert_eq!(
        &reply[5..7],
        &[2, 70],
        "fatal protocol_version alert: {reply:?}"
    );

    let rt = runtime();
    rt.block_on(async {
        for (v, want) in [
            (&TLS12, ProtocolVersion::TLSv1_2),
            (&TLS13, ProtocolVersion::TLSv1_3),
        ] {
            let c = connect(sluice.tls_addr, "a.test", pki.client(&[b"h2"], &[v]))
                .await
                .expect("handshake");
            assert_eq!(c.version, Some(want));
            assert_eq!(c.peer_cert, a);
            let mut h = h2_handshake(c.stream, "a.test").await;
            let mut x = h.request("GET", "/v1/models", "").await;
            assert_eq!(x.status, 200);
            let body = concat(&x.frames(Duration::from_secs(5)).await);
            assert!(String::from_utf8_lossy(&body).contains("acme/chat"));
        }
    });
}

#[test]
fn failed_handshakes_are_counted_and_logged_below_error() {
    let mock = Mock::start("{}");
    let (pki, _, _) = two_names();
    let sluice = Sluice::start(&basic_config(&mock.base_url(), &tls_server(&pki, "")));
    // What scanners and plain-HTTP clients send to port 443: an HTTP request, then garbage
    // that is no TLS record, then a TLS 1.1 hello (no shared version).
    let attempts: [&[u8]; 3] = [
        b"GET / HTTP/1.1\r\nhost: a.test\r\n\r\n",
        b"\x16\x03\x01\x00\x05hello",
        &tls11_client_hello(),
    ];
    for bytes in attempts {
        let mut sock =
            StdTcpStream::connect_timeout(&sluice.tls_addr, Duration::from_secs(5)).expect("tcp");
        sock.set_read_timeout(Some(Duration::from_secs(5))).ok();
        sock.write_all(bytes).expect("write");
        let mut sink = Vec::new();
        let _ = sock.read_to_end(&mut sink);
    }
    let failures = r#"sluice_tls_handshake_failures_total{reason="error"}"#;
    assert!(
        eventually(Duration::from_secs(5), || sluice.metric(failures) >= 3.0),
        "{}",
        sluice.metrics()
    );
    // A real client is still served, and no handshake line reached ERROR (the harness logs
    // at info, so the DEBUG line is not written either).
    let rt = runtime();
    rt.block_on(async {
        let c = connect(sluice.tls_addr, "a.test", pki.client(&[b"h2"], &[&TLS13]))
            .await
            .expect("handshake");
        let mut h = h2_handshake(c.stream, "a.test").await;
        assert_eq!(h.request("GET", "/v1/models", "").await.status, 200);
    });
    let log = sluice.log();
    assert!(!log.contains("Downstream handshake"), "{log}");
    assert!(
        !log.lines().any(|l| l.contains(" ERROR ")),
        "an ERROR line: {log}"
    );
}

#[test]
fn a_handshake_must_finish_within_the_head_deadline() {
    let mock = Mock::start("{}");
    let (pki, _, _) = two_names();
    let sluice = Sluice::start(&basic_config(
        &mock.base_url(),
        &tls_server(&pki, "  header_read_timeout_ms: 1000\n"),
    ));
    // One client connects and stays silent; one sends the first bytes of a ClientHello
    // and no more. Pingora alone would hold both for 60 s.
    let started = Instant::now();
    let open = || {
        let s =
            StdTcpStream::connect_timeout(&sluice.tls_addr, Duration::from_secs(5)).expect("tcp");
        s.set_read_timeout(Some(Duration::from_secs(15))).ok();
        s
    };
    let mut silent = open();
    let mut partial = open();
    partial
        .write_all(&tls11_client_hello()[..10])
        .expect("write");
    for (what, sock) in [("silent", &mut silent), ("partial hello", &mut partial)] {
        let mut buf = [0u8; 64];
        // Closed (EOF or reset) by the server, not by our read timeout.
        match sock.read(&mut buf) {
            Ok(0) | Err(_) if started.elapsed() < Duration::from_secs(10) => {}
            other => panic!("{what}: {other:?} after {:?}", started.elapsed()),
        }
    }
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "closed before the deadline: {took:?}"
    );
    let timeouts = r#"sluice_tls_handshake_failures_total{reason="timeout"}"#;
    assert!(
        eventually(Duration::from_secs(5), || sluice.metric(timeouts) >= 2.0),
        "{}",
        sluice.metrics()
    );
    // A client that does its handshake in time is served.
    let rt = runtime();
    rt.block_on(async {
        let c = connect(sluice.tls_addr, "b.test", pki.client(&[b"h2"], &[&TLS12]))
            .await
            .expect("handshake");
        let mut h = h2_handshake(c.stream, "b.test").await;
        assert_eq!(h.request("GET", "/v1/models", "").await.status, 200);
    });
}

#[test]
fn a_streamed_chat_completion_over_h2_arrives_event_by_event() {
    let mock = Mock::start("{}");
    let (pki, _, _) = two_names();
    let sluice = Sluice::start(&basic_config(&mock.base_url(), &tls_server(&pki, "")));
    let rt = runtime();
    rt.block_on(async {
        let c = connect(sluice.tls_addr, "b.test", pki.client(&[b"h2"], &[&TLS13]))
            .await
            .expect("tls");
        assert_eq!(c.alpn.as_deref(), Some(&b"h2"[..]));
        let mut h = h2_handshake(c.stream, "b.test").await;
        let mut x = h
            .request(
                "POST",
                "/v1/chat/completions",
                &chat_body(true, r#"{"tokens":5,"token_delay_ms":200}"#),
            )
            .await;
        assert_eq!(x.status, 200);
        assert_eq!(
            x.headers.get("content-type").and_then(|v| v.to_str().ok()),
            Some("text/event-stream; charset=utf-8")
        );
        // HTTP/1 framing headers never reach an h2 client (the h2 codec would refuse them).
        assert!(x.headers.get("transfer-encoding").is_none());
        assert!(x.headers.get("connection").is_none());
        let frames = x.frames(Duration::from_secs(10)).await;
        let body = concat(&frames);
        assert_eq!(sse_text(&body), "tok0 tok1 tok2 tok3 tok4 ");
        assert!(String::from_utf8_lossy(&body).ends_with("data: [DONE]\n\n"));
        // Each token arrives in its own DATA frame, as the mock sends it: the first token
        // long before the last (4 gaps of 200 ms between them), nothing held back.
        let at = |tok: &str| {
            frames
                .iter()
                .find(|(_, b)| sse_text(b).contains(tok))
                .map(|(t, _)| *t)
                .unwrap_or_else(|| panic!("{tok} in no frame"))
        };
        let spread = at("tok4").duration_since(at("tok0"));
        eprintln!("tok0 → tok4 over h2: {spread:?} in {} frames", frames.len());
        assert!(
            spread >= Duration::from_millis(600),
            "tokens were buffered: tok0 → tok4 took {spread:?}"
        );
        for w in ["tok0", "tok1", "tok2", "tok3"] {
            assert!(at(w) < at("tok4"), "{w} arrived with the last token");
        }
    });
}

#[test]
fn a_reset_h2_stream_cancels_the_upstream_at_once_and_the_connection_stays_usable() {
    let mock = Mock::start("{}");
    let (pki, _, _) = two_names();
    let sluice = Sluice::start(&basic_config(&mock.base_url(), &tls_server(&pki, "")));
    let rt = runtime();
    rt.block_on(async {
        let c = connect(sluice.tls_addr, "a.test", pki.client(&[b"h2"], &[&TLS13]))
            .await
            .expect("tls");
        let mut h = h2_handshake(c.stream, "a.test").await;
        let mut x = h
            .request(
                "POST",
                "/v1/chat/completions",
                &chat_body(true, r#"{"tokens":1000,"token_delay_ms":50}"#),
            )
            .await;
        assert_eq!(x.status, 200);
        let mut got = Vec::new();
        while sse_text(&got).len() < "tok0 tok1 tok2 ".len() {
            let (_, b) = x
                .next_frame(Duration::from_secs(5))
                .await
                .expect("more stream");
            got.extend_from_slice(&b);
        }
        let clock = MockClock::read(&mock);
        let reset = Instant::now();
        x.request.send_reset(h2::Reason::CANCEL);
        let rec = assert_upstream_closed_promptly(&mock, 0, &clock, reset, "mid_stream");
        assert!(rec["bytes_written"].as_u64().unwrap_or(0) > 0);
        let (n, _) = wait_metric(&sluice, &aborts("streaming"), 1.0, Duration::from_secs(2));
        assert_eq!(n, 1.0);

        // The reset ended one stream, not the connection: the next request on it is served.
        let mut y = h
            .request(
                "POST",
                "/v1/chat/completions",
                &chat_body(true, r#"{"tokens":2}"#),
            )
            .await;
        assert_eq!(y.status, 200);
        assert_eq!(
            sse_text(&concat(&y.frames(Duration::from_secs(5)).await)),
            "tok0 tok1 "
        );
    });
}

#[test]
fn h2c_with_prior_knowledge_works_on_the_plain_listener_beside_http1() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&basic_config(&mock.base_url(), ""));
    let rt = runtime();
    rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(sluice.addr)
            .await
            .expect("tcp");
        let mut h = h2_handshake(tcp, "127.0.0.1").await;
        // Two streams at once on one connection.
        let body = chat_body(true, r#"{"tokens":3,"token_delay_ms":50}"#);
        let mut x = h.request("POST", "/v1/chat/completions", &body).await;
        let mut y = h.request("POST", "/v1/chat/completions", &body).await;
        assert_eq!((x.status, y.status), (200, 200));
        let (fx, fy) = tokio::join!(
            x.frames(Duration::from_secs(5)),
            y.frames(Duration::from_secs(5))
        );
        assert_eq!(sse_text(&concat(&fx)), "tok0 tok1 tok2 ");
        assert_eq!(sse_text(&concat(&fy)), "tok0 tok1 tok2 ");

        // A non-streaming answer, and an error in the client's dialect, over h2 too.
        let mut u = h
            .request(
                "POST",
                "/v1/chat/completions",
                &chat_body(false, r#"{"tokens":2}"#),
            )
            .await;
        assert_eq!(u.status, 200);
        let v: serde_json::Value =
            serde_json::from_slice(&concat(&u.frames(Duration::from_secs(5)).await))
                .expect("json answer");
        assert_eq!(v["choices"][0]["message"]["content"], "tok0 tok1 ");
        let mut e = h
            .request(
                "POST",
                "/v1/chat/completions",
                r#"{"model":"nope/none","messages":[{"role":"user","content":"hi"}]}"#,
            )
            .await;
        assert_eq!(e.status, 404);
        let v: serde_json::Value =
            serde_json::from_slice(&concat(&e.frames(Duration::from_secs(5)).await))
                .expect("json error");
        assert!(v["error"]["message"].is_string(), "{v}");
    });
    // HTTP/1.1 on the same listener, and a request shorter than the h2 preface (24 bytes)
    // answered at once (the preface check stops at the first differing byte).
    let r = get(
        sluice.addr,
        "/v1/models",
        &[("authorization", &format!("Bearer {KEY}"))],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let mut sock = StdTcpStream::connect(sluice.addr).expect("tcp");
    sock.set_read_timeout(Some(Duration::from_secs(3))).ok();
    let t = Instant::now();
    sock.write_all(b"GET / HTTP/1.0\r\n\r\n").expect("write");
    let mut buf = [0u8; 12];
    sock.read_exact(&mut buf).expect("an answer");
    assert_eq!(&buf, b"HTTP/1.1 404");
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
}

/// Waits until the log has `n` lines containing `needle`.
fn wait_log_count(sluice: &Sluice, needle: &str, n: usize) {
    assert!(
        eventually(Duration::from_secs(5), || sluice
            .log()
            .matches(needle)
            .count()
            >= n),
        "no {n} × {needle:?} in the log:\n{}",
        sluice.log()
    );
}

#[test]
fn a_renewed_certificate_is_served_to_new_connections_after_reload_open_ones_untouched() {
    let mock = Mock::start("{}");
    let (pki, a1, _) = two_names();
    // Reloads by SIGHUP only: the test decides when both renewed files are in place.
    let sluice = Sluice::start(&basic_config(
        &mock.base_url(),
        &tls_server(&pki, "  watch_config: false\n"),
    ));
    let rt = runtime();
    rt.block_on(async {
        // A fresh client config per connection: a shared one would resume the first TLS
        // session, and a resumed session presents no certificate (rustls reports the one
        // of the original handshake).
        let cfg = || pki.client(&[b"h2"], &[&TLS13]);
        let old = connect(sluice.tls_addr, "a.test", cfg())
            .await
            .expect("tls");
        assert_eq!(old.peer_cert, a1);
        let mut old = h2_handshake(old.stream, "a.test").await;

        // Renewal: a new key and certificate for the same name.
        let a2 = pki.issue("a", &["a.test"]);
        assert_ne!(a1, a2);
        sluice.signal("HUP");
        wait_log_count(&sluice, "TLS certificates reloaded", 1);
        let new = connect(sluice.tls_addr, "a.test", cfg())
            .await
            .expect("tls");
        assert_eq!(
            new.peer_cert, a2,
            "a new connection gets the renewed certificate"
        );

        // The connection opened before the reload still serves, with its handshake intact.
        let mut x = old.request("GET", "/v1/models", "").await;
        assert_eq!(x.status, 200);
        let _ = x.frames(Duration::from_secs(5)).await;

        // A broken renewal (the key of another certificate) is refused with file, line and
        // key; new handshakes keep the last good certificate.
        let b_key = std::fs::read_to_string(pki.path("b", "key")).expect("b key");
        pki.write("a", "key", &b_key);
        sluice.signal("HUP");
        wait_log_count(&sluice, "config reload rejected", 1);
        let log = sluice.log();
        let line = log
            .lines()
            .find(|l| l.contains("config reload rejected"))
            .expect("rejection line");
        assert!(
            line.contains("sluice.yaml:8:") && line.contains("server.tls.certificates[0].key_path"),
            "{line}"
        );
        assert!(line.contains("is not the certificate's"), "{line}");
        let again = connect(sluice.tls_addr, "a.test", cfg())
            .await
            .expect("tls");
        assert_eq!(again.peer_cert, a2, "the last good certificate stays");
    });
}

#[test]
fn a_reload_that_moves_the_tls_listener_says_an_upgrade_is_needed_and_keeps_serving() {
    let mock = Mock::start("{}");
    let (pki, a, _) = two_names();
    let yaml = basic_config(&mock.base_url(), &tls_server(&pki, ""));
    let sluice = Sluice::start(&yaml);
    let moved = yaml.replace("{tls_listen}", "127.0.0.1:1");
    sluice.rewrite_config(&moved);
    sluice.signal("HUP");
    wait_log_count(
        &sluice,
        "server.tls_listen only take effect after a restart or graceful upgrade",
        1,
    );
    let rt = runtime();
    rt.block_on(async {
        let c = connect(sluice.tls_addr, "a.test", pki.client(&[b"h2"], &[&TLS13]))
            .await
            .expect("the old TLS listener still serves");
        assert_eq!(c.peer_cert, a);
    });
}

fn check(config: &std::path::Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("-t")
        .arg("-c")
        .arg(config)
        .env_remove("RUST_LOG")
        .output()
        .expect("sluice -t");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout),
    )
}

#[test]
fn config_test_checks_that_certificates_and_keys_load_and_match() {
    let (pki, _, _) = two_names();
    let good = basic_config("http://127.0.0.1:9/v1", &tls_server(&pki, ""))
        .replace("{listen}", "127.0.0.1:18080")
        .replace("{admin}", "127.0.0.1:19090")
        .replace("{tls_listen}", "127.0.0.1:18443");
    let file = pki.dir.path().join("sluice.yaml");
    let write = |text: &str| std::fs::write(&file, text).expect("write config");

    write(&good);
    let (ok, out) = check(&file);
    assert!(ok, "{out}");

    // The second entry's key is a.test's: it does not belong to b.test's certificate.
    write(&good.replace(
        &pki.path("b", "key").display().to_string(),
        &pki.path("a", "key").display().to_string(),
    ));
    let (ok, out) = check(&file);
    assert!(!ok);
    assert!(
        out.contains("sluice.yaml:10:") && out.contains("server.tls.certificates[1].key_path"),
        "{out}"
    );

    let missing = pki.path("gone", "pem").display().to_string();
    write(&good.replace(&pki.path("a", "pem").display().to_string(), &missing));
    let (ok, out) = check(&file);
    assert!(!ok);
    assert!(
        out.contains("sluice.yaml:8:") && out.contains("server.tls.certificates[0].cert_path"),
        "{out}"
    );
    assert!(out.contains(&missing), "{out}");

    // Not a certificate at all.
    std::fs::write(pki.path("junk", "pem"), "hello\n").expect("junk");
    write(&good.replace(
        &pki.path("a", "pem").display().to_string(),
        &pki.path("junk", "pem").display().to_string(),
    ));
    let (ok, out) = check(&file);
    assert!(!ok);
    assert!(out.contains("no PEM `CERTIFICATE` block"), "{out}");

    // A TLS listener without certificates, and certificates without a listener.
    let bare = basic_config("http://127.0.0.1:9/v1", "  tls_listen: 127.0.0.1:18443\n")
        .replace("{listen}", "127.0.0.1:18080")
        .replace("{admin}", "127.0.0.1:19090");
    write(&bare);
    let (ok, out) = check(&file);
    assert!(!ok);
    assert!(
        out.contains("server.tls_listen: a TLS listener needs"),
        "{out}"
    );
    write(&good.replace("  tls_listen: 127.0.0.1:18443\n", ""));
    let (ok, out) = check(&file);
    assert!(!ok);
    assert!(
        out.contains("server.tls: certificates are configured"),
        "{out}"
    );
    // A provider ca_file that is missing, and one on a plain-HTTP provider.
    let with_ca = |base: &str, ca: &str| {
        basic_config(base, "")
            .replace("{listen}", "127.0.0.1:18080")
            .replace("{admin}", "127.0.0.1:19090")
            .replace(
                "api_key: sk-provider-secret-p1",
                &format!("api_key: sk-provider-secret-p1\n    ca_file: {ca}"),
            )
    };
    write(&with_ca("https://127.0.0.1:9/v1", &missing));
    let (ok, out) = check(&file);
    assert!(!ok);
    assert!(
        out.contains("providers.p1.ca_file") && out.contains(&missing),
        "{out}"
    );
    std::fs::write(pki.path("ca", "pem"), &pki.ca_pem).expect("ca file");
    let ca = pki.path("ca", "pem").display().to_string();
    write(&with_ca("https://127.0.0.1:9/v1", &ca));
    let (ok, out) = check(&file);
    assert!(ok, "{out}");
    write(&with_ca("http://127.0.0.1:9/v1", &ca));
    let (ok, out) = check(&file);
    assert!(!ok);
    assert!(out.contains("ca_file is for an https base_url"), "{out}");
    // The same port as the plain listener.
    write(&good.replace("tls_listen: 127.0.0.1:18443", "tls_listen: 0.0.0.0:18080"));
    let (ok, out) = check(&file);
    assert!(!ok);
    assert!(out.contains("overlaps `server.listen`"), "{out}");
}

#[test]
fn upstream_tls_is_verified_against_the_system_store_or_the_providers_ca_file() {
    let mock = Mock::start("{}");
    let pki = Pki::new();
    pki.issue("back", &["127.0.0.1"]);
    std::fs::write(pki.path("ca", "pem"), &pki.ca_pem).expect("ca file");
    // The provider: a Sluice whose TLS listener has a certificate of the test CA (for the
    // IP 127.0.0.1), relaying to the mock.
    let back = Sluice::start(&basic_config(
        &mock.base_url(),
        &format!(
            "  tls_listen: {{tls_listen}}\n  tls:\n    certificates:\n      - {{cert_path: {}, key_path: {}}}\n",
            pki.path("back", "pem").display(),
            pki.path("back", "key").display()
        ),
    ));
    let front_config = |ca_file: Option<&std::path::Path>| {
        let extra = ca_file.map_or(String::new(), |f| format!("\n    ca_file: {}", f.display()));
        basic_config(&format!("https://{}/v1", back.tls_addr), "")
            .replace(
                "api_key: sk-provider-secret-p1",
                &format!("api_key: {KEY}{extra}"),
            )
            .replace("upstream_model: mock-small-v1", "upstream_model: acme/chat")
    };
    let body = chat_body(true, r#"{"tokens":2}"#);

    // With the provider's CA: verified, served.
    let trusting = Sluice::start(&front_config(Some(&pki.path("ca", "pem"))));
    let r = trusting.chat(&body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(sse_text(&r.body), "tok0 tok1 ");

    // HTTP/2 to the provider (it offers h2): two streams at once share one connection.
    let slow = chat_body(true, r#"{"tokens":1000,"token_delay_ms":50}"#);
    let mut s1 = trusting.chat_stream(&slow);
    let mut s2 = trusting.chat_stream(&slow);
    for s in [&mut s1, &mut s2] {
        assert_eq!(s.status, 200);
        let mut got = Vec::new();
        while sse_text(&got).is_empty() {
            got.extend(s.next_piece(Duration::from_secs(5)).expect("stream"));
        }
    }
    assert_eq!(
        established_to(trusting.pid(), back.tls_addr.port()),
        1,
        "two streams to an h2 provider should share one connection"
    );
    // A client that leaves cancels its stream upstream (RST_STREAM to the provider, which
    // closes the mock's connection), the other stream is untouched.
    let clock = MockClock::read(&mock);
    let closed = Instant::now();
    s1.close();
    let chats = crate::cancellation::wait_chats(&mock, 3, Duration::from_secs(3));
    let gone = mock.wait_log(Duration::from_secs(3), |l| {
        crate::cancellation::chat_records(l)
            .iter()
            .filter(|r| r["peer_closed_at_ms"].is_u64())
            .count()
            >= 1
    });
    let gone: Vec<_> = crate::cancellation::chat_records(&gone)
        .into_iter()
        .enumerate()
        .filter(|(_, r)| r["peer_closed_at_ms"].is_u64())
        .collect();
    assert_eq!(gone.len(), 1, "exactly the left stream ends: {chats:#?}");
    assert_upstream_closed_promptly(&mock, gone[0].0, &clock, closed, "mid_stream");
    let more = s2
        .next_piece(Duration::from_secs(5))
        .expect("the other stream goes on");
    assert!(!more.is_empty());
    s2.close();

    // Without it the system store does not know the test CA: the handshake fails, nothing
    // is sent, the client gets a 5xx in its dialect.
    let hits = mock.hits();
    let strict = Sluice::start(&front_config(None));
    let r = strict.chat(&body);
    assert!(
        r.status >= 500,
        "an unverified provider was used: {} {}",
        r.status,
        r.text()
    );
    assert!(r.json()["error"]["message"].is_string(), "{}", r.text());
    assert_eq!(mock.hits(), hits, "nothing reached the provider");
}

/// ESTABLISHED TCP connections of process `pid` to loopback port `port` (its socket inodes
/// matched against `/proc/net/tcp`).
fn established_to(pid: u32, port: u16) -> usize {
    let inodes = crate::harness::socket_inodes(pid);
    let port_hex = format!(":{port:04X}");
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            f.len() > 9
                && f[2].ends_with(&port_hex)
                && f[3] == "01"
                && inodes.iter().any(|i| i == f[9])
        })
        .count()
}
