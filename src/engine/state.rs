//! Owns [`AttemptState`]: what every step of an answer works on, from the attempt loop down
//! to the stream pump and a mid-stream continuation. It travels as one value (each step
//! reborrows what it passes down) instead of six loose parameters; and [`ReadyParts`], what
//! an attempt ready to commit hands to the stream pump or the unary exchange.

use pingora::protocols::http::client::HttpSession as UpstreamSession;
use pingora::proxy::Session;

use crate::config::{HopTimeouts, Model};
use crate::engine::fallback::Later;
use crate::engine::pool::Connector;
use crate::ingress::request::InferenceRequest;
use crate::proxy::ctx::RequestCtx;
use crate::routing::Candidate;

/// The state of one answer in the making.
pub(crate) struct AttemptState<'s, 'r> {
    /// The upstream connector (its pools are shared by every request).
    pub(crate) connector: &'s Connector,
    /// The downstream session: the client's disconnect is watched on it, the answer
    /// written to it.
    pub(crate) session: &'s mut Session,
    /// The request's context.
    pub(crate) ctx: &'s mut RequestCtx,
    /// The parsed request.
    pub(crate) req: &'s InferenceRequest,
    /// The standard model being served (the one asked for, or a fallback model's stage).
    pub(crate) model: &'s Model,
    /// The candidate routes of this step, in order: the stage's (the attempt loop, the
    /// hedge race), or those left after the route that answered (a committed stream's
    /// continuation).
    pub(crate) candidates: &'s [Candidate<'r>],
    /// The routes of the models after this one in the request's fallback chain, in order
    /// (`models.<id>.fallback_models`, the body's `models`): where a hedge finds a partner
    /// and a broken stream continues once `candidates` has none. Planned only for a model
    /// that hedges or continues ([`Later`]); empty otherwise.
    pub(crate) later: &'s [Later<'r>],
}

/// The candidate at `i` of `candidates` followed by `later` (`i` past the end of
/// `candidates` is a later model's route), and the model it serves (`model` for the first
/// part).
pub(crate) fn candidate_at<'a, 'r>(
    model: &'a Model,
    candidates: &'a [Candidate<'r>],
    later: &'a [Later<'r>],
    i: usize,
) -> (&'a Model, &'a Candidate<'r>) {
    match candidates.get(i) {
        Some(c) => (model, c),
        None => {
            let l = &later[i - candidates.len()];
            (l.model, &l.cand)
        }
    }
}

/// The parts of a `Ready` (`crate::engine::open`), with what it holds beside its head (`B`).
pub(crate) struct ReadyParts<B> {
    /// The upstream exchange, its response head read.
    pub(crate) up: UpstreamSession,
    /// Where it goes back to the pool.
    pub(crate) peer: pingora::upstreams::peer::HttpPeer,
    /// The hop's timeouts.
    pub(crate) timeouts: HopTimeouts,
    /// What is held.
    pub(crate) body: B,
}

impl<B> ReadyParts<B> {
    /// The parts moved out of `parts`, whose box is freed on return (a `*parts` in the
    /// caller would free it only when `parts` goes out of scope: for a stream, at its end).
    #[expect(
        clippy::boxed_local,
        reason = "the box is the point: it arrives boxed and is freed here, not later"
    )]
    pub(crate) fn take(parts: Box<Self>) -> Self {
        *parts
    }
}
