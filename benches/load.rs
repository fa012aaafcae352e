//! Closed-loop load benchmark: the same load at four targets (the mock upstream directly,
//! Sluice in front of it, Pingora's smallest proxy in front of it ([`pingora`]), nginx in
//! front of it), printed as one table with "added" = target minus direct and, when asked
//! ([`cost`]), each target's callgrind instructions, allocations and system calls per
//! request beside it; then Sluice with billing (prices, ledger, budget) on vs off; then the
//! edge rows ([`edge`]: Sluice vs nginx over TLS, over HTTP/2, and as a plain passthrough
//! proxy). See `benches/README.md` for what is measured, the knobs and how to read it.
//!
//! Run: `cargo bench --bench load` (Cargo builds the `sluice` and `sluice-mock-upstream`
//! binaries first, with the bench profile = release + debug info, into `target/release/`).
//! Everything listens on and talks to 127.0.0.1 only; every phase is bounded in time and
//! every child process (mock, Sluice, nginx, redis-server) is stopped when the bench ends.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[path = "common/mod.rs"]
#[expect(dead_code, reason = "this bench shares the port helper only")]
mod common;
#[path = "load/cost.rs"]
mod cost;
#[path = "load/edge.rs"]
mod edge;
#[path = "load/pingora.rs"]
mod pingora;

use common::free_port;

/// The virtual key in the generated Sluice config.
const KEY: &str = "sk-sluice-load-0001";
/// The standard model in the generated Sluice config.
const MODEL: &str = "acme/chat";
/// Upper bound of one request (a stuck target fails the request, not the bench).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long clients may finish their in-flight request after a phase ends.
const DRAIN: Duration = Duration::from_secs(10);
/// The `x-request-id` of the probe that reads the mock's connection counter.
const PROBE_ID: &str = "sluice-load-probe";

// ---------------------------------------------------------------------------------------
// Knobs
// ---------------------------------------------------------------------------------------

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a whole number")),
        Err(_) => default,
    }
}

/// Every knob, from the environment (documented in `benches/README.md`).
#[derive(Debug, Clone)]
struct Opts {
    warmup: Duration,
    duration: Duration,
    clients: usize,
    ttfb_clients: usize,
    stream_tokens: u64,
    unary_tokens: u64,
    ttfb_tokens: u64,
    ttfb_token_delay_ms: u64,
    /// Bytes of the user message in the `prompt` scenario (`LOAD_PROMPT_BYTES`).
    prompt_bytes: usize,
    rounds: usize,
    max_requests: u64,
    gen_threads: usize,
    sluice_threads: usize,
    nginx_workers: String,
    targets: Vec<String>,
    scenarios: Vec<String>,
    keep_tmp: bool,
    /// The `cargo test --benches` pass: short phases, no nginx rows, no figure.
    sanity: bool,
}

impl Opts {
    fn from_env() -> Opts {
        let cpus = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        let list = |name: &str, default: &str| -> Vec<String> {
            std::env::var(name)
                .unwrap_or_else(|_| default.into())
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        };
        Opts {
            warmup: Duration::from_millis(env_u64("LOAD_WARMUP_MS", 1000)),
            duration: Duration::from_millis(env_u64("LOAD_DURATION_MS", 5000)),
            clients: env_u64("LOAD_CLIENTS", 64) as usize,
            ttfb_clients: env_u64("LOAD_TTFB_CLIENTS", 32) as usize,
            stream_tokens: env_u64("LOAD_STREAM_TOKENS", 100),
            unary_tokens: env_u64("LOAD_UNARY_TOKENS", 100),
            ttfb_tokens: env_u64("LOAD_TTFB_TOKENS", 20),
            ttfb_token_delay_ms: env_u64("LOAD_TTFB_TOKEN_DELAY_MS", 5),
            prompt_bytes: env_u64("LOAD_PROMPT_BYTES", 32 * 1024) as usize,
            rounds: env_u64("LOAD_ROUNDS", 1).max(1) as usize,
            max_requests: env_u64("LOAD_MAX_REQUESTS", 2_000_000).max(1),
            gen_threads: env_u64("LOAD_GEN_THREADS", cpus as u64).max(1) as usize,
            sluice_threads: env_u64("LOAD_SLUICE_THREADS", cpus as u64).max(1) as usize,
            nginx_workers: std::env::var("LOAD_NGINX_WORKERS").unwrap_or_else(|_| "auto".into()),
            targets: list(
                "LOAD_TARGETS",
                "direct,sluice,pingora,nginx,redis,billing,tls,h2,passthrough",
            ),
            scenarios: list("LOAD_SCENARIOS", "unary,stream,burst,prompt,ttfb,ttfb1"),
            keep_tmp: env_u64("LOAD_KEEP_TMP", 0) != 0,
            sanity: false,
        }
    }

    /// Whether `target` runs; `direct` also runs for the TLS and HTTP/2 rows (their added
    /// TTFB is measured against it).
    fn wants(&self, target: &str) -> bool {
        let named = |t: &str| self.targets.iter().any(|x| x == t);
        named(target) || (target == "direct" && (named("tls") || named("h2")))
    }
}

// ---------------------------------------------------------------------------------------
// Child processes
// ---------------------------------------------------------------------------------------

/// A scratch directory, removed at the end unless `LOAD_KEEP_TMP=1`.
struct TempDir {
    path: PathBuf,
    keep: bool,
}

