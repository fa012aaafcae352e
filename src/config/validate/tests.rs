//! Tests of config validation: messages, locations and defaults.

use super::*;

fn load_str(yaml: &str) -> Result<Config, ConfigError> {
    let dir = std::env::temp_dir().join(format!("sluice-cfg-{}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("sluice.yaml");
    std::fs::write(&p, yaml).unwrap();
    let r = load(&p);
    let _ = std::fs::remove_dir_all(&dir);
    r
}

const MINIMAL: &str = "server:\n  listen: 127.0.0.1:8080\n  admin_listen: 127.0.0.1:9090\ntenants:\n  team-a: {}\nvirtual_keys:\n  - key: sk-sluice-team-a-0001\n    tenant: team-a\nproviders:\n  local-mock:\n    kind: openai\n    base_url: http://127.0.0.1:18000/v1\n    api_key: test-key\nmodels:\n  acme/chat-small:\n    routes:\n      - provider: local-mock\n        upstream_model: mock-small-v1\n        priority: 10\n";

#[test]
fn minimal_contract_loads() {
    let c = load_str(MINIMAL).unwrap();
    let p = &c.providers["local-mock"];
    let ep = p.endpoint.as_ref().unwrap();
    assert_eq!(
        (ep.host.as_str(), ep.port, ep.base_path.as_str(), ep.tls),
        ("127.0.0.1", 18000, "/v1", false)
    );
    assert_eq!(
        c.models["acme/chat-small"].routes[0].upstream_model,
        "mock-small-v1"
    );
    assert!(c.keys.authenticate("sk-sluice-team-a-0001").is_some());
    assert!(c.server.threads >= 1);
    assert!(
        c.server.work_stealing,
        "Pingora's default runtime unless asked"
    );
}

#[test]
fn work_stealing_can_be_turned_off_and_must_be_a_bool() {
    let off = MINIMAL.replacen("server:\n", "server:\n  work_stealing: false\n", 1);
    assert_ne!(off, MINIMAL, "MINIMAL has a server section");
    assert!(!load_str(&off).unwrap().server.work_stealing);
    let bad = MINIMAL.replacen("server:\n", "server:\n  work_stealing: sometimes\n", 1);
    let err = load_str(&bad).unwrap_err().to_string();
    assert!(err.contains("work_stealing"), "{err}");
}

#[test]
fn the_ledger_defaults_to_sqlite_in_the_working_directory_and_its_keys_are_checked() {
    use crate::config::ledger::{Backend, LedgerSettings};
    let c = load_str(MINIMAL).unwrap();
    assert_eq!(c.ledger, LedgerSettings::default());
    assert_eq!(
        c.ledger.backend,
        Backend::Sqlite {
            path: "sluice-usage.db".into()
        }
    );
    assert_eq!(c.ledger.flush_interval, Duration::from_millis(200));
    let set = format!(
            "{MINIMAL}ledger:\n  path: /var/lib/sluice/usage.db\n  flush_interval_ms: 50\n  queue_capacity: 7\n"
        );
    let c = load_str(&set).unwrap();
    assert_eq!(
        c.ledger.backend,
        Backend::Sqlite {
            path: "/var/lib/sluice/usage.db".into()
        }
    );
    assert_eq!(
        (c.ledger.flush_interval, c.ledger.queue_capacity),
        (Duration::from_millis(50), 7)
    );
    let pg = format!("{MINIMAL}ledger: {{url: \"postgres://u:pw@127.0.0.1:5432/usage\"}}\n");
    let c = load_str(&pg).unwrap();
    assert!(matches!(c.ledger.backend, Backend::Postgres { .. }));
    assert!(!format!("{:?} {}", c.ledger, c.ledger.backend).contains("pw@"));
    // `enabled` defaults to true; `false` keeps the rest (checked, unused).
    assert!(c.ledger.enabled);
    let off = load_str(&format!(
        "{MINIMAL}ledger: {{enabled: false, path: /var/lib/sluice/usage.db}}\n"
    ))
    .unwrap();
    assert!(!off.ledger.enabled);
    assert_eq!(
        off.ledger.backend,
        Backend::Sqlite {
            path: "/var/lib/sluice/usage.db".into()
        }
    );

    // file:line:col: key: message, like every other key.
    for (yaml, key, line, msg) in [
        (
            "ledger:\n  path: a.db\n  url: postgres://h/db\n",
            "ledger.url",
            22,
            "not both",
        ),
        (
            "ledger:\n  url: mysql://h/db\n",
            "ledger.url",
            21,
            "postgres://",
        ),
        (
            "ledger:\n  url: postgres://h/db?sslmode=require\n",
            "ledger.url",
            21,
            "sslmode=require",
        ),
        (
            "ledger:\n  flush_interval_ms: 0\n",
            "ledger.flush_interval_ms",
            21,
            "greater than 0",
        ),
        (
            "ledger:\n  queue_capacity: 0\n",
            "ledger.queue_capacity",
            21,
            "at least 1",
        ),
        (
            "ledger:\n  pth: x\n",
            "ledger.pth",
            21,
            "unknown field `pth`",
        ),
    ] {
        let e = load_str(&format!("{MINIMAL}{yaml}")).unwrap_err();
        assert_eq!(e.key_path, key, "{e}");
        assert_eq!(e.line, Some(line), "{e}");
        assert!(e.to_string().contains(msg), "{e}");
    }
}

#[test]
fn the_admin_token_comes_from_the_named_variable_which_must_be_set() {
    assert!(load_str(MINIMAL).unwrap().server.admin_token.is_none());
    let yaml = MINIMAL.replace(
        "  admin_listen: 127.0.0.1:9090\n",
        "  admin_listen: 127.0.0.1:9090\n  admin_token_env: SLUICE_TEST_SURELY_UNSET_ADMIN_TOKEN\n",
    );
    let e = load_str(&yaml).unwrap_err();
    assert_eq!(e.key_path, "server.admin_token_env", "{e}");
    assert_eq!(e.line, Some(4), "{e}");
    assert!(
        e.to_string()
            .contains("SLUICE_TEST_SURELY_UNSET_ADMIN_TOKEN"),
        "{e}"
    );
}

#[test]
fn sluice_usage_reads_the_ledger_section_alone() {
    // Provider keys from unset variables, unknown sections: none of it matters here.
    let dir = std::env::temp_dir().join(format!("sluice-cfg-{}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("sluice.yaml");
    std::fs::write(
            &p,
            "providers:\n  o: {kind: openai, base_url: https://x/v1, api_key_env: SLUICE_SURELY_UNSET}\nledger:\n  path: /tmp/u.db\n",
        )
        .unwrap();
    let l = load_ledger(&p).unwrap();
    assert_eq!(
        l.backend,
        crate::config::ledger::Backend::Sqlite {
            path: "/tmp/u.db".into()
        }
    );
    std::fs::write(&p, "server: {}\nledger:\n  flush_interval_ms: 0\n").unwrap();
    let e = load_ledger(&p).unwrap_err();
    assert_eq!(
        (e.key_path.as_str(), e.line),
        ("ledger.flush_interval_ms", Some(3)),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn max_event_bytes_is_its_own_limit() {
    let c = load_str(MINIMAL).unwrap();
    assert_eq!(c.server.max_event_bytes, 8 * 1024 * 1024);
    assert_eq!(c.server.max_buffered_bytes_per_stream, 65_536);
    let set = MINIMAL.replace(
        "  admin_listen: 127.0.0.1:9090\n",
        "  admin_listen: 127.0.0.1:9090\n  max_event_bytes: 300000\n",
    );
    assert_eq!(load_str(&set).unwrap().server.max_event_bytes, 300_000);
    let bad = MINIMAL.replace(
        "  admin_listen: 127.0.0.1:9090\n",
        "  admin_listen: 127.0.0.1:9090\n  max_event_bytes: 100\n",
    );
    let e = load_str(&bad).unwrap_err();
    assert_eq!(e.key_path, "server.max_event_bytes", "{e}");
}

#[test]
fn hostile_client_bounds_default_and_are_checked() {
    let c = load_str(MINIMAL).unwrap();
    assert_eq!(c.server.max_buffered_request_bytes, 256 * 1024 * 1024);
    assert_eq!(c.server.header_read_timeout, Duration::from_secs(30));
    assert_eq!(c.server.body_read_timeout, Duration::from_secs(60));
    let small = MINIMAL.replace(
            "  admin_listen: 127.0.0.1:9090\n",
            "  admin_listen: 127.0.0.1:9090\n  max_request_body_bytes: 2000\n  max_buffered_request_bytes: 3999\n",
        );
    let e = load_str(&small).unwrap_err();
    assert_eq!(e.key_path, "server.max_buffered_request_bytes", "{e}");
    let zero = MINIMAL.replace(
        "  admin_listen: 127.0.0.1:9090\n",
        "  admin_listen: 127.0.0.1:9090\n  header_read_timeout_ms: 0\n",
    );
    let e = load_str(&zero).unwrap_err();
    assert_eq!(e.key_path, "server.header_read_timeout_ms", "{e}");
}

#[test]
fn listen_and_admin_listen_must_not_overlap() {
    for admin in ["127.0.0.1:8080", "0.0.0.0:8080"] {
        let same = MINIMAL.replace(
            "admin_listen: 127.0.0.1:9090",
            &format!("admin_listen: {admin}"),
        );
        let e = load_str(&same).unwrap_err();
        assert_eq!(e.key_path, "server.admin_listen", "{e}");
        assert!(e.to_string().contains("overlaps"), "{e}");
    }
    let other_ip = MINIMAL.replace(
        "admin_listen: 127.0.0.1:9090",
        "admin_listen: 127.0.0.2:8080",
    );
    assert!(load_str(&other_ip).is_ok());
}

#[test]
fn prices_load_with_their_defaults_and_bad_ones_are_located() {
    let priced = MINIMAL.replace(
            "  acme/chat-small:\n    routes:\n",
            "  acme/chat-small:\n    input_usd_per_mtok: 0.30\n    output_usd_per_mtok: 1.20\n    cached_input_usd_per_mtok: 0.075\n    routes:\n",
        );
    let priced = priced.replace(
            "        priority: 10\n",
            "        priority: 10\n        input_usd_per_mtok: 0.15\n        output_usd_per_mtok: 0.60\n        cache_write_usd_per_mtok: 0.1875\n",
        );
    let c = load_str(&priced).unwrap();
    let m = &c.models["acme/chat-small"];
    assert_eq!(m.cached_input_usd_per_mtok, Some(0.075));
    assert_eq!(m.cache_write_usd_per_mtok, None);
    assert_eq!(m.routes[0].cache_write_usd_per_mtok, Some(0.1875));
    assert_eq!(m.routes[0].cached_input_usd_per_mtok, None);
    assert!(c.warnings().is_empty());

    for (bad, key, line) in [
        (
            "cached_input_usd_per_mtok: -0.1",
            "models.acme/chat-small.cached_input_usd_per_mtok",
            18,
        ),
        (
            "cached_input_usd_per_mtok: .nan",
            "models.acme/chat-small.cached_input_usd_per_mtok",
            18,
        ),
        (
            "cached_input_usd_per_mtok: .inf",
            "models.acme/chat-small.cached_input_usd_per_mtok",
            18,
        ),
    ] {
        let y = priced.replace("cached_input_usd_per_mtok: 0.075", bad);
        let e = load_str(&y).unwrap_err();
        assert_eq!(e.key_path, key, "{bad}: {e}");
        assert_eq!(e.line, Some(line), "{bad}: {e}");
    }
    let y = priced.replace(
        "cache_write_usd_per_mtok: 0.1875",
        "cache_write_usd_per_mtok: -1",
    );
    let e = load_str(&y).unwrap_err();
    assert_eq!(
        e.key_path, "models.acme/chat-small.routes[0].cache_write_usd_per_mtok",
        "{e}"
    );
    assert!(e.message.contains("must not be negative"), "{e}");

    // Priced in part: a located warning (output would be free).
    let half = priced.replace("    output_usd_per_mtok: 1.20\n", "");
    let w = load_str(&half).unwrap().warnings();
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].key_path, "models.acme/chat-small.output_usd_per_mtok");
    // Not priced at all: free by intent, no warning.
    assert!(load_str(MINIMAL).unwrap().warnings().is_empty());
}

#[test]
fn continuation_keys_load_and_a_single_route_continuation_is_warned_about() {
    let c = load_str(MINIMAL).unwrap();
    let m = &c.models["acme/chat-small"];
    assert!(!m.continue_on_break);
    assert!(!m.routes[0].supports_prefill);
    let one = MINIMAL.replace(
        "  acme/chat-small:\n",
        "  acme/chat-small:\n    continue_on_break: true\n",
    );
    let c = load_str(&one).unwrap();
    assert!(c.models["acme/chat-small"].continue_on_break);
    let w = c.warnings();
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].key_path, "models.acme/chat-small.continue_on_break");
    let two = one.replace(
            "        priority: 10\n",
            "        priority: 10\n      - provider: local-mock\n        upstream_model: mock-large-v1\n        supports_prefill: true\n",
        );
    let c = load_str(&two).unwrap();
    assert!(c.warnings().is_empty());
    assert!(c.models["acme/chat-small"].routes[1].supports_prefill);
}

#[test]
fn unknown_key_is_an_error_with_line() {
    let bad = MINIMAL.replace("  admin_listen", "  admn_listen");
    let e = load_str(&bad).unwrap_err();
    assert_eq!(e.line, Some(3), "{e}");
    assert!(e.to_string().contains("admn_listen"), "{e}");
}

#[test]
fn unknown_provider_names_line_and_key() {
    let bad = MINIMAL.replace("- provider: local-mock", "- provider: nope");
    let e = load_str(&bad).unwrap_err();
    assert_eq!(e.key_path, "models.acme/chat-small.routes[0].provider");
    assert_eq!(e.line, Some(17), "{e}");
    assert!(e.message.contains("unknown provider `nope`"), "{e}");
}

#[test]
fn missing_env_key_is_an_error() {
    let bad = MINIMAL.replace(
        "api_key: test-key",
        "api_key_env: SLUICE_TEST_SURELY_UNSET_VAR",
    );
    let e = load_str(&bad).unwrap_err();
    assert!(
        e.to_string().contains("SLUICE_TEST_SURELY_UNSET_VAR"),
        "{e}"
    );
}

#[test]
fn every_missing_env_key_is_named_at_once() {
    let two = MINIMAL
            .replace("api_key: test-key", "api_key_env: SLUICE_TEST_SURELY_UNSET_A")
            .replace(
                "models:\n",
                "  zz-second:\n    kind: openai\n    base_url: http://127.0.0.1:9\n    api_key_env: SLUICE_TEST_SURELY_UNSET_B\nmodels:\n",
            );
    let e = load_str(&two).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("environment variable `SLUICE_TEST_SURELY_UNSET_A` is not set"),
        "{text}"
    );
    assert!(
        text.contains("`SLUICE_TEST_SURELY_UNSET_B` (providers.zz-second.api_key_env)"),
        "{text}"
    );
}

#[test]
fn a_budget_is_a_finite_amount_at_or_above_zero_and_unknown_windows_are_errors() {
    let ok = MINIMAL.replace(
        "  team-a: {}\n",
        "  team-a:\n    budget: {total_usd: 500, daily_usd: 0}\n",
    );
    let c = load_str(&ok).unwrap();
    let b = c.tenants["team-a"].limits.budget.unwrap();
    assert_eq!(
        (b.total_usd, b.monthly_usd, b.daily_usd),
        (Some(500.0), None, Some(0.0))
    );
    let bad = MINIMAL.replace(
        "  team-a: {}\n",
        "  team-a:\n    budget: {monthly_usd: -1}\n",
    );
    let e = load_str(&bad).unwrap_err();
    assert_eq!(e.key_path, "tenants.team-a.budget.monthly_usd", "{e}");
    assert!(e.message.contains("0 or more"), "{e}");
    let bad = MINIMAL.replace("  team-a: {}\n", "  team-a:\n    budget: {weekly_usd: 5}\n");
    let e = load_str(&bad).unwrap_err();
    assert!(e.key_path.starts_with("tenants.team-a.budget"), "{e}");
    assert!(e.message.contains("weekly_usd"), "{e}");
}

#[test]
fn retry_sections_are_checked_and_a_models_override_merges_over_the_servers() {
    let ok = MINIMAL
            .replace(
                "  admin_listen: 127.0.0.1:9090\n",
                "  admin_listen: 127.0.0.1:9090\n  retry: {max_attempts_per_route: 3, on: [503, connect_error]}\n",
            )
            .replace("    routes:\n", "    retry: {backoff_ms: 7}\n    routes:\n");
    let c = load_str(&ok).unwrap();
    let p = &c.models["acme/chat-small"].retry;
    assert_eq!(p.max_attempts_per_route, 3);
    assert_eq!(p.statuses, [503]);
    assert!(p.connect_error && !p.connection_reset);
    assert_eq!(p.backoff, Duration::from_millis(7));
    assert_eq!(c.server.retry.backoff, Duration::from_millis(100));
    for (bad, key, msg) in [
        ("on: [700]", "server.retry.on", "HTTP status"),
        ("on: [timeout]", "server.retry.on", "connect_error"),
        (
            "max_attempts_per_route: 0",
            "server.retry.max_attempts_per_route",
            "at least 1",
        ),
        (
            "budget_ratio: 2",
            "server.retry.budget_ratio",
            "between 0 and 1",
        ),
    ] {
        let y = MINIMAL.replace(
            "  admin_listen: 127.0.0.1:9090\n",
            &format!("  admin_listen: 127.0.0.1:9090\n  retry: {{{bad}}}\n"),
        );
        let e = load_str(&y).unwrap_err();
        assert!(e.key_path.starts_with(key), "{bad}: {e}");
        assert!(e.message.contains(msg), "{bad}: {e}");
    }
}

#[test]
fn hedge_after_ms_and_affinity_are_opt_in_and_checked() {
    use crate::config::opt_in::{Affinity, HedgeAfter};
    let c = load_str(MINIMAL).unwrap();
    let m = &c.models["acme/chat-small"];
    assert_eq!(
        (m.hedge_after, m.affinity),
        (None, Affinity::Off),
        "off by default"
    );
    for (v, want) in [
        ("150", HedgeAfter::Fixed(Duration::from_millis(150))),
        ("auto", HedgeAfter::Auto),
    ] {
        let y = MINIMAL.replace(
            "    routes:\n",
            &format!("    hedge_after_ms: {v}\n    affinity: conversation\n    routes:\n"),
        );
        let c = load_str(&y).unwrap();
        let m = &c.models["acme/chat-small"];
        assert_eq!(
            (m.hedge_after, m.affinity),
            (Some(want), Affinity::Conversation)
        );
    }
    let y = MINIMAL.replace("    routes:\n", "    hedge_after_ms: 0\n    routes:\n");
    let e = load_str(&y).unwrap_err();
    assert_eq!(e.key_path, "models.acme/chat-small.hedge_after_ms", "{e}");
    assert!(e.message.contains("at least 1"), "{e}");
    for bad in ["hedge_after_ms: soon", "affinity: sticky"] {
        let y = MINIMAL.replace("    routes:\n", &format!("    {bad}\n    routes:\n"));
        assert!(load_str(&y).is_err(), "{bad}");
    }
}

#[test]
fn repeated_mapping_key_is_an_error_at_its_second_line() {
    let bad = MINIMAL.replace("  team-a: {}\n", "  team-a: {}\n  team-a: {}\n");
    let e = load_str(&bad).unwrap_err();
    assert_eq!(e.key_path, "tenants.team-a");
    assert_eq!((e.line, e.column), (Some(6), Some(3)), "{e}");
    assert!(e.message.contains("duplicate key `team-a`"), "{e}");
    let bad = MINIMAL.replace(
        "        priority: 10\n",
        "        priority: 10\n        priority: 20\n",
    );
    let e = load_str(&bad).unwrap_err();
    assert_eq!(e.key_path, "models.acme/chat-small.routes[0].priority");
    assert_eq!(e.line, Some(19), "{e}");
}

#[test]
fn base_url_forms() {
    let e = parse_base_url("https://api.openai.com/v1").unwrap();
    assert_eq!(
        (e.port, e.tls, e.base_path.as_str(), e.ip),
        (443, true, "/v1", None)
    );
    assert_eq!(e.host_header(), "api.openai.com");
    let e = parse_base_url("http://[::1]:8000/v1/").unwrap();
    assert_eq!(
        (e.host.as_str(), e.port, e.base_path.as_str()),
        ("::1", 8000, "/v1")
    );
    assert!(parse_base_url("ftp://x").is_err());
}

#[test]
fn bad_key_hash_rejected() {
    let bad = MINIMAL.replace("key: sk-sluice-team-a-0001", "key_sha256: abc");
    let e = load_str(&bad).unwrap_err();
    assert_eq!(e.key_path, "virtual_keys[0].key_sha256");
}

#[test]
fn health_decay_and_probe_mode_keys() {
    use crate::config::ProbeMode;
    let with = |lines: &str| {
        MINIMAL.replace(
            "    api_key: test-key\n",
            &format!("    api_key: test-key\n{lines}"),
        )
    };
    let c = load_str(MINIMAL).unwrap();
    let p = &c.providers["local-mock"];
    assert_eq!(p.passive_health.decay_after, Some(Duration::from_secs(60)));
    assert_eq!(p.health_check.as_ref().unwrap().mode, ProbeMode::List);
    let c = load_str(&with(
        "    health: {cooldown_ms: 90000}\n    health_check: {mode: request, interval_ms: 30000}\n",
    ))
    .unwrap();
    let p = &c.providers["local-mock"];
    assert_eq!(
        p.passive_health.decay_after,
        Some(Duration::from_secs(90)),
        "the default decay is never shorter than the cool-down"
    );
    assert_eq!(p.health_check.as_ref().unwrap().mode, ProbeMode::Request);
    let c = load_str(&with("    health: {decay_after_ms: 0}\n")).unwrap();
    assert_eq!(c.providers["local-mock"].passive_health.decay_after, None);
    let e = load_str(&with(
        "    health: {cooldown_ms: 5000, decay_after_ms: 1000}\n",
    ))
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("providers.local-mock.health.decay_after_ms: must be at least cooldown_ms"),
        "{e}"
    );
    let e = load_str(&with("    health_check: {mode: chat}\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("mode"), "{e}");
}

#[test]
fn the_response_store_follows_the_ledger_and_its_bounds_are_checked() {
    use crate::config::response_store::ResponseStoreSettings;
    let c = load_str(MINIMAL).unwrap();
    assert_eq!(c.response_store, ResponseStoreSettings::default());
    assert!(c.response_store.enabled);
    // Off with the ledger, unless asked for by name.
    let off = load_str(&format!("{MINIMAL}ledger: {{enabled: false}}\n")).unwrap();
    assert!(!off.response_store.enabled);
    let on = load_str(&format!(
        "{MINIMAL}ledger: {{enabled: false}}\nresponse_store: {{enabled: true}}\n"
    ))
    .unwrap();
    assert!(on.response_store.enabled);
    let set = load_str(&format!(
        "{MINIMAL}response_store:\n  max_age_secs: 60\n  max_bytes_per_tenant: 4096\n  sweep_interval_secs: 5\n  queue_capacity: 3\n"
    ))
    .unwrap()
    .response_store;
    assert_eq!(
        (
            set.max_age,
            set.max_bytes_per_tenant,
            set.sweep_interval,
            set.queue_capacity
        ),
        (Duration::from_secs(60), 4096, Duration::from_secs(5), 3)
    );
    for key in [
        "max_age_secs",
        "max_bytes_per_tenant",
        "sweep_interval_secs",
        "queue_capacity",
    ] {
        let e = load_str(&format!("{MINIMAL}response_store:\n  {key}: 0\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("response_store.{key}")), "{e}");
    }
    assert!(load_str(&format!("{MINIMAL}response_store:\n  max_age: 5\n")).is_err());
}

#[test]
fn head_timeouts_default_long_for_non_stream_short_for_streams_and_old_keys_keep_their_meaning() {
    use std::time::Duration;
    let s = Duration::from_secs;
    let t = |yaml: &str| load_str(yaml).unwrap().providers["local-mock"].timeouts;
    // The defaults: 60 s for a stream's head and first event, 600 s (the official SDKs'
    // own timeout) for a non-stream head, a heartbeat every 10 s.
    let d = t(MINIMAL);
    assert_eq!(
        (
            d.first_byte,
            d.first_byte_non_stream,
            d.first_event,
            d.heartbeat
        ),
        (s(60), s(600), s(60), s(10))
    );
    assert_eq!((d.head(true), d.head(false)), (s(60), s(600)));
    // `first_byte_timeout_ms` set alone means both shapes, as before the non-stream key.
    let old = t(&MINIMAL.replacen("server:\n", "server:\n  first_byte_timeout_ms: 70000\n", 1));
    assert_eq!((old.first_byte, old.first_byte_non_stream), (s(70), s(70)));
    let both = t(&MINIMAL.replacen(
        "server:\n",
        "server:\n  first_byte_timeout_ms: 5000\n  non_stream_first_byte_timeout_ms: 900000\n",
        1,
    ));
    assert_eq!(
        (both.first_byte, both.first_byte_non_stream),
        (s(5), s(900))
    );
    // Per provider the same: its `first_byte_timeout_ms` alone holds for both shapes.
    let p = t(&MINIMAL.replacen(
        "    api_key: test-key\n",
        "    api_key: test-key\n    first_byte_timeout_ms: 20000\n",
        1,
    ));
    assert_eq!((p.first_byte, p.first_byte_non_stream), (s(20), s(20)));
    let p = t(&MINIMAL.replacen(
        "    api_key: test-key\n",
        "    api_key: test-key\n    non_stream_first_byte_timeout_ms: 30000\n",
        1,
    ));
    assert_eq!((p.first_byte, p.first_byte_non_stream), (s(60), s(30)));
    let zero = load_str(&MINIMAL.replacen(
        "    api_key: test-key\n",
        "    api_key: test-key\n    non_stream_first_byte_timeout_ms: 0\n",
        1,
    ));
    assert!(zero
        .unwrap_err()
        .to_string()
        .contains("non_stream_first_byte_timeout_ms"));
}

#[test]
fn resumable_stream_keys_load_with_defaults_and_are_checked() {
    let c = load_str(MINIMAL).unwrap();
    assert!(!c.models["acme/chat-small"].resumable);
    assert_eq!(c.server.resume_grace, std::time::Duration::from_secs(30));
    assert_eq!(c.server.resume_buffer_bytes, 1 << 20);
    assert_eq!(c.server.resume_linger_bytes, 64 << 10);
    // A random tag, the same for every load of this process (reloads keep ids valid).
    assert_eq!(c.server.replica_id.len(), 8);
    assert_eq!(
        load_str(MINIMAL).unwrap().server.replica_id,
        c.server.replica_id
    );
    let set = MINIMAL
        .replace(
            "  admin_listen: 127.0.0.1:9090\n",
            "  admin_listen: 127.0.0.1:9090\n  resume_grace_ms: 5000\n  resume_buffer_bytes: 4096\n  replica_id: eu-west-1\n",
        )
        .replace("  acme/chat-small:\n", "  acme/chat-small:\n    resumable: true\n");
    let c = load_str(&set).unwrap();
    assert!(c.models["acme/chat-small"].resumable);
    assert_eq!(c.server.resume_grace, std::time::Duration::from_secs(5));
    assert_eq!(c.server.resume_buffer_bytes, 4096);
    // The default tail is capped by the buffer.
    assert_eq!(c.server.resume_linger_bytes, 4096);
    assert_eq!(c.server.replica_id, "eu-west-1");
    let off = MINIMAL.replace(
        "  admin_listen: 127.0.0.1:9090\n",
        "  admin_listen: 127.0.0.1:9090\n  resume_linger_bytes: 0\n",
    );
    assert_eq!(load_str(&off).unwrap().server.resume_linger_bytes, 0);
    for (line, key) in [
        ("  resume_grace_ms: 0\n", "server.resume_grace_ms"),
        ("  resume_buffer_bytes: 100\n", "server.resume_buffer_bytes"),
        (
            "  resume_linger_bytes: 2000000\n",
            "server.resume_linger_bytes",
        ),
        (
            "  responses_websocket_max_sessions: 0\n",
            "server.responses_websocket_max_sessions",
        ),
        ("  replica_id: eu_1\n", "server.replica_id"),
        ("  replica_id: \"\"\n", "server.replica_id"),
    ] {
        let bad = MINIMAL.replace(
            "  admin_listen: 127.0.0.1:9090\n",
            &format!("  admin_listen: 127.0.0.1:9090\n{line}"),
        );
        let e = load_str(&bad).unwrap_err();
        assert_eq!(e.key_path, key, "{e}");
    }
    let typo = MINIMAL.replace(
        "  acme/chat-small:\n",
        "  acme/chat-small:\n    resumeable: true\n",
    );
    let e = load_str(&typo).unwrap_err();
    assert!(e.to_string().contains("resumeable"), "{e}");
}
