//! Hot reload as operators use it: `SIGHUP` on its own (the watcher switched off, so it is
//! not what reloads), a broken file that keeps the old config (still served; the error with
//! file:line:key logged; `sluice_config_reloads_total{result="error"}` counted once), the
//! watcher following the config file and its includes (also outside the config's folder) but
//! not an unrelated YAML next to it, and one edit plus `SIGHUP` being one reload.

use std::time::Duration;

use crate::harness::{eventually, Mock, Sluice, TempDir, KEY};

/// The value of the exact series `series` (name and labels as rendered), if it is exported.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        l.strip_prefix(series)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    })
}

fn reloads(sluice: &Sluice, result: &str) -> f64 {
    sample(
        &sluice.metrics(),
        &format!("sluice_config_reloads_total{{result=\"{result}\"}}"),
    )
    .unwrap_or(-1.0)
}

/// One model `model` on provider `p1` at `base_url`; `extra_server` goes under `server:`.
fn config(base_url: &str, model: &str, extra_server: &str) -> String {
    format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 1\n{extra_server}tenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n  p1:\n    kind: openai\n    base_url: {base_url}\n    api_key: sk-provider-secret-p1\n    health_check: {{enabled: false}}\nmodels:\n  {model}:\n    routes:\n      - provider: p1\n        upstream_model: mock-small-v1\n"
    )
}

fn chat_status(sluice: &Sluice, model: &str) -> u16 {
    sluice
        .chat(&format!(
            r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#
        ))
        .status
}

/// Longer than the watcher's debounce (250 ms) plus a reload, with room for a busy machine.
const SETTLE: Duration = Duration::from_millis(1500);

#[test]
fn sighup_alone_reloads_the_config() {
    let mock = Mock::start("{}");
    let off = "  watch_config: false\n";
    let sluice = Sluice::start(&config(&mock.base_url(), "acme/old", off));
    assert_eq!(chat_status(&sluice, "acme/old"), 200);
    sluice.rewrite_config(&config(&mock.base_url(), "acme/new", off));
    // The watcher is off: nothing changes until the signal.
    std::thread::sleep(SETTLE);
    assert_eq!(reloads(&sluice, "ok"), 0.0, "{}", sluice.log());
    assert_eq!(chat_status(&sluice, "acme/old"), 200);
    assert_eq!(chat_status(&sluice, "acme/new"), 404);

    sluice.signal("HUP");
    assert!(
        eventually(Duration::from_secs(5), || reloads(&sluice, "ok") == 1.0),
        "{}",
        sluice.log()
    );
    assert_eq!(chat_status(&sluice, "acme/new"), 200);
    assert_eq!(chat_status(&sluice, "acme/old"), 404);
    assert!(
        sluice.log().contains("SIGHUP: reloading"),
        "{}",
        sluice.log()
    );
    // A second SIGHUP with the file unchanged reloads nothing.
    sluice.signal("HUP");
    assert!(eventually(Duration::from_secs(5), || sluice
        .log()
        .contains("unchanged since the last reload")));
    assert_eq!(reloads(&sluice, "ok"), 1.0);
}

#[test]
fn a_broken_file_keeps_the_old_config() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&config(&mock.base_url(), "acme/chat", ""));
    assert_eq!(reloads(&sluice, "error"), 0.0);
    // The route names a provider that does not exist (line 19 of the file, column 9).
    let broken = config(&mock.base_url(), "acme/chat", "")
        .replace("      - provider: p1\n", "      - provider: nope\n");
    assert!(broken.contains("provider: nope"));
    sluice.rewrite_config(&broken);
    sluice.signal("HUP");
    assert!(
        eventually(Duration::from_secs(5), || reloads(&sluice, "error") == 1.0),
        "{}",
        sluice.log()
    );
    let log = sluice.log();
    let path = sluice.config_path.display().to_string();
    let line = log
        .lines()
        .find(|l| l.contains("config reload rejected, keeping the previous config"))
        .unwrap_or_else(|| panic!("no rejection logged:\n{log}"));
    assert!(
        line.contains(&format!(
            "{path}:19:9: models.acme/chat.routes[0].provider:"
        )),
        "{line}"
    );
    assert!(line.contains("nope"), "{line}");
    // Still served by the old config.
    let r = sluice.chat(r#"{"model":"acme/chat","messages":[{"role":"user","content":"hi"}]}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-sluice-provider"), Some("p1"));
    // The watcher saw the same edit: still one rejection, and no reload.
    std::thread::sleep(SETTLE);
    assert_eq!(reloads(&sluice, "error"), 1.0, "{}", sluice.log());
    assert_eq!(reloads(&sluice, "ok"), 0.0);
    // Fixing the file reloads (through the watcher).
    sluice.rewrite_config(&config(&mock.base_url(), "acme/fixed", ""));
    assert!(
        eventually(Duration::from_secs(5), || reloads(&sluice, "ok") == 1.0),
        "{}",
        sluice.log()
    );
    assert_eq!(chat_status(&sluice, "acme/fixed"), 200);
}

