//! Criterion benchmark of building the candidate list (`sluice::routing::plan`): capability
//! filter, key policy, client preference, strategy, health lookup and ordering, for a model
//! with 1, 4, 8 and 16 routes.
//!
//! Target (issue "Multi-provider routing"): under 2 µs for a model with 8 routes.
//!
//! Run: `cargo bench --bench routing` (add `-- --quick` for a short run).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use sluice::auth::Caller;
use sluice::config::{
    Capability, HopTimeouts, Model, PassiveHealth, Provider, ProviderKind, Route, Strategy,
};
use sluice::routing::{plan, Preference, RouteNeeds};

const MODEL: &str = "acme/bench-chat";

fn provider(id: &str) -> Arc<Provider> {
    let t = Duration::from_secs(10);
    Arc::new(Provider {
        id: id.into(),
        kind: ProviderKind::Openai,
        endpoint: None,
        api_key: None,
        ca: None,
        h2_stream_window: 65536,
        timeouts: HopTimeouts::uniform(t),
        health_check: None,
        passive_health: PassiveHealth {
            unhealthy_after_failures: 3,
            cooldown: t,
            ..PassiveHealth::default()
        },
        stream_usage: true,
        max_concurrent_requests: None,
        api_version: None,
        aws: None,
        vertex: None,
        token_source: None,
    })
}

/// A model with `n` routes on `n` providers: priorities in pairs (so `priority` has ties to
/// spread by weight), varied costs, every third route without `tools`.
fn model(n: usize, strategy: Strategy) -> Model {
    let routes = (0..n)
        .map(|i| {
            let id = format!("provider-{i}");
            let upstream = format!("upstream-model-{i}");
            Route {
                health_key: format!("{id}/{upstream}"),
                provider: provider(&id),
                upstream_model: upstream,
                priority: i32::try_from(i / 2).unwrap_or(0),
                weight: 1 + u32::try_from(i % 3).unwrap_or(0),
                input_usd_per_mtok: 0.1 + (i % 5) as f64,
                output_usd_per_mtok: 0.4 + (i % 7) as f64,
                cached_input_usd_per_mtok: None,
                cache_write_usd_per_mtok: None,
                capabilities: (i % 3 == 2).then(|| vec![Capability::Vision]),
                supports_prefill: false,
                display_model: None,
                context_window_tokens: None,
                thinking: None,
                api: sluice::config::RouteApi::ChatCompletions,
            }
        })
        .collect();
    Model {
        id: MODEL.into(),
        strategy,
        first_event_timeout: None,
        early_commit_after: None,
        continue_on_break: false,
        resumable: false,
        report_served_model: false,
        unsupported: sluice::config::Unsupported::default(),
        default_max_tokens: 4096,
        retry: sluice::routing::retry::RetryPolicy::default(),
        hedge_after: None,
        affinity: sluice::config::opt_in::Affinity::Off,
        fallback_models: Vec::new(),
        context_fallback_models: Vec::new(),
        input_usd_per_mtok: None,
        output_usd_per_mtok: None,
        cached_input_usd_per_mtok: None,
        cache_write_usd_per_mtok: None,
        routes,
    }
}

/// TTFT of route `i` of `n`, ms: a scrambled order (neither the priority order nor its
/// reverse), so `lowest_latency` really sorts on the samples.
fn ttft_ms(i: usize, n: usize) -> u64 {
    1 + ((i * 5 + 3) % n.max(1)) as u64
}

/// Records TTFT samples for every route of `m`, then checks `plan` orders by them: without
/// samples `lowest_latency` degenerates to the priority sort and measures nothing else.
fn give_ttft_samples(m: &Model) {
    let n = m.routes.len();
    for (i, r) in m.routes.iter().enumerate() {
        let h = sluice::routing::health::registry().route(&r.provider.id, &r.health_key);
        for _ in 0..4 {
            h.record_success(
                &r.provider.passive_health,
                Some(Duration::from_millis(ttft_ms(i, n))),
            );
        }
    }
    let plain = RouteNeeds {
        capabilities: Vec::new(),
        estimated_input_tokens: 1200,
        max_output_tokens: 512,
        requested_max_output_tokens: Some(512),
    };
    // The plan's order follows the routes' TTFT averages, all present and distinct (the
    // registry is shared by the models of every size, so the averages mix their samples).
    let order: Vec<Duration> = plan(m, &caller(), &plain, None)
        .expect("plan")
        .iter()
        .map(|c| c.health.ewma_ttft().expect("a TTFT sample"))
        .collect();
    assert_eq!(order.len(), n);
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "lowest_latency does not follow the TTFT samples: {order:?}"
    );
}

fn caller() -> Caller {
    Caller {
        tenant: "bench".into(),
        key_id: "bench-key".into(),
        allowed_models: None,
        allowed_providers: None,
        strategy: None,
    }
}

fn bench_plan(c: &mut Criterion) {
    let caller = caller();
    let plain = RouteNeeds {
        capabilities: Vec::new(),
        estimated_input_tokens: 1200,
        max_output_tokens: 512,
        requested_max_output_tokens: Some(512),
    };
    let tools = RouteNeeds {
        capabilities: vec![Capability::Tools],
        ..plain.clone()
    };
    let pref = Preference {
        only: None,
        ignore: vec!["provider-1".into()],
        order: vec!["provider-3".into(), "provider-0".into()],
        allow_fallbacks: true,
    };
    for (name, strategy) in [
        ("priority", Strategy::Priority),
        ("lowest_cost", Strategy::LowestCost),
        ("lowest_latency", Strategy::LowestLatency),
    ] {
        let mut g = c.benchmark_group(format!("plan/{name}"));
        for n in [1usize, 4, 8, 16] {
            let m = model(n, strategy);
            // Warm the health registry (first use creates the entries).
            let _ = plan(&m, &caller, &plain, None);
            if strategy == Strategy::LowestLatency {
                give_ttft_samples(&m);
            }
            g.bench_with_input(BenchmarkId::from_parameter(n), &m, |b, m| {
                b.iter(|| {
                    let p = plan(black_box(m), &caller, black_box(&plain), None);
                    black_box(p.map(|c| c.len()).unwrap_or(0))
                });
            });
        }
        g.finish();
    }
    let mut g = c.benchmark_group("plan/priority+tools+preference");
    for n in [4usize, 8, 16] {
        let m = model(n, Strategy::Priority);
        let _ = plan(&m, &caller, &tools, Some(&pref));
        g.bench_with_input(BenchmarkId::from_parameter(n), &m, |b, m| {
            b.iter(|| {
                let p = plan(black_box(m), &caller, black_box(&tools), Some(&pref));
                black_box(p.map(|c| c.len()).unwrap_or(0))
            });
        });
    }
    g.finish();
}

criterion_group!(benches, bench_plan);
criterion_main!(benches);
