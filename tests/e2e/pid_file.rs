//! Finding the process to reload (issue 30, README as a newcomer found it): a Sluice in the
//! foreground (as `scripts/run.sh` runs it) writes `server.pid_file`, and `sluice reload -c
//! FILE` sends it SIGHUP through it; the file goes away when the process shuts down. A
//! stale pid file is refused, never signalled.

use std::process::Command;
use std::time::Duration;

use crate::harness::{basic_config, eventually, Mock, Sluice};

/// `sluice reload -c CONF` run in `dir` (a relative `pid_file` is relative to it).
fn reload(dir: &std::path::Path, conf: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .current_dir(dir)
        .args(["reload", "-c"])
        .arg(conf)
        .output()
        .expect("run sluice reload")
}

#[test]
fn sluice_reload_signals_the_foreground_process_named_by_its_pid_file() {
    let mock = Mock::start("{}");
    // Relative: the pid file lands in the process's working directory (the test's folder).
    let yaml = basic_config(
        &mock.base_url(),
        "  pid_file: sluice.pid\n  watch_config: false\n",
    );
    let mut s = Sluice::start(&yaml);
    let pid_file = s.dir.path().join("sluice.pid");
    assert!(
        eventually(Duration::from_secs(5), || std::fs::read_to_string(
            &pid_file
        )
        .is_ok_and(|p| p.trim() == s.pid().to_string())),
        "no pid file naming {} at {}",
        s.pid(),
        pid_file.display()
    );

    // A second model, applied by `sluice reload` (file watching is off: only SIGHUP reloads).
    s.rewrite_config(&yaml.replace("models:\n", "models:\n  acme/other:\n    routes:\n      - provider: p1\n        upstream_model: mock-small-v1\n"));
    let out = reload(s.dir.path(), &s.config_path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("sent SIGHUP to process {}", s.pid())),
        "{stdout}"
    );
    assert!(
        eventually(Duration::from_secs(5), || s
            .log()
            .contains("config reloaded file=")
            && s.log().contains("models=2")),
        "{}",
        s.log()
    );

    // Shut down: the pid file goes with the process.
    s.signal("TERM");
    assert!(
        s.wait_exit(Duration::from_secs(10)).is_some(),
        "did not exit"
    );
    assert!(!pid_file.exists(), "the pid file outlived its process");

    // Stale: the file names a process that is not a Sluice (pid 1), which is not signalled.
    std::fs::write(&pid_file, "1\n").expect("write");
    let out = reload(s.dir.path(), &s.config_path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("is not a Sluice") || stderr.contains("is not running"),
        "{stderr}"
    );
    // No pid file at all.
    std::fs::remove_file(&pid_file).expect("remove");
    let out = reload(s.dir.path(), &s.config_path);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no pid file at"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
