//! Memory given back after a burst (issue 30, item 3): 100 concurrent 5 MB uploads, refused
//! or served, through a real Sluice on the default request-buffer bound and on a 32 MiB one;
//! afterwards the process's RSS (`VmRSS` of `/proc/PID/status`) must come back to within
//! 64 MiB of what it was before the burst, within a few seconds. No allocator setting comes
//! from the environment: what is measured is what an operator running the binary gets.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::{basic_config, Mock, Sluice, KEY};

const MIB: u64 = 1024 * 1024;

/// Uploads in the burst, all at once.
const UPLOADS: usize = 100;

/// Bytes of each upload's body.
const UPLOAD_BYTES: usize = 5_000_000;

/// How far above its baseline RSS may stay after the burst, KiB.
const GIVEN_BACK_WITHIN_KIB: u64 = 64 * 1024;

/// How long RSS has to come back after the last answer.
const GIVE_BACK_DEADLINE: Duration = Duration::from_secs(5);

/// When the settled RSS is read (reported, and bounded on the 32 MiB bound).
const SETTLED_AFTER: Duration = Duration::from_secs(3);

/// `VmRSS` of `pid`, KiB (0 when unreadable).
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A chat body of `size` bytes for `acme/chat`.
fn big_body(size: usize) -> Vec<u8> {
    let pre = br#"{"model":"acme/chat","messages":[{"role":"user","content":""#;
    let post = br#""}]}"#;
    let mut b = Vec::with_capacity(size);
    b.extend_from_slice(pre);
    b.resize(size - post.len(), b'a');
    b.extend_from_slice(post);
    b
}

/// Sends one upload (the whole body, whatever Sluice answers meanwhile) and returns the
/// answer's status: 0 when the connection was reset before a status line arrived (a body
/// refused mid-way).
fn upload(addr: SocketAddr, body: &[u8]) -> u16 {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(5)) else {
        return 0;
    };
    s.set_read_timeout(Some(Duration::from_secs(30))).ok();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {KEY}\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    if s.write_all(head.as_bytes()).is_ok() {
        for piece in body.chunks(256 * 1024) {
            if s.write_all(piece).is_err() {
                break;
            }
            // Paced like a client on a real link: bodies arrive side by side, so their
            // buffers grow together (and most are refused mid-way under a small bound).
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    String::from_utf8_lossy(&raw)
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// RSS figures of one burst, KiB.
struct Burst {
    baseline: u64,
    peak: u64,
    /// The first RSS within [`GIVEN_BACK_WITHIN_KIB`] of the baseline, or the last one read
    /// when it never came back within [`GIVE_BACK_DEADLINE`].
    after: u64,
    /// How long after the last answer `after` was read.
    after_in: Duration,
    /// RSS [`SETTLED_AFTER`] after the last answer.
    settled: u64,
    served: usize,
    refused: usize,
}

/// Starts Sluice with `extra_server` lines, sends the burst and measures.
fn burst(extra_server: &str) -> Burst {
    // Each admitted request waits 300 ms for its answer, so admitted bodies are held together.
    let mock = Mock::start(r#"{"first_byte_delay_ms":300}"#);
    let s = Sluice::start(&basic_config(&mock.base_url(), extra_server));
    let warm = br#"{"model":"acme/chat","messages":[{"role":"user","content":"warm up"}]}"#;
    assert_eq!(upload(s.addr, warm), 200);
    std::thread::sleep(Duration::from_millis(500));
    let baseline = rss_kib(s.pid());
    let peak = Arc::new(AtomicU64::new(baseline));
    let done = Arc::new(AtomicBool::new(false));
    let monitor = {
        let (peak, done, pid) = (peak.clone(), done.clone(), s.pid());
        std::thread::spawn(move || {
            let end = Instant::now() + Duration::from_secs(180);
            while !done.load(Ordering::Acquire) && Instant::now() < end {
                peak.fetch_max(rss_kib(pid), Ordering::AcqRel);
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let body = Arc::new(big_body(UPLOAD_BYTES));
    let clients: Vec<_> = (0..UPLOADS)
        .map(|_| {
            let (addr, body) = (s.addr, body.clone());
            std::thread::spawn(move || upload(addr, &body))
        })
        .collect();
    let statuses: Vec<u16> = clients
        .into_iter()
        .map(|c| c.join().expect("client"))
        .collect();
    done.store(true, Ordering::Release);
    monitor.join().expect("monitor");
    let served = statuses.iter().filter(|&&c| c == 200).count();
    let refused = statuses.iter().filter(|&&c| c == 503 || c == 0).count();
    assert_eq!(
        served + refused,
        UPLOADS,
        "only 200, 503 or a cut: {statuses:?}"
    );
    assert!(served > 0, "some uploads fit: {statuses:?}");
    let drained = Instant::now();
    let mut after = rss_kib(s.pid());
    while after > baseline + GIVEN_BACK_WITHIN_KIB && drained.elapsed() < GIVE_BACK_DEADLINE {
        std::thread::sleep(Duration::from_millis(50));
        after = rss_kib(s.pid());
    }
    let after_in = drained.elapsed();
    std::thread::sleep(SETTLED_AFTER.saturating_sub(after_in));
    eprintln!(
        "  heap trims: {}",
        s.metric_opt("sluice_heap_trims_total").unwrap_or(-1.0)
    );
    for line in s.log().lines().filter(|l| l.contains("heap trimmed")) {
        eprintln!("  {line}");
    }
    Burst {
        baseline,
        peak: peak.load(Ordering::Acquire),
        after,
        after_in,
        settled: rss_kib(s.pid()),
        served,
        refused,
    }
}

fn check(name: &str, b: &Burst) {
    eprintln!(
        "{name}: RSS baseline {} MiB, peak {} MiB, after the burst {} MiB ({} ms after the last \
         answer), {} MiB after {} s; {} served, {} refused",
        b.baseline / 1024,
        b.peak / 1024,
        b.after / 1024,
        b.after_in.as_millis(),
        b.settled / 1024,
        SETTLED_AFTER.as_secs(),
        b.served,
        b.refused
    );
    assert!(
        b.peak > b.baseline + 32 * 1024,
        "{name}: the burst did not take memory (peak {} KiB, baseline {} KiB): nothing measured",
        b.peak,
        b.baseline
    );
    assert!(
        b.after <= b.baseline + GIVEN_BACK_WITHIN_KIB,
        "{name}: RSS stayed {} MiB above its baseline ({} -> {} KiB) {} s after the burst",
        (b.after.saturating_sub(b.baseline)) / 1024,
        b.baseline,
        b.after,
        GIVE_BACK_DEADLINE.as_secs()
    );
}

#[test]
fn memory_is_given_back_after_a_burst_of_uploads_on_the_default_bound() {
    let b = burst("");
    check("default bound (256 MiB)", &b);
}

#[test]
fn memory_is_given_back_after_a_burst_of_uploads_on_a_32_mib_bound() {
    let b = burst(&format!("  max_buffered_request_bytes: {}\n", 32 * MIB));
    check("32 MiB bound", &b);
}
