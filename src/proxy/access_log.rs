//! Owns the one access-log line per request (written in Pingora's `logging` phase) and the
//! per-request metrics recorded with it. Fields, in a fixed order:
//! `request_id tenant key_id standard_model upstream_model provider attempts status outcome
//! ttft_ms duration_ms bytes_out input_tokens output_tokens cached_input_tokens
//! cache_write_tokens reasoning_tokens estimated cost_usd charge_usd client answered_model
//! failures dialect resumptions` (the metering fields
//! are the request's [`Metered`](crate::billing::metering::Metered); USD with 9 decimals). Bodies and
//! keys are never logged (the key appears only as its `key_id`). `client` is the client's
//! address ([`crate::client_ip::client_ip`]: `X-Forwarded-For` only through trusted proxies).
//! `answered_model` is the standard model that answered when a model-level fallback
//! ([`crate::engine::fallback`]) served (`-` when it is `standard_model`); `failures` lists the failed
//! attempts in order as `provider:reason` (the `sluice_upstream_attempts_total` outcome,
//! e.g. `p1:status_5xx,p1:status_5xx,p2:context_length`; `-` when none). `dialect` is the
//! client's wire API (`chat`, `messages`, `responses`; the OpenAI shape's `chat` for the model
//! list). `resumptions` is how many times the client reattached to a resumable stream
//! ([`crate::outcome::Outcome::resumptions`]; 0 for every other request). A request refused
//! while decoding keeps the `model` it named in `standard_model`, and its reason is logged at
//! info on `sluice::proxy::request`. The request's usage record
//! for the ledger ([`crate::billing::ledger::submit`]) is queued here too, from the same facts. The
//! line's metering fields are the answer's; an attempt a hedge race cancelled is metered
//! apart (`hedge loser metered` on `sluice::engine::hedge`, its own `hedge_cancelled` ledger
//! row, and the cost metrics; see [`crate::engine::hedge`]).

use pingora::proxy::Session;

use super::ctx::RequestCtx;
use crate::logging::{format_line, Field, TARGET};
use crate::metrics::series::route as route_series;

