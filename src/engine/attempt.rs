//! Owns the attempt loop of the LLM endpoints: try the candidate routes in order over
//! the upstream [`Connector`] (Pingora's connect, TLS and H1/H2 client; HTTP/1.1 pooling in
//! [`crate::engine::pool`]), commit to the client only on a good
//! upstream answer, then pump the stream. The loop runs in stages: the model asked for, then
//! what [`crate::engine::fallback`] adds (other standard models, larger routes after a context-length
//! rejection); the stages share the retry policy's per-route logic and the fallback metrics.
//!
//! Why a loop inside `request_filter` and not Pingora's native retry: the native path replays
//! at most 64 KiB of request body and has no timer hook (see `PINGORA-NOTES.md` 1.4-1.6).
//! Here the body is read once and replayed to any number of providers, and every wait is a
//! `select!` over the upstream, timers and the downstream noticing a close.
//!
//! The line it never crosses: **fallback only before the first byte** reaches the client.
//! For streams the response head is held until the first upstream SSE data event arrives,
//! so a provider that fails before that is invisible to the client. After the commit a
//! failure ends the stream with an SSE error event; a non-streaming answer whose body broke
//! gets 502. A request is never sent again after any byte of its response was received.
//!
//! One attempt is two phases ([`crate::engine::open`]): `prepare` (connect, send, read the head and, for a stream,
//! hold its first data event) touches no downstream state and is a future the caller races
//! against the client's disconnect and shutdown, and, hedged, against another route's
//! ([`crate::engine::hedge`], which runs every attempt of the loop); `commit` then writes the
//! answer. Dropping a `prepare` drops its upstream connection.
//!
//! The unary exchange is [`crate::stream::unary`], the stream pump [`crate::stream::pump`]; what they share
//! about an attempt's end is [`crate::engine::upstream`]. None of them names a provider kind: the
//! provider's converters ([`crate::protocol`]) and its request head and signer
//! ([`crate::providers`]) are chosen from the route.

use std::sync::Arc;
use std::time::Duration;

use crate::engine::fallback::Later;
use crate::engine::pool::Connector;
use crate::engine::state::{candidate_at, AttemptState};
use pingora::proxy::Session;

use crate::backpressure::provider as provider_cap;
use crate::config::{Model, Route};
use crate::engine::fallback;
use crate::engine::hedge;
pub use crate::engine::upstream::ClientGone;
use crate::engine::upstream::{client_gone, Attempt};
use crate::error::{AttemptError, AttemptFailure, GatewayError};
use crate::ingress::request::InferenceRequest;
use crate::ingress::respond;
use crate::metrics::metrics;
use crate::proxy::ctx::RequestCtx;
use crate::routing::Candidate;

