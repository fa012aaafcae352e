//! Owns how Sluice addresses AWS Bedrock (`kind: bedrock`): the runtime endpoint of the
//! region, the `InvokeModel` / `InvokeModelWithResponseStream` and `Converse` /
//! `ConverseStream` paths with the model id in the path, the Anthropic Messages body as
//! Bedrock takes it (no `model`, no `stream`, `anthropic_version: "bedrock-2023-05-31"`),
//! the SigV4 signer ([`sigv4`]) with the credentials of the AWS chain ([`credentials`]), the
//! binary stream framing ([`eventstream`]) and Bedrock's error answers.
//!
//! Which models ([`dialect`]): Anthropic Claude models (an upstream model id with
//! `anthropic.` in it: `anthropic.claude-…`, the cross-region profiles
//! `us.anthropic.claude-…`, `global.anthropic.claude-…`, or their inference-profile ARNs)
//! speak the Messages dialect through `InvokeModel`; every other model (`amazon.nova-…`,
//! `meta.llama…`, `mistral.…`, ...) speaks the Converse dialect
//! ([`crate::protocol::converse`]) through `Converse` / `ConverseStream`, both signed and
//! framed alike.
//!
//! Errors (HTTP, `x-amzn-ErrorType` header, `{"message": ...}` body), as every provider's:
//! `ThrottlingException` and `ModelNotReadyException` (429), `ServiceUnavailableException`
//! (503), `InternalServerException` (500), `ModelTimeoutException` (408) fall back to the
//! next route; `ModelErrorException` (424, the model failed on this request) counts as a 502
//! and falls back too; `ValidationException` (400) and `ResourceNotFoundException` (404)
//! reach the client; `AccessDeniedException`, `UnrecognizedClientException` and signature
//! errors (403) are the gateway's credentials: fall back, the client gets 502.
//!
//! References: <https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_InvokeModel.html>,
//! <https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_Converse.html>,
//! <https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_ConverseStream.html>,
//! <https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_InvokeModelWithResponseStream.html>,
//! <https://docs.aws.amazon.com/bedrock/latest/userguide/model-parameters-anthropic-claude-messages.html>
//! (the body), <https://docs.aws.amazon.com/general/latest/gr/bedrock.html> (endpoints).

pub use crate::config::aws as credentials;
pub use crate::config::aws::{default_base_url, valid_region};
pub mod eventstream;
pub mod sigv4;

use std::borrow::Cow;

use pingora::http::RequestHeader;

use super::adapter::{Adapter, Credential};
use crate::config::kinds::push_segment;
use crate::config::Provider;
use crate::protocol::{ModelPlacement, UpstreamDialect};
use eventstream::EventStreamDecoder;

/// The `anthropic_version` member Bedrock's Claude models require in the body.
pub const ANTHROPIC_VERSION: &str = "bedrock-2023-05-31";

/// The `Accept` of a streamed request: AWS's event-stream framing.
pub const EVENT_STREAM_CONTENT_TYPE: &str = "application/vnd.amazon.eventstream";

/// Members of a Messages body Bedrock's Claude models do not take besides `model` (a
/// `ValidationException` "extraneous key" otherwise): the stream choice (the path names it,
/// as it names the model), and `metadata` / `service_tier`, which only Anthropic's own API
/// has (tracing and capacity hints, harmless to drop).
pub const DROPPED_MEMBERS: &[&str] = &["stream", "metadata", "service_tier"];

/// The shape of `model`'s request body: a Claude model's Messages body names no model,
/// carries [`ANTHROPIC_VERSION`] and leaves out [`DROPPED_MEMBERS`]; a Converse body names
/// no model anyway ([`ModelPlacement::Body`]: nothing to change).
pub fn model_placement(model: &str) -> ModelPlacement {
    if is_anthropic(model) {
        ModelPlacement::Path {
            anthropic_version: ANTHROPIC_VERSION,
            dropped: DROPPED_MEMBERS,
        }
    } else {
        ModelPlacement::Body
    }
}

