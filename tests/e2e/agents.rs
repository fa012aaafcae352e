//! The real clients, as shipped (issue 28): Claude Code and Codex from npm at the versions
//! `tests/agents/package-lock.json` pins, each driven non-interactively through a tool loop
//! on every provider kind; LangChain (Python) and the Vercel AI SDK (JavaScript), a plain and
//! a streamed request each.
//!
//! Each agent run is one prompt to a real Sluice in front of the mock upstream with its
//! `tool_loop` knob on: the mock answers the request that offers tools with a call of the
//! agent's shell tool (`echo sluice-tool-ok`), the agent runs it, and the mock answers the
//! request that carries the tool result with text quoting it. The test asserts the agent
//! exits 0, prints that text, and the mock saw the tool result come back. The agents run
//! with their own defaults (no permission or sandbox flag: both let `echo` run), told only
//! where Sluice is, the model, the key, and to stay off the network (Claude Code's
//! `CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC`, Codex's update check, analytics and plugins
//! off); nothing turns off what a gateway might refuse.
//!
//! The clients never reach another host: each runs in a network namespace of its own with
//! only loopback (`unshare --net`, as root; else, printed, in the test's own), where
//! `tests/agents/isolate.mjs` forwards the base URL's port to Sluice over a Unix socket, and
//! `HTTP(S)_PROXY` points at a trap that records every attempt to reach another host: the
//! test fails on any. Missing Node.js, packages or Python modules fail the test (install with
//! `bash scripts/install-deps.sh`); nothing is skipped.

use std::io::Read;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::json;
use sluice_mock_upstream::{DONE_MARKER, TOOL_MARKER};

use crate::harness::{free_ports, Mock, Sluice, TempDir, KEY};
use crate::provider_battery::{self as battery, Rig, MODEL};

/// Longest one client run may take before it is killed (its process group).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);
/// What the agents are asked (the mock decides what they do; the prompt only reads right).
const PROMPT: &str = "Run `echo sluice-tool-ok` in the shell and tell me what it printed.";
const INSTALL: &str =
    "run `bash scripts/install-deps.sh` (Node.js, npm, then `npm ci` in tests/agents)";

fn agents_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/agents")
}

/// A client's executable from `tests/agents/node_modules/.bin`; fails the test when missing.
fn npm_bin(name: &str) -> PathBuf {
    let node = Command::new("node").arg("--version").output();
    assert!(
        node.as_ref().is_ok_and(|o| o.status.success()),
        "Node.js is not installed ({node:?}): {INSTALL}"
    );
    let bin = agents_dir().join("node_modules/.bin").join(name);
    assert!(bin.exists(), "{} is missing: {INSTALL}", bin.display());
    bin
}

/// Brings up loopback in a new network namespace (`ip` is in `/usr/sbin`, which a non-login
/// `PATH` may lack).
const LOOPBACK_UP: &str = "PATH=\"$PATH:/usr/sbin:/sbin\" ip link set lo up";

/// Whether this process may make a network namespace (root, or unprivileged user
/// namespaces); checked once.
fn netns() -> bool {
    static CAN: OnceLock<bool> = OnceLock::new();
    *CAN.get_or_init(|| {
        let ok = Command::new("unshare")
            .args(["--net", "--", "sh", "-c", LOOPBACK_UP])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!(
                "agents: no network namespace here (`unshare --net` needs root): the clients \
                 run in the test's namespace, other hosts caught by the proxy trap only"
            );
        }
        ok
    })
}

/// Forwards each connection to a Unix socket to `target` (Sluice), until dropped.
struct Bridge {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl Bridge {
    fn start(path: PathBuf, target: SocketAddr) -> Bridge {
        let listener = UnixListener::bind(&path).expect("bind the bridge's Unix socket");
        listener.set_nonblocking(true).expect("nonblocking");
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let accept = std::thread::spawn(move || {
            while !stopping.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        std::thread::spawn(move || splice(conn, target));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => {
                        eprintln!("agents bridge: accept: {e}");
                        break;
                    }
                }
            }
        });
        Bridge {
            path,
            stop,
            accept: Some(accept),
        }
    }
}

