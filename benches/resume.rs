//! Resume latency benchmark (issue 32; not a timed test): how long a client that lost its
//! connection waits, once it asks again, for the first byte of what it missed. A
//! release-built Sluice and `sluice-mock-upstream` on loopback; one client at a time:
//!
//! 1. `POST /v1/chat/completions` with `x-sluice-resumable: true`; read the first
//!    `EVENTS_BEFORE` events, then hang up (the generation goes on, held in its grace window);
//! 2. `GET /v1/streams/<id>` with `Last-Event-ID` naming the **first** event (so the events
//!    after it are in the replay buffer whatever the timing); the latency is from writing
//!    the GET to reading the first byte of a replayed event (response head included);
//! 3. the generation ends: **live** mode (a paced answer still being generated, one token
//!    every 10 ms) cancels it with `DELETE /v1/streams/<id>` (that latency, GET → 204, is
//!    reported too); **finished** mode (an answer the provider finished while the client
//!    was away: 20 tokens 5 ms apart, the resume 250 ms after the hang-up, so the whole rest
//!    comes from the buffer) reads the replay to its end, and reports that time;
//!    **completed** mode (an answer written whole, final event included, to a client that
//!    read 3 events and then lost its connection: the generation is over and its row
//!    written; the resume replays the completed stream's kept tail,
//!    `server.resume_linger_bytes`) does the same.
//!
//! Reports p50, p99 and max per mode, in ms.
//!
//! ```text
//! cargo bench --bench resume                       # 500 resumes per mode
//! SLUICE_BENCH_RESUMES=2000 cargo bench --bench resume
//! cargo test --bench resume                        # sanity pass: 20 resumes per mode
//! ```
//!
//! Every resume is checked: its first replayed event carries `id: <stream id>:2`, and a
//! finished-mode replay ends with `[DONE]`. Every phase has a deadline; only 127.0.0.1.
//! Figures are in `benches/README.md` ("Issue 32: resumable streams").

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

#[path = "common/mod.rs"]
#[expect(dead_code, reason = "the RSS helpers are the memory benches'")]
mod common;

use common::KEY;
/// Events a client reads before it hangs up.
const EVENTS_BEFORE: usize = 3;
/// How long a finished-mode client waits after hanging up before it resumes (the answer,
/// 20 tokens 5 ms apart, is complete by then), and a completed-mode client before it hangs
/// up (Sluice has written the whole answer to its socket by then).
const FINISH_WAIT: Duration = Duration::from_millis(250);
/// Per-read deadline.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --bench resume` runs a short sanity pass.
    let bench = std::env::args().any(|a| a == "--bench");
    let resumes: usize = std::env::var("SLUICE_BENCH_RESUMES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if bench { 500 } else { 20 });
    let (procs, addr) = match common::start("resume", "{}", "", Command::new(common::SLUICE)) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("resume bench: {e}");
            std::process::exit(1);
        }
    };
    let mut failures = Vec::new();
    let mut report = Vec::new();
    for mode in [Mode::Live, Mode::Finished, Mode::Completed] {
        match run(addr, mode, resumes) {
            Ok(r) => report.push((mode, r)),
            Err(e) => failures.push(format!("{mode:?}: {e}")),
        }
    }
    println!();
    println!("| mode | resumes | GET → first replayed byte p50 | p99 | max | then | p50 | p99 |");
    println!("|---|---:|---:|---:|---:|---|---:|---:|");
    for (mode, r) in &report {
        let (then, after) = match mode {
            Mode::Live => ("DELETE → 204", &r.after),
            Mode::Finished | Mode::Completed => ("GET → whole replay", &r.after),
        };
        println!(
            "| {} | {} | {:.3} ms | {:.3} ms | {:.3} ms | {then} | {:.3} ms | {:.3} ms |",
            mode.name(),
            r.first_byte.len(),
            pct(&r.first_byte, 50),
            pct(&r.first_byte, 99),
            pct(&r.first_byte, 100),
            pct(after, 50),
            pct(after, 99),
        );
    }
    drop(procs);
    if !failures.is_empty() {
        eprintln!("resume bench FAILED:\n{}", failures.join("\n"));
        std::process::exit(1);
    }
}

/// How the resumed generation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Still generating (a token every 10 ms): the replay, then the live rest; cancelled
    /// with `DELETE`.
    Live,
    /// Finished by the provider before the resume (20 tokens 5 ms apart, the resume
    /// [`FINISH_WAIT`] after the hang-up): the whole rest from the buffer.
    Finished,
    /// Written whole to a client that read 3 events, then hung up: the kept tail of a
    /// completed stream.
    Completed,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Live => "live generation",
            Mode::Finished => "finished generation",
            Mode::Completed => "completed stream (kept tail)",
        }
    }

    /// The mock knobs of the answer.
    fn mock(self) -> &'static str {
        match self {
            Mode::Live => r#"{"tokens":400,"token_delay_ms":10}"#,
            Mode::Finished => r#"{"tokens":20,"token_delay_ms":5}"#,
            Mode::Completed => r#"{"tokens":20,"token_delay_ms":0}"#,
        }
    }
}

/// The measured latencies of one mode, ms.
struct Latencies {
    first_byte: Vec<f64>,
    /// Live: `DELETE` → 204; finished: GET → the replay's end.
    after: Vec<f64>,
}

