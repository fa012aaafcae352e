//! Owns the response store's SQLite backend: its tables in the ledger's file (WAL mode, set
//! by the ledger or here), the schema version table `response_store_schema` and its
//! migrations, and the queries of [`super::Store`].
//!
//! Schema (version 1): `stored_responses(tenant TEXT, id TEXT, created_ms INTEGER, model
//! TEXT, previous_response_id TEXT NULL, response_json TEXT, size_bytes INTEGER, PRIMARY KEY
//! (tenant, id))`, indexed by `created_ms` and `(tenant, created_ms)`;
//! `stored_response_items(tenant TEXT, response_id TEXT, kind INTEGER (0 input, 1 output),
//! seq INTEGER, item_id TEXT, item_json TEXT, created_ms INTEGER, PRIMARY KEY (tenant,
//! response_id, kind, seq))`, indexed by `(tenant, item_id, created_ms)`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};

use super::{Store, StoredItem, StoredResponse};
use crate::billing::ledger::sqlite::migrate_schema;
use crate::billing::ledger::LedgerError;

/// Schema migrations: entry `i` brings version `i` to `i + 1`. Append, never edit.
pub(crate) const MIGRATIONS: &[&str] = &["CREATE TABLE stored_responses (
        tenant TEXT NOT NULL,
        id TEXT NOT NULL,
        created_ms INTEGER NOT NULL,
        model TEXT NOT NULL,
        previous_response_id TEXT,
        response_json TEXT NOT NULL,
        size_bytes INTEGER NOT NULL,
        PRIMARY KEY (tenant, id)
    );
    CREATE INDEX stored_responses_created ON stored_responses (created_ms);
    CREATE INDEX stored_responses_tenant_created ON stored_responses (tenant, created_ms);
    CREATE TABLE stored_response_items (
        tenant TEXT NOT NULL,
        response_id TEXT NOT NULL,
        kind INTEGER NOT NULL,
        seq INTEGER NOT NULL,
        item_id TEXT NOT NULL,
        item_json TEXT NOT NULL,
        created_ms INTEGER NOT NULL,
        PRIMARY KEY (tenant, response_id, kind, seq)
    );
    CREATE INDEX stored_response_items_item ON stored_response_items (tenant, item_id, created_ms);"];

/// The schema version this Sluice writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// The chain query (`$1` tenant, `$2` id, `$3` oldest `created_ms` returned), shared with
/// [`super::postgres`]: the response and its ancestors with their items, oldest response
/// first, input (kind 0) before output, in order. A response without items still yields a
/// row (NULL item), so an empty chain and an unknown id differ. At most 1000 responses
/// deep: a cycle (only possible if an upstream reused ids) ends there. The unary `+` on
/// `created_ms` keeps SQLite's planner on the primary key for each step (without it SQLite
/// 3.54 walks the tenant's `(tenant, created_ms)` index, a scan of all its responses per
/// step: 2.2 ms instead of some 30 µs at 2,000 responses); PostgreSQL reads it as a no-op.
pub(crate) const CHAIN_SQL: &str = "WITH RECURSIVE chain(id, prev, depth) AS (
        SELECT id, previous_response_id, 0 FROM stored_responses
         WHERE tenant = $1 AND id = $2 AND +created_ms >= $3
        UNION ALL
        SELECT r.id, r.previous_response_id, c.depth + 1 FROM stored_responses r
          JOIN chain c ON r.id = c.prev
         WHERE r.tenant = $1 AND +r.created_ms >= $3 AND c.depth < 1000
    )
    SELECT c.depth, i.item_json FROM chain c
      LEFT JOIN stored_response_items i ON i.tenant = $1 AND i.response_id = c.id
     ORDER BY c.depth DESC, i.kind, i.seq";