/// Copies bytes both ways between `conn` and a new connection to `target`, until both
/// sides are done.
fn splice(conn: UnixStream, target: SocketAddr) {
    let _ = conn.set_nonblocking(false);
    let Ok(tcp) = TcpStream::connect(target) else {
        return;
    };
    let (Ok(mut conn_rd), Ok(mut tcp_rd)) = (conn.try_clone(), tcp.try_clone()) else {
        return;
    };
    let (mut conn_wr, mut tcp_wr) = (conn, tcp);
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut conn_rd, &mut tcp_wr);
        let _ = tcp_wr.shutdown(Shutdown::Write);
    });
    let _ = std::io::copy(&mut tcp_rd, &mut conn_wr);
    let _ = conn_wr.shutdown(Shutdown::Write);
    let _ = up.join();
}

impl Drop for Bridge {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// What one client run did.
struct Run {
    /// `None`: killed at [`CLIENT_TIMEOUT`].
    status: Option<ExitStatus>,
    stdout: String,
    stderr: String,
    /// Attempts to reach another host, one line each (the proxy trap's log).
    trapped: String,
    took: Duration,
}

impl Run {
    fn describe(&self) -> String {
        let tail = |s: &str| {
            let start = s.len().saturating_sub(4000);
            s.get(start..).unwrap_or(s).to_string()
        };
        format!(
            "status {:?} after {:.1} s\n--- stdout:\n{}\n--- stderr:\n{}\n--- other hosts tried:\n{}",
            self.status,
            self.took.as_secs_f64(),
            tail(&self.stdout),
            tail(&self.stderr),
            self.trapped
        )
    }
}

/// Runs `program args` isolated (see the module docs), in `cwd`, with only `env` (plus
/// `PATH`, a scratch `HOME` and the proxy settings), after writing `files`; `{port}` in
/// `args`, `env` values and `files` stands for the port of the client's base URL.
fn run_isolated(
    sluice: &Sluice,
    cwd: &Path,
    program: &Path,
    args: &[String],
    env: &[(&str, String)],
    files: &[(PathBuf, String)],
) -> Run {
    let scratch = TempDir::new("agent-run");
    let bridge = Bridge::start(scratch.path().join("sluice.sock"), sluice.addr);
    let [port, trap_port] = free_ports();
    let trap_log = scratch.path().join("trap.log");
    std::fs::write(&trap_log, "").expect("trap log");
    let home = scratch.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    let mut isolate: Vec<String> = vec![
        agents_dir().join("isolate.mjs").display().to_string(),
        port.to_string(),
        bridge.path.display().to_string(),
        trap_port.to_string(),
        trap_log.display().to_string(),
        "--".into(),
        program.display().to_string(),
    ];
    isolate.extend(args.iter().map(|a| a.replace("{port}", &port.to_string())));
    let mut cmd = if netns() {
        let mut c = Command::new("unshare");
        let script = format!("{LOOPBACK_UP} && exec node \"$@\"");
        c.args(["--net", "--", "sh", "-c", &script, "sh"]);
        c.args(&isolate);
        c
    } else {
        let mut c = Command::new("node");
        c.args(&isolate);
        c
    };
    let trap = format!("http://127.0.0.1:{trap_port}");
    cmd.current_dir(cwd)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", &home)
        .env("TMPDIR", scratch.path())
        .env("LANG", "C.UTF-8")
        .env("TERM", "dumb")
        .env("NO_COLOR", "1")
        .env("HTTPS_PROXY", &trap)
        .env("HTTP_PROXY", &trap)
        .env("ALL_PROXY", &trap)
        .env("https_proxy", &trap)
        .env("http_proxy", &trap)
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(scratch.path().join("stdout")).expect("stdout file"))
        .stderr(std::fs::File::create(scratch.path().join("stderr")).expect("stderr file"))
        // Its own process group, so that a timeout kills the client's children too.
        .process_group(0);
    for (k, v) in env {
        cmd.env(k, v.replace("{port}", &port.to_string()));
    }
    for (path, text) in files {
        std::fs::write(path, text.replace("{port}", &port.to_string())).expect("write a file");
    }
    let start = Instant::now();
    let status = wait_bounded(cmd.spawn().expect("spawn the isolated client"));
    let took = start.elapsed();
    drop(bridge);
    let read = |name: &str| {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(scratch.path().join(name)) {
            let _ = f.read_to_string(&mut s);
        }
        s
    };
    Run {
        status,
        stdout: read("stdout"),
        stderr: read("stderr"),
        trapped: read("trap.log"),
        took,
    }
}

