//! Cascading cancellation: a client that disconnects in any phase (queued in admission,
//! connecting upstream, waiting for the upstream head, waiting for the first event,
//! mid-stream) makes Sluice close the upstream within 100 ms (measured on the mock's own
//! clock), count the abort by phase, release its admission slot, and send nothing more
//! upstream. Also: an upstream connection whose body was not fully read is never pooled.
//!
//! The helpers here (`RawClient`, `MockClock`, `Blackhole`, ...) are shared by the other
//! streaming modules (`timeouts`, `heartbeat`, `slow_reader`, `shutdown`).

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::client::sse_text;
use crate::harness::{basic_config, get, Mock, Sluice, KEY};

/// The close of the upstream must be seen by the mock within this many ms of the client's.
pub(crate) const CLOSE_BOUND_MS: i64 = 100;

/// A chat request body for `acme/chat` with per-request mock knobs (`mock` is JSON).
pub(crate) fn chat_body(stream: bool, mock: &str) -> String {
    format!(
        r#"{{"model":"acme/chat","stream":{stream},"messages":[{{"role":"user","content":"hi"}}],"mock":{mock}}}"#
    )
}

/// A client that writes a chat request and reads nothing: it can hang up before the
/// response head (which `StreamReader::open` would block on).
pub(crate) struct RawClient {
    sock: TcpStream,
}

impl RawClient {
    /// Connects to `addr` and sends `POST /v1/chat/completions` with `body`.
    pub(crate) fn send(addr: SocketAddr, body: &str) -> RawClient {
        let mut sock = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
        sock.set_nodelay(true).ok();
        let req = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {KEY}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        sock.write_all(req.as_bytes()).expect("write request");
        RawClient { sock }
    }

    /// Hangs up; returns when it did.
    pub(crate) fn close(self) -> Instant {
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
        drop(self.sock);
        Instant::now()
    }

