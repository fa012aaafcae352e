//! Owns Google service-account authentication (Vertex AI): the
//! RS256 JWT assertion the key signs, and its exchange at the token endpoint for an OAuth2
//! access token ([`ServiceAccountFetcher`], cached by [`super::token::TokenCache`]).
//!
//! The flow is OAuth 2.0's JWT bearer grant (RFC 7523) as Google runs it
//! (<https://developers.google.com/identity/protocols/oauth2/service-account#httprest>):
//!
//! - header `{"alg":"RS256","typ":"JWT","kid":<private_key_id>}`;
//! - claims `iss` = `client_email`, `scope` = [`CLOUD_PLATFORM_SCOPE`], `aud` = the token URL,
//!   `iat` = now, `exp` = `iat` + 3600 (seconds since the Unix epoch);
//! - `POST {token_uri}` with `Content-Type: application/x-www-form-urlencoded` and
//!   `grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer&assertion=<JWT>`;
//! - answer `{"access_token": "...", "expires_in": 3599, "token_type": "Bearer"}`, or an
//!   OAuth2 error `{"error": "invalid_grant", "error_description": "..."}` (RFC 6749 §5.2).
//!
//! The key file (<https://cloud.google.com/iam/docs/keys-create-delete>) has `type:
//! "service_account"`, `client_email`, `private_key` (PEM, PKCS#8 RSA), `private_key_id` and
//! `token_uri` (usually `https://oauth2.googleapis.com/token`). The private key stays in a
//! [`Secret`]; neither it nor a token is ever logged or put in an error. The key file is
//! read and checked at config load ([`ServiceAccount`], configuration data).

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use pingora::connectors::http::Connector;
use pingora::http::RequestHeader;
use pingora::protocols::ALPN;
use pingora::upstreams::peer::HttpPeer;
use serde::{Deserialize, Serialize};

use super::exchange::OpenError;
use super::token::{FetchFuture, IssuedToken, TokenFetcher};
pub use crate::config::vertex::ServiceAccount;
use crate::config::Endpoint;
use crate::secret::Secret;

/// The OAuth2 scope Vertex AI calls need.
pub const CLOUD_PLATFORM_SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
/// The JWT bearer grant type, form-encoded.
const GRANT_TYPE_FORM: &str = "urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer";
/// Lifetime of an assertion (Google's maximum), seconds.
const ASSERTION_LIFETIME_S: u64 = 3600;
/// Largest token endpoint answer read, bytes.
const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// Longest error text kept from a token endpoint answer, characters.
const MAX_ERROR_CHARS: usize = 200;

/// Signing with the service-account key read at load ([`crate::config::vertex`]).
impl ServiceAccount {
    /// The signed assertion for `audience` (the token URL) issued at `now_unix_s`.
    ///
    /// # Errors
    /// If the key cannot sign (it parsed at load, so only on a broken key).
    pub fn assertion(&self, audience: &str, now_unix_s: u64) -> Result<String, String> {
        #[derive(Serialize)]
        struct Claims<'a> {
            iss: &'a str,
            scope: &'a str,
            aud: &'a str,
            iat: u64,
            exp: u64,
        }
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
        header.kid = Some(self.private_key_id.clone());
        let claims = Claims {
            iss: &self.client_email,
            scope: CLOUD_PLATFORM_SCOPE,
            aud: audience,
            iat: now_unix_s,
            exp: now_unix_s + ASSERTION_LIFETIME_S,
        };
        jsonwebtoken::encode(&header, &claims, &self.encoding_key()?)
            .map_err(|e| format!("cannot sign the token request: {e}"))
    }
}

/// Exchanges a service account's assertions for access tokens at one token endpoint, over
/// Pingora's connector (plain HTTP or TLS verified against the system store).
pub struct ServiceAccountFetcher {
    account: ServiceAccount,
    /// The token URL as written (the assertion's `aud`).
    url: String,
    endpoint: Endpoint,
    /// Path and query of the token URL.
    path: String,
    connect_timeout: Duration,
    connector: OnceLock<Connector>,
}

