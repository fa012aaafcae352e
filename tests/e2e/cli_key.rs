//! The command line beyond `-c`/`-t`: `sluice key new --tenant T [--name N]` (a contract:
//! the key, then the line `key_sha256: <64 hex>`), a generated key working end to end, and the
//! warning for an admin listener that is not on loopback (`sluice -t` and startup).

use std::process::{Command, Stdio};
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::harness::{eventually, Mock, Sluice, TempDir};

fn sluice_cmd() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
}

/// Runs `sluice key new` with `args`; (stdout, stderr).
fn key_new(args: &[&str]) -> (String, String) {
    let out = sluice_cmd()
        .args(["key", "new"])
        .args(args)
        .output()
        .expect("run sluice key new");
    assert!(out.status.success(), "{out:?}");
    (
        String::from_utf8(out.stdout).expect("utf-8 stdout"),
        String::from_utf8(out.stderr).expect("utf-8 stderr"),
    )
}

#[test]
fn key_new_prints_a_random_key_and_its_sha256_line() {
    let (stdout, stderr) = key_new(&["--tenant", "team-a", "--name", "ci"]);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    let key = lines[0];
    let random = key.strip_prefix("sk-sluice-").expect("sk-sluice- prefix");
    assert_eq!(random.len(), 48, "{key}");
    assert!(random
        .bytes()
        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    let hash = lines[1]
        .strip_prefix("key_sha256: ")
        .expect("key_sha256: line");
    assert_eq!(hash.len(), 64);
    assert_eq!(hash, hex::encode(Sha256::digest(key.as_bytes())));
    assert!(
        stderr.contains(&format!("- key_sha256: {hash}")),
        "{stderr}"
    );
    assert!(stderr.contains("tenant: team-a"), "{stderr}");
    assert!(stderr.contains("name: ci"), "{stderr}");
    // Fresh each time.
    let (again, _) = key_new(&["--tenant", "team-a"]);
    assert_ne!(again.lines().next(), Some(key));
    // --tenant is required.
    let out = sluice_cmd()
        .args(["key", "new"])
        .output()
        .expect("run sluice key new");
    assert!(!out.status.success());
}

#[test]
fn a_generated_key_authenticates_once_its_hash_is_in_the_config() {
    let (stdout, stderr) = key_new(&["--tenant", "t", "--name", "generated"]);
    let key = stdout.lines().next().expect("key line").to_string();
    // The two config entries exactly as printed (each after its comment line): the tenant
    // under `tenants:`, the key under `virtual_keys:`.
    let (tenant, entry) = stderr
        .split_once("# add under virtual_keys:")
        .expect("two parts");
    let part = |p: &str| -> String { p.lines().skip(1).map(|l| format!("{l}\n")).collect() };
    let (tenant, entry) = (part(tenant), part(entry));
    let mock = Mock::start("{}");
    let yaml = format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 1\ntenants:\n{tenant}virtual_keys:\n{entry}providers:\n  p1:\n    kind: openai\n    base_url: {}\n    health_check: {{enabled: false}}\nmodels:\n  acme/chat:\n    routes:\n      - provider: p1\n        upstream_model: mock-small-v1\n",
        mock.base_url()
    );
    let sluice = Sluice::start(&yaml);
    let body = r#"{"model":"acme/chat","messages":[{"role":"user","content":"hi"}]}"#;
    let r = crate::harness::post_json(
        sluice.addr,
        "/v1/chat/completions",
        &[("authorization", &format!("Bearer {key}"))],
        body,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = crate::harness::post_json(
        sluice.addr,
        "/v1/chat/completions",
        &[("authorization", "Bearer sk-sluice-not-the-key")],
        body,
    );
    assert_eq!(r.status, 401, "{}", r.text());
}

fn admin_config(admin: &str, listen_port: u16) -> String {
    format!(
        "server:\n  listen: 127.0.0.1:{listen_port}\n  admin_listen: {admin}\n  threads: 1\ntenants:\n  t: {{}}\nvirtual_keys:\n  - key: sk-sluice-test-0001\n    tenant: t\nproviders:\n  demo:\n    kind: demo\nmodels:\n  demo/echo:\n    routes:\n      - provider: demo\n        upstream_model: demo-echo-v1\n"
    )
}

#[test]
fn a_non_loopback_admin_listener_is_warned_about_by_check_and_startup() {
    let dir = TempDir::new("admin-warn");
    let file = dir.path().join("sluice.yaml");
    // Loopback: no warning.
    std::fs::write(&file, admin_config("127.0.0.1:9090", 8080)).expect("write");
    let out = sluice_cmd()
        .arg("-t")
        .arg("-c")
        .arg(&file)
        .output()
        .expect("sluice -t");
    assert!(out.status.success(), "{out:?}");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("warning"),
        "{out:?}"
    );
    // All interfaces: valid, with a located warning on stderr.
    std::fs::write(&file, admin_config("0.0.0.0:9090", 8080)).expect("write");
    let out = sluice_cmd()
        .arg("-t")
        .arg("-c")
        .arg(&file)
        .output()
        .expect("sluice -t");
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "sluice: warning: {}:3:3: server.admin_listen: `0.0.0.0:9090` is not a loopback address",
            file.display()
        )),
        "{stderr}"
    );
    assert!(stderr.contains("no authentication"), "{stderr}");
    // It names what is exposed, the status page included, and the remedy.
    for exposed in [
        "/ (the status page",
        "/status.json",
        "/metrics",
        "server.admin_token_env",
    ] {
        assert!(stderr.contains(exposed), "{exposed}: {stderr}");
    }

    // Startup logs the same warning (the listeners bind to free ports; nothing connects).
    let [port, admin_port] = crate::harness::free_ports();
    std::fs::write(&file, admin_config(&format!("0.0.0.0:{admin_port}"), port)).expect("write");
    let log = dir.path().join("sluice.log");
    let mut child = sluice_cmd()
        .arg("-c")
        .arg(&file)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("spawn sluice");
    let warned = eventually(Duration::from_secs(10), || {
        std::fs::read_to_string(&log).is_ok_and(|l| {
            l.contains("WARN")
                && l.contains("server.admin_listen")
                && l.contains("no authentication")
        })
    });
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        warned,
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}
