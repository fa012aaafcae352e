//! Owns active health probes: a Pingora background service that, for every provider with an
//! enabled `health_check`, periodically sends `GET {base_path}{path}` with the provider's
//! credential through Pingora's `Connector` (`mode: list`, the default), or a minimal real
//! request to each of its routes (`mode: request`, [`super::request_probe`]), and feeds the
//! result into the route health registry ([`super::health::registry`]). Each round it also
//! applies decay to every configured route ([`RouteHealth::refresh`]).
//!
//! - A list probe speaks for the provider, not for a route: its failure is a provider-level
//!   failure of every route of the provider; its success lifts only provider-level failures
//!   ([`RouteHealth::record_probe_success`]), never a route's own. A request probe speaks for
//!   its route: success and failure are the route's own.
//! - Probes are counted in `sluice_health_probes_total{provider,mode,result}` and never
//!   metered or charged.
//! - The config snapshot is read every round, so a reload that adds, removes or retunes a
//!   probe applies within one round (at most [`MAX_ROUND`]).
//! - Every probe is bounded by its `timeout` (connect, request and response head together) and
//!   runs in its own task, so a slow provider never delays another provider's probe, and no
//!   probe ever touches the request hot path. At most one probe round per provider is in
//!   flight (a request-mode round probes the provider's routes concurrently).
//! - Outcome: an answer with a status the attempt loop would fall back on (401, 403, 408, 409,
//!   429, 5xx; see [`crate::routing::retryable_status`]), a connect error or a timeout is
//!   a failure (with a 429's `Retry-After` as the cool-down); any other answer means the
//!   provider (or route) answers. State changes are logged once each by the health module.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::connectors::http::Connector;

use crate::providers::exchange::{self, OpenError};
use pingora::http::RequestHeader;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::task::JoinSet;
use tokio::time::{sleep_until, Instant};

use super::health::{registry, FailureScope, RouteHealth};
use crate::config::{ActiveHealthCheck, Config, ProbeMode, Provider};
use crate::error::parse_retry_after;
use crate::live::ConfigHandle;
use crate::metrics::metrics;
use crate::providers::{self, Upstream};

/// Longest sleep between rounds: how quickly a reload's probe changes are noticed.
pub const MAX_ROUND: Duration = Duration::from_secs(1);

/// What one probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// The provider answered with a status that does not call for a fallback.
    Up {
        /// The answer's status.
        status: u16,
    },
    /// Unreachable, too slow, or answered with a fallback status.
    Down {
        /// Why, for the debug log (never contains the provider key).
        reason: String,
        /// A 429/503 answer's `Retry-After`, if any.
        retry_after: Option<Duration>,
    },
}

/// The background service running the probes.
pub struct HealthProber {
    config: Arc<ConfigHandle>,
    connector: Arc<Connector>,
}

impl std::fmt::Debug for HealthProber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthProber").finish_non_exhaustive()
    }
}

impl HealthProber {
    /// Probes the providers of whatever snapshot `config` holds at each round. The prober
    /// has its own `Connector` (probe connections never share the request pool).
    pub fn new(config: Arc<ConfigHandle>) -> Self {
        Self {
            config,
            connector: Arc::new(Connector::new(None)),
        }
    }
}

/// Sends one probe to `provider`, bounded by `check.timeout` (the provider resolved on the
/// spot; the prober passes its registry's, [`probe_resolved`]).
pub async fn probe(
    connector: &Connector,
    provider: &Provider,
    check: &ActiveHealthCheck,
) -> ProbeOutcome {
    probe_resolved(connector, provider, &Upstream::resolve(provider), check).await
}

/// [`probe`] of `provider` resolved as `up` (its adapter and live credential).
pub async fn probe_resolved(
    connector: &Connector,
    provider: &Provider,
    up: &Upstream,
    check: &ActiveHealthCheck,
) -> ProbeOutcome {
    match tokio::time::timeout(check.timeout, probe_inner(connector, provider, up, check)).await {
        Ok(outcome) => outcome,
        Err(_) => ProbeOutcome::Down {
            reason: format!("no answer within {} ms", check.timeout.as_millis()),
            retry_after: None,
        },
    }
}

