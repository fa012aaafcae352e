//! Owns the request side of the conversation state, for `POST /v1/responses`: a body's
//! `previous_response_id` and `item_reference` items resolved by tenant into its `input`
//! before the request is decoded, routed or translated (so it works for every provider
//! kind and across fallback). The new `input` is the chain of previous responses' input and
//! output items, oldest first, then this request's input with each `item_reference`
//! replaced by the stored item. `instructions` are not carried over (OpenAI's documented
//! behaviour); `previous_response_id` and `store` stay in the body (the response echo
//! reads them). The expanded body is held like any body (its bytes count against
//! `server.max_buffered_request_bytes`; `server.max_request_body_bytes` bounds what the
//! client sends, not the history). Another tenant's id is an unknown id: the same status and body (400 naming
//! `previous_response_id`, 404 for an item).
//!
//! With the store off (`response_store.enabled: false`), `previous_response_id`,
//! `store: true` and `item_reference` inputs are refused with a 400 naming the field.

use serde_json::{Map, Value};

use super::capture::Capture;
use super::{Handle, StoreError};
use crate::error::GatewayError;

/// A Responses body after resolution.
#[derive(Debug, Default)]
pub struct Expanded {
    /// The rewritten body (`None`: unchanged).
    pub body: Option<Vec<u8>>,
    /// What to store once answered (`None`: `store: false`, or no store).
    pub capture: Option<Capture>,
}

/// The 400 of a state field with the store off (the wording of the refusal before the store
/// existed, naming the switch).
fn off(field: &str) -> GatewayError {
    GatewayError::invalid(
        format!(
            "unsupported `{field}`: there is no response storage (response_store.enabled is false); send the full input"
        ),
        Some(field),
    )
}

fn store_error(e: &StoreError) -> GatewayError {
    GatewayError::Overloaded {
        message: e.to_string(),
        reason: "response_store",
        retry_after: std::time::Duration::from_secs(1),
    }
}

/// Resolves `body` for `tenant` (see the module doc). A body that is not a JSON object, or
/// whose members have the wrong types, is left for the decoder to refuse.
///
/// # Errors
/// 400 for a state field with the store off, and for an unknown (or another tenant's)
/// `previous_response_id` (`param` names it, as OpenAI answers); 404 for an unknown
/// referenced item (OpenAI's `Item with id '…' not found.`); 503 when the store cannot answer.
pub async fn expand(
    store: Option<&Handle>,
    tenant: &str,
    body: &[u8],
) -> Result<Expanded, GatewayError> {
    if store.is_some() && stateless(body) {
        return Ok(Expanded::default());
    }
    let Ok(Value::Object(mut obj)) = serde_json::from_slice::<Value>(body) else {
        return Ok(Expanded::default());
    };
    let prev = obj
        .get("previous_response_id")
        .and_then(Value::as_str)
        .map(str::to_string);
    let store_flag = obj.get("store").and_then(Value::as_bool);
    let refs: Vec<usize> = match obj.get("input") {
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .filter(|(_, it)| it.get("type").and_then(Value::as_str) == Some("item_reference"))
            .map(|(i, _)| i)
            .collect(),
        _ => Vec::new(),
    };
    let Some(store) = store else {
        if prev.is_some() {
            return Err(off("previous_response_id"));
        }
        if store_flag == Some(true) {
            return Err(off("store"));
        }
        if let Some(i) = refs.first() {
            return Err(off(&format!("input[{i}].type")));
        }
        return Ok(Expanded::default());
    };
    let stored = store_flag != Some(false);
    if !stored && prev.is_none() && refs.is_empty() {
        return Ok(Expanded::default());
    }
    let mut own = own_items(obj.get("input"));
    for &i in &refs {
        let id = own[i]
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let found = store
            .item(tenant, &id)
            .await
            .map_err(|e| store_error(&e))?
            .and_then(|j| serde_json::from_str::<Value>(&j).ok());
        match found {
            Some(item) => own[i] = item,
            None => {
                return Err(GatewayError::NotFound {
                    message: format!("Item with id '{id}' not found."),
                    code: "not_found",
                })
            }
        }
    }
    let mut history = Vec::new();
    if let Some(p) = &prev {
        let chain = store
            .chain(tenant, p)
            .await
            .map_err(|e| store_error(&e))?
            // OpenAI's answer to an unknown id: a 400 naming the parameter.
            .ok_or_else(|| {
                GatewayError::invalid(
                    format!("Previous response with id '{p}' not found."),
                    Some("previous_response_id"),
                )
            })?;
        history = chain
            .iter()
            .filter_map(|j| serde_json::from_str::<Value>(j).ok())
            .collect();
    }
    let body = if prev.is_some() || !refs.is_empty() {
        let mut input = history;
        input.extend(own.iter().cloned());
        obj.insert("input".into(), Value::Array(input));
        Some(
            serde_json::to_vec(&Value::Object(obj))
                .map_err(|e| GatewayError::Internal(e.to_string()))?,
        )
    } else {
        None
    };
    Ok(Expanded {
        body,
        capture: stored.then(|| Capture {
            tenant: tenant.to_string(),
            previous_response_id: prev,
            input: own,
            answer: None,
        }),
    })
}

