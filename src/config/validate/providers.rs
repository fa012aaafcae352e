//! Owns the validation of `providers:`: each provider's kind-specific keys, address, key,
//! TLS trust, timeouts and health settings, into the [`Provider`] data the registry
//! (`providers::registry`) later resolves. Kind-specific rules come from
//! [`crate::config::kinds`], [`crate::config::aws`] and [`crate::config::vertex`].

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use super::{ms, parse_base_url, Sources};
use crate::config::error::ConfigError;
use crate::config::schema::{
    HealthCheckSection, PassiveHealthSection, ProviderKind, ProviderSection,
};
use crate::config::{
    ActiveHealthCheck, Endpoint, ErrorRate, HopTimeouts, PassiveHealth, ProbeMode, Provider,
};
use crate::secret::Secret;

/// Where one provider's errors point: its file and its key path.
struct Loc<'a> {
    sources: &'a Sources,
    fidx: usize,
    id: &'a str,
}

impl Loc<'_> {
    /// `providers.<id>.<k>`.
    fn key(&self, k: &str) -> String {
        format!("providers.{}.{k}", self.id)
    }

    /// An error at `providers.<id>.<k>`.
    fn err(&self, k: &str, msg: impl Into<String>) -> ConfigError {
        self.sources.err(self.fidx, &self.key(k), msg)
    }
}

/// Every provider of `providers`, built in id order.
///
/// # Errors
/// Every unset `api_key_env` at once, else the first problem of the first bad provider.
pub(super) fn build_providers(
    providers: BTreeMap<String, ProviderSection>,
    defaults: HopTimeouts,
    h2_stream_window: usize,
    sources: &Sources,
) -> Result<BTreeMap<String, Arc<Provider>>, ConfigError> {
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
        let built = build_provider(&id, p, defaults, h2_stream_window, sources)?;
        provider_map.insert(id, Arc::new(built));
    }
    Ok(provider_map)
}

