//! Hostile downstream clients (issue 8, section 5), over raw loopback sockets:
//!
//! - many large uploads at once are bounded by `server.max_buffered_request_bytes`
//!   (503 + `Retry-After` beyond it, memory stays bounded), a body that cannot fit is
//!   refused at its head (before `100 Continue`), a chunked one mid-way;
//! - the tenant's concurrency slot is taken from the head, before the body is read;
//! - slowloris: a trickled head is cut at `server.header_read_timeout_ms` (first request from
//!   the accept, keep-alive requests from their first byte), a trickled body gets 408 at
//!   `server.body_read_timeout_ms`, clients leaving mid-head are counted, not logged as ERROR;
//! - HTTP/1.1: keep-alive and pipelined requests are all answered, in order.
//!
//! The edge limits of issue 11 (head size and count, URI length, per-IP rate and connections,
//! trusted proxies, hop-by-hop headers) are in `hostile_edge.rs`, on these helpers.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::{basic_config, eventually, Mock, Response, Sluice, KEY};

const MIB: usize = 1024 * 1024;

pub(crate) fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).ok();
    s.set_nodelay(true).ok();
    s
}

/// A chat body for `acme/chat` whose one message is `content`.
fn chat_body(content: &str, stream: bool) -> String {
    format!(
        r#"{{"model":"acme/chat","stream":{stream},"messages":[{{"role":"user","content":"{content}"}}]}}"#
    )
}

/// A chat request head (authenticated, `x-request-id: id`) with `framing` lines
/// (`content-length: N` or `transfer-encoding: chunked`, plus any extra header lines).
fn chat_head(id: &str, framing: &str) -> String {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {KEY}\r\ncontent-type: application/json\r\nx-request-id: {id}\r\n{framing}\r\n"
    )
}

/// A complete chat request with its body.
fn chat_request(id: &str, body: &str) -> String {
    format!(
        "{}{body}",
        chat_head(id, &format!("content-length: {}\r\n", body.len()))
    )
}

fn models_request(id: &str) -> String {
    format!(
        "GET /v1/models HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {KEY}\r\nx-request-id: {id}\r\n\r\n"
    )
}

/// Reads exactly one response (skipping `100 Continue`), framed by `Content-Length` or
/// chunked; a chunked body must end with its terminator.
pub(crate) fn read_response(r: &mut BufReader<TcpStream>) -> Response {
    loop {
        let (status, headers) = read_head(r);
        if status == 100 {
            continue;
        }
        let chunked = headers
            .iter()
            .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
        let mut body = Vec::new();
        if chunked {
            loop {
                let mut size = String::new();
                r.read_line(&mut size).expect("chunk size line");
                let n = usize::from_str_radix(size.trim(), 16)
                    .unwrap_or_else(|_| panic!("bad chunk size {size:?}"));
                let mut chunk = vec![0u8; n + 2];
                r.read_exact(&mut chunk).expect("chunk");
                assert_eq!(&chunk[n..], b"\r\n", "chunk not followed by CRLF");
                if n == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..n]);
            }
        } else {
            let n: usize = headers
                .iter()
                .find(|(k, _)| k == "content-length")
                .and_then(|(_, v)| v.parse().ok())
                .expect("content-length");
            body.resize(n, 0);
            r.read_exact(&mut body).expect("body");
        }
        return Response {
            status,
            headers,
            body,
        };
    }
}

fn read_head(r: &mut BufReader<TcpStream>) -> (u16, Vec<(String, String)>) {
    let mut line = String::new();
    let n = r.read_line(&mut line).expect("status line");
    assert!(n > 0, "connection closed before a response");
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h).expect("header line");
        let h = h.trim_end();
        if h.is_empty() {
            return (status, headers);
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
}

/// Waits until the server closes `sock` (EOF or reset); returns what it sent before.
pub(crate) fn read_until_closed(sock: &mut TcpStream, limit: Duration) -> Vec<u8> {
    sock.set_read_timeout(Some(limit)).ok();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match sock.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return got,
            Err(e) => panic!("the server did not close the connection within {limit:?}: {e}"),
        }
    }
}