/// Whether an upstream model id names an Anthropic model (served by `InvokeModel` in
/// the Messages dialect).
pub fn is_anthropic(model: &str) -> bool {
    model.starts_with("anthropic.")
        || model.contains(".anthropic.")
        || model.contains("/anthropic.")
}

/// The dialect Bedrock serves `model` in: Messages (`InvokeModel`) for an Anthropic model,
/// Converse for every other.
pub fn dialect(model: &str) -> UpstreamDialect {
    if is_anthropic(model) {
        UpstreamDialect::Messages
    } else {
        UpstreamDialect::Converse
    }
}

/// The path of the method that serves `model` ([`dialect`]): [`invoke_path`] for an
/// Anthropic model, [`converse_path`] for every other.
pub fn method_path(model: &str, stream: bool) -> String {
    if is_anthropic(model) {
        invoke_path(model, stream)
    } else {
        converse_path(model, stream)
    }
}

/// The path of the Converse method for `model`: `/model/{id}/converse-stream` for a
/// stream, `/model/{id}/converse` otherwise, the id percent-encoded as one segment (as in
/// [`invoke_path`]).
pub fn converse_path(model: &str, stream: bool) -> String {
    let mut p = String::with_capacity(40 + model.len());
    p.push_str("/model/");
    push_segment(&mut p, model);
    p.push_str(if stream {
        "/converse-stream"
    } else {
        "/converse"
    });
    p
}

/// The path of the invoke method for `model`: `/model/{id}/invoke-with-response-stream`
/// for a stream, `/model/{id}/invoke` otherwise, the id percent-encoded as one segment
/// (`:` as `%3A`, `/` of an ARN as `%2F`).
pub fn invoke_path(model: &str, stream: bool) -> String {
    let mut p = String::with_capacity(40 + model.len());
    p.push_str("/model/");
    push_segment(&mut p, model);
    p.push_str(if stream {
        "/invoke-with-response-stream"
    } else {
        "/invoke"
    });
    p
}

/// The status an error answer counts as: a `ModelErrorException` (424: the model failed
/// while processing this request) is a 502, a provider failure that falls back; every
/// other keeps its status.
pub fn error_status(status: u16) -> u16 {
    if status == 424 {
        502
    } else {
        status
    }
}

/// The message of a Bedrock error body (`{"message": ...}`, some services spell it
/// `Message`); `None` when the body is not that JSON.
pub fn error_message(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Body {
        #[serde(alias = "Message")]
        message: Option<String>,
    }
    serde_json::from_slice::<Body>(body)
        .ok()
        .and_then(|b| b.message)
}

/// The adapter of `kind: bedrock`: Claude models in Messages (`InvokeModel`, the model in
/// the URL, the client's betas in the body), the others in Converse; every request signed
/// with SigV4; streams in AWS's binary event stream, unframed to SSE.
#[derive(Debug)]
pub struct Bedrock;

impl Adapter for Bedrock {
    fn base_dialect(&self) -> UpstreamDialect {
        UpstreamDialect::Messages
    }

    fn dialect(&self, upstream_model: &str) -> UpstreamDialect {
        dialect(upstream_model)
    }