/// One provider: its keys checked in the order the kind's rules, the address, the key,
/// the timeouts and the health settings depend on each other.
fn build_provider(
    id: &str,
    p: ProviderSection,
    defaults: HopTimeouts,
    h2_stream_window: usize,
    sources: &Sources,
) -> Result<Provider, ConfigError> {
    let loc = Loc {
        sources,
        fidx: sources.provider_file.get(id).copied().unwrap_or(0),
        id,
    };
    let fidx = loc.fidx;
    let key = |k: &str| loc.key(k);
    let ProviderSection {
        kind,
        base_url,
        api_key_env,
        api_key,
        connect_timeout_ms,
        first_byte_timeout_ms,
        non_stream_first_byte_timeout_ms,
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
    let vertex_section = check_kind_keys(
        &loc,
        kind,
        (api_key.is_some(), api_key_env.is_some()),
        crate::config::vertex::VertexSection {
            project,
            region: region.clone(),
            credentials_file_env,
            token_url,
        },
    )?;
    let bedrock_region = if kind == ProviderKind::Bedrock {
        region.as_deref()
    } else {
        None
    };
    let aws = bedrock_account(kind, bedrock_region, aws_profile.as_deref(), &key)
        .map_err(|(k, m)| sources.err(fidx, &k, m))?;
    let api_version = checked_api_version(&loc, kind, api_version)?;
    if max_concurrent_requests == Some(0) {
        return Err(loc.err(
            "max_concurrent_requests",
            "must be at least 1 (leave it out for no cap)",
        ));
    }
    let endpoint = endpoint(&loc, kind, base_url, aws.as_ref())?;
    let ca = upstream_ca(&loc, ca_file, endpoint.as_ref())?;
    let api_key = provider_key(&loc, api_key, api_key_env)?;
    let timeouts = hop_timeouts(
        &loc,
        defaults,
        [
            connect_timeout_ms,
            first_byte_timeout_ms,
            // This provider's `first_byte_timeout_ms`, when set, holds for both shapes
            // unless its non-stream key says otherwise (as before that key existed).
            non_stream_first_byte_timeout_ms.or(first_byte_timeout_ms),
            first_event_timeout_ms,
            idle_timeout_ms,
            heartbeat_interval_ms,
        ],
    )?;
    let (vertex, token_source, endpoint) = vertex_parts(&loc, kind, vertex_section, endpoint)?;
    let health_check = active_health(kind, api_version.as_deref(), health_check);
    let passive_health = passive_health(&loc, health)?;
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

/// A Vertex AI provider's account, token source and address.
type VertexParts = (
    Option<crate::config::vertex::VertexAccount>,
    Option<crate::config::vertex::TokenSource>,
    Option<Endpoint>,
);

/// A Vertex AI provider's account, token source and address (its region's endpoint when
/// `base_url` is not set); `(None, None, endpoint)` for every other kind.
fn vertex_parts(
    loc: &Loc<'_>,
    kind: ProviderKind,
    vertex_section: crate::config::vertex::VertexSection,
    endpoint: Option<Endpoint>,
) -> Result<VertexParts, ConfigError> {
    let (fidx, sources, id) = (loc.fidx, loc.sources, loc.id);
    let key = |k: &str| loc.key(k);
    Ok(if kind == ProviderKind::Vertex {
        let parts = crate::config::vertex::build(id, vertex_section, parse_base_url).map_err(
            |(k, m)| {
                let path = if k.is_empty() {
                    format!("providers.{id}")
                } else {
                    key(k)
                };
                sources.err(fidx, &path, m)
            },
        )?;
        let endpoint = match endpoint {
            Some(e) => e,
            None => parse_base_url(&parts.default_base_url)
                .map_err(|m| sources.err(fidx, &key("region"), m))?,
        };
        (Some(parts.account), Some(parts.token), Some(endpoint))
    } else {
        (None, None, endpoint)
    })
}

/// The keys only some kinds take: an API key on a kind that signs otherwise (Bedrock,
/// Vertex AI), Vertex AI's keys on another kind. `region` is both kinds' key: Bedrock's AWS
/// region, Vertex AI's Google Cloud region. Returns the Vertex section (without Bedrock's
/// region).
fn check_kind_keys(
    loc: &Loc<'_>,
    kind: ProviderKind,
    (has_api_key, has_api_key_env): (bool, bool),
    mut vertex_section: crate::config::vertex::VertexSection,
) -> Result<crate::config::vertex::VertexSection, ConfigError> {
    if kind == ProviderKind::Bedrock && (has_api_key || has_api_key_env) {
        let k = if has_api_key {
            "api_key"
        } else {
            "api_key_env"
        };
        return Err(loc.err(
            k,
            "kind bedrock signs with AWS credentials (the AWS_* environment or aws_profile), not an API key",
        ));
    }
    if kind == ProviderKind::Bedrock {
        vertex_section.region = None;
    }
    if kind != ProviderKind::Vertex {
        if let Some(k) = vertex_section.first_set() {
            let m = if k == "region" {
                "region is only for kinds bedrock and vertex".to_string()
            } else {
                format!("{k} is only for kind vertex")
            };
            return Err(loc.err(k, m));
        }
    } else if let Some(k) = [("api_key", has_api_key), ("api_key_env", has_api_key_env)]
        .into_iter()
        .find_map(|(k, set)| set.then_some(k))
    {
        return Err(loc.err(
            k,
            "kind vertex authenticates with a service-account key (credentials_file_env), not an API key",
        ));
    }
    Ok(vertex_section)
}

/// `api_version` checked by the kind's rule ([`crate::config::kinds::api_version`]).
fn checked_api_version(
    loc: &Loc<'_>,
    kind: ProviderKind,
    api_version: Option<String>,
) -> Result<Option<String>, ConfigError> {
    crate::config::kinds::api_version(kind, api_version).map_err(|(k, m)| match k {
        Some(k) => loc.err(k, m),
        None => loc
            .sources
            .err(loc.fidx, &format!("providers.{}", loc.id), m),
    })
}

/// The provider's address: `base_url`, else the kind's default (Gemini's, Bedrock's
/// region's); none for the demo provider, and for Vertex AI until its region is checked.
fn endpoint(
    loc: &Loc<'_>,
    kind: ProviderKind,
    base_url: Option<String>,
    aws: Option<&crate::config::aws::AwsAccount>,
) -> Result<Option<Endpoint>, ConfigError> {
    let (fidx, sources, id) = (loc.fidx, loc.sources, loc.id);
    let key = |k: &str| loc.key(k);
    Ok(match (kind, base_url) {
        (ProviderKind::Demo, None) => None,
        (ProviderKind::Demo, Some(_)) => {
            return Err(sources.err(fidx, &key("base_url"), "the demo provider has no base_url"))
        }
        (ProviderKind::Gemini, None) => Some(
            parse_base_url(crate::config::kinds::GEMINI_BASE_URL)
                .map_err(|m| sources.err(fidx, &key("base_url"), m))?,
        ),
        (ProviderKind::Bedrock, None) => Some(
            parse_base_url(&crate::config::aws::default_base_url(
                aws.map_or("", |a| a.region.as_str()),
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
    })
}

/// `ca_file`: the trust anchors of an https provider.
fn upstream_ca(
    loc: &Loc<'_>,
    ca_file: Option<String>,
    endpoint: Option<&Endpoint>,
) -> Result<Option<crate::tls::certs::UpstreamCa>, ConfigError> {
    let (fidx, sources) = (loc.fidx, loc.sources);
    let key = |k: &str| loc.key(k);
    Ok(match (ca_file, endpoint) {
        (None, _) => None,
        (Some(_), e) if !e.is_some_and(|e| e.tls) => {
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
                crate::tls::certs::load_ca_file(&base.join(f))
                    .map_err(|e| sources.err(fidx, &key("ca_file"), e.to_string()))?,
            )
        }
    })
}

/// The provider key: `api_key`, or the variable `api_key_env` names (which must be set).
fn provider_key(
    loc: &Loc<'_>,
    api_key: Option<String>,
    api_key_env: Option<String>,
) -> Result<Option<Secret>, ConfigError> {
    let (fidx, sources) = (loc.fidx, loc.sources);
    let key = |k: &str| loc.key(k);
    Ok(match (api_key, api_key_env) {
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
    })
}

/// The hop timeouts (`connect`, `first_byte`, `non_stream_first_byte`, `first_event`,
/// `idle`, `heartbeat`, ms), each over the server's default and greater than 0.
fn hop_timeouts(
    loc: &Loc<'_>,
    defaults: HopTimeouts,
    [connect_timeout_ms, first_byte_timeout_ms, non_stream_first_byte_timeout_ms, first_event_timeout_ms, idle_timeout_ms, heartbeat_interval_ms]: [Option<u64>; 6],
) -> Result<HopTimeouts, ConfigError> {
    let (fidx, sources) = (loc.fidx, loc.sources);
    let key = |k: &str| loc.key(k);
    let timeouts = HopTimeouts {
        connect: connect_timeout_ms.map_or(defaults.connect, ms),
        first_byte: first_byte_timeout_ms.map_or(defaults.first_byte, ms),
        first_byte_non_stream: non_stream_first_byte_timeout_ms
            .map_or(defaults.first_byte_non_stream, ms),
        first_event: first_event_timeout_ms.map_or(defaults.first_event, ms),
        idle: idle_timeout_ms.map_or(defaults.idle, ms),
        heartbeat: heartbeat_interval_ms.map_or(defaults.heartbeat, ms),
    };
    for (name, d) in [
        ("connect_timeout_ms", timeouts.connect),
        ("first_byte_timeout_ms", timeouts.first_byte),
        (
            "non_stream_first_byte_timeout_ms",
            timeouts.first_byte_non_stream,
        ),
        ("first_event_timeout_ms", timeouts.first_event),
        ("idle_timeout_ms", timeouts.idle),
        ("heartbeat_interval_ms", timeouts.heartbeat),
    ] {
        if d.is_zero() {
            return Err(sources.err(fidx, &key(name), "must be greater than 0"));
        }
    }
    Ok(timeouts)
}

/// The active probe: the kind's model list by default; none for the demo provider, and by
/// default none for Bedrock and Vertex AI (no cheap read to probe).
fn active_health(
    kind: ProviderKind,
    api_version: Option<&str>,
    health_check: Option<HealthCheckSection>,
) -> Option<ActiveHealthCheck> {
    // The probe's default path is the kind's model list (Azure's needs its `api-version`).
    let default_path = || crate::config::kinds::health_path(kind, api_version);
    match (kind, health_check) {
        (ProviderKind::Demo, _) => None,
        // The runtime API has no cheap read to probe (no model list): passive health only,
        // unless a probe path is configured (sent signed like any request).
        (ProviderKind::Bedrock, None) => None,
        // Vertex AI has no model list to probe: passive health only, unless a path is set.
        (ProviderKind::Vertex, None) => None,
        (_, Some(h)) if !h.enabled => None,
        (_, Some(h)) => Some(ActiveHealthCheck {
            mode: h.mode,
            path: if h.path == crate::config::schema::default_health_path() {
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
    }
}

/// Passive health thresholds (`health:`), checked; the defaults without one.
fn passive_health(
    loc: &Loc<'_>,
    health: Option<PassiveHealthSection>,
) -> Result<PassiveHealth, ConfigError> {
    let (fidx, sources) = (loc.fidx, loc.sources);
    let key = |k: &str| loc.key(k);
    Ok(match health {
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
) -> Result<Option<crate::config::aws::AwsAccount>, (String, String)> {
    use crate::config::aws::{self as credentials, valid_region, AwsAccount};
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
