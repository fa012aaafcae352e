//! Owns hedged requests (`models.<id>.hedge_after_ms`, opt-in): when an attempt has not
//! delivered its first event after the model's delay (a number of ms, or `auto`: the
//! route's observed time-to-first-event p95, see [`crate::routing::ttft`]), the next
//! healthy candidate is started beside it. The first of the two to be ready to commit wins
//! and is committed to the client; the other is cancelled at once (its future dropped, so
//! its upstream connection is closed before the winner's first byte is written).
//!
//! What "ready" means is [`crate::engine::open::prepare`]'s: for a stream, the first upstream
//! SSE data event is held; for a non-streaming answer, its 2xx response head has arrived
//! (providers send it when the answer is ready), and the body is read after the race.
//!
//! Rules:
//! - At most one hedge per request. A hedge takes one retry from the first route's retry
//!   budget ([`crate::routing::retry::RetryBudget`]): hedges and same-route retries together
//!   stay within `retry.budget_ratio` of the route's requests. No room: no hedge
//!   (`sluice_hedges_total{outcome="no_budget"}`).
//! - The hedge goes to the next candidate that is healthy and not resting: a later route of
//!   the model, else a route of a later model of the request's fallback chain
//!   (`engine::fallback::Later`, planned with the chain's checks: the key's models and
//!   providers, capabilities, the preference), which then answers as a model-level
//!   fallback would (its id in the answer). It never claims a half-open trial
//!   (`no_partner` when there is none).
//! - Both attempts race the client's disconnect and shutdown.
//! - One attempt failing lets the other go on alone; its failure is recorded (health,
//!   `sluice_upstream_attempts_total`, the request's attempts). A final error (a 4xx about
//!   the request) ends both. After a hedged pair the request is not retried on either
//!   route: it falls back to the candidates after them.
//! - The cancelled attempt is one of the request's attempts (access log and ledger
//!   `attempts`) and `sluice_upstream_attempts_total{outcome="hedge_cancelled"}`. It
//!   delivered no event, so no usage figure came from the provider, but the provider was
//!   sent the prompt and may bill it: its usage is recorded as Sluice's estimate
//!   ([`CancelledHedge`], priced by [`crate::billing::metering::Metered::cancelled_hedge`]): the
//!   request's input-token estimate (computed at most once per request, after the attempt
//!   loop, so never before the winner's first byte; for a stream whose provider reported
//!   the input before the commit, that figure, the same prompt counted by a provider; for
//!   another stream, from the sample of the prompt it keeps past the commit) at the loser
//!   route's input price,
//!   output 0, charge 0 (budgets never see it). At the request's end it is its own ledger
//!   row (`outcome: "hedge_cancelled"`, `estimated: true`, status 0, attempts 1, the
//!   loser's provider and upstream model; the winner's row is unchanged) and is added to
//!   `sluice_cost_usd_total` and `sluice_tokens_total{kind="input"}` (which include
//!   estimates, as for streams that ended without usage). Every attempt counted as
//!   `hedge_cancelled` gets such a row: the loser of a won race, and the other side when a
//!   race ended without a winner (a final error, the client leaving, shutdown). Nothing of
//!   this runs unless a hedge race cancels an attempt.
//!
//! Every successful pre-commit feeds the route's time-to-first-event samples (hedged or
//! not), so `auto` learns from all traffic of the route.

use std::time::Duration;

use pingora::proxy::Session;
use tokio::time::Instant;

use crate::backpressure::provider as provider_cap;
use crate::billing::metering::CancelledHedge;
use crate::config::opt_in::HedgeAfter;
use crate::config::Model;
use crate::engine::open::{commit, prepare, Phase, Ready};
use crate::engine::state::{candidate_at, AttemptState};
use crate::engine::upstream::{client_gone, Attempt, ClientGone};
use crate::metrics::metrics;
use crate::proxy::ctx::RequestCtx;
use crate::routing::health::Health;
use crate::routing::Candidate;

