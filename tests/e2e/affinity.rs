//! Prompt-cache affinity (`models.<id>.affinity: conversation`): among equal-priority
//! weighted routes, every turn of one conversation goes to the same route, so the mocks'
//! prompt caches (`prompt_cache` knob) hit and the ledger's `cached_input_tokens` shows it;
//! with affinity off the turns spread and the caches miss more. A coding agent's session
//! header keys a conversation whatever its messages; a sticky route that turns unhealthy
//! is left for the next one, which then sticks. Hit counts per mock asserted in each.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use crate::fallback::{chat_hits, chat_with_headers, config_with_routes, Metrics, MODEL, P};
use crate::harness::{eventually, Mock, Sluice};
use crate::ledger::wait_records;

const CACHING: &str = r#"{"prompt_cache":true,"tokens":2}"#;

/// Three providers at one priority and weight, `affinity` lines under the model.
fn equal_routes(mocks: &[&Mock], model_lines: &str, provider_extra: &str) -> String {
    let ids = ["p1", "p2", "p3"];
    let urls: Vec<String> = mocks.iter().map(|m| m.base_url()).collect();
    let providers: Vec<P<'_>> = mocks
        .iter()
        .enumerate()
        .map(|(i, _)| P(ids[i], &urls[i], provider_extra))
        .collect();
    let mut routes = String::new();
    for id in &ids[..mocks.len()] {
        routes.push_str(&format!(
            "      - provider: {id}\n        upstream_model: {id}-model\n        priority: 1\n"
        ));
    }
    config_with_routes(
        "",
        &providers,
        &format!("{model_lines}    routes:\n{routes}"),
    )
}

/// Turn `turn` (0-based) of conversation `conv`: the same first message, then the turns so far.
fn turn(conv: usize, turn: usize) -> String {
    let mut messages =
        vec![json!({"role": "user", "content": format!("conversation {conv} begins here")})];
    for t in 1..=turn {
        messages.push(json!({"role": "assistant", "content": "tok0 tok1"}));
        messages.push(json!({"role": "user", "content": format!("question {t}")}));
    }
    json!({"model": MODEL, "stream": false, "messages": messages}).to_string()
}

/// Sends `convs` conversations of `turns` turns each (interleaved); returns the provider of
/// each (conversation, turn).
fn converse(sluice: &Sluice, convs: usize, turns: usize) -> BTreeMap<(usize, usize), String> {
    let mut served = BTreeMap::new();
    for t in 0..turns {
        for c in 0..convs {
            let r = sluice.chat(&turn(c, t));
            assert_eq!(r.status, 200, "{}", r.text());
            served.insert(
                (c, t),
                r.header("x-sluice-provider")
                    .expect("x-sluice-provider")
                    .to_string(),
            );
        }
    }
    served
}

/// Ledger records with cached input tokens.
fn cache_hits(sluice: &Sluice, n: usize) -> usize {
    let recs: Vec<Value> = wait_records(sluice.dir.path(), &sluice.config_path, n);
    assert_eq!(recs.len(), n, "{recs:#?}");
    recs.iter()
        .filter(|r| r["cached_input_tokens"].as_u64().unwrap_or(0) > 0)
        .count()
}

fn affinity(sluice: &Sluice, outcome: &str) -> f64 {
    Metrics::scrape(sluice).get(
        "sluice_affinity_total",
        &[("model", MODEL), ("outcome", outcome)],
    )
}

