//! The verifier against AWS's published SigV4 test vectors (aws-sig-v4-test-suite:
//! access key `AKIDEXAMPLE`, secret `wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY`, region
//! `us-east-1`, service `service`, date `20150830T123600Z`). The gateway's signer (the
//! `aws-sigv4` crate) is checked against this verifier on Bedrock's paths in Sluice's own
//! tests (`src/providers/bedrock/sigv4/against_mock.rs`).

use super::*;

const KEY_ID: &str = "AKIDEXAMPLE";
const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
const DATE: &str = "20150830T123600Z";
const VECTOR_IDS: &[Identity<'static>] = &[(KEY_ID, SECRET, None)];
const EMPTY_HASH: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

fn vector_time() -> SystemTime {
    parse_amz_date(DATE).unwrap()
}

fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

/// One vector: the request, its signed headers and the published signature.
struct Vector {
    name: &'static str,
    method: &'static str,
    target: &'static str,
    headers: &'static [(&'static str, &'static str)],
    body: &'static [u8],
    signed: &'static str,
    signature: &'static str,
}

const VECTORS: &[Vector] = &[
    Vector {
        name: "get-vanilla",
        method: "GET",
        target: "/",
        headers: &[("Host", "example.amazonaws.com"), ("X-Amz-Date", DATE)],
        body: b"",
        signed: "host;x-amz-date",
        signature: "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
    },
    Vector {
        name: "post-vanilla",
        method: "POST",
        target: "/",
        headers: &[("Host", "example.amazonaws.com"), ("X-Amz-Date", DATE)],
        body: b"",
        signed: "host;x-amz-date",
        signature: "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b",
    },
    Vector {
        name: "post-header-key-case",
        method: "POST",
        target: "/",
        headers: &[("HOST", "example.amazonaws.com"), ("x-amz-date", DATE)],
        body: b"",
        signed: "host;x-amz-date",
        signature: "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b",
    },
    Vector {
        name: "get-vanilla-query-order-key-case",
        method: "GET",
        target: "/?Param2=value2&Param1=value1",
        headers: &[("Host", "example.amazonaws.com"), ("X-Amz-Date", DATE)],
        body: b"",
        signed: "host;x-amz-date",
        signature: "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500",
    },
    Vector {
        name: "post-vanilla-query",
        method: "POST",
        target: "/?Param1=value1",
        headers: &[("Host", "example.amazonaws.com"), ("X-Amz-Date", DATE)],
        body: b"",
        signed: "host;x-amz-date",
        signature: "28038455d6de14eafc1f9222cf5aa6f1a96197d7deb8263271d420d138af7f11",
    },
    Vector {
        name: "get-header-value-trim",
        method: "GET",
        target: "/",
        headers: &[
            ("Host", "example.amazonaws.com"),
            ("My-Header1", " value1"),
            ("My-Header2", " \"a   b   c\""),
            ("X-Amz-Date", DATE),
        ],
        body: b"",
        signed: "host;my-header1;my-header2;x-amz-date",
        signature: "acc3ed3afb60bb290fc8d2dd0098b9911fcaa05412b367055dee359757a9c736",
    },
    Vector {
        name: "post-x-www-form-urlencoded",
        method: "POST",
        target: "/",
        headers: &[
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("Host", "example.amazonaws.com"),
            ("Content-Length", "13"),
            (
                "X-Amz-Content-Sha256",
                "9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e",
            ),
            ("X-Amz-Date", DATE),
        ],
        body: b"Param1=value1",
        signed: "content-length;content-type;host;x-amz-content-sha256;x-amz-date",
        signature: "d3875051da38690788ef43de4db0d8f280229d82040bfac253562e56c3f20e0b",
    },
];

fn authorization(key_id: &str, region: &str, service: &str, signed: &str, sig: &str) -> String {
    format!(
        "AWS4-HMAC-SHA256 Credential={key_id}/{}/{region}/{service}/aws4_request, SignedHeaders={signed}, Signature={sig}",
        &DATE[..8]
    )
}

#[test]
fn reproduces_the_published_signatures() {
    for v in VECTORS {
        let headers = h(v.headers);
        let signed: Vec<&str> = v.signed.split(';').collect();
        let hash = hex::encode(Sha256::digest(v.body));
        let creq = canonical_request(v.method, v.target, &headers, &signed, &hash);
        assert_eq!(
            signature(SECRET, DATE, "us-east-1", "service", &creq),
            v.signature,
            "{}: {creq}",
            v.name
        );
        // And the whole check accepts the signed request at the vector's time.
        let mut with_auth = headers.clone();
        with_auth.push((
            "Authorization".into(),
            authorization(KEY_ID, "us-east-1", "service", v.signed, v.signature),
        ));
        verify(
            v.method,
            v.target,
            &with_auth,
            v.body,
            "service",
            vector_time(),
            VECTOR_IDS,
        )
        .unwrap_or_else(|r| panic!("{}: {r:?}", v.name));
    }
}

#[test]
fn the_session_token_vector() {
    // get-vanilla-with-session-token: the token is a signed header.
    const TOKEN: &str = "6e86291e8372ff2a2260956d9b8aae1d763fbf315fa00fa31553b73ebf194267";
    let ids: &[Identity<'static>] = &[(KEY_ID, SECRET, Some(TOKEN))];
    let signed = "host;x-amz-date;x-amz-security-token";
    let sig = "07ec1639c89043aa0e3e2de82b96708f198cceab042d4a97044c66dd9f74e7f8";
    let mut headers = h(&[
        ("Host", "example.amazonaws.com"),
        ("X-Amz-Date", DATE),
        ("X-Amz-Security-Token", TOKEN),
    ]);
    let creq = canonical_request(
        "GET",
        "/",
        &headers,
        &signed.split(';').collect::<Vec<_>>(),
        EMPTY_HASH,
    );
    assert_eq!(signature(SECRET, DATE, "us-east-1", "service", &creq), sig);
    headers.push((
        "Authorization".into(),
        authorization(KEY_ID, "us-east-1", "service", signed, sig),
    ));
    assert_eq!(
        verify("GET", "/", &headers, b"", "service", vector_time(), ids),
        Ok(())
    );
    // Without the token the same identity is refused.
    headers.retain(|(k, _)| k != "X-Amz-Security-Token");
    assert_eq!(
        verify("GET", "/", &headers, b"", "service", vector_time(), ids)
            .unwrap_err()
            .error_type,
        "UnrecognizedClientException"
    );
}

#[test]
fn the_canonical_uri_encodes_segments_again() {
    // double-encode-path: `@` encoded once, an escape `%3D` encoded again.
    assert_eq!(
        canonical_uri("/test/@connections/JBDvjfGEIAMCERw%3D"),
        "/test/%40connections/JBDvjfGEIAMCERw%253D"
    );
    assert_eq!(
        canonical_uri("/model/us.anthropic.claude-sonnet-4-6-v1%3A0/invoke"),
        "/model/us.anthropic.claude-sonnet-4-6-v1%253A0/invoke"
    );
    assert_eq!(canonical_uri(""), "/");
    assert_eq!(canonical_query("b=2&a=&a=1"), "a=&a=1&b=2");
    assert_eq!(canonical_query("x=a%20b"), "x=a%20b");
}

#[test]
fn dates_round_trip() {
    let t = vector_time();
    assert_eq!(
        t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs(),
        1_440_938_160
    );
    assert_eq!(format_amz_date(t), DATE);
    assert_eq!(parse_amz_date("2015-08-30T12:36:00Z"), None);
}
