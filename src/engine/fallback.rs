//! Owns model-level fallbacks: which *other* standard models a request may go to after the
//! model it asked for could not answer, and the context-window fallback. The attempt loop
//! ([`crate::engine::attempt`]) runs one [`Stage`] (a model and its candidate routes) at a time and
//! asks the [`Chain`] for the next.
//!
//! - **`models.<id>.fallback_models`**: after every route of the model asked for failed
//!   before the first byte, its fallback models are tried in order, each planned like the
//!   model itself ([`crate::routing::plan`]: capabilities, the key's providers, the
//!   request's provider preference, strategy, health). Only the list of the model asked
//!   for is followed (a fallback model's own list is not), so two models may back each
//!   other up without a loop. A listed model the key may not use is skipped.
//! - **The body's `models`** (OpenRouter's field): the request's `model` first, then these,
//!   in place of the configured `fallback_models`. Each must be a model the key may use
//!   (else the request is refused with the same 404 as an unknown `model`); the field never
//!   goes upstream.
//! - **Context-window fallback**: a rejection of the request as too long for the route's
//!   context window ([`is_context_rejection`]: OpenAI's `context_length_exceeded`,
//!   Anthropic's "prompt is too long", vLLM's and others' "maximum context length", ...)
//!   goes on to the untried routes of the same model that declare a larger
//!   `context_window_tokens`, then to the rejecting model's `context_fallback_models`, and
//!   nowhere else: the model that rejected is never asked again, and the regular fallbacks
//!   are dropped (they would reject the same prompt). Without either the client gets the
//!   provider's error as before. Content-policy and other 4xx answers stay final.
//! - `allow_fallbacks: false` in the provider preference means one candidate: no other
//!   route and no other model.
//!
//! Every model is tried at most once per request (the context step to a larger route of
//! the same model aside), so a request makes at most as many stages as there are models.
//! The answer names the model that answered (each route's model echo writes its own
//! model's id); `x-sluice-fallback-depth` counts failed routes across models; metering
//! prices the answer at the model that answered ([`crate::proxy::ctx::RequestCtx::answering_model`]).
//! Admission (rate limits, concurrency, the budget's reservation) was taken for the model
//! asked for and is not taken again.

use serde_json::Value;

use crate::auth::Caller;
use crate::config::{Config, Model};
use crate::error::GatewayError;
use crate::metrics::MODEL_FALLBACK_REASON;
use crate::routing::{self, Candidate, Preference, RouteNeeds};

/// Most entries of a request body's `models` list.
pub const MAX_BODY_MODELS: usize = 8;

/// Reads a request body's `models` field (already removed from the body): absent or
/// `null` is none; else an array of 1..=[`MAX_BODY_MODELS`] non-empty strings.
///
/// # Errors
/// A 400 naming `models` for any other shape.
pub fn body_models(field: Option<Value>) -> Result<Vec<String>, GatewayError> {
    let bad = |m: &str| GatewayError::invalid(m, Some("models"));
    match field {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => {
            if a.len() > MAX_BODY_MODELS {
                return Err(bad(&format!(
                    "`models` lists at most {MAX_BODY_MODELS} models"
                )));
            }
            a.into_iter()
                .map(|v| match v {
                    Value::String(s) if !s.trim().is_empty() => Ok(s),
                    _ => Err(bad("`models` must be an array of model ids (strings)")),
                })
                .collect()
        }
        Some(_) => Err(bad("`models` must be an array of model ids (strings)")),
    }
}

/// Checks the body's `models` against the configuration and the key, as the request's
/// `model` is checked.
///
/// # Errors
/// The 404 `model_not_found` of an unknown `model` for the first id that is not a
/// configured standard model or that the key may not use.
pub fn check_body_models(
    config: &Config,
    caller: &Caller,
    models: &[String],
) -> Result<(), GatewayError> {
    match models
        .iter()
        .find(|m| !config.models.contains_key(*m) || !caller.may_use_model(m))
    {
        Some(m) => Err(GatewayError::model_not_found(m)),
        None => Ok(()),
    }
}

