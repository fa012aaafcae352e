//! Owns a committed stream's running charge against the tenant's budget: after every batch of
//! upstream events (before their output is written), the charge so far is priced at the
//! standard model's sell prices and held against the request's budget reservation, which
//! grows while the budget has room ([`crate::billing::budget::Reservation::grow`]); when it has none, the stream ends
//! with the budget error event in the client's dialect (`code: budget_exceeded`; Anthropic's
//! `billing_error`, OpenAI's `insufficient_quota`), and the batch that would have passed the
//! budget is not written.
//!
//! The running charge is the input the upstream reported so far (Anthropic's `message_start`,
//! or any usage a provider sends before its end; until then, as with OpenAI, which reports
//! usage only at the end, the admission's input estimate) plus
//! the output: the larger of the
//! provider's running output figure and the text streamed at 4 bytes a token (the usual
//! English ratio; nothing is tokenized while a stream runs).
//!
//! A stream ended at the budget is metered at most at the output of the last check its
//! budget held (`Billing::budget_output_tokens`): the batch that was not delivered is not
//! charged, and the end-of-stream estimate (the tokenizer's count of the text) cannot charge
//! more than the running measure let through.

use crate::billing::metering::Prices;
use crate::proxy::ctx::RequestCtx;
use crate::stream::end::StreamError;
use crate::stream::pipe::StreamPipe;

/// Bytes of streamed text counted as one output token in the running charge.
const BYTES_PER_TOKEN: u64 = 4;

/// Holds the stream's running charge against its budget reservation (a no-op without one).
///
/// # Errors
/// The `budget_exceeded` stream error when the budget has no room for the running charge;
/// the output the pipe holds (that would pass the budget) is discarded.
pub(crate) async fn check(
    ctx: &mut RequestCtx,
    pipe: &mut StreamPipe<'_>,
) -> Result<(), StreamError> {
    let Some(held) = ctx.billing.budget.as_ref().map(|r| r.amount_usd()) else {
        return Ok(());
    };
    let Some(model) = ctx.answering_model().and_then(|m| ctx.config.models.get(m)) else {
        return Ok(());
    };
    let mut usage = pipe.usage.unwrap_or_default();
    if usage.input_tokens == 0 {
        // Not reported yet: the admission's estimate, as the end-of-stream metering would.
        usage.input_tokens = ctx.billing.budget_input_tokens;
    }
    usage.output_tokens = usage
        .output_tokens
        .max(pipe.estimator.bytes().div_ceil(BYTES_PER_TOKEN));
    let running = Prices::sell(model).usd(&usage);
    if running <= held {
        ctx.billing.budget_output_tokens = Some(usage.output_tokens);
        return Ok(());
    }
    let config = ctx.config.clone();
    let Some(r) = ctx.billing.budget.as_mut() else {
        return Ok(());
    };
    match r.grow(&config, running).await {
        Ok(()) => {
            ctx.billing.budget_output_tokens = Some(usage.output_tokens);
            Ok(())
        }
        Err(e) => {
            let tenant = ctx
                .caller
                .as_ref()
                .map(|c| c.tenant.as_str())
                .unwrap_or_default();
            log::warn!(target: "sluice::budget", "stream ended at the budget request_id={} tenant={tenant} running_charge_usd={running:.6} held_usd={held:.6}",
                ctx.request_id
            );
            let _ = pipe.take();
            let message = format!(
                "Budget exceeded for tenant `{tenant}`: this answer has cost {running:.6} USD so \
                 far and its {} budget of {:.6} USD has no room for more; the stream was ended.",
                e.window.label(),
                e.budget_usd,
            );
            Err(StreamError {
                reason: "budget_exceeded",
                kind: crate::protocol::ErrorKind::Billing,
                error_type: "insufficient_quota".into(),
                message,
            })
        }
    }
}
