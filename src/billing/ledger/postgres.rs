//! Owns the PostgreSQL backend (`ledger.url`; tokio-postgres): one ledger shared by several
//! replicas. Same schema as [`super::sqlite`] (`BIGINT`, `DOUBLE PRECISION`, `BOOLEAN`
//! columns; version 2 added `resumptions INTEGER` in place), the same version table; migrations run in one transaction under an advisory
//! lock, so replicas starting together migrate once. A batch is one `INSERT ... SELECT FROM
//! UNNEST(...)` (one round trip whatever its size).
//!
//! The driver is async; the ledger's writer thread and the readers are blocking, so each
//! [`PostgresLedger`] owns a current-thread Tokio runtime that drives its connection. A
//! connection that broke is re-opened on the next batch. Connections are plain TCP (or a
//! Unix socket): `sslmode=require` is refused by the config check (TLS to PostgreSQL is not
//! built in; use a private network or a local TLS tunnel).

use std::time::Duration;

use tokio::runtime::Runtime;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls};

use super::rows::{Filter, Param, Sink, SummaryRow, COLUMNS, SUMMARY_COLUMNS};
use super::{LedgerError, UsageRecord};

/// Schema migrations, as in [`super::sqlite`]: entry `i` brings version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    "CREATE TABLE usage_records (
        id BIGSERIAL PRIMARY KEY,
        time_ms BIGINT NOT NULL,
        request_id TEXT NOT NULL,
        tenant TEXT NOT NULL,
        virtual_key TEXT NOT NULL,
        model TEXT NOT NULL,
        provider TEXT,
        upstream_model TEXT,
        input_tokens BIGINT NOT NULL,
        output_tokens BIGINT NOT NULL,
        cached_input_tokens BIGINT NOT NULL,
        cache_write_tokens BIGINT NOT NULL,
        reasoning_tokens BIGINT NOT NULL,
        estimated BOOLEAN NOT NULL,
        cost_usd DOUBLE PRECISION NOT NULL,
        charge_usd DOUBLE PRECISION NOT NULL,
        status INTEGER NOT NULL,
        outcome TEXT NOT NULL,
        ttft_ms BIGINT,
        duration_ms BIGINT NOT NULL,
        fallback_depth INTEGER NOT NULL,
        attempts INTEGER NOT NULL,
        ingress TEXT NOT NULL
    );
    CREATE INDEX usage_records_time ON usage_records (time_ms);
    CREATE INDEX usage_records_tenant_time ON usage_records (tenant, time_ms);",
    // 1 → 2: resumable streams (issue 32); the rows already there were never resumed.
    // PostgreSQL 11+ adds a column with a constant default without rewriting the table.
    "ALTER TABLE usage_records ADD COLUMN resumptions INTEGER NOT NULL DEFAULT 0;",
];

/// The schema version this Sluice writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Advisory lock key held while migrating (any fixed number; "sluice" in ASCII).
const MIGRATION_LOCK: i64 = 0x736c_7569_6365;

/// Connect timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// `url` with its password replaced by `***` (for logs and errors).
pub fn redacted_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "postgres://***".into();
    };
    let (authority, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            let pw = if userinfo.contains(':') { ":***" } else { "" };
            let tail = tail.split('?').next().unwrap_or("");
            format!("{scheme}://{user}{pw}@{host}{tail}")
        }
        None => format!(
            "{scheme}://{authority}{}",
            tail.split('?').next().unwrap_or("")
        ),
    }
}

pub use crate::config::ledger::check_url;

/// A connection to a PostgreSQL ledger.
pub struct PostgresLedger {
    rt: Runtime,
    url: String,
    client: Option<Client>,
}

/// Connects to `url` (connect timeout [`CONNECT_TIMEOUT`], `application_name` `sluice`) and
/// drives the connection on `rt`; when it ends, a warning on `log_target` names `what` and
/// the URL without its password. Shared by the ledger and the response store
/// ([`crate::conversation`]).
///
/// # Errors
/// A URL PostgreSQL cannot parse, or the connection's failure.
pub(crate) fn connect(
    rt: &Runtime,
    url: &str,
    log_target: &'static str,
    what: &'static str,
) -> Result<Client, tokio_postgres::Error> {
    let mut cfg: tokio_postgres::Config = url.parse()?;
    cfg.connect_timeout(CONNECT_TIMEOUT);
    cfg.application_name("sluice");
    let (client, conn) = rt.block_on(cfg.connect(NoTls))?;
    let url = redacted_url(url);
    rt.spawn(async move {
        if let Err(e) = conn.await {
            log::warn!(target: log_target, "{what} {url}: connection closed: {e}");
        }
    });
    Ok(client)
}

