//! Owns the admin listener: `/` (the status page) and `/status.json` (its figures; see
//! [`crate::status`]), `/healthz` (the process is up), `/readyz` (this process holds every
//! configured listener; see [`crate::listeners`]), `/metrics` (Prometheus text exposition,
//! see [`crate::metrics`]) and `/admin/usage` (the usage ledger; see
//! [`crate::billing::ledger::query::admin_usage`]). It never shares a port with client
//! traffic.
//!
//! Access:
//! - only `GET` and `HEAD`; any other method gets 405 with `Allow: GET, HEAD`;
//! - with an admin token (`server.admin_token_env`), every path but `/healthz` and `/readyz`
//!   needs it, as `Authorization: Bearer <token>` (Prometheus' `authorization:` scrape
//!   setting) or as the password of HTTP Basic (`Authorization: Basic`, any user name), so
//!   that a browser opening the status page prompts for it; without it, 401 with
//!   `WWW-Authenticate: Basic realm="sluice admin"`. The token never goes in a URL (it would
//!   land in logs and browser history);
//! - without an admin token the listener is open (as it must be to be scraped without one),
//!   except `/admin/usage`, which then answers 403; `sluice -t` and startup warn when it is
//!   bound to a non-loopback address.

use std::sync::Arc;

use async_trait::async_trait;
use http::{Method, Response};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;

use crate::listeners::ListenerSet;
use crate::live::ConfigHandle;

/// The realm of the admin listener's `WWW-Authenticate` challenge.
pub const REALM: &str = "sluice admin";

/// The admin HTTP app.
#[derive(Debug)]
pub struct AdminApp {
    config: Arc<ConfigHandle>,
    listeners: Arc<ListenerSet>,
}

impl AdminApp {
    /// An admin app reporting on `config`, ready while this process holds `listeners`;
    /// starts the status page's sampler.
    pub fn new(config: Arc<ConfigHandle>, listeners: Arc<ListenerSet>) -> Self {
        crate::status::start_sampler();
        Self { config, listeners }
    }
}

fn respond(status: u16, content_type: &str, body: Vec<u8>) -> Response<Vec<u8>> {
    respond_with(status, content_type, body, &[])
}

fn respond_with(
    status: u16,
    content_type: &str,
    body: Vec<u8>,
    headers: &[(&str, &str)],
) -> Response<Vec<u8>> {
    let mut b = Response::builder()
        .status(status)
        .header("content-type", content_type)
        .header("content-length", body.len())
        .header("cache-control", "no-store");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(body.clone()).unwrap_or_else(|_| Response::new(body))
}

/// An admin error in the shape `/admin/usage` uses: `{"error": {message, type:
/// "admin_error", code}}`.
fn admin_error(
    status: u16,
    code: &str,
    message: &str,
    headers: &[(&str, &str)],
) -> Response<Vec<u8>> {
    let body =
        serde_json::json!({"error": {"message": message, "type": "admin_error", "code": code}});
    respond_with(
        status,
        "application/json",
        body.to_string().into_bytes(),
        headers,
    )
}

/// The admin token an `Authorization` value presents: the credentials of `Bearer`, or the
/// password of `Basic` (base64 of `user:password`, RFC 7617; the user name is ignored).
/// `None` for any other scheme or a malformed value.
pub fn presented_admin_token(authorization: &[u8]) -> Option<String> {
    let v = std::str::from_utf8(authorization).ok()?.trim();
    let (scheme, rest) = v.split_once(|c: char| c.is_ascii_whitespace())?;
    let rest = rest.trim();
    if scheme.eq_ignore_ascii_case("bearer") {
        return Some(rest.to_owned()).filter(|t| !t.is_empty());
    }
    if scheme.eq_ignore_ascii_case("basic") {
        let decoded = base64_simd::STANDARD.decode_to_vec(rest).ok()?;
        let pair = String::from_utf8(decoded).ok()?;
        let (_, password) = pair.split_once(':')?;
        return Some(password.to_owned()).filter(|t| !t.is_empty());
    }
    None
}

