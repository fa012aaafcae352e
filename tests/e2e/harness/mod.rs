//! Test harness: spawn `sluice` and `sluice-mock-upstream` on ephemeral loopback ports,
//! wait until ready, kill on drop; a small raw HTTP/1.1 client that sees exact bytes.

#![allow(dead_code)]

pub(crate) mod client;
pub(crate) mod tls;

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) use client::{get, post_json, Response, StreamReader};

/// A free loopback port (bind :0, read, release; the small race is retried by callers).
pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// `N` distinct free loopback ports: all are held bound until every one is chosen, so two
/// calls to [`free_port`] can not hand out the same port twice.
pub(crate) fn free_ports<const N: usize>() -> [u16; N] {
    let held: Vec<TcpListener> = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("free port"))
        .collect();
    std::array::from_fn(|i| held[i].local_addr().expect("port").port())
}

/// A loopback port that refuses every connection for the life of the test process: a TCP
/// socket bound to it that never listens, shared by every test. Connecting gets a reset
/// (`ECONNREFUSED`). Since the socket sets neither `SO_REUSEADDR` nor `SO_REUSEPORT`, no
/// parallel test's listener can be handed the port, as it could a freed port or a killed
/// mock's, whose new owner would then answer in the dead provider's place.
pub(crate) fn dead_port() -> u16 {
    static DEAD: std::sync::OnceLock<socket2::Socket> = std::sync::OnceLock::new();
    DEAD.get_or_init(|| {
        use socket2::{Domain, Socket, Type};
        let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
        s.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
            .expect("bind the dead port");
        s
    })
    .local_addr()
    .ok()
    .and_then(|a| a.as_socket())
    .expect("the dead port's address")
    .port()
}

/// `http://127.0.0.1:{dead_port}/v1`: a provider base URL where connections are refused.
pub(crate) fn dead_url() -> String {
    format!("http://127.0.0.1:{}/v1", dead_port())
}