/// Creates or migrates a versioned schema through `client` in one transaction that holds the
/// advisory lock `lock` (replicas starting together migrate one after the other): the table
/// `table` holds the version (one row; created when missing), and each of `migrations` past
/// it runs in order, reported to `migrated` with the version it reached. Shared by the
/// ledger and the response store ([`crate::conversation`]).
///
/// # Errors
/// PostgreSQL's; `Ok(Err(v))` (nothing changed) when the database's version `v` is newer
/// than `migrations`.
pub(crate) async fn migrate_schema(
    client: &mut Client,
    lock: i64,
    table: &str,
    migrations: &[&str],
    mut migrated: impl FnMut(usize),
) -> Result<Result<(), i64>, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&lock])
        .await?;
    tx.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {table} (version BIGINT NOT NULL)"
    ))
    .await?;
    let v: i64 = tx
        .query_one(
            &format!("SELECT COALESCE(MAX(version), 0)::BIGINT FROM {table}"),
            &[],
        )
        .await?
        .get(0);
    if usize::try_from(v).map_or(true, |v| v > migrations.len()) {
        return Ok(Err(v));
    }
    for (i, sql) in migrations
        .iter()
        .enumerate()
        .skip(usize::try_from(v).unwrap_or(0))
    {
        tx.batch_execute(sql).await?;
        tx.execute(&format!("DELETE FROM {table}"), &[]).await?;
        let next = i64::try_from(i + 1).unwrap_or(i64::MAX);
        tx.execute(
            &format!("INSERT INTO {table} (version) VALUES ($1)"),
            &[&next],
        )
        .await?;
        migrated(i + 1);
    }
    tx.commit().await?;
    Ok(Ok(()))
}

impl std::fmt::Debug for PostgresLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresLedger")
            .field("url", &redacted_url(&self.url))
            .finish_non_exhaustive()
    }
}

impl PostgresLedger {
    fn err(&self, source: tokio_postgres::Error) -> LedgerError {
        LedgerError::Postgres {
            url: redacted_url(&self.url),
            source,
        }
    }