/// Runs the attempt loop and writes the response: the candidates of `model`, then the
/// stages the fallback chain ([`fallback::Chain`]) adds (other models, or larger routes after
/// a context-length rejection). `unplanned` is why `candidates` is empty, when it is (the
/// client's answer if no fallback model serves either).
///
/// # Errors
/// [`ClientGone`] when the client disconnected (nothing more can be written).
pub async fn run(
    connector: &Connector,
    session: &mut Session,
    ctx: &mut RequestCtx,
    req: &InferenceRequest,
    model: &Model,
    candidates: &[Candidate<'_>],
    unplanned: Option<GatewayError>,
) -> Result<(), ClientGone> {
    // The chain borrows the pinned snapshot; the caller is copied only when the chain may
    // leave the model asked for (fallback lists or a body `models`).
    let config = Arc::clone(&ctx.config);
    let chained = !req.models.is_empty()
        || !model.fallback_models.is_empty()
        || !model.context_fallback_models.is_empty();
    let caller = if chained { ctx.caller.clone() } else { None };
    let mut chain = fallback::Chain::new(
        &config,
        caller.as_ref(),
        model,
        &req.models,
        req.preference.as_ref(),
    );
    let mut st = LoopState {
        last_error: unplanned,
        ..LoopState::default()
    };
    let mut stage_model = model;
    let mut owned: Vec<Candidate<'_>>;
    let mut cands = candidates;
    let mut entry_reason = None;
    let mut later: Vec<Later<'_>>;
    loop {
        if stage_model.id != model.id {
            ctx.answered_model = Some(stage_model.id.clone());
        } else {
            ctx.answered_model = None;
        }
        later = later_routes(&chain, req, stage_model);
        let end = run_stage(
            AttemptState {
                connector,
                session: &mut *session,
                ctx: &mut *ctx,
                req,
                model: stage_model,
                candidates: cands,
                later: &later,
            },
            entry_reason,
            &mut st,
        )
        .await?;
        match end {
            StageEnd::Done => return Ok(()),
            StageEnd::Exhausted => {}
            StageEnd::Context { at, err } => {
                let window = cands.get(at).and_then(|c| c.route.context_window_tokens);
                let larger = chain.larger_routes(cands.get(at + 1..).unwrap_or_default(), window);
                chain.context_rejected(stage_model);
                st.last_error = Some(err);
                if !larger.is_empty() {
                    owned = larger;
                    cands = &owned;
                    entry_reason = Some("context_length");
                    continue;
                }
            }
        }
        let Some(next) = chain.next_stage(
            &req.needs,
            || req.estimated_input_tokens(),
            req.preference.as_ref(),
        ) else {
            break;
        };
        stage_model = next.model;
        owned = next.candidates;
        cands = &owned;
        entry_reason = Some(next.reason);
    }
    if let Some((p, served)) = st.rejected_by.take() {
        // The last word was a provider's context-length rejection: that provider (a route
        // of the stage's model) answered.
        ctx.outcome.provider = Some(p);
        ctx.outcome.served_model = Some(served);
    } else if name_last_attempt(ctx) {
        // The last attempt's provider had the request (see there).
    } else {
        // Nothing answered: the request is the model's it asked for (log, ledger).
        ctx.answered_model = None;
    }
    if let Some(GatewayError::Overloaded {
        reason: "provider_capacity",
        ..
    }) = &st.last_error
    {
        metrics()
            .rejected_total
            .with_label_values(&["provider_capacity"])
            .inc();
    }
    let err = st.last_error.unwrap_or_else(|| GatewayError::NoRoute {
        message: format!("no healthy provider for model `{}` right now", model.id),
        retry_after: None,
    });
    let _ = respond::write_error(session, ctx, &err).await;
    Ok(())
}

/// Records against the last failed attempt's provider a request that nothing answered, when
/// that provider had the request: a timed-out attempt (a head or first event; it worked on
/// the prompt) is recorded (ledger, access log) at its estimated input, the route's cost, the
/// tenant not charged; an answer the client could not read (an unreadable body, a stream to
/// a non-stream request, an in-band error) names its provider, with no usage. Returns
/// whether it did.
fn name_last_attempt(ctx: &mut RequestCtx) -> bool {
    let Some(ae) = ctx.attempts.failed.last() else {
        return false;
    };
    let (worked, answered) = (
        ae.failure.provider_worked(),
        ae.failure == AttemptFailure::Protocol,
    );
    if !worked && !answered {
        return false;
    }
    ctx.outcome.provider = Some(ae.provider.clone());
    ctx.outcome.upstream_model = Some(ae.upstream_model.clone());
    if worked {
        ctx.outcome.usage_estimated = true;
        ctx.outcome.input_unknown = true;
        ctx.outcome.cost_only = true;
    }
    true
}

/// The routes of the models after `model` in the request's fallback chain, for a model
/// that hedges or continues a broken stream (they may go on to those, as fallback would);
/// none for another model (no planning).
fn later_routes<'c>(
    chain: &fallback::Chain<'c>,
    req: &InferenceRequest,
    model: &Model,
) -> Vec<Later<'c>> {
    if model.hedge_after.is_some() || model.continue_on_break {
        chain.peek_later(
            &req.needs,
            || req.estimated_input_tokens(),
            req.preference.as_ref(),
        )
    } else {
        Vec::new()
    }
}