/// What one call of [`attempt`] did.
pub(crate) struct Tried {
    /// How the request's attempt (or hedged pair) ended, for the attempt loop.
    pub(crate) outcome: Attempt,
    /// The candidate `outcome` is about (the hedge's when it served or failed last).
    pub(crate) served: usize,
    /// The candidate that was started as a hedge, if any: the attempt loop skips it later
    /// and does not retry after the pair.
    pub(crate) hedge: Option<usize>,
}

/// One attempt on `candidates[idx]`, hedged onto a later candidate when the model asks for
/// it and `may_hedge` (no hedge yet in this request); see the module docs.
pub(crate) async fn attempt(s: AttemptState<'_, '_>, idx: usize, may_hedge: bool) -> Tried {
    let AttemptState {
        connector,
        session,
        ctx,
        req,
        model,
        candidates,
        later,
    } = s;
    let phases = [Phase::default(), Phase::default()];
    let tried = attempt_phased(
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
        may_hedge,
        &phases,
    )
    .await;
    // Stale-connection resends of attempts that did not commit (failed or cancelled).
    settle(ctx, &phases);
    tried
}

/// [`attempt`] with the primary's and the hedge's [`Phase`].
#[expect(
    clippy::too_many_lines,
    reason = "the hedge's phases read best in one place"
)]
async fn attempt_phased(
    s: AttemptState<'_, '_>,
    idx: usize,
    may_hedge: bool,
    phases: &[Phase; 2],
) -> Tried {
    let AttemptState {
        connector,
        session,
        ctx,
        req,
        model,
        candidates,
        later,
    } = s;
    let primary = &candidates[idx];
    ctx.outcome
        .upstream_started
        .get_or_insert_with(Instant::now);
    let all = candidates.len() + later.len();
    let delay = if may_hedge && idx + 1 < all {
        hedge_delay(model, primary)
    } else {
        None
    };
    let alone = |outcome| Tried {
        outcome,
        served: idx,
        hedge: None,
    };
    let started = Instant::now();
    let (phase, hedge_phase) = (&phases[0], &phases[1]);
    let Some(delay) = delay else {
        // No hedge possible: the plain attempt (boxed like the hedged ones, so that its
        // ~5 KiB of state is not part of every caller's future).
        let ready = {
            let pre = Box::pin(prepare(connector, ctx, req, model, primary.route, phase));
            tokio::select! {
                biased;
                () = client_gone(session) => return alone(Attempt::Gone(ClientGone(phase.label()))),
                () = crate::shutdown::streams_cancelled() => return alone(Attempt::Shutdown),
                r = pre => r,
            }
        };
        return alone(match ready {
            Ok(ready) => {
                sample(primary, started, &ready);
                {
                    settle(ctx, phases);
                    commit(
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
                        ready,
                    )
                    .await
                }
            }
            Err(a) => a,
        });
    };

    // Phase A: the first attempt alone until the hedge timer. Boxed, so that dropping it
    // (the race lost) drops its upstream connection there and then.
    let mut p = Box::pin(prepare(connector, ctx, req, model, primary.route, phase));
    let first = tokio::select! {
        biased;
        () = client_gone(session) => Some(Err(Attempt::Gone(ClientGone(phase.label())))),
        () = crate::shutdown::streams_cancelled() => Some(Err(Attempt::Shutdown)),
        r = &mut p => Some(r),
        () = tokio::time::sleep(delay) => None,
    };
    if let Some(r) = first {
        drop(p);
        return alone(match r {
            Ok(ready) => {
                sample(primary, started, &ready);
                {
                    settle(ctx, phases);
                    commit(
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
                        ready,
                    )
                    .await
                }
            }
            Err(a) => a,
        });
    }

    // The timer fired: a hedge, if the budget and a partner allow.
    // The partner: the next healthy route of this model, else of a later model of the
    // fallback chain (`later`, planned with the chain's checks).
    let at = |j: usize| candidate_at(model, candidates, later, j);
    let partner = (idx + 1..all).find(|&j| {
        let h = &at(j).1.health;
        h.state() == Health::Healthy && h.is_available()
    });
    // The partner's provider cap (`max_concurrent_requests`) holds for the hedge too; the
    // place is kept until this function returns (after the commit, if the hedge served).
    let (partner, _hedge_slot) =
        match partner.map(|j| (j, provider_cap::try_take(&at(j).1.route.provider))) {
            Some((_, provider_cap::ProviderAdmission::Full)) | None => (None, None),
            Some((j, provider_cap::ProviderAdmission::Slot(s))) => (Some(j), Some(s)),
            Some((j, provider_cap::ProviderAdmission::Uncapped)) => (Some(j), None),
        };
    let skipped = match partner {
        None => Some("no_partner"),
        Some(_)
            if !primary
                .health
                .retry_budget()
                .try_retry(model.retry.budget_ratio) =>
        {
            Some("no_budget")
        }
        Some(_) => None,
    };
    let (Some(j), None) = (partner, skipped) else {
        count(model, skipped.unwrap_or("no_partner"));
        let ready = tokio::select! {
            biased;
            () = client_gone(session) => return alone(Attempt::Gone(ClientGone(phase.label()))),
            () = crate::shutdown::streams_cancelled() => return alone(Attempt::Shutdown),
            r = &mut p => r,
        };
        drop(p);
        return alone(match ready {
            Ok(ready) => {
                sample(primary, started, &ready);
                {
                    settle(ctx, phases);
                    commit(
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
                        ready,
                    )
                    .await
                }
            }
            Err(a) => a,
        });
    };

    // Phase B: both race; the first ready wins.
    let (hedge_model, hedge) = at(j);
    log::info!(target: "sluice::proxy::hedge",
        "hedge started request_id={} model={} primary={} hedge={} hedge_model={} after_ms={}",
        ctx.request_id,
        model.id,
        primary.route.provider.id,
        hedge.route.provider.id,
        hedge_model.id,
        delay.as_millis()
    );
    let hedge_started = Instant::now();
    let raced = {
        let mut h = Box::pin(prepare(
            connector,
            ctx,
            req,
            hedge_model,
            hedge.route,
            hedge_phase,
        ));
        race(session, &mut p, &mut h, phase).await
    };
    drop(p);
    let tried = |outcome, served| Tried {
        outcome,
        served,
        hedge: Some(j),
    };
    // The extra upstream request is one of the request's attempts.
    ctx.attempts.count += 1;
    let side = |s: Side| if s == Side::Primary { idx } else { j };
    let start_of = |s: Side| {
        if s == Side::Primary {
            started
        } else {
            hedge_started
        }
    };
    match raced {
        Raced::Won {
            ready,
            winner,
            earlier_failure,
        } => {
            let served = side(winner);
            sample(at(served).1, start_of(winner), &ready);
            match earlier_failure {
                // The other one failed first: a failed attempt, not a cancelled one.
                Some(failure) => {
                    let failed = winner.other();
                    record_failed(ctx, model, at(side(failed)), at(served), failed, failure);
                }
                None => {
                    let (loser_model, loser) = at(side(winner.other()));
                    cancelled(ctx, loser_model, loser, start_of(winner.other()));
                }
            }
            count(
                model,
                if winner == Side::Hedge {
                    "hedge_won"
                } else {
                    "primary_won"
                },
            );
            settle(ctx, phases);
            let outcome = if served < candidates.len() {
                commit(
                    AttemptState {
                        connector,
                        session: &mut *session,
                        ctx: &mut *ctx,
                        req,
                        model,
                        candidates,
                        later,
                    },
                    served,
                    ready,
                )
                .await
            } else {
                // A later model's route won: that model answers (its id in the answer), and
                // a broken stream continues on the routes after it.
                let k = served - candidates.len();
                let won = &later[k];
                ctx.answered_model = Some(won.model.id.clone());
                commit(
                    AttemptState {
                        connector,
                        session: &mut *session,
                        ctx: &mut *ctx,
                        req,
                        model: won.model,
                        candidates: std::slice::from_ref(&won.cand),
                        later: &later[k + 1..],
                    },
                    0,
                    ready,
                )
                .await
            };
            tried(outcome, served)
        }
        Raced::Ended {
            outcome,
            last,
            earlier_failure,
        } => {
            count(model, "none");
            match earlier_failure {
                Some(failure) => {
                    let failed = last.other();
                    record_failed(
                        ctx,
                        model,
                        at(side(failed)),
                        at(side(last)),
                        failed,
                        failure,
                    );
                }
                None => {
                    let other = last.other();
                    let (other_model, other_cand) = at(side(other));
                    cancelled(ctx, other_model, other_cand, start_of(other));
                }
            }
            tried(outcome, side(last))
        }
    }
}

