//! The systemd units (`systemd/sluice.service`, the drop-in `systemd/graceful-upgrade.conf`):
//! `systemd-analyze verify` accepts them, alone and together, and the unit carries what
//! issue 11 asks of it (reload by SIGHUP, a stop that waits out the drain, the sandbox, the
//! one capability, the descriptor limit, the ledger's state directory).
//!
//! `systemd-analyze verify` refuses a unit whose `ExecStart=` binaries do not exist, so the
//! units are verified from a temporary directory, with `/usr/bin/sluice` rewritten to the
//! binary under test; everything else is verified as shipped. A drop-in in
//! `<dir>/sluice.service.d/` next to the unit is read with it (the control below proves it).
//! Needs `systemd-analyze` (package `systemd`, installed by `scripts/install-deps.sh`); it
//! runs without a running systemd and as any user.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::TempDir;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn shipped(name: &str) -> String {
    std::fs::read_to_string(root().join("systemd").join(name)).expect("unit file")
}

/// `text` with the installed binary's path replaced by the one under test.
fn with_test_binary(text: &str) -> String {
    text.replace("/usr/bin/sluice", env!("CARGO_BIN_EXE_sluice"))
}

/// Runs `systemd-analyze verify unit`; returns whether it succeeded and its diagnostics about
/// Sluice's units (lines naming them: anything else is the host's business).
fn verify(unit: &Path) -> (bool, Vec<String>) {
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(unit)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "systemd-analyze not runnable ({e}): run scripts/install-deps.sh (package systemd)"
            )
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let ours = text
        .lines()
        .filter(|l| l.contains("sluice"))
        .map(str::to_string)
        .collect();
    (out.status.success(), ours)
}

#[test]
fn systemd_analyze_verify_accepts_the_unit_and_the_upgrade_drop_in() {
    let dir = TempDir::new("systemd");
    let unit = dir.path().join("sluice.service");
    std::fs::write(&unit, with_test_binary(&shipped("sluice.service"))).unwrap();
    let (ok, diag) = verify(&unit);
    assert!(ok && diag.is_empty(), "sluice.service: {diag:#?}");

    let dropins = dir.path().join("sluice.service.d");
    std::fs::create_dir_all(&dropins).unwrap();
    let dropin = with_test_binary(&shipped("graceful-upgrade.conf"));
    std::fs::write(dropins.join("graceful-upgrade.conf"), &dropin).unwrap();
    let (ok, diag) = verify(&unit);
    assert!(
        ok && diag.is_empty(),
        "with graceful-upgrade.conf: {diag:#?}"
    );

    // Control: the drop-in is read, and a mistake in it is reported.
    std::fs::write(
        dropins.join("graceful-upgrade.conf"),
        format!("{dropin}\nExecStrat=/bin/true\n"),
    )
    .unwrap();
    let (_, diag) = verify(&unit);
    assert!(
        diag.iter().any(|l| l.contains("ExecStrat")),
        "the misspelt key is not reported: {diag:#?}"
    );
}

/// The values of `key` in the `[Service]` section of `unit` (in order).
fn values(unit: &str, key: &str) -> Vec<String> {
    unit.lines()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .map(|v| v.trim().to_string())
        .collect()
}

#[test]
fn the_unit_reloads_by_sighup_waits_out_the_drain_and_holds_one_capability() {
    let unit = shipped("sluice.service");
    let one = |key: &str| {
        let v = values(&unit, key);
        assert_eq!(v.len(), 1, "{key}: {v:?}");
        v[0].clone()
    };
    assert_eq!(one("ExecReload"), "/bin/kill -HUP $MAINPID");
    // SIGTERM is Sluice's graceful stop; the process is gone at most
    // ceil(shutdown_grace_ms / 1000) + 1 s (Pingora's grace period) + 2 s (runtime shutdown)
    // after it: 33 s for the default shutdown_grace_ms of 30000. systemd must not SIGKILL
    // sooner.
    assert_eq!(one("KillSignal"), "SIGTERM");
    let stop: u64 = one("TimeoutStopSec").parse().expect("seconds");
    let default_grace_s = 30;
    assert!(stop > default_grace_s + 1 + 2, "TimeoutStopSec={stop}");
    assert_eq!(one("User"), "sluice");
    for (k, v) in [
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("CapabilityBoundingSet", "CAP_NET_BIND_SERVICE"),
        ("AmbientCapabilities", "CAP_NET_BIND_SERVICE"),
        ("LimitNOFILE", "1048576"),
        // The default ledger file is relative to the working directory: the state directory.
        ("StateDirectory", "sluice"),
        ("WorkingDirectory", "/var/lib/sluice"),
    ] {
        assert_eq!(one(k), v, "{k}");
    }
}
