//! Heartbeats: `: keepalive` comments while a committed stream is silent, never inside an
//! event, never after the end; none before the commit unless the model opts in to
//! `early_commit_after_ms`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use crate::cancellation::chat_body;
use crate::harness::client::{sse_events, sse_text};
use crate::harness::{Mock, Sluice};
use crate::timeouts::config;

const KEEPALIVE: &str = ": keepalive";

/// A scripted provider: answers every request on its connection with a chunked SSE
/// response made of `(delay before, bytes)` writes, each one HTTP chunk.
struct ScriptedProvider {
    addr: SocketAddr,
}

impl ScriptedProvider {
    fn start(script: Vec<(u64, String)>) -> ScriptedProvider {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        std::thread::spawn(move || {
            for conn in l.incoming() {
                let Ok(conn) = conn else { return };
                let script = script.clone();
                std::thread::spawn(move || {
                    let _ = serve(conn, &script);
                });
            }
        });
        ScriptedProvider { addr }
    }

    fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }
}

fn serve(conn: std::net::TcpStream, script: &[(u64, String)]) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut r = BufReader::new(conn.try_clone()?);
    let mut len = 0usize;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let l = line.trim_end().to_ascii_lowercase();
        if l.is_empty() {
            break;
        }
        if let Some(v) = l.strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    let mut w = conn;
    w.write_all(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n",
    )?;
    for (delay, bytes) in script {
        std::thread::sleep(Duration::from_millis(*delay));
        if !bytes.is_empty() {
            w.write_all(format!("{:x}\r\n{bytes}\r\n", bytes.len()).as_bytes())?;
        }
    }
    w.write_all(b"0\r\n\r\n")?;
    Ok(())
}

fn token_event(i: usize) -> String {
    format!(
        "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"mock-small-v1\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"tok{i} \"}},\"finish_reason\":null}}]}}\n\n"
    )
}

/// Reads a whole stream, returning its body and when the head arrived after the request.
fn read_stream(sluice: &Sluice, body: &str) -> (String, Duration) {
    let mut s = sluice.chat_stream(body);
    assert_eq!(s.status, 200);
    let head_after = s.head_at - s.sent_at;
    let body = s.read_to_end(Duration::from_secs(10));
    assert!(s.is_done());
    (String::from_utf8_lossy(&body).into_owned(), head_after)
}

/// The events of a body, with keepalives as `K` and data events as their payloads.
fn shape(body: &str) -> Vec<String> {
    sse_events(body.as_bytes())
        .into_iter()
        .map(|e| if e == KEEPALIVE { "K".to_string() } else { e })
        .collect()
}

#[test]
fn a_silence_of_three_intervals_gives_three_keepalives_then_the_data_intact() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&config(
        "",
        &[("p1", &mock.base_url(), "    heartbeat_interval_ms: 200\n")],
    ));
    // Role event at once, then 700 ms of silence (3.5 intervals), then the token.
    let (body, _) = read_stream(
        &sluice,
        &chat_body(true, r#"{"tokens":1,"token_delay_ms":700}"#),
    );
    let ev = shape(&body);
    let ks: Vec<usize> = ev
        .iter()
        .enumerate()
        .filter(|(_, e)| *e == "K")
        .map(|(i, _)| i)
        .collect();
    assert_eq!(ks, vec![1, 2, 3], "{ev:#?}");
    assert!(ev[0].contains("\"role\":\"assistant\""), "{ev:#?}");
    assert!(ev[4].contains("tok0"), "{ev:#?}");
    assert_eq!(ev.last().map(String::as_str), Some("data: [DONE]"));
    assert_eq!(sse_text(body.as_bytes()), "tok0 ");
    for e in ev.iter().filter(|e| *e != "K") {
        assert!(e.starts_with("data: "), "not a whole event: {e:?}");
    }
    assert_eq!(
        sluice.metric("sluice_heartbeats_total{provider=\"p1\"}"),
        3.0
    );
}