    fn path(&self, _: &Provider, upstream_model: &str, stream: bool) -> Cow<'static, str> {
        method_path(upstream_model, stream).into()
    }

    fn placement(&self, upstream_model: &str) -> ModelPlacement {
        model_placement(upstream_model)
    }

    fn stream_accept(&self) -> &'static str {
        EVENT_STREAM_CONTENT_TYPE
    }

    fn credential(&self, provider: &Provider) -> Credential {
        match &provider.aws {
            Some(a) => Credential::Sigv4(sigv4::Signer::new(&a.region, &a.credentials)),
            None => Credential::None,
        }
    }

    fn authorize(
        &self,
        _: &Provider,
        credential: &Credential,
        req: &mut RequestHeader,
        body: &[u8],
    ) -> pingora::Result<()> {
        match credential {
            Credential::Sigv4(signer) => sign_aws(signer, req, body),
            _ => Ok(()),
        }
    }

    fn add_client_betas(
        &self,
        upstream_model: &str,
        body: Vec<u8>,
        anthropic_beta: &str,
    ) -> serde_json::Result<Vec<u8>> {
        if is_anthropic(upstream_model) {
            super::body_with_betas(body, anthropic_beta)
        } else {
            Ok(body)
        }
    }

    fn error_status(&self, status: u16, _: &[u8]) -> u16 {
        error_status(status)
    }

    fn error_parts(
        &self,
        upstream: UpstreamDialect,
        status: u16,
        body: &[u8],
    ) -> (String, Option<String>, String) {
        match error_message(body) {
            Some(message) => (
                crate::protocol::ErrorKind::from_status(status)
                    .openai_type()
                    .to_string(),
                None,
                message,
            ),
            None => super::adapter::error_parts(upstream, status, body),
        }
    }

    fn unframer(
        &self,
        dialect: UpstreamDialect,
        max_event_bytes: usize,
    ) -> Option<EventStreamDecoder> {
        Some(match dialect {
            UpstreamDialect::Converse => EventStreamDecoder::converse(max_event_bytes),
            _ => EventStreamDecoder::new(max_event_bytes),
        })
    }
}

