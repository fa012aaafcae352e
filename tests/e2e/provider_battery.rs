//! The provider battery (issue 27, item 3): one set of cells that every provider kind the
//! config accepts must pass, in the manner of TensorZero's `generate_provider_tests!`. A
//! provider adapter is done when its kind passes the battery.
//!
//! [`provider_battery!`] takes a kind's rig (its YAML provider block, the mock behaviour and
//! credentials it needs, set up exactly as that kind's own e2e tests do) and generates one
//! test for the kind that runs every cell against one Sluice and one mock upstream: for each
//! client dialect (Chat Completions, Messages, Responses), streamed and not,
//! - **text**: the answer's text, stop reason and the standard model id;
//! - **tool**: a tool round trip (a call and its result in the history, the tool offered);
//!   the model calls two tools and the answer carries their names and arguments;
//! - **usage**: in every answer, input and output tokens in the client's own dialect, as the
//!   mock reported them;
//! - **error**: the upstream fails before the first byte (429); the client gets its own
//!   dialect's error with that status and the provider's message.
//!
//! Only HTTP on loopback: the battery knows a kind by its config and the paths its calls
//! take, never by Sluice's code. Cells run in order inside the kind's test (the mock's
//! behaviour is process-wide), every failing cell is reported by name, then the test fails.

use serde_json::{json, Value};
use sluice_mock_upstream::sigv4::{MOCK_AWS_ACCESS_KEY_ID, MOCK_AWS_SECRET_ACCESS_KEY};

use crate::dialect_matrix::{run_cell, Client, Scenario};
use crate::harness::{Mock, Sluice, TempDir, KEY};
use crate::vertex::TestKey;

/// The answer's text (multi-byte characters, cut by the mock inside them).
const TEXT: &str = "héllo from the båttery, ünïcode ✓";
/// The text before the tool calls.
const TOOL_TEXT: &str = "Let me check.";
/// The input tokens the mock reports.
const PROMPT_TOKENS: u64 = 37;
const ERROR_MESSAGE: &str = "battery: slow down";
/// The key the keyed kinds are configured with and the mock accepts (Azure, Gemini).
const PROVIDER_KEY: &str = "battery-key-5e1d";

/// One provider kind set up for the battery: Sluice with one provider of the kind behind
/// the model `acme/m`, its mock, and what the cells need to know about the kind.
pub(crate) struct Rig {
    pub(crate) sluice: Sluice,
    pub(crate) mock: Mock,
    /// Knobs every behaviour of this kind carries (the token endpoint's public key, the
    /// provider key the mock accepts).
    pub(crate) base: Value,
    /// What the path of every model call of this kind contains (token requests and health
    /// probes do not).
    pub(crate) marker: &'static str,
    /// The upstream model id, which the client never sees.
    upstream_model: &'static str,
    /// Whether the kind's wire names tool calls by id (Gemini names them by function only).
    call_ids: bool,
    /// Whether a stream carries each tool call whole, in one event (Gemini): the mock then
    /// counts one output token per call, not one per argument fragment.
    whole_calls: bool,
    /// Files the provider reads (service-account key, AWS credentials), kept for the rig's life.
    _keep: Option<Box<dyn std::any::Any>>,
}

impl Rig {
    /// The requests the mock logged on this kind's model-call path (token requests and
    /// health probes left out).
    pub(crate) fn model_calls(&self) -> Vec<Value> {
        self.mock
            .log()
            .into_iter()
            .filter(|r| r["path"].as_str().is_some_and(|p| p.contains(self.marker)))
            .collect()
    }
}

/// The standard model every rig serves.
pub(crate) const MODEL: &str = "acme/m";

/// Sluice's config with one provider, `p`, given as its YAML block (indented four spaces,
/// without the name), serving [`MODEL`] as `upstream`.
fn config(provider: &str, upstream: &str) -> String {
    config_with(provider, upstream, "")
}

