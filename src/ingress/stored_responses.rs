//! Owns the stored-response endpoints of the Responses API
//! (<https://platform.openai.com/docs/api-reference/responses/get>, `/delete`,
//! `/input-items`), served from [`crate::conversation`]:
//!
//! - `GET /v1/responses/{id}`: the stored Response object, as the client first got it.
//! - `DELETE /v1/responses/{id}`: `{"id","object":"response","deleted":true}`; the
//!   response and its items are deleted from the database.
//! - `GET /v1/responses/{id}/input_items?limit=&order=&after=`: OpenAI's list
//!   `{"object":"list","data":[item],"first_id","last_id","has_more"}` of the request's own
//!   input items (item references resolved; an item without an `id` gets the one Sluice
//!   stored it under); `limit` 1–100 (default 20), `order` `asc` or `desc` (default),
//!   `after` an item id of the list.
//!
//! Authenticated by virtual key like `POST /v1/responses` and scoped to its tenant: an id of
//! another tenant, an expired one and an unknown one are the same 404 in OpenAI's error
//! shape; so is every id while the store is off.

use pingora::proxy::Session;
use serde_json::{json, Value};

use crate::engine::attempt::ClientGone;
use crate::error::GatewayError;
use crate::ingress::access::authenticate;
use crate::ingress::respond::{self, ChatError};
use crate::protocol::ClientDialect;
use crate::proxy::ctx::RequestCtx;
use crate::proxy::gateway::Gateway;

/// Serves `GET`/`DELETE` on `path` (after the `/v1` prefix, starting `/responses/`).
///
/// # Errors
/// A [`ChatError`] for the caller to write (or the client is gone).
pub(crate) async fn handle(
    gw: &Gateway,
    session: &mut Session,
    ctx: &mut RequestCtx,
    path: &str,
    method: &str,
) -> Result<(), ChatError> {
    ctx.dialect = ClientDialect::Responses;
    let caller = authenticate(gw, session, ctx)?;
    let rest = path.trim_start_matches("/responses/");
    let (raw_id, list) = match rest.strip_suffix("/input_items") {
        Some(id) => (id, true),
        None => (rest, false),
    };
    let id = percent_encoding::percent_decode_str(raw_id)
        .decode_utf8_lossy()
        .into_owned();
    if id.is_empty() || id.contains('/') {
        return Err(unknown_path(session).into());
    }
    let not_found = || GatewayError::NotFound {
        message: format!("Response with id '{id}' not found."),
        code: "not_found",
    };
    let Some(store) = crate::conversation::running() else {
        return Err(not_found().into());
    };
    let busy = |e: crate::conversation::StoreError| GatewayError::Overloaded {
        message: e.to_string(),
        reason: "response_store",
        retry_after: std::time::Duration::from_secs(1),
    };
    let tenant = caller.tenant.as_str();
    let body: Vec<u8> = match (method, list) {
        ("GET", false) => store
            .get(tenant, &id)
            .await
            .map_err(busy)?
            .ok_or_else(not_found)?
            .into_bytes(),
        ("DELETE", false) => {
            if !store.delete(tenant, &id).await.map_err(busy)? {
                return Err(not_found().into());
            }
            serde_json::to_vec(&json!({"id": id, "object": "response", "deleted": true}))
                .map_err(|e| GatewayError::Internal(e.to_string()))?
        }
        ("GET", true) => {
            let q = Query::parse(session.req_header().uri.query().unwrap_or(""))?;
            let items = store
                .input_items(tenant, &id)
                .await
                .map_err(busy)?
                .ok_or_else(not_found)?;
            serde_json::to_vec(&q.page(items)).map_err(|e| GatewayError::Internal(e.to_string()))?
        }
        _ => return Err(GatewayError::MethodNotAllowed(method.to_string()).into()),
    };
    respond::write_json(session, ctx, 200, body, &[])
        .await
        .map_err(|_| ChatError::Gone(ClientGone("writing")))
}