/// Writes `lines` one per `every` on a clone of `sock` (stops at the first failed write).
fn trickle(
    sock: &TcpStream,
    lines: Vec<String>,
    every: Duration,
) -> std::thread::JoinHandle<usize> {
    let mut w = sock.try_clone().expect("clone socket");
    std::thread::spawn(move || {
        let mut sent = 0;
        for l in lines {
            if w.write_all(l.as_bytes()).is_err() {
                break;
            }
            sent += 1;
            std::thread::sleep(every);
        }
        sent
    })
}

fn head_lines() -> Vec<String> {
    let mut lines = vec![
        "GET /v1/models HTTP/1.1\r\n".to_string(),
        "host: 127.0.0.1\r\n".to_string(),
    ];
    lines.extend((0..30).map(|i| format!("x-slow-{i}: 1\r\n")));
    lines
}

fn no_error_lines(s: &Sluice) {
    let log = s.log();
    let errors: Vec<&str> = log.lines().filter(|l| l.contains(" ERROR ")).collect();
    assert!(errors.is_empty(), "ERROR lines in the log: {errors:#?}");
}

#[test]
fn a_head_trickled_one_line_a_second_is_cut_at_the_header_deadline() {
    let mock = Mock::start("{}");
    let s = Sluice::start(&basic_config(
        &mock.base_url(),
        "  header_read_timeout_ms: 3000\n",
    ));
    let started = Instant::now();
    let mut sock = connect(s.addr);
    let writer = trickle(&sock, head_lines(), Duration::from_secs(1));
    let got = read_until_closed(&mut sock, Duration::from_secs(10));
    let cut = started.elapsed();
    eprintln!("slowloris head cut after {cut:?} (header_read_timeout_ms: 3000)");
    assert!(got.is_empty(), "no answer to a cut head: {got:?}");
    // The deadline counts from the accept, which is after `started`.
    assert!(
        cut >= Duration::from_millis(2990) && cut < Duration::from_millis(3800),
        "cut after {cut:?}, want 3 s"
    );
    assert!(
        writer.join().unwrap() <= 5,
        "the trickle went on past the cut"
    );
    assert!(eventually(Duration::from_secs(2), || s.metric(
        r#"sluice_request_read_aborts_total{phase="head",reason="timeout"}"#
    ) == 1.0));
    no_error_lines(&s);
    // Others are served as before.
    assert_eq!(
        crate::harness::get(
            s.addr,
            "/v1/models",
            &[("authorization", &format!("Bearer {KEY}"))]
        )
        .status,
        200
    );
}