/// [`config`] with `route_extra` added to the route's flow mapping (`, api: responses`).
fn config_with(provider: &str, upstream: &str, route_extra: &str) -> String {
    format!(
        "server:\n  listen: {{listen}}\n  admin_listen: {{admin}}\n  threads: 2\n  retry: {{max_attempts_per_route: 1}}\ntenants:\n  t: {{}}\nvirtual_keys:\n  - key: {KEY}\n    tenant: t\nproviders:\n  p:\n{provider}    health: {{degraded_after_failures: 100000, unhealthy_after_failures: 100000}}\nmodels:\n  {MODEL}:\n    default_max_tokens: 4096\n    routes:\n      - {{provider: p, upstream_model: \"{upstream}\"{route_extra}}}\n"
    )
}

/// A rig for a kind configured by a provider key (or none), the mock's own port.
fn keyed(
    provider: impl Fn(&str) -> String,
    base: Value,
    marker: &'static str,
    upstream_model: &'static str,
) -> Rig {
    keyed_route(provider, base, marker, upstream_model, "")
}

/// [`keyed`] with `route_extra` in the route (`, api: responses`).
fn keyed_route(
    provider: impl Fn(&str) -> String,
    base: Value,
    marker: &'static str,
    upstream_model: &'static str,
    route_extra: &str,
) -> Rig {
    let mock = Mock::start(&base.to_string());
    let sluice = Sluice::start(&config_with(
        &provider(&format!("http://{}", mock.addr)),
        upstream_model,
        route_extra,
    ));
    Rig {
        sluice,
        mock,
        base,
        marker,
        upstream_model,
        call_ids: !upstream_model.starts_with("gemini"),
        whole_calls: upstream_model.starts_with("gemini"),
        _keep: None,
    }
}

pub(crate) fn openai_rig() -> Rig {
    keyed(
        |url| {
            format!("    kind: openai\n    base_url: {url}/v1\n    api_key: sk-battery-oa\n    health_check: {{enabled: false}}\n")
        },
        json!({}),
        "/v1/chat/completions",
        "gpt-battery-1",
    )
}

/// OpenAI through its Responses API (`routes[].api: responses`).
pub(crate) fn openai_responses_rig() -> Rig {
    keyed_route(
        |url| {
            format!("    kind: openai\n    base_url: {url}/v1\n    api_key: sk-battery-oa\n    health_check: {{enabled: false}}\n")
        },
        json!({}),
        "/v1/responses",
        "gpt-battery-1",
        ", api: responses",
    )
}

/// Azure OpenAI through its v1 Responses API (`routes[].api: responses`).
pub(crate) fn azure_responses_rig() -> Rig {
    keyed_route(
        |url| {
            format!("    kind: azure_openai\n    base_url: {url}\n    api_version: \"2024-10-21\"\n    api_key: {PROVIDER_KEY}\n    health_check: {{enabled: false}}\n")
        },
        json!({"api_key": PROVIDER_KEY}),
        "/openai/v1/responses",
        "gpt4o-battery",
        ", api: responses",
    )
}

pub(crate) fn anthropic_rig() -> Rig {
    keyed(
        |url| {
            format!("    kind: anthropic\n    base_url: {url}/v1\n    api_key: sk-ant-battery\n    health_check: {{enabled: false}}\n")
        },
        json!({}),
        "/v1/messages",
        "claude-battery-1",
    )
}

pub(crate) fn azure_openai_rig() -> Rig {
    keyed(
        |url| {
            format!("    kind: azure_openai\n    base_url: {url}\n    api_version: \"2024-10-21\"\n    api_key: {PROVIDER_KEY}\n    health_check: {{enabled: false}}\n")
        },
        json!({"api_key": PROVIDER_KEY}),
        "/openai/deployments/gpt4o-battery/chat/completions",
        "gpt4o-battery",
    )
}

