//! Owns how Sluice talks to a provider: the `HttpPeer` for an attempt (address, TLS, SNI,
//! ALPN, connect timeout) and the upstream request head (path, `Host`, provider auth). Each
//! kind is one [`Adapter`] in its own file ([`openai`], [`anthropic`], [`azure`],
//! [`gemini`], [`vertex`] with [`google_auth`], [`bedrock`], [`demo`]), registered in
//! [`adapter()`]: a dialect per model plus an address ([`request_path`]) plus a signer
//! ([`apply_auth`], and for a credential exchanged for a token at run time the provider's
//! [`token::TokenCache`], read by [`target`]). The [`registry`] resolves each provider's
//! adapter and live credential once per config snapshot; the attempt loop only calls the
//! functions here, which call the adapter and never branch on the kind. The
//! request body is the protocol layer's ([`crate::protocol`]): as is with the upstream model
//! when the provider speaks the client's dialect, else translated.
//!
//! Provider host names are resolved asynchronously with a short-lived cache (Pingora's
//! `HttpPeer::new` would do a blocking lookup and panic on failure).

pub mod anthropic;
pub mod azure;
pub mod bedrock;
pub mod demo;
pub mod encoding;
pub mod exchange;
pub mod framing;
pub mod gemini;
pub mod google_auth;
pub mod openai;
pub mod registry;
pub mod token;
pub mod upstream_errors;
pub mod vertex;

mod adapter;

pub use adapter::{error_parts, Adapter, Credential};
pub use registry::{Registry, Upstream};

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use pingora::http::RequestHeader;
use pingora::protocols::ALPN;
use pingora::upstreams::peer::HttpPeer;

use crate::config::{Provider, ProviderKind, Route};
use crate::protocol::wire::Forwarding;
use crate::protocol::{ModelPlacement, UpstreamDialect};
use crate::secret::Secret;

/// The adapter of `kind`: the registration of every provider kind.
pub fn adapter(kind: ProviderKind) -> &'static dyn Adapter {
    match kind {
        ProviderKind::Openai => &openai::OpenAi,
        ProviderKind::Demo => &demo::Demo,
        ProviderKind::Anthropic => &anthropic::Anthropic,
        ProviderKind::AzureOpenai => &azure::AzureOpenAi,
        ProviderKind::Gemini => &gemini::Gemini,
        ProviderKind::Vertex => &vertex::Vertex,
        ProviderKind::Bedrock => &bedrock::Bedrock,
    }
}

/// How long a DNS answer is reused.
const DNS_TTL: Duration = Duration::from_secs(30);

type DnsCache = Mutex<HashMap<(String, u16), (Vec<SocketAddr>, tokio::time::Instant)>>;

static DNS: LazyLock<DnsCache> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// Resolves `host:port`, from cache when fresh.
///
/// # Errors
/// A message when the lookup fails, times out (`deadline`) or returns nothing.
pub(crate) async fn resolve(
    host: &str,
    port: u16,
    deadline: Duration,
) -> Result<SocketAddr, String> {
    let key = (host.to_string(), port);
    if let Ok(cache) = DNS.lock() {
        if let Some((addrs, at)) = cache.get(&key) {
            if at.elapsed() < DNS_TTL {
                if let Some(a) = addrs
                    .get(fastrand::usize(..addrs.len().max(1)))
                    .or(addrs.first())
                {
                    return Ok(*a);
                }
            }
        }
    }
    let addrs: Vec<SocketAddr> =
        tokio::time::timeout(deadline, tokio::net::lookup_host((host, port)))
            .await
            .map_err(|_| format!("DNS lookup of {host} timed out"))?
            .map_err(|e| format!("DNS lookup of {host} failed: {e}"))?
            .collect();
    let first = *addrs
        .first()
        .ok_or_else(|| format!("DNS lookup of {host} returned no address"))?;
    if let Ok(mut cache) = DNS.lock() {
        cache.insert(key, (addrs, tokio::time::Instant::now()));
    }
    Ok(first)
}

/// Most concurrent streams Sluice opens on one HTTP/2 connection to a provider (fewer when
/// the provider's `SETTINGS_MAX_CONCURRENT_STREAMS` says so); more streams open more
/// connections.
pub const H2_STREAMS_PER_CONNECTION: usize = 100;

