//! Owns what a passthrough request leaves behind: its access line (target
//! [`crate::logging::TARGET`], the same format setting as the LLM endpoints' lines)
//! and its metrics. Fields, in order:
//! `request_id route upstream method path status outcome attempts duration_ms bytes_out`
//! (`path` without its query string, which may carry tokens; `upstream` the address that
//! answered, `-` when none did). Request headers and bodies are never logged.
//!
//! Metrics (labels bounded by the config: route names and upstream addresses):
//! - `sluice_passthrough_requests_total{route,status}`: finished passthrough requests;
//! - `sluice_passthrough_request_duration_seconds{route}`: their duration;
//! - `sluice_passthrough_upstream_healthy{route,upstream}`: 1 while an upstream is in the
//!   rotation, 0 while its health check fails.

use std::sync::LazyLock;

use pingora::proxy::Session;
use prometheus::{
    exponential_buckets, register_histogram_vec, register_int_counter_vec, register_int_gauge_vec,
    HistogramVec, IntCounterVec, IntGaugeVec,
};

use super::serve::PassCtx;
use crate::logging::{format_line, Field, TARGET};

/// The passthrough metrics (registered in the default registry `/metrics` renders).
#[derive(Debug)]
pub struct Metrics {
    /// `sluice_passthrough_requests_total{route,status}`.
    pub requests_total: IntCounterVec,
    /// `sluice_passthrough_request_duration_seconds{route}`.
    pub request_duration_seconds: HistogramVec,
    /// `sluice_passthrough_upstream_healthy{route,upstream}`.
    pub upstream_healthy: IntGaugeVec,
}

fn build() -> Result<Metrics, prometheus::Error> {
    Ok(Metrics {
        requests_total: register_int_counter_vec!(
            "sluice_passthrough_requests_total",
            "Finished passthrough requests by route and final HTTP status (0: nothing was written).",
            &["route", "status"]
        )?,
        request_duration_seconds: register_histogram_vec!(
            "sluice_passthrough_request_duration_seconds",
            "Passthrough request duration in seconds, by route.",
            &["route"],
            exponential_buckets(0.001, 2.0, 16)?
        )?,
        upstream_healthy: register_int_gauge_vec!(
            "sluice_passthrough_upstream_healthy",
            "1 while a passthrough upstream is in its route's rotation, 0 while its health check fails.",
            &["route", "upstream"]
        )?,
    })
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| match build() {
    Ok(m) => m,
    Err(e) => panic!("passthrough metric registration failed: {e}"),
});

/// The process-wide passthrough metrics.
pub fn metrics() -> &'static Metrics {
    &METRICS
}

/// Writes the access line of a finished passthrough request and counts it.
pub fn record(session: &Session, error: Option<&pingora::Error>, p: &PassCtx) {
    let route = p.route.spec.name.as_str();
    let status = if p.status != 0 {
        p.status
    } else {
        session.response_written().map_or(0, |h| h.status.as_u16())
    };
    let outcome = match (p.label, error) {
        ("", None) => "ok",
        ("", Some(_)) => "error",
        (l, _) => l,
    };
    let duration = p.received.elapsed();
    let m = metrics();
    m.requests_total
        .with_label_values(&[route, &status.to_string()])
        .inc();
    m.request_duration_seconds
        .with_label_values(&[route])
        .observe(duration.as_secs_f64());
    let req = session.req_header();
    let upstream = p.upstream.map(|a| a.to_string());
    let path: String = req.uri.path().chars().take(1024).collect();
    let ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    let fields: [(&str, Field<'_>); 10] = [
        ("request_id", Field::Text(&p.request_id)),
        ("route", Field::Text(route)),
        ("upstream", Field::Text(upstream.as_deref().unwrap_or("-"))),
        ("method", Field::Text(req.method.as_str())),
        ("path", Field::Text(&path)),
        ("status", Field::Count(u64::from(status))),
        ("outcome", Field::Text(outcome)),
        ("attempts", Field::Count(p.tried.len() as u64)),
        ("duration_ms", Field::Count(ms)),
        ("bytes_out", Field::Count(session.body_bytes_sent() as u64)),
    ];
    let line = format_line(&fields, p.log_format());
    log::info!(target: TARGET, "{line}");
}
