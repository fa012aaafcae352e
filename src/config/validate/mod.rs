//! Schema → [`Config`]: reads the files (`include:` folders and globs too), checks
//! cross-references (route → provider, key → tenant, policy names), ranges and duplicates,
//! converts `_ms` fields to `Duration`s and reads provider keys from the environment.
//! This module reads the files and assembles the snapshot; each section's checks are in
//! [`server`], [`providers`], [`models`], [`access`], [`ledger`] and [`response_store`].

mod access;
mod ledger;
mod models;
mod providers;
mod response_store;
mod server;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::error::ConfigError;
use super::schema::{FileConfig, IncludedFile};
use super::{Config, Endpoint};
pub(super) use ledger::load_ledger;

/// `models.<id>.default_max_tokens` when not set, tokens.
const DEFAULT_MAX_TOKENS: u64 = 4096;

/// Where each section came from, for error locations.
struct Sources {
    /// (file, text) of every file read, main file first.
    files: Vec<(PathBuf, String)>,
    /// Provider id → index into `files`.
    provider_file: BTreeMap<String, usize>,
    /// Model id → index into `files` of the file that defined each route, in order.
    route_files: BTreeMap<String, Vec<(usize, usize)>>,
    /// Index into `files` of each virtual key.
    key_files: Vec<(usize, usize)>,
}

impl Sources {
    fn err(&self, file_idx: usize, key: &str, msg: impl Into<String>) -> ConfigError {
        let (f, s) = &self.files[file_idx];
        ConfigError::at(f, Some(s), key, msg)
    }
}

fn parse<T: serde::de::DeserializeOwned>(path: &Path, text: &str) -> Result<T, ConfigError> {
    if let Some(e) = duplicate_key(path, text) {
        return Err(e);
    }
    let de = serde_yaml::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let key = e.path().to_string();
        let key = if key == "." { String::new() } else { key };
        // A syntax error inside a mapping has no key yet (`?`): name the mapping.
        let key = key.trim_end_matches(".?").trim_end_matches('?').to_string();
        let inner = e.into_inner();
        let (line, column) = inner
            .location()
            .map_or((None, None), |l| (Some(l.line()), Some(l.column())));
        // serde_yaml's message repeats the location; strip it so it is printed once (a
        // syntax error's context, `, while scanning … at line N`, stays).
        let mut message = inner.to_string();
        if let Some(i) = message.find(" at line ") {
            let end = message[i..].find(',').map_or(message.len(), |j| i + j);
            message.replace_range(i..end, "");
        }
        // ... and may start with the (parent) key path, which is printed anyway.
        if let Some((head, rest)) = message.split_once(": ") {
            if !head.is_empty() && key.starts_with(head) {
                message = rest.to_string();
            }
        }
        ConfigError {
            file: path.to_path_buf(),
            line,
            column,
            key_path: key,
            message,
        }
    })
}

/// A key repeated in one YAML mapping (serde would silently keep the last one), located at
/// its second occurrence; `None` when there is none (or the text does not parse at all:
/// the typed parse reports that).
fn duplicate_key(path: &Path, text: &str) -> Option<ConfigError> {
    let de = serde_yaml::Deserializer::from_str(text);
    let err = serde_path_to_error::deserialize::<_, serde_yaml::Value>(de).err()?;
    let parent = err.path().to_string();
    let message = err.into_inner().to_string();
    let key = message.split("duplicate entry with key ").nth(1)?;
    let key = key.split(" at line ").next()?.trim_matches('"').to_string();
    let key_path = if parent == "." {
        key.clone()
    } else {
        format!("{parent}.{key}")
    };
    let (line, column) = second_occurrence(text, &key_path, &key)
        .or_else(|| super::error::locate_key(text, &key_path))
        .map_or((None, None), |(l, c)| (Some(l), Some(c)));
    Some(ConfigError {
        file: path.to_path_buf(),
        line,
        column,
        key_path,
        message: format!("duplicate key `{key}` (it is already defined above)"),
    })
}

/// 1-based (line, column) of the second `key:` at the indentation of the first one found at
/// `key_path`, within the same block.
fn second_occurrence(text: &str, key_path: &str, key: &str) -> Option<(usize, usize)> {
    let (first, col) = super::error::locate_key(text, key_path)?;
    let forms = [key.to_string(), format!("\"{key}\""), format!("'{key}'")];
    for (i, line) in text.lines().enumerate().skip(first) {
        let t = line.trim_start().trim_start_matches("- ");
        let ind = line.len() - t.len();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        if ind + 1 < col {
            return None;
        }
        let is_key = forms.iter().any(|f| {
            t.strip_prefix(f.as_str())
                .is_some_and(|r| r.trim_start().starts_with(':'))
        });
        if ind + 1 == col && is_key {
            return Some((i + 1, col));
        }
    }
    None
}