    fn new(url: &str) -> Result<Self, LedgerError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        Ok(Self {
            rt,
            url: url.to_string(),
            client: None,
        })
    }

    /// Connects if not connected or the connection broke.
    fn ensure(&mut self) -> Result<(), LedgerError> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            let client = connect(
                &self.rt,
                &self.url,
                "sluice::ledger::postgres",
                "usage ledger",
            )
            .map_err(|e| self.err(e))?;
            self.client = Some(client);
        }
        Ok(())
    }

    /// The runtime and a connected client.
    fn parts(&mut self) -> Result<(&Runtime, &Client), LedgerError> {
        self.ensure()?;
        match &self.client {
            Some(c) => Ok((&self.rt, c)),
            None => Err(LedgerError::Missing(redacted_url(&self.url))),
        }
    }

    /// Connects for writing and creates or migrates the schema.
    ///
    /// # Errors
    /// When it cannot connect, or the schema is newer than this Sluice.
    pub fn connect(url: &str) -> Result<Self, LedgerError> {
        let mut me = Self::new(url)?;
        me.migrate()?;
        Ok(me)
    }

    /// Connects for reading; the schema must exist at this version.
    ///
    /// # Errors
    /// When it cannot connect or the schema is missing or of another version.
    pub fn connect_existing(url: &str) -> Result<Self, LedgerError> {
        let mut me = Self::new(url)?;
        let at = redacted_url(url);
        let v = {
            let (rt, client) = me.parts()?;
            let fut = async {
                let has: bool = client
                    .query_one("SELECT to_regclass('ledger_schema') IS NOT NULL", &[])
                    .await?
                    .get(0);
                if !has {
                    return Ok(0i64);
                }
                Ok(client
                    .query_one(
                        "SELECT COALESCE(MAX(version), 0)::BIGINT FROM ledger_schema",
                        &[],
                    )
                    .await?
                    .get(0))
            };
            rt.block_on(fut)
        }
        .map_err(|e| me.err(e))?;
        if v == 0 {
            return Err(LedgerError::Missing(at));
        }
        if v != SCHEMA_VERSION {
            return Err(LedgerError::Schema {
                at,
                message: format!("schema version {v}, this Sluice reads {SCHEMA_VERSION}"),
            });
        }
        Ok(me)
    }

    fn migrate(&mut self) -> Result<(), LedgerError> {
        let at = redacted_url(&self.url);
        self.ensure()?;
        let Some(client) = self.client.as_mut() else {
            return Err(LedgerError::Missing(at));
        };
        let result: Result<Result<(), i64>, tokio_postgres::Error> = self.rt.block_on(async {
            migrate_schema(client, MIGRATION_LOCK, "ledger_schema", MIGRATIONS, |v| {
                log::info!(target: "sluice::ledger::postgres", "usage ledger {at}: schema migrated to version {v}");
            })
            .await
        });
        match result.map_err(|e| self.err(e))? {
            Ok(_) => Ok(()),
            Err(v) => Err(LedgerError::Schema {
                at: redacted_url(&self.url),
                message: format!(
                    "schema version {v} is newer than this Sluice supports ({SCHEMA_VERSION}); upgrade Sluice"
                ),
            }),
        }
    }

    fn params(params: &[Param]) -> Vec<Box<dyn ToSql + Sync + Send>> {
        params
            .iter()
            .map(|p| -> Box<dyn ToSql + Sync + Send> {
                match p {
                    Param::Int(i) => Box::new(*i),
                    Param::Text(s) => Box::new(s.clone()),
                }
            })
            .collect()
    }

    /// The records `filter` selects, oldest first (with a limit: the newest ones).
    ///
    /// # Errors
    /// The driver's.
    pub fn records(&mut self, filter: &Filter) -> Result<Vec<UsageRecord>, LedgerError> {
        let (w, params) = filter.where_clause(|n| format!("${n}"));
        let sql = filter.records_sql(&w);
        let boxed = Self::params(&params);
        let refs: Vec<&(dyn ToSql + Sync)> =
            boxed.iter().map(|b| &**b as &(dyn ToSql + Sync)).collect();
        let (rt, client) = self.parts()?;
        let rows = rt.block_on(client.query(&sql, &refs));
        let rows = rows.map_err(|e| self.err(e))?;
        let u = |v: i64| u64::try_from(v).unwrap_or(0);
        rows.iter()
            .map(|r| {
                Ok(UsageRecord {
                    time: r.try_get(0)?,
                    request_id: r.try_get(1)?,
                    tenant: r.try_get(2)?,
                    virtual_key: r.try_get(3)?,
                    model: r.try_get(4)?,
                    provider: r.try_get(5)?,
                    upstream_model: r.try_get(6)?,
                    input_tokens: u(r.try_get(7)?),
                    output_tokens: u(r.try_get(8)?),
                    cached_input_tokens: u(r.try_get(9)?),
                    cache_write_tokens: u(r.try_get(10)?),
                    reasoning_tokens: u(r.try_get(11)?),
                    estimated: r.try_get(12)?,
                    cost_usd: r.try_get(13)?,
                    charge_usd: r.try_get(14)?,
                    status: u16::try_from(r.try_get::<_, i32>(15)?).unwrap_or(0),
                    outcome: r.try_get(16)?,
                    ttft_ms: r.try_get::<_, Option<i64>>(17)?.map(u),
                    duration_ms: u(r.try_get(18)?),
                    fallback_depth: u32::try_from(r.try_get::<_, i32>(19)?).unwrap_or(0),
                    attempts: u32::try_from(r.try_get::<_, i32>(20)?).unwrap_or(0),
                    ingress: r.try_get(21)?,
                    resumptions: u32::try_from(r.try_get::<_, i32>(22)?).unwrap_or(0),
                })
            })
            .collect::<Result<Vec<_>, tokio_postgres::Error>>()
            .map_err(|e| self.err(e))
    }

    /// Sums per tenant × model over the records `filter` selects.
    ///
    /// # Errors
    /// The driver's.
    pub fn summary(&mut self, filter: &Filter) -> Result<Vec<SummaryRow>, LedgerError> {
        let (w, params) = filter.where_clause(|n| format!("${n}"));
        let sql = format!(
            "SELECT {SUMMARY_COLUMNS} FROM usage_records{w} GROUP BY tenant, model ORDER BY tenant, model"
        );
        let boxed = Self::params(&params);
        let refs: Vec<&(dyn ToSql + Sync)> =
            boxed.iter().map(|b| &**b as &(dyn ToSql + Sync)).collect();
        let (rt, client) = self.parts()?;
        let rows = rt.block_on(client.query(&sql, &refs));
        let rows = rows.map_err(|e| self.err(e))?;
        let u = |v: i64| u64::try_from(v).unwrap_or(0);
        rows.iter()
            .map(|r| {
                Ok(SummaryRow {
                    tenant: r.try_get(0)?,
                    model: r.try_get(1)?,
                    requests: u(r.try_get(2)?),
                    input_tokens: u(r.try_get(3)?),
                    output_tokens: u(r.try_get(4)?),
                    cached_input_tokens: u(r.try_get(5)?),
                    cache_write_tokens: u(r.try_get(6)?),
                    reasoning_tokens: u(r.try_get(7)?),
                    estimated_requests: u(r.try_get(8)?),
                    cost_usd: r.try_get(9)?,
                    charge_usd: r.try_get(10)?,
                    resumptions: u(r.try_get(11)?),
                })
            })
            .collect::<Result<Vec<_>, tokio_postgres::Error>>()
            .map_err(|e| self.err(e))
    }
}