/// Waits for `child` (the leader of its own process group) at most [`CLIENT_TIMEOUT`], then
/// kills the whole group; `None` when it had to.
fn wait_bounded(mut child: std::process::Child) -> Option<ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().expect("wait for the client") {
            return Some(s);
        }
        if start.elapsed() > CLIENT_TIMEOUT {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sets up a provider kind's rig.
type MakeRig = fn() -> Rig;

/// Every provider kind's rig, by name.
fn kinds() -> Vec<(&'static str, MakeRig)> {
    vec![
        ("openai", battery::openai_rig as MakeRig),
        ("anthropic", battery::anthropic_rig),
        ("bedrock-claude", battery::bedrock_claude_rig),
        ("bedrock-converse", battery::bedrock_converse_rig),
        ("gemini", battery::gemini_rig),
        ("azure-openai", battery::azure_openai_rig),
        ("openai-responses", battery::openai_responses_rig),
        ("azure-responses", battery::azure_responses_rig),
        ("vertex-claude", battery::vertex_claude_rig),
        ("vertex-gemini", battery::vertex_gemini_rig),
    ]
}

/// Whether `text` has the marker as the command printed it, not only the command itself (a
/// refusal that quotes `echo sluice-tool-ok` does not count).
fn printed_marker(text: &str) -> bool {
    text.replace(&format!("echo {TOOL_MARKER}"), "")
        .contains(TOOL_MARKER)
}

/// One agent's tool loop on one rig: `Err` says what went wrong, with the evidence.
fn tool_loop(
    rig: &Rig,
    agent: &str,
    knobs: &serde_json::Value,
    run_agent: &dyn Fn(&Sluice) -> Run,
) -> Result<String, String> {
    let mut behavior = rig.base.clone();
    behavior["tool_loop"] = json!(true);
    for (k, v) in knobs.as_object().into_iter().flatten() {
        behavior[k] = v.clone();
    }
    rig.mock.set_behavior(&behavior.to_string());
    rig.mock.reset();
    let run = run_agent(&rig.sluice);
    let calls = rig.model_calls();
    let called = calls.iter().position(|r| {
        r["behavior"]["tool_calls"]
            .as_array()
            .is_some_and(|c| !c.is_empty())
    });
    let answered = calls
        .iter()
        .position(|r| r["tool_result"].as_str().is_some_and(printed_marker));
    let mut problems = Vec::new();
    if run.status.is_none_or(|s| !s.success()) {
        problems.push("the agent did not exit 0".to_string());
    }
    if !(run.stdout.contains(DONE_MARKER) && printed_marker(&run.stdout)) {
        problems.push(format!("stdout lacks `{DONE_MARKER} … {TOOL_MARKER}`"));
    }
    match (called, answered) {
        (Some(c), Some(a)) if c < a => {}
        _ => problems.push(format!(
            "the mock did not see a tool call answered by its result (call at {called:?}, \
             result at {answered:?})"
        )),
    }
    if !run.trapped.is_empty() {
        problems.push(format!("the agent tried other hosts:\n{}", run.trapped));
    }
    // The text the model said before its call is in the history it gets back (for the AI
    // SDK's Responses provider: by `item_reference`, resolved from Sluice's store).
    if let (Some(said), Some(a)) = (knobs["tool_loop_text"].as_str(), answered) {
        if !calls[a]["body"].as_str().is_some_and(|b| b.contains(said)) {
            problems.push(format!(
                "the request with the tool result lacks the text said before the call ({said:?})"
            ));
        }
    }
    if problems.is_empty() {
        let tool = called
            .and_then(|c| calls[c]["behavior"]["tool_calls"][0]["name"].as_str())
            .unwrap_or_default();
        // What Sluice left out translating (its info line), for the record.
        let log = rig.sluice.log();
        let mut dropped: Vec<&str> = log
            .lines()
            .filter_map(|l| l.split_once("dropped in translation ").map(|(_, d)| d))
            .collect();
        dropped.dedup();
        return Ok(format!(
            "{:.1} s, {} model calls, tool {tool}, said {:?}; dropped: {dropped:?}",
            run.took.as_secs_f64(),
            calls.len(),
            run.stdout.trim().lines().last().unwrap_or_default()
        ));
    }
    let requests: Vec<String> = calls
        .iter()
        .map(|r| {
            let body = r["body"].as_str().unwrap_or_default();
            format!(
                "  #{} {} {} → {} tool_calls={} tool_result={} body[..600]={}",
                r["seq"],
                r["method"].as_str().unwrap_or_default(),
                r["path"].as_str().unwrap_or_default(),
                r["status"],
                r["behavior"]["tool_calls"],
                r["tool_result"],
                body.get(..600.min(body.len())).unwrap_or(body)
            )
        })
        .collect();
    let sluice_log = rig.sluice.log();
    let refusals: Vec<&str> = sluice_log
        .lines()
        .filter(|l| {
            l.contains("WARN") || l.contains("ERROR") || l.contains(" 4") && l.contains("status=")
        })
        .collect();
    Err(format!(
        "{agent}: {}\n{}\n--- mock requests:\n{}\n--- Sluice warnings and refusals:\n{}",
        problems.join("; "),
        run.describe(),
        requests.join("\n"),
        refusals
            .iter()
            .rev()
            .take(20)
            .rev()
            .copied()
            .collect::<Vec<_>>()
            .join("\n")
    ))
}

/// Runs `agent` through a tool loop on every provider kind; fails naming every kind that
/// failed, with the evidence.
fn on_every_kind(agent: &str, run_agent: &dyn Fn(&Sluice) -> Run) {
    on_every_kind_with(agent, &json!({}), run_agent);
}

/// [`on_every_kind`] with more mock knobs over `tool_loop`.
fn on_every_kind_with(agent: &str, knobs: &serde_json::Value, run_agent: &dyn Fn(&Sluice) -> Run) {
    let mut failures = Vec::new();
    let mut passed = Vec::new();
    let start = Instant::now();
    for (kind, rig) in kinds() {
        let rig = rig();
        match tool_loop(&rig, agent, knobs, run_agent) {
            Ok(summary) => passed.push(format!("  {kind}: {summary}")),
            Err(e) => failures.push(format!("=== {agent} on {kind}: {e}")),
        }
    }
    eprintln!(
        "{agent}: passed on\n{}\nin {:.1} s",
        passed.join("\n"),
        start.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} of {} kinds failed:\n{}",
        failures.len(),
        kinds().len(),
        failures.join("\n\n")
    );
}