/// Where an attempt connects: the peer plus what the request head needs.
#[derive(Debug)]
pub struct Target {
    /// Pingora peer (address, TLS, SNI, timeouts).
    pub peer: HttpPeer,
    /// `Host` header value.
    pub host_header: String,
    /// Path prefix (e.g. `/v1`).
    pub base_path: String,
    /// The provider's current bearer token, when its credential is one exchanged at run
    /// time ([`token::TokenCache::bearer`]): sent as `Authorization: Bearer`.
    pub bearer: Option<Arc<Secret>>,
}

impl Target {
    /// Adds `Authorization: Bearer <token>` when the provider authenticates with a token.
    ///
    /// # Errors
    /// If the token is not a valid header value.
    pub fn apply_bearer(&self, req: &mut RequestHeader) -> pingora::Result<()> {
        if let Some(t) = &self.bearer {
            req.insert_header("authorization", format!("Bearer {}", t.expose()))?;
        }
        Ok(())
    }
}

/// Builds the peer for `provider` (resolved as `up`), with its bearer token when it has a
/// token cache (waiting
/// at most the connect timeout for one: a failed or slow token fetch fails the attempt
/// like a connect error, so the request falls back).
///
/// # Errors
/// A message when the provider's address cannot be resolved (DNS failure), a non-demo
/// provider has no endpoint, or no access token could be had.
pub async fn target(provider: &Provider, up: &Upstream) -> Result<Target, String> {
    let bearer = match up.credential.token_cache() {
        Some(cache) => Some(
            cache
                .bearer(provider.timeouts.connect)
                .await
                .map_err(|e| format!("no access token: {e}"))?,
        ),
        None => None,
    };
    let connector = up.adapter.connector();
    let (addr, tls, sni, host_header, base_path) = match (&provider.endpoint, &connector) {
        (Some(ep), _) => {
            let addr = match ep.ip {
                Some(ip) => SocketAddr::new(ip, ep.port),
                None => resolve(&ep.host, ep.port, provider.timeouts.connect).await?,
            };
            (
                addr,
                ep.tls,
                ep.host.clone(),
                ep.host_header(),
                ep.base_path.clone(),
            )
        }
        (None, Some(_)) => (
            // Never dialled: the demo peer's custom connector opens an in-process pipe.
            SocketAddr::from(([127, 0, 0, 1], 0)),
            false,
            String::new(),
            "sluice-demo".to_string(),
            "/v1".to_string(),
        ),
        (None, _) => return Err(format!("provider {} has no endpoint", provider.id)),
    };
    let mut peer = HttpPeer::new(addr, tls, sni);
    // Verified by default (Pingora's `verify_cert`/`verify_hostname`), against the system
    // store or the provider's `ca_file`.
    if let Some(ca) = &provider.ca {
        peer.options.ca = Some(ca.roots.clone());
        peer.group_key = ca.fingerprint;
    }
    if provider.endpoint.is_none() {
        peer.options.custom_l4 = connector;
    }
    let t = provider.timeouts;
    peer.options.connection_timeout = Some(t.connect);
    peer.options.total_connection_timeout = Some(t.connect);
    peer.options.write_timeout = Some(t.first_byte);
    // We time the response head, first event and idle gaps ourselves (attempt loop).
    peer.options.read_timeout = None;
    peer.options.idle_timeout = Some(Duration::from_secs(90));
    peer.options.tcp_keepalive = Some(pingora::protocols::TcpKeepalive {
        idle: Duration::from_secs(60),
        interval: Duration::from_secs(10),
        count: 5,
        #[cfg(target_os = "linux")]
        user_timeout: Duration::from_secs(0),
    });
    if tls {
        // HTTP/2 where the provider offers it (ALPN h2, else http/1.1): its streams share a
        // connection. Each stream's receive window is the per-stream buffer bound
        // (`server.max_buffered_bytes_per_stream`), so a stream whose client reads slowly
        // holds no more unread bytes than over HTTP/1.1, and the connection window has room
        // for every stream's window at once, so stalled streams never starve the others.
        let window = u32::try_from(provider.h2_stream_window).unwrap_or(u32::MAX >> 1);
        peer.options.alpn = ALPN::H2H1;
        peer.options.max_h2_streams = H2_STREAMS_PER_CONNECTION;
        peer.options.h2_stream_window_size = Some(window);
        peer.options.h2_connection_window_size = Some(
            window
                .saturating_mul(H2_STREAMS_PER_CONNECTION as u32)
                .min(u32::MAX >> 1),
        );
    } else {
        // Plain HTTP: HTTP/1.1 (no h2c upstream), one connection per stream.
        peer.options.alpn = ALPN::H1;
    }
    Ok(Target {
        peer,
        host_header,
        base_path,
        bearer,
    })
}