#[test]
fn keepalives_never_split_an_event_and_stop_at_the_end() {
    let ev2 = token_event(2);
    let (half_a, half_b) = ev2.split_at(ev2.len() / 2);
    let provider = ScriptedProvider::start(vec![
        (0, token_event(0)),
        (0, token_event(1)),
        // 700 ms of silence between events: 3 keepalives.
        (700, half_a.to_string()),
        // 600 ms of silence inside an event: 3 keepalives, none inside the event. The
        // clock runs on client writes (the last keepalive, at 600 ms), so they fall at 800,
        // 1000 and 1200 ms and the event completes at 1300, 100 ms from either tick (700 ms
        // here put the event's end on the 1400 ms tick: a race the test sometimes lost).
        (600, half_b.to_string()),
        (0, "data: [DONE]\n\n".to_string()),
        // The provider keeps the connection open after [DONE]: no keepalive after it.
        (700, String::new()),
    ]);
    let sluice = Sluice::start(&config(
        "  heartbeat_interval_ms: 200\n",
        &[("p1", &provider.base_url(), "")],
    ));
    let t = Instant::now();
    let (body, _) = read_stream(&sluice, &chat_body(true, "{}"));
    let ev = shape(&body);
    let ks: Vec<usize> = ev
        .iter()
        .enumerate()
        .filter(|(_, e)| *e == "K")
        .map(|(i, _)| i)
        .collect();
    assert_eq!(ks, vec![2, 3, 4, 5, 6, 7], "{ev:#?}");
    assert_eq!(ev.len(), 10, "{ev:#?}");
    assert_eq!(ev[9], "data: [DONE]", "{ev:#?}");
    assert_eq!(sse_text(body.as_bytes()), "tok0 tok1 tok2 ");
    for e in ev.iter().filter(|e| *e != "K") {
        if e != "data: [DONE]" {
            let json = e.strip_prefix("data: ").expect("data event");
            serde_json::from_str::<serde_json::Value>(json)
                .unwrap_or_else(|err| panic!("split event {e:?}: {err}"));
        }
    }
    eprintln!("stream took {:?}", t.elapsed());
}

#[test]
fn before_the_commit_the_head_is_held_and_no_keepalive_is_sent() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&config(
        "  heartbeat_interval_ms: 200\n",
        &[("p1", &mock.base_url(), "")],
    ));
    let (body, head_after) = read_stream(
        &sluice,
        &chat_body(true, r#"{"tokens":2,"first_event_delay_ms":700}"#),
    );
    assert!(head_after >= Duration::from_millis(650), "{head_after:?}");
    assert!(!body.contains(KEEPALIVE), "{body}");
    assert_eq!(sse_text(body.as_bytes()), "tok0 tok1 ");
}

#[test]
fn early_commit_sends_the_head_and_keepalives_while_the_first_event_is_slow() {
    let mock = Mock::start("{}");
    let cfg = config(
        "  heartbeat_interval_ms: 200\n",
        &[("p1", &mock.base_url(), "")],
    )
    .replace(
        "  acme/chat:\n",
        "  acme/chat:\n    early_commit_after_ms: 300\n",
    );
    let sluice = Sluice::start(&cfg);
    let (body, head_after) = read_stream(
        &sluice,
        &chat_body(true, r#"{"tokens":2,"first_event_delay_ms":1000}"#),
    );
    eprintln!("early head after {head_after:?}");
    assert!(
        head_after >= Duration::from_millis(280) && head_after < Duration::from_millis(900),
        "{head_after:?}"
    );
    let ev = shape(&body);
    let leading = ev.iter().take_while(|e| *e == "K").count();
    assert!((3..=4).contains(&leading), "{ev:#?}");
    assert!(ev[leading].contains("\"role\":\"assistant\""), "{ev:#?}");
    assert_eq!(sse_text(body.as_bytes()), "tok0 tok1 ");
    assert_eq!(ev.last().map(String::as_str), Some("data: [DONE]"));
}