/// Counts the stale-connection resends the phases made as attempts (before a commit, so
/// that `x-sluice-attempts` includes them).
fn settle(ctx: &mut RequestCtx, phases: &[Phase; 2]) {
    for p in phases {
        p.settle(ctx);
    }
}

/// The hedge delay for a request of `model` whose first attempt goes to `primary`.
fn hedge_delay(model: &Model, primary: &Candidate<'_>) -> Option<Duration> {
    match model.hedge_after? {
        HedgeAfter::Fixed(d) => Some(d),
        HedgeAfter::Auto => primary.health.first_event().p95(),
    }
}

/// Which of the two racing attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// The request's attempt on its candidate.
    Primary,
    /// The hedge on the next candidate.
    Hedge,
}

impl Side {
    fn other(self) -> Self {
        match self {
            Self::Primary => Self::Hedge,
            Self::Hedge => Self::Primary,
        }
    }
}

/// How a race of two pre-commits ended.
enum Raced<'r> {
    /// `winner` is ready to commit; the other was cancelled, or failed first
    /// (`earlier_failure`).
    Won {
        ready: Ready<'r>,
        winner: Side,
        earlier_failure: Option<Attempt>,
    },
    /// Nothing to commit: `outcome` is the last side's (`last`) failure, a final error, the
    /// client leaving or shutdown; `earlier_failure` is the other side's when it failed
    /// first (else it was cancelled).
    Ended {
        outcome: Attempt,
        last: Side,
        earlier_failure: Option<Attempt>,
    },
}