/// Signs `req` with SigV4 and adds the signature's headers.
fn sign_aws(signer: &sigv4::Signer, req: &mut RequestHeader, body: &[u8]) -> pingora::Result<()> {
    let path = req
        .uri
        .path_and_query()
        .map_or("/", http::uri::PathAndQuery::as_str);
    let header = |name: &str| req.headers.get(name).and_then(|v| v.to_str().ok());
    let mut signed: [(&str, &str); 2] = [("host", ""), ("content-type", "")];
    let mut n = 0;
    for name in ["host", "content-type"] {
        if let Some(v) = header(name) {
            signed[n] = (name, v);
            n += 1;
        }
    }
    let headers = signer
        .sign(
            req.method.as_str(),
            path,
            &signed[..n],
            body,
            std::time::SystemTime::now(),
        )
        .map_err(|e| {
            pingora::Error::explain(
                pingora::ErrorType::InternalError,
                format!("cannot sign the Bedrock request: {e}"),
            )
        })?;
    for (name, value) in headers {
        req.insert_header(name, value)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_encode_the_model_id_as_one_segment() {
        assert_eq!(
            invoke_path("us.anthropic.claude-sonnet-4-6-v1:0", false),
            "/model/us.anthropic.claude-sonnet-4-6-v1%3A0/invoke"
        );
        assert_eq!(
            invoke_path("anthropic.claude-3-haiku-20240307-v1:0", true),
            "/model/anthropic.claude-3-haiku-20240307-v1%3A0/invoke-with-response-stream"
        );
        assert_eq!(
            invoke_path("arn:aws:bedrock:us-east-1:1:inference-profile/us.anthropic.c", false),
            "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A1%3Ainference-profile%2Fus.anthropic.c/invoke"
        );
    }

    #[test]
    fn claude_invokes_and_every_other_model_converses() {
        assert_eq!(
            method_path("amazon.nova-pro-v1:0", false),
            "/model/amazon.nova-pro-v1%3A0/converse"
        );
        assert_eq!(
            method_path("meta.llama3-3-70b-instruct-v1:0", true),
            "/model/meta.llama3-3-70b-instruct-v1%3A0/converse-stream"
        );
        assert_eq!(
            method_path("us.anthropic.claude-sonnet-4-6-v1:0", true),
            "/model/us.anthropic.claude-sonnet-4-6-v1%3A0/invoke-with-response-stream"
        );
        assert_eq!(
            dialect("mistral.mistral-large-2407-v1:0"),
            UpstreamDialect::Converse
        );
        assert_eq!(
            dialect("anthropic.claude-3-haiku-20240307-v1:0"),
            UpstreamDialect::Messages
        );
    }

    #[test]
    fn claude_bodies_lose_model_and_stream_both_ways() {
        use crate::protocol::{Message, Part, Request, Role, UpstreamOptions};
        let placement = model_placement("us.anthropic.claude-sonnet-4-6-v1:0");
        assert_eq!(
            model_placement("amazon.nova-pro-v1:0"),
            ModelPlacement::Body
        );
        let check = |body: &[u8]| {
            let v: serde_json::Value = serde_json::from_slice(body).expect("JSON");
            assert_eq!(v["anthropic_version"], ANTHROPIC_VERSION, "{v}");
            for absent in ["model", "stream", "metadata", "service_tier"] {
                assert!(v.get(absent).is_none(), "{absent}: {v}");
            }
            assert_eq!(v["max_tokens"], 5, "{v}");
        };
        // A Messages client's own body…
        let client = serde_json::json!({"model": "acme/c", "stream": true, "max_tokens": 5,
            "metadata": {"user_id": "u"}, "service_tier": "auto", "anthropic_version": "x",
            "messages": [{"role": "user", "content": "hi"}]});
        check(
            &super::super::passthrough_body_placed(
                client.as_object().expect("object"),
                "us.anthropic.claude-sonnet-4-6-v1:0",
                false,
                placement,
            )
            .expect("body"),
        );
        // …and one the protocol layer encodes from another dialect.
        let req = Request {
            messages: vec![Message {
                role: Role::User,
                parts: vec![Part::Text("hi".into())],
            }],
            max_output_tokens: Some(5),
            user: Some("u".into()),
            stream: true,
            ..Request::default()
        };
        let opts = UpstreamOptions {
            model: "us.anthropic.claude-sonnet-4-6-v1:0",
            default_max_tokens: 5,
            stream_usage: false,
            placement,
            thinking: None,
        };
        check(
            &crate::protocol::encode_request(UpstreamDialect::Messages, &req, &opts)
                .expect("encodes"),
        );
    }

    #[test]
    fn models_regions_and_errors() {
        assert!(is_anthropic("us.anthropic.claude-sonnet-4-6-v1:0"));
        assert!(is_anthropic("anthropic.claude-3-haiku-20240307-v1:0"));
        assert!(is_anthropic(
            "arn:aws:bedrock:us-east-1:1:inference-profile/global.anthropic.x"
        ));
        assert!(!is_anthropic("amazon.nova-pro-v1:0"));
        assert!(!is_anthropic("meta.llama3-70b-instruct-v1:0"));
        assert!(valid_region("us-east-2"));
        assert!(valid_region("us-gov-west-1"));
        assert!(!valid_region("US-EAST-1"));
        assert!(!valid_region("us-east-1.evil.com"));
        assert!(!valid_region(""));
        assert_eq!(
            default_base_url("eu-west-1"),
            "https://bedrock-runtime.eu-west-1.amazonaws.com"
        );
        assert_eq!(error_status(424), 502);
        assert_eq!(error_status(429), 429);
        assert_eq!(
            error_message(br#"{"message":"Too many requests, please wait before trying again."}"#)
                .as_deref(),
            Some("Too many requests, please wait before trying again.")
        );
        assert_eq!(error_message(b"<html>"), None);
    }

    #[test]
    fn the_config_contract_keeps_region_and_aws_profile_to_bedrock() {
        for (section, key) in [
            (
                "    kind: openai\n    base_url: https://api.openai.com/v1\n    region: us-east-2\n",
                "providers.p.region",
            ),
            (
                "    kind: anthropic\n    base_url: https://api.anthropic.com/v1\n    aws_profile: dev\n",
                "providers.p.aws_profile",
            ),
            ("    kind: bedrock\n", "providers.p"),
            ("    kind: bedrock\n    region: us_east_2\n", "providers.p.region"),
            (
                "    kind: bedrock\n    region: us-east-2\n    api_key: k\n",
                "providers.p.api_key",
            ),
        ] {
            let e = super::super::azure::tests::config(section).expect_err(section);
            assert_eq!(e.key_path, key, "{section}: {e}");
        }
    }
}
