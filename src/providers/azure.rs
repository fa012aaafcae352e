//! Owns how Sluice addresses Azure OpenAI (`kind: azure_openai`): the deployments URL, the
//! `api-key` header and the model-list path of the health probe. The wire format is OpenAI
//! Chat Completions ([`crate::protocol::chat`]); Azure's additions to it (the
//! `prompt_filter_results` chunk, `content_filter_results` per choice, `finish_reason:
//! "content_filter"`, the `content_filter` 400) are plain Chat Completions to the protocol
//! layer: the extra members are ignored when translating, a `content_filter` finish is
//! [`crate::protocol::StopReason::ContentFilter`], and the 400 is final like any 4xx.
//!
//! References (Azure OpenAI data-plane inference, GA `2024-10-21`):
//! <https://learn.microsoft.com/azure/ai-services/openai/reference> (chat completions:
//! `POST {endpoint}/openai/deployments/{deployment-id}/chat/completions?api-version=...`,
//! header `api-key`; models: `GET {endpoint}/openai/models?api-version=...`),
//! <https://learn.microsoft.com/azure/ai-services/openai/concepts/content-filter>
//! (content-filter annotations and the `content_filter` error code). The body's `model`
//! member is not read by Azure (the deployment in the path picks the model); Sluice sends
//! the deployment name there.

use std::borrow::Cow;

use pingora::http::RequestHeader;

use super::adapter::{Adapter, Credential};
use crate::config::Provider;
use crate::protocol::UpstreamDialect;

pub use crate::config::kinds::{azure_health_path as health_path, push_segment, valid_api_version};

/// The request header carrying an Azure OpenAI key.
pub const API_KEY_HEADER: &str = "api-key";

/// The chat path under the resource endpoint for deployment `deployment`:
/// `/openai/deployments/{deployment}/chat/completions?api-version={api_version}`, the
/// deployment percent-encoded as one path segment.
pub fn chat_path(deployment: &str, api_version: &str) -> String {
    let mut p = String::with_capacity(64 + deployment.len());
    p.push_str("/openai/deployments/");
    push_segment(&mut p, deployment);
    p.push_str("/chat/completions?api-version=");
    push_segment(&mut p, api_version);
    p
}

/// The Responses path under the resource endpoint: `/openai/v1/responses`, Azure OpenAI's
/// v1 API (<https://learn.microsoft.com/en-us/azure/ai-foundry/openai/how-to/responses>),
/// which takes no `api-version` (the provider's `api_version` stays the Chat Completions
/// one) and names the deployment in the body's `model`.
pub const RESPONSES_PATH: &str = "/openai/v1/responses";

/// The adapter of `kind: azure_openai`: Chat Completions at the deployment's URL, the key
/// in `api-key`.
#[derive(Debug)]
pub struct AzureOpenAi;

impl Adapter for AzureOpenAi {
    fn base_dialect(&self) -> UpstreamDialect {
        UpstreamDialect::ChatCompletions
    }

    fn path(&self, provider: &Provider, upstream_model: &str, _: bool) -> Cow<'static, str> {
        chat_path(
            upstream_model,
            provider.api_version.as_deref().unwrap_or(""),
        )
        .into()
    }

    fn responses_path(&self, _: &Provider) -> Option<Cow<'static, str>> {
        Some(RESPONSES_PATH.into())
    }

    fn authorize(
        &self,
        provider: &Provider,
        _: &Credential,
        req: &mut RequestHeader,
        _: &[u8],
    ) -> pingora::Result<()> {
        if let Some(k) = &provider.api_key {
            req.insert_header(API_KEY_HEADER, k.expose())?;
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn deployments_url_and_probe_path() {
        assert_eq!(
            chat_path("gpt-4o-prod", "2024-10-21"),
            "/openai/deployments/gpt-4o-prod/chat/completions?api-version=2024-10-21"
        );
        assert_eq!(
            chat_path("my dep/x", "2024-10-21"),
            "/openai/deployments/my%20dep%2Fx/chat/completions?api-version=2024-10-21"
        );
        assert_eq!(
            health_path("2025-01-01-preview"),
            "/openai/models?api-version=2025-01-01-preview"
        );
        assert!(valid_api_version("2024-10-21"));
        assert!(!valid_api_version(""));
        assert!(!valid_api_version("2024&x=1"));
    }

    /// A config with one provider of `section` (indented under `providers.p`).
    pub(crate) fn config(
        section: &str,
    ) -> Result<crate::config::Config, crate::config::ConfigError> {
        let yaml = format!(
            "server:\n  listen: 127.0.0.1:8080\n  admin_listen: 127.0.0.1:9090\ntenants:\n  t: {{}}\nvirtual_keys:\n  - key: sk-sluice-cloud-0001\n    tenant: t\nproviders:\n  p:\n{section}models:\n  m:\n    routes:\n      - provider: p\n        upstream_model: u\n"
        );
        crate::config::Config::parse(std::path::Path::new("sluice.yaml"), &yaml)
    }

    #[test]
    fn the_config_contract_needs_api_version_and_probes_the_model_list() {
        let c = config(
            "    kind: azure_openai\n    base_url: https://my-resource.openai.azure.com\n    api_version: \"2024-10-21\"\n    api_key: k\n",
        )
        .expect("valid");
        let p = &c.providers["p"];
        assert_eq!(p.api_version.as_deref(), Some("2024-10-21"));
        assert_eq!(
            p.health_check.as_ref().map(|h| h.path.as_str()),
            Some("/openai/models?api-version=2024-10-21")
        );
        assert_eq!(
            super::super::request_path(p, "gpt4o-prod", true),
            "/openai/deployments/gpt4o-prod/chat/completions?api-version=2024-10-21"
        );
        for (section, key) in [
            (
                "    kind: azure_openai\n    base_url: https://r.openai.azure.com\n    api_key: k\n",
                "providers.p",
            ),
            (
                "    kind: azure_openai\n    base_url: https://r.openai.azure.com\n    api_version: \"x&y\"\n",
                "providers.p.api_version",
            ),
            (
                "    kind: openai\n    base_url: https://api.openai.com/v1\n    api_version: \"2024-10-21\"\n",
                "providers.p.api_version",
            ),
        ] {
            let e = config(section).expect_err(section);
            assert_eq!(e.key_path, key, "{section}: {e}");
        }
    }
}
