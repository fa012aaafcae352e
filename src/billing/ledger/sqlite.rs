//! Owns the SQLite backend (rusqlite, SQLite bundled): one file in WAL mode
//! (`synchronous=NORMAL`: a committed batch survives a killed process), the schema and its
//! migrations, batch inserts and the queries of [`super::query`].
//!
//! Schema (version 2; `ledger_schema(version)` holds the version, one row):
//! `usage_records(id INTEGER PRIMARY KEY, time_ms INTEGER, request_id TEXT, tenant TEXT,
//! virtual_key TEXT, model TEXT, provider TEXT NULL, upstream_model TEXT NULL,
//! input_tokens, output_tokens, cached_input_tokens, cache_write_tokens, reasoning_tokens
//! INTEGER, estimated INTEGER (0/1), cost_usd REAL, charge_usd REAL, status INTEGER,
//! outcome TEXT, ttft_ms INTEGER NULL, duration_ms, fallback_depth, attempts INTEGER,
//! ingress TEXT, resumptions INTEGER)`, indexed by `time_ms` and by `(tenant, time_ms)`.
//! `time_ms` is unix ms (UTC) of the request's arrival. Version 2 added `resumptions` (issue
//! 32) in place: a version-1 ledger keeps its rows, which read 0.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{params_from_iter, Connection, OpenFlags};

use super::rows::{Filter, Param, Sink, SummaryRow, COLUMNS, SUMMARY_COLUMNS};
use super::{LedgerError, UsageRecord};

/// Schema migrations: entry `i` brings the schema from version `i` to `i + 1`. Append, never
/// edit: a ledger on disk is at some version, and each later step must run on it.
const MIGRATIONS: &[&str] = &[
    "CREATE TABLE usage_records (
        id INTEGER PRIMARY KEY,
        time_ms INTEGER NOT NULL,
        request_id TEXT NOT NULL,
        tenant TEXT NOT NULL,
        virtual_key TEXT NOT NULL,
        model TEXT NOT NULL,
        provider TEXT,
        upstream_model TEXT,
        input_tokens INTEGER NOT NULL,
        output_tokens INTEGER NOT NULL,
        cached_input_tokens INTEGER NOT NULL,
        cache_write_tokens INTEGER NOT NULL,
        reasoning_tokens INTEGER NOT NULL,
        estimated INTEGER NOT NULL,
        cost_usd REAL NOT NULL,
        charge_usd REAL NOT NULL,
        status INTEGER NOT NULL,
        outcome TEXT NOT NULL,
        ttft_ms INTEGER,
        duration_ms INTEGER NOT NULL,
        fallback_depth INTEGER NOT NULL,
        attempts INTEGER NOT NULL,
        ingress TEXT NOT NULL
    );
    CREATE INDEX usage_records_time ON usage_records (time_ms);
    CREATE INDEX usage_records_tenant_time ON usage_records (tenant, time_ms);",
    // 1 → 2: resumable streams (issue 32). `NOT NULL DEFAULT 0`: the rows already there
    // were never resumed.
    "ALTER TABLE usage_records ADD COLUMN resumptions INTEGER NOT NULL DEFAULT 0;",
];

/// The schema version this Sluice writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// How long a statement waits for another connection's lock (a reader never blocks the
/// writer in WAL mode, but a second writer would).
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// An open SQLite ledger.
#[derive(Debug)]
pub struct SqliteLedger {
    conn: Connection,
    path: PathBuf,
}