/// The inodes of the sockets process `pid` holds (Linux: its `/proc/PID/fd` links
/// `socket:[N]`), to match against `/proc/net/tcp{,6}`.
pub(crate) fn socket_inodes(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter_map(|l| {
                    let l = l.to_string_lossy().into_owned();
                    Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether process `pid` holds a listening TCP socket on loopback `port` (Linux: the socket
/// inodes among `/proc/PID/fd` matched against `/proc/net/tcp{,6}`).
pub(crate) fn listens_on(pid: u32, port: u16) -> bool {
    let inodes = socket_inodes(pid);
    let port_hex = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|table| {
        std::fs::read_to_string(table)
            .unwrap_or_default()
            .lines()
            .skip(1)
            .any(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                // sl local_address rem_address st tx:rx tr:tm retrnsmt uid timeout inode
                f.len() > 9
                    && f[1].ends_with(&port_hex)
                    && f[3] == "0A"
                    && inodes.iter().any(|i| i == f[9])
            })
    })
}

/// A scratch directory removed on drop.
pub(crate) struct TempDir(pub PathBuf);

impl TempDir {
    pub(crate) fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!(
            "sluice-e2e-{tag}-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&p).expect("tempdir");
        Self(p)
    }
    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running mock upstream process.
pub(crate) struct Mock {
    child: Child,
    pub addr: SocketAddr,
}

impl Mock {
    /// Starts `sluice-mock-upstream` with a default behaviour (JSON object, `{}` for none).
    pub(crate) fn start(behavior: &str) -> Mock {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sluice-mock-upstream"))
            .args(["--listen", "127.0.0.1:0", "--behavior", behavior])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn mock upstream");
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
        Mock { child, addr }
    }

    /// `http://ADDR/v1`, the provider `base_url`.
    pub(crate) fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The mock's request log (`GET /_mock/log`), as JSON records.
    pub(crate) fn log(&self) -> Vec<serde_json::Value> {
        let r = get(self.addr, "/_mock/log", &[]);
        let v: serde_json::Value = serde_json::from_slice(&r.body).expect("mock log json");
        v["requests"].as_array().cloned().unwrap_or_default()
    }

    /// Number of recorded chat requests.
    pub(crate) fn hits(&self) -> usize {
        self.log().len()
    }

    /// Replaces the default behaviour.
    pub(crate) fn set_behavior(&self, behavior: &str) {
        let r = post_json(self.addr, "/_mock/behavior", &[], behavior);
        assert_eq!(r.status, 200, "set behavior: {}", r.text());
    }

    /// Clears the log and counters.
    pub(crate) fn reset(&self) {
        post_json(self.addr, "/_mock/reset", &[], "{}");
    }

    /// Polls the log until `pred` holds or `timeout` passes; returns the last log.
    pub(crate) fn wait_log(
        &self,
        timeout: Duration,
        pred: impl Fn(&[serde_json::Value]) -> bool,
    ) -> Vec<serde_json::Value> {
        let end = Instant::now() + timeout;
        loop {
            let log = self.log();
            if pred(&log) || Instant::now() > end {
                return log;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Kills the process (the port then refuses connections).
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A running Sluice process on its own ports.
pub(crate) struct Sluice {
    child: Child,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    /// The port `{tls_listen}` in the config was filled with (bound only when it is used).
    pub tls_addr: SocketAddr,
    pub dir: TempDir,
    pub config_path: PathBuf,
    pub log_path: PathBuf,
}

/// The virtual key the helper configs use.
pub(crate) const KEY: &str = "sk-sluice-test-0001";

impl Sluice {
    /// Writes `yaml` (with `{listen}`, `{admin}` and `{tls_listen}` placeholders filled) and
    /// starts Sluice.
    /// Retries with new ports if one was taken meanwhile.
    pub(crate) fn start(yaml: &str) -> Sluice {
        Self::start_with_env(yaml, &[])
    }

    /// As [`Sluice::start`], with extra environment variables.
    pub(crate) fn start_with_env(yaml: &str, env: &[(&str, &str)]) -> Sluice {
        keep_panic_messages();
        for _ in 0..5 {
            let [port, admin_port, tls_port] = free_ports();
            let dir = TempDir::new("sluice");
            let cfg = yaml
                .replace("{listen}", &format!("127.0.0.1:{port}"))
                .replace("{admin}", &format!("127.0.0.1:{admin_port}"))
                .replace("{tls_listen}", &format!("127.0.0.1:{tls_port}"));
            let config_path = dir.path().join("sluice.yaml");
            std::fs::write(&config_path, cfg).expect("write config");
            let log_path = dir.path().join("sluice.log");
            let log = std::fs::File::create(&log_path).expect("log file");
            // `SLUICE_E2E_BIN` runs the suite against another build (an older commit's, to
            // show that a new test fails there).
            let exe = std::env::var_os("SLUICE_E2E_BIN")
                .unwrap_or_else(|| env!("CARGO_BIN_EXE_sluice").into());
            let mut cmd = Command::new(exe);
            // Its own working directory: the default usage ledger (`sluice-usage.db`) is
            // created there, not in the repository.
            cmd.current_dir(dir.path())
                .arg("-c")
                .arg(&config_path)
                .env_remove("RUST_LOG")
                .env("RUST_LOG", "info")
                .stdout(Stdio::null())
                .stderr(log);
            for (k, v) in env {
                cmd.env(k, v);
            }
            let child = cmd.spawn().expect("spawn sluice");
            let mut s = Sluice {
                child,
                addr: format!("127.0.0.1:{port}").parse().expect("addr"),
                admin: format!("127.0.0.1:{admin_port}").parse().expect("addr"),
                tls_addr: format!("127.0.0.1:{tls_port}").parse().expect("addr"),
                dir,
                config_path,
                log_path,
            };
            if s.wait_ready(Duration::from_secs(20), yaml.contains("{tls_listen}")) {
                return s;
            }
            eprintln!("sluice did not become ready; log:\n{}", s.log());
            s.kill();
        }
        panic!("sluice failed to start 5 times");
    }

    fn wait_ready(&mut self, timeout: Duration, tls: bool) -> bool {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            let admin_ok =
                std::net::TcpStream::connect_timeout(&self.admin, Duration::from_millis(200))
                    .is_ok();
            let proxy_ok =
                std::net::TcpStream::connect_timeout(&self.addr, Duration::from_millis(200))
                    .is_ok();
            if admin_ok && proxy_ok {
                // Another process may answer on these ports (a parallel test's Sluice that
                // bound them between our port probe and our bind; ours then failed to bind):
                // ready means *this* child holds both listeners.
                let tls_ok = !tls || listens_on(self.child.id(), self.tls_addr.port());
                if !(listens_on(self.child.id(), self.addr.port())
                    && listens_on(self.child.id(), self.admin.port())
                    && tls_ok)
                {
                    return false;
                }
                // The sockets are bound before the services that accept on them start:
                // ready once `/readyz` says every listener is served.
                if get(self.admin, "/readyz", &[]).status == 200 {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        false
    }

    /// The process log so far, in whole lines: a line still being written (the logger may
    /// write one line in several writes) is left for a later read, so that a test never
    /// finds a record with its later fields missing.
    pub(crate) fn log(&self) -> String {
        let mut text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        text.truncate(text.rfind('\n').map_or(0, |i| i + 1));
        text
    }

    /// The JSON access-log record of request `id` (its `x-request-id`), waiting up to 5 s
    /// for it: the line is written when Pingora finishes the request. A line still being
    /// written (no closing newline yet, so not yet JSON) is waited for, not parsed half.
    pub(crate) fn access_record(&self, id: &str) -> serde_json::Value {
        let needle = format!("\"request_id\":\"{id}\"");
        let mut found = None;
        let ok = eventually(Duration::from_secs(5), || {
            found = self
                .log()
                .lines()
                .filter(|l| l.contains(&needle) && l.contains("\"outcome\""))
                .find_map(|l| serde_json::from_str(&l[l.find('{')?..]).ok());
            found.is_some()
        });
        assert!(ok, "no access line for {id}:\n{}", self.log());
        found.unwrap_or_default()
    }

    /// `GET /metrics` text.
    pub(crate) fn metrics(&self) -> String {
        get(self.admin, "/metrics", &[]).text()
    }

    /// Value of one counter sample line (exact name with labels, e.g.
    /// `sluice_requests_total{model="m",status="200"}`), 0 when the series is absent (a
    /// labelled counter appears with its first event). For gauges use [`Sluice::gauge`].
    pub(crate) fn metric(&self, sample: &str) -> f64 {
        self.metric_opt(sample).unwrap_or(0.0)
    }

    /// Value of one sample line, `None` when the series is absent.
    pub(crate) fn metric_opt(&self, sample: &str) -> Option<f64> {
        parse_metric(&self.metrics(), sample)
    }

    /// Value of one gauge sample line; panics when the series is absent (an absent gauge
    /// is not 0).
    pub(crate) fn gauge(&self, sample: &str) -> f64 {
        let text = self.metrics();
        parse_metric(&text, sample).unwrap_or_else(|| panic!("no series {sample} in:\n{text}"))
    }

    /// POST a chat completion with the test key.
    pub(crate) fn chat(&self, body: &str) -> Response {
        post_json(
            self.addr,
            "/v1/chat/completions",
            &[("authorization", &format!("Bearer {KEY}"))],
            body,
        )
    }

    /// Open a streaming chat completion; returns the reader after the response head.
    pub(crate) fn chat_stream(&self, body: &str) -> StreamReader {
        StreamReader::open(
            self.addr,
            "/v1/chat/completions",
            &[("authorization", &format!("Bearer {KEY}"))],
            body,
        )
    }

    /// Rewrites the config file (placeholders filled with this process's ports).
    pub(crate) fn rewrite_config(&self, yaml: &str) {
        let cfg = yaml
            .replace("{listen}", &self.addr.to_string())
            .replace("{admin}", &self.admin.to_string())
            .replace("{tls_listen}", &self.tls_addr.to_string());
        std::fs::write(&self.config_path, cfg).expect("rewrite config");
    }

    /// Sends a signal (`"HUP"`, `"TERM"`, ...).
    pub(crate) fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "kill -{sig} failed");
    }

    /// The OS pid.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for exit up to `timeout`; `Some(status)` if it exited.
    pub(crate) fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Resident set size in KiB (from /proc).
    pub(crate) fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Sluice {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            // The log can run to hundreds of lines; the failure is repeated after it so that
            // the tail of a CI log, which is what gets read, still says what failed.
            eprintln!(
                "--- sluice log ---\n{}--- end of sluice log; the test failed: {} ---",
                self.log(),
                LAST_PANIC.with(|m| m.borrow().clone()).unwrap_or_default()
            );
        }
    }
}

thread_local! {
    /// The message and place of this thread's last panic, kept by [`keep_panic_messages`].
    static LAST_PANIC: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Chains a panic hook (once per process) that keeps each panic's message for the dumps
/// that run while the test unwinds; the default hook still prints it first.
fn keep_panic_messages() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let text = panic_text(info.payload()).unwrap_or("(no message)");
            let place = info
                .location()
                .map(|l| format!(" at {}:{}", l.file(), l.line()))
                .unwrap_or_default();
            LAST_PANIC.with(|m| *m.borrow_mut() = Some(format!("{text}{place}")));
            default(info);
        }));
    });
}

/// The message of a panic payload (`panic!` with arguments gives a `String`, with a literal a
/// `&str`); `None` for any other payload.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> Option<&str> {
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
}

/// Polls `f` every 10 ms until it holds or `timeout` passes; whether it held.
pub(crate) fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Reads one sample value from Prometheus text: `None` when no line has exactly that
/// series (name and labels), so an absent series is not mistaken for 0.
pub(crate) fn parse_metric(text: &str, sample: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(sample)
                .and_then(|rest| rest.strip_prefix(' '))
        })
        .map(|v| {
            v.trim()
                .parse()
                .unwrap_or_else(|e| panic!("bad value in {sample} {v}: {e}"))
        })
}

/// A one-provider config: test key, tenant `t`, provider `p1` at `base_url`, model `acme/chat`
/// → `mock-small-v1`. `extra_server` is inserted under `server:` (indented lines).
pub(crate) fn basic_config(base_url: &str, extra_server: &str) -> String {
    format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\n{extra_server}\ntenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n  p1:\n    kind: openai\n    base_url: {base_url}\n    api_key: sk-provider-secret-p1\n    health_check: {{enabled: false}}\nmodels:\n  acme/chat:\n    routes:\n      - provider: p1\n        upstream_model: mock-small-v1\n"
    )
}