/// The `p`-th percentile of `v` (nearest rank; 100 = max), 0 when empty.
fn pct(v: &[f64], p: usize) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = (s.len() * p).div_ceil(100).clamp(1, s.len());
    s[rank - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn run(addr: SocketAddr, mode: Mode, resumes: usize) -> Result<Latencies, String> {
    // Warm up: pools, lazy statics.
    for _ in 0..5 {
        one(addr, mode)?;
    }
    let mut out = Latencies {
        first_byte: Vec::with_capacity(resumes),
        after: Vec::with_capacity(resumes),
    };
    let started = Instant::now();
    for _ in 0..resumes {
        let (first, after) = one(addr, mode)?;
        out.first_byte.push(ms(first));
        out.after.push(ms(after));
    }
    println!(
        "{}: {resumes} resumes in {:?}",
        mode.name(),
        started.elapsed()
    );
    Ok(out)
}

/// One opted-in stream, cut after [`EVENTS_BEFORE`] events and resumed from its first one:
/// (GET → first replayed byte, then DELETE → 204 or GET → end of the replay).
fn one(addr: SocketAddr, mode: Mode) -> Result<(Duration, Duration), String> {
    let body = format!(
        r#"{{"model":"acme/chat","stream":true,"messages":[{{"role":"user","content":"hi"}}],"mock":{}}}"#,
        mode.mock()
    );
    let post = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {KEY}\r\nx-sluice-resumable: true\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stream = Http::send(addr, post.as_bytes())?;
    let (status, headers) = stream.head()?;
    if status != 200 {
        return Err(format!("POST answered {status}"));
    }
    let id = headers
        .iter()
        .find(|(k, _)| k == "x-sluice-stream-id")
        .map(|(_, v)| v.clone())
        .ok_or("no x-sluice-stream-id on an opted-in stream")?;
    let mut events = String::new();
    while events.matches("\n\n").count() < EVENTS_BEFORE {
        let chunk = stream.chunk()?.ok_or("the stream ended early")?;
        events.push_str(&String::from_utf8_lossy(&chunk));
    }
    if mode == Mode::Completed {
        // Still connected while Sluice writes the rest, the final event included.
        std::thread::sleep(FINISH_WAIT);
    }
    drop(stream);
    if mode == Mode::Finished {
        std::thread::sleep(FINISH_WAIT);
    }

    let get = format!(
        "GET /v1/streams/{id} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {KEY}\r\nlast-event-id: {id}:1\r\n\r\n"
    );
    let sent = Instant::now();
    let mut again = Http::send(addr, get.as_bytes())?;
    let (status, _) = again.head()?;
    if status != 200 {
        return Err(format!("resume answered {status}"));
    }
    let first = again.chunk()?.ok_or("the resume ended at once")?;
    let first_byte = sent.elapsed();
    let text = String::from_utf8_lossy(&first);
    if !text.contains(&format!("id: {id}:2\n")) {
        return Err(format!("the first replayed event is not event 2: {text:?}"));
    }
    let after = match mode {
        Mode::Live => {
            drop(again);
            let del = format!(
                "DELETE /v1/streams/{id} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {KEY}\r\n\r\n"
            );
            let t = Instant::now();
            let mut d = Http::send(addr, del.as_bytes())?;
            let (status, _) = d.head()?;
            if status != 204 {
                return Err(format!("DELETE answered {status}"));
            }
            t.elapsed()
        }
        Mode::Finished | Mode::Completed => {
            let mut rest = text.into_owned();
            while let Some(c) = again.chunk()? {
                rest.push_str(&String::from_utf8_lossy(&c));
            }
            if !rest.contains("data: [DONE]") {
                return Err(format!("the replay did not end with [DONE]: {rest:?}"));
            }
            sent.elapsed()
        }
    };
    Ok((first_byte, after))
}

/// A blocking HTTP/1.1 exchange on one connection: the head, then chunked body pieces.
struct Http {
    r: BufReader<TcpStream>,
}

impl Http {
    fn send(addr: SocketAddr, request: &[u8]) -> Result<Http, String> {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .map_err(|e| format!("connect: {e}"))?;
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(READ_TIMEOUT))
            .map_err(|e| e.to_string())?;
        s.write_all(request).map_err(|e| format!("write: {e}"))?;
        Ok(Http {
            r: BufReader::new(s),
        })
    }

    fn line(&mut self) -> Result<String, String> {
        let mut l = String::new();
        self.r.read_line(&mut l).map_err(|e| format!("read: {e}"))?;
        Ok(l)
    }

    /// Status and headers (lowercase names).
    fn head(&mut self) -> Result<(u16, Vec<(String, String)>), String> {
        let status = self
            .line()?
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or("bad status line")?;
        let mut headers = Vec::new();
        loop {
            let l = self.line()?;
            let l = l.trim_end();
            if l.is_empty() {
                return Ok((status, headers));
            }
            if let Some((k, v)) = l.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
    }

    /// The next chunk of a chunked body; `None` after the last.
    fn chunk(&mut self) -> Result<Option<Vec<u8>>, String> {
        let size = self.line()?;
        let size = usize::from_str_radix(size.trim(), 16)
            .map_err(|_| format!("bad chunk size {size:?}"))?;
        if size == 0 {
            self.line()?;
            return Ok(None);
        }
        let mut buf = vec![0u8; size + 2];
        self.r
            .read_exact(&mut buf)
            .map_err(|e| format!("read chunk: {e}"))?;
        buf.truncate(size);
        Ok(Some(buf))
    }
}