pub(crate) fn gemini_rig() -> Rig {
    keyed(
        |url| {
            format!("    kind: gemini\n    base_url: {url}/v1beta\n    api_key: {PROVIDER_KEY}\n    health_check: {{enabled: false}}\n")
        },
        json!({"api_key": PROVIDER_KEY}),
        "/v1beta/models/gemini-2.5-flash:",
        "gemini-2.5-flash",
    )
}

/// Vertex AI with a service-account key made by openssl, its token endpoint on the mock.
fn vertex(marker: &'static str, upstream_model: &'static str) -> Rig {
    // The key's token URL names the mock's port: the mock starts first, learns the key after.
    let mock = Mock::start("{}");
    let key = TestKey::new(&format!("http://{}/token", mock.addr));
    let base = json!({"token_public_key": key.public_pem});
    mock.set_behavior(&base.to_string());
    let provider = format!(
        "    kind: vertex\n    project: test-project\n    region: us-central1\n    credentials_file_env: BATTERY_VERTEX_KEY\n    base_url: http://{}/v1\n",
        mock.addr
    );
    let file = key.file.to_str().expect("utf-8 path").to_string();
    let sluice = Sluice::start_with_env(
        &config(&provider, upstream_model),
        &[("BATTERY_VERTEX_KEY", &file)],
    );
    Rig {
        sluice,
        mock,
        base,
        marker,
        upstream_model,
        call_ids: !upstream_model.starts_with("gemini"),
        whole_calls: upstream_model.starts_with("gemini"),
        _keep: Some(Box::new(key)),
    }
}

pub(crate) fn vertex_claude_rig() -> Rig {
    vertex(
        "/publishers/anthropic/models/claude-sonnet-4-6:",
        "claude-sonnet-4-6",
    )
}

pub(crate) fn vertex_gemini_rig() -> Rig {
    vertex(
        "/publishers/google/models/gemini-2.5-flash:",
        "gemini-2.5-flash",
    )
}

/// Bedrock signed with SigV4 by the credentials in the environment (and a shared
/// credentials file, as the Bedrock tests set them).
fn bedrock(marker: &'static str, upstream_model: &'static str) -> Rig {
    let dir = TempDir::new("battery-aws");
    let file = crate::bedrock::credentials_file(&dir);
    let mock = Mock::start("{}");
    let provider = format!(
        "    kind: bedrock\n    region: us-east-2\n    base_url: http://{}\n",
        mock.addr
    );
    let env = [
        ("AWS_ACCESS_KEY_ID", MOCK_AWS_ACCESS_KEY_ID),
        ("AWS_SECRET_ACCESS_KEY", MOCK_AWS_SECRET_ACCESS_KEY),
        ("AWS_SHARED_CREDENTIALS_FILE", file.as_str()),
    ];
    let sluice = Sluice::start_with_env(&config(&provider, upstream_model), &env);
    Rig {
        sluice,
        mock,
        base: json!({}),
        marker,
        upstream_model,
        call_ids: !upstream_model.starts_with("gemini"),
        whole_calls: upstream_model.starts_with("gemini"),
        _keep: Some(Box::new(dir)),
    }
}

/// A Claude model: InvokeModel with Anthropic's body.
pub(crate) fn bedrock_claude_rig() -> Rig {
    bedrock("/invoke", crate::bedrock::BEDROCK_MODEL)
}

/// A model that is not Claude: the Converse API.
pub(crate) fn bedrock_converse_rig() -> Rig {
    bedrock("/converse", crate::bedrock_converse::NOVA)
}

/// What a cell asks of the model.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Cell {
    Text,
    Tool,
    Error,
}

/// The tool calls the mock answers with: (name, arguments).
fn answered_tools() -> Vec<(&'static str, Value)> {
    vec![
        ("get_weather", json!({"city": "Zürich", "unit": "c"})),
        ("get_time", json!({"tz": "Europe/Zurich", "24h": true})),
    ]
}

