//! Google Vertex AI as the mock speaks it: the OAuth2 token endpoint of the service-account
//! flow (`POST /token`, <https://developers.google.com/identity/protocols/oauth2/service-account#httprest>)
//! and the publisher model paths (`.../projects/{p}/locations/{r}/publishers/anthropic/models/{m}:rawPredict`
//! or `:streamRawPredict`; `.../publishers/google/models/{m}:generateContent` or
//! `:streamGenerateContent?alt=sse`), which take only a bearer token it issued and that has
//! not expired.
//!
//! The token endpoint checks the assertion on its own, without the gateway's JWT library:
//! the form (`grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer&assertion=...`), the
//! base64url JOSE header (`alg: RS256`, a `kid`), the claims (`iss`, the `cloud-platform`
//! `scope`, an `aud` naming this endpoint, `iat` not in the future, `exp` after now and at
//! most an hour after `iat`) and the RS256 signature against the `token_public_key` knob
//! (PKCS#1 v1.5 with SHA-256, verified with `ring`). It refuses as Google does (400
//! `invalid_grant` / `unsupported_grant_type` / `invalid_scope`) and issues
//! `{"access_token", "expires_in", "token_type": "Bearer"}` with the `token_lifetime_s`
//! knob as the lifetime; `token_status` makes it fail.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use serde_json::{json, Value};

use super::behavior::Behavior;
use super::h1::Request;

/// The scope a Vertex AI token must be issued for.
const CLOUD_PLATFORM_SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
/// The JWT bearer grant type.
const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// Default lifetime of an issued token, seconds (Google's).
const DEFAULT_LIFETIME_S: u64 = 3599;
/// Clock skew allowed on `iat`, seconds.
const SKEW_S: u64 = 60;

/// The tokens the mock issued: token → expiry.
#[derive(Debug, Default)]
pub(crate) struct Issued {
    tokens: HashMap<String, Instant>,
    seq: u64,
}

/// Whether `req` is a token request (`POST .../token`).
pub(crate) fn is_token_request(req: &Request) -> bool {
    req.method == "POST" && req.path().ends_with("/token")
}

/// The publisher of a Vertex AI model path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Publisher {
    /// `publishers/anthropic` (Claude, Messages bodies).
    Anthropic,
    /// `publishers/google` (Gemini bodies).
    Google,
}

/// A Vertex AI call: publisher, model, method.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VertexCall {
    pub publisher: Publisher,
    pub model: String,
    /// The method after `:` (`rawPredict`, `streamRawPredict`, `generateContent`, ...).
    pub method: String,
}

/// Parses `.../projects/{p}/locations/{r}/publishers/{publisher}/models/{model}:{method}`.
pub(crate) fn vertex_call(req: &Request) -> Option<VertexCall> {
    let path = req.path();
    let (_, rest) = path.split_once("/projects/")?;
    let (_project, rest) = rest.split_once("/locations/")?;
    let (_region, rest) = rest.split_once("/publishers/")?;
    let (publisher, rest) = rest.split_once("/models/")?;
    let (model, method) = rest.rsplit_once(':')?;
    let publisher = match publisher {
        "anthropic" => Publisher::Anthropic,
        "google" => Publisher::Google,
        _ => return None,
    };
    Some(VertexCall {
        publisher,
        model: model.replace("%40", "@"),
        method: method.to_string(),
    })
}

/// Google's error body (two-space indented, as Google writes it).
fn google_error(code: u16, message: &str, status: &str) -> String {
    let v = json!({"error": {"code": code, "message": message, "status": status}});
    serde_json::to_string_pretty(&v).unwrap_or_default()
}

/// Google's 401 for a missing, unknown or expired access token.
fn unauthenticated() -> (u16, String) {
    (
        401,
        google_error(
            401,
            "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project.",
            "UNAUTHENTICATED",
        ),
    )
}

/// What Vertex AI answers before reading the body: 401 `UNAUTHENTICATED` unless
/// `Authorization: Bearer` carries a token this mock issued that has not expired.
pub(crate) fn vertex_gate(issued: &Issued, req: &Request) -> Option<(u16, String)> {
    let token = req
        .header("authorization")
        .and_then(|v| v.strip_prefix("Bearer "))
        .filter(|t| !t.is_empty());
    match token.and_then(|t| issued.tokens.get(t)) {
        Some(exp) if Instant::now() < *exp => None,
        _ => Some(unauthenticated()),
    }
}

/// Google's platform errors for a Vertex AI status (quota, credentials, an unknown model)
/// come in its error model whatever the model's own dialect.
pub(crate) fn platform_error(status: u16, message: &str) -> Option<String> {
    let name = match status {
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        429 => "RESOURCE_EXHAUSTED",
        _ => return None,
    };
    Some(google_error(status, message, name))
}

/// Why a Claude body is not what Vertex AI takes, if it is not: `anthropic_version` must be
/// `vertex-2023-10-16` and the URL, not the body, names the model.
pub(crate) fn claude_body_refusal(call: &VertexCall, body: Option<&Value>) -> Option<String> {
    let body = body?;
    match body.get("anthropic_version").and_then(Value::as_str) {
        Some("vertex-2023-10-16") => {}
        Some(v) => return Some(format!("anthropic_version: unsupported value `{v}`")),
        None => return Some("anthropic_version: Field required".into()),
    }
    if body.get("model").is_some() {
        return Some("model: Extra inputs are not permitted".into());
    }
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    match (call.method.as_str(), stream) {
        ("rawPredict", false) | ("streamRawPredict", true) => None,
        (m, s) => Some(format!("mock upstream: `{m}` with stream: {s}")),
    }
}

