//! Owns the validation of the `ledger:` section, which `sluice usage` also reads alone
//! ([`load_ledger`]: no provider key needs to be in the environment for it).

use std::path::Path;

use super::{ms, parse, read};
use crate::config::error::ConfigError;
use crate::secret::Secret;

/// `ledger:` → [`crate::config::ledger::LedgerSettings`] (`None`: the defaults); `err(key, message)`
/// locates a problem in the main file.
pub(super) fn ledger_settings(
    section: Option<crate::config::schema::LedgerSection>,
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<crate::config::ledger::LedgerSettings, ConfigError> {
    use crate::config::ledger::{Backend, LedgerSettings};
    let defaults = LedgerSettings::default();
    let Some(crate::config::schema::LedgerSection {
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
            crate::config::ledger::check_url(&u).map_err(|m| err("ledger.url", m))?;
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

/// Reads only the `ledger:` section of `path` (see [`crate::config::Config::load_ledger`]).
pub(in crate::config) fn load_ledger(
    path: &Path,
) -> Result<crate::config::ledger::LedgerSettings, ConfigError> {
    let text = read(path)?;
    let only: crate::config::schema::LedgerOnly = parse(path, &text)?;
    ledger_settings(only.ledger, &|key, msg| {
        ConfigError::at(path, Some(&text), key, msg)
    })
}
