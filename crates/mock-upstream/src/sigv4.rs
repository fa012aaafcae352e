//! The mock's own SigV4 verifier, written from AWS's specification and independent of the
//! `aws-sigv4` crate the gateway signs with (so a signing bug on one side is not mirrored
//! on the other): canonical request, string to sign, the derived HMAC-SHA256 key and the
//! signature, checked against AWS's published test vectors in the unit tests.
//!
//! What it checks, as Bedrock does: an `Authorization` header of algorithm
//! `AWS4-HMAC-SHA256`; a known access key id (and, for temporary credentials, the session
//! token in a signed `x-amz-security-token`); the credential scope's date, service
//! (`bedrock`) and terminator; `x-amz-date` within 5 minutes of the mock's clock; `host`
//! among the signed headers; an `x-amz-content-sha256`, when sent, equal to the body's
//! hash; and the signature itself.
//!
//! Reference: <https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_sigv-create-signed-request.html>
//! (canonical request: method, canonical URI with each path segment URI-encoded again for
//! every service but S3, canonical query sorted by name, lower-case trimmed headers,
//! signed header list, hex SHA-256 of the payload).

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// The long-term test identity the mock knows: access key id.
pub const MOCK_AWS_ACCESS_KEY_ID: &str = "AKIAMOCKSLUICE000001";
/// The long-term test identity's secret access key.
pub const MOCK_AWS_SECRET_ACCESS_KEY: &str = "mOcKsEcReT/K7MDENG+bPxRfiCYSLUICEKEY01";
/// The temporary test identity (needs [`MOCK_AWS_SESSION_TOKEN`]): access key id.
pub const MOCK_AWS_TEMP_ACCESS_KEY_ID: &str = "ASIAMOCKSLUICE000002";
/// The temporary test identity's secret access key.
pub const MOCK_AWS_TEMP_SECRET_ACCESS_KEY: &str = "tEmPsEcReT/K7MDENG+bPxRfiCYSLUICEKEY02";
/// The temporary test identity's session token.
pub const MOCK_AWS_SESSION_TOKEN: &str = "IQoJb3JpZ2luX2VjEMOCK//sluice+session/token==";

/// Most a request's `x-amz-date` may be off the mock's clock.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(5 * 60);

/// An identity the verifier accepts: `(access key id, secret, session token)`.
pub type Identity<'a> = (&'a str, &'a str, Option<&'a str>);

/// The identities the mock knows.
pub const IDENTITIES: &[Identity<'static>] = &[
    (MOCK_AWS_ACCESS_KEY_ID, MOCK_AWS_SECRET_ACCESS_KEY, None),
    (
        MOCK_AWS_TEMP_ACCESS_KEY_ID,
        MOCK_AWS_TEMP_SECRET_ACCESS_KEY,
        Some(MOCK_AWS_SESSION_TOKEN),
    ),
];

/// Why a request's signature is refused: Bedrock's 403 error type and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// `x-amzn-ErrorType`: `MissingAuthenticationTokenException`,
    /// `UnrecognizedClientException`, `InvalidSignatureException`,
    /// `IncompleteSignatureException`.
    pub error_type: &'static str,
    /// The `message` of the body.
    pub message: String,
}

fn refuse(error_type: &'static str, message: impl Into<String>) -> Refusal {
    Refusal {
        error_type,
        message: message.into(),
    }
}

