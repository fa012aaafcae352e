//! Owns the response store's PostgreSQL backend (`ledger.url`): the same tables as
//! [`super::sqlite`] (`BIGINT` and `TEXT` columns) in the ledger's database, shared by every
//! replica; the version table `response_store_schema`, migrated in one transaction under an
//! advisory lock of its own, so replicas starting together migrate once. The driver is
//! async; the store's worker thread is blocking, so a [`PostgresStore`] owns a
//! current-thread runtime that drives its connection (as the ledger's backend does). A
//! connection that broke is re-opened on the next job.

use tokio::runtime::Runtime;
use tokio_postgres::Client;

use super::{Store, StoredItem, StoredResponse};
use crate::billing::ledger::postgres::{connect, migrate_schema, redacted_url};
use crate::billing::ledger::LedgerError;

/// Schema migrations, as in [`super::sqlite`].
const MIGRATIONS: &[&str] = &["CREATE TABLE stored_responses (
        tenant TEXT NOT NULL,
        id TEXT NOT NULL,
        created_ms BIGINT NOT NULL,
        model TEXT NOT NULL,
        previous_response_id TEXT,
        response_json TEXT NOT NULL,
        size_bytes BIGINT NOT NULL,
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
        created_ms BIGINT NOT NULL,
        PRIMARY KEY (tenant, response_id, kind, seq)
    );
    CREATE INDEX stored_response_items_item ON stored_response_items (tenant, item_id, created_ms);"];

/// The schema version this Sluice writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// The chain query of [`super::sqlite::CHAIN_SQL`] (same parameters, same rows), with the
/// items fetched per response by a `LATERAL` subquery (`OFFSET 0` keeps the planner from
/// flattening it into a join): a generic plan of the plain join hashes every item of the
/// tenant (2 ms at 2,000 responses), this one reads each response's items by the primary key.
const CHAIN_SQL: &str = "WITH RECURSIVE chain(id, prev, depth) AS (
        SELECT id, previous_response_id, 0 FROM stored_responses
         WHERE tenant = $1 AND id = $2 AND +created_ms >= $3
        UNION ALL
        SELECT r.id, r.previous_response_id, c.depth + 1 FROM stored_responses r
          JOIN chain c ON r.id = c.prev
         WHERE r.tenant = $1 AND +r.created_ms >= $3 AND c.depth < 1000
    )
    SELECT c.depth, i.item_json FROM chain c
      LEFT JOIN LATERAL (
        SELECT item_json, kind, seq FROM stored_response_items
         WHERE tenant = $1 AND response_id = c.id
        OFFSET 0
      ) i ON TRUE
     ORDER BY c.depth DESC, i.kind, i.seq";

/// A stored Response object by tenant and id, not older than `$3`.
const GET_SQL: &str = "SELECT response_json FROM stored_responses
     WHERE tenant = $1 AND id = $2 AND created_ms >= $3";

/// The newest stored item by tenant and item id, not older than `$3`.
const ITEM_SQL: &str = "SELECT item_json FROM stored_response_items
     WHERE tenant = $1 AND item_id = $2 AND created_ms >= $3
     ORDER BY created_ms DESC, kind DESC LIMIT 1";

/// Advisory lock key held while migrating ("respst" in ASCII; the ledger's is "sluice").
const MIGRATION_LOCK: i64 = 0x7265_7370_7374;

/// The store's tables in a PostgreSQL database.
pub struct PostgresStore {
    rt: Runtime,
    url: String,
    client: Option<Client>,
    /// The lookups' prepared statements on this connection (a lookup is then one round
    /// trip, not a prepare and an execute); emptied when the connection is re-opened.
    prepared: std::collections::HashMap<&'static str, tokio_postgres::Statement>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("url", &redacted_url(&self.url))
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    fn err(&self, source: tokio_postgres::Error) -> LedgerError {
        LedgerError::Postgres {
            url: redacted_url(&self.url),
            source,
        }
    }

