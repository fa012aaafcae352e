//! Owns the validation of `models:`: each standard model's keys, prices, retry override and
//! routes (each route's provider must exist), into [`Model`]s.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{check_price, ms, Sources, DEFAULT_MAX_TOKENS};
use crate::config::error::ConfigError;
use crate::config::schema::{ModelSection, ProviderKind, RetrySection, RouteApi, RouteSection};
use crate::config::{Model, Provider, Route};

/// A located error in the main file: `(key path, message)`.
type MainErr<'a> = &'a dyn Fn(&str, String) -> ConfigError;

/// Every standard model of `models`, in id order, after `server.retry` is checked.
///
/// # Errors
/// The first problem of the first bad model or route.
pub(super) fn build_models(
    models: BTreeMap<String, ModelSection>,
    provider_map: &BTreeMap<String, Arc<Provider>>,
    server_retry: &RetrySection,
    sources: &Sources,
    main_err: MainErr<'_>,
) -> Result<BTreeMap<String, Arc<Model>>, ConfigError> {
    let mut model_map = BTreeMap::new();
    check_retry(server_retry, "server.retry", &main_err)?;
    for (id, m) in models {
        let model = build_model(id.clone(), m, provider_map, server_retry, sources, main_err)?;
        model_map.insert(id, model);
    }
    Ok(model_map)
}

/// One standard model and its routes.
fn build_model(
    id: String,
    m: ModelSection,
    provider_map: &BTreeMap<String, Arc<Provider>>,
    server_retry: &RetrySection,
    sources: &Sources,
    main_err: MainErr<'_>,
) -> Result<Arc<Model>, ConfigError> {
    if let Some(r) = &m.retry {
        check_retry(r, &format!("models.{id}.retry"), &main_err)?;
    }
    let hedge_after = m
        .hedge_after_ms
        .map(crate::config::opt_in::HedgeAfter::from_section)
        .transpose()
        .map_err(|e| main_err(&format!("models.{id}.hedge_after_ms"), e))?;
    if id.trim().is_empty() {
        return Err(main_err("models", "a standard model id is empty".into()));
    }
    if m.context_window_tokens == Some(0) {
        return Err(main_err(
            &format!("models.{id}.context_window_tokens"),
            "must be at least 1 (tokens)".into(),
        ));
    }
    if m.routes.is_empty() {
        return Err(main_err(
            &format!("models.{id}.routes"),
            "a model needs at least one route".into(),
        ));
    }
    for (name, v) in [
        ("input_usd_per_mtok", m.input_usd_per_mtok),
        ("output_usd_per_mtok", m.output_usd_per_mtok),
        ("cached_input_usd_per_mtok", m.cached_input_usd_per_mtok),
        ("cache_write_usd_per_mtok", m.cache_write_usd_per_mtok),
    ] {
        check_price(v).map_err(|e| main_err(&format!("models.{id}.{name}"), e))?;
    }
    let files = sources.route_files.get(&id).cloned().unwrap_or_default();
    let mut routes = Vec::with_capacity(m.routes.len());
    for (i, r) in m.routes.into_iter().enumerate() {
        let at = files.get(i).copied().unwrap_or((0, i));
        routes.push(build_route(
            &id,
            at,
            r,
            m.context_window_tokens,
            provider_map,
            sources,
        )?);
    }
    Ok(Arc::new(Model {
        id,
        strategy: m.strategy.unwrap_or_default(),
        first_event_timeout: m.first_event_timeout_ms.map(ms),
        early_commit_after: m.early_commit_after_ms.map(ms),
        continue_on_break: m.continue_on_break.unwrap_or(false),
        resumable: m.resumable.unwrap_or(false),
        report_served_model: m.report_served_model.unwrap_or(false),
        unsupported: m.unsupported.unwrap_or_default(),
        default_max_tokens: m.default_max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
        retry: {
            let mut p = crate::config::RetryPolicy::from_section(server_retry);
            if let Some(r) = &m.retry {
                p.apply(r);
            }
            p
        },
        hedge_after,
        affinity: m.affinity.unwrap_or_default(),
        fallback_models: m.fallback_models.unwrap_or_default(),
        context_fallback_models: m.context_fallback_models.unwrap_or_default(),
        input_usd_per_mtok: m.input_usd_per_mtok,
        output_usd_per_mtok: m.output_usd_per_mtok,
        cached_input_usd_per_mtok: m.cached_input_usd_per_mtok,
        cache_write_usd_per_mtok: m.cache_write_usd_per_mtok,
        routes,
    }))
}