/// The path (and query) of the inference endpoint for one request to `provider`,
/// appended to the base path: fixed for OpenAI-compatible and Anthropic providers, the
/// deployment's URL for Azure OpenAI, the model's method (stream or not) for Gemini and
/// Bedrock, the publisher model's method under the project and region for Vertex AI.
pub fn request_path(
    provider: &Provider,
    upstream_model: &str,
    stream: bool,
) -> std::borrow::Cow<'static, str> {
    adapter(provider.kind).path(provider, upstream_model, stream)
}

/// The path (and query) of `provider`'s inference endpoint for `upstream_model` spoken in
/// `dialect` ([`Route::path`]; the request-mode health probe, which has no route): the
/// Responses endpoint ([`Adapter::responses_path`]) for Responses, else [`request_path`].
pub fn path_for(
    provider: &Provider,
    upstream_model: &str,
    dialect: UpstreamDialect,
    stream: bool,
) -> std::borrow::Cow<'static, str> {
    let adapter = adapter(provider.kind);
    if dialect == UpstreamDialect::Responses {
        if let Some(p) = adapter.responses_path(provider) {
            return p;
        }
    }
    adapter.path(provider, upstream_model, stream)
}

/// Where the route's request body names the model, and so its shape ([`ModelPlacement`]):
/// in the URL for Claude on Vertex AI and on Bedrock (whose bodies carry `anthropic_version`
/// instead; Bedrock's no `stream`, `metadata` or `service_tier` either), in the body for
/// every other route (Converse and Gemini bodies name no model at all).
pub fn model_placement(route: &Route) -> ModelPlacement {
    placement_for(&route.provider, &route.upstream_model)
}

/// [`model_placement`] for `upstream_model` of `provider` (without a route: the probes).
pub fn placement_for(provider: &Provider, upstream_model: &str) -> ModelPlacement {
    adapter(provider.kind).placement(upstream_model)
}

/// The active health probe's default path for a kind (appended to the base path): the
/// model list (`/models`; Azure's `/openai/models?api-version=...`).
pub fn health_path(kind: ProviderKind, api_version: Option<&str>) -> String {
    crate::config::kinds::health_path(kind, api_version)
}

/// The wire APIs of a provider and of a route. Defined here, not in `config`, because the
/// dialect of a model is its provider kind's ([`Adapter::dialect`]); config holds data only.
impl Provider {
    /// The wire API the provider serves `upstream_model` in: the kind's one dialect, except
    /// on Vertex AI, where Claude models speak Messages and the others the Gemini dialect,
    /// and on Bedrock, where Claude models speak Messages (`InvokeModel`) and the others
    /// Converse.
    pub fn dialect_for(&self, upstream_model: &str) -> UpstreamDialect {
        adapter(self.kind).dialect(upstream_model)
    }
}

impl Route {
    /// The wire API this route's requests are sent in. Per route, not per provider kind, so
    /// that a kind serving models in several dialects (Vertex AI: Claude in Messages, Gemini
    /// in the Gemini dialect; Bedrock) can choose by the upstream model, and a route to
    /// OpenAI or Azure OpenAI can choose Responses (`routes[].api`); for the other kinds it
    /// is the kind's one dialect.
    pub fn dialect(&self) -> UpstreamDialect {
        match self.api {
            crate::config::RouteApi::Responses => UpstreamDialect::Responses,
            crate::config::RouteApi::ChatCompletions => {
                self.provider.dialect_for(&self.upstream_model)
            }
        }
    }

