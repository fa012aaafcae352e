//! The `pingora` target of the load bench (issue 31): Pingora's smallest `ProxyHttp`
//! (`benches/pingora-smallest`, one `upstream_peer` returning the mock) in front of the same
//! mock, with Sluice's thread count and runtime flavour, so that Pingora-smallest / nginx and
//! Sluice / Pingora-smallest come out of one run.
//!
//! The binary is `PINGORA_BIN`, else `pingora-smallest` beside the bench's `sluice` binary
//! (`cargo build --release -p pingora-smallest` puts it there; `cargo bench` does not build
//! it, being another package), else the release one (for the test build's sanity pass). A
//! missing binary skips the row with a note.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::{
    free_port, log_file, loopback, sluice_exe, tail, wait_listening, Cell, Dial, Opts, Proc, Target,
};

/// The target's name in `LOAD_TARGETS` and in the tables.
pub(super) const NAME: &str = "pingora";

/// The `pingora-smallest` binary: `PINGORA_BIN`, else the one beside the bench's `sluice`,
/// else (the test build's pass) the release one of the same target folder.
pub(super) fn exe() -> PathBuf {
    if let Some(p) = std::env::var_os("PINGORA_BIN") {
        return PathBuf::from(p);
    }
    let beside = sluice_exe().with_file_name("pingora-smallest");
    let release = beside
        .parent()
        .and_then(Path::parent)
        .map(|target| target.join("release").join("pingora-smallest"));
    match release {
        Some(r) if !beside.is_file() && r.is_file() => r,
        _ => beside,
    }
}

/// Starts `pingora-smallest LISTEN MOCK THREADS WORK_STEALING` (Sluice's `LOAD_SLUICE_THREADS`
/// and `LOAD_WORK_STEALING`, default `true` as Sluice's) logging to `dir/pingora.log`, and
/// adds its target; notes why not when the binary is missing or it does not come up.
pub(super) fn start(
    dir: &Path,
    o: &Opts,
    mock: std::net::SocketAddr,
    procs: &mut Vec<Proc>,
    targets: &mut Vec<Target>,
    notes: &mut Vec<String>,
) {
    let exe = exe();
    if !exe.is_file() {
        notes.push(format!(
            "pingora: no {} (`cargo build --release -p pingora-smallest`, or PINGORA_BIN); row skipped",
            exe.display()
        ));
        return;
    }
    let stealing = std::env::var("LOAD_WORK_STEALING").unwrap_or_else(|_| "true".into());
    for _ in 0..3 {
        let listen = loopback(free_port());
        let child = Command::new(&exe)
            .arg(listen.to_string())
            .arg(mock.to_string())
            .arg(o.sluice_threads.to_string())
            .arg(&stealing)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(log_file(dir, "pingora.log"))
            .spawn();
        let child = match child {
            Ok(c) => c,
            Err(e) => {
                notes.push(format!(
                    "pingora: cannot start {}: {e}; row skipped",
                    exe.display()
                ));
                return;
            }
        };
        let mut p = Proc {
            name: "pingora-smallest",
            child,
            graceful: false,
        };
        if wait_listening(&mut p, &[listen], Duration::from_secs(20)) {
            targets.push(Target {
                name: NAME,
                addr: listen,
                dial: Dial::Plain,
                pass: false,
                redis: None,
                pids: vec![p.child.id()],
                helper_pids: Vec::new(),
            });
            procs.push(p);
            return;
        }
    }
    notes.push(format!(
        "pingora: did not come up; row skipped; log tail:\n{}",
        tail(&dir.join("pingora.log"))
    ));
}

/// Prints the req/s ratios Pingora-smallest / nginx and Sluice / Pingora-smallest of this
/// run (non-stream and token-by-token streams), from the main table's cells.
pub(super) fn print_ratios(sluice: &Cell, pingora: &Cell, nginx: &Cell) {
    for (what, p, s, n) in [
        ("non-stream", pingora.unary, sluice.unary, nginx.unary),
        ("streaming", pingora.stream, sluice.stream, nginx.stream),
    ] {
        if let (Some(p), Some(n)) = (p, n) {
            println!("{what} req/s pingora-smallest / nginx = {:.2}", p / n);
        }
        if let (Some(s), Some(p)) = (s, p) {
            println!("{what} req/s sluice / pingora-smallest = {:.2}", s / p);
        }
    }
}