/// Largest config file read, bytes (a config is kilobytes; this stops `/dev/zero` & co).
const MAX_CONFIG_BYTES: u64 = 16 * 1024 * 1024;

fn read(path: &Path) -> Result<String, ConfigError> {
    let meta = std::fs::metadata(path).map_err(|e| ConfigError::io(path, &e))?;
    if !meta.is_file() {
        return Err(ConfigError::at(path, None, "", "not a regular file"));
    }
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(ConfigError::at(
            path,
            None,
            "",
            format!("larger than {MAX_CONFIG_BYTES} bytes"),
        ));
    }
    std::fs::read_to_string(path).map_err(|e| ConfigError::io(path, &e))
}

/// Expands one `include:` entry relative to `base`.
pub(crate) fn expand_include(base: &Path, pattern: &str) -> Result<Vec<PathBuf>, String> {
    let full = if Path::new(pattern).is_absolute() {
        PathBuf::from(pattern)
    } else {
        base.join(pattern)
    };
    if full.is_dir() {
        let mut out: Vec<PathBuf> = std::fs::read_dir(&full)
            .map_err(|e| format!("cannot read folder {}: {e}", full.display()))?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
            .collect();
        out.sort();
        return Ok(out);
    }
    let pat = full.to_string_lossy().to_string();
    let mut out: Vec<PathBuf> = glob::glob(&pat)
        .map_err(|e| format!("bad pattern `{pattern}`: {e}"))?
        .filter_map(Result::ok)
        .collect();
    out.sort();
    if out.is_empty() {
        return Err(format!("`{pattern}` matches no file"));
    }
    Ok(out)
}

/// Valid but risky settings of `cfg`, located like errors (`file:line:col: key: message`).
/// Today: an `admin_listen` that is not a loopback address (the admin listener has no
/// authentication), and a standard model priced in part: some sell price set but
/// `input_usd_per_mtok` or `output_usd_per_mtok` absent (those tokens are charged 0; a model
/// with no sell price at all is free by intent, e.g. the demo, and not warned about); and
/// `continue_on_break: true` on a model with a single route and no `fallback_models` (a
/// broken stream continues on the *next* route, of this model or a fallback model, so it
/// would never be continued).
pub(super) fn warnings(cfg: &Config) -> Vec<ConfigError> {
    let mut out = Vec::new();
    for (id, m) in &cfg.models {
        if m.continue_on_break && m.routes.len() < 2 && m.fallback_models.is_empty() {
            let text = std::fs::read_to_string(&cfg.source_path).ok();
            out.push(ConfigError::at(
                &cfg.source_path,
                text.as_deref(),
                &format!("models.{id}.continue_on_break"),
                "a broken stream continues on the next route, and this model has only one and no \
                 fallback_models: its streams are never continued",
            ));
        }
        let missing: Vec<&str> = [
            ("input_usd_per_mtok", m.input_usd_per_mtok),
            ("output_usd_per_mtok", m.output_usd_per_mtok),
        ]
        .into_iter()
        .filter(|(_, v)| v.is_none())
        .map(|(k, _)| k)
        .collect();
        let priced = m.input_usd_per_mtok.is_some()
            || m.output_usd_per_mtok.is_some()
            || m.cached_input_usd_per_mtok.is_some()
            || m.cache_write_usd_per_mtok.is_some();
        if let Some(first) = missing.first().filter(|_| priced) {
            let text = std::fs::read_to_string(&cfg.source_path).ok();
            out.push(ConfigError::at(
                &cfg.source_path,
                text.as_deref(),
                &format!("models.{id}.{first}"),
                format!(
                    "no sell price ({} absent): tenants are charged 0 for these tokens \
                     (cost and usage are still recorded)",
                    missing.join(", ")
                ),
            ));
        }
    }
    let cap = cfg.server.max_concurrent_upstream_requests;
    if let Some(soft) = crate::fd_limit::nofile_soft_limit() {
        let derived = crate::fd_limit::cap_for(soft);
        if cap > derived {
            let text = std::fs::read_to_string(&cfg.source_path).ok();
            out.push(ConfigError::at(
                &cfg.source_path,
                text.as_deref(),
                "server.max_concurrent_upstream_requests",
                format!(
                    "{cap} streams need about {} file descriptors and the open-file limit is \
                     {soft}: past {derived} streams, accept and connect fail with EMFILE \
                     instead of a 503 (raise LimitNOFILE / ulimit -n, or leave the key out \
                     to derive the cap from the limit)",
                    cap as u64 * crate::fd_limit::FDS_PER_STREAM + crate::fd_limit::RESERVED_FDS
                ),
            ));
        }
    }
    let admin = &cfg.server.admin_listen;
    if admin
        .parse::<std::net::SocketAddr>()
        .is_ok_and(|a| !a.ip().is_loopback())
    {
        let text = std::fs::read_to_string(&cfg.source_path).ok();
        out.push(ConfigError::at(
            &cfg.source_path,
            text.as_deref(),
            "server.admin_listen",
            format!(
                "`{admin}` is not a loopback address, and the admin listener (/metrics, \
                 /healthz, /readyz) has no authentication: anyone who reaches it reads the \
                 metrics (tenant, provider and model names, traffic). Bind it to 127.0.0.1 or \
                 restrict it with a firewall"
            ),
        ));
    }
    out
}

