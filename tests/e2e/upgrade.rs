//! Process management: the graceful upgrade (`sluice -u` takes the listening sockets over
//! from the running process, which then gets SIGQUIT; tested with six streams in flight and a
//! client polling with requests and streams throughout: none cut, none refused) and daemon mode (`-d` with a pid file
//! and an error log).
//!
//! Pingora 0.9.1's mechanics (pingora-core `server/mod.rs`, `server/transfer_fd`): the new
//! process binds `upgrade_sock` and waits up to 5 x 1 s for the old one; on SIGQUIT the old
//! process sends its listening fds over that socket, keeps accepting for `CLOSE_TIMEOUT`
//! (5 s) alongside the new one, then stops accepting, lets its open requests finish within
//! `grace_period_seconds` and exits. The listening socket itself is never closed, so no
//! connection is refused at any moment.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cancellation::chat_body;
use crate::harness::client::sse_text;
use crate::harness::{basic_config, get, Mock, Sluice, TempDir};

/// A child process killed on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn access_lines(log: &str) -> usize {
    log.lines().filter(|l| l.contains("sluice::access")).count()
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one end-to-end scenario, read top to bottom"
)]
fn a_graceful_upgrade_hands_the_listener_over_without_a_refused_connection() {
    let mock = Mock::start(r#"{"tokens":1}"#);
    let sock_dir = TempDir::new("upgrade");
    let sock = sock_dir.path().join("upgrade.sock");
    let extra = format!(
        "  shutdown_grace_ms: 1000\n  upgrade_sock: {}\n  pid_file: {}\n",
        sock.display(),
        sock_dir.path().join("old.pid").display()
    );
    let mut old = Sluice::start(&basic_config(&mock.base_url(), &extra));
    let addr = old.addr;

    // Streams in flight on the old process (~3 s each), read to their end at the finish.
    let mut streams: Vec<_> = (0..6)
        .map(|_| {
            let s = old.chat_stream(&chat_body(true, r#"{"tokens":30,"token_delay_ms":100}"#));
            assert_eq!(s.status, 200);
            s
        })
        .collect();

    // Clients keep connecting through the whole hand-over; every request must be served.
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let clients = {
        let (stop, served) = (stop.clone(), served.clone());
        std::thread::spawn(move || {
            let mut failures = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
                    Err(e) => failures.push(format!("connect: {e}")),
                    Ok(s) => {
                        drop(s);
                        // Alternately a plain request and a short stream read to its end.
                        let n = served.load(Ordering::SeqCst);
                        let auth = format!("Bearer {}", crate::harness::KEY);
                        if n % 2 == 0 {
                            let r = crate::harness::post_json(
                                addr,
                                "/v1/chat/completions",
                                &[("authorization", &auth)],
                                &chat_body(false, "{}"),
                            );
                            if r.status == 200 {
                                served.fetch_add(1, Ordering::SeqCst);
                            } else {
                                failures.push(format!("{}: {}", r.status, r.text()));
                            }
                        } else {
                            let mut st = crate::harness::client::StreamReader::open(
                                addr,
                                "/v1/chat/completions",
                                &[("authorization", &auth)],
                                &chat_body(true, r#"{"tokens":5,"token_delay_ms":20}"#),
                            );
                            let body = st.read_to_end(Duration::from_secs(10));
                            if st.status == 200 && body.ends_with(b"data: [DONE]\n\n") {
                                served.fetch_add(1, Ordering::SeqCst);
                            } else {
                                failures.push(format!(
                                    "stream {}: {}",
                                    st.status,
                                    String::from_utf8_lossy(&body)
                                ));
                            }
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            failures
        })
    };

    // The new process: same config, `-u`. It waits on the upgrade socket for the old one.
    let new_log_path = sock_dir.path().join("new.log");
    let new_log = std::fs::File::create(&new_log_path).expect("log");
    let mut new = Proc(
        // `SLUICE_E2E_BIN` as the harness reads it: both processes from the build under test.
        Command::new(
            std::env::var_os("SLUICE_E2E_BIN")
                .unwrap_or_else(|| env!("CARGO_BIN_EXE_sluice").into()),
        )
        .current_dir(old.dir.path())
        .arg("-u")
        .arg("-c")
        .arg(&old.config_path)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(new_log)
        .spawn()
        .expect("spawn sluice -u"),
    );
    assert!(
        crate::harness::eventually(Duration::from_secs(5), || sock.exists()),
        "sluice -u never bound the upgrade socket"
    );
    // As an operator types it: the new process waits a moment on the socket first (it asks
    // once a second, up to 5 times).
    std::thread::sleep(Duration::from_millis(1500));
    old.signal("QUIT");
    let quit_at = Instant::now();

    // The new process serves the listener: its access log shows requests while the old
    // one is still alive (it keeps accepting for 5 s too) and after it has gone.
    assert!(
        crate::harness::eventually(Duration::from_secs(10), || {
            access_lines(&std::fs::read_to_string(&new_log_path).unwrap_or_default()) > 0
        }),
        "the new process served nothing; its log:\n{}",
        std::fs::read_to_string(&new_log_path).unwrap_or_default()
    );
    assert!(
        new.0.try_wait().expect("wait").is_none(),
        "sluice -u exited"
    );

    // The streams in flight on the old process complete.
    let want: String = (0..30).map(|i| format!("tok{i} ")).collect();
    for stream in &mut streams {
        let body = stream.read_to_end(Duration::from_secs(10));
        assert!(
            stream.is_done(),
            "the old process's stream ends with its terminator"
        );
        assert_eq!(sse_text(&body), want);
        assert!(body.ends_with(b"data: [DONE]\n\n"));
    }

    // The old process exits: 5 s of shared accepting, then its grace period (2 s).
    let status = old.wait_exit(Duration::from_secs(15));
    eprintln!(
        "old process exited {:?} after SIGQUIT: {status:?}",
        quit_at.elapsed()
    );
    assert!(status.is_some(), "the old process did not exit");
    let before = served.load(Ordering::SeqCst);
    assert!(
        crate::harness::eventually(Duration::from_secs(5), || served.load(Ordering::SeqCst)
            >= before + 5),
        "requests stopped being served after the old process exited"
    );
    stop.store(true, Ordering::SeqCst);
    let failures = clients.join().expect("client thread");
    eprintln!(
        "{} requests served during the upgrade",
        served.load(Ordering::SeqCst)
    );
    assert!(
        failures.is_empty(),
        "failed during the upgrade: {failures:?}"
    );
    // Only the new process is left, and it answers.
    let new_log = std::fs::read_to_string(&new_log_path).unwrap_or_default();
    assert!(access_lines(&new_log) >= 5, "{new_log}");
    // A normal upgrade logs no ERROR in either process; the new one's wait for the sockets
    // is an INFO line saying what it waits for (Pingora logs it as an ERROR).
    for (who, log) in [("old", old.log()), ("new", new_log.clone())] {
        let errors: Vec<&str> = log.lines().filter(|l| l.contains(" ERROR ")).collect();
        assert!(errors.is_empty(), "{who} process: {errors:#?}");
    }
    assert!(
        new_log.contains("INFO  pingora_core::server::transfer_fd graceful upgrade: the running process has not sent its listening sockets yet"),
        "{new_log}"
    );
    assert_eq!(
        get(old.admin, "/healthz", &[]).status,
        200,
        "the new process serves the admin listener too"
    );
}

/// Stops a daemon if the test fails (only while that pid is still this daemon: the config
/// path is on its command line).
struct KillDaemon(u32, std::path::PathBuf);

impl Drop for KillDaemon {
    fn drop(&mut self) {
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", self.0)).unwrap_or_default();
        let ours = String::from_utf8_lossy(&cmdline).contains(&*self.1.to_string_lossy());
        if ours {
            let _ = Command::new("kill")
                .args(["-KILL", &self.0.to_string()])
                .status();
        }
    }
}

/// The files of a Sluice run as a daemon: a temp folder with its config (the basic config
/// on free ports, plus `extra` server keys), pid file, error log and upgrade socket.
pub(crate) struct DaemonFiles {
    /// The folder; removed on drop.
    pub dir: TempDir,
    pub pid_file: std::path::PathBuf,
    pub error_log: std::path::PathBuf,
    pub cfg_path: std::path::PathBuf,
    /// The downstream listener's port.
    pub port: u16,
}

impl DaemonFiles {
    /// Writes the config in a new temp folder named after `name`; `extra` is YAML lines under
    /// `server:` (two-space indented, each ending in a newline).
    pub(crate) fn write(name: &str, mock: &Mock, extra: &str) -> DaemonFiles {
        let dir = TempDir::new(name);
        let pid_file = dir.path().join("sluice.pid");
        let error_log = dir.path().join("error.log");
        let [port, admin] = crate::harness::free_ports();
        let cfg = basic_config(
            &mock.base_url(),
            &format!(
                "{extra}  pid_file: {}\n  error_log: {}\n  upgrade_sock: {}\n",
                pid_file.display(),
                error_log.display(),
                dir.path().join("upgrade.sock").display()
            ),
        )
        .replace("{listen}", &format!("127.0.0.1:{port}"))
        .replace("{admin}", &format!("127.0.0.1:{admin}"));
        let cfg_path = dir.path().join("sluice.yaml");
        std::fs::write(&cfg_path, cfg).expect("config");
        DaemonFiles {
            dir,
            pid_file,
            error_log,
            cfg_path,
            port,
        }
    }
}

/// A daemon started with `sluice -d`, listening on its own port.
struct Daemon {
    /// Holds the pid file, the error log and the config (removed on drop).
    _dir: TempDir,
    error_log: std::path::PathBuf,
    port: u16,
    pid: u32,
    guard: KillDaemon,
}

/// Runs `sluice -d` on free ports and waits until the daemon listens on its port. A port
/// taken by a test running in parallel between `free_ports` and the daemon's bind (its error
/// log says "in use") is retried on new ports, up to 5 times; any other failure panics.
fn start_daemon(mock: &Mock) -> Daemon {
    for _ in 0..5 {
        let DaemonFiles {
            dir,
            pid_file,
            error_log,
            cfg_path,
            port,
        } = DaemonFiles::write("daemon", mock, "");

        // `-d`: the command returns once the daemon has forked off.
        let t = Instant::now();
        let status = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .current_dir(dir.path())
            .arg("-d")
            .arg("-c")
            .arg(&cfg_path)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run sluice -d");
        assert!(status.success(), "sluice -d exited {status:?}");
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());

        // The pid file names a live process other than the one we started.
        assert!(
            crate::harness::eventually(Duration::from_secs(10), || std::fs::read_to_string(
                &pid_file
            )
            .is_ok_and(|p| !p.trim().is_empty())),
            "no pid file"
        );
        let pid: u32 = std::fs::read_to_string(&pid_file)
            .expect("pid file")
            .trim()
            .parse()
            .expect("a pid");
        let guard = KillDaemon(pid, cfg_path.clone());
        // The daemon itself listens (a bare connect could reach whoever else holds the port).
        if crate::harness::eventually(Duration::from_secs(10), || {
            crate::harness::listens_on(pid, port)
        }) {
            return Daemon {
                _dir: dir,
                error_log,
                port,
                pid,
                guard,
            };
        }
        let log = std::fs::read_to_string(&error_log).unwrap_or_default();
        assert!(
            log.contains("in use"),
            "the daemon does not listen on {port}; error log:\n{log}"
        );
    }
    panic!("the daemon's port was taken 5 times");
}

#[test]
fn daemon_mode_writes_the_pid_file_serves_and_stops() {
    let mock = Mock::start(r#"{"tokens":2}"#);
    let Daemon {
        _dir,
        error_log,
        port,
        pid,
        guard,
    } = start_daemon(&mock);
    assert!(
        std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "pid {pid} is not running"
    );

    // It serves.
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    assert!(
        crate::harness::eventually(Duration::from_secs(10), || {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
        }),
        "the daemon does not listen; error log:\n{}",
        std::fs::read_to_string(&error_log).unwrap_or_default()
    );
    let r = crate::harness::post_json(
        addr,
        "/v1/chat/completions",
        &[("authorization", &format!("Bearer {}", crate::harness::KEY))],
        &chat_body(false, "{}"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["choices"][0]["message"]["content"], "tok0 tok1 ");

    // Its log goes to the error log.
    assert!(
        crate::harness::eventually(Duration::from_secs(5), || access_lines(
            &std::fs::read_to_string(&error_log).unwrap_or_default()
        ) >= 1),
        "error log:\n{}",
        std::fs::read_to_string(&error_log).unwrap_or_default()
    );

    // SIGTERM stops it: the process goes away and the port refuses connections.
    let ok = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -TERM {pid}");
    assert!(
        crate::harness::eventually(Duration::from_secs(15), || !std::path::Path::new(&format!(
            "/proc/{pid}"
        ))
        .exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.contains(") Z "))),
        "the daemon did not stop"
    );
    std::mem::forget(guard);
    // The listener went with the process. (Whether the port now refuses is not checked: a
    // test running in parallel may already have been given the same free port.)
}
