//! Owns the SigV4 signature of a Bedrock request, computed by the AWS SDK's signer
//! (`aws-sigv4`) over the final request: method, path, `host`, `content-type` and the
//! body bytes as they go on the wire. Service `bedrock`, the provider's region, the
//! payload's SHA-256 in `x-amz-content-sha256`, the session token (temporary credentials)
//! in `x-amz-security-token`, signed. The path is signed double-encoded, as SigV4 wants
//! for every service but S3: the model id's `:` travels as `%3A` and is signed as `%253A`.
//!
//! The credentials are read once (config load, [`super::credentials`]) into an
//! [`Identity`] that every request shares: no per-request copy of the keys.
//!
//! Reference: <https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_sigv-create-signed-request.html>.

use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    sign, PayloadChecksumKind, SignableBody, SignableRequest, SigningSettings,
};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;

use crate::config::aws::AwsCredentials;

/// The SigV4 service name of the Bedrock runtime API.
pub const SERVICE: &str = "bedrock";

/// Signs requests for one provider: its region and credentials.
pub struct Signer {
    /// The AWS region requests are signed for (`providers.<id>.region`).
    region: String,
    /// The credentials as the signer takes them (built once).
    identity: Identity,
    /// The access key id, for logs (never the secret).
    access_key_id: String,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// A header the signature adds to the request: `(name, value)`.
pub type SignedHeader = (&'static str, String);

impl Signer {
    /// A signer for `region` with `credentials`.
    pub fn new(region: &str, credentials: &AwsCredentials) -> Self {
        let creds = Credentials::new(
            credentials.access_key_id.clone(),
            credentials.secret_access_key.expose().to_string(),
            credentials
                .session_token
                .as_ref()
                .map(|t| t.expose().to_string()),
            None,
            "sluice-config",
        );
        Self {
            region: region.to_string(),
            identity: creds.into(),
            access_key_id: credentials.access_key_id.clone(),
        }
    }

    /// The region requests are signed for.
    pub fn region(&self) -> &str {
        &self.region
    }

    /// The headers that sign a request at `time`: `x-amz-date`, `x-amz-content-sha256`,
    /// `x-amz-security-token` (with a session token) and `authorization`. `path` is the
    /// request target as sent (already percent-encoded, with any query), `headers` the
    /// other headers to sign (`host` required; names lower case).
    ///
    /// # Errors
    /// The signer's message when the request cannot be signed (a path that is no URI, a
    /// header value that is not visible ASCII).
    pub fn sign(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        time: SystemTime,
    ) -> Result<Vec<SignedHeader>, String> {
        let mut settings = SigningSettings::default();
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        let params = v4::SigningParams::builder()
            .identity(&self.identity)
            .region(&self.region)
            .name(SERVICE)
            .time(time)
            .settings(settings)
            .build()
            .map_err(|e| e.to_string())?
            .into();
        let request = SignableRequest::new(
            method,
            path,
            headers.iter().copied(),
            SignableBody::Bytes(body),
        )
        .map_err(|e| e.to_string())?;
        let (instructions, _signature) = sign(request, &params)
            .map_err(|e| e.to_string())?
            .into_parts();
        let (headers, _params) = instructions.into_parts();
        Ok(headers
            .into_iter()
            .map(|h| (h.name(), h.value().to_string()))
            .collect())
    }
}

#[cfg(test)]
mod against_mock;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secret::Secret;

    fn creds(token: Option<&str>) -> AwsCredentials {
        AwsCredentials {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: Secret::new("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into()),
            session_token: token.map(|t| Secret::new(t.into())),
        }
    }

    fn at_vector_time() -> SystemTime {
        // 2015-08-30T12:36:00Z, the aws-sig-v4-test-suite's date.
        SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_440_938_160)
    }

    fn header<'h>(h: &'h [SignedHeader], name: &str) -> Option<&'h str> {
        h.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }

    #[test]
    fn signs_with_payload_hash_date_and_session_token() {
        let s = Signer::new("us-east-1", &creds(Some("tok-123")));
        let h = s
            .sign(
                "POST",
                "/model/us.anthropic.claude-sonnet-4-6-v1%3A0/invoke",
                &[
                    ("host", "bedrock-runtime.us-east-1.amazonaws.com"),
                    ("content-type", "application/json"),
                ],
                b"{}",
                at_vector_time(),
            )
            .unwrap();
        assert_eq!(header(&h, "x-amz-date"), Some("20150830T123600Z"));
        assert_eq!(
            header(&h, "x-amz-content-sha256"),
            Some("44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a")
        );
        assert_eq!(header(&h, "x-amz-security-token"), Some("tok-123"));
        let auth = header(&h, "authorization").unwrap();
        assert!(
            auth.starts_with("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/bedrock/aws4_request, SignedHeaders=content-type;host;x-amz-content-sha256;x-amz-date;x-amz-security-token, Signature="),
            "{auth}"
        );
        assert!(!format!("{s:?}").contains("wJalr"));
    }

    #[test]
    fn no_session_token_no_token_header() {
        let s = Signer::new("us-east-2", &creds(None));
        let h = s
            .sign(
                "POST",
                "/model/m/invoke",
                &[("host", "h")],
                b"",
                at_vector_time(),
            )
            .unwrap();
        assert_eq!(header(&h, "x-amz-security-token"), None);
        assert!(header(&h, "authorization")
            .unwrap()
            .contains("/20150830/us-east-2/bedrock/aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date,"));
    }
}