/// The signature check of one request. `target` is the request target as received (path
/// and query, percent-encoded as sent), `headers` all its headers, `service` the expected
/// SigV4 service name.
///
/// # Errors
/// The [`Refusal`] Bedrock answers (always with 403).
pub fn verify(
    method: &str,
    target: &str,
    headers: &[(String, String)],
    body: &[u8],
    service: &str,
    now: SystemTime,
    identities: &[Identity<'_>],
) -> Result<(), Refusal> {
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    };
    let Some(auth) = header("authorization") else {
        return Err(refuse(
            "MissingAuthenticationTokenException",
            "Missing Authentication Token",
        ));
    };
    let auth = parse_authorization(auth)?;
    let Some(&(_, secret, token)) = identities.iter().find(|(id, _, _)| *id == auth.key_id) else {
        return Err(refuse(
            "UnrecognizedClientException",
            "The security token included in the request is invalid.",
        ));
    };
    let signed: Vec<&str> = auth.signed_headers.split(';').collect();
    if let Some(expected) = token {
        let sent = header("x-amz-security-token");
        if sent != Some(expected) || !signed.contains(&"x-amz-security-token") {
            return Err(refuse(
                "UnrecognizedClientException",
                "The security token included in the request is invalid.",
            ));
        }
    }
    if !signed.contains(&"host") {
        return Err(refuse(
            "InvalidSignatureException",
            "'Host' or ':authority' must be a 'SignedHeader' in the AWS Authorization.",
        ));
    }
    let Some(date) = header("x-amz-date") else {
        return Err(refuse(
            "IncompleteSignatureException",
            "Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header.",
        ));
    };
    let Some(at) = parse_amz_date(date) else {
        return Err(refuse(
            "IncompleteSignatureException",
            format!("Date must be in ISO-8601 'basic format'. Got '{date}'."),
        ));
    };
    let skew = now
        .duration_since(at)
        .or_else(|_| at.duration_since(now))
        .unwrap_or_default();
    if skew > MAX_CLOCK_SKEW {
        let now_s = format_amz_date(now);
        let message = if at < now {
            let limit = format_amz_date(now - MAX_CLOCK_SKEW);
            format!("Signature expired: {date} is now earlier than {limit} ({now_s} - 5 min.)")
        } else {
            let limit = format_amz_date(now + MAX_CLOCK_SKEW);
            format!(
                "Signature not yet current: {date} is still later than {limit} ({now_s} + 5 min.)"
            )
        };
        return Err(refuse("InvalidSignatureException", message));
    }
    if auth.date != &date[..8] || auth.terminator != "aws4_request" {
        return Err(refuse(
            "InvalidSignatureException",
            format!(
                "Credential should be scoped to a valid date, not '{}'.",
                auth.date
            ),
        ));
    }
    if auth.service != service {
        return Err(refuse(
            "InvalidSignatureException",
            format!("Credential should be scoped to correct service: '{service}'. "),
        ));
    }
    let payload_hash = hex::encode(Sha256::digest(body));
    if header("x-amz-content-sha256").is_some_and(|h| h != payload_hash) {
        return Err(refuse(
            "InvalidSignatureException",
            "The provided 'x-amz-content-sha256' header does not match what was computed.",
        ));
    }
    let creq = canonical_request(method, target, headers, &signed, &payload_hash);
    let expected = signature(secret, date, auth.region, auth.service, &creq);
    if expected != auth.signature {
        return Err(refuse(
            "InvalidSignatureException",
            "The request signature we calculated does not match the signature you provided. Check your AWS Secret Access Key and signing method. Consult the service documentation for details.",
        ));
    }
    Ok(())
}

/// The parts of an `Authorization: AWS4-HMAC-SHA256 Credential=…, SignedHeaders=…,
/// Signature=…` header.
struct Authorization<'a> {
    key_id: &'a str,
    date: &'a str,
    region: &'a str,
    service: &'a str,
    terminator: &'a str,
    signed_headers: &'a str,
    signature: &'a str,
}

fn parse_authorization(value: &str) -> Result<Authorization<'_>, Refusal> {
    let incomplete = || {
        refuse(
            "IncompleteSignatureException",
            format!("Authorization header requires 'Credential', 'Signature' and 'SignedHeaders' parameters. Authorization={value}"),
        )
    };
    let rest = value
        .strip_prefix("AWS4-HMAC-SHA256 ")
        .ok_or_else(incomplete)?;
    let (mut credential, mut signed, mut sig) = (None, None, None);
    for part in rest.split(',') {
        let Some((k, v)) = part.trim().split_once('=') else {
            return Err(incomplete());
        };
        match k {
            "Credential" => credential = Some(v),
            "SignedHeaders" => signed = Some(v),
            "Signature" => sig = Some(v),
            _ => return Err(incomplete()),
        }
    }
    let (credential, signed_headers, signature) = match (credential, signed, sig) {
        (Some(c), Some(h), Some(s)) => (c, h, s),
        _ => return Err(incomplete()),
    };
    let mut scope = credential.split('/');
    let (Some(key_id), Some(date), Some(region), Some(service), Some(terminator), None) = (
        scope.next(),
        scope.next(),
        scope.next(),
        scope.next(),
        scope.next(),
        scope.next(),
    ) else {
        return Err(refuse(
            "IncompleteSignatureException",
            format!("Credential should have 5 parts: '{credential}'"),
        ));
    };
    Ok(Authorization {
        key_id,
        date,
        region,
        service,
        terminator,
        signed_headers,
        signature,
    })
}

