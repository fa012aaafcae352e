//! Child processes of the replicas bench (mock upstream, `redis-server`, a throwaway
//! PostgreSQL, Sluice replicas), each stopped on drop (also when the bench panics), the
//! scratch folder removed on drop, and the small clients that read Redis, PostgreSQL and
//! Sluice's `/metrics`. Everything listens on 127.0.0.1 only.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::free_port;

/// A scratch folder, removed on drop unless `REPLICAS_KEEP_TMP=1`.
pub(crate) struct TempDir {
    pub(crate) path: PathBuf,
    keep: bool,
}

impl TempDir {
    pub(crate) fn new(keep: bool) -> TempDir {
        let path = std::env::temp_dir().join(format!("sluice-replicas-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create temp dir");
        TempDir { path, keep }
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if self.keep {
            eprintln!("replicas: logs and configs kept in {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// A child process stopped on drop: `signal` first (`None`: SIGKILL at once), then SIGKILL
/// after 10 s.
pub(crate) struct Proc {
    name: &'static str,
    child: Child,
    signal: Option<&'static str>,
}

impl Proc {
    fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Stops it now (as on drop).
    pub(crate) fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        if self.exited() {
            return;
        }
        if let Some(sig) = self.signal {
            let _ = Command::new("kill")
                .args([&format!("-{sig}"), &self.child.id().to_string()])
                .status();
            let end = Instant::now() + Duration::from_secs(10);
            while Instant::now() < end {
                if self.exited() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            eprintln!(
                "replicas: {} did not stop on SIG{sig}; killing it",
                self.name
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.halt();
    }
}

pub(crate) fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Waits until every address accepts a TCP connection (false when the process exits or
/// `timeout` passes).
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

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

fn bin(env_name: &str, default: &str) -> PathBuf {
    std::env::var_os(env_name).map_or_else(|| PathBuf::from(default), PathBuf::from)
}

/// `name` on `PATH`.
pub(crate) fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The mock upstream with startup behaviour `behavior` (JSON), on a free port.
pub(crate) fn start_mock(dir: &Path, behavior: &str) -> (Proc, SocketAddr) {
    let exe = bin(
        "SLUICE_MOCK_BIN",
        env!("CARGO_BIN_EXE_sluice-mock-upstream"),
    );
    let mut child = Command::new(&exe)
        .args(["--listen", "127.0.0.1:0", "--behavior", behavior])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("mock.log")).expect("mock log"))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", exe.display()));
    let stdout = child.stdout.take().expect("mock stdout");
    let proc = Proc {
        name: "sluice-mock-upstream",
        child,
        signal: None,
    };
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("mock prints its address");
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("unexpected mock output: {line:?}"));
    (proc, addr)
}

/// `redis-server --save '' --appendonly no` on a free loopback port.
pub(crate) fn start_redis(dir: &Path, exe: &Path) -> Result<(Proc, SocketAddr), String> {
    let rdir = dir.join("redis");
    std::fs::create_dir_all(&rdir).map_err(|e| e.to_string())?;
    for _ in 0..3 {
        let port = free_port();
        let child = Command::new(exe)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(&rdir)
            .stdout(std::fs::File::create(rdir.join("redis.log")).map_err(|e| e.to_string())?)
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start redis-server: {e}"))?;
        let mut p = Proc {
            name: "redis-server",
            child,
            signal: None,
        };
        if wait_listening(&mut p, &[loopback(port)], Duration::from_secs(10)) {
            return Ok((p, loopback(port)));
        }
    }
    Err("redis-server did not come up".into())
}

/// The folder of PostgreSQL's server binaries (`initdb`, `postgres`): Debian's
/// `/usr/lib/postgresql/<version>/bin` (the newest), else the `PATH`.
pub(crate) fn postgres_bindir() -> Option<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| {
            let v = e
                .file_name()
                .to_str()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            (v, e.path().join("bin"))
        })
        .filter(|(_, b)| b.join("initdb").exists() && b.join("postgres").exists())
        .collect();
    found.sort();
    found
        .pop()
        .map(|(_, b)| b)
        .or_else(|| find_program("initdb").and_then(|p| p.parent().map(Path::to_path_buf)))
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// `bin` as the unprivileged `nobody` when this process is root (PostgreSQL refuses root;
/// util-linux `setpriv` execs, so the child's pid is the server's own).
fn unprivileged(bin: &Path, root: bool) -> Command {
    if root {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(bin);
        c
    } else {
        Command::new(bin)
    }
}

/// A throwaway PostgreSQL server (`initdb` into `dir/pg`, trust auth, `fsync=off`) on a free
/// loopback port; returns it and its URL (user `sluice`, database `postgres`).
pub(crate) fn start_postgres(dir: &Path, bindir: &Path) -> Result<(Proc, String), String> {
    let root = is_root();
    let pg = dir.join("pg");
    std::fs::create_dir_all(&pg).map_err(|e| e.to_string())?;
    if root {
        std::os::unix::fs::chown(&pg, Some(65534), Some(65534)).map_err(|e| e.to_string())?;
    }
    let data = pg.join("data");
    let init = unprivileged(&bindir.join("initdb"), root)
        .arg("-D")
        .arg(&data)
        .args(["-U", "sluice", "-A", "trust", "-E", "UTF8", "--no-sync"])
        .arg("--no-instructions")
        .stdout(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run initdb: {e}"))?;
    if !init.status.success() {
        return Err(format!(
            "initdb failed: {}",
            String::from_utf8_lossy(&init.stderr)
        ));
    }
    let port = free_port();
    let log = pg.join("postgres.log");
    let child = unprivileged(&bindir.join("postgres"), root)
        .arg("-D")
        .arg(&data)
        .arg("-k")
        .arg(&pg)
        .args(["-p", &port.to_string(), "-c", "listen_addresses=127.0.0.1"])
        .args(["-c", "fsync=off", "-c", "max_connections=100"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).map_err(|e| e.to_string())?)
        .spawn()
        .map_err(|e| format!("cannot start postgres: {e}"))?;
    let mut p = Proc {
        name: "postgres",
        child,
        // SIGINT: PostgreSQL's fast shutdown.
        signal: Some("INT"),
    };
    let end = Instant::now() + Duration::from_secs(20);
    while Instant::now() < end {
        if std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("ready to accept connections")
        {
            return Ok((p, format!("postgres://sluice@127.0.0.1:{port}/postgres")));
        }
        if p.exited() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("postgres did not start:\n{}", tail(&log)))
}

fn sluice_exe() -> PathBuf {
    bin("SLUICE_BIN", env!("CARGO_BIN_EXE_sluice"))
}

/// Starts a Sluice replica with the config `yaml(listen, admin)` in `dir/conf-TAG/`
/// (a folder of its own: Sluice watches its config's folder), logging to `dir/TAG.log`.
/// Stopped with SIGTERM (which writes every queued ledger record). Returns it with its
/// listen and admin addresses.
pub(crate) fn start_sluice(
    dir: &Path,
    tag: &str,
    yaml: &dyn Fn(SocketAddr, SocketAddr) -> String,
) -> Result<(Proc, SocketAddr, SocketAddr), String> {
    let mut last = String::new();
    for _ in 0..3 {
        let (listen, admin) = (loopback(free_port()), loopback(free_port()));
        let conf_dir = dir.join(format!("conf-{tag}"));
        std::fs::create_dir_all(&conf_dir).map_err(|e| e.to_string())?;
        let config = conf_dir.join(format!("{tag}.yaml"));
        std::fs::write(&config, yaml(listen, admin)).map_err(|e| e.to_string())?;
        let log = dir.join(format!("{tag}.log"));
        let child = Command::new(sluice_exe())
            .current_dir(dir)
            .arg("-c")
            .arg(&config)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).map_err(|e| e.to_string())?)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", sluice_exe().display()))?;
        let mut p = Proc {
            name: "sluice",
            child,
            signal: Some("TERM"),
        };
        if wait_listening(&mut p, &[listen, admin], Duration::from_secs(30)) {
            return Ok((p, listen, admin));
        }
        last = tail(&log);
    }
    Err(format!("sluice {tag} did not come up; log tail:\n{last}"))
}

/// One RESP reply (the bench sends no command that answers with an array).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Resp {
    Str(String),
    Int(i64),
    Nil,
    Err(String),
}

impl Resp {
    /// The text of a string reply (`""` otherwise).
    pub(crate) fn text(&self) -> &str {
        match self {
            Resp::Str(s) => s,
            _ => "",
        }
    }
}

/// Parses one reply from `b[*at..]`; `None` when incomplete.
fn parse_resp(b: &[u8], at: &mut usize) -> Option<Resp> {
    let eol = *at + memchr::memmem::find(&b[*at..], b"\r\n")?;
    let line = String::from_utf8_lossy(&b[*at + 1..eol]).into_owned();
    let kind = b[*at];
    *at = eol + 2;
    match kind {
        b'+' => Some(Resp::Str(line)),
        b'-' => Some(Resp::Err(line)),
        b':' => Some(Resp::Int(line.parse().ok()?)),
        b'$' => {
            let Ok(len) = usize::try_from(line.parse::<i64>().ok()?) else {
                return Some(Resp::Nil);
            };
            if b.len() < *at + len + 2 {
                return None;
            }
            let s = String::from_utf8_lossy(&b[*at..*at + len]).into_owned();
            *at += len + 2;
            Some(Resp::Str(s))
        }
        _ => Some(Resp::Err(format!(
            "unexpected RESP type {:?}",
            kind as char
        ))),
    }
}

/// Sends one command to Redis at `addr` (a short blocking connection, 5 s bounds).
pub(crate) fn redis(addr: SocketAddr, args: &[&str]) -> Result<Resp, String> {
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("redis connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    let mut cmd = format!("*{}\r\n", args.len());
    for a in args {
        cmd.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    s.write_all(cmd.as_bytes()).map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let n = s.read(&mut chunk).map_err(|e| format!("redis read: {e}"))?;
        if n == 0 {
            return Err("redis closed the connection".into());
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut at = 0;
        match parse_resp(&buf, &mut at) {
            Some(Resp::Err(e)) => return Err(format!("redis: {e}")),
            Some(r) => return Ok(r),
            None => {}
        }
    }
}

/// `GET /metrics` on a Sluice admin listener: every series of `name` as (labels, value),
/// labels as written (`{kind="timeout"}`, or `""`); empty when the listener does not answer.
pub(crate) fn metric_series(admin: SocketAddr, name: &str) -> Vec<(String, f64)> {
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&admin, Duration::from_secs(5)) else {
        return Vec::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n");
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            if !(rest.starts_with(' ') || rest.starts_with('{')) {
                return None;
            }
            let (labels, value) = rest.rsplit_once(' ')?;
            Some((labels.trim().to_string(), value.parse().ok()?))
        })
        .collect()
}
