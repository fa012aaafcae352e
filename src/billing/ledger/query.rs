//! Owns reading the ledger: the filter both `sluice usage` and `GET /admin/usage` take, the
//! per tenant × model summary, the output formats, and the admin endpoint's request handling.
//!
//! The summary ([`SummaryRow`], fields [`SUMMARY_FIELDS`] in every format): `tenant`,
//! `model`, `requests`, the sums of each token class, `estimated_requests`, `cost_usd`,
//! `charge_usd`, and `resumptions` (the sum of the records' `resumptions`: how many times
//! clients reattached to the group's resumable streams).
//!
//! Filters: `since` (inclusive) and `until` (exclusive) are a date `YYYY-MM-DD` (UTC midnight)
//! or an RFC 3339 timestamp (`2026-12-01T10:00:00Z`, any offset); `tenant` and `model` match
//! exactly. Records come oldest first.
//!
//! Formats:
//! - `json`: one array of [`UsageRecord`]s with the field names of the record (`time` as
//!   RFC 3339 UTC), or of [`SummaryRow`]s with `--summary`;
//! - `csv`: a header line with the same field names, then one line per record or row
//!   (RFC 4180 quoting);
//! - `table`: aligned columns for a terminal (the most used fields; json and csv have all).

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

pub use super::rows::{Filter, Param, SummaryRow, COLUMNS, SUMMARY_COLUMNS};
use super::{Backend, LedgerError, LedgerSettings, UsageRecord};

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// Aligned columns for a terminal.
    #[default]
    Table,
    /// One JSON array.
    Json,
    /// Comma-separated values with a header line.
    Csv,
}

/// Parses a `--since`/`--until` value: `YYYY-MM-DD` (UTC midnight) or an RFC 3339 timestamp;
/// unix ms.
///
/// # Errors
/// A message naming the accepted forms.
pub fn parse_date(s: &str) -> Result<i64, String> {
    let s = s.trim();
    if let Ok(d) = s.parse::<jiff::civil::Date>() {
        if !s.contains('T') && !s.contains(' ') {
            return jiff::tz::Offset::UTC
                .to_timestamp(d.at(0, 0, 0, 0))
                .map(jiff::Timestamp::as_millisecond)
                .map_err(|e| format!("`{s}`: {e}"));
        }
    }
    s.parse::<jiff::Timestamp>()
        .map(jiff::Timestamp::as_millisecond)
        .map_err(|_| {
            format!(
                "`{s}` is not a date (YYYY-MM-DD, UTC) or an RFC 3339 time (2026-12-01T10:00:00Z)"
            )
        })
}

/// Reads the records `filter` selects from the ledger of `settings` (opening it without
/// creating it; blocking).
///
/// # Errors
/// When the ledger is missing or cannot be read.
pub fn records(
    settings: &LedgerSettings,
    filter: &Filter,
) -> Result<Vec<UsageRecord>, LedgerError> {
    match &settings.backend {
        Backend::Sqlite { path } => {
            super::sqlite::SqliteLedger::open_existing(path)?.records(filter)
        }
        Backend::Postgres { url } => {
            super::postgres::PostgresLedger::connect_existing(url.expose())?.records(filter)
        }
    }
}

/// The per tenant × model sums over the records `filter` selects (blocking).
///
/// # Errors
/// As [`records`].
pub fn summary(settings: &LedgerSettings, filter: &Filter) -> Result<Vec<SummaryRow>, LedgerError> {
    match &settings.backend {
        Backend::Sqlite { path } => {
            super::sqlite::SqliteLedger::open_existing(path)?.summary(filter)
        }
        Backend::Postgres { url } => {
            super::postgres::PostgresLedger::connect_existing(url.expose())?.summary(filter)
        }
    }
}

/// One CSV field, quoted when it holds a comma, quote, CR or LF (RFC 4180).
fn csv_field(out: &mut String, v: &str) {
    if v.contains([',', '"', '\n', '\r']) {
        out.push('"');
        out.push_str(&v.replace('"', "\"\""));
        out.push('"');
    } else {
        out.push_str(v);
    }
}

fn csv_line(out: &mut String, fields: &[String]) {
    for (i, f) in fields.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        csv_field(out, f);
    }
    out.push('\n');
}