    /// The path of one of the Responses API's side endpoints on this route
    /// ([`ResponsesEndpoint`]: `{responses path}/input_tokens`, `{responses path}/compact`),
    /// appended to the base path; `None` for a route that does not speak Responses (the
    /// caller answers locally then).
    pub fn responses_endpoint_path(
        &self,
        endpoint: ResponsesEndpoint,
    ) -> Option<std::borrow::Cow<'static, str>> {
        if self.dialect() != UpstreamDialect::Responses {
            return None;
        }
        let base = adapter(self.provider.kind).responses_path(&self.provider)?;
        Some(format!("{base}/{}", endpoint.suffix()).into())
    }

    /// The path (and query) of this route's inference endpoint, appended to the base path:
    /// its provider's [`request_path`], or, for a route that speaks Responses
    /// (`routes[].api: responses`), the provider's Responses endpoint
    /// ([`Adapter::responses_path`]).
    pub fn path(&self, stream: bool) -> std::borrow::Cow<'static, str> {
        path_for(&self.provider, &self.upstream_model, self.dialect(), stream)
    }
}

/// A side endpoint of the OpenAI Responses API that a route speaking Responses forwards
/// (<https://platform.openai.com/docs/api-reference/responses/input-tokens>,
/// <https://platform.openai.com/docs/api-reference/responses/compact>).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponsesEndpoint {
    /// `POST /v1/responses/input_tokens`: `{"object":"response.input_tokens","input_tokens"}`.
    InputTokens,
    /// `POST /v1/responses/compact`: `{"object":"response.compaction","output":[…],"usage"}`.
    Compact,
}

impl ResponsesEndpoint {
    /// The path segment after the Responses path (`input_tokens`, `compact`).
    pub fn suffix(self) -> &'static str {
        match self {
            ResponsesEndpoint::InputTokens => "input_tokens",
            ResponsesEndpoint::Compact => "compact",
        }
    }
}

/// The body a Responses side endpoint ([`ResponsesEndpoint`]) of `route` is sent: the
/// client's JSON with `model` the upstream model, Sluice's own members left out and
/// `previous_response_id` left out ([`crate::protocol::responses::upstream::AUX_FORWARDING`]).
///
/// # Errors
/// Only if serialization fails (it cannot for a parsed `Value`).
pub fn responses_endpoint_body(
    route: &Route,
    request: &serde_json::Map<String, serde_json::Value>,
) -> serde_json::Result<Vec<u8>> {
    passthrough_body_forwarded(
        request,
        &route.upstream_model,
        false,
        ModelPlacement::Body,
        Some(&crate::protocol::responses::upstream::AUX_FORWARDING),
    )
}

/// The status an upstream error answer counts as, from its status and body: a Gemini key
/// rejected with 400 (`API_KEY_INVALID`) is a 401 (the gateway's credential: fall back,
/// tell the client 502), a Bedrock `ModelErrorException` (424) is a 502 (the model failed:
/// fall back), every other answer keeps its status. A 401 to a provider that
/// authenticates with a cached token also drops that token (revoked, or the clocks
/// disagree), so the next request gets a new one.
pub fn error_status(up: &Upstream, status: u16, body: &[u8]) -> u16 {
    if let (401, Some(cache)) = (status, up.credential.token_cache()) {
        cache.invalidate();
    }
    up.adapter.error_status(status, body)
}

/// Builds the upstream request head for `body` (the final bytes that will be sent):
/// `POST {base}{path}`, `Host`, framing, `Accept` (the provider's stream media type for a
/// stream), `Accept-Encoding` ([`encoding::ACCEPT_ENCODING`]) and the provider's
/// credential or signature ([`apply_auth`], last: a signature covers the headers before it).
///
/// # Errors
/// Only if a header value is invalid (a provider key with a newline, say) or the request
/// cannot be signed.
pub fn request_head(
    provider: &Provider,
    up: &Upstream,
    target: &Target,
    path: &str,
    body: &[u8],
    stream: bool,
    request_id: &str,
) -> pingora::Result<RequestHeader> {
    let uri = format!("{}{}", target.base_path, path);
    let mut req = RequestHeader::build("POST", uri.as_bytes(), Some(12))?;
    req.insert_header("host", &target.host_header)?;
    req.insert_header("content-type", "application/json")?;
    req.insert_header("content-length", body.len().to_string())?;
    req.insert_header(
        "accept",
        if stream {
            up.adapter.stream_accept()
        } else {
            "application/json"
        },
    )?;
    // Honest: exactly the codings `encoding::Decoder` decodes (without this header a
    // server may send any coding, RFC 9110 §12.5.3).
    req.insert_header("accept-encoding", encoding::ACCEPT_ENCODING)?;
    req.insert_header("user-agent", concat!("sluice/", env!("CARGO_PKG_VERSION")))?;
    req.insert_header("x-request-id", request_id)?;
    target.apply_bearer(&mut req)?;
    apply_auth(provider, up, &mut req, body)?;
    Ok(req)
}