fn unknown_path(session: &Session) -> GatewayError {
    GatewayError::NotFound {
        message: format!("unknown path `{}`", session.req_header().uri.path()),
        code: "not_found",
    }
}

/// The list parameters of `input_items`.
#[derive(Debug, PartialEq, Eq)]
struct Query {
    limit: usize,
    ascending: bool,
    after: Option<String>,
}

impl Query {
    fn parse(q: &str) -> Result<Self, GatewayError> {
        let mut me = Query {
            limit: 20,
            ascending: false,
            after: None,
        };
        for pair in q.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = percent_encoding::percent_decode_str(&v.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned();
            match k {
                "limit" => {
                    me.limit = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=100).contains(n))
                        .ok_or_else(|| {
                            GatewayError::invalid(
                                "`limit` must be an integer from 1 to 100",
                                Some("limit"),
                            )
                        })?;
                }
                "order" => {
                    me.ascending = match v.as_str() {
                        "asc" => true,
                        "desc" => false,
                        _ => {
                            return Err(GatewayError::invalid(
                                "`order` must be `asc` or `desc`",
                                Some("order"),
                            ))
                        }
                    }
                }
                "after" => me.after = Some(v),
                // `include[]` asks for extra data Sluice does not keep apart: the items are
                // returned as stored.
                _ => {}
            }
        }
        Ok(me)
    }

    /// One page of `items` (stored order) in OpenAI's list shape.
    fn page(&self, items: Vec<crate::conversation::StoredItem>) -> Value {
        let mut items = items;
        if !self.ascending {
            items.reverse();
        }
        let start = match &self.after {
            Some(a) => items
                .iter()
                .position(|i| &i.id == a)
                .map_or(items.len(), |p| p + 1),
            None => 0,
        };
        let rest = &items[start.min(items.len())..];
        let page = &rest[..self.limit.min(rest.len())];
        let data: Vec<Value> = page
            .iter()
            .map(|i| {
                let mut v: Value = serde_json::from_str(&i.json).unwrap_or(Value::Null);
                if let Value::Object(o) = &mut v {
                    o.entry("id").or_insert_with(|| Value::from(i.id.clone()));
                }
                v
            })
            .collect();
        json!({
            "object": "list",
            "data": data,
            "first_id": page.first().map(|i| i.id.clone()),
            "last_id": page.last().map(|i| i.id.clone()),
            "has_more": rest.len() > page.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::StoredItem;

    fn items(n: usize) -> Vec<StoredItem> {
        (0..n)
            .map(|i| StoredItem {
                id: format!("i{i}"),
                json: if i == 0 {
                    r#"{"type":"message"}"#.into()
                } else {
                    format!(r#"{{"id":"i{i}","type":"message"}}"#)
                },
            })
            .collect()
    }

    #[test]
    fn input_items_pages_in_openais_list_shape() {
        let q = Query::parse("").unwrap();
        assert_eq!(
            (q.limit, q.ascending, q.after.as_deref()),
            (20, false, None)
        );
        let p = q.page(items(3));
        assert_eq!(p["first_id"], "i2");
        assert_eq!(p["last_id"], "i0");
        assert_eq!(
            p["data"][2]["id"], "i0",
            "an item without id gets its stored one"
        );
        assert_eq!(p["has_more"], false);
        let q = Query::parse("limit=2&order=asc").unwrap();
        let p = q.page(items(3));
        assert_eq!(p["data"].as_array().unwrap().len(), 2);
        assert_eq!(p["has_more"], true);
        let q = Query::parse("limit=2&order=asc&after=i1").unwrap();
        let p = q.page(items(3));
        assert_eq!(p["first_id"], "i2");
        assert_eq!(p["has_more"], false);
        let q = Query::parse("after=nope").unwrap();
        assert_eq!(q.page(items(3))["data"], json!([]));
        assert!(Query::parse("limit=0").is_err());
        assert!(Query::parse("order=up").is_err());
    }
}