/// Loads `path` and its includes and validates them.
pub(super) fn load(path: &Path) -> Result<Config, ConfigError> {
    load_text(path, read(path)?)
}

/// Validates `text` as if read from `path` (used for messages and to resolve `include:`).
pub(super) fn load_text(path: &Path, text: String) -> Result<Config, ConfigError> {
    let mut main: FileConfig = parse(path, &text)?;
    let mut sources = Sources {
        files: vec![(path.to_path_buf(), text)],
        provider_file: BTreeMap::new(),
        route_files: BTreeMap::new(),
        key_files: Vec::new(),
    };
    for id in main.providers.keys() {
        sources.provider_file.insert(id.clone(), 0);
    }
    for (id, m) in &main.models {
        sources
            .route_files
            .insert(id.clone(), (0..m.routes.len()).map(|i| (0, i)).collect());
    }
    sources.key_files = (0..main.virtual_keys.len()).map(|i| (0, i)).collect();

    // When the main file lists standard models, it is the catalogue: an included (provider)
    // file may add routes to those models only. A model id the main file lacks is a typo
    // there, not a new model.
    let catalogue: Vec<String> = main.models.keys().cloned().collect();
    let base = path.parent().unwrap_or_else(|| Path::new("."));
    for (n, pattern) in main.include.clone().iter().enumerate() {
        let files = expand_include(base, pattern)
            .map_err(|m| sources.err(0, &format!("include[{n}]"), m))?;
        for file in files {
            let text = read(&file)?;
            let inc: IncludedFile = parse(&file, &text)?;
            let idx = sources.files.len();
            sources.files.push((file.clone(), text));
            if let Some(id) = inc
                .models
                .keys()
                .find(|id| !catalogue.is_empty() && !catalogue.contains(id))
            {
                return Err(sources.err(
                    idx,
                    &format!("models.{id}"),
                    format!(
                        "unknown standard model `{id}` (known: {}; standard models are listed in {})",
                        catalogue.join(", "),
                        path.display()
                    ),
                ));
            }
            merge(&mut main, inc, idx, &mut sources)?;
        }
    }
    build(main, &sources)
}

fn merge(
    main: &mut FileConfig,
    inc: IncludedFile,
    idx: usize,
    sources: &mut Sources,
) -> Result<(), ConfigError> {
    for (id, t) in inc.tenants {
        if main.tenants.contains_key(&id) {
            return Err(sources.err(idx, &format!("tenants.{id}"), "tenant defined twice"));
        }
        main.tenants.insert(id, t);
    }
    for (id, p) in inc.providers {
        if main.providers.contains_key(&id) {
            return Err(sources.err(idx, &format!("providers.{id}"), "provider defined twice"));
        }
        sources.provider_file.insert(id.clone(), idx);
        main.providers.insert(id, p);
    }
    for (i, k) in inc.virtual_keys.into_iter().enumerate() {
        sources.key_files.push((idx, i));
        main.virtual_keys.push(k);
    }
    for (id, m) in inc.models {
        let entry = main.models.entry(id.clone()).or_default();
        let files = sources.route_files.entry(id).or_default();
        for (i, r) in m.routes.into_iter().enumerate() {
            files.push((idx, i));
            entry.routes.push(r);
        }
        entry.strategy = entry.strategy.or(m.strategy);
        entry.first_event_timeout_ms = entry.first_event_timeout_ms.or(m.first_event_timeout_ms);
        entry.early_commit_after_ms = entry.early_commit_after_ms.or(m.early_commit_after_ms);
        entry.default_max_tokens = entry.default_max_tokens.or(m.default_max_tokens);
        entry.retry = entry.retry.take().or(m.retry);
        entry.continue_on_break = entry.continue_on_break.or(m.continue_on_break);
        entry.hedge_after_ms = entry.hedge_after_ms.or(m.hedge_after_ms);
        entry.affinity = entry.affinity.or(m.affinity);
        entry.fallback_models = entry.fallback_models.take().or(m.fallback_models);
        entry.context_fallback_models = entry
            .context_fallback_models
            .take()
            .or(m.context_fallback_models);
        entry.context_window_tokens = entry.context_window_tokens.or(m.context_window_tokens);
        entry.input_usd_per_mtok = entry.input_usd_per_mtok.or(m.input_usd_per_mtok);
        entry.output_usd_per_mtok = entry.output_usd_per_mtok.or(m.output_usd_per_mtok);
        entry.cached_input_usd_per_mtok = entry
            .cached_input_usd_per_mtok
            .or(m.cached_input_usd_per_mtok);
        entry.cache_write_usd_per_mtok = entry
            .cache_write_usd_per_mtok
            .or(m.cache_write_usd_per_mtok);
    }
    Ok(())
}