/// Request fields that are Sluice's own and never go upstream.
pub const GATEWAY_FIELDS: &[&str] = &["provider"];

/// Serializes the client's request for a provider that speaks the client's dialect (the fast
/// path, any dialect: each names the model in top-level `model`): `model` replaced by the
/// upstream model, gateway-only fields removed, everything else as sent. With `ask_usage` (a
/// Chat Completions stream whose client did not ask for usage) `stream_options.include_usage`
/// is set to `true`, other `stream_options` members kept: metering needs the provider's final
/// usage chunk, which the stream pipe then removes from the client's stream.
///
/// # Errors
/// Only if serialization fails (it cannot for a parsed `Value`).
pub fn passthrough_body(
    request: &serde_json::Map<String, serde_json::Value>,
    upstream_model: &str,
    ask_usage: bool,
) -> serde_json::Result<Vec<u8>> {
    passthrough_body_placed(request, upstream_model, ask_usage, ModelPlacement::Body)
}

/// [`passthrough_body`] for a provider that names the model where `placement` says: with
/// [`ModelPlacement::Path`] the body has no `model` nor the placement's `dropped` members and
/// gets the platform's `anthropic_version` (a client's own `anthropic_version` member is
/// replaced).
///
/// # Errors
/// Only if serialization fails (it cannot for a parsed `Value`).
pub fn passthrough_body_placed(
    request: &serde_json::Map<String, serde_json::Value>,
    upstream_model: &str,
    ask_usage: bool,
    placement: ModelPlacement,
) -> serde_json::Result<Vec<u8>> {
    passthrough_body_forwarded(request, upstream_model, ask_usage, placement, None)
}

/// [`passthrough_body_placed`] with the client dialect's own [`Forwarding`] rules: the
/// members the gateway owns in that dialect are left out or set (Responses:
/// `previous_response_id` out, `store: false`, `include` with
/// `reasoning.encrypted_content`).
///
/// # Errors
/// Only if serialization fails (it cannot for a parsed `Value`).
pub fn passthrough_body_forwarded(
    request: &serde_json::Map<String, serde_json::Value>,
    upstream_model: &str,
    ask_usage: bool,
    placement: ModelPlacement,
    forwarding: Option<&Forwarding>,
) -> serde_json::Result<Vec<u8>> {
    use serde_json::Value;
    let (owned_out, owned_set) = forwarding.map_or((&[][..], &[][..]), |f| (f.dropped, f.set));
    let mut out = Vec::with_capacity(256);
    let mut ser = serde_json::Serializer::new(&mut out);
    use serde::ser::{SerializeMap, Serializer};
    let mut map = ser.serialize_map(None)?;
    let with_usage = |opts: Option<&Value>| {
        let mut o = opts.and_then(Value::as_object).cloned().unwrap_or_default();
        o.insert("include_usage".into(), Value::Bool(true));
        Value::Object(o)
    };
    let dropped = match placement {
        ModelPlacement::Path { dropped, .. } => dropped,
        ModelPlacement::Body => &[][..],
    };
    for (k, v) in request {
        if GATEWAY_FIELDS.contains(&k.as_str())
            || dropped.contains(&k.as_str())
            || owned_out.contains(&k.as_str())
        {
            continue;
        }
        if let Some((_, f)) = owned_set.iter().find(|(name, _)| name == k) {
            map.serialize_entry(k, &f(Some(v)))?;
            continue;
        }
        if k == "model" || k == "anthropic_version" {
            match placement {
                ModelPlacement::Body if k == "model" => {
                    map.serialize_entry(k, upstream_model)?;
                }
                ModelPlacement::Body => map.serialize_entry(k, v)?,
                ModelPlacement::Path { .. } => {}
            }
        } else if ask_usage && k == "stream_options" {
            map.serialize_entry(k, &with_usage(Some(v)))?;
        } else {
            map.serialize_entry(k, v)?;
        }
    }
    for (name, f) in owned_set {
        if !request.contains_key(*name) {
            map.serialize_entry(name, &f(None))?;
        }
    }
    if ask_usage && !request.contains_key("stream_options") {
        map.serialize_entry("stream_options", &with_usage(None))?;
    }
    if let ModelPlacement::Path {
        anthropic_version, ..
    } = placement
    {
        map.serialize_entry("anthropic_version", anthropic_version)?;
    }
    map.end()?;
    Ok(out)
}