async fn probe_inner(
    connector: &Connector,
    provider: &Provider,
    up: &Upstream,
    check: &ActiveHealthCheck,
) -> ProbeOutcome {
    let target = match providers::target(provider, up).await {
        Ok(t) => t,
        Err(m) => return down(m),
    };
    match probe_head(provider, up, &target, check) {
        Ok(head) => exchange(connector, &target, head, None).await,
        Err(e) => down(format!("bad probe request: {e}")),
    }
}

/// A [`ProbeOutcome::Down`] without `Retry-After`.
pub(super) fn down(reason: String) -> ProbeOutcome {
    ProbeOutcome::Down {
        reason,
        retry_after: None,
    }
}

/// Sends one probe request on a fresh connection and judges its answer's status; the body is
/// not read. The connection is never pooled: the next probe tests connecting again.
pub(super) async fn exchange(
    connector: &Connector,
    target: &providers::Target,
    head: RequestHeader,
    body: Option<bytes::Bytes>,
) -> ProbeOutcome {
    let mut head = Some(head);
    let opened = exchange::open(
        || connector.get_http_session(&target.peer),
        exchange::Deadlines::default(),
        exchange::Resend::Never,
        || {
            head.take()
                .ok_or("the probe's request head was sent already")
        },
        body,
        |_| {},
    )
    .await;
    let mut up = match opened {
        Ok(up) => up,
        Err(OpenError::Connect(e)) => return down(format!("connect: {e}")),
        Err(OpenError::Send(e)) => return down(format!("request: {}", e.error)),
        // No deadlines (the caller bounds the whole probe), no resend (no second head).
        Err(OpenError::ConnectTimeout | OpenError::FirstByteTimeout) => {
            return down("timeout".into())
        }
        Err(OpenError::Head(e)) => return down(e.into()),
    };
    let outcome = match up.response_header() {
        None => down("no response head".into()),
        Some(h) => {
            let status = h.status.as_u16();
            if crate::routing::retryable_status(status) {
                ProbeOutcome::Down {
                    reason: format!("HTTP {status}"),
                    retry_after: h
                        .headers
                        .get("retry-after")
                        .and_then(|v| parse_retry_after(v.as_bytes())),
                }
            } else {
                ProbeOutcome::Up { status }
            }
        }
    };
    up.shutdown().await;
    outcome
}

/// `GET {base_path}{path}` with `Host`, the provider's credential and no body.
fn probe_head(
    provider: &Provider,
    up: &Upstream,
    target: &providers::Target,
    check: &ActiveHealthCheck,
) -> pingora::Result<RequestHeader> {
    let uri = format!("{}{}", target.base_path, check.path);
    let mut req = RequestHeader::build("GET", uri.as_bytes(), Some(5))?;
    req.insert_header("host", &target.host_header)?;
    req.insert_header("accept", "application/json")?;
    req.insert_header("user-agent", concat!("sluice/", env!("CARGO_PKG_VERSION")))?;
    target.apply_bearer(&mut req)?;
    providers::apply_auth(provider, up, &mut req, &[])?;
    Ok(req)
}

/// The routes of `provider_id` in `cfg`, once per health key: upstream model, dialect and
/// health state (created on first use, so the gauge exists before any traffic).
fn routes_of(cfg: &Config, provider_id: &str) -> Vec<ProbedRoute> {
    let reg = registry();
    let mut seen = HashSet::new();
    cfg.models
        .values()
        .flat_map(|m| m.routes.iter())
        .filter(|r| r.provider.id == provider_id && seen.insert(r.health_key.as_str()))
        .map(|r| {
            (
                r.upstream_model.clone(),
                r.dialect(),
                reg.route(&r.provider.id, &r.health_key),
            )
        })
        .collect()
}

/// One route as the probes see it: its upstream model, the API it speaks (a request probe
/// is sent in it) and its health state.
type ProbedRoute = (String, crate::protocol::UpstreamDialect, Arc<RouteHealth>);

/// Applies decay to every route of `cfg` ([`RouteHealth::refresh`]): without traffic nothing
/// else would, and the gauge should follow.
fn sweep(cfg: &Config) {
    let reg = registry();
    for r in cfg.models.values().flat_map(|m| m.routes.iter()) {
        reg.route(&r.provider.id, &r.health_key)
            .refresh(&r.provider.passive_health);
    }
}