/// Whether `b` is an RFC 3986 unreserved character (never encoded).
fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// URI-encodes every byte but the unreserved ones (and `/` when `keep_slash`).
fn uri_encode(s: &str, keep_slash: bool, out: &mut String) {
    for b in s.bytes() {
        if unreserved(b) || (keep_slash && b == b'/') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
}

/// Decodes `%XX` escapes (invalid ones kept as is): SigV4 query names and values are
/// encoded again after one decode.
fn percent_decode(s: &str) -> String {
    let hexval = |c: u8| {
        char::from(c)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 3 <= b.len() {
            if let (Some(h), Some(l)) = (hexval(b[i + 1]), hexval(b[i + 2])) {
                out.push(h * 16 + l);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The canonical URI of a request path as sent: each segment encoded once more (`%` becomes
/// `%25`), `/` kept; an empty path is `/`.
pub fn canonical_uri(path: &str) -> String {
    if path.is_empty() {
        return "/".into();
    }
    let mut out = String::with_capacity(path.len() + 16);
    uri_encode(path, true, &mut out);
    out
}

/// The canonical query string: each `name=value` decoded then encoded strictly, sorted by
/// name then value, joined with `&`; a name without `=` has an empty value.
pub fn canonical_query(query: &str) -> String {
    let mut pairs: Vec<(String, String)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            let (mut ek, mut ev) = (String::new(), String::new());
            uri_encode(&percent_decode(k), false, &mut ek);
            uri_encode(&percent_decode(v), false, &mut ev);
            (ek, ev)
        })
        .collect();
    pairs.sort();
    let mut out = String::new();
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        out.push_str(k);
        out.push('=');
        out.push_str(v);
    }
    out
}

/// A header value as SigV4 canonicalizes it: trimmed, inner runs of spaces as one.
fn canonical_value(v: &str) -> String {
    v.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The canonical request text.
pub fn canonical_request(
    method: &str,
    target: &str,
    headers: &[(String, String)],
    signed: &[&str],
    payload_hash: &str,
) -> String {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut out = String::with_capacity(256);
    out.push_str(method);
    out.push('\n');
    out.push_str(&canonical_uri(path));
    out.push('\n');
    out.push_str(&canonical_query(query));
    out.push('\n');
    let mut names: Vec<&str> = signed.to_vec();
    names.sort_unstable();
    for name in &names {
        let values: Vec<String> = headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| canonical_value(v))
            .collect();
        out.push_str(name);
        out.push(':');
        out.push_str(&values.join(","));
        out.push('\n');
    }
    out.push('\n');
    out.push_str(&names.join(";"));
    out.push('\n');
    out.push_str(payload_hash);
    out
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    // HMAC takes keys of any length.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// The hex signature of a canonical request signed at `amz_date` (`YYYYMMDDTHHMMSSZ`) for
/// `region` and `service` with `secret`.
pub fn signature(secret: &str, amz_date: &str, region: &str, service: &str, creq: &str) -> String {
    let date = &amz_date[..amz_date.len().min(8)];
    let scope = format!("{date}/{region}/{service}/aws4_request");
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex::encode(Sha256::digest(creq.as_bytes()))
    );
    let k_date = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    let k_region = hmac(&k_date, region.as_bytes());
    let k_service = hmac(&k_region, service.as_bytes());
    let k_signing = hmac(&k_service, b"aws4_request");
    hex::encode(hmac(&k_signing, string_to_sign.as_bytes()))
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Parses `YYYYMMDDTHHMMSSZ`.
pub fn parse_amz_date(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(4..6)?, num(6..8)?);
    let (h, mi, se) = (num(9..11)?, num(11..13)?, num(13..15)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + se;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).ok()?))
}

/// Formats a time as `YYYYMMDDTHHMMSSZ`.
pub fn format_amz_date(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Civil from days (Hinnant).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests;