/// `u64` → SQLite integer (counts beyond `i64::MAX` are clamped).
fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// SQLite integer → `u64` (negative → 0).
fn uint(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// Creates or migrates a versioned schema on `conn` in one `BEGIN IMMEDIATE` transaction
/// (two processes starting on one file migrate one after the other): the table `table`
/// holds the version (one row; created when missing), and each of `migrations` past it runs
/// in order, reported to `migrated` with the version it reached. Shared by the ledger and
/// the response store ([`crate::conversation`]).
///
/// # Errors
/// SQLite's; `Ok(Err(v))` (nothing changed) when the file's version `v` is newer than
/// `migrations`.
pub(crate) fn migrate_schema(
    conn: &mut Connection,
    table: &str,
    migrations: &[&str],
    mut migrated: impl FnMut(usize),
) -> rusqlite::Result<Result<(), i64>> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    tx.execute_batch(&format!(
        "CREATE TABLE IF NOT EXISTS {table} (version INTEGER NOT NULL)"
    ))?;
    let v: i64 = tx.query_row(
        &format!("SELECT COALESCE(MAX(version), 0) FROM {table}"),
        [],
        |r| r.get(0),
    )?;
    if usize::try_from(v).map_or(true, |v| v > migrations.len()) {
        return Ok(Err(v));
    }
    for (i, sql) in migrations
        .iter()
        .enumerate()
        .skip(usize::try_from(v).unwrap_or(0))
    {
        tx.execute_batch(sql)?;
        tx.execute(&format!("DELETE FROM {table}"), [])?;
        tx.execute(
            &format!("INSERT INTO {table} (version) VALUES (?1)"),
            [i64::try_from(i + 1).unwrap_or(i64::MAX)],
        )?;
        migrated(i + 1);
    }
    tx.commit()?;
    Ok(Ok(()))
}

impl SqliteLedger {
    fn err(&self, source: rusqlite::Error) -> LedgerError {
        LedgerError::Sqlite {
            path: self.path.display().to_string(),
            source,
        }
    }

    /// Opens (creating it if needed) the ledger at `path` for writing: WAL mode, schema
    /// created or migrated to [`SCHEMA_VERSION`].
    ///
    /// # Errors
    /// When the file cannot be opened or created, or its schema is newer than this Sluice.
    pub fn open(path: &Path) -> Result<Self, LedgerError> {
        let wrap = |source| LedgerError::Sqlite {
            path: path.display().to_string(),
            source,
        };
        let conn = Connection::open(path).map_err(wrap)?;
        let mut me = Self {
            conn,
            path: path.to_path_buf(),
        };
        me.conn.busy_timeout(BUSY_TIMEOUT).map_err(wrap)?;
        me.conn
            .pragma_update(None, "journal_mode", "WAL")
            .map_err(wrap)?;
        me.conn
            .pragma_update(None, "synchronous", "NORMAL")
            .map_err(wrap)?;
        me.migrate()?;
        Ok(me)
    }

    /// Opens an existing ledger for reading (`sluice usage`, `GET /admin/usage`); never
    /// creates one.
    ///
    /// # Errors
    /// [`LedgerError::Missing`] when there is no file; a schema newer than this Sluice.
    pub fn open_existing(path: &Path) -> Result<Self, LedgerError> {
        if !path.exists() {
            return Err(LedgerError::Missing(path.display().to_string()));
        }
        let wrap = |source| LedgerError::Sqlite {
            path: path.display().to_string(),
            source,
        };
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(wrap)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(wrap)?;
        let me = Self {
            conn,
            path: path.to_path_buf(),
        };
        let v = me.version()?;
        if v > SCHEMA_VERSION {
            return Err(me.newer(v));
        }
        if v < SCHEMA_VERSION {
            return Err(LedgerError::Schema {
                at: path.display().to_string(),
                message: format!(
                    "schema version {v}: start this Sluice once to migrate it to {SCHEMA_VERSION}"
                ),
            });
        }
        Ok(me)
    }

    fn newer(&self, v: i64) -> LedgerError {
        LedgerError::Schema {
            at: self.path.display().to_string(),
            message: format!(
                "schema version {v} is newer than this Sluice supports ({SCHEMA_VERSION}); upgrade Sluice"
            ),
        }
    }