#[test]
fn on_keep_alive_the_header_deadline_counts_from_the_first_byte_of_the_next_head() {
    let mock = Mock::start("{}");
    let s = Sluice::start(&basic_config(
        &mock.base_url(),
        "  header_read_timeout_ms: 1500\n",
    ));
    let sock = connect(s.addr);
    let mut r = BufReader::new(sock.try_clone().unwrap());
    (&sock)
        .write_all(models_request("ka-1").as_bytes())
        .unwrap();
    assert_eq!(read_response(&mut r).status, 200);
    // Idle longer than the head deadline: that is the keep-alive's time, not the head's.
    std::thread::sleep(Duration::from_millis(2500));
    let first_byte = Instant::now();
    let writer = trickle(&sock, head_lines(), Duration::from_millis(400));
    let mut sock2 = sock.try_clone().unwrap();
    let got = read_until_closed(&mut sock2, Duration::from_secs(10));
    let cut = first_byte.elapsed();
    eprintln!("keep-alive head cut {cut:?} after its first byte (header_read_timeout_ms: 1500)");
    assert!(got.is_empty(), "no answer to a cut head: {got:?}");
    assert!(
        cut >= Duration::from_millis(1490) && cut < Duration::from_millis(2300),
        "cut {cut:?} after the head's first byte, want 1.5 s"
    );
    writer.join().unwrap();
    assert_eq!(
        s.metric(r#"sluice_request_read_aborts_total{phase="head",reason="timeout"}"#),
        1.0
    );
}

#[test]
fn clients_leaving_mid_head_are_counted_and_not_logged_as_errors() {
    let mock = Mock::start("{}");
    let s = Sluice::start(&basic_config(&mock.base_url(), ""));
    for i in 0..20 {
        let mut sock = connect(s.addr);
        sock.write_all(
            format!("POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nx-partial: {i}\r\n")
                .as_bytes(),
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(20));
        drop(sock);
    }
    // Connections opened and closed without a byte are ordinary, not counted.
    for _ in 0..5 {
        drop(connect(s.addr));
    }
    assert!(
        eventually(Duration::from_secs(5), || s.metric(
            r#"sluice_request_read_aborts_total{phase="head",reason="closed"}"#
        ) == 20.0),
        "closed mid-head: {}",
        s.metric(r#"sluice_request_read_aborts_total{phase="head",reason="closed"}"#)
    );
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        s.metric(r#"sluice_request_read_aborts_total{phase="head",reason="closed"}"#),
        20.0
    );
    no_error_lines(&s);
    let r = s.chat(&chat_body("still serving", false));
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn a_body_trickled_past_the_body_deadline_gets_408_and_the_connection_closes() {
    let mock = Mock::start("{}");
    let s = Sluice::start(&basic_config(
        &mock.base_url(),
        "  body_read_timeout_ms: 1500\n",
    ));
    let body = chat_body(&"x".repeat(2000), false);
    let sock = connect(s.addr);
    let started = Instant::now();
    (&sock)
        .write_all(
            chat_head("slow-body", &format!("content-length: {}\r\n", body.len())).as_bytes(),
        )
        .unwrap();
    let pieces: Vec<String> = body
        .as_bytes()
        .chunks(100)
        .map(|c| String::from_utf8(c.to_vec()).unwrap())
        .collect();
    let writer = trickle(&sock, pieces, Duration::from_millis(300));
    let mut r = BufReader::new(sock.try_clone().unwrap());
    let resp = read_response(&mut r);
    let after = started.elapsed();
    assert_eq!(resp.status, 408, "{}", resp.text());
    assert_eq!(resp.json()["error"]["code"], "request_timeout");
    assert_eq!(resp.header("connection"), Some("close"));
    assert!(
        after >= Duration::from_millis(1490) && after < Duration::from_millis(2500),
        "408 after {after:?}, want 1.5 s"
    );
    let rest = read_until_closed(r.get_mut(), Duration::from_secs(5));
    assert!(rest.is_empty());
    writer.join().unwrap();
    // A body that stops altogether gets the same answer at the same time.
    let stalled = connect(s.addr);
    let started = Instant::now();
    (&stalled)
        .write_all(
            chat_head(
                "stalled-body",
                &format!("content-length: {}\r\n", body.len()),
            )
            .as_bytes(),
        )
        .unwrap();
    (&stalled).write_all(&body.as_bytes()[..10]).unwrap();
    let resp = read_response(&mut BufReader::new(stalled.try_clone().unwrap()));
    let after = started.elapsed();
    assert_eq!(resp.status, 408, "{}", resp.text());
    assert!(
        after >= Duration::from_millis(1490) && after < Duration::from_millis(2500),
        "408 after {after:?}, want 1.5 s"
    );
    assert_eq!(
        s.metric(r#"sluice_request_read_aborts_total{phase="body",reason="timeout"}"#),
        2.0
    );
    assert_eq!(mock.hits(), 0, "nothing went upstream");
}

#[test]
fn pipelined_requests_are_answered_in_order_on_the_same_connection() {
    let mock = Mock::start("{}");
    let s = Sluice::start(&basic_config(&mock.base_url(), ""));
    let sock = connect(s.addr);
    let all = [
        models_request("pipe-1"),
        chat_request("pipe-2", &chat_body("second", false)),
        chat_request("pipe-3", &chat_body("third", true)),
    ]
    .concat();
    (&sock).write_all(all.as_bytes()).unwrap();
    let mut r = BufReader::new(sock.try_clone().unwrap());
    let first = read_response(&mut r);
    assert_eq!(
        (first.status, first.header("x-request-id")),
        (200, Some("pipe-1"))
    );
    assert_eq!(first.json()["object"], "list");
    assert_eq!(first.header("connection"), Some("keep-alive"));
    let second = read_response(&mut r);
    assert_eq!(
        (second.status, second.header("x-request-id")),
        (200, Some("pipe-2")),
        "{}",
        second.text()
    );
    assert_eq!(second.json()["object"], "chat.completion");
    let third = read_response(&mut r);
    assert_eq!(
        (third.status, third.header("x-request-id")),
        (200, Some("pipe-3"))
    );
    assert!(
        third.text().ends_with("data: [DONE]\n\n"),
        "{}",
        third.text()
    );
    // Still open and serving.
    (&sock)
        .write_all(models_request("pipe-4").as_bytes())
        .unwrap();
    let fourth = read_response(&mut r);
    assert_eq!(fourth.header("x-request-id"), Some("pipe-4"));
    assert_eq!(mock.hits(), 2);
}

#[test]
fn a_request_pipelined_while_the_previous_one_is_served_waits_its_turn() {
    // The provider takes 600 ms: the second request arrives while the first waits for it.
    let mock = Mock::start(r#"{"first_byte_delay_ms":600}"#);
    let s = Sluice::start(&basic_config(&mock.base_url(), ""));
    let sock = connect(s.addr);
    (&sock)
        .write_all(chat_request("during-1", &chat_body("first", true)).as_bytes())
        .unwrap();
    assert!(eventually(Duration::from_secs(5), || mock.hits() == 1));
    (&sock)
        .write_all(chat_request("during-2", &chat_body("second", false)).as_bytes())
        .unwrap();
    let mut r = BufReader::new(sock.try_clone().unwrap());
    let first = read_response(&mut r);
    assert_eq!(
        (first.status, first.header("x-request-id")),
        (200, Some("during-1"))
    );
    assert!(
        first.text().ends_with("data: [DONE]\n\n"),
        "{}",
        first.text()
    );
    let second = read_response(&mut r);
    assert_eq!(
        (second.status, second.header("x-request-id")),
        (200, Some("during-2"))
    );
    assert_eq!(
        s.metric(r#"sluice_client_aborts_total{phase="waiting_head"}"#),
        0.0,
        "the pipelined bytes are not a client leaving"
    );
}

#[test]
fn keep_alive_requests_one_after_another_are_all_answered() {
    let mock = Mock::start("{}");
    let s = Sluice::start(&basic_config(&mock.base_url(), ""));
    let sock = connect(s.addr);
    let mut r = BufReader::new(sock.try_clone().unwrap());
    for i in 0..3 {
        let id = format!("seq-{i}");
        (&sock)
            .write_all(chat_request(&id, &chat_body("again", i % 2 == 0)).as_bytes())
            .unwrap();
        let resp = read_response(&mut r);
        assert_eq!(
            (resp.status, resp.header("x-request-id")),
            (200, Some(id.as_str()))
        );
        assert_eq!(resp.header("connection"), Some("keep-alive"));
    }
}

/// One upload of `body` with `Expect: 100-continue`, sent in 256 KiB pieces 20 ms apart once
/// Sluice says continue; the final response and whether Sluice asked for the body.
fn upload(addr: SocketAddr, body: &[u8]) -> (Response, bool) {
    let sock = connect(addr);
    (&sock)
        .write_all(
            chat_head(
                "upload",
                &format!("expect: 100-continue\r\ncontent-length: {}\r\n", body.len()),
            )
            .as_bytes(),
        )
        .expect("write head");
    let mut r = BufReader::new(sock.try_clone().expect("clone socket"));
    let (status, headers) = read_head(&mut r);
    if status != 100 {
        // Refused at the head: the body was never asked for.
        let n: usize = headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let mut b = vec![0u8; n];
        r.read_exact(&mut b).expect("error body");
        let resp = Response {
            status,
            headers,
            body: b,
        };
        return (resp, false);
    }
    for piece in body.chunks(256 * 1024) {
        if (&sock).write_all(piece).is_err() {
            // Refused mid-way (the body outgrew what was left of the bound): the answer was
            // written before the close, unless the close's reset discarded it.
            return (read_answer_after_cut(&mut r), true);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    (read_response(&mut r), true)
}

/// What is left to read of an answer to a body that was cut off mid-way: the response, or
/// status 0 when the connection's reset discarded it.
fn read_answer_after_cut(r: &mut BufReader<TcpStream>) -> Response {
    let mut raw = Vec::new();
    let _ = r.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return Response {
            status: 0,
            headers: Vec::new(),
            body: raw,
        };
    };
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Response {
        status,
        headers,
        body: body.as_bytes().to_vec(),
    }
}

/// A chat body of about `size` bytes.
fn big_body(size: usize) -> Vec<u8> {
    let pre = br#"{"model":"acme/chat","messages":[{"role":"user","content":""#;
    let post = br#""}]}"#;
    let mut b = Vec::with_capacity(size);
    b.extend_from_slice(pre);
    b.resize(size - post.len(), b'a');
    b.extend_from_slice(post);
    b
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one end-to-end scenario, read top to bottom"
)]
fn a_hundred_large_uploads_at_once_are_bounded_by_the_request_buffers() {
    // The provider holds each admitted request 1.5 s, so admitted bodies stay held. A fixed
    // mmap threshold keeps glibc from holding freed body buffers in RSS (see the end).
    let mock = Mock::start(r#"{"first_byte_delay_ms":1500}"#);
    let bound = 32 * MIB;
    let s = Sluice::start_with_env(
        &basic_config(
            &mock.base_url(),
            &format!(
                "  max_request_body_bytes: {}\n  max_buffered_request_bytes: {bound}\n",
                8 * MIB
            ),
        ),
        &[("MALLOC_MMAP_THRESHOLD_", "131072")],
    );
    assert_eq!(s.chat(&chat_body("warm up", false)).status, 200);
    let base_kib = s.rss_kib();
    let peak_kib = Arc::new(AtomicU64::new(base_kib));
    let peak_gauge = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let monitor = {
        let (peak_kib, peak_gauge, done) = (peak_kib.clone(), peak_gauge.clone(), done.clone());
        let (pid, admin) = (s.pid(), s.admin);
        std::thread::spawn(move || {
            let end = Instant::now() + Duration::from_secs(120);
            while !done.load(Ordering::Acquire) && Instant::now() < end {
                let status =
                    std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
                let rss: u64 = status
                    .lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.split_whitespace().next())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                peak_kib.fetch_max(rss, Ordering::AcqRel);
                let text = crate::harness::get(admin, "/metrics", &[]).text();
                // A peak sampler: an absent gauge reads 0 here (the peak is asserted later).
                let g = crate::harness::parse_metric(&text, "sluice_buffered_request_bytes")
                    .unwrap_or(0.0);
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                peak_gauge.fetch_max(g as u64, Ordering::AcqRel);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let body = Arc::new(big_body(5_000_000));
    let clients: Vec<_> = (0..100)
        .map(|_| {
            let (addr, body) = (s.addr, body.clone());
            std::thread::spawn(move || upload(addr, &body))
        })
        .collect();
    let responses: Vec<(Response, bool)> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    // A body that does not fit is refused at its head (never asked for), or mid-way once
    // its buffer outgrows what is left; every body served was asked for.
    for (r, continued) in &responses {
        assert!(
            *continued || r.status == 503,
            "status {} continued {continued}",
            r.status
        );
    }
    let responses: Vec<Response> = responses.into_iter().map(|(r, _)| r).collect();
    done.store(true, Ordering::Release);
    monitor.join().unwrap();
    let ok = responses.iter().filter(|r| r.status == 200).count();
    let refused: Vec<&Response> = responses.iter().filter(|r| r.status == 503).collect();
    // Refused mid-way with the answer lost to the connection's reset (status 0).
    let cut = responses.iter().filter(|r| r.status == 0).count();
    assert_eq!(
        ok + refused.len() + cut,
        100,
        "only 200, 503 or a cut: {:?}",
        responses.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    // Every head is admitted while little is held, so the bodies race for the bound and most
    // are refused mid-way; each refusal frees its bytes, so the last body standing always fits
    // (3 of 10 MB fit in 32 MiB; 3 were served in every run seen, but nothing promises it).
    assert!(ok >= 1, "bodies that fit are served ({ok})");
    assert!(refused.len() + cut > 0);
    for r in &refused {
        assert_eq!(
            r.json()["error"]["code"],
            "request_buffers_full",
            "{}",
            r.text()
        );
        assert_eq!(r.json()["error"]["type"], "overloaded_error");
        assert_eq!(r.header("retry-after"), Some("1"));
    }
    // Every answer that is not a 200 was a request-buffer refusal, read or not.
    #[allow(clippy::cast_precision_loss)]
    let refused_n = (refused.len() + cut) as f64;
    assert_eq!(
        s.metric(r#"sluice_rejected_total{reason="request_buffers_full"}"#),
        refused_n
    );
    let peak = peak_gauge.load(Ordering::Acquire);
    assert!(peak > 0 && peak <= bound as u64, "gauge peaked at {peak}");
    assert!(eventually(Duration::from_secs(5), || s
        .metric("sluice_buffered_request_bytes")
        == 0.0));
    // Unbounded, the 100 bodies took ~640 MiB; bounded, about the bound (32 MiB) plus
    // what a request costs besides its body.
    let grew_mib = (peak_kib.load(Ordering::Acquire) - base_kib) / 1024;
    eprintln!(
        "RSS {} MiB -> peak {} MiB ({ok} served, {} refused, {cut} cut)",
        base_kib / 1024,
        peak_kib.load(Ordering::Acquire) / 1024,
        refused.len()
    );
    // With glibc's default, freeing a large buffer raises its mmap threshold, so later body
    // buffers come from the heap arenas and what the refused ones freed stays in RSS: growth
    // 46-69 MiB in runs, the likely cause of a CI failure whose message was lost. The fixed
    // threshold set at the start hands each freed body buffer back at once, so RSS follows
    // what is held: 34-41 MiB in runs alone and beside the hostile tests. The bound is what
    // the test proves: far from the ~640 MiB of the unbounded case, within 3x the bound.
    assert!(
        grew_mib < 96,
        "RSS grew by {grew_mib} MiB under a 32 MiB bound"
    );
}

#[test]
fn a_body_that_cannot_fit_is_refused_at_its_head_and_a_chunked_one_mid_way() {
    let mock = Mock::start("{}");
    let s = Sluice::start(&basic_config(
        &mock.base_url(),
        &format!(
            "  max_request_body_bytes: {}\n  max_buffered_request_bytes: {}\n",
            8 * MIB,
            16 * MIB
        ),
    ));
    // A holds 2 x 7 MiB of the 16 MiB: it announced 7 MiB and sent 6 of them, so its
    // buffer grew to the announced length (a reservation follows the bytes that came).
    let holder = connect(s.addr);
    (&holder)
        .write_all(
            chat_head(
                "holder",
                &format!("expect: 100-continue\r\ncontent-length: {}\r\n", 7 * MIB),
            )
            .as_bytes(),
        )
        .unwrap();
    let mut hr = BufReader::new(holder.try_clone().unwrap());
    assert_eq!(read_head(&mut hr).0, 100);
    assert_eq!(
        s.metric("sluice_buffered_request_bytes"),
        0.0,
        "nothing is held for bytes that have not arrived"
    );
    (&holder).write_all(&big_body(7 * MIB)[..6 * MIB]).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || s
            .metric("sluice_buffered_request_bytes")
            == (14 * MIB) as f64),
        "{}",
        s.metric("sluice_buffered_request_bytes")
    );
    // B announces 3 MiB (6 MiB counted): refused at once, no 100 Continue.
    let (b, continued) = upload(s.addr, &big_body(3 * MIB));
    assert!(!continued, "refused before its body was asked for");
    assert_eq!(b.status, 503, "{}", b.text());
    assert_eq!(b.json()["error"]["code"], "request_buffers_full");
    assert_eq!(b.header("connection"), Some("close"));
    // C sends chunked: it is refused once its buffer outgrows what is left.
    let c = connect(s.addr);
    (&c).write_all(chat_head("chunked", "transfer-encoding: chunked\r\n").as_bytes())
        .unwrap();
    let piece = vec![b' '; 256 * 1024];
    let mut refused = None;
    let mut sent = 0;
    for _ in 0..32 {
        let mut chunk = format!("{:x}\r\n", piece.len()).into_bytes();
        chunk.extend_from_slice(&piece);
        chunk.extend_from_slice(b"\r\n");
        if (&c).write_all(&chunk).is_err() {
            break;
        }
        sent += 1;
        std::thread::sleep(Duration::from_millis(30));
        c.set_nonblocking(true).unwrap();
        let mut probe = [0u8; 1];
        let answered = matches!(c.peek(&mut probe), Ok(n) if n > 0);
        c.set_nonblocking(false).unwrap();
        if answered {
            refused = Some(read_response(&mut BufReader::new(c.try_clone().unwrap())));
            break;
        }
    }
    let refused = refused.expect("the chunked body was refused before 8 MiB");
    // 2 MiB were left: room for a buffer of at most 1 MiB (counted twice); doubling, it
    // passes that with 512 KiB to 1 MiB of body (2 to 4 chunks; one more may be in flight).
    assert!(
        (2..=5).contains(&sent),
        "refused after {sent} chunks of 256 KiB"
    );
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(refused.json()["error"]["code"], "request_buffers_full");
    // Only the holder's reservation is left; it goes with the holder.
    assert!(eventually(Duration::from_secs(2), || s
        .metric("sluice_buffered_request_bytes")
        == (14 * MIB) as f64));
    drop(hr);
    drop(holder);
    assert!(eventually(Duration::from_secs(5), || s
        .metric("sluice_buffered_request_bytes")
        == 0.0));
    assert_eq!(mock.hits(), 0);
    // Room again.
    assert_eq!(upload(s.addr, &big_body(3 * MIB)).0.status, 200);
}

#[test]
fn the_tenant_concurrency_slot_is_taken_before_the_body_is_read() {
    let mock = Mock::start("{}");
    let s = Sluice::start(&basic_config(&mock.base_url(), "").replace(
        "tenants:\n  t: {}",
        "tenants:\n  t: {max_concurrent_streams: 1}",
    ));
    // A's head is in, its body is not: A holds the tenant's one slot already.
    let body = chat_body("first", false);
    let a = connect(s.addr);
    (&a).write_all(chat_head("slot-a", &format!("content-length: {}\r\n", body.len())).as_bytes())
        .unwrap();
    (&a).write_all(&body.as_bytes()[..10]).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // B is refused from its head: Sluice never asks for its body.
    let (b, continued) = upload(s.addr, &big_body(1000));
    assert!(!continued, "refused before its body was asked for");
    assert_eq!(b.status, 429, "{}", b.text());
    assert_eq!(b.json()["error"]["code"], "tenant_concurrency");
    // A finishes and is served; then the slot is free again.
    (&a).write_all(&body.as_bytes()[10..]).unwrap();
    let ra = read_response(&mut BufReader::new(a.try_clone().unwrap()));
    assert_eq!(ra.status, 200, "{}", ra.text());
    assert_eq!(upload(s.addr, &big_body(1000)).0.status, 200);
    assert_eq!(mock.hits(), 2);
}

#[test]
fn idle_connections_announcing_large_bodies_hold_no_request_buffers() {
    // The lockout a reviewer found: announce large bodies, send nothing, and every other
    // client got 503 until the body deadline. Announced bytes that never come hold nothing.
    let mock = Mock::start("{}");
    let s = Sluice::start(&basic_config(
        &mock.base_url(),
        &format!(
            "  max_request_body_bytes: {}\n  max_buffered_request_bytes: {}\n",
            8 * MIB,
            16 * MIB
        ),
    ));
    let idle: Vec<TcpStream> = (0..10)
        .map(|i| {
            let c = connect(s.addr);
            (&c).write_all(
                chat_head(
                    &format!("idle-{i}"),
                    &format!("content-length: {}\r\n", 7 * MIB),
                )
                .as_bytes(),
            )
            .unwrap();
            (&c).write_all(b"{\"model\"").unwrap();
            c
        })
        .collect();
    // Ten announce 10 x 2 x 7 MiB of a 16 MiB bound; they have sent 9 bytes each.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        s.metric("sluice_buffered_request_bytes") < MIB as f64,
        "{}",
        s.metric("sluice_buffered_request_bytes")
    );
    let (r, _) = upload(s.addr, &big_body(3 * MIB));
    assert_eq!(r.status, 200, "{}", r.text());
    drop(idle);
}

/// `words` words of prose (about 6 bytes a word).
fn long_prompt(words: usize) -> String {
    let mut text = String::with_capacity(words * 7);
    for i in 0..words {
        text.push_str(["gateway ", "streams ", "tokens ", "to ", "a ", "provider, "][i % 6]);
    }
    text
}

#[test]
fn a_committed_stream_lets_go_of_its_body_and_its_share_of_the_buffer_bound() {
    // Streams of 60 tokens 100 ms apart: each is held open for ~6 s.
    let mock = Mock::start(r#"{"tokens": 60, "token_delay_ms": 100}"#);
    // 48 KiB prompts: ~96 KiB of the bound each while the body is held (parsed + copy), so
    // at most two at once before the commit.
    let bound = 256 * 1024;
    let prompt = long_prompt(8_000);
    let body = chat_body(&prompt, true);
    assert!(body.len() > 40 * 1024 && 3 * 2 * body.len() > bound);
    let s = Sluice::start(&basic_config(
        &mock.base_url(),
        &format!(
            "  max_request_body_bytes: {}\n  max_buffered_request_bytes: {bound}\n",
            bound / 2
        ),
    ));
    let mut open = Vec::new();
    for _ in 0..5 {
        let mut r = s.chat_stream(&body);
        assert_eq!(r.status, 200, "{:?}", r.headers);
        assert!(
            r.next_piece(Duration::from_secs(10)).is_some(),
            "first event"
        );
        open.push(r);
    }
    // Five streams are open at once, each past its commit: none holds its body any more.
    // (A stream lets go of it just after its first write, off the first byte's path, so
    // the last one may still be letting go when its first event arrives here.)
    assert!(
        eventually(Duration::from_secs(3), || s
            .gauge("sluice_buffered_request_bytes")
            == 0.0),
        "bodies still held: {}",
        s.gauge("sluice_buffered_request_bytes")
    );
    assert_eq!(
        s.metric(r#"sluice_rejected_total{reason="request_buffers_full"}"#),
        0.0
    );
    // A client that leaves mid-stream is metered with the input estimated before its body
    // went (the provider reports usage only at the end): the prompt's ~8,000 words.
    drop(open.pop());
    let input = |log: &str| {
        log.lines()
            .filter(|l| l.contains("status=200") && l.contains("client_abort"))
            .find_map(|l| {
                l.split_whitespace()
                    .find_map(|kv| kv.strip_prefix("input_tokens="))
                    .and_then(|v| v.parse::<u64>().ok())
            })
    };
    assert!(
        eventually(Duration::from_secs(5), || input(&s.log()).is_some()),
        "{}",
        s.log()
    );
    let n = input(&s.log()).unwrap_or_default();
    let exact = sluice::protocol::tokens::text_tokens(&prompt);
    assert!(
        (exact * 9 / 10..=exact * 11 / 10).contains(&n),
        "aborted stream metered at {n} input tokens; its prompt has about {exact}"
    );
    for mut r in open {
        r.read_to_end(Duration::from_secs(20));
    }
}

#[test]
fn a_stream_that_may_continue_after_a_break_keeps_its_body_to_the_end() {
    let mock = Mock::start(r#"{"tokens": 20, "token_delay_ms": 100}"#);
    let body = chat_body(&long_prompt(4_000), true);
    let yaml = basic_config(&mock.base_url(), "").replace(
        "        upstream_model: mock-small-v1\n",
        "        upstream_model: mock-small-v1\n    continue_on_break: true\n",
    );
    let s = Sluice::start(&yaml);
    let mut r = s.chat_stream(&body);
    assert_eq!(r.status, 200, "{:?}", r.headers);
    assert!(
        r.next_piece(Duration::from_secs(10)).is_some(),
        "first event"
    );
    // Held for the continuation's re-encoded request: the parsed body and its copy.
    assert!(
        s.gauge("sluice_buffered_request_bytes") >= (2 * body.len()) as f64,
        "{}",
        s.gauge("sluice_buffered_request_bytes")
    );
    r.read_to_end(Duration::from_secs(20));
    assert!(eventually(Duration::from_secs(5), || s
        .metric("sluice_buffered_request_bytes")
        == 0.0));
}