    /// Connects and creates or migrates the store's tables.
    ///
    /// # Errors
    /// When it cannot connect, or the schema is newer than this Sluice.
    pub fn connect(url: &str) -> Result<Self, LedgerError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let mut me = Self {
            rt,
            url: url.to_string(),
            client: None,
            prepared: std::collections::HashMap::new(),
        };
        me.migrate()?;
        Ok(me)
    }

    /// Connects if not connected or the connection broke.
    fn ensure(&mut self) -> Result<(), LedgerError> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            let client = connect(
                &self.rt,
                &self.url,
                "sluice::conversation",
                "response store",
            )
            .map_err(|e| self.err(e))?;
            self.client = Some(client);
            self.prepared.clear();
        }
        Ok(())
    }

    /// `sql` prepared on the current connection (once per connection).
    fn statement(&mut self, sql: &'static str) -> Result<tokio_postgres::Statement, LedgerError> {
        self.ensure()?;
        if let Some(st) = self.prepared.get(sql) {
            return Ok(st.clone());
        }
        let st = self.with(|c| Box::pin(async move { c.prepare(sql).await }))?;
        self.prepared.insert(sql, st.clone());
        Ok(st)
    }

    /// Runs `f` on the connection (connecting first if needed); a driver error becomes a
    /// [`LedgerError`].
    fn with<'a, T>(
        &'a mut self,
        f: impl FnOnce(
            &'a mut Client,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<T, tokio_postgres::Error>> + 'a>,
        >,
    ) -> Result<T, LedgerError> {
        let url = redacted_url(&self.url);
        self.ensure()?;
        let Self { rt, client, .. } = self;
        let client = client
            .as_mut()
            .ok_or_else(|| LedgerError::Missing(url.clone()))?;
        rt.block_on(f(client))
            .map_err(|source| LedgerError::Postgres { url, source })
    }

    fn migrate(&mut self) -> Result<(), LedgerError> {
        let at = redacted_url(&self.url);
        let log_at = at.clone();
        let v = self.with(move |c| {
            Box::pin(async move {
                migrate_schema(c, MIGRATION_LOCK, "response_store_schema", MIGRATIONS, |v| {
                    log::info!(target: "sluice::conversation", "response store {log_at}: schema migrated to version {v}");
                })
                .await
            })
        })?;
        match v {
            Ok(_) => Ok(()),
            Err(v) => Err(LedgerError::Schema {
                at,
                message: format!(
                    "response store schema version {v} is newer than this Sluice supports ({SCHEMA_VERSION}); upgrade Sluice"
                ),
            }),
        }
    }
}

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Store for PostgresStore {
    fn put(&mut self, r: &StoredResponse, max_bytes: u64) -> Result<(u64, u64), LedgerError> {
        let max = int(max_bytes);
        self.with(|c| {
            Box::pin(async move {
                let tx = c.transaction().await?;
                tx.execute(
                    "DELETE FROM stored_response_items WHERE tenant = $1 AND response_id = $2",
                    &[&r.tenant, &r.id],
                )
                .await?;
                tx.execute(
                    "INSERT INTO stored_responses
                     (tenant, id, created_ms, model, previous_response_id, response_json, size_bytes)
                     VALUES ($1, $2, $3, $4, $5, $6, $7)
                     ON CONFLICT (tenant, id) DO UPDATE SET created_ms = EXCLUDED.created_ms,
                       model = EXCLUDED.model, previous_response_id = EXCLUDED.previous_response_id,
                       response_json = EXCLUDED.response_json, size_bytes = EXCLUDED.size_bytes",
                    &[
                        &r.tenant,
                        &r.id,
                        &r.created_ms,
                        &r.model,
                        &r.previous_response_id,
                        &r.response,
                        &int(r.size_bytes),
                    ],
                )
                .await?;
                let mut kinds = Vec::new();
                let mut seqs = Vec::new();
                let mut ids = Vec::new();
                let mut jsons = Vec::new();
                for (kind, items) in [(0i32, &r.input), (1, &r.output)] {
                    for (seq, it) in items.iter().enumerate() {
                        kinds.push(kind);
                        seqs.push(i32::try_from(seq).unwrap_or(i32::MAX));
                        ids.push(it.id.as_str());
                        jsons.push(it.json.as_str());
                    }
                }
                // One round trip for every item.
                tx.execute(
                    "INSERT INTO stored_response_items
                     (tenant, response_id, kind, seq, item_id, item_json, created_ms)
                     SELECT $1, $2, k, s, i, j, $3
                       FROM UNNEST($4::INTEGER[], $5::INTEGER[], $6::TEXT[], $7::TEXT[]) AS u(k, s, i, j)",
                    &[&r.tenant, &r.id, &r.created_ms, &kinds, &seqs, &ids, &jsons],
                )
                .await?;
                let mut total: i64 = tx
                    .query_one(
                        "SELECT COALESCE(SUM(size_bytes), 0)::BIGINT FROM stored_responses WHERE tenant = $1",
                        &[&r.tenant],
                    )
                    .await?
                    .get(0);
                let mut evicted = 0u64;
                if total > max {
                    let rows = tx
                        .query(
                            "SELECT id, size_bytes FROM stored_responses WHERE tenant = $1
                             ORDER BY created_ms, id",
                            &[&r.tenant],
                        )
                        .await?;
                    for row in rows {
                        if total <= max {
                            break;
                        }
                        let id: String = row.get(0);
                        let size: i64 = row.get(1);
                        tx.execute(
                            "DELETE FROM stored_response_items WHERE tenant = $1 AND response_id = $2",
                            &[&r.tenant, &id],
                        )
                        .await?;
                        tx.execute(
                            "DELETE FROM stored_responses WHERE tenant = $1 AND id = $2",
                            &[&r.tenant, &id],
                        )
                        .await?;
                        total -= size;
                        evicted += 1;
                    }
                }
                tx.commit().await?;
                Ok((evicted, u64::try_from(total).unwrap_or(0)))
            })
        })
    }

    fn get(
        &mut self,
        tenant: &str,
        id: &str,
        since_ms: i64,
    ) -> Result<Option<String>, LedgerError> {
        let st = self.statement(GET_SQL)?;
        self.with(|c| {
            Box::pin(async move {
                Ok(c.query_opt(&st, &[&tenant, &id, &since_ms])
                    .await?
                    .map(|r| r.get(0)))
            })
        })
    }

    fn chain(
        &mut self,
        tenant: &str,
        id: &str,
        since_ms: i64,
    ) -> Result<Option<Vec<String>>, LedgerError> {
        let st = self.statement(CHAIN_SQL)?;
        self.with(|c| {
            Box::pin(async move {
                let rows = c.query(&st, &[&tenant, &id, &since_ms]).await?;
                if rows.is_empty() {
                    return Ok(None);
                }
                Ok(Some(
                    rows.iter()
                        .filter_map(|r| r.get::<_, Option<String>>(1))
                        .collect(),
                ))
            })
        })
    }

    fn item(
        &mut self,
        tenant: &str,
        item_id: &str,
        since_ms: i64,
    ) -> Result<Option<String>, LedgerError> {
        let st = self.statement(ITEM_SQL)?;
        self.with(|c| {
            Box::pin(async move {
                Ok(c.query_opt(&st, &[&tenant, &item_id, &since_ms])
                    .await?
                    .map(|r| r.get(0)))
            })
        })
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
        self.with(|c| {
            Box::pin(async move {
                let rows = c
                    .query(
                        "SELECT item_id, item_json FROM stored_response_items
                         WHERE tenant = $1 AND response_id = $2 AND kind = 0 ORDER BY seq",
                        &[&tenant, &id],
                    )
                    .await?;
                Ok(Some(
                    rows.iter()
                        .map(|r| StoredItem {
                            id: r.get(0),
                            json: r.get(1),
                        })
                        .collect(),
                ))
            })
        })
    }

    fn delete(&mut self, tenant: &str, id: &str) -> Result<bool, LedgerError> {
        self.with(|c| {
            Box::pin(async move {
                let tx = c.transaction().await?;
                tx.execute(
                    "DELETE FROM stored_response_items WHERE tenant = $1 AND response_id = $2",
                    &[&tenant, &id],
                )
                .await?;
                let n = tx
                    .execute(
                        "DELETE FROM stored_responses WHERE tenant = $1 AND id = $2",
                        &[&tenant, &id],
                    )
                    .await?;
                tx.commit().await?;
                Ok(n > 0)
            })
        })
    }

    fn sweep(&mut self, before_ms: i64) -> Result<u64, LedgerError> {
        self.with(|c| {
            Box::pin(async move {
                let tx = c.transaction().await?;
                tx.execute(
                    "DELETE FROM stored_response_items WHERE created_ms < $1",
                    &[&before_ms],
                )
                .await?;
                let n = tx
                    .execute(
                        "DELETE FROM stored_responses WHERE created_ms < $1",
                        &[&before_ms],
                    )
                    .await?;
                tx.commit().await?;
                Ok(n)
            })
        })
    }

    fn tenant_bytes(&mut self) -> Result<Vec<(String, u64)>, LedgerError> {
        self.with(|c| {
            Box::pin(async move {
                let rows = c
                    .query(
                        "SELECT tenant, SUM(size_bytes)::BIGINT FROM stored_responses
                         GROUP BY tenant ORDER BY tenant",
                        &[],
                    )
                    .await?;
                Ok(rows
                    .iter()
                    .map(|r| (r.get(0), u64::try_from(r.get::<_, i64>(1)).unwrap_or(0)))
                    .collect())
            })
        })
    }
}