/// The CSV cells of `row` for the fields `header` names: strings as they are, `null` empty,
/// numbers and booleans as JSON prints them.
fn cells(row: &serde_json::Value, header: &[&str]) -> Vec<String> {
    header
        .iter()
        .map(|k| match row.get(*k) {
            Some(serde_json::Value::String(s)) => s.clone(),
            None | Some(serde_json::Value::Null) => String::new(),
            Some(other) => other.to_string(),
        })
        .collect()
}

/// `rows` as CSV: a header line with the field names, one line per row.
fn to_csv<T: Serialize>(rows: &[T], header: &[&str]) -> String {
    let mut out = String::new();
    csv_line(
        &mut out,
        &header.iter().map(|s| (*s).to_string()).collect::<Vec<_>>(),
    );
    for r in rows {
        let v = serde_json::to_value(r).unwrap_or_default();
        csv_line(&mut out, &cells(&v, header));
    }
    out
}

/// The field names of [`UsageRecord`], in order.
pub const RECORD_FIELDS: [&str; 23] = [
    "time",
    "request_id",
    "tenant",
    "virtual_key",
    "model",
    "provider",
    "upstream_model",
    "input_tokens",
    "output_tokens",
    "cached_input_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "estimated",
    "cost_usd",
    "charge_usd",
    "status",
    "outcome",
    "ttft_ms",
    "duration_ms",
    "fallback_depth",
    "attempts",
    "ingress",
    "resumptions",
];

/// The field names of [`SummaryRow`], in order.
pub const SUMMARY_FIELDS: [&str; 12] = [
    "tenant",
    "model",
    "requests",
    "input_tokens",
    "output_tokens",
    "cached_input_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "estimated_requests",
    "cost_usd",
    "charge_usd",
    "resumptions",
];

/// Aligned text columns: a header, a rule, the rows.
fn to_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut l = String::new();
        for (i, c) in cells.enumerate() {
            if i > 0 {
                l.push_str("  ");
            }
            let _ = write!(l, "{c:<w$}", w = widths.get(i).copied().unwrap_or(0));
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    line(&mut rule.iter().map(String::as_str));
    for r in rows {
        line(&mut r.iter().map(String::as_str));
    }
    out
}

/// Formats records.
pub fn format_records(records: &[UsageRecord], format: Format) -> String {
    match format {
        Format::Json => {
            serde_json::to_string_pretty(records).unwrap_or_else(|_| "[]".into()) + "\n"
        }
        Format::Csv => to_csv(records, &RECORD_FIELDS),
        Format::Table => {
            let header = [
                "time",
                "request_id",
                "tenant",
                "virtual_key",
                "model",
                "provider",
                "status",
                "outcome",
                "input",
                "output",
                "est",
                "charge_usd",
                "ttft_ms",
                "duration_ms",
                "resumed",
            ];
            let rows: Vec<Vec<String>> = records
                .iter()
                .map(|r| {
                    vec![
                        super::rfc3339_ms::format(r.time),
                        r.request_id.clone(),
                        r.tenant.clone(),
                        r.virtual_key.clone(),
                        r.model.clone(),
                        r.provider.clone().unwrap_or_else(|| "-".into()),
                        r.status.to_string(),
                        r.outcome.clone(),
                        r.input_tokens.to_string(),
                        r.output_tokens.to_string(),
                        if r.estimated { "yes" } else { "no" }.into(),
                        format!("{:.6}", r.charge_usd),
                        r.ttft_ms.map_or_else(|| "-".into(), |t| t.to_string()),
                        r.duration_ms.to_string(),
                        r.resumptions.to_string(),
                    ]
                })
                .collect();
            to_table(&header, &rows)
        }
    }
}

/// Formats summary rows.
pub fn format_summary(rows: &[SummaryRow], format: Format) -> String {
    match format {
        Format::Json => serde_json::to_string_pretty(rows).unwrap_or_else(|_| "[]".into()) + "\n",
        Format::Csv => to_csv(rows, &SUMMARY_FIELDS),
        Format::Table => {
            let cells: Vec<Vec<String>> = rows
                .iter()
                .map(|r| {
                    vec![
                        r.tenant.clone(),
                        r.model.clone(),
                        r.requests.to_string(),
                        r.input_tokens.to_string(),
                        r.output_tokens.to_string(),
                        r.cached_input_tokens.to_string(),
                        r.cache_write_tokens.to_string(),
                        r.reasoning_tokens.to_string(),
                        r.estimated_requests.to_string(),
                        format!("{:.6}", r.cost_usd),
                        format!("{:.6}", r.charge_usd),
                        r.resumptions.to_string(),
                    ]
                })
                .collect();
            to_table(&SUMMARY_FIELDS, &cells)
        }
    }
}