/// Whether `authorization` presents `token` (digests compared in constant time).
fn authorized(authorization: Option<&[u8]>, token: &str) -> Option<String> {
    use subtle::ConstantTimeEq;
    let presented = presented_admin_token(authorization?)?;
    let matches = crate::auth::hash_key(&presented).ct_eq(&crate::auth::hash_key(token));
    bool::from(matches).then_some(presented)
}

#[async_trait]
impl ServeHttp for AdminApp {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let req = session.req_header();
        if req.method != Method::GET && req.method != Method::HEAD {
            return admin_error(
                405,
                "method_not_allowed",
                "the admin listener answers GET and HEAD only",
                &[("allow", "GET, HEAD")],
            );
        }
        let path = req.uri.path().to_string();
        match path.as_str() {
            "/healthz" => return respond(200, "text/plain", b"ok\n".to_vec()),
            "/readyz" => {
                return match self.listeners.readiness() {
                    Ok(listening) => {
                        let cfg = self.config.snapshot();
                        let body = format!(
                            "ready: {} models, {} providers, config {}\n{listening}",
                            cfg.models.len(),
                            cfg.providers.len(),
                            cfg.source_path.display()
                        );
                        respond(200, "text/plain", body.into_bytes())
                    }
                    Err(why) => respond(503, "text/plain", why.into_bytes()),
                };
            }
            _ => {}
        }
        // Everything else shows tenants, spend, budgets and routes: behind the admin token
        // when there is one.
        let token = self
            .config
            .snapshot()
            .server
            .admin_token
            .as_ref()
            .map(|t| t.expose().to_string());
        let authorization = req
            .headers
            .get(http::header::AUTHORIZATION)
            .map(|v| v.as_bytes().to_vec());
        let presented = match &token {
            Some(token) => match authorized(authorization.as_deref(), token) {
                Some(p) => Some(p),
                None => {
                    let challenge = format!("Basic realm=\"{REALM}\", charset=\"UTF-8\"");
                    return admin_error(
                        401,
                        "invalid_admin_token",
                        "missing or wrong admin token: send `Authorization: Bearer <token>`, \
                         or the token as the password of HTTP Basic (a browser prompts for it)",
                        &[("www-authenticate", &challenge)],
                    );
                }
            },
            None => None,
        };
        match path.as_str() {
            "/" | "/index.html" => respond(
                200,
                "text/html; charset=utf-8",
                crate::status::PAGE.as_bytes().to_vec(),
            ),
            "/status.json" => respond(200, "application/json", crate::status::status_json()),
            "/metrics" => respond(200, "text/plain; version=0.0.4", crate::metrics::render()),
            "/admin/usage" => {
                let query = req.uri.query().unwrap_or("").to_string();
                // The ledger query checks the token again, as a bearer credential.
                let auth = presented.map(|p| format!("Bearer {p}").into_bytes());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_and_basic_present_the_token_other_schemes_do_not() {
        assert_eq!(presented_admin_token(b"Bearer abc").as_deref(), Some("abc"));
        assert_eq!(
            presented_admin_token(b"bearer   abc ").as_deref(),
            Some("abc")
        );
        // base64("prometheus:s3cret:with:colons")
        let basic = format!(
            "Basic {}",
            base64_simd::STANDARD.encode_to_string("prometheus:s3cret:with:colons")
        );
        assert_eq!(
            presented_admin_token(basic.as_bytes()).as_deref(),
            Some("s3cret:with:colons")
        );
        assert_eq!(presented_admin_token(b"abc"), None);
        assert_eq!(presented_admin_token(b"Basic !!!"), None);
        assert_eq!(presented_admin_token(b"Digest abc"), None);
        let empty = format!("Basic {}", base64_simd::STANDARD.encode_to_string("u:"));
        assert_eq!(presented_admin_token(empty.as_bytes()), None);
        assert!(authorized(Some(b"Bearer abc"), "abc").is_some());
        assert!(authorized(Some(b"Bearer abd"), "abc").is_none());
        assert!(authorized(None, "abc").is_none());
    }
}
