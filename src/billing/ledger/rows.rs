//! Owns the shapes both ledger backends share: the record filter and its SQL clauses, the
//! summary row, the column lists, and the [`Sink`] a backend implements for the writer
//! thread. A leaf of the ledger, so the backends, the writer and the queries all read it
//! without reading each other.

use serde::Serialize;

use super::{LedgerError, UsageRecord};

/// Which records to read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Records at or after this time, unix ms.
    pub since: Option<i64>,
    /// Records before this time, unix ms.
    pub until: Option<i64>,
    /// Only this tenant.
    pub tenant: Option<String>,
    /// Only this standard model.
    pub model: Option<String>,
    /// At most this many records: the newest ones, returned oldest first; `None`: all. Not
    /// applied to summaries.
    pub limit: Option<u64>,
}

/// One group of `--summary`: the sums over one tenant × standard model.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct SummaryRow {
    /// Tenant id.
    pub tenant: String,
    /// Standard model.
    pub model: String,
    /// Number of requests: records other than [`HEDGE_CANCELLED`](super::HEDGE_CANCELLED)
    /// rows (a cancelled hedge is an attempt of a request that has its own record) and
    /// [`COUNT_TOKENS`](super::COUNT_TOKENS) rows (a token count generates nothing).
    pub requests: u64,
    /// Sum of `input_tokens` (cancelled hedges' estimates included).
    pub input_tokens: u64,
    /// Sum of `output_tokens`.
    pub output_tokens: u64,
    /// Sum of `cached_input_tokens`.
    pub cached_input_tokens: u64,
    /// Sum of `cache_write_tokens`.
    pub cache_write_tokens: u64,
    /// Sum of `reasoning_tokens`.
    pub reasoning_tokens: u64,
    /// Requests whose counts are estimated (cancelled hedges' rows, always estimated, left
    /// out as in `requests`).
    pub estimated_requests: u64,
    /// Sum of `cost_usd` (cancelled hedges' estimated cost included).
    pub cost_usd: f64,
    /// Sum of `charge_usd`.
    pub charge_usd: f64,
    /// Sum of `resumptions`: how many times clients reattached to this group's resumable
    /// streams (`GET /v1/streams/{id}`). Absent in JSON written before the sum existed:
    /// read as 0.
    #[serde(default)]
    pub resumptions: u64,
}

/// The record columns, in the order of [`UsageRecord`]'s fields (`time` is stored as
/// `time_ms`, unix ms). Shared by both backends.
pub const COLUMNS: &str = "time_ms, request_id, tenant, virtual_key, model, provider, \
    upstream_model, input_tokens, output_tokens, cached_input_tokens, cache_write_tokens, \
    reasoning_tokens, estimated, cost_usd, charge_usd, status, outcome, ttft_ms, duration_ms, \
    fallback_depth, attempts, ingress, resumptions";

/// The summary's select list, shared by both backends (sums cast to BIGINT: PostgreSQL's
/// `SUM(bigint)` is `numeric`). Requests are counted without the
/// [`HEDGE_CANCELLED`](super::HEDGE_CANCELLED) and [`COUNT_TOKENS`](super::COUNT_TOKENS) rows (not by distinct `request_id`: a client
/// may reuse its `x-request-id`); the sums take every row.
pub const SUMMARY_COLUMNS: &str = "tenant, model, \
    CAST(SUM(CASE WHEN outcome IN ('hedge_cancelled', 'count_tokens') THEN 0 ELSE 1 END) AS BIGINT), \
    CAST(SUM(input_tokens) AS BIGINT), CAST(SUM(output_tokens) AS BIGINT), \
    CAST(SUM(cached_input_tokens) AS BIGINT), CAST(SUM(cache_write_tokens) AS BIGINT), \
    CAST(SUM(reasoning_tokens) AS BIGINT), \
    CAST(SUM(CASE WHEN estimated AND outcome NOT IN ('hedge_cancelled', 'count_tokens') THEN 1 ELSE 0 END) AS BIGINT), \
    SUM(cost_usd), SUM(charge_usd), CAST(SUM(resumptions) AS BIGINT)";

/// A bound parameter of a filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Param {
    /// A time, unix ms.
    Int(i64),
    /// A tenant or model.
    Text(String),
}

impl Filter {
    /// ` WHERE ...` (or nothing) and its parameters; `placeholder(n)` spells the n-th
    /// (1-based) parameter (`?1` for SQLite, `$1` for PostgreSQL).
    pub fn where_clause(&self, placeholder: fn(usize) -> String) -> (String, Vec<Param>) {
        let mut parts = Vec::new();
        let mut params = Vec::new();
        let mut add = |cond: &str, p: Param| {
            params.push(p);
            parts.push(format!("{cond} {}", placeholder(params.len())));
        };
        if let Some(s) = self.since {
            add("time_ms >=", Param::Int(s));
        }
        if let Some(u) = self.until {
            add("time_ms <", Param::Int(u));
        }
        if let Some(t) = &self.tenant {
            add("tenant =", Param::Text(t.clone()));
        }
        if let Some(m) = &self.model {
            add("model =", Param::Text(m.clone()));
        }
        if parts.is_empty() {
            (String::new(), params)
        } else {
            (format!(" WHERE {}", parts.join(" AND ")), params)
        }
    }

    /// Refuses a filter that can match nothing by construction: `since` at or after `until`.
    ///
    /// # Errors
    /// The message saying so.
    pub fn check(&self) -> Result<(), String> {
        match (self.since, self.until) {
            (Some(s), Some(u)) if s >= u => Err(format!(
                "--since ({}) is not before --until ({}): no record can match",
                super::rfc3339_ms::format(s),
                super::rfc3339_ms::format(u)
            )),
            _ => Ok(()),
        }
    }

    /// The records query of both backends: the `where` clause `w` (from
    /// [`Filter::where_clause`]), oldest first; with a limit the newest `n` records, still
    /// oldest first.
    pub fn records_sql(&self, w: &str) -> String {
        match self.limit {
            None => format!("SELECT {COLUMNS} FROM usage_records{w} ORDER BY time_ms, id"),
            Some(n) => format!(
                "SELECT {COLUMNS} FROM (SELECT * FROM usage_records{w} \
                 ORDER BY time_ms DESC, id DESC LIMIT {n}) AS newest ORDER BY time_ms, id"
            ),
        }
    }
}

/// A backend the writer thread owns.
pub trait Sink: Send {
    /// Writes `batch` in one transaction (all or nothing).
    ///
    /// # Errors
    /// The backend's; the caller keeps the batch and retries.
    fn write_batch(&mut self, batch: &[UsageRecord]) -> Result<(), LedgerError>;
}