    /// Reads whatever arrives until EOF, an error, or `timeout` (lossy text).
    pub(crate) fn read_response(mut self, timeout: Duration) -> String {
        use std::io::Read;
        let end = Instant::now() + timeout;
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while Instant::now() < end {
            self.sock
                .set_read_timeout(Some(
                    end.saturating_duration_since(Instant::now())
                        .max(Duration::from_millis(1)),
                ))
                .ok();
            match self.sock.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Whether the server has sent any byte yet (non-blocking peek).
    pub(crate) fn got_bytes(&self) -> bool {
        let mut b = [0u8; 1];
        self.sock.set_nonblocking(true).ok();
        let r = self.sock.peek(&mut b);
        self.sock.set_nonblocking(false).ok();
        matches!(r, Ok(n) if n > 0)
    }
}

/// A reading of the mock's process clock (ms since it started), for measuring delays in
/// the mock's own time base.
///
/// A probe request (`GET /v1/models`) is recorded at mock time `mock_ms`, some local instant
/// before `local` (when its response had arrived). So at any local instant `t >= local` the
/// mock clock reads at least `mock_ms + (t - local)`: delays computed from that lower bound
/// are upper bounds of the true delay (plus 1 ms for the mock's ms truncation).
pub(crate) struct MockClock {
    mock_ms: u64,
    local: Instant,
}

impl MockClock {
    /// Reads the mock's clock now.
    pub(crate) fn read(mock: &Mock) -> MockClock {
        let r = get(mock.addr, "/v1/models", &[]);
        assert_eq!(r.status, 200, "mock probe");
        let local = Instant::now();
        let log = mock.log();
        let mock_ms = log
            .iter()
            .rev()
            .find(|r| r["method"] == "GET" && r["path"] == "/v1/models")
            .and_then(|r| r["received_at_ms"].as_u64())
            .expect("probe recorded");
        MockClock { mock_ms, local }
    }

    /// An upper bound of `mock_event_ms - mock_clock(at)` in ms.
    pub(crate) fn delay_upper_ms(&self, at: Instant, mock_event_ms: u64) -> i64 {
        let elapsed = at.saturating_duration_since(self.local).as_millis() as i64;
        mock_event_ms as i64 + 1 - (self.mock_ms as i64 + elapsed)
    }
}

/// The chat (POST) records of a mock log (health/clock probes are GETs).
pub(crate) fn chat_records(log: &[Value]) -> Vec<Value> {
    log.iter()
        .filter(|r| r["method"] == "POST")
        .cloned()
        .collect()
}

/// Waits until the mock has `n` chat records; returns them.
pub(crate) fn wait_chats(mock: &Mock, n: usize, timeout: Duration) -> Vec<Value> {
    let log = mock.wait_log(timeout, |l| chat_records(l).len() >= n);
    let chats = chat_records(&log);
    assert!(
        chats.len() >= n,
        "expected {n} upstream requests, mock log: {log:#?}"
    );
    chats
}

/// Waits until the chat record `seq` (1-based among chats) satisfies `pred`.
pub(crate) fn wait_chat(
    mock: &Mock,
    idx: usize,
    timeout: Duration,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    let log = mock.wait_log(timeout, |l| chat_records(l).get(idx).is_some_and(&pred));
    let chats = chat_records(&log);
    let rec = chats.get(idx).cloned().unwrap_or(Value::Null);
    assert!(pred(&rec), "chat record {idx} never matched; log: {log:#?}");
    rec
}

/// Polls a metric sample until it reaches `at_least`; returns (value, when).
pub(crate) fn wait_metric(
    sluice: &Sluice,
    sample: &str,
    at_least: f64,
    timeout: Duration,
) -> (f64, Instant) {
    let end = Instant::now() + timeout;
    loop {
        let v = sluice.metric(sample);
        let now = Instant::now();
        if v >= at_least || now > end {
            return (v, now);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The abort counter sample for `phase`.
pub(crate) fn aborts(phase: &str) -> String {
    format!("sluice_client_aborts_total{{phase=\"{phase}\"}}")
}

/// Asserts the mock saw chat record `idx`'s peer close within [`CLOSE_BOUND_MS`] of
/// `closed_at` (a local instant read against `clock`), in mock phase `phase`.
pub(crate) fn assert_upstream_closed_promptly(
    mock: &Mock,
    idx: usize,
    clock: &MockClock,
    closed_at: Instant,
    phase: &str,
) -> Value {
    let rec = wait_chat(mock, idx, Duration::from_secs(3), |r| {
        r["peer_closed_at_ms"].is_u64()
    });
    let peer_closed = rec["peer_closed_at_ms"]
        .as_u64()
        .expect("peer_closed_at_ms");
    let delay = clock.delay_upper_ms(closed_at, peer_closed);
    eprintln!("upstream closed {delay} ms (upper bound) after the client, mock phase {phase}");
    assert!(
        delay <= CLOSE_BOUND_MS,
        "upstream closed {delay} ms after the client (bound {CLOSE_BOUND_MS}): {rec:#?}"
    );
    assert_eq!(rec["phase"], phase, "{rec:#?}");
    assert_eq!(rec["completed"], false);
    rec
}

/// A config with one admission slot (so a leaked slot shows as a 503 on the next request).
fn one_slot_config(base_url: &str) -> String {
    basic_config(
        base_url,
        "  max_concurrent_upstream_requests: 1\n  queue_size: 4\n  queue_timeout_ms: 3000\n",
    )
}

/// The admission slot is free again: a short request is served at once.
pub(crate) fn assert_slot_released(sluice: &Sluice) {
    let t = Instant::now();
    let r = sluice.chat(&chat_body(true, r#"{"tokens":2}"#));
    assert_eq!(r.status, 200, "follow-up request: {}", r.text());
    assert_eq!(sse_text(&r.body), "tok0 tok1 ");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "follow-up waited {:?} (a leaked slot?)",
        t.elapsed()
    );
}

/// Everything the request held is released: the active-stream gauge returns to 0.
pub(crate) fn assert_active_streams_drop_to_zero(sluice: &Sluice) {
    let sample = "sluice_active_streams{tenant=\"t\"}";
    let end = Instant::now() + Duration::from_secs(2);
    while sluice.metric(sample) != 0.0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(sluice.metric(sample), 0.0, "{}", sluice.metrics());
}

/// A TCP listener that never accepts, with its accept queue full: connecting to it hangs
/// in SYN_SENT (Linux drops SYNs to a listener whose accept queue is full), which holds a
/// connector in its connect phase on loopback.
pub(crate) struct Blackhole {
    pub addr: SocketAddr,
    _fillers: Vec<TcpStream>,
    _listener: tokio::net::TcpListener,
    _rt: tokio::runtime::Runtime,
}

impl Blackhole {
    pub(crate) fn start() -> Blackhole {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .expect("runtime");
        let listener = {
            let _g = rt.enter();
            let s = tokio::net::TcpSocket::new_v4().expect("socket");
            s.bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
            s.listen(1).expect("listen")
        };
        let addr = listener.local_addr().expect("addr");
        let mut fillers = Vec::new();
        for _ in 0..8 {
            match TcpStream::connect_timeout(&addr, Duration::from_millis(300)) {
                Ok(s) => fillers.push(s),
                Err(_) => break,
            }
        }
        assert!(
            fillers.len() < 8,
            "the blackhole listener kept accepting connections"
        );
        Blackhole {
            addr,
            _fillers: fillers,
            _listener: listener,
            _rt: rt,
        }
    }

    /// `http://ADDR/v1`.
    pub(crate) fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Socket inodes of this machine in SYN_SENT towards the blackhole.
    pub(crate) fn syn_sent_inodes(&self) -> Vec<String> {
        let port = format!(":{:04X}", self.addr.port());
        std::fs::read_to_string("/proc/net/tcp")
            .unwrap_or_default()
            .lines()
            .skip(1)
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() > 9 && f[2].ends_with(&port) && f[3] == "02").then(|| f[9].to_string())
            })
            .collect()
    }

    /// Sockets of this machine in SYN_SENT towards the blackhole.
    pub(crate) fn syn_sent(&self) -> usize {
        let port = format!(":{:04X}", self.addr.port());
        std::fs::read_to_string("/proc/net/tcp")
            .unwrap_or_default()
            .lines()
            .skip(1)
            .filter(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 3 && f[2].ends_with(&port) && f[3] == "02"
            })
            .count()
    }
}

/// The client hangs up now: the mock sees the close promptly in `mock_phase`, one abort is
/// counted in `abort_phase`, the admission slot is free again (a second request is served:
/// two records in all).
fn hang_up_and_assert_cancelled(
    sluice: &Sluice,
    mock: &Mock,
    client: RawClient,
    mock_phase: &str,
    abort_phase: &str,
) {
    let clock = MockClock::read(mock);
    let closed = client.close();
    assert_upstream_closed_promptly(mock, 0, &clock, closed, mock_phase);
    let (n, _) = wait_metric(sluice, &aborts(abort_phase), 1.0, Duration::from_secs(2));
    assert_eq!(n, 1.0);
    assert_slot_released(sluice);
    assert_eq!(chat_records(&mock.log()).len(), 2);
}

#[test]
fn client_gone_while_queued_leaves_the_queue_and_never_reaches_upstream() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&one_slot_config(&mock.base_url()));
    // Occupy the only slot with a slow stream.
    let mut holder = sluice.chat_stream(&chat_body(true, r#"{"tokens":100,"token_delay_ms":100}"#));
    assert_eq!(holder.status, 200);
    holder.next_piece(Duration::from_secs(5));
    wait_chats(&mock, 1, Duration::from_secs(3));

    let queued = RawClient::send(sluice.addr, &chat_body(true, r#"{"tokens":2}"#));
    let (depth, _) = wait_metric(
        &sluice,
        "sluice_admission_queue_depth",
        1.0,
        Duration::from_secs(3),
    );
    assert_eq!(depth, 1.0, "the second request should be queued");
    let closed = queued.close();
    let (n, seen) = wait_metric(&sluice, &aborts("queued"), 1.0, Duration::from_secs(3));
    assert_eq!(n, 1.0);
    let took = seen.duration_since(closed);
    eprintln!("queued abort counted {took:?} after the client closed");
    assert!(
        took <= Duration::from_millis(CLOSE_BOUND_MS as u64),
        "{took:?}"
    );
    assert_eq!(sluice.gauge("sluice_admission_queue_depth"), 0.0);

    // The slot holder is still served; when it hangs up, its upstream closes promptly.
    holder.next_piece(Duration::from_secs(5));
    let clock = MockClock::read(&mock);
    let closed = Instant::now();
    holder.close();
    assert_upstream_closed_promptly(&mock, 0, &clock, closed, "mid_stream");
    assert_slot_released(&sluice);
    // Only the holder and the follow-up reached the provider.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(chat_records(&mock.log()).len(), 2, "{:#?}", mock.log());
}

#[test]
fn client_gone_while_connecting_abandons_the_connect() {
    let mock = Mock::start("{}");
    let hole = Blackhole::start();
    let cfg = one_slot_config(&mock.base_url()).replace(
        "models:\n",
        &format!(
            "  p2:\n    kind: openai\n    base_url: {}\n    api_key: sk-p2\n    connect_timeout_ms: 30000\n    health_check: {{enabled: false}}\nmodels:\n  acme/hole:\n    routes:\n      - provider: p2\n        upstream_model: m\n",
            hole.base_url()
        ),
    );
    let sluice = Sluice::start(&cfg);
    let before = hole.syn_sent();
    let client = RawClient::send(
        sluice.addr,
        r#"{"model":"acme/hole","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
    );
    // Sluice's connect hangs in SYN_SENT.
    let end = Instant::now() + Duration::from_secs(5);
    while hole.syn_sent() <= before && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(hole.syn_sent() > before, "sluice never started connecting");
    std::thread::sleep(Duration::from_millis(100));
    // Measured on the socket: Sluice's file descriptor of the SYN_SENT socket towards the
    // blackhole goes away. Its inode was found in /proc/net/tcp before the close; polling
    // Sluice's own fd table is cheap (reading the machine's whole /proc/net/tcp took up to
    // 137 ms per poll in CI, when the suite holds many sockets). Each poll's end bounds the
    // moment from above; the read time of the poll that saw it gone is allowed on top.
    let inodes = hole.syn_sent_inodes();
    assert!(!inodes.is_empty(), "the SYN_SENT socket has an inode");
    let held = |pid: u32| {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| {
                d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                    .any(|l| {
                        let l = l.to_string_lossy();
                        inodes.iter().any(|i| l == format!("socket:[{i}]"))
                    })
            })
            .unwrap_or(false)
    };
    assert!(held(sluice.pid()), "Sluice holds the connecting socket");
    let closed = client.close();
    let end = closed + Duration::from_secs(3);
    let (gone_at, poll_cost) = loop {
        let started = Instant::now();
        let still = held(sluice.pid());
        let at = Instant::now();
        if !still {
            break (at, at - started);
        }
        assert!(at < end, "the upstream connect is still pending after 3 s");
        std::thread::sleep(Duration::from_millis(1));
    };
    let took = gone_at.duration_since(closed);
    eprintln!(
        "connect abandoned (SYN_SENT socket closed) within {took:?} after the client closed \
         (the last poll itself took {poll_cost:?})"
    );
    assert!(
        took <= Duration::from_millis(CLOSE_BOUND_MS as u64) + poll_cost,
        "{took:?} (poll {poll_cost:?})"
    );
    let (n, _) = wait_metric(&sluice, &aborts("connecting"), 1.0, Duration::from_secs(3));
    assert_eq!(n, 1.0);
    assert_slot_released(&sluice);
}

#[test]
fn client_gone_while_waiting_for_the_upstream_head_closes_upstream_within_100ms() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&one_slot_config(&mock.base_url()));
    let client = RawClient::send(
        sluice.addr,
        &chat_body(true, r#"{"first_byte_delay_ms":20000}"#),
    );
    wait_chats(&mock, 1, Duration::from_secs(3));
    std::thread::sleep(Duration::from_millis(100));
    hang_up_and_assert_cancelled(&sluice, &mock, client, "before_head", "waiting_head");
}

#[test]
fn client_gone_while_waiting_for_the_first_event_closes_upstream_within_100ms() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&one_slot_config(&mock.base_url()));
    let client = RawClient::send(
        sluice.addr,
        &chat_body(true, r#"{"first_event_delay_ms":20000}"#),
    );
    wait_chat(&mock, 0, Duration::from_secs(3), |r| {
        r["head_at_ms"].is_u64()
    });
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !client.got_bytes(),
        "the head must be held until the first event"
    );
    hang_up_and_assert_cancelled(&sluice, &mock, client, "after_head", "waiting_first_event");
}