/// The mock's behaviour for a cell, over the rig's own knobs.
fn behavior(rig: &Rig, cell: Cell) -> String {
    let mut v = match cell {
        Cell::Text => json!({"text": TEXT}),
        Cell::Tool => {
            let calls: Vec<Value> = answered_tools()
                .into_iter()
                .map(|(name, arguments)| json!({"name": name, "arguments": arguments}))
                .collect();
            json!({"text": TOOL_TEXT, "tool_calls": calls})
        }
        Cell::Error => json!({"status": 429, "error_message": ERROR_MESSAGE}),
    };
    v["split"] = json!("mid_utf8");
    v["prompt_tokens"] = json!(PROMPT_TOKENS);
    for (k, val) in rig.base.as_object().into_iter().flatten() {
        v[k] = val.clone();
    }
    v.to_string()
}

/// The output tokens the mock reports: one per text word and, per tool call, one for its
/// start and one per argument fragment (of at most 7 characters), or one in all when the
/// call is streamed whole.
fn expected_output_tokens(cell: Cell, whole_calls: bool) -> u64 {
    let words = |t: &str| t.split_whitespace().count() as u64;
    match cell {
        Cell::Text | Cell::Error => words(TEXT),
        Cell::Tool => {
            let calls: u64 = answered_tools()
                .iter()
                .map(|(_, a)| {
                    if whole_calls {
                        1
                    } else {
                        1 + (a.to_string().chars().count() as u64).div_ceil(7)
                    }
                })
                .sum();
            words(TOOL_TEXT) + calls
        }
    }
}

fn expected_stop(client: Client, cell: Cell) -> &'static str {
    match (client, cell) {
        (Client::Chat, Cell::Tool) => "tool_calls",
        (Client::Chat, _) => "stop",
        (Client::Messages, Cell::Tool) => "tool_use",
        (Client::Messages, _) => "end_turn",
        (Client::Responses, _) => "completed",
    }
}

/// Runs one cell; panics with what differs.
fn check(rig: &Rig, name: &str, cell: Cell, client: Client, stream: bool) {
    rig.mock.reset();
    let scenario = match cell {
        Cell::Tool => Scenario::Tool,
        Cell::Text | Cell::Error => Scenario::Text,
    };
    let body = client.body(scenario, MODEL, stream);
    let (status, raw, seen) = run_cell(&rig.sluice, client, &body, stream);

    // One model call, on the kind's own path.
    let calls = rig.model_calls();
    assert_eq!(
        calls.len(),
        1,
        "{name}: one call on a path with {:?}: {:?}",
        rig.marker,
        rig.mock.log()
    );
    assert!(
        !raw.contains(rig.upstream_model),
        "{name}: the upstream model leaked: {raw}"
    );

    if cell == Cell::Error {
        assert_eq!(status, 429, "{name}: {raw}");
        let (ty, message) = seen
            .error
            .unwrap_or_else(|| panic!("{name}: no error in the client's dialect: {raw}"));
        if client == Client::Messages {
            assert_eq!(ty, "rate_limit_error", "{name}: {raw}");
        } else {
            // OpenAI's own 429 says `type: requests, code: rate_limit_exceeded`; a
            // translated one `type: rate_limit_error`.
            assert!(!ty.is_empty(), "{name}: an error type: {raw}");
            assert!(
                raw.contains("rate_limit"),
                "{name}: a rate-limit error: {raw}"
            );
        }
        assert!(message.contains(ERROR_MESSAGE), "{name}: {raw}");
        return;
    }

    assert_eq!(status, 200, "{name}: {raw}");
    assert!(seen.error.is_none(), "{name}: {:?}: {raw}", seen.error);
    assert!(!seen.models.is_empty(), "{name}: no model named: {raw}");
    assert!(
        seen.models.iter().all(|m| m == MODEL),
        "{name}: models {:?}: {raw}",
        seen.models
    );
    assert_eq!(seen.stop, expected_stop(client, cell), "{name}: {raw}");
    assert_eq!(
        seen.input_tokens, PROMPT_TOKENS,
        "{name}: input tokens: {raw}"
    );
    assert_eq!(
        seen.output_tokens,
        expected_output_tokens(cell, stream && rig.whole_calls),
        "{name}: output tokens: {raw}"
    );
    match cell {
        Cell::Text => {
            assert_eq!(seen.text, TEXT, "{name}: {raw}");
            assert!(seen.tools.is_empty(), "{name}: {raw}");
        }
        Cell::Tool => {
            assert_eq!(seen.text, TOOL_TEXT, "{name}: {raw}");
            let want = answered_tools();
            assert_eq!(
                seen.tools.len(),
                want.len(),
                "{name}: tool calls {:?}: {raw}",
                seen.tools
            );
            for ((id, tool, args), (want_tool, want_args)) in seen.tools.iter().zip(&want) {
                assert!(!id.is_empty(), "{name}: a call id: {raw}");
                assert_eq!(tool, want_tool, "{name}: {raw}");
                let got: Value = serde_json::from_str(args).unwrap_or_else(|e| {
                    panic!("{name}: arguments {args:?} are not JSON ({e}): {raw}")
                });
                assert_eq!(&got, want_args, "{name}: {raw}");
            }
            assert_ne!(
                seen.tools[0].0, seen.tools[1].0,
                "{name}: distinct call ids"
            );
            // The offered tool and the earlier call and result reached the provider.
            let sent = calls[0]["body"].as_str().unwrap_or_default();
            for part in ["get_weather", "18°C and sunny", "Paris"] {
                assert!(sent.contains(part), "{name}: {part:?} not sent: {sent}");
            }
            if rig.call_ids {
                assert!(sent.contains("call_prev1"), "{name}: the call id: {sent}");
            }
        }
        Cell::Error => unreachable!("answered above"),
    }
}