/// How long a statement waits for another connection's lock (the ledger's writer).
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The store's tables in an open SQLite file.
#[derive(Debug)]
pub struct SqliteStore {
    conn: Connection,
    path: PathBuf,
}

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl SqliteStore {
    fn err(&self, source: rusqlite::Error) -> LedgerError {
        LedgerError::Sqlite {
            path: self.path.display().to_string(),
            source,
        }
    }

    /// Opens (creating it if needed) the file at `path` and creates or migrates the
    /// store's tables.
    ///
    /// # Errors
    /// When the file cannot be opened, or the store's schema is newer than this Sluice.
    pub fn open(path: &Path) -> Result<Self, LedgerError> {
        let conn = Connection::open(path).map_err(|source| LedgerError::Sqlite {
            path: path.display().to_string(),
            source,
        })?;
        let mut me = Self {
            conn,
            path: path.to_path_buf(),
        };
        me.conn.busy_timeout(BUSY_TIMEOUT).map_err(|e| me.err(e))?;
        me.conn
            .pragma_update(None, "journal_mode", "WAL")
            .map_err(|e| me.err(e))?;
        me.conn
            .pragma_update(None, "synchronous", "NORMAL")
            .map_err(|e| me.err(e))?;
        me.migrate()?;
        Ok(me)
    }

    fn migrate(&mut self) -> Result<(), LedgerError> {
        let path = self.path.display().to_string();
        let wrap = |source| LedgerError::Sqlite {
            path: path.clone(),
            source,
        };
        let migrated = migrate_schema(&mut self.conn, "response_store_schema", MIGRATIONS, |v| {
            log::info!(target: "sluice::conversation", "response store {path}: schema migrated to version {v}");
        })
        .map_err(wrap)?;
        migrated.map_err(|v| LedgerError::Schema {
            at: path.clone(),
            message: format!(
                "response store schema version {v} is newer than this Sluice supports ({SCHEMA_VERSION}); upgrade Sluice"
            ),
        })
    }

    /// The connection (tests and the benchmark read the file through it).
    pub fn connection(&self) -> &Connection {
        &self.conn
    }
}

impl Store for SqliteStore {
    fn put(&mut self, r: &StoredResponse, max_bytes: u64) -> Result<(u64, u64), LedgerError> {
        let path = self.path.display().to_string();
        let wrap = |source| LedgerError::Sqlite {
            path: path.clone(),
            source,
        };
        let tx = self.conn.transaction().map_err(wrap)?;
        tx.execute(
            "DELETE FROM stored_response_items WHERE tenant = ?1 AND response_id = ?2",
            params![r.tenant, r.id],
        )
        .map_err(wrap)?;
        tx.execute(
            "INSERT OR REPLACE INTO stored_responses
             (tenant, id, created_ms, model, previous_response_id, response_json, size_bytes)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                r.tenant,
                r.id,
                r.created_ms,
                r.model,
                r.previous_response_id,
                r.response,
                int(r.size_bytes)
            ],
        )
        .map_err(wrap)?;
        {
            let mut stmt = tx
                .prepare_cached(
                    "INSERT INTO stored_response_items
                     (tenant, response_id, kind, seq, item_id, item_json, created_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )
                .map_err(wrap)?;
            for (kind, items) in [(0i64, &r.input), (1, &r.output)] {
                for (seq, it) in items.iter().enumerate() {
                    stmt.execute(params![
                        r.tenant,
                        r.id,
                        kind,
                        i64::try_from(seq).unwrap_or(i64::MAX),
                        it.id,
                        it.json,
                        r.created_ms
                    ])
                    .map_err(wrap)?;
                }
            }
        }
        // Over the tenant's budget: its oldest go first.
        let mut total: i64 = tx
            .query_row(
                "SELECT COALESCE(SUM(size_bytes), 0) FROM stored_responses WHERE tenant = ?1",
                [&r.tenant],
                |row| row.get(0),
            )
            .map_err(wrap)?;
        let mut evicted = 0u64;
        let max = int(max_bytes);
        if total > max {
            let oldest: Vec<(String, i64)> = {
                let mut stmt = tx
                    .prepare(
                        "SELECT id, size_bytes FROM stored_responses WHERE tenant = ?1
                         ORDER BY created_ms, rowid",
                    )
                    .map_err(wrap)?;
                let rows = stmt
                    .query_map([&r.tenant], |row| Ok((row.get(0)?, row.get(1)?)))
                    .map_err(wrap)?;
                rows.collect::<Result<_, _>>().map_err(wrap)?
            };
            for (id, size) in oldest {
                if total <= max {
                    break;
                }
                delete_in(&tx, &r.tenant, &id).map_err(wrap)?;
                total -= size;
                evicted += 1;
            }
        }
        tx.commit().map_err(wrap)?;
        Ok((evicted, u64::try_from(total).unwrap_or(0)))
    }

