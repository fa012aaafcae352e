//! Owns the candidate list for one request: which routes of a standard model may serve it and
//! in what order.
//!
//! Order of filters (issue "Multi-provider routing"): routes of the model → capability filter →
//! tenant/key policy → client preference (`only`/`ignore`) → strategy (`priority` with weighted
//! ties, `lowest_cost`, `lowest_latency`) → client `order` → health (a route whose half-open
//! trial is due and this request claimed goes first; then healthy routes, then degraded ones;
//! unhealthy routes without the trial are dropped) → `allow_fallbacks`.

pub mod affinity;
pub mod health;
pub mod probe;
pub mod request_probe;
pub mod retry;
pub mod ttft;

use std::sync::Arc;

use crate::auth::Caller;
use crate::config::{Capability, Model, Route, Strategy};
use crate::error::GatewayError;
pub use health::retryable_status;
use health::{Health, RouteHealth, TrialPermit};

/// The client's per-request provider preference: body field `provider` or header
/// `x-sluice-provider-preference` (same JSON), OpenRouter style.
#[derive(Debug, Clone, Default, serde::Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Preference {
    /// Only these providers.
    #[serde(default)]
    pub only: Option<Vec<String>>,
    /// Never these providers.
    #[serde(default)]
    pub ignore: Vec<String>,
    /// These providers first, in this order.
    #[serde(default)]
    pub order: Vec<String>,
    /// `false`: try only the first candidate.
    #[serde(default = "yes")]
    pub allow_fallbacks: bool,
}

fn yes() -> bool {
    true
}

impl Preference {
    /// Every provider name the preference mentions.
    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.only
            .iter()
            .flatten()
            .chain(self.ignore.iter())
            .chain(self.order.iter())
    }
}

/// What the request needs from a route, and its size for cost estimates.
#[derive(Debug, Clone, Default)]
pub struct RouteNeeds {
    /// Capabilities the request uses.
    pub capabilities: Vec<Capability>,
    /// Estimated input tokens: read only by `lowest_cost` ([`estimated_cost_usd`]); the
    /// proxy fills it only when [`uses_input_estimate`] says so (0 otherwise), as the
    /// estimate runs the tokenizer over the whole prompt.
    pub estimated_input_tokens: u64,
    /// Output token bound (`max_tokens` or a default).
    pub max_output_tokens: u64,
    /// The client's own output bound (`max_tokens`, `max_completion_tokens`,
    /// `max_output_tokens`), if it set one.
    pub requested_max_output_tokens: Option<u64>,
}

/// The routing strategy that orders `model`'s routes for `caller` (the key's override, else
/// the model's).
pub fn strategy(model: &Model, caller: &Caller) -> Strategy {
    caller.strategy.unwrap_or(model.strategy)
}

/// Whether [`plan`] reads [`RouteNeeds::estimated_input_tokens`] for `model` and `caller`
/// (only `lowest_cost` ranks routes by an estimated cost).
pub fn uses_input_estimate(model: &Model, caller: &Caller) -> bool {
    strategy(model, caller) == Strategy::LowestCost
}

/// One candidate: a route and its health handle.
#[derive(Debug, Clone)]
pub struct Candidate<'m> {
    /// The route.
    pub route: &'m Route,
    /// Its health state.
    pub health: Arc<RouteHealth>,
    /// This request holds the route's half-open trial ([`RouteHealth::claim_trial`]); it is
    /// released when the last clone of the candidate is dropped, if no outcome ended it first.
    pub trial: Option<Arc<TrialPermit>>,
}

impl<'m> Candidate<'m> {
    /// A candidate without a trial permit.
    pub fn new(route: &'m Route, health: Arc<RouteHealth>) -> Self {
        Self {
            route,
            health,
            trial: None,
        }
    }

    /// Whether this request may try the route now: it is not resting, and it is not
    /// unhealthy unless this request holds its trial.
    pub fn admit(&self) -> bool {
        self.health.cooldown_remaining().is_none()
            && (self.trial.is_some() || self.health.state() != Health::Unhealthy)
    }

    /// Whether this attempt is the route's half-open trial: a single request, never retried
    /// on the route.
    pub fn is_trial(&self) -> bool {
        self.trial.is_some()
    }

    /// Gives the trial back without an outcome (the client left, shutdown), so the next
    /// request may take it.
    pub fn release_trial(&self) {
        if let Some(t) = &self.trial {
            t.release();
        }
    }
}