#[test]
fn an_unrelated_yaml_next_to_the_config_does_not_reload() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&config(&mock.base_url(), "acme/chat", ""));
    let dir = sluice.dir.path();
    std::fs::write(dir.join("other.yaml"), "unrelated: true\n").expect("write");
    std::fs::create_dir_all(dir.join("sub")).expect("mkdir");
    std::fs::write(dir.join("sub/deeper.yaml"), "unrelated: true\n").expect("write");
    std::thread::sleep(SETTLE);
    std::fs::write(dir.join("other.yaml"), "unrelated: again\n").expect("write");
    std::thread::sleep(SETTLE);
    assert_eq!(reloads(&sluice, "ok"), 0.0, "{}", sluice.log());
    assert!(!sluice.log().contains("reloading"), "{}", sluice.log());
    // The config itself is watched (no signal here).
    sluice.rewrite_config(&config(&mock.base_url(), "acme/edited", ""));
    assert!(
        eventually(Duration::from_secs(5), || reloads(&sluice, "ok") == 1.0),
        "{}",
        sluice.log()
    );
    assert_eq!(chat_status(&sluice, "acme/edited"), 200);
}

#[test]
fn one_edit_plus_sighup_is_one_reload() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&config(&mock.base_url(), "acme/chat", ""));
    sluice.rewrite_config(&config(&mock.base_url(), "acme/edited", ""));
    sluice.signal("HUP");
    assert!(eventually(Duration::from_secs(5), || reloads(
        &sluice, "ok"
    ) >= 1.0));
    std::thread::sleep(SETTLE);
    assert_eq!(reloads(&sluice, "ok"), 1.0, "{}", sluice.log());
    assert_eq!(chat_status(&sluice, "acme/edited"), 200);
}

#[test]
fn an_include_outside_the_config_folder_is_watched() {
    let mock = Mock::start("{}");
    let shared = TempDir::new("shared-include");
    let inc = shared.path().join("provider.yaml");
    let provider = |key: &str| {
        format!(
            "providers:\n  p1:\n    kind: openai\n    base_url: {}\n    api_key: {key}\n    health_check: {{enabled: false}}\n",
            mock.base_url()
        )
    };
    std::fs::write(&inc, provider("sk-first-key")).expect("write include");
    let main = format!(
        "include: [\"{}\"]\nserver:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 1\ntenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nmodels:\n  acme/chat:\n    routes:\n      - provider: p1\n        upstream_model: mock-small-v1\n",
        inc.display()
    );
    let sluice = Sluice::start(&main);
    assert_eq!(chat_status(&sluice, "acme/chat"), 200);
    std::fs::write(&inc, provider("sk-second-key")).expect("rewrite include");
    assert!(
        eventually(Duration::from_secs(5), || reloads(&sluice, "ok") == 1.0),
        "{}",
        sluice.log()
    );
    mock.reset();
    assert_eq!(chat_status(&sluice, "acme/chat"), 200);
    let log = mock.log();
    assert_eq!(
        log[0]["headers"]["authorization"], "Bearer sk-second-key",
        "{log:?}"
    );
}