/// Races two pre-commits and the client's disconnect. A side that fails lets the other go
/// on alone; a final error ends both.
async fn race<'r, P, H>(session: &mut Session, p: &mut P, h: &mut H, phase: &Phase) -> Raced<'r>
where
    P: std::future::Future<Output = Result<Ready<'r>, Attempt>> + Unpin,
    H: std::future::Future<Output = Result<Ready<'r>, Attempt>> + Unpin,
{
    let mut failed: Option<(Side, Attempt)> = None;
    loop {
        let p_live = !matches!(failed, Some((Side::Primary, _)));
        let h_live = !matches!(failed, Some((Side::Hedge, _)));
        let (side, r) = tokio::select! {
            biased;
            () = client_gone(session) => {
                let (last, earlier_failure) = split(failed);
                return Raced::Ended {
                    outcome: Attempt::Gone(ClientGone(phase.label())),
                    last,
                    earlier_failure,
                };
            }
            () = crate::shutdown::streams_cancelled() => {
                let (last, earlier_failure) = split(failed);
                return Raced::Ended { outcome: Attempt::Shutdown, last, earlier_failure };
            }
            r = &mut *p, if p_live => (Side::Primary, r),
            r = &mut *h, if h_live => (Side::Hedge, r),
        };
        match r {
            Ok(ready) => {
                return Raced::Won {
                    ready,
                    winner: side,
                    earlier_failure: failed.map(|(_, a)| a),
                }
            }
            Err(a @ Attempt::Failed(..)) if failed.is_none() => failed = Some((side, a)),
            Err(a) => {
                return Raced::Ended {
                    outcome: a,
                    last: side,
                    earlier_failure: failed.map(|(_, a)| a),
                }
            }
        }
    }
}