/// Builds the ordered candidate list.
///
/// # Errors
/// [`GatewayError::NoRoute`] (503) saying why nothing is left.
pub fn plan<'m>(
    model: &'m Model,
    caller: &Caller,
    needs: &RouteNeeds,
    preference: Option<&Preference>,
) -> Result<Vec<Candidate<'m>>, GatewayError> {
    let mut routes: Vec<&Route> = model.routes.iter().collect();

    if let Some(missing) = needs
        .capabilities
        .iter()
        .find(|cap| !routes.iter().any(|r| r.supports(**cap)))
    {
        return Err(no_route(format!(
            "no provider for model `{}` supports the capability `{}`",
            model.id,
            capability_name(*missing)
        )));
    }
    routes.retain(|r| needs.capabilities.iter().all(|c| r.supports(*c)));
    if routes.is_empty() {
        return Err(no_route(format!(
            "no single provider for model `{}` supports all requested capabilities",
            model.id
        )));
    }

    routes.retain(|r| caller.may_use_provider(&r.provider.id));
    if routes.is_empty() {
        return Err(no_route(format!(
            "no provider for model `{}` is allowed for this key",
            model.id
        )));
    }

    if let Some(p) = preference {
        if let Some(only) = &p.only {
            routes.retain(|r| only.contains(&r.provider.id));
        }
        routes.retain(|r| !p.ignore.contains(&r.provider.id));
        if routes.is_empty() {
            // The client's own choice left nothing: a client error, not an outage.
            return Err(GatewayError::invalid(
                format!(
                    "every provider for model `{}` is excluded by the request's provider preference",
                    model.id
                ),
                Some("provider"),
            ));
        }
    }

    let strategy = strategy(model, caller);
    let reg = health::registry();
    let mut cands: Vec<Candidate<'m>> = routes
        .into_iter()
        .map(|r| Candidate::new(r, reg.route(&r.provider.id, &r.health_key)))
        .collect();
    order_by_strategy(&mut cands, strategy, needs);

    if let Some(p) = preference {
        if !p.order.is_empty() {
            let rank = |c: &Candidate<'_>| {
                p.order
                    .iter()
                    .position(|x| *x == c.route.provider.id)
                    .unwrap_or(usize::MAX)
            };
            cands.sort_by_key(rank);
        }
    }

    // Health: decay, claim at most one due trial, drop resting routes, keep the order
    // within each class. The trial goes first (the route's way back: without it a degraded
    // route behind a healthy one never sees traffic), unless the client allows no fallback
    // (then nothing would catch a failed trial). One trial per request bounds what it costs
    // the client to one failed attempt before its answer.
    let fallbacks = preference.is_none_or(|p| p.allow_fallbacks);
    let mut claimed = false;
    for c in &mut cands {
        c.health.refresh(&c.route.provider.passive_health);
        if !claimed {
            c.trial = c.health.claim_trial().map(Arc::new);
            claimed = c.trial.is_some();
        }
    }
    let soonest = cands
        .iter()
        .filter_map(|c| c.health.cooldown_remaining())
        .min();
    cands.retain(|c| c.trial.is_some() || c.health.is_available());
    cands.sort_by_key(
        |c| match (c.trial.is_some() && fallbacks, c.health.state()) {
            (true, _) => 0u8,
            (false, Health::Healthy) => 1,
            (false, Health::Degraded) => 2,
            (false, Health::Unhealthy) => 3,
        },
    );
    if cands.is_empty() {
        return Err(GatewayError::NoRoute {
            message: format!("no healthy provider for model `{}` right now", model.id),
            retry_after: soonest,
        });
    }

    if preference.is_some_and(|p| !p.allow_fallbacks) {
        cands.truncate(1);
    }
    Ok(cands)
}

fn no_route(message: String) -> GatewayError {
    GatewayError::NoRoute {
        message,
        retry_after: None,
    }
}

/// The YAML name of a capability.
pub fn capability_name(c: Capability) -> &'static str {
    match c {
        Capability::Tools => "tools",
        Capability::Vision => "vision",
        Capability::JsonSchema => "json_schema",
    }
}

/// Estimated cost of a request on a route, USD.
pub fn estimated_cost_usd(route: &Route, needs: &RouteNeeds) -> f64 {
    #[expect(
        clippy::cast_precision_loss,
        reason = "token counts are far below 2^52"
    )]
    let (i, o) = (
        needs.estimated_input_tokens as f64,
        needs.max_output_tokens as f64,
    );
    (i * route.input_usd_per_mtok + o * route.output_usd_per_mtok) / 1_000_000.0
}

