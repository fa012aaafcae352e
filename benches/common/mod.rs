//! What the process benches share (each bench is its own crate and includes this file with
//! `#[path = "common/mod.rs"] mod common;`): loopback ports, a temporary directory removed
//! on drop, `sluice-mock-upstream` and Sluice started on 127.0.0.1 with the benches'
//! one-tenant config ([`start`] for both at once, stopped on drop), readiness polling, and a
//! process's resident set size.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The virtual key of tenant `t` in [`sluice_config`].
pub(crate) const KEY: &str = "sk-sluice-bench-0001";

/// A free loopback port not handed out before in this process (two ports bound, released
/// and bound again can come back equal, and Sluice refuses `listen == admin_listen`).
pub(crate) fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().expect("ports");
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("free port");
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// Resident set size of a process (`VmRSS` of `/proc/<pid>/status`), KiB; `None` when the
/// process is gone or a zombie.
pub(crate) fn vm_rss_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Resident set size of a live process, KiB. Panics when the process is gone or a zombie
/// (no `VmRSS`): a dead Sluice must fail the bench, not report 0 KiB.
pub(crate) fn rss_kib(pid: u32) -> u64 {
    vm_rss_kib(pid)
        .unwrap_or_else(|| panic!("process {pid} is gone (no VmRSS in /proc/{pid}/status)"))
}

/// A directory under the system's temp dir, removed (with its contents) on drop.
pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    /// Creates `sluice-bench-<tag>-<pid>-<random>`.
    pub(crate) fn new(tag: &str) -> Result<TempDir, String> {
        let dir = std::env::temp_dir().join(format!(
            "sluice-bench-{tag}-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts `sluice-mock-upstream` on a free loopback port answering `behavior` (its JSON
/// knobs); the child and its address (`host:port`, from its `listening on ADDR` line).
pub(crate) fn start_mock(behavior: &str) -> Result<(Child, String), String> {
    let mut mock = Command::new(env!("CARGO_BIN_EXE_sluice-mock-upstream"))
        .args(["--listen", "127.0.0.1:0", "--behavior", behavior])
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("spawn mock: {e}"))?;
    let mut line = String::new();
    BufReader::new(mock.stdout.take().ok_or("mock stdout")?)
        .read_line(&mut line)
        .map_err(|e| format!("mock address: {e}"))?;
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .ok_or_else(|| format!("unexpected mock output {line:?}"))?
        .to_string();
    Ok((mock, addr))
}

/// The benches' Sluice config: `listen` and `admin_listen` on `port` and `admin`, two
/// threads and the `server` lines `server_extra` (each `  key: value\n`), tenant `t` with
/// [`KEY`], and `acme/chat` routed to the OpenAI-compatible mock at `mock_addr`.
pub(crate) fn sluice_config(port: u16, admin: u16, mock_addr: &str, server_extra: &str) -> String {
    format!(
        "server:\n  listen: 127.0.0.1:{port}\n  admin_listen: 127.0.0.1:{admin}\n  threads: 2\n{server_extra}\
         tenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\n\
         providers:\n  p1:\n    kind: openai\n    base_url: http://{mock_addr}/v1\n    api_key: sk-p1\n    health_check: {{enabled: false}}\n\
         models:\n  acme/chat:\n    routes:\n      - provider: p1\n        upstream_model: mock-small-v1\n",
    )
}

/// The Sluice binary of this build (the bench profile's under `cargo bench`).
pub(crate) const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

/// Spawns `cmd` (Sluice, or a wrapper whose last argument is Sluice) with `-c config` in
/// `dir`, `RUST_LOG=warn`, stdout discarded and stderr inherited.
pub(crate) fn spawn_sluice(mut cmd: Command, dir: &Path, config: &Path) -> Result<Child, String> {
    cmd.current_dir(dir)
        .arg("-c")
        .arg(config)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("spawn sluice: {e}"))
}

/// Waits until `addr` accepts a TCP connection, `timeout` at most.
pub(crate) fn wait_listening(addr: SocketAddr, timeout: Duration) -> Result<(), String> {
    let end = Instant::now() + timeout;
    while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        if Instant::now() > end {
            return Err(format!("nothing listens on {addr} after {timeout:?}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// The mock and Sluice of a bench ([`start`]), killed on drop, then their temp dir removed.
pub(crate) struct Procs {
    /// Sluice.
    pub(crate) sluice: Child,
    /// `sluice-mock-upstream`.
    pub(crate) mock: Child,
    _dir: TempDir,
}

impl Drop for Procs {
    fn drop(&mut self) {
        let _ = self.sluice.kill();
        let _ = self.sluice.wait();
        let _ = self.mock.kill();
        let _ = self.mock.wait();
    }
}

/// Starts the mock answering `behavior` and Sluice (`cmd`, e.g. `Command::new(SLUICE)`)
/// on [`sluice_config`] with `server_extra`, in a new [`TempDir`] named after `tag`;
/// returns once Sluice accepts (30 s at most), with its listen address.
pub(crate) fn start(
    tag: &str,
    behavior: &str,
    server_extra: &str,
    cmd: Command,
) -> Result<(Procs, SocketAddr), String> {
    let (mock, mock_addr) = start_mock(behavior)?;
    let dir = TempDir::new(tag)?;
    let (port, admin) = (free_port(), free_port());
    let path = dir.0.join("sluice.yaml");
    std::fs::write(&path, sluice_config(port, admin, &mock_addr, server_extra))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let sluice = spawn_sluice(cmd, &dir.0, &path)?;
    let procs = Procs {
        sluice,
        mock,
        _dir: dir,
    };
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    wait_listening(addr, Duration::from_secs(30))?;
    Ok((procs, addr))
}
