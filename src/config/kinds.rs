//! Owns what the configuration knows of each provider kind as data: the default base URLs,
//! the checks of kind-specific keys (`api_version`) and the health probe's default path.
//! Everything a kind does at run time is its adapter's (`providers::Adapter`).

use std::fmt::Write as _;

use super::ProviderKind;

/// The default `base_url` of `kind: gemini`.
pub const GEMINI_BASE_URL: &str = "https://generativelanguage.googleapis.com/v1beta";

/// Whether `v` looks like an Azure API version (`2024-10-21`, `2025-01-01-preview`):
/// non-empty, letters, digits, `-` and `.` only (it goes into the URL as is).
pub fn valid_api_version(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 64
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
}

/// `providers.<id>.api_version`: required and well-formed for `azure_openai`, refused on
/// other kinds.
///
/// # Errors
/// `(key, message)`: the member that is wrong (`None`: the provider itself).
pub fn api_version(
    kind: ProviderKind,
    api_version: Option<String>,
) -> Result<Option<String>, (Option<&'static str>, &'static str)> {
    match (kind, api_version) {
        (ProviderKind::AzureOpenai, Some(v)) if valid_api_version(&v) => Ok(Some(v)),
        (ProviderKind::AzureOpenai, Some(_)) => Err((
            Some("api_version"),
            "must be an Azure OpenAI API version such as \"2024-10-21\" (letters, digits, `-`, `.`)",
        )),
        (ProviderKind::AzureOpenai, None) => Err((
            None,
            "api_version is required for kind azure_openai (e.g. \"2024-10-21\")",
        )),
        (_, Some(_)) => Err((Some("api_version"), "api_version is only for kind azure_openai")),
        (_, None) => Ok(None),
    }
}

/// The Azure OpenAI health probe's default path: its model list, which needs the API
/// version.
pub fn azure_health_path(api_version: &str) -> String {
    let mut p = String::from("/openai/models?api-version=");
    push_segment(&mut p, api_version);
    p
}

/// The active health probe's default path for a kind (appended to the base path): the
/// model list (`/models`; Azure's `/openai/models?api-version=...`).
pub fn health_path(kind: ProviderKind, api_version: Option<&str>) -> String {
    match (kind, api_version) {
        (ProviderKind::AzureOpenai, Some(v)) => azure_health_path(v),
        _ => "/models".to_string(),
    }
}

/// Appends `s` percent-encoded as one URL path segment (RFC 3986 unreserved characters
/// kept).
pub fn push_segment(out: &mut String, s: &str) {
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
}
