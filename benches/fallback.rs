//! Fallback overhead after an immediate provider failure (a 500 or a 503), release build.
//!
//! Target (issue 8): a fallback adds at most the failing provider's own response time + 1 ms
//! over a direct request.
//!
//! Starts three `sluice-mock-upstream` processes (answering 500, 503, and 200 with one token)
//! and three Sluice processes: `direct` (one route, the good mock), `via500` and `via503`
//! (the failing mock first, the good one second, health thresholds so high the failing route
//! is never skipped). One keep-alive client connection per target; the samples are
//! interleaved (direct, via500, via503, the failing mock itself) so machine load hits every
//! series alike; medians are reported. Loopback only; `FALLBACK_ITERATIONS` (default 2001)
//! bounds the count.
//!
//! Run: `cargo bench --bench fallback`. Under `cargo test --benches` (no `--bench`
//! argument) it runs 5 iterations as a sanity check of the set-up (statuses and fallback
//! depths) and reports no figure.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "common/mod.rs"]
#[expect(dead_code, reason = "this bench shares the port helper only")]
mod common;

use common::free_port;

const KEY: &str = "sk-sluice-bench-fallback";

/// A child process killed on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_mock(behavior: &str) -> (Proc, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice-mock-upstream"))
        .args(["--listen", "127.0.0.1:0", "--behavior", behavior])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn mock");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("mock address");
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("unexpected mock output {line:?}"));
    (Proc(child), addr)
}

/// Starts Sluice with `providers` (id, mock) routed in that order; returns it and its address.
fn start_sluice(dir: &Path, name: &str, providers: &[(&str, SocketAddr)]) -> (Proc, SocketAddr) {
    let port = free_port();
    let admin = free_port();
    let mut y = format!(
        "server:\n  listen: 127.0.0.1:{port}\n  admin_listen: 127.0.0.1:{admin}\n  threads: 2\ntenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n"
    );
    for (id, addr) in providers {
        y.push_str(&format!(
            "  {id}:\n    kind: openai\n    base_url: http://{addr}/v1\n    api_key: sk-{id}\n    health_check: {{enabled: false}}\n    health: {{degraded_after_failures: 1000000000, unhealthy_after_failures: 1000000000}}\n"
        ));
    }
    y.push_str("models:\n  acme/chat:\n    routes:\n");
    for (i, (id, _)) in providers.iter().enumerate() {
        y.push_str(&format!(
            "      - provider: {id}\n        upstream_model: m-{id}\n        priority: {}\n",
            i + 1
        ));
    }
    let cfg = dir.join(format!("{name}.yaml"));
    std::fs::write(&cfg, y).expect("write config");
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).expect("log");
    let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .current_dir(dir)
        .arg("-c")
        .arg(&cfg)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn sluice");
    let mut p = Proc(child);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let end = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_err() {
        assert!(
            p.0.try_wait().ok().flatten().is_none(),
            "sluice {name} exited"
        );
        assert!(Instant::now() < end, "sluice {name} not ready in 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    (p, addr)
}

/// A keep-alive HTTP/1.1 connection for Content-Length responses.
struct Conn(BufReader<TcpStream>);

impl Conn {
    fn open(addr: SocketAddr) -> Conn {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_nodelay(true).ok();
        s.set_read_timeout(Some(Duration::from_secs(10))).ok();
        Conn(BufReader::new(s))
    }

    /// POSTs a non-stream chat request; returns (status, fallback depth header, duration).
    fn chat(&mut self, auth: bool) -> (u16, Option<String>, Duration) {
        let body = r#"{"model":"acme/chat","messages":[{"role":"user","content":"hi"}]}"#;
        let auth = if auth {
            format!("authorization: Bearer {KEY}\r\n")
        } else {
            String::new()
        };
        let req = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n{auth}content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let t = Instant::now();
        self.0.get_mut().write_all(req.as_bytes()).expect("write");
        let mut line = String::new();
        self.0.read_line(&mut line).expect("status line");
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {line:?}"));
        let (mut len, mut depth) = (None, None);
        loop {
            let mut h = String::new();
            self.0.read_line(&mut h).expect("header");
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (k, v) = h.split_once(':').unwrap_or((h, ""));
            match k.to_ascii_lowercase().as_str() {
                "content-length" => len = v.trim().parse::<usize>().ok(),
                "x-sluice-fallback-depth" => depth = Some(v.trim().to_string()),
                _ => {}
            }
        }
        let mut b = vec![0u8; len.expect("a Content-Length response")];
        self.0.read_exact(&mut b).expect("body");
        (status, depth, t.elapsed())
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let n: usize = if bench {
        std::env::var("FALLBACK_ITERATIONS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(2001)
            .clamp(1, 100_000)
    } else {
        5
    };
    let dir = std::env::temp_dir().join(format!("sluice-bench-fallback-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (_m500, a500) = start_mock(r#"{"status":500}"#);
    let (_m503, a503) = start_mock(r#"{"status":503}"#);
    let (_ok, aok) = start_mock(r#"{"tokens":1}"#);
    let (_d, direct) = start_sluice(&dir, "direct", &[("ok", aok)]);
    let (_s500, via500) = start_sluice(&dir, "via500", &[("first", a500), ("ok", aok)]);
    let (_s503, via503) = start_sluice(&dir, "via503", &[("first", a503), ("ok", aok)]);
    let mut conns = [
        Conn::open(direct),
        Conn::open(via500),
        Conn::open(via503),
        Conn::open(a503),
    ];
    let want = [
        (200, Some("0")),
        (200, Some("1")),
        (200, Some("1")),
        (503, None),
    ];
    let mut samples: [Vec<Duration>; 4] = Default::default();
    for i in 0..(n + n / 10 + 5) {
        for (k, c) in conns.iter_mut().enumerate() {
            let (status, depth, took) = c.chat(k < 3);
            assert_eq!(
                (status, depth.as_deref()),
                want[k],
                "target {k}, iteration {i}"
            );
            // The first tenth (and 5) are warm-up.
            if i >= n / 10 + 5 {
                samples[k].push(took);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let [d, f500, f503, own] = samples.map(median);
    let (o500, o503) = (f500.saturating_sub(d), f503.saturating_sub(d));
    let bound = own + Duration::from_millis(1);
    let verdict = if !bench {
        "not judged (sanity run: 5 samples, test build)"
    } else if o500 <= bound && o503 <= bound {
        "met"
    } else {
        "missed"
    };
    println!(
        "fallback (median of {n}): direct {d:?}; via 500 {f500:?} (+{o500:?}); via 503 {f503:?} (+{o503:?}); the failing provider alone {own:?}; target <= {bound:?}: {verdict}"
    );
}
