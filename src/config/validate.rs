//! Schema → [`Config`]: reads the files (`include:` folders and globs too), checks
//! cross-references (route → provider, key → tenant, policy names), ranges and duplicates,
//! converts `_ms` fields to `Duration`s and reads provider keys from the environment.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::error::ConfigError;
use super::keys::{hash_key, Caller, KeyTable};
use super::schema::{FileConfig, IncludedFile, ProviderKind, ProviderSection};
use super::{
    ActiveHealthCheck, Config, Endpoint, ErrorRate, HopTimeouts, Model, PassiveHealth, ProbeMode,
    Provider, Route, ServerSettings, Tenant,
};
use crate::secret::Secret;

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
/// `continue_on_break: true` on a model with a single route (a broken stream continues on
/// the *next* route, so it would never be continued).
pub(super) fn warnings(cfg: &Config) -> Vec<ConfigError> {
    let mut out = Vec::new();
    for (id, m) in &cfg.models {
        if m.continue_on_break && m.routes.len() < 2 {
            let text = std::fs::read_to_string(&cfg.source_path).ok();
            out.push(ConfigError::at(
                &cfg.source_path,
                text.as_deref(),
                &format!("models.{id}.continue_on_break"),
                "a broken stream continues on the next route, and this model has only one:                  its streams are never continued",
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

fn build_provider(
    id: &str,
    p: ProviderSection,
    defaults: HopTimeouts,
    h2_stream_window: usize,
    sources: &Sources,
) -> Result<Provider, ConfigError> {
    let fidx = sources.provider_file.get(id).copied().unwrap_or(0);
    let key = |k: &str| format!("providers.{id}.{k}");
    let ProviderSection {
        kind,
        base_url,
        api_key_env,
        api_key,
        connect_timeout_ms,
        first_byte_timeout_ms,
        first_event_timeout_ms,
        idle_timeout_ms,
        heartbeat_interval_ms,
        health_check,
        health,
        stream_usage,
        max_concurrent_requests,
        ca_file,
        api_version,
        project,
        region,
        aws_profile,
        credentials_file_env,
        token_url,
    } = p;
    if kind == ProviderKind::Bedrock && (api_key.is_some() || api_key_env.is_some()) {
        let k = if api_key.is_some() {
            "api_key"
        } else {
            "api_key_env"
        };
        return Err(sources.err(
            fidx,
            &key(k),
            "kind bedrock signs with AWS credentials (the AWS_* environment or aws_profile), not an API key",
        ));
    }
    // `region` is both kinds' key: Bedrock's AWS region, Vertex AI's Google Cloud region.
    let vertex_section = super::vertex::VertexSection {
        project,
        region: if kind == ProviderKind::Bedrock {
            None
        } else {
            region.clone()
        },
        credentials_file_env,
        token_url,
    };
    if kind != ProviderKind::Vertex {
        if let Some(k) = vertex_section.first_set() {
            let m = if k == "region" {
                "region is only for kinds bedrock and vertex".to_string()
            } else {
                format!("{k} is only for kind vertex")
            };
            return Err(sources.err(fidx, &key(k), m));
        }
    } else if let Some(k) = [
        ("api_key", api_key.is_some()),
        ("api_key_env", api_key_env.is_some()),
    ]
    .into_iter()
    .find_map(|(k, set)| set.then_some(k))
    {
        return Err(sources.err(
            fidx,
            &key(k),
            "kind vertex authenticates with a service-account key (credentials_file_env), not an API key",
        ));
    }
    let bedrock_region = if kind == ProviderKind::Bedrock {
        region.as_deref()
    } else {
        None
    };
    let aws = bedrock_account(kind, bedrock_region, aws_profile.as_deref(), &key)
        .map_err(|(k, m)| sources.err(fidx, &k, m))?;
    let api_version = match (kind, api_version) {
        (ProviderKind::AzureOpenai, Some(v)) if super::kinds::valid_api_version(&v) => {
            Some(v)
        }
        (ProviderKind::AzureOpenai, Some(_)) => {
            return Err(sources.err(
                fidx,
                &key("api_version"),
                "must be an Azure OpenAI API version such as \"2024-10-21\" (letters, digits, `-`, `.`)",
            ))
        }
        (ProviderKind::AzureOpenai, None) => {
            return Err(sources.err(
                fidx,
                &format!("providers.{id}"),
                "api_version is required for kind azure_openai (e.g. \"2024-10-21\")",
            ))
        }
        (_, Some(_)) => {
            return Err(sources.err(
                fidx,
                &key("api_version"),
                "api_version is only for kind azure_openai",
            ))
        }
        (_, None) => None,
    };
    if max_concurrent_requests == Some(0) {
        return Err(sources.err(
            fidx,
            &key("max_concurrent_requests"),
            "must be at least 1 (leave it out for no cap)",
        ));
    }
    let endpoint = match (kind, base_url) {
        (ProviderKind::Demo, None) => None,
        (ProviderKind::Demo, Some(_)) => {
            return Err(sources.err(fidx, &key("base_url"), "the demo provider has no base_url"))
        }
        (ProviderKind::Gemini, None) => Some(
            parse_base_url(super::kinds::GEMINI_BASE_URL)
                .map_err(|m| sources.err(fidx, &key("base_url"), m))?,
        ),
        (ProviderKind::Bedrock, None) => Some(
            parse_base_url(&super::aws::default_base_url(
                aws.as_ref().map_or("", |a| a.region.as_str()),
            ))
            .map_err(|m| sources.err(fidx, &key("base_url"), m))?,
        ),
        // The region's endpoint, once the region is checked (below).
        (ProviderKind::Vertex, None) => None,
        (_, None) => {
            return Err(sources.err(fidx, &format!("providers.{id}"), "base_url is required"))
        }
        (_, Some(u)) => {
            Some(parse_base_url(&u).map_err(|m| sources.err(fidx, &key("base_url"), m))?)
        }
    };
    let ca = match (ca_file, &endpoint) {
        (None, _) => None,
        (Some(_), e) if !e.as_ref().is_some_and(|e| e.tls) => {
            return Err(sources.err(
                fidx,
                &key("ca_file"),
                "ca_file is for an https base_url (this provider is not reached over TLS)",
            ))
        }
        (Some(f), _) => {
            let base = sources.files[fidx]
                .0
                .parent()
                .unwrap_or_else(|| Path::new("."));
            Some(
                crate::tls::load_ca_file(&base.join(f))
                    .map_err(|e| sources.err(fidx, &key("ca_file"), e.to_string()))?,
            )
        }
    };
    let api_key = match (api_key, api_key_env) {
        (Some(_), Some(_)) => {
            return Err(sources.err(
                fidx,
                &key("api_key"),
                "set api_key or api_key_env, not both",
            ))
        }
        (Some(k), None) => Some(Secret::new(k)),
        (None, Some(var)) => match std::env::var(&var) {
            Ok(v) if !v.is_empty() => Some(Secret::new(v)),
            _ => {
                return Err(sources.err(
                    fidx,
                    &key("api_key_env"),
                    format!("environment variable `{var}` is not set"),
                ))
            }
        },
        (None, None) => None,
    };
    let timeouts = HopTimeouts {
        connect: connect_timeout_ms.map_or(defaults.connect, ms),
        first_byte: first_byte_timeout_ms.map_or(defaults.first_byte, ms),
        first_event: first_event_timeout_ms.map_or(defaults.first_event, ms),
        idle: idle_timeout_ms.map_or(defaults.idle, ms),
        heartbeat: heartbeat_interval_ms.map_or(defaults.heartbeat, ms),
    };
    for (name, d) in [
        ("connect_timeout_ms", timeouts.connect),
        ("first_byte_timeout_ms", timeouts.first_byte),
        ("first_event_timeout_ms", timeouts.first_event),
        ("idle_timeout_ms", timeouts.idle),
        ("heartbeat_interval_ms", timeouts.heartbeat),
    ] {
        if d.is_zero() {
            return Err(sources.err(fidx, &key(name), "must be greater than 0"));
        }
    }
    let (vertex, token_source, endpoint) = if kind == ProviderKind::Vertex {
        let parts =
            super::vertex::build(id, vertex_section, parse_base_url).map_err(|(k, m)| {
                let path = if k.is_empty() {
                    format!("providers.{id}")
                } else {
                    key(k)
                };
                sources.err(fidx, &path, m)
            })?;
        let endpoint = match endpoint {
            Some(e) => e,
            None => parse_base_url(&parts.default_base_url)
                .map_err(|m| sources.err(fidx, &key("region"), m))?,
        };
        (Some(parts.account), Some(parts.token), Some(endpoint))
    } else {
        (None, None, endpoint)
    };
    // The probe's default path is the kind's model list (Azure's needs its `api-version`).
    let default_path = || super::kinds::health_path(kind, api_version.as_deref());
    let health_check = match (kind, health_check) {
        (ProviderKind::Demo, _) => None,
        // The runtime API has no cheap read to probe (no model list): passive health only,
        // unless a probe path is configured (sent signed like any request).
        (ProviderKind::Bedrock, None) => None,
        // Vertex AI has no model list to probe: passive health only, unless a path is set.
        (ProviderKind::Vertex, None) => None,
        (_, Some(h)) if !h.enabled => None,
        (_, Some(h)) => Some(ActiveHealthCheck {
            mode: h.mode,
            path: if h.path == super::schema::default_health_path() {
                default_path()
            } else {
                h.path
            },
            interval: ms(h.interval_ms.max(100)),
            timeout: ms(h.timeout_ms.max(1)),
        }),
        (_, None) => Some(ActiveHealthCheck {
            mode: ProbeMode::List,
            path: default_path(),
            interval: ms(10_000),
            timeout: ms(2000),
        }),
    };
    let passive_health = match health {
        Some(h) => {
            if h.unhealthy_after_failures < h.degraded_after_failures
                || h.degraded_after_failures == 0
            {
                return Err(sources.err(
                    fidx,
                    &key("health"),
                    "need 0 < degraded_after_failures <= unhealthy_after_failures",
                ));
            }
            let error_rate = match h.error_rate_percent {
                None => None,
                Some(p) if !(1..=100).contains(&p) => {
                    return Err(sources.err(
                        fidx,
                        &key("health.error_rate_percent"),
                        "must be between 1 and 100",
                    ))
                }
                Some(_) if h.error_rate_window_ms == 0 || h.error_rate_min_requests == 0 => {
                    return Err(sources.err(
                        fidx,
                        &key("health"),
                        "error_rate_window_ms and error_rate_min_requests must be greater than 0",
                    ))
                }
                Some(percent) => Some(ErrorRate {
                    percent,
                    window: ms(h.error_rate_window_ms),
                    min_requests: h.error_rate_min_requests,
                }),
            };
            let decay_after_ms = h.decay_after_ms.unwrap_or(h.cooldown_ms.max(60_000));
            if decay_after_ms > 0 && decay_after_ms < h.cooldown_ms {
                // A route would "decay" to healthy while still resting.
                return Err(sources.err(
                    fidx,
                    &key("health.decay_after_ms"),
                    "must be at least cooldown_ms (or 0: no decay)",
                ));
            }
            PassiveHealth {
                degraded_after_failures: h.degraded_after_failures,
                unhealthy_after_failures: h.unhealthy_after_failures,
                cooldown: ms(h.cooldown_ms),
                error_rate,
                decay_after: (decay_after_ms > 0).then(|| ms(decay_after_ms)),
            }
        }
        None => PassiveHealth::default(),
    };
    Ok(Provider {
        id: id.to_string(),
        kind,
        endpoint,
        api_key,
        ca,
        h2_stream_window,
        timeouts,
        health_check,
        passive_health,
        stream_usage,
        max_concurrent_requests,
        api_version,
        aws,
        vertex,
        token_source,
    })
}

/// The AWS account of a `bedrock` provider: `region` required and well-formed, the
/// credentials of `aws_profile` or of the environment chain. Other kinds may set neither.
///
/// # Errors
/// `(key path, message)` of the offending key.
fn bedrock_account(
    kind: ProviderKind,
    region: Option<&str>,
    aws_profile: Option<&str>,
    key: &dyn Fn(&str) -> String,
) -> Result<Option<super::aws::AwsAccount>, (String, String)> {
    use super::aws::{self as credentials, valid_region, AwsAccount};
    if kind != ProviderKind::Bedrock {
        return match (region, aws_profile) {
            (Some(_), _) => Err((key("region"), "region is only for kind bedrock".into())),
            (_, Some(_)) => Err((
                key("aws_profile"),
                "aws_profile is only for kind bedrock".into(),
            )),
            _ => Ok(None),
        };
    }
    let region = match region {
        Some(r) if valid_region(r) => r,
        Some(r) => {
            return Err((
                key("region"),
                format!(
                    "`{r}` is no AWS region (lower-case letters, digits and `-`, e.g. us-east-2)"
                ),
            ))
        }
        None => {
            return Err((
                key("").trim_end_matches('.').to_string(),
                "region is required for kind bedrock (e.g. us-east-2)".into(),
            ))
        }
    };
    let env = |name: &str| std::env::var(name).ok();
    let creds = match aws_profile {
        Some(profile) => {
            let file = credentials::shared_file(&env).ok_or_else(|| {
                (
                    key("aws_profile"),
                    "no shared credentials file: set AWS_SHARED_CREDENTIALS_FILE or HOME"
                        .to_string(),
                )
            })?;
            credentials::from_profile(&file, profile).map_err(|e| (key("aws_profile"), e.0))?
        }
        None => credentials::from_env(&env)
            .map_err(|e| (key("").trim_end_matches('.').to_string(), e.0))?,
    };
    Ok(Some(AwsAccount {
        region: region.to_string(),
        credentials: creds,
    }))
}

/// Checks one `retry` section (`key` names it in errors).
fn check_retry(
    r: &crate::config::schema::RetrySection,
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
        passthrough,
    } = f;
    let main_err = |key: &str, msg: String| sources.err(0, key, msg);
    let ledger = ledger_settings(ledger, &main_err)?;
    let admin_token = match &server.admin_token_env {
        None => None,
        Some(var) => match std::env::var(var) {
            Ok(v) if v.chars().count() >= MIN_ADMIN_TOKEN_CHARS => Some(Secret::new(v)),
            Ok(v) if !v.is_empty() => {
                return Err(main_err(
                    "server.admin_token_env",
                    format!(
                        "the admin token in `{var}` is too short ({} characters; at least {MIN_ADMIN_TOKEN_CHARS})",
                        v.chars().count()
                    ),
                ))
            }
            _ => {
                return Err(main_err(
                    "server.admin_token_env",
                    format!("environment variable `{var}` is not set"),
                ))
            }
        },
    };

    for (k, v) in [
        ("server.listen", &server.listen),
        ("server.admin_listen", &server.admin_listen),
    ] {
        if v.parse::<std::net::SocketAddr>().is_err() {
            return Err(main_err(
                k,
                format!("`{v}` is not an address like 127.0.0.1:8080"),
            ));
        }
    }
    // Both listeners are bound with SO_REUSEPORT, so the same address twice binds without
    // error and the kernel then splits connections between the proxy and the admin
    // service: half the API calls would get the admin's 404.
    if let (Ok(l), Ok(a)) = (
        server.listen.parse::<std::net::SocketAddr>(),
        server.admin_listen.parse::<std::net::SocketAddr>(),
    ) {
        let overlap = l.port() == a.port()
            && l.port() != 0
            && (l.ip() == a.ip() || l.ip().is_unspecified() || a.ip().is_unspecified());
        if overlap {
            return Err(main_err(
                "server.admin_listen",
                format!(
                    "`{a}` overlaps `server.listen` ({l}): the proxy and the admin service \
                     need different ports"
                ),
            ));
        }
    }
    let tls = super::tls::tls_settings(
        server.tls_listen.as_deref(),
        server.tls.as_ref(),
        &[
            ("server.listen", &server.listen),
            ("server.admin_listen", &server.admin_listen),
        ],
        sources.files[0]
            .0
            .parent()
            .unwrap_or_else(|| Path::new(".")),
        &main_err,
    )?;
    if server.max_request_body_bytes == 0 {
        return Err(main_err(
            "server.max_request_body_bytes",
            "must be greater than 0".into(),
        ));
    }
    if server.max_buffered_bytes_per_stream < 1024 {
        return Err(main_err(
            "server.max_buffered_bytes_per_stream",
            "must be at least 1024".into(),
        ));
    }
    if server.max_event_bytes < 1024 {
        return Err(main_err(
            "server.max_event_bytes",
            "must be at least 1024".into(),
        ));
    }
    if server.rate_limit_window_ms == 0 {
        return Err(main_err(
            "server.rate_limit_window_ms",
            "must be greater than 0".into(),
        ));
    }
    if server.max_concurrent_upstream_requests == 0 {
        return Err(main_err(
            "server.max_concurrent_upstream_requests",
            "must be greater than 0".into(),
        ));
    }
    let copies = super::COPIES_PER_BODY_BYTE;
    if server.max_buffered_request_bytes / copies < server.max_request_body_bytes {
        return Err(main_err(
            "server.max_buffered_request_bytes",
            format!(
                "must be at least {copies} x server.max_request_body_bytes ({}): a body of the allowed size counts {copies} times and must fit",
                server.max_request_body_bytes
            ),
        ));
    }
    for (k, v) in [
        (
            "server.header_read_timeout_ms",
            server.header_read_timeout_ms,
        ),
        ("server.body_read_timeout_ms", server.body_read_timeout_ms),
    ] {
        if v == 0 {
            return Err(main_err(k, "must be greater than 0".into()));
        }
    }
    let edge = super::edge::edge_settings(
        &super::edge::EdgeSection {
            max_request_header_bytes: server.max_request_header_bytes,
            max_request_headers: server.max_request_headers,
            max_uri_bytes: server.max_uri_bytes,
            per_ip: server.per_ip.as_ref(),
            trusted_proxies: &server.trusted_proxies,
        },
        &main_err,
    )?;
    let threads = server.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    if threads == 0 {
        return Err(main_err("server.threads", "must be greater than 0".into()));
    }
    let defaults = HopTimeouts {
        connect: ms(server.connect_timeout_ms),
        first_byte: ms(server.first_byte_timeout_ms),
        first_event: ms(server.first_event_timeout_ms),
        idle: ms(server.idle_timeout_ms),
        heartbeat: ms(server.heartbeat_interval_ms),
    };
    let settings = ServerSettings {
        listen: server.listen,
        tls_listen: server.tls_listen,
        tls,
        admin_listen: server.admin_listen,
        threads,
        work_stealing: server.work_stealing,
        log_format: server.log_format,
        max_request_body_bytes: server.max_request_body_bytes,
        max_response_body_bytes: server.max_response_body_bytes,
        default_timeouts: defaults,
        downstream_write_timeout: ms(server.downstream_write_timeout_ms.max(1)),
        max_buffered_bytes_per_stream: server.max_buffered_bytes_per_stream,
        max_event_bytes: server.max_event_bytes,
        shutdown_grace: ms(server.shutdown_grace_ms),
        max_stream_duration: server.max_stream_duration_ms.map(ms),
        max_concurrent_upstream_requests: server.max_concurrent_upstream_requests,
        queue_size: server.queue_size,
        queue_timeout: ms(server.queue_timeout_ms),
        rate_limit_window: ms(server.rate_limit_window_ms),
        admin_token,
        emit_route_headers: server.emit_route_headers,
        watch_config: server.watch_config,
        pid_file: server.pid_file,
        upgrade_sock: server.upgrade_sock,
        error_log: server.error_log,
        max_buffered_request_bytes: server.max_buffered_request_bytes,
        header_read_timeout: ms(server.header_read_timeout_ms),
        body_read_timeout: ms(server.body_read_timeout_ms),
        retry: super::RetryPolicy::from_section(&server.retry),
        edge,
    };
    let server_retry = server.retry.clone();

    // Every unset `api_key_env` at once (a new user setting the keys one `sluice -t` at a
    // time would otherwise meet them one by one); one alone is `build_provider`'s error.
    let unset: Vec<(&String, &String)> = providers
        .iter()
        .filter(|(_, p)| p.api_key.is_none())
        .filter_map(|(id, p)| p.api_key_env.as_ref().map(|v| (id, v)))
        .filter(|(_, var)| std::env::var(var).map_or(true, |v| v.is_empty()))
        .collect();
    if let [(first_id, first_var), rest @ ..] = unset.as_slice() {
        if !rest.is_empty() {
            let others: Vec<String> = rest
                .iter()
                .map(|(id, var)| format!("`{var}` (providers.{id}.api_key_env)"))
                .collect();
            let fidx = sources.provider_file.get(*first_id).copied().unwrap_or(0);
            return Err(sources.err(
                fidx,
                &format!("providers.{first_id}.api_key_env"),
                format!(
                    "environment variable `{first_var}` is not set; also not set: {}",
                    others.join(", ")
                ),
            ));
        }
    }

    let mut provider_map = BTreeMap::new();
    for (id, p) in providers {
        let built = build_provider(
            &id,
            p,
            defaults,
            settings.max_buffered_bytes_per_stream,
            sources,
        )?;
        provider_map.insert(id, Arc::new(built));
    }
    let known_providers = || provider_map.keys().cloned().collect::<Vec<_>>().join(", ");

    let mut model_map = BTreeMap::new();
    check_retry(&server_retry, "server.retry", &main_err)?;
    for (id, m) in models {
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
            let (fidx, local) = files.get(i).copied().unwrap_or((0, i));
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
                return Err(sources.err(
                    fidx,
                    &format!("{key}.upstream_model"),
                    "must not be empty",
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
            routes.push(Route {
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
                context_window_tokens: r.context_window_tokens.or(m.context_window_tokens),
            });
        }
        model_map.insert(
            id.clone(),
            Arc::new(Model {
                id,
                strategy: m.strategy.unwrap_or_default(),
                first_event_timeout: m.first_event_timeout_ms.map(ms),
                early_commit_after: m.early_commit_after_ms.map(ms),
                continue_on_break: m.continue_on_break.unwrap_or(false),
                default_max_tokens: m.default_max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
                retry: {
                    let mut p = super::RetryPolicy::from_section(&server_retry);
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
            }),
        );
    }

    super::model_fallback::check(&model_map, &main_err)?;

    let check_lists = |fidx: usize,
                       key: &str,
                       models: Option<&Vec<String>>,
                       providers: Option<&Vec<String>>|
     -> Result<(), ConfigError> {
        for (i, m) in models.into_iter().flatten().enumerate() {
            if !model_map.contains_key(m) {
                return Err(sources.err(
                    fidx,
                    &format!("{key}.allowed_models[{i}]"),
                    format!("unknown model `{m}`"),
                ));
            }
        }
        for (i, p) in providers.into_iter().flatten().enumerate() {
            if !provider_map.contains_key(p) {
                return Err(sources.err(
                    fidx,
                    &format!("{key}.allowed_providers[{i}]"),
                    format!("unknown provider `{p}`"),
                ));
            }
        }
        Ok(())
    };

    let mut tenant_map = BTreeMap::new();
    for (id, t) in tenants {
        check_lists(
            0,
            &format!("tenants.{id}"),
            t.allowed_models.as_ref(),
            t.allowed_providers.as_ref(),
        )?;
        if let Some(m) = t.model_limits.keys().find(|m| !model_map.contains_key(*m)) {
            return Err(main_err(
                &format!("tenants.{id}.model_limits.{m}"),
                format!("unknown model `{m}`"),
            ));
        }
        if let Some(b) = &t.budget {
            for (name, v) in [
                ("total_usd", b.total_usd),
                ("monthly_usd", b.monthly_usd),
                ("daily_usd", b.daily_usd),
            ] {
                if let Some(v) = v.filter(|v| !v.is_finite() || *v < 0.0) {
                    return Err(main_err(
                        &format!("tenants.{id}.budget.{name}"),
                        format!("a budget is a finite amount of USD, 0 or more (got {v})"),
                    ));
                }
            }
        }
        tenant_map.insert(id.clone(), Arc::new(Tenant { id, limits: t }));
    }

    let mut keys = KeyTable::default();
    for (n, k) in virtual_keys.into_iter().enumerate() {
        let (fidx, local) = sources.key_files.get(n).copied().unwrap_or((0, n));
        let key = format!("virtual_keys[{local}]");
        let tenant = tenant_map.get(&k.tenant).ok_or_else(|| {
            sources.err(
                fidx,
                &format!("{key}.tenant"),
                format!("unknown tenant `{}`", k.tenant),
            )
        })?;
        let hash = match (&k.key, &k.key_sha256) {
            (Some(raw), None) => {
                if raw.len() < 8 {
                    return Err(sources.err(
                        fidx,
                        &format!("{key}.key"),
                        "a key needs at least 8 characters",
                    ));
                }
                hash_key(raw)
            }
            (None, Some(hex_hash)) => {
                let bytes = hex::decode(hex_hash.trim())
                    .ok()
                    .and_then(|b| <[u8; 32]>::try_from(b).ok())
                    .ok_or_else(|| {
                        sources.err(
                            fidx,
                            &format!("{key}.key_sha256"),
                            "must be 64 hex characters (SHA-256)",
                        )
                    })?;
                bytes
            }
            _ => {
                return Err(sources.err(fidx, &key, "set exactly one of `key` or `key_sha256`"));
            }
        };
        if keys.contains_hash(&hash) {
            return Err(sources.err(fidx, &key, "duplicate virtual key"));
        }
        check_lists(
            fidx,
            &key,
            k.allowed_models.as_ref(),
            k.allowed_providers.as_ref(),
        )?;
        // A key's lists narrow its tenant's lists.
        let allowed_models = intersect(k.allowed_models, tenant.limits.allowed_models.clone());
        let allowed_providers =
            intersect(k.allowed_providers, tenant.limits.allowed_providers.clone());
        keys.insert(
            hash,
            Caller {
                tenant: k.tenant.clone(),
                key_id: k
                    .name
                    .unwrap_or_else(|| format!("key-{}", hex::encode(&hash[..4]))),
                allowed_models: allowed_models.map(Into::into),
                allowed_providers: allowed_providers.map(Into::into),
                strategy: k.strategy,
            },
        );
    }

    if let Some(r) = &redis {
        if !(r.url.starts_with("redis://") || r.url.starts_with("rediss://")) {
            return Err(main_err(
                "redis.url",
                format!("`{}` must start with redis://", r.url),
            ));
        }
        if r.replicas == 0 {
            return Err(main_err("redis.replicas", "must be at least 1".into()));
        }
    }

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
        passthrough,
    })
}

/// Shortest accepted admin token, characters.
const MIN_ADMIN_TOKEN_CHARS: usize = 16;

/// `ledger:` → [`super::ledger::LedgerSettings`] (`None`: the defaults); `err(key, message)`
/// locates a problem in the main file.
fn ledger_settings(
    section: Option<super::schema::LedgerSection>,
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<super::ledger::LedgerSettings, ConfigError> {
    use super::ledger::{Backend, LedgerSettings};
    let defaults = LedgerSettings::default();
    let Some(super::schema::LedgerSection {
        enabled,
        path,
        url,
        flush_interval_ms,
        queue_capacity,
    }) = section
    else {
        return Ok(defaults);
    };
    let backend = match (path, url) {
        (Some(_), Some(_)) => {
            return Err(err(
                "ledger.url",
                "set ledger.path (SQLite) or ledger.url (PostgreSQL), not both".into(),
            ))
        }
        (Some(p), None) if p.trim().is_empty() => {
            return Err(err("ledger.path", "must not be empty".into()))
        }
        (Some(p), None) => Backend::Sqlite { path: p.into() },
        (None, Some(u)) => {
            super::ledger::check_url(&u).map_err(|m| err("ledger.url", m))?;
            Backend::Postgres {
                url: Secret::new(u),
            }
        }
        (None, None) => defaults.backend,
    };
    let flush_interval = match flush_interval_ms {
        Some(0) => {
            return Err(err(
                "ledger.flush_interval_ms",
                "must be greater than 0".into(),
            ))
        }
        Some(v) => ms(v),
        None => defaults.flush_interval,
    };
    let queue_capacity = match queue_capacity {
        Some(0) => return Err(err("ledger.queue_capacity", "must be at least 1".into())),
        Some(v) => v,
        None => defaults.queue_capacity,
    };
    Ok(LedgerSettings {
        enabled: enabled.unwrap_or(true),
        backend,
        flush_interval,
        queue_capacity,
    })
}

/// Reads only the `ledger:` section of `path` (see [`Config::load_ledger`]).
pub(super) fn load_ledger(path: &Path) -> Result<super::ledger::LedgerSettings, ConfigError> {
    let text = read(path)?;
    let only: super::schema::LedgerOnly = parse(path, &text)?;
    ledger_settings(only.ledger, &|key, msg| {
        ConfigError::at(path, Some(&text), key, msg)
    })
}

fn intersect(a: Option<Vec<String>>, b: Option<Vec<String>>) -> Option<Vec<String>> {
    match (a, b) {
        (None, x) | (x, None) => x,
        (Some(a), Some(b)) => Some(a.into_iter().filter(|x| b.contains(x)).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_str(yaml: &str) -> Result<Config, ConfigError> {
        let dir = std::env::temp_dir().join(format!("sluice-cfg-{}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("sluice.yaml");
        std::fs::write(&p, yaml).unwrap();
        let r = load(&p);
        let _ = std::fs::remove_dir_all(&dir);
        r
    }

    const MINIMAL: &str = "server:\n  listen: 127.0.0.1:8080\n  admin_listen: 127.0.0.1:9090\ntenants:\n  team-a: {}\nvirtual_keys:\n  - key: sk-sluice-team-a-0001\n    tenant: team-a\nproviders:\n  local-mock:\n    kind: openai\n    base_url: http://127.0.0.1:18000/v1\n    api_key: test-key\nmodels:\n  acme/chat-small:\n    routes:\n      - provider: local-mock\n        upstream_model: mock-small-v1\n        priority: 10\n";

    #[test]
    fn minimal_contract_loads() {
        let c = load_str(MINIMAL).unwrap();
        let p = &c.providers["local-mock"];
        let ep = p.endpoint.as_ref().unwrap();
        assert_eq!(
            (ep.host.as_str(), ep.port, ep.base_path.as_str(), ep.tls),
            ("127.0.0.1", 18000, "/v1", false)
        );
        assert_eq!(
            c.models["acme/chat-small"].routes[0].upstream_model,
            "mock-small-v1"
        );
        assert!(c.keys.authenticate("sk-sluice-team-a-0001").is_some());
        assert!(c.server.threads >= 1);
        assert!(
            c.server.work_stealing,
            "Pingora's default runtime unless asked"
        );
    }

    #[test]
    fn work_stealing_can_be_turned_off_and_must_be_a_bool() {
        let off = MINIMAL.replacen("server:\n", "server:\n  work_stealing: false\n", 1);
        assert_ne!(off, MINIMAL, "MINIMAL has a server section");
        assert!(!load_str(&off).unwrap().server.work_stealing);
        let bad = MINIMAL.replacen("server:\n", "server:\n  work_stealing: sometimes\n", 1);
        let err = load_str(&bad).unwrap_err().to_string();
        assert!(err.contains("work_stealing"), "{err}");
    }

    #[test]
    fn the_ledger_defaults_to_sqlite_in_the_working_directory_and_its_keys_are_checked() {
        use crate::config::ledger::{Backend, LedgerSettings};
        let c = load_str(MINIMAL).unwrap();
        assert_eq!(c.ledger, LedgerSettings::default());
        assert_eq!(
            c.ledger.backend,
            Backend::Sqlite {
                path: "sluice-usage.db".into()
            }
        );
        assert_eq!(c.ledger.flush_interval, Duration::from_millis(200));
        let set = format!(
            "{MINIMAL}ledger:\n  path: /var/lib/sluice/usage.db\n  flush_interval_ms: 50\n  queue_capacity: 7\n"
        );
        let c = load_str(&set).unwrap();
        assert_eq!(
            c.ledger.backend,
            Backend::Sqlite {
                path: "/var/lib/sluice/usage.db".into()
            }
        );
        assert_eq!(
            (c.ledger.flush_interval, c.ledger.queue_capacity),
            (Duration::from_millis(50), 7)
        );
        let pg = format!("{MINIMAL}ledger: {{url: \"postgres://u:pw@127.0.0.1:5432/usage\"}}\n");
        let c = load_str(&pg).unwrap();
        assert!(matches!(c.ledger.backend, Backend::Postgres { .. }));
        assert!(!format!("{:?} {}", c.ledger, c.ledger.backend).contains("pw@"));
        // `enabled` defaults to true; `false` keeps the rest (checked, unused).
        assert!(c.ledger.enabled);
        let off = load_str(&format!(
            "{MINIMAL}ledger: {{enabled: false, path: /var/lib/sluice/usage.db}}\n"
        ))
        .unwrap();
        assert!(!off.ledger.enabled);
        assert_eq!(
            off.ledger.backend,
            Backend::Sqlite {
                path: "/var/lib/sluice/usage.db".into()
            }
        );

        // file:line:col: key: message, like every other key.
        for (yaml, key, line, msg) in [
            (
                "ledger:\n  path: a.db\n  url: postgres://h/db\n",
                "ledger.url",
                22,
                "not both",
            ),
            (
                "ledger:\n  url: mysql://h/db\n",
                "ledger.url",
                21,
                "postgres://",
            ),
            (
                "ledger:\n  url: postgres://h/db?sslmode=require\n",
                "ledger.url",
                21,
                "sslmode=require",
            ),
            (
                "ledger:\n  flush_interval_ms: 0\n",
                "ledger.flush_interval_ms",
                21,
                "greater than 0",
            ),
            (
                "ledger:\n  queue_capacity: 0\n",
                "ledger.queue_capacity",
                21,
                "at least 1",
            ),
            (
                "ledger:\n  pth: x\n",
                "ledger.pth",
                21,
                "unknown field `pth`",
            ),
        ] {
            let e = load_str(&format!("{MINIMAL}{yaml}")).unwrap_err();
            assert_eq!(e.key_path, key, "{e}");
            assert_eq!(e.line, Some(line), "{e}");
            assert!(e.to_string().contains(msg), "{e}");
        }
    }

    #[test]
    fn the_admin_token_comes_from_the_named_variable_which_must_be_set() {
        assert!(load_str(MINIMAL).unwrap().server.admin_token.is_none());
        let yaml = MINIMAL.replace(
            "  admin_listen: 127.0.0.1:9090\n",
            "  admin_listen: 127.0.0.1:9090\n  admin_token_env: SLUICE_TEST_SURELY_UNSET_ADMIN_TOKEN\n",
        );
        let e = load_str(&yaml).unwrap_err();
        assert_eq!(e.key_path, "server.admin_token_env", "{e}");
        assert_eq!(e.line, Some(4), "{e}");
        assert!(
            e.to_string()
                .contains("SLUICE_TEST_SURELY_UNSET_ADMIN_TOKEN"),
            "{e}"
        );
    }

    #[test]
    fn sluice_usage_reads_the_ledger_section_alone() {
        // Provider keys from unset variables, unknown sections: none of it matters here.
        let dir = std::env::temp_dir().join(format!("sluice-cfg-{}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("sluice.yaml");
        std::fs::write(
            &p,
            "providers:\n  o: {kind: openai, base_url: https://x/v1, api_key_env: SLUICE_SURELY_UNSET}\nledger:\n  path: /tmp/u.db\n",
        )
        .unwrap();
        let l = load_ledger(&p).unwrap();
        assert_eq!(
            l.backend,
            crate::config::ledger::Backend::Sqlite {
                path: "/tmp/u.db".into()
            }
        );
        std::fs::write(&p, "server: {}\nledger:\n  flush_interval_ms: 0\n").unwrap();
        let e = load_ledger(&p).unwrap_err();
        assert_eq!(
            (e.key_path.as_str(), e.line),
            ("ledger.flush_interval_ms", Some(3)),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn max_event_bytes_is_its_own_limit() {
        let c = load_str(MINIMAL).unwrap();
        assert_eq!(c.server.max_event_bytes, 8 * 1024 * 1024);
        assert_eq!(c.server.max_buffered_bytes_per_stream, 65_536);
        let set = MINIMAL.replace(
            "  admin_listen: 127.0.0.1:9090\n",
            "  admin_listen: 127.0.0.1:9090\n  max_event_bytes: 300000\n",
        );
        assert_eq!(load_str(&set).unwrap().server.max_event_bytes, 300_000);
        let bad = MINIMAL.replace(
            "  admin_listen: 127.0.0.1:9090\n",
            "  admin_listen: 127.0.0.1:9090\n  max_event_bytes: 100\n",
        );
        let e = load_str(&bad).unwrap_err();
        assert_eq!(e.key_path, "server.max_event_bytes", "{e}");
    }

    #[test]
    fn hostile_client_bounds_default_and_are_checked() {
        let c = load_str(MINIMAL).unwrap();
        assert_eq!(c.server.max_buffered_request_bytes, 256 * 1024 * 1024);
        assert_eq!(c.server.header_read_timeout, Duration::from_secs(30));
        assert_eq!(c.server.body_read_timeout, Duration::from_secs(60));
        let small = MINIMAL.replace(
            "  admin_listen: 127.0.0.1:9090\n",
            "  admin_listen: 127.0.0.1:9090\n  max_request_body_bytes: 2000\n  max_buffered_request_bytes: 3999\n",
        );
        let e = load_str(&small).unwrap_err();
        assert_eq!(e.key_path, "server.max_buffered_request_bytes", "{e}");
        let zero = MINIMAL.replace(
            "  admin_listen: 127.0.0.1:9090\n",
            "  admin_listen: 127.0.0.1:9090\n  header_read_timeout_ms: 0\n",
        );
        let e = load_str(&zero).unwrap_err();
        assert_eq!(e.key_path, "server.header_read_timeout_ms", "{e}");
    }

    #[test]
    fn listen_and_admin_listen_must_not_overlap() {
        for admin in ["127.0.0.1:8080", "0.0.0.0:8080"] {
            let same = MINIMAL.replace(
                "admin_listen: 127.0.0.1:9090",
                &format!("admin_listen: {admin}"),
            );
            let e = load_str(&same).unwrap_err();
            assert_eq!(e.key_path, "server.admin_listen", "{e}");
            assert!(e.to_string().contains("overlaps"), "{e}");
        }
        let other_ip = MINIMAL.replace(
            "admin_listen: 127.0.0.1:9090",
            "admin_listen: 127.0.0.2:8080",
        );
        assert!(load_str(&other_ip).is_ok());
    }

    #[test]
    fn prices_load_with_their_defaults_and_bad_ones_are_located() {
        let priced = MINIMAL.replace(
            "  acme/chat-small:\n    routes:\n",
            "  acme/chat-small:\n    input_usd_per_mtok: 0.30\n    output_usd_per_mtok: 1.20\n    cached_input_usd_per_mtok: 0.075\n    routes:\n",
        );
        let priced = priced.replace(
            "        priority: 10\n",
            "        priority: 10\n        input_usd_per_mtok: 0.15\n        output_usd_per_mtok: 0.60\n        cache_write_usd_per_mtok: 0.1875\n",
        );
        let c = load_str(&priced).unwrap();
        let m = &c.models["acme/chat-small"];
        assert_eq!(m.cached_input_usd_per_mtok, Some(0.075));
        assert_eq!(m.cache_write_usd_per_mtok, None);
        assert_eq!(m.routes[0].cache_write_usd_per_mtok, Some(0.1875));
        assert_eq!(m.routes[0].cached_input_usd_per_mtok, None);
        assert!(c.warnings().is_empty());

        for (bad, key, line) in [
            (
                "cached_input_usd_per_mtok: -0.1",
                "models.acme/chat-small.cached_input_usd_per_mtok",
                18,
            ),
            (
                "cached_input_usd_per_mtok: .nan",
                "models.acme/chat-small.cached_input_usd_per_mtok",
                18,
            ),
            (
                "cached_input_usd_per_mtok: .inf",
                "models.acme/chat-small.cached_input_usd_per_mtok",
                18,
            ),
        ] {
            let y = priced.replace("cached_input_usd_per_mtok: 0.075", bad);
            let e = load_str(&y).unwrap_err();
            assert_eq!(e.key_path, key, "{bad}: {e}");
            assert_eq!(e.line, Some(line), "{bad}: {e}");
        }
        let y = priced.replace(
            "cache_write_usd_per_mtok: 0.1875",
            "cache_write_usd_per_mtok: -1",
        );
        let e = load_str(&y).unwrap_err();
        assert_eq!(
            e.key_path, "models.acme/chat-small.routes[0].cache_write_usd_per_mtok",
            "{e}"
        );
        assert!(e.message.contains("must not be negative"), "{e}");

        // Priced in part: a located warning (output would be free).
        let half = priced.replace("    output_usd_per_mtok: 1.20\n", "");
        let w = load_str(&half).unwrap().warnings();
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].key_path, "models.acme/chat-small.output_usd_per_mtok");
        // Not priced at all: free by intent, no warning.
        assert!(load_str(MINIMAL).unwrap().warnings().is_empty());
    }

    #[test]
    fn continuation_keys_load_and_a_single_route_continuation_is_warned_about() {
        let c = load_str(MINIMAL).unwrap();
        let m = &c.models["acme/chat-small"];
        assert!(!m.continue_on_break);
        assert!(!m.routes[0].supports_prefill);
        let one = MINIMAL.replace(
            "  acme/chat-small:\n",
            "  acme/chat-small:\n    continue_on_break: true\n",
        );
        let c = load_str(&one).unwrap();
        assert!(c.models["acme/chat-small"].continue_on_break);
        let w = c.warnings();
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].key_path, "models.acme/chat-small.continue_on_break");
        let two = one.replace(
            "        priority: 10\n",
            "        priority: 10\n      - provider: local-mock\n        upstream_model: mock-large-v1\n        supports_prefill: true\n",
        );
        let c = load_str(&two).unwrap();
        assert!(c.warnings().is_empty());
        assert!(c.models["acme/chat-small"].routes[1].supports_prefill);
    }

    #[test]
    fn unknown_key_is_an_error_with_line() {
        let bad = MINIMAL.replace("  admin_listen", "  admn_listen");
        let e = load_str(&bad).unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        assert!(e.to_string().contains("admn_listen"), "{e}");
    }

    #[test]
    fn unknown_provider_names_line_and_key() {
        let bad = MINIMAL.replace("- provider: local-mock", "- provider: nope");
        let e = load_str(&bad).unwrap_err();
        assert_eq!(e.key_path, "models.acme/chat-small.routes[0].provider");
        assert_eq!(e.line, Some(17), "{e}");
        assert!(e.message.contains("unknown provider `nope`"), "{e}");
    }

    #[test]
    fn missing_env_key_is_an_error() {
        let bad = MINIMAL.replace(
            "api_key: test-key",
            "api_key_env: SLUICE_TEST_SURELY_UNSET_VAR",
        );
        let e = load_str(&bad).unwrap_err();
        assert!(
            e.to_string().contains("SLUICE_TEST_SURELY_UNSET_VAR"),
            "{e}"
        );
    }

    #[test]
    fn every_missing_env_key_is_named_at_once() {
        let two = MINIMAL
            .replace("api_key: test-key", "api_key_env: SLUICE_TEST_SURELY_UNSET_A")
            .replace(
                "models:\n",
                "  zz-second:\n    kind: openai\n    base_url: http://127.0.0.1:9\n    api_key_env: SLUICE_TEST_SURELY_UNSET_B\nmodels:\n",
            );
        let e = load_str(&two).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("environment variable `SLUICE_TEST_SURELY_UNSET_A` is not set"),
            "{text}"
        );
        assert!(
            text.contains("`SLUICE_TEST_SURELY_UNSET_B` (providers.zz-second.api_key_env)"),
            "{text}"
        );
    }

    #[test]
    fn a_budget_is_a_finite_amount_at_or_above_zero_and_unknown_windows_are_errors() {
        let ok = MINIMAL.replace(
            "  team-a: {}\n",
            "  team-a:\n    budget: {total_usd: 500, daily_usd: 0}\n",
        );
        let c = load_str(&ok).unwrap();
        let b = c.tenants["team-a"].limits.budget.unwrap();
        assert_eq!(
            (b.total_usd, b.monthly_usd, b.daily_usd),
            (Some(500.0), None, Some(0.0))
        );
        let bad = MINIMAL.replace(
            "  team-a: {}\n",
            "  team-a:\n    budget: {monthly_usd: -1}\n",
        );
        let e = load_str(&bad).unwrap_err();
        assert_eq!(e.key_path, "tenants.team-a.budget.monthly_usd", "{e}");
        assert!(e.message.contains("0 or more"), "{e}");
        let bad = MINIMAL.replace("  team-a: {}\n", "  team-a:\n    budget: {weekly_usd: 5}\n");
        let e = load_str(&bad).unwrap_err();
        assert!(e.key_path.starts_with("tenants.team-a.budget"), "{e}");
        assert!(e.message.contains("weekly_usd"), "{e}");
    }

    #[test]
    fn retry_sections_are_checked_and_a_models_override_merges_over_the_servers() {
        let ok = MINIMAL
            .replace(
                "  admin_listen: 127.0.0.1:9090\n",
                "  admin_listen: 127.0.0.1:9090\n  retry: {max_attempts_per_route: 3, on: [503, connect_error]}\n",
            )
            .replace("    routes:\n", "    retry: {backoff_ms: 7}\n    routes:\n");
        let c = load_str(&ok).unwrap();
        let p = &c.models["acme/chat-small"].retry;
        assert_eq!(p.max_attempts_per_route, 3);
        assert_eq!(p.statuses, [503]);
        assert!(p.connect_error && !p.connection_reset);
        assert_eq!(p.backoff, Duration::from_millis(7));
        assert_eq!(c.server.retry.backoff, Duration::from_millis(100));
        for (bad, key, msg) in [
            ("on: [700]", "server.retry.on", "HTTP status"),
            ("on: [timeout]", "server.retry.on", "connect_error"),
            (
                "max_attempts_per_route: 0",
                "server.retry.max_attempts_per_route",
                "at least 1",
            ),
            (
                "budget_ratio: 2",
                "server.retry.budget_ratio",
                "between 0 and 1",
            ),
        ] {
            let y = MINIMAL.replace(
                "  admin_listen: 127.0.0.1:9090\n",
                &format!("  admin_listen: 127.0.0.1:9090\n  retry: {{{bad}}}\n"),
            );
            let e = load_str(&y).unwrap_err();
            assert!(e.key_path.starts_with(key), "{bad}: {e}");
            assert!(e.message.contains(msg), "{bad}: {e}");
        }
    }

    #[test]
    fn hedge_after_ms_and_affinity_are_opt_in_and_checked() {
        use crate::config::opt_in::{Affinity, HedgeAfter};
        let c = load_str(MINIMAL).unwrap();
        let m = &c.models["acme/chat-small"];
        assert_eq!(
            (m.hedge_after, m.affinity),
            (None, Affinity::Off),
            "off by default"
        );
        for (v, want) in [
            ("150", HedgeAfter::Fixed(Duration::from_millis(150))),
            ("auto", HedgeAfter::Auto),
        ] {
            let y = MINIMAL.replace(
                "    routes:\n",
                &format!("    hedge_after_ms: {v}\n    affinity: conversation\n    routes:\n"),
            );
            let c = load_str(&y).unwrap();
            let m = &c.models["acme/chat-small"];
            assert_eq!(
                (m.hedge_after, m.affinity),
                (Some(want), Affinity::Conversation)
            );
        }
        let y = MINIMAL.replace("    routes:\n", "    hedge_after_ms: 0\n    routes:\n");
        let e = load_str(&y).unwrap_err();
        assert_eq!(e.key_path, "models.acme/chat-small.hedge_after_ms", "{e}");
        assert!(e.message.contains("at least 1"), "{e}");
        for bad in ["hedge_after_ms: soon", "affinity: sticky"] {
            let y = MINIMAL.replace("    routes:\n", &format!("    {bad}\n    routes:\n"));
            assert!(load_str(&y).is_err(), "{bad}");
        }
    }

    #[test]
    fn repeated_mapping_key_is_an_error_at_its_second_line() {
        let bad = MINIMAL.replace("  team-a: {}\n", "  team-a: {}\n  team-a: {}\n");
        let e = load_str(&bad).unwrap_err();
        assert_eq!(e.key_path, "tenants.team-a");
        assert_eq!((e.line, e.column), (Some(6), Some(3)), "{e}");
        assert!(e.message.contains("duplicate key `team-a`"), "{e}");
        let bad = MINIMAL.replace(
            "        priority: 10\n",
            "        priority: 10\n        priority: 20\n",
        );
        let e = load_str(&bad).unwrap_err();
        assert_eq!(e.key_path, "models.acme/chat-small.routes[0].priority");
        assert_eq!(e.line, Some(19), "{e}");
    }

    #[test]
    fn base_url_forms() {
        let e = parse_base_url("https://api.openai.com/v1").unwrap();
        assert_eq!(
            (e.port, e.tls, e.base_path.as_str(), e.ip),
            (443, true, "/v1", None)
        );
        assert_eq!(e.host_header(), "api.openai.com");
        let e = parse_base_url("http://[::1]:8000/v1/").unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.base_path.as_str()),
            ("::1", 8000, "/v1")
        );
        assert!(parse_base_url("ftp://x").is_err());
    }

    #[test]
    fn bad_key_hash_rejected() {
        let bad = MINIMAL.replace("key: sk-sluice-team-a-0001", "key_sha256: abc");
        let e = load_str(&bad).unwrap_err();
        assert_eq!(e.key_path, "virtual_keys[0].key_sha256");
    }

    #[test]
    fn health_decay_and_probe_mode_keys() {
        use crate::config::ProbeMode;
        let with = |lines: &str| {
            MINIMAL.replace(
                "    api_key: test-key\n",
                &format!("    api_key: test-key\n{lines}"),
            )
        };
        let c = load_str(MINIMAL).unwrap();
        let p = &c.providers["local-mock"];
        assert_eq!(p.passive_health.decay_after, Some(Duration::from_secs(60)));
        assert_eq!(p.health_check.as_ref().unwrap().mode, ProbeMode::List);
        let c = load_str(&with(
            "    health: {cooldown_ms: 90000}\n    health_check: {mode: request, interval_ms: 30000}\n",
        ))
        .unwrap();
        let p = &c.providers["local-mock"];
        assert_eq!(
            p.passive_health.decay_after,
            Some(Duration::from_secs(90)),
            "the default decay is never shorter than the cool-down"
        );
        assert_eq!(p.health_check.as_ref().unwrap().mode, ProbeMode::Request);
        let c = load_str(&with("    health: {decay_after_ms: 0}\n")).unwrap();
        assert_eq!(c.providers["local-mock"].passive_health.decay_after, None);
        let e = load_str(&with(
            "    health: {cooldown_ms: 5000, decay_after_ms: 1000}\n",
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("providers.local-mock.health.decay_after_ms: must be at least cooldown_ms"),
            "{e}"
        );
        let e = load_str(&with("    health_check: {mode: chat}\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("mode"), "{e}");
    }
}