#[test]
fn counters_with_config_label_sets_are_exported_at_zero() {
    let p1 = Mock::start("{}");
    let p2 = Mock::start("{}");
    let two = |extra_provider: &str| {
        format!(
            "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 1\ntenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n  p1:\n    kind: openai\n    base_url: {}\n    health_check: {{enabled: false}}\n  p2:\n    kind: openai\n    base_url: {}\n    health_check: {{enabled: false}}\n{extra_provider}models:\n  acme/chat:\n    routes:\n      - provider: p1\n        upstream_model: m1\n        priority: 1\n      - provider: p2\n        upstream_model: m2\n        priority: 2\n",
            p1.base_url(),
            p2.base_url()
        )
    };
    let sluice = Sluice::start(&two(""));
    let m = sluice.metrics();
    for series in [
        r#"sluice_fallback_total{from_provider="p1",model="acme/chat",reason="status_5xx",to_provider="p2"}"#,
        r#"sluice_fallback_total{from_provider="p2",model="acme/chat",reason="connect",to_provider="p1"}"#,
        r#"sluice_fallback_total{from_provider="p1",model="acme/chat",reason="first_event_timeout",to_provider="p2"}"#,
        r#"sluice_upstream_retries_total{provider="p1",reason="connect"}"#,
        r#"sluice_upstream_retries_total{provider="p2",reason="status_5xx"}"#,
        r#"sluice_heartbeats_total{provider="p1"}"#,
        r#"sluice_heartbeats_total{provider="p2"}"#,
        r#"sluice_upstream_attempts_total{outcome="ok",provider="p2"}"#,
        r#"sluice_upstream_attempts_total{outcome="status_429",provider="p1"}"#,
        r#"sluice_requests_total{model="acme/chat",status="200"}"#,
        r#"sluice_requests_total{model="acme/chat",status="502"}"#,
        r#"sluice_requests_total{model="none",status="401"}"#,
        r#"sluice_sse_invalid_utf8_total{provider="p1"}"#,
        r#"sluice_sse_invalid_utf8_total{provider="p2"}"#,
        r#"sluice_stream_errors_total{reason="upstream_broken"}"#,
        r#"sluice_stream_errors_total{reason="idle_timeout"}"#,
        r#"sluice_stream_errors_total{reason="shutdown"}"#,
    ] {
        assert_eq!(sample(&m, series), Some(0.0), "{series} missing:\n{m}");
    }
    // Per tenant × model nothing is made before the pair's first request (the config's
    // product would be its size); then every kind exists, at 0 where nothing was counted.
    assert!(!m.contains("sluice_tokens_total{"), "{m}");
    assert_eq!(chat_status(&sluice, "acme/chat"), 200);
    // Metering runs when the request's log phase ends, just after the answer reached the
    // client: wait for it rather than scrape before it.
    let metered = r#"sluice_charge_usd_total{model="acme/chat",tenant="t"}"#;
    assert!(eventually(Duration::from_secs(5), || sample(
        &sluice.metrics(),
        metered
    )
    .is_some()));
    let m = sluice.metrics();
    for series in [
        r#"sluice_tokens_total{kind="input",model="acme/chat",tenant="t"}"#,
        r#"sluice_tokens_total{kind="cached_input",model="acme/chat",tenant="t"}"#,
        r#"sluice_tokens_total{kind="cache_write",model="acme/chat",tenant="t"}"#,
        r#"sluice_cost_usd_total{model="acme/chat",tenant="t"}"#,
        r#"sluice_charge_usd_total{model="acme/chat",tenant="t"}"#,
    ] {
        assert!(sample(&m, series).is_some(), "{series} missing:\n{m}");
    }
    // A provider added by a reload gets its series too.
    let p3 = format!(
        "  p3:\n    kind: openai\n    base_url: {}\n    health_check: {{enabled: false}}\n",
        p1.base_url()
    );
    sluice.rewrite_config(&two(&p3));
    sluice.signal("HUP");
    assert!(eventually(Duration::from_secs(5), || sample(
        &sluice.metrics(),
        r#"sluice_heartbeats_total{provider="p3"}"#
    ) == Some(0.0)));
    assert_eq!(
        sample(
            &sluice.metrics(),
            r#"sluice_sse_invalid_utf8_total{provider="p3"}"#
        ),
        Some(0.0)
    );
}

#[test]
fn a_sighup_right_after_start_neither_kills_sluice_nor_is_lost() {
    let mock = Mock::start("{}");
    let mut sluice = Sluice::start(&config(&mock.base_url(), "acme/chat", ""));
    // The listeners are up; the reload service may not be running yet.
    sluice.rewrite_config(&config(&mock.base_url(), "acme/edited", ""));
    sluice.signal("HUP");
    assert!(
        sluice.wait_exit(Duration::from_millis(500)).is_none(),
        "SIGHUP killed sluice:\n{}",
        sluice.log()
    );
    assert!(
        eventually(Duration::from_secs(5), || reloads(&sluice, "ok") == 1.0),
        "{}",
        sluice.log()
    );
    assert_eq!(chat_status(&sluice, "acme/edited"), 200);
}