/// A price (USD per million tokens) must be a finite number ≥ 0.
fn check_price(v: Option<f64>) -> Result<(), String> {
    match v {
        Some(p) if !p.is_finite() => Err(format!(
            "must be a finite number (USD per million tokens), got {p}"
        )),
        Some(p) if p < 0.0 => Err(format!(
            "must not be negative (USD per million tokens), got {p}"
        )),
        _ => Ok(()),
    }
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

/// Parses `http(s)://host[:port][/path]`.
pub(super) fn parse_base_url(url: &str) -> Result<Endpoint, String> {
    let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("http://") {
        (false, r)
    } else {
        return Err(format!("`{url}` must start with http:// or https://"));
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if authority.is_empty() {
        return Err(format!("`{url}` has no host"));
    }
    let (host, port) = if let Some(stripped) = authority.strip_prefix('[') {
        // [v6]:port
        let end = stripped
            .find(']')
            .ok_or_else(|| format!("`{url}`: bad IPv6 host"))?;
        let host = &stripped[..end];
        let port = stripped[end + 1..].strip_prefix(':');
        (host.to_string(), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (authority.to_string(), None),
        }
    };
    let port = match port {
        Some(p) => p
            .parse::<u16>()
            .map_err(|_| format!("`{url}`: bad port `{p}`"))?,
        None if tls => 443,
        None => 80,
    };
    let ip = host.parse::<IpAddr>().ok();
    Ok(Endpoint {
        tls,
        host,
        port,
        base_path: path.trim_end_matches('/').to_string(),
        ip,
    })
}

/// The whole file, validated in order: ledger, server, providers, models (and their
/// fallbacks), tenants, keys, Redis, then the "serves something" checks and passthrough.
fn build(f: FileConfig, sources: &Sources) -> Result<Config, ConfigError> {
    let FileConfig {
        include: _,
        server,
        tenants,
        virtual_keys,
        providers,
        models,
        redis,
        ledger,
        response_store,
        passthrough,
    } = f;
    let main_err = |key: &str, msg: String| sources.err(0, key, msg);
    let ledger = ledger::ledger_settings(ledger, &main_err)?;
    let response_store =
        response_store::response_store_settings(response_store, ledger.enabled, &main_err)?;
    let server_retry = server.retry.clone();
    let settings = server::server_settings(server, sources, &main_err)?;
    let provider_map = providers::build_providers(
        providers,
        settings.default_timeouts,
        settings.max_buffered_bytes_per_stream,
        sources,
    )?;
    let model_map = models::build_models(models, &provider_map, &server_retry, sources, &main_err)?;
    super::model_fallback::check(&model_map, &main_err)?;
    let known = access::Known {
        models: &model_map,
        providers: &provider_map,
    };
    let tenant_map = access::build_tenants(tenants, &known, sources, &main_err)?;
    let keys = access::build_keys(virtual_keys, &tenant_map, &known, sources)?;
    access::check_redis(redis.as_ref(), &main_err)?;
    // An empty or truncated file (a save caught mid-write) must not replace a working
    // config with one that serves nothing.
    if model_map.is_empty() {
        return Err(main_err(
            "models",
            "no standard models are defined (a config needs at least one under `models:`)".into(),
        ));
    }
    if keys.is_empty() {
        return Err(main_err(
            "virtual_keys",
            "no virtual keys are defined (a config needs at least one under `virtual_keys:`)"
                .into(),
        ));
    }

    let passthrough = super::passthrough::build(
        passthrough,
        settings.default_timeouts.connect,
        settings.max_request_body_bytes,
        &main_err,
    )?;

    Ok(Config {
        source_path: sources.files[0].0.clone(),
        server: settings,
        tenants: tenant_map,
        keys,
        providers: provider_map,
        models: model_map,
        redis,
        ledger,
        response_store,
        passthrough,
    })
}

#[cfg(test)]
mod tests;
