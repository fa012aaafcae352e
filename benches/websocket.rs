//! Memory of idle Responses WebSocket sessions (not a timed test): N sockets opened on a
//! release-built Sluice, each after one whole response (`response.create` → events →
//! `response.completed`, so each holds the conversation of one turn), then held idle;
//! reports Sluice's RSS per open session.
//!
//! ```text
//! cargo bench --bench websocket                          # N = 1000
//! SLUICE_BENCH_SOCKETS=200,2000 cargo bench --bench websocket
//! ```
//!
//! RSS per session = (Sluice RSS with N sessions held − RSS after a warm-up socket that ran
//! one response and closed) / N, the median of 5 samples over 2.5 s. Heartbeats are set to
//! 10 minutes so that the idle clients (which read nothing) are not closed for missing
//! pongs while they are measured. Sockets are opened one after another (each needs one
//! descriptor here and one in Sluice; N is capped by this process's `RLIMIT_NOFILE`).
//! Without `--bench` (`cargo test --benches`) it is a sanity pass with 20 sockets. Figures
//! are in `benches/README.md`; everything runs on 127.0.0.1.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tungstenite::client::IntoClientRequest;
use tungstenite::{Message, WebSocket};

const KEY: &str = "sk-sluice-bench-0001";

struct Procs {
    sluice: Child,
    mock: Child,
    dir: std::path::PathBuf,
}

impl Drop for Procs {
    fn drop(&mut self) {
        let _ = self.sluice.kill();
        let _ = self.mock.kill();
        let _ = self.sluice.wait();
        let _ = self.mock.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// Resident set size of a live process, KiB (panics when it is gone).
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("process {pid} is gone"))
}

/// The median of 5 RSS samples over 2.5 s, KiB.
fn settled_rss_kib(pid: u32) -> u64 {
    let mut s: Vec<u64> = (0..5)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(500));
            rss_kib(pid)
        })
        .collect();
    s.sort_unstable();
    s[2]
}

fn start() -> (Procs, std::net::SocketAddr) {
    let mut mock = Command::new(env!("CARGO_BIN_EXE_sluice-mock-upstream"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--behavior",
            r#"{"text":"an idle socket's one answer"}"#,
        ])
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the mock");
    let mut line = String::new();
    BufReader::new(mock.stdout.take().expect("mock stdout"))
        .read_line(&mut line)
        .expect("mock address");
    let mock_addr = line
        .trim()
        .strip_prefix("listening on ")
        .expect("`listening on ADDR`")
        .to_string();
    let dir = std::env::temp_dir().join(format!("sluice-bench-ws-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (port, admin) = (free_port(), free_port());
    let cfg = format!(
        "server:\n  listen: 127.0.0.1:{port}\n  admin_listen: 127.0.0.1:{admin}\n  threads: 2\n  heartbeat_interval_ms: 600000\n\
         tenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\n\
         providers:\n  p1:\n    kind: openai\n    base_url: http://{mock_addr}/v1\n    api_key: sk-p1\n    health_check: {{enabled: false}}\n\
         models:\n  acme/chat:\n    routes:\n      - provider: p1\n        upstream_model: mock-small-v1\n",
    );
    let path = dir.join("sluice.yaml");
    std::fs::write(&path, cfg).expect("config");
    let sluice = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .current_dir(&dir)
        .process_group(0)
        .arg("-c")
        .arg(&path)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn sluice");
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let end = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(Instant::now() < end, "sluice did not start listening");
        std::thread::sleep(Duration::from_millis(50));
    }
    (Procs { sluice, mock, dir }, addr)
}

/// Opens a socket and runs one response on it to its `response.completed`.
fn open_with_one_response(addr: std::net::SocketAddr) -> WebSocket<TcpStream> {
    let stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let mut req = format!("ws://{addr}/v1/responses")
        .into_client_request()
        .expect("request");
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {KEY}").parse().expect("header"),
    );
    let (mut ws, _) = tungstenite::client::client(req, stream).expect("upgrade");
    let create = r#"{"type":"response.create","model":"acme/chat","store":false,"input":[{"role":"user","content":"hold this socket"}]}"#;
    ws.send(Message::text(create)).expect("send");
    loop {
        match ws.read().expect("read") {
            Message::Text(t) if t.contains("\"response.completed\"") => return ws,
            Message::Text(t) if t.contains("\"type\":\"error\"") => panic!("refused: {t}"),
            _ => {}
        }
    }
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let wanted: Vec<usize> = std::env::var("SLUICE_BENCH_SOCKETS")
        .unwrap_or_else(|_| if bench { "1000".into() } else { "20".into() })
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    println!("| open sessions | baseline RSS | RSS with sessions | RSS per idle session |");
    println!("|---:|---:|---:|---:|");
    for n in wanted {
        let (procs, addr) = start();
        let pid = procs.sluice.id();
        // Warm-up: the first response loads what every later one shares (pools, caches).
        drop(open_with_one_response(addr));
        let base = settled_rss_kib(pid);
        let t = Instant::now();
        let held: Vec<WebSocket<TcpStream>> =
            (0..n).map(|_| open_with_one_response(addr)).collect();
        let opened = t.elapsed();
        let with = settled_rss_kib(pid);
        let per = (with.saturating_sub(base) as f64) * 1024.0 / n as f64;
        println!(
            "| {n} | {base} KiB | {with} KiB | {:.1} KiB ({per:.0} bytes) |",
            per / 1024.0
        );
        eprintln!("websocket: {n} sockets opened, one response each, in {opened:.1?}");
        drop(held);
        drop(procs);
    }
}