#[test]
fn claude_code_runs_a_tool_loop_on_every_provider_kind() {
    let claude = npm_bin("claude");
    on_every_kind("claude code", &|sluice| {
        let work = TempDir::new("claude-work");
        run_isolated(
            sluice,
            work.path(),
            &claude,
            &[
                "-p".into(),
                PROMPT.into(),
                "--model".into(),
                MODEL.into(),
                "--output-format".into(),
                "text".into(),
                // No permission flag: Claude Code runs a read-only command like `echo`
                // without asking.
            ],
            &[
                ("ANTHROPIC_BASE_URL", "http://127.0.0.1:{port}".into()),
                ("ANTHROPIC_API_KEY", KEY.into()),
                ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
                ("DISABLE_AUTOUPDATER", "1".into()),
            ],
            &[],
        )
    });
}

/// Codex's `config.toml`: the gateway as its model provider, no retries, nothing optional
/// that reaches out (update checks, analytics); `{port}` for the base URL's port.
fn codex_config() -> String {
    format!(
        r#"model = "{MODEL}"
model_provider = "sluice"
check_for_update_on_startup = false

[analytics]
enabled = false

[model_providers.sluice]
name = "sluice"
base_url = "http://127.0.0.1:{{port}}/v1"
env_key = "SLUICE_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
"#
    )
}

#[test]
fn codex_runs_a_tool_loop_on_every_provider_kind() {
    let codex = npm_bin("codex");
    on_every_kind("codex", &|sluice| {
        let work = TempDir::new("codex-work");
        let home = TempDir::new("codex-home");
        run_isolated(
            sluice,
            work.path(),
            &codex,
            &[
                "exec".into(),
                "--skip-git-repo-check".into(),
                // Codex's own sandbox as shipped (read-only for `codex exec`: echo may run);
                // no plugins, which would be fetched.
                "--disable".into(),
                "plugins".into(),
                "--color".into(),
                "never".into(),
                PROMPT.into(),
            ],
            &[
                ("CODEX_HOME", home.path().display().to_string()),
                ("SLUICE_KEY", KEY.into()),
            ],
            &[(home.path().join("config.toml"), codex_config())],
        )
    });
}