impl TempDir {
    fn new(keep: bool) -> TempDir {
        let path = std::env::temp_dir().join(format!("sluice-load-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create temp dir");
        TempDir { path, keep }
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if self.keep {
            eprintln!("load: logs and configs kept in {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// A child process stopped on drop: SIGTERM first when `graceful` (nginx's master must
/// take its workers down), SIGKILL otherwise or after 5 s.
struct Proc {
    name: &'static str,
    child: Child,
    graceful: bool,
}

impl Proc {
    fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.graceful {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status();
            let end = Instant::now() + Duration::from_secs(5);
            while Instant::now() < end {
                if self.exited() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            eprintln!("load: {} did not stop on SIGTERM; killing it", self.name);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Waits until every address accepts a TCP connection (or the process exits).
fn wait_listening(p: &mut Proc, addrs: &[SocketAddr], timeout: Duration) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if p.exited() {
            return false;
        }
        if addrs
            .iter()
            .all(|a| std::net::TcpStream::connect_timeout(a, Duration::from_millis(200)).is_ok())
        {
            return true;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    false
}

fn log_file(dir: &Path, name: &str) -> std::fs::File {
    std::fs::File::create(dir.join(name)).expect("create log file")
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

fn bin(env_name: &str, default: &str) -> PathBuf {
    std::env::var_os(env_name).map_or_else(|| PathBuf::from(default), PathBuf::from)
}

fn mock_exe() -> PathBuf {
    bin(
        "SLUICE_MOCK_BIN",
        env!("CARGO_BIN_EXE_sluice-mock-upstream"),
    )
}

fn start_mock(dir: &Path) -> (Proc, SocketAddr) {
    let exe = mock_exe();
    let mut child = Command::new(&exe)
        .args(["--listen", "127.0.0.1:0", "--behavior", "{}"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(log_file(dir, "mock.log"))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", exe.display()));
    let stdout = child.stdout.take().expect("mock stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("mock prints its address");
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("unexpected mock output: {line:?}"));
    (
        Proc {
            name: "sluice-mock-upstream",
            child,
            graceful: false,
        },
        addr,
    )
}

/// The Sluice config: one tenant, one key, one openai-kind provider at the mock, one model.
/// `tenant` is the tenant's flow-style body; `extra` is appended at the top level.
fn sluice_yaml(
    listen: SocketAddr,
    admin: SocketAddr,
    threads: usize,
    mock: SocketAddr,
    tenant: &str,
    extra: &str,
) -> String {
    // `LOAD_WORK_STEALING=true|false` sets `server.work_stealing` (unset: Sluice's default).
    let stealing = std::env::var("LOAD_WORK_STEALING")
        .map(|v| format!("\n  work_stealing: {v}"))
        .unwrap_or_default();
    format!(
        "server:
  listen: {listen}
  admin_listen: {admin}
  threads: {threads}{stealing}
tenants:
  t: {tenant}
virtual_keys:
  - key: {KEY}
    tenant: t
providers:
  mock:
    kind: openai
    base_url: http://{mock}/v1
    api_key: sk-provider-load
    health_check: {{enabled: false}}
models:
  {MODEL}:
    routes:
      - provider: mock
        upstream_model: mock-small-v1
{extra}"
    )
}

fn sluice_exe() -> PathBuf {
    bin("SLUICE_BIN", env!("CARGO_BIN_EXE_sluice"))
}

/// `sluice -t -c FILE`: `Err(message)` when the config is refused.
fn sluice_check(config: &Path) -> Result<(), String> {
    let out = Command::new(sluice_exe())
        .arg("-t")
        .arg("-c")
        .arg(config)
        .output()
        .map_err(|e| format!("cannot run sluice -t: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
        .trim()
        .to_string())
    }
}

/// Starts Sluice with a config built by `yaml(listen, admin)` in `dir/conf-TAG/`, logging
/// to `dir/TAG.log`; `Err` when `sluice -t` refuses the config or Sluice does not come up.
fn start_sluice(
    dir: &Path,
    tag: &str,
    yaml: &dyn Fn(SocketAddr, SocketAddr) -> String,
) -> Result<(Proc, SocketAddr), String> {
    let mut last = String::new();
    for _ in 0..3 {
        let (listen, admin) = (loopback(free_port()), loopback(free_port()));
        // The config gets a folder of its own: Sluice watches its config's folder
        // (recursively) for changes, and log writes in there would wake that watcher on
        // every request.
        let conf_dir = dir.join(format!("conf-{tag}"));
        std::fs::create_dir_all(&conf_dir).map_err(|e| e.to_string())?;
        let config = conf_dir.join(format!("{tag}.yaml"));
        std::fs::write(&config, yaml(listen, admin)).expect("write sluice config");
        sluice_check(&config)?;
        let log = dir.join(format!("{tag}.log"));
        let child = Command::new(sluice_exe())
            .current_dir(dir)
            .arg("-c")
            .arg(&config)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("sluice log"))
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", sluice_exe().display()))?;
        let mut p = Proc {
            name: "sluice",
            child,
            graceful: false,
        };
        if wait_listening(&mut p, &[listen, admin], Duration::from_secs(20)) {
            return Ok((p, listen));
        }
        last = tail(&log);
    }
    Err(format!("sluice did not come up; log tail:\n{last}"))
}

fn nginx_conf(dir: &Path, listen: SocketAddr, mock: SocketAddr, workers: &str) -> String {
    let d = dir.display();
    // As root the workers would switch to `nobody`; keep them as the invoking user.
    let user = if is_root() { "user root;\n" } else { "" };
    format!(
        "{user}worker_processes {workers};
daemon off;
master_process on;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{
    worker_connections 4096;
}}
http {{
    access_log {d}/access.log;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    keepalive_timeout 75s;
    keepalive_requests 1000000;
    upstream mock {{
        server {mock};
        keepalive 64;
        keepalive_requests 1000000;
        keepalive_timeout 60s;
    }}
    server {{
        listen {listen} reuseport;
        location / {{
            proxy_pass http://mock;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_buffering off;
            proxy_read_timeout 60s;
        }}
    }}
}}
"
    )
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn find_program(name: &str) -> Option<PathBuf> {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .ok()?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !path.is_empty()).then(|| PathBuf::from(path))
}

fn start_nginx(
    dir: &Path,
    exe: &Path,
    mock: SocketAddr,
    workers: &str,
) -> Result<(Proc, SocketAddr), String> {
    start_nginx_with(dir, "nginx", exe, &|ndir, listen| {
        nginx_conf(ndir, listen, mock, workers)
    })
}

/// Starts nginx with the config `conf(its folder, a free listen port)` in `dir/sub/` and
/// waits until that port accepts; `Err` with its error log's tail when it does not come up.
fn start_nginx_with(
    dir: &Path,
    sub: &str,
    exe: &Path,
    conf: &dyn Fn(&Path, SocketAddr) -> String,
) -> Result<(Proc, SocketAddr), String> {
    let ndir = dir.join(sub);
    std::fs::create_dir_all(&ndir).map_err(|e| e.to_string())?;
    let mut last = String::new();
    for _ in 0..3 {
        let listen = loopback(free_port());
        let path = ndir.join("nginx.conf");
        std::fs::write(&path, conf(&ndir, listen)).map_err(|e| e.to_string())?;
        let child = Command::new(exe)
            .arg("-p")
            .arg(&ndir)
            .arg("-c")
            .arg(&path)
            .arg("-e")
            .arg(ndir.join("error.log"))
            .stdout(Stdio::null())
            .stderr(log_file(&ndir, "stderr.log"))
            .spawn()
            .map_err(|e| format!("cannot start nginx: {e}"))?;
        let mut p = Proc {
            name: "nginx",
            child,
            graceful: true,
        };
        if wait_listening(&mut p, &[listen], Duration::from_secs(10)) {
            return Ok((p, listen));
        }
        last = format!(
            "{}\n{}",
            tail(&ndir.join("error.log")),
            tail(&ndir.join("stderr.log"))
        );
    }
    Err(format!("nginx did not come up; error.log tail:\n{last}"))
}

fn start_redis(dir: &Path, exe: &Path) -> Result<(Proc, SocketAddr), String> {
    let rdir = dir.join("redis");
    std::fs::create_dir_all(&rdir).map_err(|e| e.to_string())?;
    for _ in 0..3 {
        let port = free_port();
        let child = Command::new(exe)
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
            ])
            .arg(&rdir)
            .stdout(log_file(&rdir, "redis.log"))
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start redis-server: {e}"))?;
        let mut p = Proc {
            name: "redis-server",
            child,
            graceful: false,
        };
        if wait_listening(&mut p, &[loopback(port)], Duration::from_secs(10)) {
            return Ok((p, loopback(port)));
        }
    }
    Err("redis-server did not come up".into())
}

/// Redis `INFO stats` → `total_commands_processed` (blocking, one short connection).
fn redis_commands(addr: SocketAddr) -> Option<u64> {
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"INFO stats\r\n").ok()?;
    // A bulk string: `$LEN\r\n` + LEN bytes + `\r\n`.
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = s.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        let Some(eol) = memchr::memmem::find(&buf, b"\r\n") else {
            continue;
        };
        let len: usize = std::str::from_utf8(buf.get(1..eol)?).ok()?.parse().ok()?;
        if buf.len() >= eol + 2 + len {
            break;
        }
    }
    String::from_utf8_lossy(&buf)
        .lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
}

/// `pid` and its child processes (nginx's master and workers).
fn with_children(pid: u32) -> Vec<u32> {
    let mut pids = vec![pid];
    if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")) {
        pids.extend(
            text.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    pids
}

/// nginx's master `pid` and its `workers` worker processes, once all of them exist (up to
/// 10 s).
fn nginx_pids(pid: u32, workers: usize) -> Result<Vec<u32>, String> {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let pids = with_children(pid);
        if pids.len() > workers {
            return Ok(pids);
        }
        if Instant::now() > end {
            return Err(format!(
                "nginx has {} of {workers} workers after 10 s",
                pids.len() - 1
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Clock ticks per second of `/proc/*/stat` times.
fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// User + system CPU seconds the processes used so far (all their threads).
fn cpu_seconds(pids: &[u32]) -> f64 {
    let ticks: u64 = pids
        .iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).ok())
        .filter_map(|stat| {
            // Fields after `(comm)`: state is field 3, utime 14 and stime 15.
            let rest = stat.get(stat.rfind(')')? + 2..)?;
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
        })
        .sum();
    #[expect(clippy::cast_precision_loss, reason = "tick counts are small")]
    let t = ticks as f64;
    t / clock_ticks()
}

// ---------------------------------------------------------------------------------------
// The load generator: raw HTTP/1.1 over keep-alive connections
// ---------------------------------------------------------------------------------------

/// What one request returned.
struct Reply {
    status: u16,
    /// Request written → first response body byte read.
    ttfb: Option<Duration>,
    /// The connection may carry the next request.
    keep_alive: bool,
    body_bytes: usize,
    /// The body was chunked (and its terminating chunk was read: a cut body is an error);
    /// over HTTP/2: the stream ended with END_STREAM.
    chunked: bool,
    /// The last bytes of the body (up to [`TAIL`]), to see a stream's `data: [DONE]`.
    tail: Vec<u8>,
}

/// How many final body bytes a [`Reply`] keeps.
const TAIL: usize = 32;

/// The end of a complete OpenAI stream.
const DONE: &[u8] = b"data: [DONE]\n\n";

fn bad(msg: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg.into())
}

/// A keep-alive HTTP/1.1 client connection (plain or TLS) with its read buffer.
struct Conn {
    stream: edge::Io,
    buf: BytesMut,
}

impl Conn {
    async fn open(addr: SocketAddr, dial: &Dial) -> std::io::Result<Conn> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let stream = match dial {
            Dial::Plain => edge::Io::Tcp(stream),
            Dial::Tls(cfg) => edge::Io::Tls(Box::new(edge::tls_connect(stream, cfg).await?)),
            Dial::H2(_) => return Err(bad("an HTTP/2 target has no HTTP/1.1 connection")),
        };
        Ok(Conn {
            stream,
            buf: BytesMut::with_capacity(64 * 1024),
        })
    }

    /// Reads more bytes; returns when they arrived. EOF is an error (mid-response).
    async fn fill(&mut self) -> std::io::Result<Instant> {
        if self.buf.capacity() - self.buf.len() < 16 * 1024 {
            self.buf.reserve(64 * 1024);
        }
        let n = self.stream.read_buf(&mut self.buf).await?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed mid-response",
            ));
        }
        Ok(Instant::now())
    }

    /// Sends `req` and reads the whole response (Content-Length or chunked).
    async fn exchange(&mut self, req: &[u8]) -> std::io::Result<Reply> {
        if !self.buf.is_empty() {
            return Err(bad("unexpected bytes before the response"));
        }
        self.stream.write_all(req).await?;
        // A no-op over TCP; over TLS it pushes out the records of the request.
        self.stream.flush().await?;
        let sent = Instant::now();
        // Head.
        let (status, length, chunked, keep_alive, mut last_read) = loop {
            let at = self.fill().await?;
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut resp = httparse::Response::new(&mut headers);
            match resp.parse(&self.buf) {
                Ok(httparse::Status::Complete(n)) => {
                    let status = resp.code.unwrap_or(0);
                    let mut length = None;
                    let mut chunked = false;
                    let mut keep_alive = resp.version == Some(1);
                    for h in resp.headers.iter() {
                        if h.name.eq_ignore_ascii_case("content-length") {
                            length = std::str::from_utf8(h.value)
                                .ok()
                                .and_then(|v| v.trim().parse::<usize>().ok());
                        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                            chunked = h.value.eq_ignore_ascii_case(b"chunked");
                        } else if h.name.eq_ignore_ascii_case("connection") {
                            keep_alive = !h.value.eq_ignore_ascii_case(b"close");
                        }
                    }
                    self.buf.advance(n);
                    break (status, length, chunked, keep_alive, at);
                }
                Ok(httparse::Status::Partial) => {}
                Err(e) => return Err(bad(format!("bad response head: {e}"))),
            }
        };
        let mut first_byte: Option<Instant> = None;
        let mut body_bytes = 0usize;
        let mut tail = Vec::with_capacity(2 * TAIL);
        if chunked {
            let mut dec = Chunked::Size;
            loop {
                if dec.step(&mut self.buf, &mut body_bytes, &mut tail)? {
                    if first_byte.is_none() && body_bytes > 0 {
                        first_byte = Some(last_read);
                    }
                    break;
                }
                if first_byte.is_none() && body_bytes > 0 {
                    first_byte = Some(last_read);
                }
                last_read = self.fill().await?;
            }
        } else if let Some(len) = length {
            while self.buf.len() < len {
                if first_byte.is_none() && !self.buf.is_empty() {
                    first_byte = Some(last_read);
                }
                last_read = self.fill().await?;
            }
            if first_byte.is_none() && len > 0 {
                first_byte = Some(last_read);
            }
            tail.extend_from_slice(&self.buf[len.saturating_sub(TAIL)..len]);
            self.buf.advance(len);
            body_bytes = len;
        } else {
            return Err(bad("response without Content-Length or chunked framing"));
        }
        Ok(Reply {
            status,
            ttfb: first_byte.map(|t| t.saturating_duration_since(sent)),
            keep_alive,
            body_bytes,
            chunked,
            tail,
        })
    }
}

/// Incremental chunked-body decoder state.
enum Chunked {
    Size,
    Data(usize),
    DataEnd,
    Trailer,
}

impl Chunked {
    /// Consumes what it can from `buf`; `Ok(true)` once the terminating chunk and trailer
    /// were read. Counts payload bytes into `body` and keeps the last [`TAIL`] in `tail`.
    fn step(
        &mut self,
        buf: &mut BytesMut,
        body: &mut usize,
        tail: &mut Vec<u8>,
    ) -> std::io::Result<bool> {
        loop {
            match *self {
                Chunked::Size => {
                    let Some(i) = memchr::memmem::find(buf, b"\r\n") else {
                        return Ok(false);
                    };
                    let line = std::str::from_utf8(&buf[..i]).map_err(|_| bad("chunk size"))?;
                    let hex = line.split(';').next().unwrap_or("").trim();
                    let size = usize::from_str_radix(hex, 16).map_err(|_| bad("bad chunk size"))?;
                    buf.advance(i + 2);
                    *self = if size == 0 {
                        Chunked::Trailer
                    } else {
                        Chunked::Data(size)
                    };
                }
                Chunked::Data(rest) => {
                    if buf.is_empty() {
                        return Ok(false);
                    }
                    let n = rest.min(buf.len());
                    tail.extend_from_slice(&buf[n.saturating_sub(TAIL)..n]);
                    if tail.len() > TAIL {
                        tail.drain(..tail.len() - TAIL);
                    }
                    buf.advance(n);
                    *body += n;
                    *self = if n == rest {
                        Chunked::DataEnd
                    } else {
                        Chunked::Data(rest - n)
                    };
                }
                Chunked::DataEnd => {
                    if buf.len() < 2 {
                        return Ok(false);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(bad("missing CRLF after chunk data"));
                    }
                    buf.advance(2);
                    *self = Chunked::Size;
                }
                Chunked::Trailer => {
                    let Some(i) = memchr::memmem::find(buf, b"\r\n") else {
                        return Ok(false);
                    };
                    buf.advance(i + 2);
                    if i == 0 {
                        return Ok(true);
                    }
                }
            }
        }
    }
}

/// A POST of `body` to the chat endpoint, with the test key (the mock ignores it).
fn chat_request(extra_headers: &str, body: &str) -> Vec<u8> {
    chat_request_at("/v1/chat/completions", extra_headers, body)
}

/// [`chat_request`] at `path` (a passthrough route's `/p/v1/chat/completions`: the mock
/// answers any path ending in `/chat/completions`).
fn chat_request_at(path: &str, extra_headers: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {KEY}\r\ncontent-type: application/json\r\n{extra_headers}content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// How the load generator reaches a target.
#[derive(Clone)]
enum Dial {
    /// HTTP/1.1 over TCP.
    Plain,
    /// HTTP/1.1 over TLS (ALPN `http/1.1`), the client config of [`edge::client_config`].
    Tls(Arc<tokio_rustls::rustls::ClientConfig>),
    /// HTTP/2 over TLS (ALPN `h2`): one connection per client, one stream at a time.
    H2(Arc<tokio_rustls::rustls::ClientConfig>),
}

/// One request of a phase: the raw HTTP/1.1 bytes, and the path and body for HTTP/2.
struct Request {
    raw: Vec<u8>,
    path: String,
    body: bytes::Bytes,
}

impl Request {
    fn chat(path: &str, body: &str) -> Request {
        Request {
            raw: chat_request_at(path, "", body),
            path: path.to_string(),
            body: bytes::Bytes::from(body.to_string()),
        }
    }
}

/// A client connection of either protocol.
enum AnyConn {
    H1(Conn),
    H2(edge::H2Conn),
}

impl AnyConn {
    async fn open(addr: SocketAddr, dial: &Dial) -> std::io::Result<AnyConn> {
        match dial {
            Dial::H2(cfg) => Ok(AnyConn::H2(edge::H2Conn::open(addr, cfg).await?)),
            _ => Ok(AnyConn::H1(Conn::open(addr, dial).await?)),
        }
    }

    async fn exchange(&mut self, req: &Request) -> std::io::Result<Reply> {
        match self {
            AnyConn::H1(c) => c.exchange(&req.raw).await,
            AnyConn::H2(c) => c.exchange(req).await,
        }
    }
}

/// A streamed chat body whose user message is `bytes` long (ASCII words): the `prompt`
/// scenario's realistic long prompt (memory per held stream, body handling per request).
fn chat_body_with_prompt(bytes: usize) -> String {
    let mut prompt = String::with_capacity(bytes + 8);
    while prompt.len() < bytes {
        prompt.push_str("lorem ipsum dolor sit amet ");
    }
    prompt.truncate(bytes);
    format!(
        "{{\"model\":\"{MODEL}\",\"messages\":[{{\"role\":\"system\",\"content\":\"You are a helpful assistant.\"}},{{\"role\":\"user\",\"content\":\"{prompt}\"}}],\"stream\":true,\"max_tokens\":256}}"
    )
}

fn chat_body(stream: bool) -> String {
    format!(
        "{{\"model\":\"{MODEL}\",\"messages\":[{{\"role\":\"system\",\"content\":\"You are a helpful assistant.\"}},{{\"role\":\"user\",\"content\":\"Write a short poem about load tests.\"}}],\"stream\":{stream},\"max_tokens\":256}}"
    )
}

/// What one client saw in one phase.
#[derive(Default)]
struct ClientStats {
    done: u64,
    errors: u64,
    first_error: Option<String>,
    connects: u64,
    ttfb_us: Vec<u32>,
    /// Request written → response complete, for requests started in the window.
    latency_us: Vec<u32>,
    body_bytes: u64,
}

/// The merged result of one phase.
#[derive(Debug, Clone, Default)]
struct PhaseResult {
    rps: f64,
    done: u64,
    errors: u64,
    first_error: Option<String>,
    connects: u64,
    ttfb_us: Vec<u32>,
    /// Whole-response latencies (sorted), µs.
    latency_us: Vec<u32>,
    avg_body: f64,
    upstream_conns: Option<u64>,
    redis_cmds: Option<u64>,
    /// CPU seconds used during the measured window: proxy, mock, load generator.
    cpu: (f64, f64, f64),
    /// CPU seconds of helper processes (redis-server) in the measured window.
    cpu_helpers: f64,
    /// `LOAD_MAX_REQUESTS` ran out before the end: req/s is understated.
    capped: bool,
}

impl PhaseResult {
    /// TTFB quantile `q`, ms.
    fn pct_ms(&self, q: f64) -> Option<f64> {
        quantile_ms(&self.ttfb_us, q)
    }

    /// Whole-response latency quantile `q`, ms.
    fn latency_ms(&self, q: f64) -> Option<f64> {
        quantile_ms(&self.latency_us, q)
    }
}

/// The nearest-rank quantile `q` of the sorted µs samples `v`, in ms.
fn quantile_ms(v: &[u32], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let n = v.len();
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "nearest-rank index of a small vector"
    )]
    let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
    Some(f64::from(v[rank - 1]) / 1000.0)
}

async fn client(
    addr: SocketAddr,
    dial: Dial,
    req: Arc<Request>,
    budget: Arc<AtomicU64>,
    measure_from: Instant,
    end: Instant,
    stream: bool,
) -> ClientStats {
    let mut st = ClientStats::default();
    let mut conn: Option<AnyConn> = None;
    // Bounded in time (`end`) and in count (the phase's shared request budget).
    while Instant::now() < end
        && budget
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    {
        let mut c = match conn.take() {
            Some(c) => c,
            None => match AnyConn::open(addr, &dial).await {
                Ok(c) => {
                    st.connects += 1;
                    c
                }
                Err(e) => {
                    st.errors += 1;
                    st.first_error
                        .get_or_insert_with(|| format!("connect: {e}"));
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let started = Instant::now();
        let res = tokio::time::timeout(REQUEST_TIMEOUT, c.exchange(&req)).await;
        let finished = Instant::now();
        match res {
            Err(_) => {
                st.errors += 1;
                st.first_error
                    .get_or_insert_with(|| "request timed out".into());
            }
            Ok(Err(e)) => {
                st.errors += 1;
                st.first_error.get_or_insert_with(|| format!("io: {e}"));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok(Ok(r)) => {
                if r.status != 200 {
                    st.errors += 1;
                    st.first_error
                        .get_or_insert_with(|| format!("HTTP {}", r.status));
                } else if stream && !r.tail.ends_with(DONE) {
                    // A 200 whose stream did not end with `[DONE]` is a broken stream, not
                    // a completed one (its framing, chunked to the terminator or a
                    // `content-length` when the whole answer was there at the commit, was
                    // read to its end).
                    st.errors += 1;
                    st.first_error.get_or_insert_with(|| {
                        format!(
                            "stream without [DONE]: chunked {}, ends {:?}",
                            r.chunked,
                            String::from_utf8_lossy(&r.tail)
                        )
                    });
                } else if finished >= measure_from && finished <= end {
                    st.done += 1;
                    st.body_bytes += r.body_bytes as u64;
                    if started >= measure_from {
                        if let Some(t) = r.ttfb {
                            st.ttfb_us
                                .push(u32::try_from(t.as_micros()).unwrap_or(u32::MAX));
                        }
                        let whole = finished.saturating_duration_since(started);
                        st.latency_us
                            .push(u32::try_from(whole.as_micros()).unwrap_or(u32::MAX));
                    }
                }
                if r.keep_alive {
                    conn = Some(c);
                }
            }
        }
    }
    st
}

/// Runs `clients` closed-loop clients against `t` for warmup + duration, and takes the
/// CPU time the proxy (`t.pids`, and its helpers apart), the mock and this process used in
/// the measured window.
async fn phase(t: &Target, req: Request, clients: usize, mock_pid: u32, o: &Opts) -> PhaseResult {
    let (addr, dial, pids, helper_pids) = (t.addr, &t.dial, &t.pids, &t.helper_pids);
    let req = Arc::new(req);
    let budget = Arc::new(AtomicU64::new(o.max_requests));
    let t0 = Instant::now();
    let measure_from = t0 + o.warmup;
    let end = measure_from + o.duration;
    // Stream requests (`"stream":true` in the body) must end with `[DONE]` to count.
    let stream = req.raw.windows(13).any(|w| w == b"\"stream\":true");
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            tokio::spawn(client(
                addr,
                dial.clone(),
                req.clone(),
                budget.clone(),
                measure_from,
                end,
                stream,
            ))
        })
        .collect();
    let me = std::process::id();
    let sample = || {
        (
            cpu_seconds(pids),
            cpu_seconds(&[mock_pid]),
            cpu_seconds(&[me]),
            cpu_seconds(helper_pids),
        )
    };
    tokio::time::sleep_until(measure_from.into()).await;
    let before = sample();
    tokio::time::sleep_until(end.into()).await;
    let after = sample();
    let mut r = PhaseResult {
        cpu: (after.0 - before.0, after.1 - before.1, after.2 - before.2),
        cpu_helpers: after.3 - before.3,
        ..PhaseResult::default()
    };
    let mut bytes = 0u64;
    for t in tasks {
        // Clients finish their in-flight request after `end` (uncounted), bounded by DRAIN.
        let Ok(Ok(s)) = tokio::time::timeout_at((end + DRAIN).into(), t).await else {
            r.errors += 1;
            r.first_error
                .get_or_insert_with(|| "client did not drain".into());
            continue;
        };
        r.done += s.done;
        r.errors += s.errors;
        r.connects += s.connects;
        bytes += s.body_bytes;
        r.ttfb_us.extend(s.ttfb_us);
        r.latency_us.extend(s.latency_us);
        if r.first_error.is_none() {
            r.first_error = s.first_error;
        }
    }
    r.capped = budget.load(Ordering::Relaxed) == 0;
    r.ttfb_us.sort_unstable();
    r.latency_us.sort_unstable();
    #[expect(clippy::cast_precision_loss, reason = "counts well below 2^52")]
    {
        r.rps = r.done as f64 / o.duration.as_secs_f64();
        r.avg_body = if r.done > 0 {
            bytes as f64 / r.done as f64
        } else {
            0.0
        };
    }
    r
}

// ---------------------------------------------------------------------------------------
// Mock control: behaviour and the connection counter
// ---------------------------------------------------------------------------------------

/// One phase of `clients` clients at `t` with the chat `body`, with the upstream
/// connections the mock saw opened and the Redis commands it caused.
async fn measure(
    t: &Target,
    mock: SocketAddr,
    mock_pid: u32,
    scenario: Scenario,
    body: &str,
    clients: usize,
    o: &Opts,
) -> PhaseResult {
    let before = conn_counter(mock).await;
    let redis_before = t.redis.and_then(redis_commands);
    let mut r = phase(
        t,
        edge::request_for(t, scenario, body),
        clients,
        mock_pid,
        o,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = conn_counter(mock).await;
    // Between the two probes: the first one's log read, then the second one's reset, each
    // on its own connection.
    r.upstream_conns = match (before, after) {
        (Some(b), Some(a)) => Some(a.saturating_sub(b + 3)),
        _ => None,
    };
    if let (Some(a), Some(b)) = (t.redis.and_then(redis_commands), redis_before) {
        // Minus our own first INFO command.
        r.redis_cmds = Some(a.saturating_sub(b + 1));
    }
    r
}

/// One request on a fresh connection; returns (status, body).
async fn oneshot(addr: SocketAddr, req: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(req).await?;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .map_err(|_| bad("control request timed out"))??;
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(&out) {
        Ok(httparse::Status::Complete(n)) => Ok((resp.code.unwrap_or(0), out[n..].to_vec())),
        _ => Err(bad("bad control response")),
    }
}

fn control_request(method: &str, path: &str, body: &str) -> Vec<u8> {
    format!(
        "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

async fn set_behavior(mock: SocketAddr, json: &str) {
    let (status, body) = oneshot(mock, &control_request("POST", "/_mock/behavior", json))
        .await
        .expect("set mock behaviour");
    assert_eq!(
        status,
        200,
        "mock refused behaviour {json}: {}",
        String::from_utf8_lossy(&body)
    );
}

/// Clears the mock's log and returns the id of a fresh connection: the mock numbers its
/// connections 1, 2, ... so two probes bracket how many connections a phase opened.
async fn conn_counter(mock: SocketAddr) -> Option<u64> {
    oneshot(mock, &control_request("POST", "/_mock/reset", "{}"))
        .await
        .ok()?;
    let probe = chat_request(
        &format!("connection: close\r\nx-request-id: {PROBE_ID}\r\n"),
        "{\"model\":\"probe\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"mock\":{\"tokens\":1,\"token_delay_ms\":0}}",
    );
    oneshot(mock, &probe).await.ok()?;
    let (_, log) = oneshot(mock, &control_request("GET", "/_mock/log", ""))
        .await
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&log).ok()?;
    v["requests"].as_array()?.iter().find_map(|r| {
        (r["headers"]["x-request-id"] == PROBE_ID)
            .then(|| r["conn_id"].as_u64())
            .flatten()
    })
}

// ---------------------------------------------------------------------------------------
// Scenarios, targets, table
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Scenario {
    /// Non-stream requests.
    Unary,
    /// Streams whose events the mock writes one per write (token by token).
    Stream,
    /// The same streams written in one burst: all 100 events in one write and one HTTP
    /// chunk (a fast model, a burst after a pause, a cached answer).
    Burst,
    /// Token-by-token streams whose request carries a `LOAD_PROMPT_BYTES` user message.
    Prompt,
    /// TTFB of slow streams at `LOAD_TTFB_CLIENTS` concurrent streams.
    Ttfb,
    /// TTFB of the same streams, one at a time.
    Ttfb1,
}

impl Scenario {
    fn label(self, o: &Opts) -> String {
        match self {
            Scenario::Unary => format!("non-stream, {} clients", o.clients),
            Scenario::Stream => format!("{}-token streams, {} clients", o.stream_tokens, o.clients),
            Scenario::Burst => format!(
                "{}-token streams in one burst, {} clients",
                o.stream_tokens, o.clients
            ),
            Scenario::Prompt => format!(
                "{}-token streams, {} B prompts, {} clients",
                o.stream_tokens, o.prompt_bytes, o.clients
            ),
            Scenario::Ttfb => format!(
                "TTFB, {} streams ({} tokens x {} ms)",
                o.ttfb_clients, o.ttfb_tokens, o.ttfb_token_delay_ms
            ),
            Scenario::Ttfb1 => format!(
                "TTFB, 1 stream ({} tokens x {} ms)",
                o.ttfb_tokens, o.ttfb_token_delay_ms
            ),
        }
    }

    /// The scenarios added for the performance issue, run only against the main targets
    /// (direct, sluice, pingora, nginx): the edge, limiter and billing rows keep the first
    /// three.
    fn main_targets_only(self) -> bool {
        matches!(self, Scenario::Burst | Scenario::Prompt | Scenario::Ttfb1)
    }
}

/// Whether `name` is one of the main targets (every scenario runs against them).
fn is_main(name: &str) -> bool {
    matches!(name, "direct" | "sluice" | "nginx" | pingora::NAME)
}

struct Target {
    name: &'static str,
    addr: SocketAddr,
    /// How the generator connects (plain HTTP/1.1 for all but the edge rows).
    dial: Dial,
    /// A passthrough target: requests go to `/p/...`, non-stream ones ask for ~2 KiB.
    pass: bool,
    redis: Option<SocketAddr>,
    /// The proxy's processes (none for `direct`), for its CPU time.
    pids: Vec<u32>,
    /// Helper processes (redis-server), whose CPU time is reported apart.
    helper_pids: Vec<u32>,
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

fn fmt_opt(v: Option<f64>, prec: usize) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.prec$}"))
}

fn fmt_added(v: Option<f64>, base: Option<f64>, prec: usize) -> String {
    match (v, base) {
        (Some(a), Some(b)) => format!("{:+.prec$}", a - b),
        _ => "-".into(),
    }
}

type Results = BTreeMap<(Scenario, &'static str), Vec<PhaseResult>>;

struct Cell {
    unary: Option<f64>,
    stream: Option<f64>,
    p50: Option<f64>,
    p99: Option<f64>,
}

fn cell(results: &Results, target: &'static str) -> Cell {
    let get = |s: Scenario, f: &dyn Fn(&PhaseResult) -> Option<f64>| {
        results
            .get(&(s, target))
            .and_then(|rs| median(rs.iter().filter_map(f).collect()))
    };
    Cell {
        unary: get(Scenario::Unary, &|r| Some(r.rps)),
        stream: get(Scenario::Stream, &|r| Some(r.rps)),
        p50: get(Scenario::Ttfb, &|r| r.pct_ms(0.50)),
        p99: get(Scenario::Ttfb, &|r| r.pct_ms(0.99)),
    }
}

/// The main table; with `costs` (`LOAD_INSTRUCTIONS`) two more columns: each target's
/// callgrind instructions per non-stream request and per token-by-token stream.
fn print_table(results: &Results, targets: &[&'static str], o: &Opts, costs: Option<&cost::Costs>) {
    let base = cell(results, "direct");
    println!();
    println!(
        "| target | non-stream req/s | added | {}-token stream req/s | added | TTFB p50 ms | added | TTFB p99 ms | added |{}",
        o.stream_tokens,
        if costs.is_some() {
            " non-stream Ir/req | stream Ir/req |"
        } else {
            ""
        }
    );
    println!(
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|{}",
        if costs.is_some() { "---:|---:|" } else { "" }
    );
    for t in targets {
        let c = cell(results, t);
        let direct = *t == "direct";
        let added = |v: Option<f64>, b: Option<f64>, p: usize| {
            if direct {
                "".to_string()
            } else {
                fmt_added(v, b, p)
            }
        };
        let name = match *t {
            "sluice+redis" => "sluice + redis limiter",
            "sluice+local" => "sluice + the same limit, local",
            "nginx" => "nginx → mock",
            "sluice" => "sluice → mock",
            pingora::NAME => "pingora-smallest → mock",
            other => other,
        };
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} | {} | {} |{}",
            fmt_opt(c.unary, 0),
            added(c.unary, base.unary, 0),
            fmt_opt(c.stream, 0),
            added(c.stream, base.stream, 0),
            fmt_opt(c.p50, 3),
            added(c.p50, base.p50, 3),
            fmt_opt(c.p99, 3),
            added(c.p99, base.p99, 3),
            costs.map_or_else(String::new, |k| cost::main_cells(k, t)),
        );
    }
    println!();
    let (l, r) = (cell(results, "sluice+local"), cell(results, "sluice+redis"));
    if let (Some(lv), Some(rv)) = (l.unary, r.unary) {
        println!(
            "non-stream req/s, tenant limit in Redis vs the same limit local: {rv:.0} vs {lv:.0} ({:+.1} %)",
            (rv / lv - 1.0) * 100.0
        );
    }
    // Targets.
    let s = cell(results, "sluice");
    let n = cell(results, "nginx");
    pingora::print_ratios(&s, &cell(results, pingora::NAME), &n);
    if let (Some(sv), Some(nv)) = (s.unary, n.unary) {
        println!(
            "non-stream req/s sluice / nginx = {:.2} (target >= 1.00): {}",
            sv / nv,
            if sv >= nv { "MET" } else { "MISSED" }
        );
    }
    if let (Some(sv), Some(nv)) = (s.stream, n.stream) {
        println!(
            "streaming req/s sluice / nginx = {:.2} (target >= 1.00): {}",
            sv / nv,
            if sv >= nv { "MET" } else { "MISSED" }
        );
    }
    if let (Some(sv), Some(nv), Some(b)) = (s.p50, n.p50, base.p50) {
        println!(
            "added TTFB p50 sluice vs nginx: {:+.3} vs {:+.3} ms",
            sv - b,
            nv - b
        );
    }
    if let (Some(a), Some(b)) = (s.p50, base.p50) {
        let added = a - b;
        println!(
            "added TTFB p50 = {added:.3} ms (target <= 0.100): {}",
            if added <= 0.1 { "MET" } else { "MISSED" }
        );
    }
    if let (Some(a), Some(b)) = (s.p99, base.p99) {
        let added = a - b;
        println!(
            "added TTFB p99 = {added:.3} ms (target <= 0.500): {}",
            if added <= 0.5 { "MET" } else { "MISSED" }
        );
    }
}

/// The performance issue's targets, each as Sluice / nginx from this run: throughput
/// (non-stream, token-by-token streams, burst streams, long-prompt streams), the TTFB each
/// adds over `direct` at 1 and at `LOAD_TTFB_CLIENTS` streams, and proxy CPU per request.
fn print_targets(results: &Results, o: &Opts) {
    let rps = |s: Scenario, t: &'static str| {
        results
            .get(&(s, t))
            .and_then(|rs| median(rs.iter().map(|r| r.rps).collect()))
    };
    let p50 = |s: Scenario, t: &'static str| {
        results
            .get(&(s, t))
            .and_then(|rs| median(rs.iter().filter_map(|r| r.pct_ms(0.50)).collect()))
    };
    if results.keys().all(|(_, t)| *t != "nginx") {
        return;
    }
    println!();
    println!("Targets of the performance issue (Sluice / nginx in this run):");
    println!();
    println!("| measure | direct | nginx | sluice | sluice / nginx | target | status |");
    println!("|---|---:|---:|---:|---:|---:|---|");
    let verdict = |ok: bool| if ok { "met" } else { "**missed**" };
    for (s, what, goal) in [
        (Scenario::Unary, "non-stream req/s".to_string(), 1.0),
        (
            Scenario::Stream,
            format!("streams/s, {} tokens one per write", o.stream_tokens),
            1.25,
        ),
        (
            Scenario::Burst,
            format!("streams/s, {} tokens in one burst", o.stream_tokens),
            1.25,
        ),
        (
            Scenario::Prompt,
            format!("streams/s, {} B prompts", o.prompt_bytes),
            1.25,
        ),
    ] {
        let (d, n, sl) = (rps(s, "direct"), rps(s, "nginx"), rps(s, "sluice"));
        if let (Some(n), Some(sl)) = (n, sl) {
            let r = sl / n;
            println!(
                "| {what} | {} | {n:.0} | {sl:.0} | {r:.2} | >= {goal:.2} | {} |",
                fmt_opt(d, 0),
                verdict(r >= goal)
            );
        }
    }
    for (s, what) in [
        (Scenario::Ttfb1, "added TTFB p50 ms, 1 stream".to_string()),
        (
            Scenario::Ttfb,
            format!("added TTFB p50 ms, {} streams", o.ttfb_clients),
        ),
    ] {
        if let (Some(d), Some(n), Some(sl)) = (p50(s, "direct"), p50(s, "nginx"), p50(s, "sluice"))
        {
            let (an, asl) = (n - d, sl - d);
            let ratio = if an > 0.0 {
                format!("{:.2}", asl / an)
            } else {
                "-".into()
            };
            println!(
                "| {what} | {d:.3} | {an:+.3} | {asl:+.3} | {ratio} | <= nginx's | {} |",
                verdict(asl <= an)
            );
        }
    }
    for (s, what) in [
        (Scenario::Unary, "CPU µs per non-stream request"),
        (Scenario::Stream, "CPU µs per stream, token by token"),
        (Scenario::Burst, "CPU µs per stream, burst"),
        (Scenario::Prompt, "CPU µs per stream, long prompt"),
    ] {
        let n = cpu_per_request(results, s, "nginx")[0];
        let sl = cpu_per_request(results, s, "sluice")[0];
        if let (Some(n), Some(sl)) = (n, sl) {
            println!(
                "| {what} | - | {n:.0} | {sl:.0} | {:.2} | <= 1.00 | {} |",
                sl / n,
                verdict(sl <= n)
            );
        }
    }
}

/// CPU µs per completed request: (proxy, mock, generator), medians over rounds.
fn cpu_per_request(results: &Results, s: Scenario, t: &'static str) -> [Option<f64>; 3] {
    let per = |f: &dyn Fn(&PhaseResult) -> f64| {
        results.get(&(s, t)).and_then(|rs| {
            median(
                rs.iter()
                    .filter(|r| r.done > 0)
                    .map(|r| {
                        #[expect(clippy::cast_precision_loss, reason = "counts well below 2^52")]
                        let done = r.done as f64;
                        f(r) * 1e6 / done
                    })
                    .collect(),
            )
        })
    };
    [per(&|r| r.cpu.0), per(&|r| r.cpu.1), per(&|r| r.cpu.2)]
}

fn print_cpu(results: &Results, targets: &[&'static str]) {
    println!();
    println!("CPU time per completed request, µs (user + system, from /proc; proxy / mock / load generator):");
    println!();
    println!(
        "| target | non-stream: proxy | mock | generator | stream: proxy | mock | generator |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for t in targets {
        let u = cpu_per_request(results, Scenario::Unary, t);
        let st = cpu_per_request(results, Scenario::Stream, t);
        let f = |v: Option<f64>| fmt_opt(v, 0);
        let proxy = |v: Option<f64>| {
            if t.starts_with("direct") {
                "-".into()
            } else {
                f(v)
            }
        };
        println!(
            "| {t} | {} | {} | {} | {} | {} | {} |",
            proxy(u[0]),
            f(u[1]),
            f(u[2]),
            proxy(st[0]),
            f(st[1]),
            f(st[2]),
        );
    }
}

/// Sluice's CPU per request over nginx's (the most stable figure on a shared machine).
fn print_cpu_ratios(results: &Results) {
    for (s, what) in [
        (Scenario::Unary, "non-stream"),
        (Scenario::Stream, "stream"),
    ] {
        let sl = cpu_per_request(results, s, "sluice")[0];
        let ng = cpu_per_request(results, s, "nginx")[0];
        if let (Some(a), Some(b)) = (sl, ng) {
            println!(
                "CPU per {what} request, sluice / nginx = {a:.0} / {b:.0} µs = {:.2} (target <= 1.00): {}",
                a / b,
                if a <= b { "MET" } else { "MISSED" }
            );
        }
    }
}

/// One line per phase; `per_round` phases of a target run in each round (the billing pair
/// runs twice per round).
fn print_details(results: &Results, per_round: usize) {
    println!();
    println!("per phase (all rounds): completed, errors, client connects, upstream conns opened at the mock, avg body bytes, TTFB samples");
    for ((s, t), rs) in results {
        for (i, r) in rs.iter().enumerate() {
            let at = if per_round > 1 {
                format!("round {} phase {}", i / per_round + 1, i % per_round + 1)
            } else {
                format!("round {}", i + 1)
            };
            println!(
                "  {:<6} {:<13} {at}: {:>7} ok {:>5} err {:>4} conns {:>6} upstream {:>7.0} B {:>6} ttfb{}{}{}",
                format!("{s:?}").to_lowercase(),
                t,
                r.done,
                r.errors,
                r.connects,
                r.upstream_conns.map_or("?".into(), |c| c.to_string()),
                r.avg_body,
                r.ttfb_us.len(),
                r.redis_cmds.map_or(String::new(), |c| {
                    #[expect(clippy::cast_precision_loss, reason = "counts well below 2^52")]
                    let per = r.cpu_helpers * 1e6 / (r.done.max(1) as f64);
                    format!(" redis_cmds {c}, redis-server CPU {per:.0} µs/req")
                }),
                r.first_error
                    .as_ref()
                    .map_or(String::new(), |e| format!(" first_error: {e}")),
                if r.capped {
                    " LOAD_MAX_REQUESTS reached: req/s understated"
                } else {
                    ""
                },
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Billing on vs off
// ---------------------------------------------------------------------------------------

/// Sell prices of the billing-on model, USD per million tokens (the billing issue's example).
const SELL_PRICES: &str =
    "    input_usd_per_mtok: 0.30\n    output_usd_per_mtok: 1.20\n    cached_input_usd_per_mtok: 0.075\n";
/// Cost prices of its route, USD per million tokens.
const COST_PRICES: &str = "        input_usd_per_mtok: 0.15\n        output_usd_per_mtok: 0.60\n";
/// The billing-on tenant: a budget no bench run can spend (nothing is refused).
const BUDGET_TENANT: &str = "{budget: {total_usd: 1000000, daily_usd: 100000}}";
/// The two Sluices of the comparison, as target names.
const BILLING: [&str; 2] = ["billing-off", "billing-on"];
/// The order the pair runs in within a scenario (indices into [`BILLING`]): off, on, on,
/// off, so that a drift of the background load over the four phases hits both alike, and
/// the two phases of one config show the noise (an A/A difference).
const BILLING_ORDER: [usize; 4] = [0, 1, 1, 0];

/// `yaml` (from [`sluice_yaml`]) with sell prices on the model and cost prices on its route.
fn with_prices(yaml: &str) -> String {
    yaml.replacen(
        &format!("  {MODEL}:\n"),
        &format!("  {MODEL}:\n{SELL_PRICES}"),
        1,
    )
    .replacen(
        "        upstream_model: mock-small-v1\n",
        &format!("        upstream_model: mock-small-v1\n{COST_PRICES}"),
        1,
    )
}

/// Starts the billing pair: `billing-off` without prices and with `ledger.enabled: false`,
/// `billing-on` with sell and cost prices, the ledger on (SQLite in the temp folder) and,
/// when this build accepts `tenants.<id>.budget`, a budget that refuses nothing (a note says
/// when it does not). Metering itself always runs; "off" is what can be turned off.
fn start_billing(
    dir: &Path,
    threads: usize,
    mock: SocketAddr,
    notes: &mut Vec<String>,
) -> Result<(Vec<Proc>, Vec<Target>), String> {
    let (off, off_addr) = start_sluice(dir, "billing-off", &|l, a| {
        sluice_yaml(l, a, threads, mock, "{}", "ledger:\n  enabled: false\n")
    })?;
    let priced = |tenant: &'static str| {
        move |l, a| with_prices(&sluice_yaml(l, a, threads, mock, tenant, ""))
    };
    let (on, on_addr) = match start_sluice(dir, "billing-on", &priced(BUDGET_TENANT)) {
        Ok(x) => x,
        Err(e) => {
            notes.push(format!(
                "billing: this build refused a tenant budget, so billing-on runs with prices and the ledger but no budget: {}",
                e.lines().next().unwrap_or_default()
            ));
            start_sluice(dir, "billing-on", &priced("{}"))?
        }
    };
    let targets = vec![
        Target {
            name: BILLING[0],
            dial: Dial::Plain,
            pass: false,
            addr: off_addr,
            redis: None,
            pids: vec![off.child.id()],
            helper_pids: Vec::new(),
        },
        Target {
            name: BILLING[1],
            dial: Dial::Plain,
            pass: false,
            addr: on_addr,
            redis: None,
            pids: vec![on.child.id()],
            helper_pids: Vec::new(),
        },
    ];
    Ok((vec![off, on], targets))
}

fn mean(v: &[f64]) -> Option<f64> {
    #[expect(clippy::cast_precision_loss, reason = "a handful of phases")]
    let n = v.len() as f64;
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / n)
}

/// Per phase of `target` in `scenario`: `f` of each phase that completed requests.
fn per_phase(
    b: &Results,
    scenario: Scenario,
    target: &str,
    f: &dyn Fn(&PhaseResult) -> Option<f64>,
) -> Vec<f64> {
    b.iter()
        .filter(|((s, t), _)| *s == scenario && *t == target)
        .flat_map(|(_, rs)| rs.iter().filter(|r| r.done > 0).filter_map(f))
        .collect()
}

/// Proxy CPU µs per completed request of one phase.
fn cpu_us(r: &PhaseResult) -> Option<f64> {
    #[expect(clippy::cast_precision_loss, reason = "counts well below 2^52")]
    let done = r.done as f64;
    Some(r.cpu.0 * 1e6 / done)
}

/// The billing table and its verdicts: throughput and CPU per request on vs off (means
/// over the phases), TTFB p50/p99 on minus off, with the A/A spread as the noise floor.
fn print_billing(b: &Results, o: &Opts) {
    if b.is_empty() {
        return;
    }
    println!();
    println!(
        "Billing on vs off (off: no prices, ledger.enabled: false; on: sell + cost prices, ledger on, budget when accepted; {} phases each per round, order off/on/on/off):",
        BILLING_ORDER.len() / 2
    );
    println!();
    println!("| scenario | off | on | on / off | proxy CPU µs/req off | on | on / off |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.3}", a / b),
        _ => "-".into(),
    };
    // The A/A spread of a config: (max - min) / mean of its phases.
    let spread = |v: &[f64]| {
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(*x), hi.max(*x)));
        mean(v).filter(|_| v.len() >= 2).map(|m| (hi - lo) / m)
    };
    let mut stream_ratio = None;
    let mut stream_noise = 0.0_f64;
    for (s, label) in [
        (Scenario::Unary, "non-stream req/s".to_string()),
        (
            Scenario::Stream,
            format!("{}-token streams/s", o.stream_tokens),
        ),
    ] {
        let rps = |t| mean(&per_phase(b, s, t, &|r| Some(r.rps)));
        let cpu = |t| mean(&per_phase(b, s, t, &cpu_us));
        let (off, on) = (rps(BILLING[0]), rps(BILLING[1]));
        let (coff, con) = (cpu(BILLING[0]), cpu(BILLING[1]));
        if s == Scenario::Stream {
            stream_ratio = on.zip(off).map(|(a, b)| a / b);
            for t in BILLING {
                let v = per_phase(b, s, t, &|r| Some(r.rps));
                stream_noise = stream_noise.max(spread(&v).unwrap_or(0.0));
            }
        }
        println!(
            "| {label} | {} | {} | {} | {} | {} | {} |",
            fmt_opt(off, 0),
            fmt_opt(on, 0),
            ratio(on, off),
            fmt_opt(coff, 0),
            fmt_opt(con, 0),
            ratio(con, coff),
        );
    }
    let mut ttfb = Vec::new();
    for (q, name) in [(0.50, "p50"), (0.99, "p99")] {
        let off = per_phase(b, Scenario::Ttfb, BILLING[0], &|r| r.pct_ms(q));
        let on = per_phase(b, Scenario::Ttfb, BILLING[1], &|r| r.pct_ms(q));
        // The A/A spread: the same config measured twice in the same run.
        let spread = |v: &[f64]| {
            (v.len() >= 2).then(|| {
                v.iter().copied().fold(f64::MIN, f64::max)
                    - v.iter().copied().fold(f64::MAX, f64::min)
            })
        };
        let noise = spread(&off)
            .into_iter()
            .chain(spread(&on))
            .fold(0.0, f64::max);
        let (mo, mn) = (mean(&off), mean(&on));
        println!(
            "| TTFB {name} ms, {} streams | {} | {} | {} | | | |",
            o.ttfb_clients,
            fmt_opt(mo, 3),
            fmt_opt(mn, 3),
            fmt_added(mn, mo, 3),
        );
        ttfb.push((name, mn.zip(mo).map(|(a, b)| a - b), noise));
    }
    println!();
    if let Some(r) = stream_ratio {
        let cost = (1.0 - r) * 100.0;
        println!(
            "billing costs {cost:.1} % of streaming throughput (A/A spread of one config in this run {:.1} %; target < 5 %): {}",
            stream_noise * 100.0,
            if cost < 5.0 { "MET" } else { "MISSED" }
        );
    }
    if let Some((_, Some(d), noise)) = ttfb.first() {
        // "Nothing measurable": within what the same config varies by in this run (at
        // least 10 µs, the resolution worth reading here).
        let floor = noise.max(0.010);
        println!(
            "billing adds {d:+.3} ms to TTFB p50 (A/A noise in this run {noise:.3} ms; target: nothing measurable, <= {floor:.3}): {}",
            if *d <= floor { "MET" } else { "MISSED" }
        );
    }
}

fn machine_note() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let commit = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    format!(
        "commit {commit}, {cpus} CPUs ({cpu}), load average {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    )
}

#[expect(
    clippy::too_many_lines,
    reason = "the bench's phases run in order, as benches/README.md lists them"
)]
fn main() {
    // `cargo test --benches` runs bench targets without `--bench`: then a sanity pass
    // (direct, Sluice, Pingora-smallest when built, the billing pair and Sluice's edge rows
    // (TLS, HTTP/2, passthrough), non-stream and stream, 4 clients, 0.2 + 0.5 s per phase;
    // about 15 s) that fails on any error or an empty phase, and reports no figure.
    let sanity = !std::env::args().any(|a| a == "--bench");
    let mut o = Opts::from_env();
    if sanity {
        o.sanity = true;
        o.warmup = Duration::from_millis(200);
        o.duration = Duration::from_millis(500);
        o.clients = 4;
        o.rounds = 1;
        o.max_requests = 100_000;
        o.targets = [
            "direct",
            "sluice",
            pingora::NAME,
            "billing",
            "tls",
            "h2",
            "passthrough",
        ]
        .map(String::from)
        .to_vec();
        o.scenarios = ["unary", "stream", "burst", "prompt"]
            .map(String::from)
            .to_vec();
    }
    let tmp = TempDir::new(o.keep_tmp);
    eprintln!("load: {o:?}");
    eprintln!("load: {}", machine_note());
    let mut notes: Vec<String> = Vec::new();
    if sanity {
        cost::check_parse();
    }
    // Before any load phase: `LOAD_INSTRUCTIONS=run` runs callgrind on its own.
    let costs = cost::load(&o, &tmp.path, &mut notes);

    let (mock_proc, mock) = start_mock(&tmp.path);
    let mock_pid = mock_proc.child.id();
    let mut procs: Vec<Proc> = Vec::new();
    let mut targets: Vec<Target> = Vec::new();
    if o.wants("direct") {
        targets.push(Target {
            name: "direct",
            dial: Dial::Plain,
            pass: false,
            addr: mock,
            redis: None,
            pids: Vec::new(),
            helper_pids: Vec::new(),
        });
    }
    if o.wants("sluice") {
        let threads = o.sluice_threads;
        let (p, addr) = start_sluice(&tmp.path, "sluice", &|l, a| {
            sluice_yaml(l, a, threads, mock, "{}", "")
        })
        .unwrap_or_else(|e| panic!("{e}"));
        let pids = vec![p.child.id()];
        procs.push(p);
        targets.push(Target {
            name: "sluice",
            dial: Dial::Plain,
            pass: false,
            addr,
            redis: None,
            pids,
            helper_pids: Vec::new(),
        });
    }
    if o.wants(pingora::NAME) {
        pingora::start(&tmp.path, &o, mock, &mut procs, &mut targets, &mut notes);
    }
    if o.wants("nginx") {
        match find_program("nginx") {
            None => {
                notes.push("nginx: not installed (`apt-get install nginx`); row skipped".into())
            }
            Some(exe) => match start_nginx(&tmp.path, &exe, mock, &o.nginx_workers) {
                Ok((p, addr)) => {
                    // The master forks its workers after it listens: wait for all of them,
                    // or their CPU time would be missed.
                    let want = o.nginx_workers.parse::<usize>().unwrap_or_else(|_| {
                        std::thread::available_parallelism().map_or(2, std::num::NonZero::get)
                    });
                    let pids = nginx_pids(p.child.id(), want).unwrap_or_else(|e| panic!("{e}"));
                    procs.push(p);
                    targets.push(Target {
                        name: "nginx",
                        dial: Dial::Plain,
                        pass: false,
                        addr,
                        redis: None,
                        pids,
                        helper_pids: Vec::new(),
                    });
                }
                Err(e) => notes.push(format!("nginx: {e}; row skipped")),
            },
        }
    }
    if o.wants("redis") {
        match find_program("redis-server") {
            None => notes.push("redis: no redis-server binary; row skipped".into()),
            Some(exe) => match start_redis(&tmp.path, &exe) {
                Err(e) => notes.push(format!("redis: {e}; row skipped")),
                Ok((rp, raddr)) => {
                    let redis_pid = rp.child.id();
                    procs.push(rp);
                    let threads = o.sluice_threads;
                    // Like with like: the Redis row is compared with a Sluice that has the
                    // same tenant limit checked locally (the plain `sluice` row has none).
                    let (p, addr) = start_sluice(&tmp.path, "sluice-local", &|l, a| {
                        sluice_yaml(l, a, threads, mock, "{requests_per_minute: 1000000000}", "")
                    })
                    .unwrap_or_else(|e| panic!("{e}"));
                    let pids = vec![p.child.id()];
                    procs.push(p);
                    targets.push(Target {
                        name: "sluice+local",
                        dial: Dial::Plain,
                        pass: false,
                        addr,
                        redis: None,
                        pids,
                        helper_pids: Vec::new(),
                    });
                    let started = start_sluice(&tmp.path, "sluice-redis", &|l, a| {
                        sluice_yaml(
                            l,
                            a,
                            threads,
                            mock,
                            "{requests_per_minute: 1000000000}",
                            &format!("redis:\n  url: redis://{raddr}\n"),
                        )
                    });
                    match started {
                        Ok((p, addr)) => {
                            let pids = vec![p.child.id()];
                            procs.push(p);
                            targets.push(Target {
                                name: "sluice+redis",
                                dial: Dial::Plain,
                                pass: false,
                                addr,
                                redis: Some(raddr),
                                pids,
                                helper_pids: vec![redis_pid],
                            });
                        }
                        Err(e) => notes.push(format!(
                            "redis: Sluice refused the `redis:` config; row skipped: {e}"
                        )),
                    }
                }
            },
        }
    }

    edge::start(&tmp.path, &o, mock, &mut procs, &mut targets, &mut notes);

    let mut billing_targets: Vec<Target> = Vec::new();
    if o.wants("billing") {
        match start_billing(&tmp.path, o.sluice_threads, mock, &mut notes) {
            Ok((ps, ts)) => {
                procs.extend(ps);
                billing_targets = ts;
            }
            Err(e) => notes.push(format!("billing: {e}; comparison skipped")),
        }
    }

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(o.gen_threads)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut results: Results = BTreeMap::new();
    let mut billing: Results = BTreeMap::new();
    let scenarios = [
        (
            Scenario::Unary,
            format!("{{\"tokens\":{},\"token_delay_ms\":0}}", o.unary_tokens),
            chat_body(false),
            o.clients,
        ),
        (
            Scenario::Stream,
            format!("{{\"tokens\":{},\"token_delay_ms\":0}}", o.stream_tokens),
            chat_body(true),
            o.clients,
        ),
        (
            Scenario::Burst,
            format!(
                "{{\"tokens\":{},\"token_delay_ms\":0,\"split\":\"burst\"}}",
                o.stream_tokens
            ),
            chat_body(true),
            o.clients,
        ),
        (
            Scenario::Prompt,
            format!("{{\"tokens\":{},\"token_delay_ms\":0}}", o.stream_tokens),
            chat_body_with_prompt(o.prompt_bytes),
            o.clients,
        ),
        (
            Scenario::Ttfb,
            format!(
                "{{\"tokens\":{},\"token_delay_ms\":{}}}",
                o.ttfb_tokens, o.ttfb_token_delay_ms
            ),
            chat_body(true),
            o.ttfb_clients,
        ),
        (
            Scenario::Ttfb1,
            format!(
                "{{\"tokens\":{},\"token_delay_ms\":{}}}",
                o.ttfb_tokens, o.ttfb_token_delay_ms
            ),
            chat_body(true),
            1,
        ),
    ];
    rt.block_on(async {
        for round in 0..o.rounds {
            for (scenario, behavior, body, clients) in &scenarios {
                let name = format!("{scenario:?}").to_lowercase();
                if !o.scenarios.contains(&name) {
                    continue;
                }
                set_behavior(mock, behavior).await;
                for t in &targets {
                    if scenario.main_targets_only() && !is_main(t.name) {
                        continue;
                    }
                    eprintln!(
                        "load: round {} {} -> {}",
                        round + 1,
                        scenario.label(&o),
                        t.name
                    );
                    let r = measure(t, mock, mock_pid, *scenario, body, *clients, &o).await;
                    results.entry((*scenario, t.name)).or_default().push(r);
                }
                if billing_targets.is_empty() || scenario.main_targets_only() {
                    continue;
                }
                for i in BILLING_ORDER {
                    let t = &billing_targets[i];
                    eprintln!(
                        "load: round {} {} -> {}",
                        round + 1,
                        scenario.label(&o),
                        t.name
                    );
                    let r = measure(t, mock, mock_pid, *scenario, body, *clients, &o).await;
                    billing.entry((*scenario, t.name)).or_default().push(r);
                }
            }
        }
    });

    // A limiter that never reaches Redis would make the row meaningless: say so.
    if let Some(rs) = results.get(&(Scenario::Unary, "sluice+redis")) {
        if rs.iter().all(|r| r.redis_cmds == Some(0)) {
            notes.push(
                "redis: Sluice accepted the `redis:` config but sent no command to Redis \
                 (limiter not wired in this build): the row measures the local limiter only"
                    .into(),
            );
        }
    }

    let names: Vec<&'static str> = targets.iter().map(|t| t.name).collect();
    println!();
    println!(
        "Sluice load benchmark — {} ({} rounds; {} s per phase after {} s warm-up; generator: {} tokio threads; sluice threads: {}; nginx worker_processes {})",
        machine_note(),
        o.rounds,
        o.duration.as_secs_f64(),
        o.warmup.as_secs_f64(),
        o.gen_threads,
        o.sluice_threads,
        o.nginx_workers,
    );
    let main_rows: Vec<&'static str> = names
        .iter()
        .copied()
        .filter(|n| !edge::is_edge(n))
        .collect();
    print_table(&results, &main_rows, &o, costs.as_ref());
    if let Some(c) = &costs {
        cost::print(c, &results);
    }
    print_cpu(&results, &names);
    println!();
    print_cpu_ratios(&results);
    print_targets(&results, &o);
    print_billing(&billing, &o);
    edge::print(&results, &o);
    print_details(&results, 1);
    print_details(&billing, BILLING_ORDER.len() / 2);
    for n in &notes {
        println!("note: {n}");
    }
    println!(
        "note: generator, mock and proxies share this machine's CPUs: compare rows within one run only."
    );
    if sanity {
        let mut bad = Vec::new();
        for ((scenario, target), rs) in &results {
            for r in rs {
                if r.errors > 0 || r.done == 0 {
                    bad.push(format!(
                        "{scenario:?} via {target}: {} done, {} errors (first: {:?})",
                        r.done, r.errors, r.first_error
                    ));
                }
            }
        }
        for ((scenario, target), rs) in &billing {
            for r in rs {
                if r.errors > 0 || r.done == 0 {
                    bad.push(format!(
                        "{scenario:?} via {target}: {} done, {} errors (first: {:?})",
                        r.done, r.errors, r.first_error
                    ));
                }
            }
        }
        // Every target in unary and stream, the main ones (direct, sluice and pingora when
        // built: nginx is not among the sanity targets) in burst and prompt too.
        let main = names.iter().filter(|n| is_main(n)).count();
        assert_eq!(
            results.len(),
            2 * names.len() + 2 * main,
            "phases run: {:?}",
            results.keys()
        );
        assert_eq!(billing.len(), 4, "billing phases run: {:?}", billing.keys());
        assert!(
            bad.is_empty(),
            "load sanity pass failed:\n{}",
            bad.join("\n")
        );
        println!("load: sanity pass ok (test build, short phases: not a figure)");
    }
    drop(procs);
    drop(mock_proc);
}
