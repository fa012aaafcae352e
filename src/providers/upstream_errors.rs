//! Owns two judgements about an upstream's error answer that do not depend on the provider
//! kind: whether it says the route's model does not exist there ([`is_model_not_found`]),
//! and the masking of the route's upstream model id in error text relayed to a client
//! ([`mask_upstream_model`]): a client asked for a standard model and never learns which
//! upstream model (dated id, deployment name, ARN) a route maps it to.

/// Whether an upstream error (`status`, its normalized `code` and `message`) says the
/// provider does not know the route's model `upstream_model`:
///
/// - OpenAI and OpenAI-compatible servers (vLLM, Groq, OpenRouter, ...): 404
///   `code: model_not_found`, "The model `x` does not exist or you do not have access to it";
/// - Azure OpenAI: 404 `DeploymentNotFound` ("The API deployment for this resource does not
///   exist");
/// - Anthropic (also through Vertex AI): 404 `not_found_error`, "model: claude-x";
/// - Gemini and Vertex AI: 404 `NOT_FOUND`, "models/x is not found for API version v1beta"
///   / "Publisher Model `...` was not found";
/// - Bedrock: 404 `ResourceNotFoundException` ("Model not found"), or 400 "The provided
///   model identifier is invalid".
///
/// A 404 counts when its code or message names a model or deployment, or the message
/// names `upstream_model`; a 400 only for Bedrock's invalid model identifier.
pub fn is_model_not_found(
    status: u16,
    code: Option<&str>,
    message: &str,
    upstream_model: &str,
) -> bool {
    let m = message.to_ascii_lowercase();
    match status {
        404 => {
            let code = code.unwrap_or_default().to_ascii_lowercase();
            code.contains("model")
                || code.contains("deployment")
                || m.contains("model")
                || m.contains("deployment")
                || (!upstream_model.is_empty() && message.contains(upstream_model))
        }
        400 => m.contains("model identifier is invalid"),
        _ => false,
    }
}

/// Whether `c` may be part of a model id (letters, digits and `-._:/@`).
fn id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | ':' | '/' | '@')
}

/// `text` with every mention of `upstream_model` replaced by `standard_model`. A mention is
/// the id as a whole token, or the id followed by a separator (`-`, `.`, `:`, `@`) and more
/// of an id, as providers name a dated or versioned form of the model asked for
/// (`gpt-4o` → `gpt-4o-2024-08-06`, `claude-x` → `claude-x@20250101`); the whole token is
/// replaced. A token that merely starts with the same letters (`m` in `model`) is not one.
pub fn mask_upstream_model(text: &str, upstream_model: &str, standard_model: &str) -> String {
    if upstream_model.is_empty() || !text.contains(upstream_model) {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(upstream_model) {
        let before = rest[..at].chars().next_back();
        let after_id = &rest[at + upstream_model.len()..];
        let starts_token = !before.is_some_and(|c| c.is_ascii_alphanumeric());
        // The id ends there, or goes on after a separator (a dated or versioned form).
        let ends_ok = after_id
            .chars()
            .next()
            .is_none_or(|c| !id_char(c) || matches!(c, '-' | '.' | ':' | '@'));
        if starts_token && ends_ok {
            out.push_str(&rest[..at]);
            out.push_str(standard_model);
            // The rest of the token (a date, a version suffix), trailing sentence punctuation
            // left alone.
            let tail = after_id
                .find(|c: char| !id_char(c))
                .unwrap_or(after_id.len());
            let token = after_id[..tail].trim_end_matches(['.', ':', '/', '-']);
            rest = &after_id[token.len()..];
        } else {
            let step = at + upstream_model.len();
            out.push_str(&rest[..step]);
            rest = &rest[step..];
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_not_found_answers_of_every_provider_shape_are_recognised() {
        let yes = [
            (
                404,
                Some("model_not_found"),
                "The model `gpt-9` does not exist or you do not have access to it.",
            ),
            (
                404,
                Some("DeploymentNotFound"),
                "The API deployment for this resource does not exist.",
            ),
            (404, Some("not_found_error"), "model: claude-nope"),
            (
                404,
                Some("NOT_FOUND"),
                "models/gemini-0 is not found for API version v1beta",
            ),
            (404, None, "Model not found"),
            (400, None, "The provided model identifier is invalid."),
        ];
        for (status, code, message) in yes {
            assert!(is_model_not_found(status, code, message, "x"), "{message}");
        }
        assert!(is_model_not_found(
            404,
            None,
            "no such thing: gpt-9",
            "gpt-9"
        ));
        let no = [
            (404, None, "Not Found"),
            (400, Some("invalid_request_error"), "model: field required"),
            (500, Some("model_not_found"), "The model is overloaded"),
            (429, None, "Rate limit reached for model gpt-9"),
        ];
        for (status, code, message) in no {
            assert!(
                !is_model_not_found(status, code, message, "gpt-9"),
                "{message}"
            );
        }
    }

    #[test]
    fn upstream_model_ids_are_masked_as_whole_tokens_with_their_dated_forms() {
        let m = |t: &str| mask_upstream_model(t, "gpt-4o", "acme/chat");
        assert_eq!(
            m("This model's maximum context length is 128000 tokens (gpt-4o-2024-08-06)."),
            "This model's maximum context length is 128000 tokens (acme/chat)."
        );
        assert_eq!(
            m("The model `gpt-4o` does not exist."),
            "The model `acme/chat` does not exist."
        );
        assert_eq!(m("gpt-4o."), "acme/chat.");
        assert_eq!(m("see gpt-4omega"), "see gpt-4omega");
        assert_eq!(m("nothing here"), "nothing here");
        assert_eq!(
            mask_upstream_model("m is not the model", "m", "std"),
            "std is not the model"
        );
        assert_eq!(
            mask_upstream_model(
                "publishers/x/models/claude-x@20250101 not found",
                "claude-x",
                "std"
            ),
            "publishers/x/models/std not found"
        );
    }
}
