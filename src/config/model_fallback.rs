//! Owns the checks of the model-level fallback keys, `models.<id>.fallback_models` and
//! `models.<id>.context_fallback_models` (see [`crate::engine::fallback`] for what they do):
//! every id names a configured standard model, none names the model itself, none is listed
//! twice, and the context fallbacks form no cycle (each step is meant to go to a larger
//! context window, so a way back is a mistake in the file).
//!
//! `fallback_models` may name each other (`a` → `b` and `b` → `a` is a pair of backups):
//! a request follows only the list of the model it asked for, so no request loops. Errors
//! are located like the loader's others: file, line, key path (`models.<id>.<key>[i]`).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::error::ConfigError;
use super::Model;

/// Checks both fallback lists of every model of `models`; `err(key, message)` locates a
/// problem in the main file.
///
/// # Errors
/// The first unknown id, self-reference, duplicate or context-fallback cycle.
pub(super) fn check(
    models: &BTreeMap<String, Arc<Model>>,
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<(), ConfigError> {
    for (id, m) in models {
        for (key, list) in [
            ("fallback_models", &m.fallback_models),
            ("context_fallback_models", &m.context_fallback_models),
        ] {
            for (i, f) in list.iter().enumerate() {
                let at = format!("models.{id}.{key}[{i}]");
                if !models.contains_key(f) {
                    let known: Vec<&str> = models.keys().map(String::as_str).collect();
                    return Err(err(
                        &at,
                        format!("unknown standard model `{f}` (known: {})", known.join(", ")),
                    ));
                }
                if f == id {
                    return Err(err(&at, format!("`{id}` cannot fall back to itself")));
                }
                if list[..i].contains(f) {
                    return Err(err(&at, format!("`{f}` is listed twice")));
                }
            }
        }
    }
    for id in models.keys() {
        if let Some(cycle) = context_cycle(models, id) {
            return Err(err(
                &format!("models.{id}.context_fallback_models"),
                format!(
                    "context fallbacks form a cycle: {} (each should lead to a larger context window)",
                    cycle.join(" -> ")
                ),
            ));
        }
    }
    Ok(())
}

/// A cycle of `context_fallback_models` through `start`, as the ids along it (`start`
/// first and last), if there is one. Depth-first over the lists (every id exists).
fn context_cycle<'a>(
    models: &'a BTreeMap<String, Arc<Model>>,
    start: &'a str,
) -> Option<Vec<&'a str>> {
    fn walk<'a>(
        models: &'a BTreeMap<String, Arc<Model>>,
        start: &'a str,
        at: &'a str,
        path: &mut Vec<&'a str>,
        seen: &mut Vec<&'a str>,
    ) -> bool {
        let Some(m) = models.get(at) else {
            return false;
        };
        for next in &m.context_fallback_models {
            if next == start {
                path.push(next);
                return true;
            }
            if seen.contains(&next.as_str()) {
                continue;
            }
            seen.push(next);
            path.push(next);
            if walk(models, start, next, path, seen) {
                return true;
            }
            path.pop();
        }
        false
    }
    let mut path = vec![start];
    let mut seen = Vec::new();
    walk(models, start, start, &mut path, &mut seen).then_some(path)
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn load(models: &str) -> Result<Config, crate::config::ConfigError> {
        let yaml = format!(
            "tenants:\n  t: {{}}\nvirtual_keys:\n  - key: sk-test-fallback-0001\n    tenant: t\nproviders:\n  p:\n    kind: openai\n    base_url: http://127.0.0.1:1/v1\n    health_check: {{enabled: false}}\nmodels:\n{models}"
        );
        Config::parse(std::path::Path::new("c.yaml"), &yaml)
    }

    const ROUTE: &str = "    routes:\n      - {provider: p, upstream_model: x}\n";

    #[test]
    fn fallback_lists_load_and_route_windows_default_to_the_models() {
        let c = load(&format!(
            "  a:\n    fallback_models: [b]\n    context_fallback_models: [c]\n    context_window_tokens: 8000\n    routes:\n      - {{provider: p, upstream_model: x}}\n      - {{provider: p, upstream_model: y, context_window_tokens: 32000}}\n  b:\n    fallback_models: [a]\n{ROUTE}  c:\n{ROUTE}"
        ))
        .unwrap();
        let a = &c.models["a"];
        assert_eq!(a.fallback_models, ["b"]);
        assert_eq!(a.context_fallback_models, ["c"]);
        assert_eq!(a.routes[0].context_window_tokens, Some(8000));
        assert_eq!(a.routes[1].context_window_tokens, Some(32000));
        assert_eq!(c.models["c"].routes[0].context_window_tokens, None);
        // Mutual backups are fine: a request follows only its own model's list.
        assert_eq!(c.models["b"].fallback_models, ["a"]);
    }

    #[test]
    fn unknown_self_duplicate_and_cyclic_fallbacks_are_located_errors() {
        for (models, key, says) in [
            (
                format!("  a:\n    fallback_models: [zz]\n{ROUTE}"),
                "models.a.fallback_models[0]",
                "unknown standard model `zz`",
            ),
            (
                format!("  a:\n    fallback_models: [a]\n{ROUTE}"),
                "models.a.fallback_models[0]",
                "itself",
            ),
            (
                format!("  a:\n    context_fallback_models: [b, b]\n{ROUTE}  b:\n{ROUTE}"),
                "models.a.context_fallback_models[1]",
                "twice",
            ),
            (
                format!("  a:\n    context_fallback_models: [b]\n{ROUTE}  b:\n    context_fallback_models: [c]\n{ROUTE}  c:\n    context_fallback_models: [a]\n{ROUTE}"),
                "models.a.context_fallback_models",
                "a -> b -> c -> a",
            ),
            (
                format!("  a:\n    context_window_tokens: 0\n{ROUTE}"),
                "models.a.context_window_tokens",
                "at least 1",
            ),
            (
                "  a:\n    routes:\n      - {provider: p, upstream_model: x, context_window_tokens: 0}\n".to_string(),
                "models.a.routes[0].context_window_tokens",
                "at least 1",
            ),
        ] {
            let e = load(&models).unwrap_err();
            assert_eq!(e.key_path, key, "{e}");
            assert!(e.to_string().contains(says), "{e}");
            assert!(e.line.is_some(), "located: {e}");
        }
    }
}