/// Most records `GET /admin/usage` returns at once (and its default `limit`).
pub const ADMIN_MAX_RECORDS: u64 = 10_000;

/// A response of `GET /admin/usage`: status, content type, body.
#[derive(Debug, PartialEq, Eq)]
pub struct AdminResponse {
    /// HTTP status.
    pub status: u16,
    /// `content-type`.
    pub content_type: &'static str,
    /// The body.
    pub body: Vec<u8>,
}

fn admin_error(status: u16, code: &str, message: &str) -> AdminResponse {
    let body =
        serde_json::json!({"error": {"message": message, "type": "admin_error", "code": code}});
    AdminResponse {
        status,
        content_type: "application/json",
        body: body.to_string().into_bytes(),
    }
}

/// Whether `authorization` (`Bearer <token>`) carries `token`: SHA-256 digests compared in
/// constant time, so neither the length nor a prefix of the token leaks through timing.
pub fn token_matches(authorization: Option<&[u8]>, token: &str) -> bool {
    use subtle::ConstantTimeEq;
    let presented = crate::auth::presented_key(authorization, None).unwrap_or_default();
    let a = crate::auth::hash_key(&presented);
    let b = crate::auth::hash_key(token);
    !presented.is_empty() && bool::from(a.ct_eq(&b))
}

/// Parses the admin query string: `since`, `until`, `tenant`, `model` (as the CLI flags),
/// `format` (`json` default, `csv`, `table`), `summary` (`true`/`1`), `limit` (records, at
/// most [`ADMIN_MAX_RECORDS`], which is also the default).
fn parse_admin_query(q: &str) -> Result<(Filter, Format, bool), String> {
    let mut f = Filter {
        limit: Some(ADMIN_MAX_RECORDS),
        ..Filter::default()
    };
    let mut format = Format::Json;
    let mut summary = false;
    for pair in q.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_encoding::percent_decode_str(&v.replace('+', " "))
            .decode_utf8()
            .map_err(|_| format!("`{k}` is not UTF-8"))?
            .into_owned();
        match k {
            "since" => f.since = Some(parse_date(&v)?),
            "until" => f.until = Some(parse_date(&v)?),
            "tenant" => f.tenant = Some(v),
            "model" => f.model = Some(v),
            "summary" => summary = matches!(v.as_str(), "" | "1" | "true" | "yes"),
            "format" => {
                format = match v.as_str() {
                    "json" => Format::Json,
                    "csv" => Format::Csv,
                    "table" => Format::Table,
                    _ => return Err(format!("format `{v}`: use json, csv or table")),
                }
            }
            "limit" => {
                let n: u64 = v
                    .parse()
                    .map_err(|_| format!("limit `{v}` is not a number"))?;
                if n == 0 || n > ADMIN_MAX_RECORDS {
                    return Err(format!("limit must be 1..={ADMIN_MAX_RECORDS}"));
                }
                f.limit = Some(n);
            }
            _ => {
                return Err(format!(
                    "unknown parameter `{k}` (since, until, tenant, model, format, summary, limit)"
                ))
            }
        }
    }
    f.check()?;
    Ok((f, format, summary))
}