/// For an end without a winner: the side the outcome is about (the primary unless only the
/// hedge is left) and the earlier failure.
fn split(failed: Option<(Side, Attempt)>) -> (Side, Option<Attempt>) {
    match failed {
        Some((side, a)) => (side.other(), Some(a)),
        None => (Side::Primary, None),
    }
}

/// Feeds `cand`'s time-to-first-event samples with an attempt that became ready (a stream's
/// first data event, a non-streaming answer's head), started at `started`.
fn sample(cand: &Candidate<'_>, started: Instant, ready: &Ready<'_>) {
    if ready.early_committed() {
        return;
    }
    cand.health.first_event().record(started.elapsed());
}

/// Records the loser of a race (a `model` route, started at `started`): cancelled before
/// its first event. Its usage is kept for the request's end ([`CancelledHedge`]), where the
/// input estimate is at hand.
fn cancelled(ctx: &mut RequestCtx, model: &Model, loser: &Candidate<'_>, started: Instant) {
    loser.release_trial();
    let route = loser.route;
    metrics()
        .upstream_attempts_total
        .with_label_values(&[route.provider.id.as_str(), "hedge_cancelled"])
        .inc();
    log::info!(target: "sluice::proxy::hedge",
        "hedge loser cancelled request_id={} provider={} upstream_model={}",
        ctx.request_id,
        route.provider.id,
        route.upstream_model
    );
    let fallback_depth = ctx.fallback_depth();
    ctx.billing.cancelled_hedges.push(CancelledHedge {
        model: model.id.clone(),
        provider: route.provider.id.clone(),
        upstream_model: route.upstream_model.clone(),
        prices: crate::billing::metering::Prices::cost(route),
        ran: started.elapsed(),
        fallback_depth,
        input_tokens: 0,
    });
}

/// Records the failure of the `which` side's candidate (with its model) while `then` went
/// on: what the attempt loop records for a failed attempt (log, metric, health, the
/// request's attempts), and a fallback when the first attempt (of the stage's `model`)
/// failed and the hedge carried on.
fn record_failed(
    ctx: &mut RequestCtx,
    model: &Model,
    (_, cand): (&Model, &Candidate<'_>),
    (_, then): (&Model, &Candidate<'_>),
    which: Side,
    failure: Attempt,
) {
    let Attempt::Failed(ae, _err) = failure else {
        return;
    };
    let provider = cand.route.provider.id.as_str();
    let reason = ae.failure.label();
    log::info!(target: "sluice::proxy::attempt",
        "attempt failed request_id={} provider={} upstream_model={} reason={} detail={:?} hedged=true",
        ctx.request_id, ae.provider, ae.upstream_model, reason, ae.detail
    );
    metrics()
        .upstream_attempts_total
        .with_label_values(&[provider, reason])
        .inc();
    cand.health.record_attempt_failure(
        &cand.route.provider.passive_health,
        ae.failure,
        ae.retry_after,
    );
    ctx.attempts.failed.push(ae);
    if which == Side::Primary {
        // The first attempt failed and the hedge carried on: a fallback.
        ctx.attempts.failed_routes += 1;
        crate::metrics::series::count_fallback(&[
            model.id.as_str(),
            provider,
            then.route.provider.id.as_str(),
            reason,
        ]);
    }
}

/// Counts one fired hedge timer by outcome.
fn count(model: &Model, outcome: &str) {
    metrics()
        .hedges_total
        .with_label_values(&[model.id.as_str(), outcome])
        .inc();
}