/// Under load: streams held open across many reloads, valid and broken alternately, all end
/// complete; a client polling throughout is always served; every broken file is rejected
/// with its file, line and key while the last good config keeps serving; a reload that
/// changes a listener says that it needs an upgrade (and keeps serving on the old one).
#[test]
fn streams_survive_many_reloads_valid_and_broken_alternately() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let mock = Mock::start("{}");
    let good = |i: usize| {
        // Valid variations: the queue size changes, the model stays.
        config(
            &mock.base_url(),
            "acme/chat",
            &format!("  queue_size: {}\n", 100 + i),
        )
    };
    let broken = good(0).replace("      - provider: p1\n", "      - provider: nope\n");
    let sluice = Sluice::start(&good(0));
    // 8 streams of 60 tokens, 100 ms apart (about 6 s each).
    let mut streams: Vec<_> = (0..8)
        .map(|_| {
            let s = sluice.chat_stream(&crate::cancellation::chat_body(
                true,
                r#"{"tokens":60,"token_delay_ms":100}"#,
            ));
            assert_eq!(s.status, 200);
            s
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let poller = {
        let (stop, addr) = (stop.clone(), sluice.addr);
        std::thread::spawn(move || {
            let (mut ok, mut failed) = (0, Vec::new());
            while !stop.load(Ordering::SeqCst) {
                let r = crate::harness::post_json(
                    addr,
                    "/v1/chat/completions",
                    &[("authorization", &format!("Bearer {KEY}"))],
                    &crate::cancellation::chat_body(false, "{}"),
                );
                if r.status == 200 {
                    ok += 1;
                } else {
                    failed.push(format!("{}: {}", r.status, r.text()));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            (ok, failed)
        })
    };
    // 10 reloads through the watcher, alternately broken and valid.
    for i in 0..10 {
        let (yaml, result) = if i % 2 == 0 {
            (broken.clone(), "error")
        } else {
            (good(i), "ok")
        };
        let before = reloads(&sluice, result).max(0.0);
        sluice.rewrite_config(&yaml);
        assert!(
            eventually(Duration::from_secs(5), || reloads(&sluice, result) > before),
            "reload {i} ({result}) not seen:\n{}",
            sluice.log()
        );
    }
    assert_eq!(reloads(&sluice, "error"), 5.0);
    assert_eq!(reloads(&sluice, "ok"), 5.0);
    let log = sluice.log();
    let path = sluice.config_path.display().to_string();
    let rejections: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("config reload rejected, keeping the previous config"))
        .collect();
    assert_eq!(rejections.len(), 5, "{log}");
    for l in &rejections {
        assert!(
            l.contains(&format!(
                "{path}:20:9: models.acme/chat.routes[0].provider:"
            )),
            "{l}"
        );
    }
    // Every stream ends complete: 60 tokens and the terminator.
    let want: String = (0..60).map(|i| format!("tok{i} ")).collect();
    for s in &mut streams {
        let body = s.read_to_end(Duration::from_secs(10));
        assert!(s.is_done(), "a stream was cut across the reloads");
        assert_eq!(crate::harness::client::sse_text(&body), want);
    }
    stop.store(true, Ordering::SeqCst);
    let (ok, failed) = poller.join().expect("poller");
    assert!(failed.is_empty(), "refused during reloads: {failed:?}");
    assert!(ok >= 10, "only {ok} polls");

    // A listener change is not applied by a reload: the log says an upgrade is needed.
    let moved = good(99).replace("{listen}", "127.0.0.1:1");
    std::fs::write(
        &sluice.config_path,
        moved.replace("{admin}", &sluice.admin.to_string()),
    )
    .expect("rewrite");
    assert!(
        eventually(Duration::from_secs(5), || sluice.log().contains(
            "server.listen only take effect after a restart or graceful upgrade"
        )),
        "{}",
        sluice.log()
    );
    assert_eq!(chat_status(&sluice, "acme/chat"), 200);
}