impl std::fmt::Debug for ServiceAccountFetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccountFetcher")
            .field("account", &self.account)
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl ServiceAccountFetcher {
    /// A fetcher for `account` at the token URL `url` (already parsed into `endpoint` and
    /// `path`); connecting is bounded by `connect_timeout`.
    pub fn new(
        account: ServiceAccount,
        url: String,
        endpoint: Endpoint,
        path: String,
        connect_timeout: Duration,
    ) -> Self {
        Self {
            account,
            url,
            endpoint,
            path,
            connect_timeout,
            connector: OnceLock::new(),
        }
    }

    async fn exchange(&self) -> Result<IssuedToken, String> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let assertion = self.account.assertion(&self.url, now)?;
        let body = Bytes::from(format!(
            "grant_type={GRANT_TYPE_FORM}&assertion={assertion}"
        ));
        let ep = &self.endpoint;
        let addr = match ep.ip {
            Some(ip) => SocketAddr::new(ip, ep.port),
            None => super::resolve(&ep.host, ep.port, self.connect_timeout).await?,
        };
        let mut peer = HttpPeer::new(addr, ep.tls, ep.host.clone());
        peer.options.connection_timeout = Some(self.connect_timeout);
        peer.options.total_connection_timeout = Some(self.connect_timeout);
        peer.options.alpn = ALPN::H1;
        let connector = self.connector.get_or_init(|| Connector::new(None));
        let mut head = Some(self.head(body.len()).map_err(|e| e.to_string())?);
        let opened = super::exchange::open(
            || connector.get_http_session(&peer),
            super::exchange::Deadlines::default(),
            super::exchange::Resend::Never,
            || head.take().ok_or("no second head"),
            Some(body),
            |_| {},
        )
        .await;
        let mut up = match opened {
            Ok(up) => up,
            Err(OpenError::Connect(e)) => {
                return Err(format!(
                    "cannot connect to the token endpoint {}: {e}",
                    ep.host
                ))
            }
            Err(OpenError::Send(e)) => {
                return Err(format!("token endpoint {}: {}", ep.host, e.error))
            }
            // No deadlines here (the peer's own connect timeout applies), no resend.
            Err(OpenError::ConnectTimeout | OpenError::FirstByteTimeout | OpenError::Head(_)) => {
                return Err(format!("token endpoint {}: no answer", ep.host))
            }
        };
        let status = up.response_header().map_or(0, |h| h.status.as_u16());
        let mut answer = Vec::new();
        loop {
            match up.read_response_body().await {
                Ok(Some(chunk)) => {
                    answer.extend_from_slice(&chunk);
                    if answer.len() > MAX_ANSWER_BYTES {
                        up.shutdown().await;
                        return Err("the token endpoint's answer is too large".into());
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    up.shutdown().await;
                    return Err(format!("token endpoint {}: {e}", ep.host));
                }
            }
        }
        // One exchange an hour: the connection is not kept.
        up.shutdown().await;
        token_answer(status, &answer)
    }

    fn head(&self, body_len: usize) -> pingora::Result<RequestHeader> {
        let mut req = RequestHeader::build("POST", self.path.as_bytes(), Some(6))?;
        req.insert_header("host", self.endpoint.host_header())?;
        req.insert_header("content-type", "application/x-www-form-urlencoded")?;
        req.insert_header("content-length", body_len.to_string())?;
        req.insert_header("accept", "application/json")?;
        req.insert_header("user-agent", concat!("sluice/", env!("CARGO_PKG_VERSION")))?;
        Ok(req)
    }
}

impl TokenFetcher for ServiceAccountFetcher {
    fn fetch(&self) -> FetchFuture<'_> {
        Box::pin(self.exchange())
    }
}

/// Reads a token endpoint answer of HTTP `status`.
///
/// # Errors
/// A non-2xx answer (with the OAuth2 `error` and `error_description`, cut short), or a 2xx
/// whose body is no `Bearer` token with a positive `expires_in`.
pub fn token_answer(status: u16, body: &[u8]) -> Result<IssuedToken, String> {
    #[derive(Deserialize)]
    struct Answer {
        access_token: Option<String>,
        expires_in: Option<u64>,
        token_type: Option<String>,
        error: Option<String>,
        error_description: Option<String>,
    }
    let parsed: Option<Answer> = serde_json::from_slice(body).ok();
    if !(200..300).contains(&status) {
        let why = parsed
            .map(|a| {
                let mut s = a.error.unwrap_or_default();
                if let Some(d) = a.error_description {
                    s.push_str(": ");
                    s.push_str(&d);
                }
                s
            })
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "no OAuth2 error in the answer".into());
        let why: String = why.chars().take(MAX_ERROR_CHARS).collect();
        return Err(format!(
            "the token endpoint refused the service-account assertion: HTTP {status}: {why}"
        ));
    }
    let a = parsed.ok_or("the token endpoint's answer is not JSON")?;
    if !a
        .token_type
        .as_deref()
        .is_some_and(|t| t.eq_ignore_ascii_case("bearer"))
    {
        return Err("the token endpoint's answer has no `token_type: Bearer`".into());
    }
    let value = a
        .access_token
        .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or("the token endpoint's answer has no usable `access_token`")?;
    let lifetime = a
        .expires_in
        .filter(|s| *s > 0)
        .ok_or("the token endpoint's answer has no positive `expires_in`")?;
    Ok(IssuedToken {
        value: Secret::new(value),
        lifetime: Duration::from_secs(lifetime),
    })
}

#[cfg(test)]
mod against_mock;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_answers() {
        let t = token_answer(
            200,
            br#"{"access_token":"ya29.abc","expires_in":3599,"token_type":"Bearer"}"#,
        )
        .unwrap();
        assert_eq!(t.value.expose(), "ya29.abc");
        assert_eq!(t.lifetime, Duration::from_secs(3599));
        let e = token_answer(
            400,
            br#"{"error":"invalid_grant","error_description":"Invalid JWT Signature."}"#,
        )
        .unwrap_err();
        assert!(
            e.contains("HTTP 400: invalid_grant: Invalid JWT Signature."),
            "{e}"
        );
        assert!(token_answer(500, b"<html>")
            .unwrap_err()
            .contains("HTTP 500"));
        for bad in [
            &br#"{"access_token":"x","expires_in":3599}"#[..],
            br#"{"access_token":"","expires_in":3599,"token_type":"Bearer"}"#,
            br#"{"access_token":"a b","expires_in":3599,"token_type":"Bearer"}"#,
            br#"{"access_token":"x","expires_in":0,"token_type":"Bearer"}"#,
            b"nope",
        ] {
            assert!(
                token_answer(200, bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn key_files_are_checked_and_never_quoted() {
        let parse = |s: &str| ServiceAccount::parse(&Secret::new(s.to_string()));
        assert!(parse("{not json").unwrap_err().contains("line 1"));
        assert!(parse(r#"{"type":"authorized_user"}"#)
            .unwrap_err()
            .contains("type: authorized_user"));
        assert!(
            parse(r#"{"type":"service_account","private_key":"k","private_key_id":"i"}"#)
                .unwrap_err()
                .contains("client_email")
        );
        let e = parse(
            r#"{"type":"service_account","client_email":"a@b","private_key_id":"i","private_key":"-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n"}"#,
        )
        .unwrap_err();
        assert!(e.contains("no PEM RSA private key"), "{e}");
        assert!(!e.contains("c2VjcmV0"), "{e}");
    }
}
