//! The gateway's signer (the `aws-sigv4` crate) against the mock upstream's own SigV4
//! verifier ([`sluice_mock_upstream::sigv4`], written from AWS's published algorithm and
//! checked there against AWS's test vectors) on Bedrock's paths: what the signer sends is
//! what AWS accepts, and a wrong secret, a changed body, a stale or future date or an unknown
//! key are refused as Bedrock refuses them.

use std::time::{Duration, SystemTime};

use sluice_mock_upstream::sigv4::{
    verify, IDENTITIES, MOCK_AWS_ACCESS_KEY_ID, MOCK_AWS_SECRET_ACCESS_KEY, MOCK_AWS_SESSION_TOKEN,
    MOCK_AWS_TEMP_ACCESS_KEY_ID, MOCK_AWS_TEMP_SECRET_ACCESS_KEY,
};

fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

/// A request signed by the gateway's signer (`aws-sigv4`), as `(headers, body)`.
fn gateway_signed(
    key_id: &str,
    secret: &str,
    token: Option<&str>,
    time: SystemTime,
    body: &[u8],
) -> Vec<(String, String)> {
    let creds = crate::providers::bedrock::credentials::AwsCredentials {
        access_key_id: key_id.into(),
        secret_access_key: crate::secret::Secret::new(secret.into()),
        session_token: token.map(|t| crate::secret::Secret::new(t.into())),
    };
    let signer = crate::providers::bedrock::sigv4::Signer::new("us-east-2", &creds);
    let base = [
        ("host", "bedrock-runtime.us-east-2.amazonaws.com"),
        ("content-type", "application/json"),
    ];
    let mut headers = h(&base);
    for (k, v) in signer
        .sign("POST", BEDROCK_PATH, &base, body, time)
        .unwrap()
    {
        headers.push((k.to_string(), v));
    }
    headers
}

const BEDROCK_PATH: &str =
    "/model/us.anthropic.claude-sonnet-4-6-v1%3A0/invoke-with-response-stream";

#[test]
fn accepts_the_gateway_signer_and_refuses_wrong_or_stale_signatures() {
    let now = SystemTime::now();
    let body = br#"{"anthropic_version":"bedrock-2023-05-31","max_tokens":5,"messages":[]}"#;
    let check = |headers: &[(String, String)], body: &[u8], at: SystemTime| {
        verify(
            "POST",
            BEDROCK_PATH,
            headers,
            body,
            "bedrock",
            at,
            IDENTITIES,
        )
    };
    let good = gateway_signed(
        MOCK_AWS_ACCESS_KEY_ID,
        MOCK_AWS_SECRET_ACCESS_KEY,
        None,
        now,
        body,
    );
    assert_eq!(check(&good, body, now), Ok(()));
    // Temporary credentials with their session token.
    let temp = gateway_signed(
        MOCK_AWS_TEMP_ACCESS_KEY_ID,
        MOCK_AWS_TEMP_SECRET_ACCESS_KEY,
        Some(MOCK_AWS_SESSION_TOKEN),
        now,
        body,
    );
    assert_eq!(check(&temp, body, now), Ok(()));
    // A wrong secret, a changed body, a stale or future date, an unknown key.
    let wrong = gateway_signed(MOCK_AWS_ACCESS_KEY_ID, "not-the-secret", None, now, body);
    let r = check(&wrong, body, now).unwrap_err();
    assert_eq!(r.error_type, "InvalidSignatureException");
    assert!(r
        .message
        .starts_with("The request signature we calculated does not match"));
    assert_eq!(
        check(&good, b"{}", now).unwrap_err().error_type,
        "InvalidSignatureException"
    );
    let stale = gateway_signed(
        MOCK_AWS_ACCESS_KEY_ID,
        MOCK_AWS_SECRET_ACCESS_KEY,
        None,
        now - Duration::from_secs(6 * 60),
        body,
    );
    let r = check(&stale, body, now).unwrap_err();
    assert!(
        r.message.starts_with("Signature expired: "),
        "{}",
        r.message
    );
    let within = gateway_signed(
        MOCK_AWS_ACCESS_KEY_ID,
        MOCK_AWS_SECRET_ACCESS_KEY,
        None,
        now - Duration::from_secs(4 * 60),
        body,
    );
    assert_eq!(check(&within, body, now), Ok(()));
    let future = gateway_signed(
        MOCK_AWS_ACCESS_KEY_ID,
        MOCK_AWS_SECRET_ACCESS_KEY,
        None,
        now + Duration::from_secs(6 * 60),
        body,
    );
    assert!(check(&future, body, now)
        .unwrap_err()
        .message
        .starts_with("Signature not yet current: "));
    let unknown = gateway_signed("AKIAUNKNOWN", MOCK_AWS_SECRET_ACCESS_KEY, None, now, body);
    assert_eq!(
        check(&unknown, body, now).unwrap_err().error_type,
        "UnrecognizedClientException"
    );
    assert_eq!(
        check(&h(&[("host", "x")]), body, now)
            .unwrap_err()
            .error_type,
        "MissingAuthenticationTokenException"
    );
}
