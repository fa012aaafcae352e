//! Owns the validation of the `response_store:` section.

use crate::config::error::ConfigError;
use crate::config::response_store::ResponseStoreSettings;
use crate::config::schema::ResponseStoreSection;

/// `response_store:` → [`ResponseStoreSettings`] (`None`: the defaults); `err(key, message)`
/// locates a problem in the main file. `enabled` defaults to `ledger_enabled`: with
/// `ledger.enabled: false` no database is opened unless the store is asked for by name.
pub(super) fn response_store_settings(
    section: Option<ResponseStoreSection>,
    ledger_enabled: bool,
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<ResponseStoreSettings, ConfigError> {
    let d = ResponseStoreSettings {
        enabled: ledger_enabled,
        ..ResponseStoreSettings::default()
    };
    let Some(ResponseStoreSection {
        enabled,
        max_age_secs,
        max_bytes_per_tenant,
        sweep_interval_secs,
        queue_capacity,
    }) = section
    else {
        return Ok(d);
    };
    let positive = |key: &str, v: Option<u64>| -> Result<Option<u64>, ConfigError> {
        match v {
            Some(0) => Err(err(key, "must be greater than 0".into())),
            v => Ok(v),
        }
    };
    let max_age = positive("response_store.max_age_secs", max_age_secs)?
        .map_or(d.max_age, std::time::Duration::from_secs);
    let max_bytes_per_tenant =
        positive("response_store.max_bytes_per_tenant", max_bytes_per_tenant)?
            .unwrap_or(d.max_bytes_per_tenant);
    let sweep_interval = positive("response_store.sweep_interval_secs", sweep_interval_secs)?
        .map_or(d.sweep_interval, std::time::Duration::from_secs);
    let queue_capacity = match queue_capacity {
        Some(0) => {
            return Err(err(
                "response_store.queue_capacity",
                "must be at least 1".into(),
            ))
        }
        Some(v) => v,
        None => d.queue_capacity,
    };
    Ok(ResponseStoreSettings {
        enabled: enabled.unwrap_or(ledger_enabled),
        max_age,
        max_bytes_per_tenant,
        sweep_interval,
        queue_capacity,
    })
}
