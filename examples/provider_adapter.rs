//! The smallest provider adapter: one type implementing [`sluice::providers::Adapter`].
//!
//! A provider kind is what Sluice needs to reach one provider's API: its upstream dialect
//! (here Chat Completions, so every client dialect reaches it through the canonical model),
//! the path of its inference endpoint, and how a request carries the credential. Everything
//! else (where the body names the model, the stream's media type, error mapping, framing)
//! has a default that fits an SSE provider speaking its dialect's own error shape. A real
//! kind lives in its own file under `src/providers/` and is registered in
//! `providers::adapter` (and, when it has config keys of its own, in `config::schema`);
//! `tests/e2e/provider_battery.rs` is the battery it must then pass.
//!
//! This example builds the request head an attempt would send for one provider of the
//! shipped config shape, with a made-up kind that wants its key in `x-api-key` and serves
//! `/v2/chat`.

use std::borrow::Cow;

use pingora::http::RequestHeader;
use sluice::config::{Config, Provider};
use sluice::protocol::UpstreamDialect;
use sluice::providers::{Adapter, Credential};

/// A provider that speaks Chat Completions at `/v2/chat` and takes its key in `x-api-key`.
#[derive(Debug)]
struct ExampleCloud;

impl Adapter for ExampleCloud {
    fn base_dialect(&self) -> UpstreamDialect {
        UpstreamDialect::ChatCompletions
    }

    fn path(
        &self,
        _provider: &Provider,
        _upstream_model: &str,
        _stream: bool,
    ) -> Cow<'static, str> {
        Cow::Borrowed("/v2/chat")
    }

    fn authorize(
        &self,
        provider: &Provider,
        _credential: &Credential,
        req: &mut RequestHeader,
        _body: &[u8],
    ) -> pingora::Result<()> {
        if let Some(key) = &provider.api_key {
            req.insert_header("x-api-key", key.expose())?;
        }
        Ok(())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let yaml = "tenants:\n  t: {}\nvirtual_keys:\n  - key: sk-example-virtual-key-01\n    tenant: t\nproviders:\n  cloud:\n    kind: openai\n    base_url: http://127.0.0.1:9/v1\n    api_key: sk-example-provider-key\nmodels:\n  example/chat:\n    routes:\n      - provider: cloud\n        upstream_model: chat-small\n";
    let config = Config::parse(std::path::Path::new("example.yaml"), yaml)?;
    let provider = &config.providers["cloud"];
    let adapter = ExampleCloud;
    let path = adapter.path(provider, "chat-small", true);
    let mut head = RequestHeader::build("POST", path.as_bytes(), None)?;
    adapter.authorize(provider, &Credential::None, &mut head, b"{}")?;
    println!(
        "{} speaks {} at {} with x-api-key set: {}",
        provider.id,
        adapter.dialect("chat-small").as_str(),
        path,
        head.headers.contains_key("x-api-key")
    );
    Ok(())
}

// Run: cargo run --example provider_adapter