/// Writes the access line and records request metrics.
#[expect(
    clippy::too_many_lines,
    reason = "the access line's fields and the request metrics come from the same facts in one pass"
)]
pub fn record(session: &Session, error: Option<&pingora::Error>, ctx: &RequestCtx) {
    let o = &ctx.outcome;
    let status = if o.status != 0 {
        o.status
    } else {
        session.response_written().map_or(0, |h| h.status.as_u16())
    };
    let duration = ctx.received.elapsed();
    // Label only configured model ids (bounded cardinality).
    let model = ctx
        .standard_model
        .as_deref()
        .filter(|m| ctx.config.models.contains_key(*m))
        .unwrap_or("none");
    let provider = o.provider.as_deref().unwrap_or("none");
    let outcome = if o.label.is_empty() {
        if error.is_some() {
            "error"
        } else {
            "ok"
        }
    } else {
        o.label
    };
    // The (model, provider) children, resolved once per pair (`crate::metrics::series`).
    let series = route_series(model, provider);
    series.count_request(status);
    if o.provider.is_some() && !o.count_only {
        series.observe_duration(ctx.stream, duration.as_secs_f64());
        if let Some(t) = o.ttft {
            series.observe_ttft(t.as_secs_f64());
        }
        if let Some(overhead) = o.overhead {
            series.observe_overhead(overhead.as_secs_f64());
        }
    }
    let caller = ctx.caller.as_ref();
    if let (Some(metered), Some(c)) = (&ctx.billing.metered, caller) {
        // Tokens and money under the model that answered (its prices were applied).
        let billed = ctx
            .answering_model()
            .filter(|m| ctx.config.models.contains_key(*m))
            .unwrap_or(model);
        metered.record_metrics(&c.tenant, billed);
    }
    if let Some(c) = caller {
        // Attempts a hedge race cancelled: Sluice's cost under their own model (its route's
        // prices were applied), never a charge.
        for h in &ctx.billing.cancelled_hedges {
            let m = h.metered();
            m.record_metrics(&c.tenant, &h.model);
            log::info!(
                target: "sluice::proxy::hedge",
                "hedge loser metered request_id={} provider={} upstream_model={} input_tokens={} cost_usd={} estimated=true",
                ctx.request_id,
                h.provider,
                h.upstream_model,
                m.input_tokens,
                Field::Usd(m.cost_usd)
            );
        }
    }
    let metered = ctx.billing.metered.unwrap_or_default();
    let client = ctx.client_ip.map(|ip| ip.to_string());
    // Built only for a request with failed attempts.
    let failures = (!ctx.attempts.failed.is_empty()).then(|| {
        let mut s = String::with_capacity(ctx.attempts.failed.len() * 24);
        for (i, a) in ctx.attempts.failed.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push_str(&a.provider);
            s.push(':');
            s.push_str(a.failure.label());
        }
        s
    });
    let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let fields: [(&str, Field<'_>); 25] = [
        ("request_id", Field::Text(&ctx.request_id)),
        (
            "tenant",
            Field::Text(caller.map_or("-", |c| c.tenant.as_str())),
        ),
        (
            "key_id",
            Field::Text(caller.map_or("-", |c| c.key_id.as_str())),
        ),
        (
            "standard_model",
            Field::Text(ctx.standard_model.as_deref().unwrap_or("-")),
        ),
        (
            "upstream_model",
            Field::Text(o.upstream_model.as_deref().unwrap_or("-")),
        ),
        ("provider", Field::Text(provider)),
        ("attempts", Field::Count(ctx.attempts.count as u64)),
        ("status", Field::Count(u64::from(status))),
        ("outcome", Field::Text(outcome)),
        (
            "ttft_ms",
            o.ttft.map_or(Field::Text("-"), |t| Field::Count(ms(t))),
        ),
        ("duration_ms", Field::Count(ms(duration))),
        ("bytes_out", Field::Count(o.bytes_out)),
        ("input_tokens", Field::Count(metered.input_tokens)),
        ("output_tokens", Field::Count(metered.output_tokens)),
        (
            "cached_input_tokens",
            Field::Count(metered.cached_input_tokens),
        ),
        (
            "cache_write_tokens",
            Field::Count(metered.cache_write_tokens),
        ),
        ("reasoning_tokens", Field::Count(metered.reasoning_tokens)),
        (
            "estimated",
            Field::Text(if metered.estimated { "true" } else { "false" }),
        ),
        ("cost_usd", Field::Usd(metered.cost_usd)),
        ("charge_usd", Field::Usd(metered.charge_usd)),
        ("client", Field::Text(client.as_deref().unwrap_or("-"))),
        (
            "answered_model",
            Field::Text(ctx.answered_model.as_deref().unwrap_or("-")),
        ),
        ("failures", Field::Text(failures.as_deref().unwrap_or("-"))),
        ("dialect", Field::Text(ctx.dialect.as_str())),
        ("resumptions", Field::Count(u64::from(o.resumptions))),
    ];
    let line = format_line(&fields, ctx.config.server.log_format);
    log::info!(target: TARGET, "{line}");
    ledger_record(ctx, status, outcome);
}