    fn get(
        &mut self,
        tenant: &str,
        id: &str,
        since_ms: i64,
    ) -> Result<Option<String>, LedgerError> {
        self.conn
            .prepare_cached(
                "SELECT response_json FROM stored_responses
                 WHERE tenant = ?1 AND id = ?2 AND created_ms >= ?3",
            )
            .and_then(|mut s| {
                s.query_row(params![tenant, id, since_ms], |r| r.get(0))
                    .optional()
            })
            .map_err(|e| self.err(e))
    }

    fn chain(
        &mut self,
        tenant: &str,
        id: &str,
        since_ms: i64,
    ) -> Result<Option<Vec<String>>, LedgerError> {
        let sql = CHAIN_SQL.replace('$', "?");
        let rows: Vec<Option<String>> = self
            .conn
            .prepare_cached(&sql)
            .and_then(|mut s| {
                s.query_map(params![tenant, id, since_ms], |r| r.get(1))?
                    .collect()
            })
            .map_err(|e| self.err(e))?;
        if rows.is_empty() {
            return Ok(None);
        }
        Ok(Some(rows.into_iter().flatten().collect()))
    }

    fn item(
        &mut self,
        tenant: &str,
        item_id: &str,
        since_ms: i64,
    ) -> Result<Option<String>, LedgerError> {
        self.conn
            .prepare_cached(
                "SELECT item_json FROM stored_response_items
                 WHERE tenant = ?1 AND item_id = ?2 AND created_ms >= ?3
                 ORDER BY created_ms DESC, kind DESC LIMIT 1",
            )
            .and_then(|mut s| {
                s.query_row(params![tenant, item_id, since_ms], |r| r.get(0))
                    .optional()
            })
            .map_err(|e| self.err(e))
    }

    fn input_items(
        &mut self,
        tenant: &str,
        id: &str,
        since_ms: i64,
    ) -> Result<Option<Vec<StoredItem>>, LedgerError> {
        if self.get(tenant, id, since_ms)?.is_none() {
            return Ok(None);
        }
        self.conn
            .prepare_cached(
                "SELECT item_id, item_json FROM stored_response_items
                 WHERE tenant = ?1 AND response_id = ?2 AND kind = 0 ORDER BY seq",
            )
            .and_then(|mut s| {
                s.query_map(params![tenant, id], |r| {
                    Ok(StoredItem {
                        id: r.get(0)?,
                        json: r.get(1)?,
                    })
                })?
                .collect()
            })
            .map(Some)
            .map_err(|e| self.err(e))
    }

    fn delete(&mut self, tenant: &str, id: &str) -> Result<bool, LedgerError> {
        let path = self.path.display().to_string();
        let wrap = |source| LedgerError::Sqlite {
            path: path.clone(),
            source,
        };
        let tx = self.conn.transaction().map_err(wrap)?;
        let n = delete_in(&tx, tenant, id).map_err(wrap)?;
        tx.commit().map_err(wrap)?;
        Ok(n > 0)
    }

    fn sweep(&mut self, before_ms: i64) -> Result<u64, LedgerError> {
        let path = self.path.display().to_string();
        let wrap = |source| LedgerError::Sqlite {
            path: path.clone(),
            source,
        };
        let tx = self.conn.transaction().map_err(wrap)?;
        tx.execute(
            "DELETE FROM stored_response_items WHERE created_ms < ?1",
            [before_ms],
        )
        .map_err(wrap)?;
        let n = tx
            .execute(
                "DELETE FROM stored_responses WHERE created_ms < ?1",
                [before_ms],
            )
            .map_err(wrap)?;
        tx.commit().map_err(wrap)?;
        Ok(n as u64)
    }

    fn tenant_bytes(&mut self) -> Result<Vec<(String, u64)>, LedgerError> {
        self.conn
            .prepare_cached(
                "SELECT tenant, SUM(size_bytes) FROM stored_responses GROUP BY tenant ORDER BY tenant",
            )
            .and_then(|mut s| {
                s.query_map([], |r| {
                    Ok((r.get(0)?, u64::try_from(r.get::<_, i64>(1)?).unwrap_or(0)))
                })?
                .collect()
            })
            .map_err(|e| self.err(e))
    }
}