/// Answers one token request: `(status, body)`, registering an issued token in `issued`.
pub(crate) fn token_exchange(issued: &mut Issued, req: &Request, b: &Behavior) -> (u16, String) {
    let oauth_error = |status: u16, error: &str, description: &str| {
        (
            status,
            serde_json::to_string_pretty(
                &json!({"error": error, "error_description": description}),
            )
            .unwrap_or_default(),
        )
    };
    if let Some(status) = b.token_status {
        return oauth_error(
            status,
            "internal_failure",
            "mock upstream: token endpoint failure",
        );
    }
    let form = String::from_utf8_lossy(&req.body);
    let field = |name: &str| {
        form.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            (k == name).then(|| percent_decode(v))
        })
    };
    match field("grant_type").as_deref() {
        Some(JWT_BEARER) => {}
        Some(g) => {
            return oauth_error(
                400,
                "unsupported_grant_type",
                &format!("Invalid grant_type: {g}"),
            )
        }
        None => {
            return oauth_error(
                400,
                "invalid_request",
                "Missing required parameter: grant_type",
            )
        }
    }
    let Some(assertion) = field("assertion") else {
        return oauth_error(
            400,
            "invalid_request",
            "Missing required parameter: assertion",
        );
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if let Err((error, description)) = check_assertion(&assertion, req.path(), b, now) {
        return oauth_error(400, error, &description);
    }
    let lifetime = b.token_lifetime_s.unwrap_or(DEFAULT_LIFETIME_S);
    issued.seq += 1;
    let token = format!("ya29.mock-{}-{:016x}", issued.seq, fastrand::u64(..));
    let now = Instant::now();
    issued.tokens.retain(|_, exp| *exp > now);
    issued
        .tokens
        .insert(token.clone(), now + Duration::from_secs(lifetime));
    (
        200,
        serde_json::to_string_pretty(
            &json!({"access_token": token, "expires_in": lifetime, "token_type": "Bearer"}),
        )
        .unwrap_or_default(),
    )
}

/// Checks a JWT assertion: `Err((oauth error, description))` when refused.
fn check_assertion(
    jwt: &str,
    endpoint_path: &str,
    b: &Behavior,
    now_unix_s: u64,
) -> Result<(), (&'static str, String)> {
    let grant = |d: &str| ("invalid_grant", d.to_string());
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut parts = jwt.split('.');
    let (Some(h), Some(c), Some(sig), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(grant(
            "Invalid JWT: Token must be a short-lived token and in a reasonable timeframe",
        ));
    };
    let json_of =
        |part: &str| -> Option<Value> { serde_json::from_slice(&b64.decode(part).ok()?).ok() };
    let header = json_of(h).ok_or_else(|| grant("Invalid JWT header"))?;
    if header["alg"] != "RS256" {
        return Err(grant("Invalid JWT: the algorithm must be RS256"));
    }
    if header["kid"].as_str().is_none_or(str::is_empty) {
        return Err(grant("Invalid JWT: no kid"));
    }
    let claims = json_of(c).ok_or_else(|| grant("Invalid JWT claims"))?;
    if !claims["iss"].as_str().is_some_and(|s| s.contains('@')) {
        return Err(grant(
            "Invalid JWT: iss must be the service account's email",
        ));
    }
    if !claims["scope"]
        .as_str()
        .is_some_and(|s| s.split(' ').any(|x| x == CLOUD_PLATFORM_SCOPE))
    {
        return Err((
            "invalid_scope",
            "Invalid OAuth scope or ID token audience provided.".into(),
        ));
    }
    if !claims["aud"]
        .as_str()
        .is_some_and(|a| a.starts_with("http") && a.ends_with(endpoint_path))
    {
        return Err(grant("Invalid JWT: aud must be the token endpoint"));
    }
    let (Some(iat), Some(exp)) = (claims["iat"].as_u64(), claims["exp"].as_u64()) else {
        return Err(grant("Invalid JWT: iat and exp are required"));
    };
    if iat > now_unix_s + SKEW_S || exp <= now_unix_s || exp < iat || exp - iat > 3600 {
        return Err(grant(
            "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. Check your iat and exp values in the JWT claim.",
        ));
    }
    let key = b
        .token_public_key
        .as_deref()
        .and_then(rsa_public_key)
        .ok_or_else(|| grant("Invalid JWT Signature."))?;
    let signature = b64
        .decode(sig)
        .map_err(|_| grant("Invalid JWT Signature."))?;
    let signed = &jwt[..h.len() + 1 + c.len()];
    ring::signature::UnparsedPublicKey::new(&ring::signature::RSA_PKCS1_2048_8192_SHA256, key)
        .verify(signed.as_bytes(), &signature)
        .map_err(|_| grant("Invalid JWT Signature."))
}

/// The PKCS#1 `RSAPublicKey` inside a PEM `PUBLIC KEY` (SPKI) block.
fn rsa_public_key(pem: &str) -> Option<Vec<u8>> {
    use x509_parser::prelude::FromDer;
    let body: String = pem
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("-----"))
        .collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(body)
        .ok()?;
    let (_, spki) = x509_parser::x509::SubjectPublicKeyInfo::from_der(&der).ok()?;
    Some(spki.subject_public_key.data.to_vec())
}

/// Decodes `application/x-www-form-urlencoded` text (`+` is a space, `%XX` a byte).
fn percent_decode(v: &str) -> String {
    let bytes = v.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
