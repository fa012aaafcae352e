//! The official `openai` Python package against a real Sluice (in front of the mock
//! upstream): streaming and not, the model list and error classes
//! (`tests/sdk/openai_client.py`).
//!
//! The interpreter is `$SLUICE_PYTHON`, else `.venv/bin/python` at the repository root when it
//! exists, else `python3`. A missing interpreter or package fails the test (it never skips);
//! set up with `python3 -m venv .venv && .venv/bin/pip install -r tests/sdk/requirements.txt`.

use crate::harness::{basic_config, Mock, Sluice, KEY};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const INSTALL: &str = "python3 -m venv .venv && .venv/bin/pip install -r tests/sdk/requirements.txt \
     (or: .venv/bin/pip install openai), or point SLUICE_PYTHON at an interpreter that has `openai`";

/// The Python interpreter the SDK tests use.
pub(crate) fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("SLUICE_PYTHON").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

/// Runs `python args…` with a deadline; returns (success, stdout + stderr).
pub(crate) fn run_python(args: &[&str], timeout: Duration) -> (bool, String) {
    let py = python();
    let mut child = Command::new(&py)
        .args(args)
        .env("PYTHONUNBUFFERED", "1")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        // Never route loopback test traffic through a proxy from the environment.
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("ALL_PROXY")
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("OPENAI_API_KEY")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run the Python interpreter {} ({e}).\nInstall it and the SDK: {INSTALL}",
                py.display()
            )
        });
    let end = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() > end => {
                let _ = child.kill();
                let out = child.wait_with_output().expect("python output");
                panic!(
                    "python {args:?} did not finish within {timeout:?}\nstdout: {}\nstderr: {}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("waiting for python: {e}"),
        }
    }
    let out = child.wait_with_output().expect("python output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Fails with set-up instructions unless the interpreter can import `openai`.
fn require_openai() {
    let (ok, out) = run_python(
        &["-c", "import openai, sys; print(openai.__version__)"],
        Duration::from_secs(30),
    );
    assert!(
        ok,
        "the `openai` Python package is not available to {}:\n{out}\nInstall it: {INSTALL}",
        python().display()
    );
}

/// Runs `tests/sdk/openai_client.py` against `sluice`; panics with its output on failure.
fn run_openai_script(sluice: &Sluice, key: &str, model: &str, text: &str) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/openai_client.py");
    let base_url = format!("http://{}/v1", sluice.addr);
    let (ok, out) = run_python(
        &[
            script.to_str().expect("utf-8 path"),
            "--base-url",
            &base_url,
            "--key",
            key,
            "--model",
            model,
            "--expect-text",
            text,
        ],
        Duration::from_secs(120),
    );
    assert!(ok, "the openai SDK script failed:\n{out}");
    assert!(out.contains("sdk ok"), "{out}");
}

#[test]
fn official_openai_sdk_streams_and_non_streams_through_sluice() {
    require_openai();
    let text = "Hello from the mock: héllo 世界 🚀, twenty tokens or so of text.";
    let behavior = serde_json::json!({ "text": text, "split": "mid_utf8" }).to_string();
    let mock = Mock::start(&behavior);
    let sluice = Sluice::start(&basic_config(&mock.base_url(), ""));
    run_openai_script(&sluice, KEY, "acme/chat", text);
    // Stream + non-stream reached the provider with the upstream model; the error cases
    // did not reach it at all.
    let log = mock.log();
    assert_eq!(log.len(), 2, "{log:?}");
    assert!(log.iter().all(|r| r["model"] == "mock-small-v1"));
    assert_eq!(log[0]["stream"], true);
}

#[test]
fn official_openai_sdk_reads_answers_whose_invalid_utf8_sluice_repaired() {
    // Before the repair of non-stream bodies the SDK raised UnicodeDecodeError.
    require_openai();
    let mock = Mock::start(r#"{"tokens":3,"invalid_utf8":true}"#);
    let sluice = Sluice::start(&basic_config(&mock.base_url(), ""));
    run_openai_script(
        &sluice,
        KEY,
        "acme/chat",
        "tok0\u{FFFD}(\u{FFFD} tok1\u{FFFD}(\u{FFFD} tok2\u{FFFD}(\u{FFFD} ",
    );
}

#[test]
fn official_openai_sdk_works_with_the_default_config_and_no_api_key() {
    require_openai();
    // conf/sluice.yaml as shipped (built-in demo provider, no key, no network), on free ports.
    let conf =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("conf/sluice.yaml"))
            .expect("read conf/sluice.yaml");
    let yaml = conf
        .replacen("listen: 127.0.0.1:8080", "listen: {listen}", 1)
        .replacen("admin_listen: 127.0.0.1:9090", "admin_listen: {admin}", 1);
    assert!(
        yaml.contains("{listen}") && yaml.contains("{admin}"),
        "{yaml}"
    );
    let sluice = Sluice::start(&yaml);
    run_openai_script(
        &sluice,
        "sk-sluice-demo-0001",
        "demo/echo",
        "Hello from Sluice's built-in demo provider. You said: Say hello",
    );
}