/// Whether the body certainly needs nothing of the store: `store: false` at the top level and
/// neither `previous_response_id` nor `item_reference` anywhere (Codex's requests): decided
/// without building the body's tree (a byte search, then a scan that skips every member but
/// `store`), so those requests are parsed once, by the decoder, as before the store.
fn stateless(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Peek {
        #[serde(default)]
        store: Option<bool>,
    }
    use memchr::memmem::find;
    find(body, b"previous_response_id").is_none()
        && find(body, b"item_reference").is_none()
        && serde_json::from_slice::<Peek>(body).is_ok_and(|p| p.store == Some(false))
}

/// The request's own input as items: a string is one user message; an item without `type`
/// (the easy message form) is a `message`.
pub(crate) fn own_items(input: Option<&Value>) -> Vec<Value> {
    match input {
        Some(Value::String(s)) => {
            let mut m = Map::new();
            m.insert("type".into(), "message".into());
            m.insert("role".into(), "user".into());
            m.insert(
                "content".into(),
                serde_json::json!([{"type": "input_text", "text": s}]),
            );
            vec![Value::Object(m)]
        }
        Some(Value::Array(items)) => items
            .iter()
            .map(|it| match it {
                Value::Object(o) if !o.contains_key("type") && o.contains_key("role") => {
                    let mut o = o.clone();
                    o.insert("type".into(), "message".into());
                    Value::Object(o)
                }
                other => other.clone(),
            })
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_top_level_store_false_without_state_skips_the_parse() {
        assert!(stateless(br#"{"model":"m","store":false,"input":"hi"}"#));
        assert!(
            !stateless(br#"{"model":"m","input":"hi"}"#),
            "store defaults to true"
        );
        assert!(!stateless(
            br#"{"model":"m","metadata":{"store":false},"input":"hi"}"#
        ));
        assert!(!stateless(
            br#"{"model":"m","store":false,"previous_response_id":"resp_1","input":"hi"}"#
        ));
        assert!(!stateless(
            br#"{"store":false,"input":[{"type":"item_reference","id":"x"}]}"#
        ));
        assert!(!stateless(b"not json"));
    }

    #[test]
    fn own_items_give_the_easy_forms_their_type() {
        assert_eq!(
            own_items(Some(&Value::from("hi"))),
            [
                serde_json::json!({"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]})
            ]
        );
        let items = serde_json::json!([{"role":"user","content":"x"},{"type":"function_call_output","call_id":"c","output":"o"}]);
        let own = own_items(Some(&items));
        assert_eq!(own[0]["type"], "message");
        assert_eq!(own[1], items[1]);
    }

    #[tokio::test]
    async fn with_the_store_off_each_state_field_is_a_400_naming_it() {
        for (body, param) in [
            (
                r#"{"model":"m","input":"x","previous_response_id":"r"}"#,
                "previous_response_id",
            ),
            (r#"{"model":"m","input":"x","store":true}"#, "store"),
            (
                r#"{"model":"m","input":["a",{"type":"item_reference","id":"i"}]}"#,
                "input[1].type",
            ),
        ] {
            let e = expand(None, "t", body.as_bytes()).await.unwrap_err();
            assert_eq!(e.status(), 400);
            assert!(
                matches!(&e, GatewayError::InvalidRequest { param: Some(p), .. } if p == param),
                "{e:?}"
            );
        }
        let plain = expand(None, "t", br#"{"model":"m","input":"x"}"#)
            .await
            .unwrap();
        assert!(plain.body.is_none() && plain.capture.is_none());
    }
}