/// Answers `GET /admin/usage?query`: 403 when no admin token is configured
/// (`server.admin_token_env`), 401 without the right `Authorization: Bearer` token, 400 for
/// a bad parameter, 503 when the ledger cannot be read, else 200 with the records or the
/// summary. Reads the ledger the running writer uses (`running`; `None`: no ledger, 503).
/// Blocking: run it off the async threads.
pub fn admin_usage(
    query: &str,
    authorization: Option<&[u8]>,
    admin_token: Option<&str>,
    running: Option<&LedgerSettings>,
) -> AdminResponse {
    let Some(token) = admin_token else {
        return admin_error(
            403,
            "admin_token_not_configured",
            "usage data is served only with an admin token: set server.admin_token_env to the \
             name of an environment variable holding it",
        );
    };
    if !token_matches(authorization, token) {
        return admin_error(
            401,
            "invalid_admin_token",
            "missing or wrong admin token (Authorization: Bearer <token>)",
        );
    }
    let (filter, format, want_summary) = match parse_admin_query(query) {
        Ok(x) => x,
        Err(m) => return admin_error(400, "invalid_parameter", &m),
    };
    let Some(settings) = running else {
        return admin_error(
            503,
            "ledger_unavailable",
            "the usage ledger is not running (disabled by ledger.enabled: false, or it could not be opened: see the log)",
        );
    };
    let body = if want_summary {
        summary(settings, &filter).map(|rows| format_summary(&rows, format))
    } else {
        records(settings, &filter).map(|rows| format_records(&rows, format))
    };
    match body {
        Ok(body) => AdminResponse {
            status: 200,
            content_type: match format {
                Format::Json => "application/json",
                Format::Csv => "text/csv; charset=utf-8",
                Format::Table => "text/plain; charset=utf-8",
            },
            body: body.into_bytes(),
        },
        Err(e) => {
            log::error!(target: "sluice::ledger::query", "GET /admin/usage: {e}");
            admin_error(
                503,
                "ledger_unavailable",
                "the usage ledger cannot be read (see the log)",
            )
        }
    }
}