/// Deletes one response and its items inside `tx`; rows of the response deleted.
fn delete_in(tx: &rusqlite::Transaction<'_>, tenant: &str, id: &str) -> rusqlite::Result<usize> {
    tx.execute(
        "DELETE FROM stored_response_items WHERE tenant = ?1 AND response_id = ?2",
        params![tenant, id],
    )?;
    tx.execute(
        "DELETE FROM stored_responses WHERE tenant = ?1 AND id = ?2",
        params![tenant, id],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "sluice-store-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&d).unwrap();
        d.join("usage.db")
    }

    fn resp(tenant: &str, id: &str, prev: Option<&str>, at: i64) -> StoredResponse {
        let item = |n: &str| StoredItem {
            id: format!("{id}_{n}"),
            json: format!(r#"{{"id":"{id}_{n}"}}"#),
        };
        StoredResponse {
            id: id.into(),
            tenant: tenant.into(),
            created_ms: at,
            model: "m".into(),
            previous_response_id: prev.map(str::to_string),
            input: vec![item("in")],
            output: vec![item("out")],
            response: format!(r#"{{"id":"{id}"}}"#),
            size_bytes: 100,
        }
    }

    #[test]
    fn chains_items_tenants_retention_and_delete() {
        let path = temp();
        let mut s = SqliteStore::open(&path).unwrap();
        s.put(&resp("t", "r1", None, 10), 1000).unwrap();
        s.put(&resp("t", "r2", Some("r1"), 20), 1000).unwrap();
        s.put(&resp("u", "r3", Some("r2"), 30), 1000).unwrap();
        let chain = s.chain("t", "r2", 0).unwrap().unwrap();
        assert_eq!(
            chain,
            [
                r#"{"id":"r1_in"}"#,
                r#"{"id":"r1_out"}"#,
                r#"{"id":"r2_in"}"#,
                r#"{"id":"r2_out"}"#
            ]
        );
        // Another tenant's ancestor is not followed, and its ids are unknown.
        assert_eq!(s.chain("u", "r3", 0).unwrap().unwrap().len(), 2);
        assert!(s.chain("u", "r2", 0).unwrap().is_none());
        assert!(s.get("u", "r1", 0).unwrap().is_none());
        assert!(s.item("u", "r1_out", 0).unwrap().is_none());
        assert_eq!(
            s.item("t", "r1_out", 0).unwrap().as_deref(),
            Some(r#"{"id":"r1_out"}"#)
        );
        // Expired by age: not returned, then swept.
        assert!(s.get("t", "r1", 15).unwrap().is_none());
        assert_eq!(s.sweep(15).unwrap(), 1);
        // Over the byte budget: the oldest goes.
        let (evicted, bytes) = s.put(&resp("t", "r4", None, 40), 200).unwrap();
        assert_eq!((evicted, bytes), (0, 200));
        let (evicted, bytes) = s.put(&resp("t", "r5", None, 50), 200).unwrap();
        assert_eq!((evicted, bytes), (1, 200));
        assert!(s.get("t", "r2", 0).unwrap().is_none());
        assert!(s.delete("t", "r4").unwrap());
        assert!(!s.delete("t", "r4").unwrap());
        let left: i64 = s
            .conn
            .query_row(
                "SELECT COUNT(*) FROM stored_response_items WHERE response_id = 'r4'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(left, 0);
        assert_eq!(
            s.tenant_bytes().unwrap(),
            [("t".into(), 100), ("u".into(), 100)]
        );
        drop(s);
        // Reopening migrates nothing; a newer schema is refused.
        let s = SqliteStore::open(&path).unwrap();
        s.conn
            .execute("UPDATE response_store_schema SET version = 9", [])
            .unwrap();
        drop(s);
        assert!(SqliteStore::open(&path)
            .unwrap_err()
            .to_string()
            .contains("newer"));
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }
}
#[cfg(test)]
mod plan {
    /// Each step of the chain is a primary-key lookup, never a walk of the tenant's index.
    #[test]
    fn the_chain_follows_the_primary_key() {
        let c = rusqlite::Connection::open_in_memory().unwrap();
        c.execute_batch(super::MIGRATIONS[0]).unwrap();
        let sql = format!("EXPLAIN QUERY PLAN {}", super::CHAIN_SQL.replace('$', "?"));
        let mut st = c.prepare(&sql).unwrap();
        let rows: Vec<String> = st
            .query_map(rusqlite::params!["t", "x", 0i64], |r| r.get::<_, String>(3))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert!(
            rows.iter().any(|r| r.starts_with(
                "SEARCH r USING INDEX sqlite_autoindex_stored_responses_1 (tenant=? AND id=?)"
            )),
            "{rows:#?}"
        );
        assert!(!rows.iter().any(|r| r.contains("created_ms")), "{rows:#?}");
    }
}