/// Runs every cell of the battery against `rig`, except those named in `skip` (each with
/// the bug that keeps it out); fails with every failing cell's name and message.
fn run_battery(kind: &str, rig: &Rig, skip: &[&str]) {
    let mut failures = Vec::new();
    let mut ran = 0;
    for cell in [Cell::Text, Cell::Tool, Cell::Error] {
        for stream in [false, true] {
            rig.mock.set_behavior(&behavior(rig, cell));
            for client in [Client::Chat, Client::Messages, Client::Responses] {
                let name = format!(
                    "{kind} {cell:?} {client:?} {}",
                    if stream { "stream" } else { "unary" }
                );
                if skip.contains(&name.as_str()) {
                    continue;
                }
                ran += 1;
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    check(rig, &name, cell, client, stream);
                }));
                if let Err(e) = result {
                    let msg = crate::harness::panic_text(&*e).unwrap_or_default();
                    failures.push(format!("{name}: {msg}"));
                }
            }
        }
    }
    assert_eq!(ran + skip.len(), 18, "{kind}: every cell ran or is skipped");
    assert!(
        failures.is_empty(),
        "{kind}: {} of {ran} cells failed:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// One test per provider kind: `provider_battery!(name => rig_fn, skip [cells...]);`. A
/// skipped cell is named as the failure message names it (`"kind Cell Client stream"`) and
/// carries a comment naming the Sluice bug that keeps it out.
macro_rules! provider_battery {
    ($($kind:ident => $rig:path $(, skip [$($skip:literal),* $(,)?])?;)+) => {
        $(
            #[test]
            fn $kind() {
                let rig = $rig();
                run_battery(stringify!($kind), &rig, &[$($($skip),*)?]);
            }
        )+
    };
}

provider_battery! {
    openai => openai_rig;
    anthropic => anthropic_rig;
    azure_openai => azure_openai_rig;
    openai_responses => openai_responses_rig;
    azure_responses => azure_responses_rig;
    gemini => gemini_rig;
    vertex_claude => vertex_claude_rig;
    vertex_gemini => vertex_gemini_rig;
    bedrock_claude => bedrock_claude_rig;
    bedrock_converse => bedrock_converse_rig;
}