/// Route `local` of model `id` in file `fidx` (`at`); `model_window` is the model's context
/// window, the route's default.
fn build_route(
    id: &str,
    (fidx, local): (usize, usize),
    r: RouteSection,
    model_window: Option<u64>,
    provider_map: &BTreeMap<String, Arc<Provider>>,
    sources: &Sources,
) -> Result<Route, ConfigError> {
    let known_providers = || provider_map.keys().cloned().collect::<Vec<_>>().join(", ");
    let key = format!("models.{id}.routes[{local}]");
    let provider = provider_map.get(&r.provider).cloned().ok_or_else(|| {
        sources.err(
            fidx,
            &format!("{key}.provider"),
            format!(
                "unknown provider `{}` (known: {})",
                r.provider,
                known_providers()
            ),
        )
    })?;
    if r.upstream_model.trim().is_empty() {
        return Err(sources.err(fidx, &format!("{key}.upstream_model"), "must not be empty"));
    }
    if r.display_model
        .as_deref()
        .is_some_and(|d| d.trim().is_empty() || http::HeaderValue::from_str(d).is_err())
    {
        return Err(sources.err(
            fidx,
            &format!("{key}.display_model"),
            "must be a non-empty printable name (it is sent in a response header)",
        ));
    }
    if r.weight == 0 {
        return Err(sources.err(fidx, &format!("{key}.weight"), "must be at least 1"));
    }
    if r.context_window_tokens == Some(0) {
        return Err(sources.err(
            fidx,
            &format!("{key}.context_window_tokens"),
            "must be at least 1 (tokens)",
        ));
    }
    for (name, v) in [
        ("input_usd_per_mtok", Some(r.input_usd_per_mtok)),
        ("output_usd_per_mtok", Some(r.output_usd_per_mtok)),
        ("cached_input_usd_per_mtok", r.cached_input_usd_per_mtok),
        ("cache_write_usd_per_mtok", r.cache_write_usd_per_mtok),
    ] {
        check_price(v).map_err(|m| sources.err(fidx, &format!("{key}.{name}"), m))?;
    }
    if r.api == Some(RouteApi::Responses)
        && !matches!(
            provider.kind,
            ProviderKind::Openai | ProviderKind::AzureOpenai
        )
    {
        return Err(sources.err(
            fidx,
            &format!("{key}.api"),
            format!(
                "`responses` needs a provider of kind `openai` or `azure_openai` (provider `{}` is {:?})",
                provider.id,
                provider.kind
            ),
        ));
    }
    Ok(Route {
        health_key: format!("{}/{}", provider.id, r.upstream_model),
        provider,
        upstream_model: r.upstream_model,
        priority: r.priority,
        weight: r.weight,
        input_usd_per_mtok: r.input_usd_per_mtok,
        output_usd_per_mtok: r.output_usd_per_mtok,
        cached_input_usd_per_mtok: r.cached_input_usd_per_mtok,
        cache_write_usd_per_mtok: r.cache_write_usd_per_mtok,
        capabilities: r.capabilities,
        supports_prefill: r.supports_prefill,
        display_model: r.display_model,
        context_window_tokens: r.context_window_tokens.or(model_window),
        thinking: r.thinking,
        api: r.api.unwrap_or_default(),
    })
}

/// Checks one `retry` section (`key` names it in errors).
fn check_retry(
    r: &RetrySection,
    key: &str,
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<(), ConfigError> {
    if r.max_attempts_per_route == Some(0) {
        return Err(err(
            &format!("{key}.max_attempts_per_route"),
            "must be at least 1 (1 = no retry)".into(),
        ));
    }
    if let Some(b) = r.budget_ratio.filter(|b| !(0.0..=1.0).contains(b)) {
        return Err(err(
            &format!("{key}.budget_ratio"),
            format!("a share of requests between 0 and 1 (got {b})"),
        ));
    }
    Ok(())
}