#[test]
fn client_gone_mid_stream_closes_upstream_within_100ms() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&one_slot_config(&mock.base_url()));
    let mut s = sluice.chat_stream(&chat_body(true, r#"{"tokens":1000,"token_delay_ms":50}"#));
    assert_eq!(s.status, 200);
    let mut got = Vec::new();
    while sse_text(&got).len() < "tok0 tok1 tok2 ".len() {
        got.extend(s.next_piece(Duration::from_secs(5)).expect("more stream"));
    }
    let clock = MockClock::read(&mock);
    let closed = Instant::now();
    s.close();
    let rec = assert_upstream_closed_promptly(&mock, 0, &clock, closed, "mid_stream");
    assert!(rec["bytes_written"].as_u64().unwrap_or(0) > 0);
    let (n, _) = wait_metric(&sluice, &aborts("streaming"), 1.0, Duration::from_secs(2));
    assert_eq!(n, 1.0);
    assert_active_streams_drop_to_zero(&sluice);
    // The stream stopped: no more bytes after the close.
    let w1 = chat_records(&mock.log())[0]["bytes_written"].clone();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(chat_records(&mock.log())[0]["bytes_written"], w1);
    assert_slot_released(&sluice);
    assert_eq!(chat_records(&mock.log()).len(), 2);
}

#[test]
fn client_gone_while_a_non_streaming_answer_is_pending_closes_upstream_within_100ms() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&one_slot_config(&mock.base_url()));
    // The head arrives at once, the body after 20 s: Sluice is reading the body.
    let client = RawClient::send(
        sluice.addr,
        &chat_body(false, r#"{"tokens":2,"first_event_delay_ms":20000}"#),
    );
    wait_chat(&mock, 0, Duration::from_secs(3), |r| {
        r["head_at_ms"].is_u64()
    });
    std::thread::sleep(Duration::from_millis(100));
    hang_up_and_assert_cancelled(&sluice, &mock, client, "after_head", "waiting_body");
    assert_active_streams_drop_to_zero(&sluice);
}