/// Whether a request for `model` (with the body's `models`) has other models to go to
/// when its own routes cannot serve: a body list or `fallback_models`.
pub fn has_model_fallbacks(model: &Model, body_models: &[String]) -> bool {
    !body_models.is_empty() || !model.fallback_models.is_empty()
}

/// Whether an upstream error is a rejection of the request as longer than the route's
/// context window, from any provider the gateway reaches:
///
/// - OpenAI, Azure OpenAI, Groq, Mistral's OpenAI endpoint: `code: context_length_exceeded`;
/// - Anthropic (also through Bedrock / Vertex): 400 `invalid_request_error`, "prompt is too
///   long: N tokens > M maximum";
/// - vLLM, DeepSeek, OpenAI's older message, and servers modelled on them: "maximum context
///   length", "context length exceeded", "exceeds the context window";
/// - llama.cpp: "exceeds the available context size"; Gemini's OpenAI endpoint: "input token
///   count ... exceeds the maximum number of tokens"; TGI: "must have less than N tokens",
///   "`inputs` tokens + `max_new_tokens` must be <= N"; Bedrock: "input is too long".
///
/// Only 400, 413 and 422 answers count (the statuses these come with); a content-policy
/// refusal or any other 4xx is not one.
pub fn is_context_rejection(err: &GatewayError) -> bool {
    match err {
        GatewayError::Upstream {
            status,
            code,
            message,
            ..
        } => context_rejection(*status, code.as_deref(), message),
        _ => false,
    }
}

/// [`is_context_rejection`] over the error's parts.
fn context_rejection(status: u16, code: Option<&str>, message: &str) -> bool {
    if !matches!(status, 400 | 413 | 422) {
        return false;
    }
    if code.is_some_and(|c| c.eq_ignore_ascii_case("context_length_exceeded")) {
        return true;
    }
    // Messages are short (bounded by the error body read): one lowercase copy.
    let m = message.to_ascii_lowercase();
    const PHRASES: [&str; 11] = [
        "context_length_exceeded",
        "maximum context length",
        "context length exceeded",
        "exceeds the context window",
        "exceed context window",
        "prompt is too long",
        "input is too long",
        "available context size",
        "maximum number of tokens allowed",
        "`inputs` tokens + `max_new_tokens`",
        "too large for model with",
    ];
    PHRASES.iter().any(|p| m.contains(p))
        || (m.contains("must have less than") && m.contains("tokens"))
}

/// One model of a request's fallback chain and its candidate routes.
pub(crate) struct Stage<'c> {
    /// The model.
    pub model: &'c Model,
    /// Its candidates, planned for the request.
    pub candidates: Vec<Candidate<'c>>,
    /// The `sluice_fallback_total` reason of the step into this stage.
    pub reason: &'static str,
}

/// The models a request may still go to, in order, and the ones it went to.
#[derive(Clone)]
pub(crate) struct Chain<'c> {
    config: &'c Config,
    caller: Option<&'c Caller>,
    /// Models not tried yet, in order (a slice of the config or of the request).
    queue: &'c [String],
    /// The `sluice_fallback_total` reason of a step to the next model in `queue`.
    reason: &'static str,
    /// Models whose stage started (the one asked for first); filled only once the chain
    /// has somewhere to go.
    tried: Vec<&'c str>,
    /// The request's preference said `allow_fallbacks: false`.
    no_fallbacks: bool,
}

impl<'c> Chain<'c> {
    /// The chain of a request for `first` (its `fallback_models`, or `body_models` when the
    /// body listed some); `caller` may be `None` only when neither list has an entry.
    pub(crate) fn new(
        config: &'c Config,
        caller: Option<&'c Caller>,
        first: &'c Model,
        body_models: &'c [String],
        preference: Option<&Preference>,
    ) -> Self {
        let queue = if body_models.is_empty() {
            &first.fallback_models
        } else {
            body_models
        };
        let mut c = Self {
            config,
            caller,
            queue,
            reason: MODEL_FALLBACK_REASON,
            tried: Vec::new(),
            no_fallbacks: preference.is_some_and(|p| !p.allow_fallbacks),
        };
        if c.reachable(first) {
            c.tried.push(&first.id);
        }
        c
    }