/// Forwards the client headers a provider's API defines: `anthropic-beta` (the Messages
/// API's feature opt-ins) to Anthropic providers and to Claude on Vertex AI (whose
/// `rawPredict` takes the header as Anthropic's API does); Bedrock takes them in the body
/// ([`add_client_betas`]), no other provider kind takes one. Called after
/// [`request_head`], so the attempt loop never branches on the provider kind.
///
/// # Errors
/// If a forwarded value is not a valid header value.
pub fn forward_client_headers(
    provider: &Provider,
    upstream_model: &str,
    head: &mut RequestHeader,
    anthropic_beta: Option<&str>,
) -> pingora::Result<()> {
    match anthropic_beta {
        Some(beta) if beta_header_goes_to(provider.kind, upstream_model) => {
            head.insert_header("anthropic-beta", beta)
        }
        _ => Ok(()),
    }
}

/// Whether a route of `kind` serving `upstream_model` takes the `anthropic-beta` header:
/// Anthropic, and Claude on Vertex AI.
fn beta_header_goes_to(kind: ProviderKind, upstream_model: &str) -> bool {
    adapter(kind).takes_beta_header(upstream_model)
}

/// Adds the client's `anthropic-beta` opt-ins to the body of a provider that takes them
/// there: Claude on Bedrock, as the `anthropic_beta` member, a list of strings (the
/// header's comma-separated values, after those the body already lists). Every other
/// route gets `body` back as is (Anthropic and Vertex AI take the header,
/// [`forward_client_headers`]). Runs before the signature, which covers the body.
///
/// Reference: <https://docs.aws.amazon.com/bedrock/latest/userguide/model-parameters-anthropic-claude-messages-request-response.html>
/// (`anthropic_beta`).
///
/// # Errors
/// If the body is no JSON object (the encoders always write one).
pub fn add_client_betas(
    provider: &Provider,
    upstream_model: &str,
    body: Vec<u8>,
    anthropic_beta: Option<&str>,
) -> serde_json::Result<Vec<u8>> {
    match anthropic_beta {
        Some(header) => adapter(provider.kind).add_client_betas(upstream_model, body, header),
        None => Ok(body),
    }
}

/// `body` with the values of an `anthropic-beta` header (comma-separated, trimmed, empty
/// ones left out) appended to its `anthropic_beta` list, each once; as is when the header
/// lists none.
pub(crate) fn body_with_betas(body: Vec<u8>, header: &str) -> serde_json::Result<Vec<u8>> {
    use serde_json::Value;
    let mut betas = header.split(',').map(str::trim).filter(|b| !b.is_empty());
    let Some(first) = betas.next() else {
        return Ok(body);
    };
    let mut map: serde_json::Map<String, Value> = serde_json::from_slice(&body)?;
    let member = map
        .entry("anthropic_beta")
        .or_insert_with(|| Value::Array(Vec::new()));
    if !member.is_array() {
        *member = Value::Array(Vec::new());
    }
    if let Value::Array(list) = member {
        for beta in std::iter::once(first).chain(betas) {
            if !list.iter().any(|v| v.as_str() == Some(beta)) {
                list.push(Value::String(beta.to_string()));
            }
        }
    }
    serde_json::to_vec(&map)
}

/// An upstream error answer's `(type, code, message)` in OpenAI's terms for `provider`:
/// Bedrock's `{"message": ...}` bodies typed by their status, every other kind by its
/// dialect ([`error_parts`]).
pub fn provider_error_parts(
    provider: &Provider,
    upstream: UpstreamDialect,
    status: u16,
    body: &[u8],
) -> (String, Option<String>, String) {
    adapter(provider.kind).error_parts(upstream, status, body)
}