#[test]
fn client_gone_while_sending_its_body_never_reaches_upstream() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&one_slot_config(&mock.base_url()));
    let mut sock =
        TcpStream::connect_timeout(&sluice.addr, Duration::from_secs(5)).expect("connect");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {KEY}\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{{\"model\":"
    );
    sock.write_all(head.as_bytes()).expect("write");
    std::thread::sleep(Duration::from_millis(200));
    let _ = sock.shutdown(std::net::Shutdown::Both);
    drop(sock);
    let (n, _) = wait_metric(
        &sluice,
        &aborts("reading_body"),
        1.0,
        Duration::from_secs(3),
    );
    assert_eq!(n, 1.0);
    assert_slot_released(&sluice);
    assert_eq!(
        chat_records(&mock.log()).len(),
        1,
        "only the follow-up went upstream"
    );
}

#[test]
fn unread_upstream_connections_are_closed_not_pooled() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&one_slot_config(&mock.base_url()));
    // A fully read answer returns its connection to the pool: the next request reuses it.
    assert_slot_released(&sluice);
    assert_slot_released(&sluice);
    let chats = wait_chats(&mock, 2, Duration::from_secs(2));
    assert_eq!(
        chats[0]["conn_id"], chats[1]["conn_id"],
        "a completed exchange should be pooled: {chats:#?}"
    );
    let pooled = chats[1]["conn_id"].as_u64().expect("conn_id");

    // A stream the client abandons mid-way: its connection is closed, never reused.
    let mut s = sluice.chat_stream(&chat_body(true, r#"{"tokens":1000,"token_delay_ms":50}"#));
    s.next_piece(Duration::from_secs(5));
    s.next_piece(Duration::from_secs(5));
    s.close();
    let aborted = wait_chat(&mock, 2, Duration::from_secs(3), |r| {
        r["peer_closed_at_ms"].is_u64()
    });
    assert_eq!(aborted["conn_id"].as_u64(), Some(pooled));
    assert_slot_released(&sluice);
    let chats = wait_chats(&mock, 4, Duration::from_secs(2));
    assert_ne!(
        chats[3]["conn_id"], aborted["conn_id"],
        "an upstream connection with an unread body was reused: {chats:#?}"
    );

    // Same after a non-streaming client that leaves while the body is pending.
    let c = RawClient::send(
        sluice.addr,
        &chat_body(false, r#"{"tokens":2,"first_event_delay_ms":20000}"#),
    );
    wait_chat(&mock, 4, Duration::from_secs(3), |r| {
        r["head_at_ms"].is_u64()
    });
    c.close();
    let aborted = wait_chat(&mock, 4, Duration::from_secs(3), |r| {
        r["peer_closed_at_ms"].is_u64()
    });
    assert_slot_released(&sluice);
    let chats = wait_chats(&mock, 6, Duration::from_secs(2));
    assert_ne!(chats[5]["conn_id"], aborted["conn_id"], "{chats:#?}");
}