/// What the stages of one request share.
#[derive(Default)]
struct LoopState {
    /// The error the client gets if nothing answers.
    last_error: Option<GatewayError>,
    /// The route that failed last: its provider and the failure's label, for
    /// `sluice_fallback_total` when the next candidate starts.
    previous: Option<(String, &'static str)>,
    /// The provider whose context-length rejection is `last_error`.
    rejected_by: Option<(String, String)>,
    /// A hedge was started (at most one per request).
    hedged: bool,
    /// The health key of a later model's route a hedge went to: its stage skips it.
    hedged_later: Option<String>,
}

/// How one stage ended without an answer written.
enum StageEnd {
    /// A response was written (an answer, or a final error).
    Done,
    /// Every candidate failed or was resting.
    Exhausted,
    /// The candidate at `at` rejected the request as too long for its context window.
    Context {
        /// Its index in the stage's candidates.
        at: usize,
        /// The provider's error (the client's answer when nothing follows).
        err: GatewayError,
    },
}

/// Tries the candidates of one stage in order (same-route retries per `model.retry`).
#[expect(
    clippy::too_many_lines,
    reason = "one attempt's outcomes read best side by side"
)]
async fn run_stage(
    s: AttemptState<'_, '_>,
    mut entry_reason: Option<&'static str>,
    st: &mut LoopState,
) -> Result<StageEnd, ClientGone> {
    let AttemptState {
        connector,
        session,
        ctx,
        req,
        model,
        candidates,
        later,
    } = s;
    // The candidate a hedge went to (at most one per request): not tried again.
    let mut hedged: Option<usize> = None;
    for (idx, cand) in candidates.iter().enumerate() {
        if hedged == Some(idx) || st.hedged_later.as_deref() == Some(cand.route.health_key.as_str())
        {
            continue;
        }
        let route = cand.route;
        // A provider at its own cap (`max_concurrent_requests`) is skipped, its health
        // untouched: full is not failing.
        let _provider_slot = match provider_cap::try_take(&route.provider) {
            provider_cap::ProviderAdmission::Full => {
                if st.last_error.is_none() {
                    st.last_error = Some(provider_full(route));
                }
                st.previous = Some((route.provider.id.clone(), "provider_capacity"));
                continue;
            }
            provider_cap::ProviderAdmission::Slot(slot) => Some(slot),
            provider_cap::ProviderAdmission::Uncapped => None,
        };
        if !cand.admit() {
            continue;
        }
        // The step into a new stage is labelled by why the chain moved on.
        let step_reason = entry_reason.take();
        if let Some((from, reason)) = st.previous.take() {
            crate::metrics::series::count_fallback(&[
                // The model asked for (a fallback's step is told by its reason).
                ctx.standard_model.as_deref().unwrap_or(model.id.as_str()),
                from.as_str(),
                route.provider.id.as_str(),
                step_reason.unwrap_or(reason),
            ]);
        }
        let policy = &model.retry;
        cand.health.retry_budget().record_request();
        let mut tries_here = 0u32;
        loop {
            tries_here += 1;
            ctx.attempts.count += 1;
            let tried = hedge::attempt(
                AttemptState {
                    connector,
                    session: &mut *session,
                    ctx: &mut *ctx,
                    req,
                    model,
                    candidates,
                    later,
                },
                idx,
                !st.hedged,
            )
            .await;
            // A hedged pair may have ended on the hedge's candidate: the rest is about it.
            if let Some(h) = tried.hedge {
                st.hedged = true;
                hedged = Some(h);
                if h >= candidates.len() {
                    let (_, partner) = candidate_at(model, candidates, later, h);
                    st.hedged_later = Some(partner.route.health_key.clone());
                }
            }
            let (served_model, cand) = candidate_at(model, candidates, later, tried.served);
            let route = cand.route;
            match tried.outcome {
                Attempt::Done => {
                    crate::metrics::series::count_attempt_ok(route.provider.id.as_str());
                    if ctx.outcome.upstream_broke {
                        // Answered, then broke mid-way: the client got an error, so does health.
                        cand.health
                            .record_failure(&route.provider.passive_health, None);
                    } else {
                        cand.health
                            .record_success(&route.provider.passive_health, ctx.outcome.ttft);
                    }
                    #[expect(clippy::cast_precision_loss, reason = "small counts")]
                    metrics()
                        .fallback_depth
                        .observe(ctx.fallback_depth() as f64);
                    return Ok(StageEnd::Done);
                }
                Attempt::Final(err) if fallback::is_context_rejection(&err) => {
                    // The provider answered (healthy); the prompt is too long for this route.
                    cand.health
                        .record_success(&route.provider.passive_health, None);
                    let reason = AttemptFailure::ContextLength.label();
                    log::info!(target: "sluice::proxy::attempt",
                        "attempt rejected request_id={} provider={} upstream_model={} reason={reason}",
                        ctx.request_id, route.provider.id, route.upstream_model
                    );
                    metrics()
                        .upstream_attempts_total
                        .with_label_values(&[route.provider.id.as_str(), reason])
                        .inc();
                    ctx.attempts.failed.push(AttemptError {
                        provider: route.provider.id.clone(),
                        upstream_model: route.upstream_model.clone(),
                        failure: AttemptFailure::ContextLength,
                        detail: format!("HTTP {}", err.status()),
                        retry_after: None,
                    });
                    ctx.attempts.failed_routes += 1;
                    st.previous = Some((route.provider.id.clone(), reason));
                    st.rejected_by = Some((
                        route.provider.id.clone(),
                        served_model.served_name(route).to_string(),
                    ));
                    return Ok(StageEnd::Context {
                        at: tried.served,
                        err,
                    });
                }
                Attempt::Final(err) => {
                    // The provider answered (a 4xx about the request): it is healthy.
                    cand.health
                        .record_success(&route.provider.passive_health, None);
                    ctx.outcome.provider = Some(route.provider.id.clone());
                    ctx.outcome.served_model = Some(served_model.served_name(route).to_string());
                    let _ = respond::write_error(session, ctx, &err).await;
                    return Ok(StageEnd::Done);
                }
                Attempt::Shutdown => {
                    cand.release_trial();
                    let err = GatewayError::Overloaded {
                        message: "the gateway is shutting down; retry the request".into(),
                        reason: "shutting_down",
                        retry_after: Duration::from_secs(1),
                    };
                    let _ = respond::write_error(session, ctx, &err).await;
                    return Ok(StageEnd::Done);
                }
                Attempt::Gone(g) => {
                    cand.release_trial();
                    return Err(g);
                }
                Attempt::Failed(ae, err) => {
                    // Nothing of this route reached the client (a unary answer may fail
                    // after its commit began, before any byte was written).
                    ctx.outcome.served_model = None;
                    let reason = ae.failure.label();
                    log::info!(target: "sluice::proxy::attempt",
                        "attempt failed request_id={} provider={} upstream_model={} reason={} detail={:?}",
                        ctx.request_id, ae.provider, ae.upstream_model, reason, ae.detail
                    );
                    metrics()
                        .upstream_attempts_total
                        .with_label_values(&[route.provider.id.as_str(), reason])
                        .inc();
                    // Same-route retry (`retry` policy): a listed failure, attempts left on
                    // this route, a `Retry-After` short enough to wait out (a longer one rests
                    // the route and the request falls back), and room in the route's budget.
                    let wait = match ae.retry_after {
                        Some(ra) if ra > policy.max_retry_after_wait => None,
                        Some(ra) => Some(ra),
                        None => Some(policy.backoff(tries_here)),
                    };
                    // A half-open trial is a single request: it falls back at once.
                    let wait = wait.filter(|_| {
                        tried.hedge.is_none()
                            && !cand.is_trial()
                            && policy.retries(ae.failure)
                            && tries_here < policy.max_attempts_per_route
                            && cand.health.retry_budget().try_retry(policy.budget_ratio)
                    });
                    // A wait this request takes on the route is not the route's cool-down.
                    cand.health.record_attempt_failure(
                        &route.provider.passive_health,
                        ae.failure,
                        if wait.is_some() { None } else { ae.retry_after },
                    );
                    ctx.attempts.failed.push(ae);
                    st.last_error = Some(err);
                    st.rejected_by = None;
                    // A route that just started resting (turned unhealthy, or its half-open
                    // trial failed) gets no second request: the trial is a single request.
                    let resting = cand.health.cooldown_remaining().is_some();
                    if let Some(wait) = wait.filter(|_| !resting) {
                        metrics()
                            .upstream_retries_total
                            .with_label_values(&[route.provider.id.as_str(), reason])
                            .inc();
                        tokio::select! {
                            () = tokio::time::sleep(wait) => {}
                            () = client_gone(session) => return Err(ClientGone("retry_backoff")),
                        }
                        continue;
                    }
                    st.previous = Some((route.provider.id.clone(), reason));
                    ctx.attempts.failed_routes += 1;
                    break;
                }
            }
        }
    }
    Ok(StageEnd::Exhausted)
}

/// The 503 of a request whose candidates' providers are all at their
/// `max_concurrent_requests` (the client may retry at once: places free up as streams end).
fn provider_full(route: &Route) -> GatewayError {
    GatewayError::Overloaded {
        message: format!(
            "provider `{}` is at its limit of concurrent requests; retry shortly",
            route.provider.id
        ),
        reason: "provider_capacity",
        retry_after: Duration::from_secs(1),
    }
}