fn order_by_strategy(cands: &mut [Candidate<'_>], strategy: Strategy, needs: &RouteNeeds) {
    match strategy {
        Strategy::Priority => {
            cands.sort_by_key(|c| c.route.priority);
            // Weighted random order within each priority (Efraimidis–Spirakis: key u^(1/w),
            // largest first). A route alone at its priority draws no random number.
            for tie in cands.chunk_by_mut(|a, b| a.route.priority == b.route.priority) {
                if tie.len() > 1 {
                    tie.sort_by_cached_key(|c| {
                        let u = fastrand::f64().max(f64::MIN_POSITIVE);
                        let w = c.route.weight;
                        let k = if w == 1 {
                            u
                        } else {
                            u.powf(1.0 / f64::from(w))
                        };
                        // Positive floats order like their bit patterns.
                        std::cmp::Reverse(k.to_bits())
                    });
                }
            }
        }
        Strategy::LowestCost => {
            cands.sort_by(|a, b| {
                estimated_cost_usd(a.route, needs)
                    .total_cmp(&estimated_cost_usd(b.route, needs))
                    .then(a.route.priority.cmp(&b.route.priority))
            });
        }
        Strategy::LowestLatency => {
            cands.sort_by_key(|c| (c.health.ewma_ttft().unwrap_or_default(), c.route.priority));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{HopTimeouts, PassiveHealth, Provider, ProviderKind};
    use std::time::Duration;

    fn provider(id: &str) -> Arc<Provider> {
        let t = Duration::from_secs(1);
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

    fn route(model: &str, p: &str, prio: i32, cost: f64, caps: Option<Vec<Capability>>) -> Route {
        Route {
            provider: provider(p),
            upstream_model: format!("{p}-m"),
            priority: prio,
            weight: 1,
            input_usd_per_mtok: cost,
            output_usd_per_mtok: cost,
            cached_input_usd_per_mtok: None,
            cache_write_usd_per_mtok: None,
            capabilities: caps,
            supports_prefill: false,
            display_model: None,
            thinking: None,
            api: crate::config::RouteApi::ChatCompletions,
            health_key: format!("{model}|{p}/{p}-m"),
            context_window_tokens: None,
        }
    }

    fn model(id: &str, routes: Vec<Route>, strategy: Strategy) -> Model {
        Model {
            id: id.into(),
            strategy,
            first_event_timeout: None,
            early_commit_after: None,
            continue_on_break: false,
            resumable: false,
            report_served_model: false,
            unsupported: crate::config::Unsupported::Drop,
            default_max_tokens: 4096,
            retry: crate::routing::retry::RetryPolicy::default(),
            hedge_after: None,
            affinity: crate::config::opt_in::Affinity::Off,
            fallback_models: Vec::new(),
            context_fallback_models: Vec::new(),
            input_usd_per_mtok: None,
            output_usd_per_mtok: None,
            cached_input_usd_per_mtok: None,
            cache_write_usd_per_mtok: None,
            routes,
        }
    }

    fn caller() -> Caller {
        Caller {
            tenant: "t".into(),
            key_id: "k".into(),
            allowed_models: None,
            allowed_providers: None,
            strategy: None,
        }
    }

    fn ids(c: &[Candidate<'_>]) -> Vec<String> {
        c.iter().map(|c| c.route.provider.id.clone()).collect()
    }

    #[test]
    fn priority_then_capability_then_preference() {
        let m = model(
            "plan-test-1",
            vec![
                route("plan-test-1", "b", 20, 1.0, None),
                route("plan-test-1", "a", 10, 5.0, Some(vec![])),
                route("plan-test-1", "c", 30, 0.1, None),
            ],
            Strategy::Priority,
        );
        let needs = RouteNeeds::default();
        assert_eq!(
            ids(&plan(&m, &caller(), &needs, None).unwrap()),
            ["a", "b", "c"]
        );
        let tools = RouteNeeds {
            capabilities: vec![Capability::Tools],
            ..RouteNeeds::default()
        };
        assert_eq!(ids(&plan(&m, &caller(), &tools, None).unwrap()), ["b", "c"]);
        let pref = Preference {
            ignore: vec!["b".into()],
            order: vec!["c".into()],
            allow_fallbacks: true,
            only: None,
        };
        assert_eq!(
            ids(&plan(&m, &caller(), &needs, Some(&pref)).unwrap()),
            ["c", "a"]
        );
        let no_fb = Preference {
            allow_fallbacks: false,
            ..Preference::default()
        };
        assert_eq!(plan(&m, &caller(), &needs, Some(&no_fb)).unwrap().len(), 1);
    }

    #[test]
    fn priority_ties_follow_weights() {
        let mut a = route("plan-test-4", "a", 5, 1.0, None);
        a.weight = 3;
        let m = model(
            "plan-test-4",
            vec![
                a,
                route("plan-test-4", "b", 5, 1.0, None),
                route("plan-test-4", "c", 9, 1.0, None),
            ],
            Strategy::Priority,
        );
        let n = 4000;
        let mut first_a = 0;
        for _ in 0..n {
            let order = ids(&plan(&m, &caller(), &RouteNeeds::default(), None).unwrap());
            assert_eq!(order[2], "c", "a lower priority stays last");
            if order[0] == "a" {
                first_a += 1;
            }
        }
        // Expected 3000 of 4000 (sd ~27).
        assert!((2800..=3200).contains(&first_a), "{first_a}");
    }

    #[test]
    fn lowest_cost_orders_by_estimate() {
        let m = model(
            "plan-test-2",
            vec![
                route("plan-test-2", "a", 1, 5.0, None),
                route("plan-test-2", "b", 2, 0.5, None),
            ],
            Strategy::LowestCost,
        );
        let needs = RouteNeeds {
            estimated_input_tokens: 1000,
            max_output_tokens: 100,
            ..RouteNeeds::default()
        };
        assert_eq!(ids(&plan(&m, &caller(), &needs, None).unwrap()), ["b", "a"]);
    }

    #[test]
    fn explains_empty_plans() {
        let m = model(
            "plan-test-3",
            vec![route("plan-test-3", "a", 1, 1.0, Some(vec![]))],
            Strategy::Priority,
        );
        let vision = RouteNeeds {
            capabilities: vec![Capability::Vision],
            ..RouteNeeds::default()
        };
        let e = plan(&m, &caller(), &vision, None).unwrap_err();
        assert_eq!(e.status(), 503);
        assert!(e.to_string().contains("vision"), "{e}");
        let only = Preference {
            only: Some(vec!["zzz".into()]),
            ..Preference::default()
        };
        let e = plan(&m, &caller(), &RouteNeeds::default(), Some(&only)).unwrap_err();
        assert!(e.to_string().contains("preference"), "{e}");
        assert_eq!(
            e.status(),
            400,
            "the client's own exclusion is a client error"
        );
    }

    #[test]
    fn a_due_trial_goes_first_one_per_request_and_never_without_fallbacks() {
        let m = model(
            "plan-test-5",
            vec![
                route("plan-test-5", "a", 1, 1.0, None),
                route("plan-test-5", "b", 2, 1.0, None),
                route("plan-test-5", "c", 3, 1.0, None),
            ],
            Strategy::Priority,
        );
        let th = PassiveHealth {
            unhealthy_after_failures: 2,
            cooldown: Duration::from_millis(40),
            ..PassiveHealth::default()
        };
        let reg = health::registry();
        let (b, c) = (
            reg.route("b", "plan-test-5|b/b-m"),
            reg.route("c", "plan-test-5|c/c-m"),
        );
        b.record_failure(&th, None);
        for _ in 0..2 {
            c.record_failure(&th, None);
        }
        let needs = RouteNeeds::default();
        // Within the cool-down: degraded b last, resting c dropped.
        assert_eq!(ids(&plan(&m, &caller(), &needs, None).unwrap()), ["a", "b"]);
        std::thread::sleep(Duration::from_millis(50));
        // Both trials are due: one request carries one (b's, the first in order) first.
        let first = plan(&m, &caller(), &needs, None).unwrap();
        assert_eq!(
            ids(&first),
            ["b", "a"],
            "c's trial waits for the next request"
        );
        assert!(first[0].is_trial() && first[0].admit());
        // The next request takes c's trial; b's is in flight, so b is a late fallback.
        let second = plan(&m, &caller(), &needs, None).unwrap();
        assert_eq!(ids(&second), ["c", "a", "b"]);
        // A third gets no trial: both are in flight; unhealthy c is not admitted without one.
        let third = plan(&m, &caller(), &needs, None).unwrap();
        assert_eq!(ids(&third), ["a", "b"]);
        // b's trial request ended without an outcome (client left): the permit is free again.
        drop(first);
        let no_fb = Preference {
            allow_fallbacks: false,
            ..Preference::default()
        };
        let only = plan(&m, &caller(), &needs, Some(&no_fb)).unwrap();
        assert_eq!(ids(&only), ["a"], "no trial first without fallbacks");
        drop((second, third, only));
        b.record_success(&th, None);
        c.record_success(&th, None);
        assert_eq!(
            ids(&plan(&m, &caller(), &needs, None).unwrap()),
            ["a", "b", "c"]
        );
    }
}