/// Codex as shipped with its provider marked `supports_websockets = true` (its
/// `OpenAI-Beta: responses_websockets=…` transport): it opens a Responses WebSocket on
/// Sluice and runs the whole tool loop over it, each model call a `response.create` on the
/// socket (access lines `<socket id>.<n>`; the socket's own line has status 101), on every
/// provider kind.
#[test]
fn codex_runs_a_tool_loop_over_the_responses_websocket_mode_on_every_provider_kind() {
    let codex = npm_bin("codex");
    let config = format!("{}supports_websockets = true\n", codex_config());
    on_every_kind("codex (websocket)", &|sluice| {
        let work = TempDir::new("codex-work");
        let home = TempDir::new("codex-home");
        let run = run_isolated(
            sluice,
            work.path(),
            &codex,
            &[
                "exec".into(),
                "--skip-git-repo-check".into(),
                "--disable".into(),
                "plugins".into(),
                "--color".into(),
                "never".into(),
                PROMPT.into(),
            ],
            &[
                ("CODEX_HOME", home.path().display().to_string()),
                ("SLUICE_KEY", KEY.into()),
            ],
            &[(home.path().join("config.toml"), config.clone())],
        );
        let log = sluice.log();
        let sockets: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("sluice::access") && l.contains(" status=101 "))
            .filter_map(|l| l.split("request_id=").nth(1))
            .filter_map(|r| r.split_whitespace().next())
            .collect();
        assert!(
            !sockets.is_empty(),
            "codex did not open a WebSocket:\n{log}"
        );
        // Its model calls, one response after another on a socket (not over HTTP).
        assert!(
            sockets
                .iter()
                .any(|s| log.contains(&format!("request_id={s}.2 "))),
            "codex's model calls were not responses on its socket:\n{log}"
        );
        assert!(
            !log.contains(" status=4"),
            "a response on the socket was refused:\n{log}"
        );
        run
    });
}