/// Counts one probe in `sluice_health_probes_total`.
fn count(provider: &Provider, mode: ProbeMode, outcome: &ProbeOutcome) {
    let result = match outcome {
        ProbeOutcome::Up { .. } => "up",
        ProbeOutcome::Down { .. } => "down",
    };
    metrics()
        .health_probes_total
        .with_label_values(&[provider.id.as_str(), mode.as_str(), result])
        .inc();
}

/// Applies a provider probe's outcome (`mode: list`) to the routes of `provider`: a failure
/// is a provider-level failure of each; a success lifts only provider-level failures (a
/// route that failed on its own stays as it is).
fn record(provider: &Provider, routes: &[ProbedRoute], outcome: &ProbeOutcome) {
    count(provider, ProbeMode::List, outcome);
    match outcome {
        ProbeOutcome::Up { .. } => {
            for (model, _, r) in routes {
                if !r.record_probe_success(&provider.passive_health) {
                    log::debug!(
                        target: "sluice::routing::probe",
                        "provider probe succeeded; route keeps its own failures provider={} upstream_model={model}",
                        provider.id
                    );
                }
            }
        }
        ProbeOutcome::Down {
            reason,
            retry_after,
        } => {
            log::debug!(
                target: "sluice::routing::probe",
                "health probe failed provider={} reason={reason:?}",
                provider.id
            );
            for (_, _, r) in routes {
                r.record_scoped_failure(
                    &provider.passive_health,
                    FailureScope::Provider,
                    *retry_after,
                );
            }
        }
    }
}

/// Probes every route of `provider` with a minimal real request (`mode: request`), all at
/// once, and applies each outcome to its route as the route's own evidence.
async fn probe_routes(
    connector: Arc<Connector>,
    provider: Arc<Provider>,
    up: Arc<Upstream>,
    check: ActiveHealthCheck,
    routes: Vec<ProbedRoute>,
) {
    let mut probes = JoinSet::new();
    for (model, dialect, health) in routes {
        let (connector, provider, up, check) = (
            connector.clone(),
            provider.clone(),
            up.clone(),
            check.clone(),
        );
        probes.spawn(async move {
            let outcome = super::request_probe::probe_route(
                &connector, &provider, &up, &model, dialect, &check,
            )
            .await;
            count(&provider, ProbeMode::Request, &outcome);
            match outcome {
                ProbeOutcome::Up { .. } => health.record_success(&provider.passive_health, None),
                ProbeOutcome::Down {
                    reason,
                    retry_after,
                } => {
                    log::debug!(
                        target: "sluice::routing::probe",
                        "request probe failed provider={} upstream_model={model} reason={reason:?}",
                        provider.id
                    );
                    health.record_failure(&provider.passive_health, retry_after);
                }
            }
        });
    }
    while probes.join_next().await.is_some() {}
}