#[test]
fn a_conversation_sticks_to_one_route_and_its_prompt_cache_hits_show_in_the_ledger() {
    let (a, b, c) = (
        Mock::start(CACHING),
        Mock::start(CACHING),
        Mock::start(CACHING),
    );
    let sluice = Sluice::start(&equal_routes(
        &[&a, &b, &c],
        "    affinity: conversation\n",
        "",
    ));
    let (convs, turns) = (4, 4);
    let served = converse(&sluice, convs, turns);
    for conv in 0..convs {
        let first = &served[&(conv, 0)];
        for t in 1..turns {
            assert_eq!(
                &served[&(conv, t)],
                first,
                "conversation {conv} moved: {served:?}"
            );
        }
    }
    assert_eq!(chat_hits(&a) + chat_hits(&b) + chat_hits(&c), convs * turns);
    // Every turn after the first read its prefix from the route's cache.
    assert_eq!(cache_hits(&sluice, convs * turns), convs * (turns - 1));
    assert_eq!(affinity(&sluice, "hit"), (convs * (turns - 1)) as f64);
    assert_eq!(affinity(&sluice, "miss"), convs as f64);

    // A Claude Code session header keys the conversation whatever the messages say.
    let session = [("x-claude-code-session-id", "3f1c2a9e-session")];
    let providers: Vec<String> = (0..6)
        .map(|i| {
            let r = chat_with_headers(&sluice, &session, &turn(100 + i, 0));
            assert_eq!(r.status, 200, "{}", r.text());
            r.header("x-sluice-provider")
                .expect("x-sluice-provider")
                .to_string()
        })
        .collect();
    assert!(
        providers.iter().all(|p| *p == providers[0]),
        "{providers:?}"
    );
}

#[test]
fn without_affinity_the_turns_spread_and_the_caches_miss_more() {
    let (a, b, c) = (
        Mock::start(CACHING),
        Mock::start(CACHING),
        Mock::start(CACHING),
    );
    let sluice = Sluice::start(&equal_routes(&[&a, &b, &c], "", ""));
    let (convs, turns) = (4, 4);
    let served = converse(&sluice, convs, turns);
    // Random weighted order: all 16 turns staying put has a chance of (1/3)^12.
    let moved = (0..convs)
        .filter(|&conv| (1..turns).any(|t| served[&(conv, t)] != served[&(conv, 0)]))
        .count();
    assert!(moved > 0, "{served:?}");
    assert_eq!(chat_hits(&a) + chat_hits(&b) + chat_hits(&c), convs * turns);
    let hits = cache_hits(&sluice, convs * turns);
    assert!(
        hits < convs * (turns - 1),
        "{hits} cache hits without affinity"
    );
    assert_eq!(affinity(&sluice, "hit") + affinity(&sluice, "miss"), 0.0);
}

#[test]
fn a_sticky_route_that_goes_unhealthy_is_left_and_the_next_one_sticks() {
    let (a, b) = (Mock::start(CACHING), Mock::start(CACHING));
    let rest = "    health: {degraded_after_failures: 1, unhealthy_after_failures: 1, cooldown_ms: 60000}\n";
    let sluice = Sluice::start(&equal_routes(
        &[&a, &b],
        "    affinity: conversation\n",
        rest,
    ));
    let r = sluice.chat(&turn(0, 0));
    assert_eq!(r.status, 200, "{}", r.text());
    let sticky = r
        .header("x-sluice-provider")
        .expect("x-sluice-provider")
        .to_string();
    let (sticky_mock, other_mock, other) = if sticky == "p1" {
        (&a, &b, "p2")
    } else {
        (&b, &a, "p1")
    };
    for t in 1..3 {
        let r = sluice.chat(&turn(0, t));
        assert_eq!(r.header("x-sluice-provider"), Some(sticky.as_str()));
    }
    assert_eq!((chat_hits(sticky_mock), chat_hits(other_mock)), (3, 0));

    // The sticky route fails: the turn falls back to the other route (tried first as
    // the sticky one), which turns the failed one unhealthy (resting).
    sticky_mock.set_behavior(r#"{"status":503}"#);
    let r = sluice.chat(&turn(0, 3));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-sluice-provider"), Some(other));
    assert_eq!(r.header("x-sluice-fallback-depth"), Some("1"));
    assert_eq!((chat_hits(sticky_mock), chat_hits(other_mock)), (4, 1));

    // It recovers, but rests: the conversation now sticks to the other route.
    sticky_mock.set_behavior(CACHING);
    for t in 4..8 {
        let r = sluice.chat(&turn(0, t));
        assert_eq!(r.header("x-sluice-provider"), Some(other), "turn {t}");
        assert_eq!(r.header("x-sluice-fallback-depth"), Some("0"));
    }
    assert_eq!((chat_hits(sticky_mock), chat_hits(other_mock)), (4, 5));
    assert!(
        eventually(Duration::from_secs(2), || affinity(&sluice, "hit")
            == 2.0 + 1.0 + 4.0),
        "hits {}",
        affinity(&sluice, "hit")
    );
}