    /// Whether the chain may ever leave `first`: it has fallbacks of either kind.
    fn reachable(&self, first: &Model) -> bool {
        let nowhere = self.queue.is_empty() && first.context_fallback_models.is_empty();
        !(self.no_fallbacks || nowhere)
    }

    /// After `model` rejected the request as too long: the rest of the chain is
    /// `model`'s `context_fallback_models` (the regular fallbacks are dropped).
    pub(crate) fn context_rejected(&mut self, model: &'c Model) {
        self.queue = &model.context_fallback_models;
        self.reason = "context_length";
    }

    /// The untried candidates `rest` of a stage whose declared context window is larger
    /// than `window` (the rejecting route's); none when that route declared none.
    pub(crate) fn larger_routes(
        &self,
        rest: &[Candidate<'c>],
        window: Option<u64>,
    ) -> Vec<Candidate<'c>> {
        let Some(w) = window.filter(|_| !self.no_fallbacks) else {
            return Vec::new();
        };
        rest.iter()
            .filter(|c| c.route.context_window_tokens.is_some_and(|x| x > w))
            .cloned()
            .collect()
    }

    /// The next model to try with its candidates: the first queued model not tried yet
    /// that the key may use and that has a candidate for the request (a model with none,
    /// lacking a capability say, is skipped). `None` when the chain is done.
    pub(crate) fn next_stage(
        &mut self,
        needs: &RouteNeeds,
        estimate: impl Fn() -> u64,
        preference: Option<&Preference>,
    ) -> Option<Stage<'c>> {
        if self.no_fallbacks {
            return None;
        }
        let caller = self.caller?;
        while let Some((id, rest)) = self.queue.split_first() {
            self.queue = rest;
            if self.tried.contains(&id.as_str()) || !caller.may_use_model(id) {
                continue;
            }
            let Some(model) = self.config.models.get(id) else {
                continue;
            };
            self.tried.push(&model.id);
            let planned = if routing::uses_input_estimate(model, caller)
                && needs.estimated_input_tokens == 0
            {
                let mut n = needs.clone();
                n.estimated_input_tokens = estimate();
                routing::plan(model, caller, &n, preference)
            } else {
                routing::plan(model, caller, needs, preference)
            };
            match planned {
                Ok(candidates) => {
                    return Some(Stage {
                        model,
                        candidates,
                        reason: self.reason,
                    })
                }
                Err(e) => log::debug!(target: "sluice::proxy::fallback",
                    "fallback model skipped model={id} reason={e}"
                ),
            }
        }
        None
    }
}

impl<'c> Chain<'c> {
    /// The routes of every model still ahead in the chain, in order, each planned as
    /// [`Self::next_stage`] plans it (so with the same checks: the key's models and
    /// providers, capabilities, the request's preference, health), for a hedge's partner or
    /// a continuation beyond the current model's routes ([`Later`]). The chain itself does
    /// not move. A route whose half-open trial the planning claimed is left out (and the
    /// trial released): a partner or a continuation is no trial.
    pub(crate) fn peek_later(
        &self,
        needs: &RouteNeeds,
        estimate: impl Fn() -> u64,
        preference: Option<&Preference>,
    ) -> Vec<Later<'c>> {
        let mut ahead = self.clone();
        let mut out = Vec::new();
        while let Some(stage) = ahead.next_stage(needs, &estimate, preference) {
            out.extend(
                stage
                    .candidates
                    .into_iter()
                    .filter(|c| c.trial.is_none())
                    .map(|cand| Later {
                        model: stage.model,
                        cand,
                    }),
            );
        }
        out
    }
}