    /// The stored schema version (0: no schema yet).
    fn version(&self) -> Result<i64, LedgerError> {
        let has: bool = self
            .conn
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'ledger_schema')",
                [],
                |r| r.get(0),
            )
            .map_err(|e| self.err(e))?;
        if !has {
            return Ok(0);
        }
        self.conn
            .query_row(
                "SELECT COALESCE(MAX(version), 0) FROM ledger_schema",
                [],
                |r| r.get(0),
            )
            .map_err(|e| self.err(e))
    }

    /// Applies the missing migrations, each in its own transaction with its version bump.
    fn migrate(&mut self) -> Result<(), LedgerError> {
        let path = self.path.display().to_string();
        let wrap = |source| LedgerError::Sqlite {
            path: path.clone(),
            source,
        };
        let migrated = migrate_schema(&mut self.conn, "ledger_schema", MIGRATIONS, |v| {
            log::info!(target: "sluice::ledger::sqlite", "usage ledger {path}: schema migrated to version {v}");
        })
        .map_err(wrap)?;
        migrated.map_err(|v| self.newer(v))
    }

    /// The records `filter` selects, oldest first (with a limit: the newest ones).
    ///
    /// # Errors
    /// SQLite's.
    pub fn records(&self, filter: &Filter) -> Result<Vec<UsageRecord>, LedgerError> {
        let (w, params) = filter.where_clause(|n| format!("?{n}"));
        let sql = filter.records_sql(&w);
        let mut stmt = self.conn.prepare(&sql).map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map(params_from_iter(params.iter().map(to_sql)), |r| {
                Ok(UsageRecord {
                    time: r.get(0)?,
                    request_id: r.get(1)?,
                    tenant: r.get(2)?,
                    virtual_key: r.get(3)?,
                    model: r.get(4)?,
                    provider: r.get(5)?,
                    upstream_model: r.get(6)?,
                    input_tokens: uint(r.get(7)?),
                    output_tokens: uint(r.get(8)?),
                    cached_input_tokens: uint(r.get(9)?),
                    cache_write_tokens: uint(r.get(10)?),
                    reasoning_tokens: uint(r.get(11)?),
                    estimated: r.get::<_, i64>(12)? != 0,
                    cost_usd: r.get(13)?,
                    charge_usd: r.get(14)?,
                    status: u16::try_from(r.get::<_, i64>(15)?).unwrap_or(0),
                    outcome: r.get(16)?,
                    ttft_ms: r.get::<_, Option<i64>>(17)?.map(uint),
                    duration_ms: uint(r.get(18)?),
                    fallback_depth: u32::try_from(r.get::<_, i64>(19)?).unwrap_or(0),
                    attempts: u32::try_from(r.get::<_, i64>(20)?).unwrap_or(0),
                    ingress: r.get(21)?,
                    resumptions: u32::try_from(r.get::<_, i64>(22)?).unwrap_or(0),
                })
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(|e| self.err(e))
    }

    /// Sums per tenant × model over the records `filter` selects, ordered by tenant, model.
    ///
    /// # Errors
    /// SQLite's.
    pub fn summary(&self, filter: &Filter) -> Result<Vec<SummaryRow>, LedgerError> {
        let (w, params) = filter.where_clause(|n| format!("?{n}"));
        let sql = format!(
            "SELECT {SUMMARY_COLUMNS} FROM usage_records{w} GROUP BY tenant, model ORDER BY tenant, model"
        );
        let mut stmt = self.conn.prepare(&sql).map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map(params_from_iter(params.iter().map(to_sql)), |r| {
                Ok(SummaryRow {
                    tenant: r.get(0)?,
                    model: r.get(1)?,
                    requests: uint(r.get(2)?),
                    input_tokens: uint(r.get(3)?),
                    output_tokens: uint(r.get(4)?),
                    cached_input_tokens: uint(r.get(5)?),
                    cache_write_tokens: uint(r.get(6)?),
                    reasoning_tokens: uint(r.get(7)?),
                    estimated_requests: uint(r.get(8)?),
                    cost_usd: r.get(9)?,
                    charge_usd: r.get(10)?,
                    resumptions: uint(r.get(11)?),
                })
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(|e| self.err(e))
    }
}

fn to_sql(p: &Param) -> rusqlite::types::Value {
    match p {
        Param::Int(i) => rusqlite::types::Value::Integer(*i),
        Param::Text(s) => rusqlite::types::Value::Text(s.clone()),
    }
}

impl Sink for SqliteLedger {
    fn write_batch(&mut self, batch: &[UsageRecord]) -> Result<(), LedgerError> {
        let path = self.path.display().to_string();
        let wrap = |source| LedgerError::Sqlite {
            path: path.clone(),
            source,
        };
        let tx = self.conn.transaction().map_err(wrap)?;
        {
            let mut stmt = tx
                .prepare_cached(&format!(
                    "INSERT INTO usage_records ({COLUMNS}) VALUES \
                     (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23)"
                ))
                .map_err(wrap)?;
            for r in batch {
                stmt.execute(rusqlite::params![
                    r.time,
                    r.request_id,
                    r.tenant,
                    r.virtual_key,
                    r.model,
                    r.provider,
                    r.upstream_model,
                    int(r.input_tokens),
                    int(r.output_tokens),
                    int(r.cached_input_tokens),
                    int(r.cache_write_tokens),
                    int(r.reasoning_tokens),
                    i64::from(r.estimated),
                    r.cost_usd,
                    r.charge_usd,
                    i64::from(r.status),
                    r.outcome,
                    r.ttft_ms.map(int),
                    int(r.duration_ms),
                    i64::from(r.fallback_depth),
                    i64::from(r.attempts),
                    r.ingress,
                    i64::from(r.resumptions),
                ])
                .map_err(wrap)?;
            }
        }
        tx.commit().map_err(wrap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::billing::ledger::writer::tests::rec;

    fn temp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "sluice-ledger-{tag}-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&d).unwrap();
        d.join("usage.db")
    }

    #[test]
    fn writes_in_wal_mode_and_reads_back_with_filters_and_sums() {
        let path = temp("rw");
        let mut w = SqliteLedger::open(&path).unwrap();
        let mode: String = w
            .conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        let mut a = rec(0);
        a.ttft_ms = None;
        a.provider = None;
        let mut b = rec(1000);
        b.tenant = "u".into();
        b.estimated = true;
        b.charge_usd = 0.25;
        b.resumptions = 2;
        let mut c = rec(2000);
        c.input_tokens = 1 << 40;
        c.resumptions = 3;
        w.write_batch(&[a.clone(), b.clone(), c.clone()]).unwrap();

        let r = SqliteLedger::open_existing(&path).unwrap();
        let all = r.records(&Filter::default()).unwrap();
        assert_eq!(all, vec![a.clone(), b.clone(), c.clone()]);
        let since = Filter {
            since: Some(b.time),
            ..Filter::default()
        };
        assert_eq!(r.records(&since).unwrap(), vec![b.clone(), c.clone()]);
        let window = Filter {
            since: Some(a.time),
            until: Some(c.time),
            tenant: Some("t".into()),
            ..Filter::default()
        };
        assert_eq!(r.records(&window).unwrap(), vec![a.clone()]);
        let limited = Filter {
            limit: Some(1),
            ..Filter::default()
        };
        // The newest record, not the oldest.
        assert_eq!(r.records(&limited).unwrap(), vec![c.clone()]);
        let two = Filter {
            limit: Some(2),
            ..Filter::default()
        };
        assert_eq!(r.records(&two).unwrap(), vec![b.clone(), c.clone()]);
        let model = Filter {
            model: Some("other".into()),
            ..Filter::default()
        };
        assert!(r.records(&model).unwrap().is_empty());

        let sums = r.summary(&Filter::default()).unwrap();
        assert_eq!(sums.len(), 2);
        assert_eq!((sums[0].tenant.as_str(), sums[0].requests), ("t", 2));
        assert_eq!((sums[1].tenant.as_str(), sums[1].requests), ("u", 1));
        assert_eq!(sums[1].estimated_requests, 1);
        assert!((sums[1].charge_usd - 0.25).abs() < 1e-12);
        assert_eq!(sums[1].output_tokens, 2);
        // Resumptions add up per group: t has a (0) and c (3), u has b (2).
        assert_eq!((sums[0].resumptions, sums[1].resumptions), (3, 2));
        let t_only = Filter {
            tenant: Some("t".into()),
            until: Some(c.time),
            ..Filter::default()
        };
        assert_eq!(r.summary(&t_only).unwrap()[0].resumptions, 0);
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn a_cancelled_hedge_row_adds_to_the_sums_but_not_to_the_request_counts() {
        let path = temp("hedge");
        let mut w = SqliteLedger::open(&path).unwrap();
        let mut answer = rec(0);
        answer.cost_usd = 0.5;
        answer.charge_usd = 0.75;
        answer.attempts = 2;
        // The cancelled attempt of the same request: estimated input, Sluice's cost only.
        let mut loser = rec(0);
        loser.provider = Some("p1".into());
        loser.input_tokens = 9;
        loser.output_tokens = 0;
        loser.estimated = true;
        loser.cost_usd = 0.25;
        loser.status = 0;
        loser.outcome = crate::billing::ledger::HEDGE_CANCELLED.into();
        loser.ttft_ms = None;
        // Another request, estimated.
        let mut other = rec(1);
        other.estimated = true;
        w.write_batch(&[answer.clone(), loser.clone(), other.clone()])
            .unwrap();
        let r = SqliteLedger::open_existing(&path).unwrap();
        assert_eq!(
            r.records(&Filter::default()).unwrap(),
            vec![answer, loser, other],
            "both rows of one request_id are kept"
        );
        let sums = r.summary(&Filter::default()).unwrap();
        assert_eq!(sums.len(), 1);
        let s = &sums[0];
        assert_eq!((s.requests, s.estimated_requests), (2, 1));
        assert_eq!(s.input_tokens, 1 + 9 + 1);
        assert!((s.cost_usd - 0.75).abs() < 1e-12, "{}", s.cost_usd);
        assert!((s.charge_usd - 0.75).abs() < 1e-12, "{}", s.charge_usd);
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn a_version_1_ledger_is_migrated_in_place_and_its_rows_read_zero_resumptions() {
        let path = temp("v1");
        // A ledger written before `resumptions` existed, with one row.
        let mut conn = Connection::open(&path).unwrap();
        migrate_schema(&mut conn, "ledger_schema", &MIGRATIONS[..1], |_| {})
            .unwrap()
            .unwrap();
        let old = rec(0);
        let v1_columns = COLUMNS.replace(", resumptions", "");
        conn.execute(
            &format!(
                "INSERT INTO usage_records ({v1_columns}) VALUES \
                 (?1, ?2, ?3, ?4, ?5, ?6, ?7, 1, 2, 0, 0, 0, 0, 0.0, 0.0, 200, 'ok', 3, 4, 0, 1, 'chat')"
            ),
            rusqlite::params![
                old.time,
                old.request_id,
                old.tenant,
                old.virtual_key,
                old.model,
                old.provider,
                old.upstream_model
            ],
        )
        .unwrap();
        drop(conn);
        // A reader refuses it until a Sluice start migrates it.
        let e = SqliteLedger::open_existing(&path).unwrap_err().to_string();
        assert!(
            e.contains("schema version 1: start this Sluice once"),
            "{e}"
        );

        let mut w = SqliteLedger::open(&path).unwrap();
        assert_eq!(w.version().unwrap(), 2);
        let mut resumed = rec(1);
        resumed.resumptions = 3;
        w.write_batch(std::slice::from_ref(&resumed)).unwrap();
        let r = SqliteLedger::open_existing(&path).unwrap();
        assert_eq!(r.records(&Filter::default()).unwrap(), vec![old, resumed]);
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn the_schema_is_versioned_created_once_and_a_newer_one_is_refused() {
        let path = temp("schema");
        let w = SqliteLedger::open(&path).unwrap();
        assert_eq!(w.version().unwrap(), SCHEMA_VERSION);
        drop(w);
        // A second start finds the schema and migrates nothing.
        let w = SqliteLedger::open(&path).unwrap();
        let rows: i64 = w
            .conn
            .query_row("SELECT COUNT(*) FROM ledger_schema", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 1);
        w.conn
            .execute("UPDATE ledger_schema SET version = 99", [])
            .unwrap();
        drop(w);
        let e = SqliteLedger::open(&path).unwrap_err().to_string();
        assert!(e.contains("schema version 99 is newer"), "{e}");
        let e = SqliteLedger::open_existing(&path).unwrap_err().to_string();
        assert!(e.contains("newer"), "{e}");
        let missing = path.with_file_name("none.db");
        assert!(matches!(
            SqliteLedger::open_existing(&missing),
            Err(LedgerError::Missing(_))
        ));
        assert!(!missing.exists(), "reading never creates a ledger");
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }
}