#[async_trait]
impl BackgroundService for HealthProber {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut next_due: HashMap<String, Instant> = HashMap::new();
        // Provider id of each running probe task.
        let mut in_flight: HashMap<tokio::task::Id, String> = HashMap::new();
        let mut tasks: JoinSet<()> = JoinSet::new();
        loop {
            let live = self.config.pinned();
            let cfg = live.config.clone();
            sweep(&cfg);
            let now = Instant::now();
            let mut wake = now + MAX_ROUND;
            next_due.retain(|id, _| {
                cfg.providers
                    .get(id)
                    .is_some_and(|p| p.health_check.is_some())
            });
            for provider in cfg.providers.values() {
                let Some(check) = provider.health_check.clone() else {
                    continue;
                };
                // A new provider is probed at once; a shortened interval applies at once.
                let interval = check.interval;
                let due = (*next_due.entry(provider.id.clone()).or_insert(now)).min(now + interval);
                if in_flight.values().any(|id| *id == provider.id) {
                    // Its probe's completion wakes the loop; the next one is scheduled then.
                    next_due.insert(provider.id.clone(), due);
                    continue;
                }
                let due = if due <= now {
                    let routes = routes_of(&cfg, &provider.id);
                    let p = provider.clone();
                    let up = live.registry.upstream(provider);
                    let connector = self.connector.clone();
                    let task = match check.mode {
                        ProbeMode::List => tasks.spawn(async move {
                            let outcome = probe_resolved(&connector, &p, &up, &check).await;
                            record(&p, &routes, &outcome);
                        }),
                        ProbeMode::Request => {
                            tasks.spawn(probe_routes(connector, p, up, check, routes))
                        }
                    };
                    in_flight.insert(task.id(), provider.id.clone());
                    now + interval
                } else {
                    due
                };
                next_due.insert(provider.id.clone(), due);
                wake = wake.min(due);
            }
            drop(cfg);
            drop(live);
            tokio::select! {
                _ = shutdown.changed() => {
                    tasks.abort_all();
                    return;
                }
                Some(done) = tasks.join_next_with_id() => {
                    let id = match done {
                        Ok((id, ())) => id,
                        Err(e) => e.id(),
                    };
                    in_flight.remove(&id);
                }
                () = sleep_until(wake.max(now + Duration::from_millis(10))) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Endpoint, HopTimeouts, PassiveHealth, ProviderKind};
    use sluice_mock_upstream::{Behavior, MockServer, MockState};

    fn provider(port: u16, path_key: Option<&str>) -> Provider {
        let t = Duration::from_secs(1);
        Provider {
            id: "probe-test".into(),
            kind: ProviderKind::Openai,
            endpoint: Some(Endpoint {
                tls: false,
                host: "127.0.0.1".into(),
                port,
                base_path: "/v1".into(),
                ip: Some("127.0.0.1".parse().unwrap()),
            }),
            api_key: path_key.map(|k| crate::secret::Secret::new(k.to_string())),
            ca: None,
            h2_stream_window: 65536,
            timeouts: HopTimeouts::uniform(t),
            health_check: None,
            passive_health: PassiveHealth {
                unhealthy_after_failures: 2,
                cooldown: t,
                ..PassiveHealth::default()
            },
            stream_usage: true,
            max_concurrent_requests: None,
            api_version: None,
            aws: None,
            vertex: None,
            token_source: None,
        }
    }

    fn check(timeout_ms: u64) -> ActiveHealthCheck {
        ActiveHealthCheck {
            mode: ProbeMode::List,
            path: "/models".into(),
            interval: Duration::from_millis(100),
            timeout: Duration::from_millis(timeout_ms),
        }
    }

    #[tokio::test]
    async fn up_down_and_timeout() {
        let state = Arc::new(MockState::new(Behavior::default()));
        let mock = MockServer::start("127.0.0.1:0", state.clone())
            .await
            .unwrap();
        let p = provider(mock.addr().port(), Some("sk-probe-key"));
        let c = Connector::new(None);
        assert_eq!(
            probe(&c, &p, &check(1000)).await,
            ProbeOutcome::Up { status: 200 }
        );
        let log = state.log();
        assert_eq!(log.len(), 1);
        assert_eq!(log[0].method, "GET");
        assert_eq!(log[0].path, "/v1/models");
        assert_eq!(
            log[0].headers.get("authorization").map(String::as_str),
            Some("Bearer sk-probe-key")
        );

        state.set_default_behavior(Behavior {
            status: Some(429),
            retry_after_s: Some(7),
            ..Behavior::default()
        });
        assert_eq!(
            probe(&c, &p, &check(1000)).await,
            ProbeOutcome::Down {
                reason: "HTTP 429".into(),
                retry_after: Some(Duration::from_secs(7)),
            }
        );

        state.set_default_behavior(Behavior {
            stall: Some(true),
            ..Behavior::default()
        });
        let started = Instant::now();
        assert!(matches!(
            probe(&c, &p, &check(150)).await,
            ProbeOutcome::Down { .. }
        ));
        assert!(started.elapsed() < Duration::from_secs(1));

        // A 404 (no such path) still proves the provider answers.
        state.set_default_behavior(Behavior::default());
        let mut odd = check(1000);
        odd.path = "/nope".into();
        assert_eq!(probe(&c, &p, &odd).await, ProbeOutcome::Up { status: 404 });
    }

    #[tokio::test]
    async fn refused_connection_is_down() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let p = provider(port, None);
        let c = Connector::new(None);
        assert!(matches!(
            probe(&c, &p, &check(1000)).await,
            ProbeOutcome::Down { .. }
        ));
    }
}
