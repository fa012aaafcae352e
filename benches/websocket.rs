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

use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

use tungstenite::client::IntoClientRequest;
use tungstenite::{Message, WebSocket};

#[path = "common/mod.rs"]
mod common;

use common::{rss_kib, KEY};

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

/// The mock and Sluice (heartbeats every 10 minutes), Sluice in its own process group.
fn start() -> (common::Procs, std::net::SocketAddr) {
    let mut cmd = Command::new(common::SLUICE);
    cmd.process_group(0);
    common::start(
        "ws",
        r#"{"text":"an idle socket's one answer"}"#,
        "  heartbeat_interval_ms: 600000\n",
        cmd,
    )
    .expect("start the mock and sluice")
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
