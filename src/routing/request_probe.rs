//! Owns the request-mode health probe (`providers.<id>.health_check.mode: request`): where a
//! provider's listing endpoint does not prove that a route works (the listing answers 200
//! while the model's chat endpoint answers 503), each route of the provider gets a minimal
//! real request instead: one user message `ping`, at most one output token, not streamed, in
//! the provider's own dialect as the protocol layer encodes it ([`crate::protocol`]), sent to
//! the provider's chat path with its credential.
//!
//! Probe traffic never passes the proxy: it is never metered, never charged to a tenant and
//! never written to the ledger; it is counted in `sluice_health_probes_total{mode="request"}`.
//! Its outcome is the route's own evidence: a success clears the route's failures, a failure
//! counts as one of them.

use bytes::Bytes;
use pingora::connectors::http::Connector;
use pingora::http::RequestHeader;

use super::probe::{down, exchange, ProbeOutcome};
use crate::config::{ActiveHealthCheck, Provider};
use crate::protocol::{self, Message, Part, Role};
use crate::providers;

/// The `x-request-id` of request probes (the provider's logs can tell them apart).
pub const PROBE_REQUEST_ID: &str = "sluice-health-probe";

/// The probe's body for `upstream_model` in `dialect` (the route's): one user message
/// `ping`, `max_output_tokens` 1 (Responses' minimum, 16, there), no stream.
///
/// # Errors
/// Only if the protocol layer cannot encode it for the dialect.
pub fn probe_body(
    provider: &Provider,
    upstream_model: &str,
    dialect: protocol::UpstreamDialect,
) -> Result<Vec<u8>, protocol::ProtocolError> {
    let req = protocol::Request {
        model: upstream_model.to_string(),
        messages: vec![Message {
            role: Role::User,
            parts: vec![Part::Text("ping".into())],
        }],
        max_output_tokens: Some(1),
        ..protocol::Request::default()
    };
    let opts = protocol::UpstreamOptions {
        model: upstream_model,
        default_max_tokens: 1,
        stream_usage: false,
        placement: providers::placement_for(provider, upstream_model),
        thinking: None,
    };
    // The body as the provider takes it (the placement: Bedrock's Claude has no `model`, its
    // `anthropic_version`).
    protocol::encode_request(dialect, &req, &opts)
}

/// Sends one request probe to the route `upstream_model` of `provider` that speaks
/// `dialect`, bounded by `check.timeout` (connect, request and response head together); `up`
/// is the provider resolved (its adapter and live credential).
pub async fn probe_route(
    connector: &Connector,
    provider: &Provider,
    up: &providers::Upstream,
    upstream_model: &str,
    dialect: protocol::UpstreamDialect,
    check: &ActiveHealthCheck,
) -> ProbeOutcome {
    let run = async {
        let target = match providers::target(provider, up).await {
            Ok(t) => t,
            Err(m) => return down(m),
        };
        let body = match probe_body(provider, upstream_model, dialect) {
            Ok(b) => Bytes::from(b),
            Err(e) => return down(format!("cannot encode the probe request: {e}")),
        };
        match probe_head(provider, up, &target, upstream_model, dialect, &body) {
            Ok(head) => exchange(connector, &target, head, Some(body)).await,
            Err(e) => down(format!("bad probe request: {e}")),
        }
    };
    match tokio::time::timeout(check.timeout, run).await {
        Ok(outcome) => outcome,
        Err(_) => down(format!("no answer within {} ms", check.timeout.as_millis())),
    }
}

/// `POST {base_path}{inference path}` for `upstream_model` (non-streaming), the same head a
/// client request gets (auth, framing).
fn probe_head(
    provider: &Provider,
    up: &providers::Upstream,
    target: &providers::Target,
    upstream_model: &str,
    dialect: protocol::UpstreamDialect,
    body: &[u8],
) -> pingora::Result<RequestHeader> {
    providers::request_head(
        provider,
        up,
        target,
        &providers::path_for(provider, upstream_model, dialect, false),
        body,
        false,
        PROBE_REQUEST_ID,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{HopTimeouts, PassiveHealth, ProviderKind};
    use std::time::Duration;

    fn provider(kind: ProviderKind) -> Provider {
        Provider {
            id: "rp".into(),
            kind,
            endpoint: None,
            api_key: None,
            ca: None,
            api_version: None,
            aws: None,
            h2_stream_window: 65536,
            timeouts: HopTimeouts::uniform(Duration::from_secs(1)),
            health_check: None,
            passive_health: PassiveHealth::default(),
            stream_usage: true,
            max_concurrent_requests: None,
            vertex: None,
            token_source: None,
        }
    }

    #[test]
    fn the_probe_asks_for_one_token_in_the_providers_dialect() {
        let chat: serde_json::Value = serde_json::from_slice(
            &probe_body(
                &provider(ProviderKind::Openai),
                "gpt-x",
                protocol::UpstreamDialect::ChatCompletions,
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(chat["model"], "gpt-x");
        assert_eq!(chat["messages"][0]["role"], "user");
        assert_eq!(chat["messages"][0]["content"][0]["text"], "ping");
        assert!(chat.get("stream_options").is_none(), "{chat}");
        let one = chat
            .get("max_tokens")
            .or_else(|| chat.get("max_completion_tokens"));
        assert_eq!(one, Some(&serde_json::json!(1)), "{chat}");

        let msgs: serde_json::Value = serde_json::from_slice(
            &probe_body(
                &provider(ProviderKind::Anthropic),
                "claude-x",
                protocol::UpstreamDialect::Messages,
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(msgs["model"], "claude-x");
        assert_eq!(msgs["max_tokens"], 1);
        assert_eq!(msgs["messages"][0]["role"], "user");
        assert_ne!(msgs["stream"], true);

        // A route with `api: responses` is probed in Responses, at its smallest limit.
        let resp: serde_json::Value = serde_json::from_slice(
            &probe_body(
                &provider(ProviderKind::Openai),
                "gpt-x",
                protocol::UpstreamDialect::Responses,
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(resp["input"][0]["content"][0]["text"], "ping", "{resp}");
        assert_eq!(resp["max_output_tokens"], 16, "{resp}");
        assert_eq!(resp["store"], false, "{resp}");
        assert_eq!(
            providers::path_for(
                &provider(ProviderKind::Openai),
                "gpt-x",
                protocol::UpstreamDialect::Responses,
                false
            ),
            "/responses"
        );
    }
}