/// How long `sluice usage` waits for PostgreSQL to answer a query.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::billing::ledger::writer::tests::rec;

    #[test]
    fn the_summary_names_the_hedge_cancelled_outcome_it_leaves_out_of_request_counts() {
        for outcome in [super::super::HEDGE_CANCELLED, super::super::COUNT_TOKENS] {
            let quoted = format!("'{outcome}'");
            assert_eq!(
                SUMMARY_COLUMNS.matches(&quoted).count(),
                2,
                "{SUMMARY_COLUMNS}"
            );
        }
    }

    #[test]
    fn dates_are_utc_midnight_or_rfc3339() {
        assert_eq!(parse_date("1970-01-02"), Ok(86_400_000));
        assert_eq!(parse_date("1970-01-01T00:00:01Z"), Ok(1000));
        assert_eq!(parse_date("1970-01-01T01:00:00+01:00"), Ok(0));
        assert!(parse_date("yesterday").unwrap_err().contains("YYYY-MM-DD"));
        assert!(parse_date("2026-13-01").is_err());
    }

    #[test]
    fn the_where_clause_binds_every_filter_in_order() {
        let f = Filter {
            since: Some(1),
            until: Some(2),
            tenant: Some("t".into()),
            model: None,
            limit: Some(5),
        };
        let (sql, params) = f.where_clause(|n| format!("${n}"));
        assert_eq!(sql, " WHERE time_ms >= $1 AND time_ms < $2 AND tenant = $3");
        assert_eq!(
            params,
            vec![Param::Int(1), Param::Int(2), Param::Text("t".into())]
        );
        assert!(f.records_sql(&sql).contains("DESC LIMIT 5"));
        // `since` at or after `until` matches nothing: refused, not answered empty.
        assert!(f.check().is_ok());
        let backwards = Filter {
            since: Some(2),
            until: Some(1),
            ..Filter::default()
        };
        assert!(backwards.check().unwrap_err().contains("not before"));
        assert_eq!(Filter::default().where_clause(|n| format!("?{n}")).0, "");
    }

    #[test]
    fn json_is_one_array_with_the_contract_field_names_and_csv_has_them_as_header() {
        let mut a = rec(1);
        a.request_id = "has,comma \"quoted\"".into();
        a.provider = None;
        let json = format_records(&[a.clone(), rec(2)], Format::Json);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        let arr = v.as_array().unwrap();
        assert_eq!(arr.len(), 2);
        let mut keys: Vec<&str> = arr[0]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let mut want = RECORD_FIELDS.to_vec();
        keys.sort_unstable();
        want.sort_unstable();
        assert_eq!(keys, want);
        // Serialized in the record's field order.
        let first_keys: Vec<usize> = RECORD_FIELDS
            .iter()
            .map(|k| json.find(&format!("\"{k}\":")).unwrap())
            .collect();
        assert!(first_keys.windows(2).all(|w| w[0] < w[1]), "{json}");
        assert_eq!(arr[0]["time"], "2026-12-01T23:50:00.001Z");
        assert!(arr[0]["provider"].is_null());
        let back: Vec<UsageRecord> = serde_json::from_str(&json).unwrap();
        assert_eq!(back[0], a);

        let csv = format_records(&[a], Format::Csv);
        let mut lines = csv.lines();
        assert_eq!(lines.next().unwrap(), RECORD_FIELDS.join(","));
        let row = lines.next().unwrap();
        assert!(row.starts_with("2026-12-01T23:50:00.001Z,\"has,comma \"\"quoted\"\"\",t,k,m,,u,1,2,0,0,0,false,0.0,0.0,200,ok,3,4,0,1,chat,0"), "{row}");

        let mut resumed = rec(3);
        resumed.resumptions = 2;
        let table = format_records(&[resumed], Format::Table);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("time "), "{table}");
        assert!(lines[0].ends_with(" resumed"), "{table}");
        assert!(lines[2].ends_with(" 2"), "{table}");
        assert!(
            lines[2].contains(" r3 ") && lines[2].contains(" ok "),
            "{table}"
        );
    }

    #[test]
    fn summary_csv_and_table_name_every_sum() {
        let row = SummaryRow {
            tenant: "t".into(),
            model: "m".into(),
            requests: 2,
            input_tokens: 3,
            output_tokens: 4,
            cached_input_tokens: 0,
            cache_write_tokens: 0,
            reasoning_tokens: 0,
            estimated_requests: 1,
            cost_usd: 0.5,
            charge_usd: 1.25,
            resumptions: 7,
        };
        let csv = format_summary(std::slice::from_ref(&row), Format::Csv);
        assert_eq!(
            csv,
            format!(
                "{}\nt,m,2,3,4,0,0,0,1,0.5,1.25,7\n",
                SUMMARY_FIELDS.join(",")
            )
        );
        assert!(SUMMARY_FIELDS.ends_with(&["charge_usd", "resumptions"]));
        let text = format_summary(std::slice::from_ref(&row), Format::Json);
        let json: Vec<SummaryRow> = serde_json::from_str(&text).unwrap();
        assert_eq!(json, vec![row.clone()]);
        assert!(text.contains("\"resumptions\": 7"), "{text}");
        // A summary printed before the sum existed reads 0.
        let old: Vec<SummaryRow> =
            serde_json::from_str(&text.replace(",\n    \"resumptions\": 7", "")).unwrap();
        assert_eq!(old[0].resumptions, 0);
        let table = format_summary(&[row], Format::Table);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].ends_with(" resumptions"), "{table}");
        let cells: Vec<&str> = lines[2].split_whitespace().collect();
        assert!(cells.ends_with(&["1.250000", "7"]), "{table}");
    }

    #[test]
    fn the_admin_endpoint_needs_a_configured_token_and_the_right_bearer() {
        let r = admin_usage("", Some(b"Bearer x"), None, None);
        assert_eq!(r.status, 403);
        assert!(String::from_utf8_lossy(&r.body).contains("server.admin_token_env"));
        let token = "0123456789abcdef0123";
        assert_eq!(admin_usage("", None, Some(token), None).status, 401);
        assert_eq!(
            admin_usage("", Some(b"Bearer 0123456789abcdef012"), Some(token), None).status,
            401
        );
        assert_eq!(
            admin_usage("", Some(b"Bearer "), Some(token), None).status,
            401
        );
        let auth = format!("Bearer {token}");
        assert_eq!(
            admin_usage("bogus=1", Some(auth.as_bytes()), Some(token), None).status,
            400
        );
        assert_eq!(
            admin_usage("limit=0", Some(auth.as_bytes()), Some(token), None).status,
            400
        );
        assert_eq!(
            admin_usage("since=2026-12-01", Some(auth.as_bytes()), Some(token), None).status,
            503
        );
    }

    #[test]
    fn admin_query_parameters_are_percent_decoded() {
        let (f, format, summary) = parse_admin_query(
            "tenant=team%20a&model=openai%2Fgpt&since=2026-12-01&format=csv&summary=1&limit=7",
        )
        .unwrap();
        assert_eq!(f.tenant.as_deref(), Some("team a"));
        assert_eq!(f.model.as_deref(), Some("openai/gpt"));
        assert_eq!(f.since, Some(1_796_083_200_000));
        assert_eq!(f.limit, Some(7));
        assert_eq!((format, summary), (Format::Csv, true));
    }
}