/// Adds the provider's credential to a request whose body is `body` (the exact bytes
/// sent; empty for a `GET`): `Authorization: Bearer` (OpenAI-compatible), `x-api-key` +
/// `anthropic-version` (Anthropic), `api-key` (Azure OpenAI), `x-goog-api-key` (Gemini),
/// or a SigV4 signature over the method, path, `host`, `content-type` and body (Bedrock,
/// [`bedrock::sigv4`]); nothing for Vertex AI, whose bearer token comes with the
/// [`Target`] ([`Target::apply_bearer`]). The signer seam: each kind's
/// [`Adapter::authorize`], with the credential the registry resolved; it runs after every
/// other header is set.
///
/// # Errors
/// If the key is not a valid header value, or the request cannot be signed.
pub fn apply_auth(
    provider: &Provider,
    up: &Upstream,
    req: &mut RequestHeader,
    body: &[u8],
) -> pingora::Result<()> {
    up.adapter.authorize(provider, &up.credential, req, body)
}

/// Removes every occurrence of the provider's key from `text` (upstream error messages may
/// echo it).
pub fn scrub_key(provider: &Provider, text: &str) -> String {
    match &provider.api_key {
        Some(k) if k.expose().len() >= 4 && text.contains(k.expose()) => {
            text.replace(k.expose(), "[redacted]")
        }
        _ => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anthropic_beta_goes_in_bedrock_bodies_and_to_claude_headers() {
        let body = body_with_betas(
            br#"{"max_tokens":8,"anthropic_beta":["a"]}"#.to_vec(),
            " a, context-1m-2025-08-07 ,,interleaved-thinking-2025-05-14",
        )
        .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v["anthropic_beta"],
            serde_json::json!([
                "a",
                "context-1m-2025-08-07",
                "interleaved-thinking-2025-05-14"
            ])
        );
        assert_eq!(v["max_tokens"], 8);
        // No values: the body as is, byte for byte.
        assert_eq!(body_with_betas(b"{ }".to_vec(), " , ").unwrap(), b"{ }");
        assert!(body_with_betas(b"[]".to_vec(), "a").is_err());
        assert!(beta_header_goes_to(
            ProviderKind::Anthropic,
            "claude-sonnet-4-6"
        ));
        assert!(beta_header_goes_to(
            ProviderKind::Vertex,
            "claude-sonnet-4-6"
        ));
        assert!(!beta_header_goes_to(ProviderKind::Vertex, "gemini-2.5-pro"));
        assert!(!beta_header_goes_to(
            ProviderKind::Bedrock,
            "us.anthropic.claude-sonnet-4-6-v1:0"
        ));
        assert!(!beta_header_goes_to(ProviderKind::Openai, "gpt-4o"));
    }

    #[test]
    fn body_gets_upstream_model_and_loses_gateway_fields() {
        let v: serde_json::Value = serde_json::from_str(
            r#"{"model":"acme/x","provider":{"only":["a"]},"stream":true,"messages":[]}"#,
        )
        .unwrap();
        let out = passthrough_body(v.as_object().unwrap(), "m-1", false).unwrap();
        let back: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(back["model"], "m-1");
        assert!(back.get("provider").is_none());
        assert_eq!(back["stream"], true);
    }

    #[test]
    fn asking_for_usage_sets_include_usage_and_keeps_other_stream_options() {
        use serde_json::Value;
        let v: Value =
            serde_json::from_str(r#"{"model":"x","stream":true,"messages":[]}"#).unwrap();
        let back: Value =
            serde_json::from_slice(&passthrough_body(v.as_object().unwrap(), "m", true).unwrap())
                .unwrap();
        assert_eq!(
            back["stream_options"],
            serde_json::json!({"include_usage": true})
        );
        let v: Value = serde_json::from_str(
            r#"{"model":"x","stream":true,"stream_options":{"include_usage":false,"include_obfuscation":false}}"#,
        )
        .unwrap();
        let back: Value =
            serde_json::from_slice(&passthrough_body(v.as_object().unwrap(), "m", true).unwrap())
                .unwrap();
        assert_eq!(
            back["stream_options"],
            serde_json::json!({"include_usage": true, "include_obfuscation": false})
        );
    }
}
