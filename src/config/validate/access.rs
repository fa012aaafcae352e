//! Owns the validation of who may call: `tenants:` (lists, per-model limits, budgets),
//! `virtual_keys:` (hashed, each narrowing its tenant's lists) and `redis:`.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::Sources;
use crate::config::error::ConfigError;
use crate::config::keys::{hash_key, Caller, KeyTable};
use crate::config::schema::{RedisSection, TenantSection, VirtualKeySection};
use crate::config::{Model, Provider, Tenant};

/// A located error in the main file: `(key path, message)`.
type MainErr<'a> = &'a dyn Fn(&str, String) -> ConfigError;

/// The models and providers a tenant's or key's lists may name.
pub(super) struct Known<'a> {
    /// Standard models by id.
    pub models: &'a BTreeMap<String, Arc<Model>>,
    /// Providers by id.
    pub providers: &'a BTreeMap<String, Arc<Provider>>,
}

impl Known<'_> {
    /// `allowed_models` and `allowed_providers` at `key` (in file `fidx`) name known ones.
    fn check_lists(
        &self,
        sources: &Sources,
        fidx: usize,
        key: &str,
        models: Option<&Vec<String>>,
        providers: Option<&Vec<String>>,
    ) -> Result<(), ConfigError> {
        let (model_map, provider_map) = (self.models, self.providers);
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
    }
}

/// Every tenant, checked against the known models and providers.
///
/// # Errors
/// The first problem, located in the main file.
pub(super) fn build_tenants(
    tenants: BTreeMap<String, TenantSection>,
    known: &Known<'_>,
    sources: &Sources,
    main_err: MainErr<'_>,
) -> Result<BTreeMap<String, Arc<Tenant>>, ConfigError> {
    let model_map = known.models;
    let check_lists = |fidx: usize, key: &str, m: Option<&Vec<String>>, p: Option<&Vec<String>>| {
        known.check_lists(sources, fidx, key, m, p)
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

    Ok(tenant_map)
}

/// The virtual key table: each key hashed, unique, of a known tenant, its lists narrowing
/// the tenant's.
///
/// # Errors
/// The first problem, located in the key's file.
pub(super) fn build_keys(
    virtual_keys: Vec<VirtualKeySection>,
    tenant_map: &BTreeMap<String, Arc<Tenant>>,
    known: &Known<'_>,
    sources: &Sources,
) -> Result<KeyTable, ConfigError> {
    let check_lists = |fidx: usize, key: &str, m: Option<&Vec<String>>, p: Option<&Vec<String>>| {
        known.check_lists(sources, fidx, key, m, p)
    };
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

    Ok(keys)
}

/// `redis:`: a `redis://` or `rediss://` URL and at least one replica.
///
/// # Errors
/// The first problem, located in the main file.
pub(super) fn check_redis(
    redis: Option<&RedisSection>,
    main_err: MainErr<'_>,
) -> Result<(), ConfigError> {
    if let Some(r) = redis {
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

    Ok(())
}

fn intersect(a: Option<Vec<String>>, b: Option<Vec<String>>) -> Option<Vec<String>> {
    match (a, b) {
        (None, x) | (x, None) => x,
        (Some(a), Some(b)) => Some(a.into_iter().filter(|x| b.contains(x)).collect()),
    }
}