/// The reasoning items (`encrypted_content`, summary text) of a logged Responses request's
/// `input`, in order.
fn reasoning_items(call: &serde_json::Value) -> Vec<(String, String)> {
    let body: serde_json::Value =
        serde_json::from_str(call["body"].as_str().unwrap_or_default()).unwrap_or_default();
    body["input"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["type"] == "reasoning")
        .map(|i| {
            (
                i["encrypted_content"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                i["summary"][0]["text"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect()
}

/// Codex as shipped, two turns (a tool loop, then `codex exec resume --last`) through a
/// route that speaks OpenAI Responses (OpenAI's and Azure OpenAI's): every answer carries a
/// reasoning item with `encrypted_content`, and every later request carries the earlier
/// reasoning items back in its `input`, unchanged, with `store: false` (Sluice keeps the
/// conversation; the provider keeps nothing).
#[test]
#[expect(
    clippy::too_many_lines,
    reason = "two agent turns on two kinds, then every request's history checked in order"
)]
fn codex_keeps_its_reasoning_items_across_turns_on_a_responses_route() {
    const THOUGHT: &str = "I should run the command before answering.";
    let codex = npm_bin("codex");
    for (kind, make) in [
        ("openai-responses", battery::openai_responses_rig as MakeRig),
        ("azure-responses", battery::azure_responses_rig),
    ] {
        let rig = make();
        let mut behavior = rig.base.clone();
        behavior["tool_loop"] = json!(true);
        behavior["reasoning"] = json!(THOUGHT);
        rig.mock.set_behavior(&behavior.to_string());
        rig.mock.reset();
        let work = TempDir::new("codex-work");
        let home = TempDir::new("codex-home");
        let run = |args: &[&str]| {
            let mut all: Vec<String> = vec!["exec".into()];
            all.extend(args.iter().map(|a| (*a).to_string()));
            run_isolated(
                &rig.sluice,
                work.path(),
                &codex,
                &all,
                &[
                    ("CODEX_HOME", home.path().display().to_string()),
                    ("SLUICE_KEY", KEY.into()),
                ],
                &[(home.path().join("config.toml"), codex_config())],
            )
        };
        let common = [
            "--skip-git-repo-check",
            "--disable",
            "plugins",
            "--color",
            "never",
        ];
        let mut first: Vec<&str> = common.to_vec();
        first.push(PROMPT);
        let turn1 = run(&first);
        assert!(
            turn1.status.is_some_and(|s| s.success()) && printed_marker(&turn1.stdout),
            "{kind}: turn 1: {}",
            turn1.describe()
        );
        // `--color` is `codex exec`'s own, before its `resume` subcommand.
        let second = [
            "--color",
            "never",
            "resume",
            "--last",
            "--skip-git-repo-check",
            "--disable",
            "plugins",
            "Say it once more.",
        ];
        let turn2 = run(&second);
        assert!(
            turn2.status.is_some_and(|s| s.success()),
            "{kind}: turn 2: {}",
            turn2.describe()
        );
        assert!(turn1.trapped.is_empty() && turn2.trapped.is_empty());

        let calls = rig.model_calls();
        assert!(
            calls.len() >= 3,
            "{kind}: {} model calls: {calls:?}",
            calls.len()
        );
        for c in &calls {
            let body: serde_json::Value =
                serde_json::from_str(c["body"].as_str().unwrap_or_default()).unwrap_or_default();
            assert_eq!(body["store"], false, "{kind}: the provider keeps nothing");
            assert!(body.get("previous_response_id").is_none(), "{kind}");
            assert!(
                body["include"]
                    .as_array()
                    .is_some_and(|i| i.contains(&json!("reasoning.encrypted_content"))),
                "{kind}: {body}"
            );
        }
        // The first call has no history; every later one carries each earlier answer's
        // reasoning item back, in order, its encrypted content as the mock wrote it.
        assert!(reasoning_items(&calls[0]).is_empty(), "{kind}");
        let mut seen: Vec<String> = Vec::new();
        for (n, c) in calls.iter().enumerate().skip(1) {
            let items = reasoning_items(c);
            let sigs: Vec<String> = items.iter().map(|(s, _)| s.clone()).collect();
            assert!(
                sigs.len() >= n.min(2) && sigs.starts_with(&seen),
                "{kind}: call {n} carries the earlier reasoning {seen:?}, got {sigs:?}"
            );
            for (sig, text) in &items {
                assert!(sig.starts_with("mock-signature-resp_mock"), "{kind}: {sig}");
                assert_eq!(text.trim(), THOUGHT, "{kind}");
            }
            seen = sigs;
        }
        let distinct: std::collections::BTreeSet<&String> = seen.iter().collect();
        assert_eq!(
            distinct.len(),
            seen.len(),
            "{kind}: one item per answer: {seen:?}"
        );
    }
}

/// The text the mock answers the SDKs' requests with.
const SDK_TEXT: &str = "Hello from the mock, through Sluice.";

/// Sluice with an OpenAI-compatible route (`acme/gpt`) and an Anthropic one
/// (`acme/claude`), both on `mock`.
fn two_routes(mock: &Mock) -> Sluice {
    let url = mock.base_url();
    Sluice::start(&format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\ntenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n  oa:\n    kind: openai\n    base_url: {url}\n    api_key: sk-provider-oa\n    health_check: {{enabled: false}}\n  claude:\n    kind: anthropic\n    base_url: {url}\n    api_key: sk-ant-provider\n    health_check: {{enabled: false}}\nmodels:\n  acme/gpt:\n    routes:\n      - {{provider: oa, upstream_model: gpt-mock-1}}\n  acme/claude:\n    default_max_tokens: 1024\n    routes:\n      - {{provider: claude, upstream_model: claude-mock-1}}\n"
    ))
}

/// The lines a client script prints for its four calls: `<provider> <mode> <JSON text> …`.
fn check_sdk_lines(client: &str, run: &Run, modes: [&str; 2]) {
    assert!(
        run.status.is_some_and(|s| s.success()) && run.trapped.is_empty(),
        "{client} failed:\n{}",
        run.describe()
    );
    let want = serde_json::to_string(SDK_TEXT).expect("json");
    for provider in ["openai-chat", "anthropic"] {
        for mode in modes {
            let prefix = format!("{provider} {mode} {want}");
            assert!(
                run.stdout.lines().any(|l| l.starts_with(&prefix)),
                "{client}: no line `{prefix}`:\n{}",
                run.describe()
            );
        }
    }
}

#[test]
fn langchain_and_the_vercel_ai_sdk_plain_and_streamed() {
    let _node_checked = npm_bin("codex");
    assert!(
        agents_dir().join("node_modules/ai").exists(),
        "the Vercel AI SDK is missing: {INSTALL}"
    );
    let mock = Mock::start(&json!({ "text": SDK_TEXT }).to_string());
    let sluice = two_routes(&mock);
    let work = TempDir::new("sdk-work");
    let base = "http://127.0.0.1:{port}".to_string();
    let args = |script: String| -> Vec<String> {
        vec![
            script,
            base.clone(),
            KEY.into(),
            "acme/gpt".into(),
            "acme/claude".into(),
        ]
    };
    // The Vercel AI SDK: its OpenAI Chat provider and its Anthropic provider.
    let node = PathBuf::from("node");
    let script = agents_dir().join("vercel_ai.mjs").display().to_string();
    let vercel = run_isolated(&sluice, work.path(), &node, &args(script), &[], &[]);
    check_sdk_lines("the Vercel AI SDK", &vercel, ["generate", "stream"]);
    // LangChain: ChatOpenAI and ChatAnthropic.
    let python = crate::sdk::python();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/sdk/langchain_client.py")
        .display()
        .to_string();
    let langchain = run_isolated(
        &sluice,
        work.path(),
        &python,
        &args(script),
        &[("PYTHONDONTWRITEBYTECODE", "1".into())],
        &[],
    );
    check_sdk_lines("LangChain", &langchain, ["invoke", "stream"]);
    // Every call reached the mock: 2 providers × 2 calls × 2 clients.
    let calls = mock.log().len();
    assert_eq!(calls, 8, "mock requests: {:#?}", mock.log());
}

/// The Vercel AI SDK's Responses provider, as a user sets it up: `openai.responses(model)`,
/// nothing else (no `store: false`).
fn vercel_responses(sluice: &Sluice) -> Run {
    let work = TempDir::new("ai-sdk-responses");
    let script = agents_dir()
        .join("vercel_ai_responses.mjs")
        .display()
        .to_string();
    run_isolated(
        sluice,
        work.path(),
        &PathBuf::from("node"),
        &[
            script,
            "http://127.0.0.1:{port}".into(),
            KEY.into(),
            MODEL.into(),
            PROMPT.into(),
        ],
        &[],
        &[],
    )
}

/// Issue 29, item 2: the AI SDK's Responses provider leaves `store` at its default (true),
/// so step 2 of its tool loop names step 1's function call by `item_reference`; Sluice
/// resolves it from the response store, whatever the provider kind behind the model.
/// `generateText` and `streamText` both run the loop (the script exits 1 if either fails).
#[test]
fn the_vercel_ai_sdk_responses_provider_with_its_defaults_runs_a_tool_loop_on_every_provider_kind()
{
    let _node_checked = npm_bin("codex");
    on_every_kind_with(
        "the Vercel AI SDK (Responses)",
        &json!({ "tool_loop_text": PREAMBLE }),
        &vercel_responses,
    );
}

/// What the mock says before its tool call: step 2 of the AI SDK's loop names this text by
/// `item_reference` (the SDK sends text items of a stored response by reference).
const PREAMBLE: &str = "I will run the command.";

/// The same loop with the response store off fails at step 2 on the item reference (the
/// 400 names it): the loop above depends on the store, not on the SDK resending items.
#[test]
fn without_the_response_store_the_ai_sdks_item_reference_is_refused_by_name() {
    let _node_checked = npm_bin("codex");
    let mock = Mock::start(&json!({ "tool_loop": true, "tool_loop_text": PREAMBLE }).to_string());
    let url = mock.base_url();
    let sluice = Sluice::start(&format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\ntenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n  oa:\n    kind: openai\n    base_url: {url}\n    api_key: sk-provider-oa\n    health_check: {{enabled: false}}\nmodels:\n  {MODEL}:\n    routes:\n      - {{provider: oa, upstream_model: gpt-mock-1}}\nresponse_store:\n  enabled: false\n"
    ));
    let run = vercel_responses(&sluice);
    assert!(
        run.status.is_some_and(|s| !s.success()),
        "the loop passed without the store:\n{}",
        run.describe()
    );
    assert!(
        run.stderr.contains(".type`: there is no response storage"),
        "the refusal does not name the item reference:\n{}",
        run.describe()
    );
    // Step 1 was answered (a tool call), step 2 never reached the upstream.
    assert_eq!(mock.log().len(), 1, "{:#?}", mock.log());
}