/// A candidate route of a later model of the request's fallback chain, planned as the
/// chain plans a stage (the key's models and providers, capabilities, the request's
/// preference, health), without a half-open trial (a partner or a continuation never claims
/// one).
#[derive(Debug, Clone)]
pub(crate) struct Later<'r> {
    /// The standard model the route serves.
    pub(crate) model: &'r Model,
    /// The route and its health.
    pub(crate) cand: Candidate<'r>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_rejections_of_every_provider_shape_are_recognised() {
        let yes = [
            (400, Some("context_length_exceeded"), "This model's maximum context length is 128000 tokens. However, your messages resulted in 130512 tokens."),
            (400, None, "prompt is too long: 210004 tokens > 200000 maximum"),
            (400, Some("400"), "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion."),
            (400, None, "the request exceeds the available context size, try increasing it"),
            (400, None, "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576)."),
            (422, None, "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 8192. Given: 9000 `inputs` tokens and 20 `max_new_tokens`"),
            (422, None, "Input validation error: `inputs` must have less than 4096 tokens. Given: 5000"),
            (400, None, "Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 maximum context length"),
            (413, None, "Input is too long for requested model."),
        ];
        for (status, code, message) in yes {
            assert!(context_rejection(status, code, message), "{message}");
        }
        let no = [
            (
                400,
                Some("content_policy_violation"),
                "Your request was rejected as a result of our safety system.",
            ),
            (
                400,
                None,
                "messages.0.content: Input should be a valid list",
            ),
            (
                400,
                Some("invalid_request_error"),
                "max_tokens: 100000 > 64000, which is the maximum allowed number of output tokens",
            ),
            (404, Some("model_not_found"), "The model `x` does not exist"),
            // A 5xx that happens to name the context is an outage, not the prompt.
            (500, None, "maximum context length exceeded while loading"),
        ];
        for (status, code, message) in no {
            assert!(!context_rejection(status, code, message), "{message}");
        }
    }

    fn chain_config() -> Config {
        let route =
            |m: &str| format!("    routes:\n      - {{provider: fbtest-p, upstream_model: {m}}}\n");
        let yaml = format!(
            "tenants:\n  t: {{}}\nvirtual_keys:\n  - key: sk-test-chain-0001\n    tenant: t\nproviders:\n  fbtest-p:\n    kind: openai\n    base_url: http://127.0.0.1:1/v1\n    health_check: {{enabled: false}}\nmodels:\n  a:\n    fallback_models: [b, c, d]\n    context_fallback_models: [e]\n    context_window_tokens: 8000\n    routes:\n      - {{provider: fbtest-p, upstream_model: a1, priority: 1}}\n      - {{provider: fbtest-p, upstream_model: a2, priority: 2, context_window_tokens: 4000}}\n      - {{provider: fbtest-p, upstream_model: a3, priority: 3, context_window_tokens: 64000}}\n  b:\n{}  c:\n    routes:\n      - {{provider: fbtest-p, upstream_model: c1, capabilities: []}}\n  d:\n{}  e:\n{}",
            route("b1"),
            route("d1"),
            route("e1")
        );
        Config::parse(std::path::Path::new("c.yaml"), &yaml).unwrap()
    }

    fn caller(allowed: &[&str]) -> Caller {
        Caller {
            tenant: "t".into(),
            key_id: "k".into(),
            allowed_models: Some(allowed.iter().map(|m| (*m).to_string()).collect()),
            allowed_providers: None,
            strategy: None,
        }
    }

    fn order(chain: &mut Chain<'_>, needs: &RouteNeeds) -> Vec<(String, &'static str)> {
        std::iter::from_fn(|| chain.next_stage(needs, || 0, None))
            .map(|s| (s.model.id.clone(), s.reason))
            .collect()
    }

    #[test]
    fn the_chain_follows_the_lists_skipping_what_the_request_or_key_cannot_use() {
        let cfg = chain_config();
        let a = &cfg.models["a"];
        let key = caller(&["a", "b", "c", "e"]);
        let plain = RouteNeeds::default();
        let tools = RouteNeeds {
            capabilities: vec![crate::config::Capability::Tools],
            ..RouteNeeds::default()
        };
        // `d` is not the key's; `c` has no route with tools.
        let mut chain = Chain::new(&cfg, Some(&key), a, &[], None);
        assert_eq!(
            order(&mut chain, &plain),
            [
                ("b".into(), "model_fallback"),
                ("c".into(), "model_fallback")
            ]
        );
        let mut chain = Chain::new(&cfg, Some(&key), a, &[], None);
        assert_eq!(order(&mut chain, &tools), [("b".into(), "model_fallback")]);
        // The body's list replaces the configured one; the model asked for is not repeated.
        let body = vec!["c".to_string(), "a".to_string(), "b".to_string()];
        let mut chain = Chain::new(&cfg, Some(&key), a, &body, None);
        assert_eq!(
            order(&mut chain, &plain),
            [
                ("c".into(), "model_fallback"),
                ("b".into(), "model_fallback")
            ]
        );
        // A context rejection: the context list only, never the regular ones.
        let mut chain = Chain::new(&cfg, Some(&key), a, &[], None);
        chain.context_rejected(a);
        assert_eq!(order(&mut chain, &plain), [("e".into(), "context_length")]);
        // `allow_fallbacks: false`: nowhere.
        let one = Preference {
            allow_fallbacks: false,
            ..Preference::default()
        };
        let mut chain = Chain::new(&cfg, Some(&key), a, &[], Some(&one));
        assert!(chain.next_stage(&plain, || 0, Some(&one)).is_none());
    }

    #[test]
    fn peeking_ahead_lists_the_later_models_routes_and_leaves_the_chain_where_it_was() {
        let cfg = chain_config();
        let a = &cfg.models["a"];
        let key = caller(&["a", "b", "c", "e"]);
        let plain = RouteNeeds::default();
        let mut chain = Chain::new(&cfg, Some(&key), a, &[], None);
        let later = chain.peek_later(&plain, || 0, None);
        let seen: Vec<_> = later
            .iter()
            .map(|l| (l.model.id.as_str(), l.cand.route.upstream_model.as_str()))
            .collect();
        assert_eq!(seen, [("b", "b1"), ("c", "c1")]);
        // The chain still starts at `b`.
        assert_eq!(order(&mut chain, &plain).len(), 2);
        // The same capability checks as the stages: `c` has no route with tools.
        let tools = RouteNeeds {
            capabilities: vec![crate::config::Capability::Tools],
            ..RouteNeeds::default()
        };
        let chain = Chain::new(&cfg, Some(&key), a, &[], None);
        assert_eq!(chain.peek_later(&tools, || 0, None).len(), 1);
    }

    #[test]
    fn a_context_rejection_moves_only_to_routes_with_a_larger_declared_window() {
        let cfg = chain_config();
        let a = &cfg.models["a"];
        let key = caller(&["a"]);
        let chain = Chain::new(&cfg, Some(&key), a, &[], None);
        let cands = routing::plan(a, &key, &RouteNeeds::default(), None).unwrap();
        let window = |c: &Candidate<'_>| c.route.context_window_tokens;
        assert_eq!(
            cands.iter().map(window).collect::<Vec<_>>(),
            [Some(8000), Some(4000), Some(64000)]
        );
        let larger = chain.larger_routes(&cands[1..], Some(8000));
        assert_eq!(larger.len(), 1);
        assert_eq!(larger[0].route.upstream_model, "a3");
        assert!(chain.larger_routes(&cands[1..], None).is_empty());
        assert!(chain.larger_routes(&cands[2..], Some(64000)).is_empty());
    }

    #[test]
    fn body_models_take_a_short_list_of_names() {
        assert!(body_models(None).unwrap().is_empty());
        assert!(body_models(Some(Value::Null)).unwrap().is_empty());
        assert_eq!(
            body_models(Some(serde_json::json!(["a", "b"]))).unwrap(),
            ["a", "b"]
        );
        for bad in [
            serde_json::json!("a"),
            serde_json::json!([1]),
            serde_json::json!([""]),
            Value::from(vec!["m"; 9]),
        ] {
            let e = body_models(Some(bad)).unwrap_err();
            assert_eq!((e.status(), e.param()), (400, Some("models")));
        }
    }
}
