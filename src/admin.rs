//! Owns the admin listener: `/` (the status page) and `/status.json` (its figures; see
//! [`crate::status`]), `/healthz` (the process is up), `/readyz` (config loaded and the
//! proxy listener bound), `/metrics` (Prometheus text exposition, see [`crate::metrics`]) and
//! `/admin/usage` (the usage ledger, behind the admin token of `server.admin_token_env`; see
//! [`crate::billing::ledger::query::admin_usage`]).
//! It never shares a port with client traffic.

use std::sync::Arc;

use async_trait::async_trait;
use http::Response;
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;

use crate::live::ConfigHandle;

/// The admin HTTP app.
#[derive(Debug)]
pub struct AdminApp {
    config: Arc<ConfigHandle>,
}

impl AdminApp {
    /// An admin app reporting on `config`; starts the status page's sampler.
    pub fn new(config: Arc<ConfigHandle>) -> Self {
        crate::status::start_sampler();
        Self { config }
    }
}

fn respond(status: u16, content_type: &str, body: Vec<u8>) -> Response<Vec<u8>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .header("content-length", body.len())
        .header("cache-control", "no-store")
        .body(body.clone())
        .unwrap_or_else(|_| Response::new(body))
}

#[async_trait]
impl ServeHttp for AdminApp {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let path = session.req_header().uri.path().to_string();
        match path.as_str() {
            "/" | "/index.html" => respond(
                200,
                "text/html; charset=utf-8",
                crate::status::PAGE.as_bytes().to_vec(),
            ),
            "/status.json" => respond(200, "application/json", crate::status::status_json()),
            "/healthz" => respond(200, "text/plain", b"ok\n".to_vec()),
            "/readyz" => {
                let cfg = self.config.snapshot();
                let body = format!(
                    "ready: {} models, {} providers, config {}\n",
                    cfg.models.len(),
                    cfg.providers.len(),
                    cfg.source_path.display()
                );
                respond(200, "text/plain", body.into_bytes())
            }
            "/metrics" => respond(200, "text/plain; version=0.0.4", crate::metrics::render()),
            "/admin/usage" => {
                let query = session.req_header().uri.query().unwrap_or("").to_string();
                let auth = session
                    .req_header()
                    .headers
                    .get(http::header::AUTHORIZATION)
                    .map(|v| v.as_bytes().to_vec());
                let token = self
                    .config
                    .snapshot()
                    .server
                    .admin_token
                    .as_ref()
                    .map(|t| t.expose().to_string());
                // The ledger query blocks (SQLite, or PostgreSQL on its own runtime).
                let r = tokio::task::spawn_blocking(move || {
                    crate::billing::ledger::query::admin_usage(
                        &query,
                        auth.as_deref(),
                        token.as_deref(),
                        crate::billing::ledger::running(),
                    )
                })
                .await;
                match r {
                    Ok(r) => respond(r.status, r.content_type, r.body),
                    Err(_) => respond(500, "text/plain", b"usage query failed\n".to_vec()),
                }
            }
            _ => respond(404, "text/plain", b"not found\n".to_vec()),
        }
    }
}