/// `u64` → `BIGINT` (clamped).
fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Sink for PostgresLedger {
    fn write_batch(&mut self, batch: &[UsageRecord]) -> Result<(), LedgerError> {
        let col = |f: fn(&UsageRecord) -> i64| batch.iter().map(f).collect::<Vec<i64>>();
        let text = |f: fn(&UsageRecord) -> &str| {
            batch
                .iter()
                .map(|r| f(r).to_string())
                .collect::<Vec<String>>()
        };
        let time = col(|r| r.time);
        let request_id = text(|r| &r.request_id);
        let tenant = text(|r| &r.tenant);
        let virtual_key = text(|r| &r.virtual_key);
        let model = text(|r| &r.model);
        let provider: Vec<Option<String>> = batch.iter().map(|r| r.provider.clone()).collect();
        let upstream: Vec<Option<String>> =
            batch.iter().map(|r| r.upstream_model.clone()).collect();
        let input = col(|r| int(r.input_tokens));
        let output = col(|r| int(r.output_tokens));
        let cached = col(|r| int(r.cached_input_tokens));
        let cache_write = col(|r| int(r.cache_write_tokens));
        let reasoning = col(|r| int(r.reasoning_tokens));
        let estimated: Vec<bool> = batch.iter().map(|r| r.estimated).collect();
        let cost: Vec<f64> = batch.iter().map(|r| r.cost_usd).collect();
        let charge: Vec<f64> = batch.iter().map(|r| r.charge_usd).collect();
        let status: Vec<i32> = batch.iter().map(|r| i32::from(r.status)).collect();
        let outcome = text(|r| &r.outcome);
        let ttft: Vec<Option<i64>> = batch.iter().map(|r| r.ttft_ms.map(int)).collect();
        let duration = col(|r| int(r.duration_ms));
        let depth: Vec<i32> = batch
            .iter()
            .map(|r| i32::try_from(r.fallback_depth).unwrap_or(i32::MAX))
            .collect();
        let attempts: Vec<i32> = batch
            .iter()
            .map(|r| i32::try_from(r.attempts).unwrap_or(i32::MAX))
            .collect();
        let ingress = text(|r| &r.ingress);
        let resumptions: Vec<i32> = batch
            .iter()
            .map(|r| i32::try_from(r.resumptions).unwrap_or(i32::MAX))
            .collect();
        let sql = format!(
            "INSERT INTO usage_records ({COLUMNS}) SELECT * FROM UNNEST(\
             $1::BIGINT[], $2::TEXT[], $3::TEXT[], $4::TEXT[], $5::TEXT[], $6::TEXT[], $7::TEXT[], \
             $8::BIGINT[], $9::BIGINT[], $10::BIGINT[], $11::BIGINT[], $12::BIGINT[], \
             $13::BOOLEAN[], $14::DOUBLE PRECISION[], $15::DOUBLE PRECISION[], $16::INTEGER[], \
             $17::TEXT[], $18::BIGINT[], $19::BIGINT[], $20::INTEGER[], $21::INTEGER[], $22::TEXT[], \
             $23::INTEGER[])"
        );
        let params: [&(dyn ToSql + Sync); 23] = [
            &time,
            &request_id,
            &tenant,
            &virtual_key,
            &model,
            &provider,
            &upstream,
            &input,
            &output,
            &cached,
            &cache_write,
            &reasoning,
            &estimated,
            &cost,
            &charge,
            &status,
            &outcome,
            &ttft,
            &duration,
            &depth,
            &attempts,
            &ingress,
            &resumptions,
        ];
        let (rt, client) = self.parts()?;
        let res = rt.block_on(client.execute(&sql, &params));
        match res {
            Ok(_) => Ok(()),
            Err(e) => {
                // Re-open on the next batch if the connection is what failed.
                if self.client.as_ref().is_some_and(Client::is_closed) {
                    self.client = None;
                }
                Err(self.err(e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn urls_are_checked_and_printed_without_their_password() {
        assert_eq!(
            super::redacted_url("postgres://u:secret@db:5432/usage?sslmode=disable"),
            "postgres://u:***@db:5432/usage"
        );
        assert_eq!(
            super::redacted_url("postgres://db/usage"),
            "postgres://db/usage"
        );
        assert!(super::check_url("postgres://u@127.0.0.1:5432/db").is_ok());
        assert!(super::check_url("mysql://x").is_err());
        assert!(super::check_url("postgres://u@h/db?sslmode=require")
            .unwrap_err()
            .contains("sslmode=require"));
    }
}
