//! The mock's Google OAuth2 token endpoint and Vertex AI gate ([`sluice_mock_upstream`]) over
//! a real socket, driven by the gateway's own service-account signer and token fetcher
//! ([`crate::providers::google_auth`]): assertions signed with a key made by the `openssl`
//! command line are verified independently, wrong keys, scopes and grants are refused as
//! Google refuses them, and the model paths take only unexpired tokens the mock issued.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use sluice_mock_upstream::{Behavior, MockServer, MockState};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::providers::google_auth::{ServiceAccount, ServiceAccountFetcher};
use crate::providers::token::TokenFetcher;
use crate::secret::Secret;

/// A 2048-bit RSA key: (private PKCS#8 PEM, public SPKI PEM).
fn rsa_key() -> (String, String) {
    let dir = std::env::temp_dir().join(format!(
        "sluice-mock-vertex-{}-{}",
        std::process::id(),
        fastrand::u64(..)
    ));
    std::fs::create_dir_all(&dir).expect("dir");
    let key = dir.join("key.pem");
    let public = dir.join("public.pem");
    for args in [
        vec![
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
            key.to_str().expect("path"),
        ],
        vec![
            "pkey",
            "-in",
            key.to_str().expect("path"),
            "-pubout",
            "-out",
            public.to_str().expect("path"),
        ],
    ] {
        let out = std::process::Command::new("openssl")
            .args(&args)
            .output()
            .expect("the openssl command line");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let pair = (
        std::fs::read_to_string(&key).expect("key"),
        std::fs::read_to_string(&public).expect("public"),
    );
    let _ = std::fs::remove_dir_all(&dir);
    pair
}

fn account(private_pem: &str) -> ServiceAccount {
    let file = json!({"type": "service_account", "client_email": "sa@p.iam.gserviceaccount.com",
        "private_key_id": "kid-1", "private_key": private_pem,
        "token_uri": "https://oauth2.googleapis.com/token"});
    ServiceAccount::parse(&Secret::new(file.to_string())).expect("key file")
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

async fn raw(srv: &MockServer, head: &str, body: &str) -> Resp {
    let mut c = Client::connect(srv.addr()).await;
    let req = format!(
        "{head}\r\nHost: mock\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    c.send(req.as_bytes()).await;
    c.read_response().await
}

async fn token_request(srv: &MockServer, assertion: &str, grant: &str) -> Resp {
    raw(
        srv,
        "POST /token HTTP/1.1\r\nContent-Type: application/x-www-form-urlencoded",
        &format!("grant_type={grant}&assertion={assertion}"),
    )
    .await
}

const GRANT: &str = "urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer";
const CLAUDE: &str =
    "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-6:rawPredict";

async fn claude(srv: &MockServer, auth: Option<&str>, body: &Value) -> Resp {
    let auth = auth
        .map(|t| format!("\r\nAuthorization: Bearer {t}"))
        .unwrap_or_default();
    raw(
        srv,
        &format!("POST {CLAUDE} HTTP/1.1\r\nContent-Type: application/json{auth}"),
        &body.to_string(),
    )
    .await
}

#[tokio::test]
async fn assertions_are_verified_tokens_issued_and_only_live_tokens_accepted() {
    let (private_pem, public_pem) = rsa_key();
    let (other_private, _) = rsa_key();
    let b: Behavior = serde_json::from_value(
        json!({"token_public_key": public_pem, "token_lifetime_s": 1, "text": "hi there"}),
    )
    .expect("behavior");
    let srv = server(b).await;
    let aud = format!("http://{}/token", srv.addr());
    let sa = account(&private_pem);

    // Signed by another key, or for another grant: refused the way Google refuses.
    let forged = account(&other_private)
        .assertion(&aud, now())
        .expect("sign");
    let r = token_request(&srv, &forged, GRANT).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"], "invalid_grant");
    assert_eq!(r.json()["error_description"], "Invalid JWT Signature.");
    let good = sa.assertion(&aud, now()).expect("sign");
    let r = token_request(&srv, &good, "client_credentials").await;
    assert_eq!(r.json()["error"], "unsupported_grant_type", "{}", r.text());
    let tampered = {
        let mut parts: Vec<&str> = good.split('.').collect();
        let claims = base64_claims(&json!({"iss": "x@y", "scope": "email", "aud": aud,
            "iat": now(), "exp": now() + 3600}));
        parts[1] = &claims;
        parts.join(".")
    };
    let r = token_request(&srv, &tampered, GRANT).await;
    assert_eq!(r.json()["error"], "invalid_scope", "{}", r.text());
    let stale = sa.assertion(&aud, now() - 7200).expect("sign");
    let r = token_request(&srv, &stale, GRANT).await;
    assert_eq!(r.json()["error"], "invalid_grant", "{}", r.text());

    // The gateway's fetcher over Pingora's connector gets a token.
    let endpoint = crate::config::Endpoint {
        tls: false,
        host: "127.0.0.1".into(),
        port: srv.addr().port(),
        base_path: "/token".into(),
        ip: Some(srv.addr().ip()),
    };
    let fetcher = ServiceAccountFetcher::new(
        sa,
        aud.clone(),
        endpoint,
        "/token".into(),
        Duration::from_secs(2),
    );
    let issued = fetcher.fetch().await.expect("a token");
    assert_eq!(issued.lifetime, Duration::from_secs(1));
    let token = issued.value.expose().to_string();
    assert!(token.starts_with("ya29.mock-"), "{token}");
    assert!(!format!("{fetcher:?}").contains("PRIVATE"), "{fetcher:?}");

    // Claude on Vertex: the token, `anthropic_version`, no `model`.
    let body = json!({"anthropic_version": "vertex-2023-10-16", "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}]});
    let r = claude(&srv, Some(&token), &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["content"][0]["text"], "hi there");
    assert_eq!(r.json()["model"], "claude-sonnet-4-6");
    let mut with_model = body.clone();
    with_model["model"] = json!("claude-sonnet-4-6");
    assert_eq!(claude(&srv, Some(&token), &with_model).await.status, 400);
    let mut old_version = body.clone();
    old_version["anthropic_version"] = json!("2023-06-01");
    assert_eq!(claude(&srv, Some(&token), &old_version).await.status, 400);
    for auth in [None, Some("ya29.not-issued")] {
        let r = claude(&srv, auth, &body).await;
        assert_eq!(r.status, 401, "{auth:?}");
        assert_eq!(r.json()["error"]["status"], "UNAUTHENTICATED");
        assert_eq!(r.json()["error"]["code"], 401);
    }
    // Past its lifetime the token is refused.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let r = claude(&srv, Some(&token), &body).await;
    assert_eq!(r.status, 401, "{}", r.text());

    // A failing endpoint answers the status the knob names.
    let b: Behavior = serde_json::from_value(json!({"token_status": 503})).expect("behavior");
    let failing = server(b).await;
    let r = token_request(&failing, &good, GRANT).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["error"], "internal_failure");
}

fn base64_claims(v: &Value) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
}

// The mock crate's own loopback test client, the part these tests use.

const T: Duration = Duration::from_secs(10);

async fn server(b: Behavior) -> MockServer {
    MockServer::start("127.0.0.1:0", Arc::new(MockState::new(b)))
        .await
        .expect("bind")
}

/// A parsed HTTP response as seen by a client.
#[derive(Debug, Default)]
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    /// De-chunked body.
    body: Vec<u8>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    fn text(&self) -> String {
        String::from_utf8(self.body.clone()).expect("utf8 body")
    }
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("json body")
    }
}

/// Buffered reader over a client stream.
struct Client {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    async fn connect(addr: std::net::SocketAddr) -> Client {
        let s = TcpStream::connect(addr).await.expect("connect");
        s.set_nodelay(true).expect("nodelay");
        Client { s, buf: Vec::new() }
    }

    async fn fill(&mut self) -> bool {
        let mut tmp = vec![0u8; 65536];
        match tokio::time::timeout(T, self.s.read(&mut tmp)).await {
            Ok(Ok(0)) | Ok(Err(_)) => false,
            Ok(Ok(n)) => {
                self.buf.extend_from_slice(&tmp[..n]);
                true
            }
            Err(_) => panic!("client read timed out"),
        }
    }

    async fn send(&mut self, data: &[u8]) {
        self.s.write_all(data).await.expect("write");
    }

    async fn line(&mut self) -> Option<Vec<u8>> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let l = self.buf[..i].to_vec();
                self.buf.drain(..i + 2);
                return Some(l);
            }
            if !self.fill().await {
                return None;
            }
        }
    }

    async fn read_response(&mut self) -> Resp {
        let mut r = Resp::default();
        let status_line = self.line().await.expect("status line");
        let sl = String::from_utf8(status_line).expect("status utf8");
        r.status = sl.split(' ').nth(1).expect("status").parse().expect("num");
        loop {
            let l = self.line().await.expect("header line");
            if l.is_empty() {
                break;
            }
            let l = String::from_utf8(l).expect("header utf8");
            let (k, v) = l.split_once(':').expect("colon");
            r.headers.push((k.trim().to_string(), v.trim().to_string()));
        }
        if r.status == 100 {
            return Box::pin(self.read_response()).await;
        }
        if r.header("transfer-encoding")
            .is_some_and(|v| v.contains("chunked"))
        {
            loop {
                let Some(l) = self.line().await else { return r };
                let size =
                    usize::from_str_radix(std::str::from_utf8(&l).expect("size"), 16).expect("hex");
                if size == 0 {
                    let _ = self.line().await;
                    return r;
                }
                while self.buf.len() < size + 2 {
                    if !self.fill().await {
                        return r;
                    }
                }
                let c = self.buf[..size].to_vec();
                assert_eq!(&self.buf[size..size + 2], b"\r\n");
                self.buf.drain(..size + 2);
                r.body.extend_from_slice(&c);
            }
        } else {
            let n: usize = r
                .header("content-length")
                .expect("content-length")
                .parse()
                .expect("cl");
            while self.buf.len() < n {
                if !self.fill().await {
                    r.body = std::mem::take(&mut self.buf);
                    return r;
                }
            }
            r.body = self.buf.drain(..n).collect();
            r
        }
    }
}