/// Builds the ledger record of a finished request and queues it ([`crate::billing::ledger::submit`]):
/// built here, where the access log is written, so the ledger never knows the request
/// context (ledger -> proxy would be a cycle). `status` and `label` are the access log's status and outcome.
fn ledger_record(ctx: &RequestCtx, status: u16, label: &str) {
    if crate::billing::ledger::running().is_none() {
        return;
    }
    // The model that answered: the one whose prices the record's charge used (the model
    // asked for is in the access line's `standard_model` when they differ).
    let (Some(caller), Some(model)) = (ctx.caller.as_ref(), ctx.answering_model()) else {
        return;
    };
    let o = &ctx.outcome;
    // Metered in `logging` just before; a request that was never metered (no provider
    // answered) records zeros.
    let m = ctx.billing.metered.unwrap_or_default();
    let duration = ctx.received.elapsed();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let to_ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let time = now_ms.saturating_sub(i64::try_from(duration.as_millis()).unwrap_or(0));
    crate::billing::ledger::submit(crate::billing::ledger::UsageRecord {
        time,
        request_id: ctx.request_id.clone(),
        tenant: caller.tenant.clone(),
        virtual_key: caller.key_id.clone(),
        model: model.to_string(),
        provider: o.provider.clone(),
        upstream_model: o.upstream_model.clone(),
        input_tokens: m.input_tokens,
        output_tokens: m.output_tokens,
        cached_input_tokens: m.cached_input_tokens,
        cache_write_tokens: m.cache_write_tokens,
        reasoning_tokens: m.reasoning_tokens,
        estimated: m.estimated,
        cost_usd: m.cost_usd,
        charge_usd: m.charge_usd,
        status,
        outcome: if o.count_only && label == "ok" {
            crate::billing::ledger::COUNT_TOKENS
        } else {
            crate::billing::ledger::outcome_class(label, status)
        }
        .to_string(),
        ttft_ms: o.ttft.map(to_ms),
        duration_ms: to_ms(duration),
        fallback_depth: u32::try_from(ctx.fallback_depth()).unwrap_or(u32::MAX),
        attempts: u32::try_from(ctx.attempts.count).unwrap_or(u32::MAX),
        ingress: ctx.dialect.as_str().to_string(),
        resumptions: o.resumptions,
    });
    // One row per attempt a hedge race cancelled: Sluice's estimated cost, never a charge;
    // readers count requests without these rows ([`crate::billing::ledger::HEDGE_CANCELLED`]).
    for h in &ctx.billing.cancelled_hedges {
        crate::billing::ledger::submit(cancelled_hedge_record(ctx, caller, h, time));
    }
}

/// The ledger row of an attempt a hedge race cancelled ([`crate::billing::metering::CancelledHedge`]):
/// the request's ids, arrival `time` (unix ms) and ingress, the loser's model, provider and
/// upstream model, its estimated input at its route's price, output 0, charge 0,
/// `estimated`, status 0 (it wrote nothing), outcome `hedge_cancelled`, one attempt, no
/// TTFT, and how long it ran before it was cancelled.
fn cancelled_hedge_record(
    ctx: &RequestCtx,
    caller: &crate::auth::Caller,
    h: &crate::billing::metering::CancelledHedge,
    time: i64,
) -> crate::billing::ledger::UsageRecord {
    let m = h.metered();
    crate::billing::ledger::UsageRecord {
        time,
        request_id: ctx.request_id.clone(),
        tenant: caller.tenant.clone(),
        virtual_key: caller.key_id.clone(),
        model: h.model.clone(),
        provider: Some(h.provider.clone()),
        upstream_model: Some(h.upstream_model.clone()),
        input_tokens: m.input_tokens,
        output_tokens: m.output_tokens,
        cached_input_tokens: m.cached_input_tokens,
        cache_write_tokens: m.cache_write_tokens,
        reasoning_tokens: m.reasoning_tokens,
        estimated: m.estimated,
        cost_usd: m.cost_usd,
        charge_usd: m.charge_usd,
        status: 0,
        outcome: crate::billing::ledger::HEDGE_CANCELLED.to_string(),
        ttft_ms: None,
        duration_ms: u64::try_from(h.ran.as_millis()).unwrap_or(u64::MAX),
        fallback_depth: u32::try_from(h.fallback_depth).unwrap_or(u32::MAX),
        attempts: 1,
        ingress: ctx.dialect.as_str().to_string(),
        resumptions: 0,
    }
}
