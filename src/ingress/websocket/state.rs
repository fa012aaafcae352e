//! Owns what a Responses WebSocket remembers between its responses, and how a client
//! message becomes the body of one `POST /v1/responses`.
//!
//! **State.** The socket keeps the last response it answered: its id, and its whole
//! conversation as items (the input it was sent with, history included, then the output
//! items of its `response.completed` or `response.incomplete`). A `response.create` whose
//! `previous_response_id` names that response is expanded on the socket (input = that
//! conversation + the new input; `previous_response_id` removed), so a follow-up carries only
//! its new items and works with `store: false`, on every provider kind. Any other
//! `previous_response_id` goes to the response store unchanged, as over HTTP
//! ([`crate::conversation::expand`]); the socket then keeps no conversation for that
//! response's successor (the store has it, or nobody does). The kept conversation is bounded
//! by `server.max_request_body_bytes` (a longer one could not be sent as a body anyway): past
//! it the socket forgets it, and a follow-up naming it gets `previous_response_not_found`
//! telling the client to send the full input.
//!
//! **Messages.** `response.create` carries the fields of `POST /v1/responses` (minus
//! `stream`, implied, and `background`, refused) plus `stream_id` (the lane: echoed on every
//! event of the response, not sent upstream). `response.cancel` (Sluice's extension; OpenAI's
//! client events are `response.create` and `response.steer`) cancels the response in flight.

use bytes::Bytes;
use serde_json::{Map, Value};

use crate::conversation::expand::own_items;

/// A client message, decoded.
#[derive(Debug)]
pub enum ClientMessage {
    /// `response.create`: the request (not yet expanded).
    Create(Box<Map<String, Value>>),
    /// `response.cancel`: cancel the response in flight.
    Cancel,
    /// Another `type` (named) or none (`""`).
    Unknown(String),
}

/// A refusal of a client message: the `error` event's status, code, message and param.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// HTTP status the same problem has over HTTP.
    pub status: u16,
    /// OpenAI-style error code.
    pub code: &'static str,
    /// Human-readable reason.
    pub message: String,
    /// The offending field, if one.
    pub param: Option<&'static str>,
}

impl Refusal {
    fn invalid(
        code: &'static str,
        message: impl Into<String>,
        param: Option<&'static str>,
    ) -> Self {
        Self {
            status: 400,
            code,
            message: message.into(),
            param,
        }
    }
}

/// Decodes a text message.
///
/// # Errors
/// A [`Refusal`] (`invalid_json`) when it is not a JSON object.
pub fn decode(text: &str) -> Result<ClientMessage, Refusal> {
    let Ok(Value::Object(mut obj)) = serde_json::from_str::<Value>(text) else {
        return Err(Refusal::invalid(
            "invalid_json",
            "a message must be a JSON object with a `type`",
            None,
        ));
    };
    let kind = match obj.remove("type") {
        Some(Value::String(s)) => s,
        _ => String::new(),
    };
    Ok(match kind.as_str() {
        "response.create" => ClientMessage::Create(Box::new(obj)),
        "response.cancel" => ClientMessage::Cancel,
        _ => ClientMessage::Unknown(kind),
    })
}

/// A `response.create` made ready to run.
#[derive(Debug)]
pub struct Prepared {
    /// The `POST /v1/responses` body (`stream: true`).
    pub body: Bytes,
    /// The lane to echo on the response's events.
    pub stream_id: Option<String>,
    /// The whole input sent (items joined by commas), when the socket knows it (no
    /// `previous_response_id` left for the store): the start of the next conversation.
    pub input: Option<String>,
}

/// The last response a socket answered.
#[derive(Debug)]
struct Last {
    id: String,
    /// Its conversation: JSON items joined by commas.
    items: String,
}

/// One socket's conversation state.
#[derive(Debug)]
pub struct Conversation {
    last: Option<Last>,
    /// A response whose conversation passed the bound (forgotten).
    forgotten: Option<String>,
    /// The bound, bytes (`server.max_request_body_bytes`).
    cap: usize,
}

/// Items as comma-joined JSON.
fn join(items: &[Value]) -> String {
    let mut s = String::new();
    for (i, it) in items.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&it.to_string());
    }
    s
}

/// Appends comma-joined `b` to comma-joined `a`.
fn concat(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_string(),
        (_, true) => a.to_string(),
        _ => format!("{a},{b}"),
    }
}

impl Conversation {
    /// An empty state bounded at `cap` bytes.
    pub fn new(cap: usize) -> Self {
        Self {
            last: None,
            forgotten: None,
            cap,
        }
    }

    /// Bytes the state holds (the kept conversation).
    pub fn bytes(&self) -> usize {
        self.last.as_ref().map_or(0, |l| l.items.len() + l.id.len())
    }

    /// Makes a `response.create` the body of one `POST /v1/responses`.
    ///
    /// # Errors
    /// A [`Refusal`]: `background: true` (not over a WebSocket), or a
    /// `previous_response_id` whose conversation the socket forgot
    /// (`previous_response_not_found`).
    pub fn prepare(&self, mut req: Map<String, Value>) -> Result<Prepared, Refusal> {
        if req
            .remove("background")
            .is_some_and(|b| b == Value::Bool(true))
        {
            return Err(Refusal::invalid(
                "unsupported_parameter",
                "`background` is not supported over a WebSocket; use HTTP",
                Some("background"),
            ));
        }
        let stream_id = match req.remove("stream_id") {
            Some(Value::String(s)) => Some(s),
            _ => None,
        };
        req.remove("generate");
        req.insert("stream".into(), Value::Bool(true));
        let prev = req
            .get("previous_response_id")
            .and_then(Value::as_str)
            .map(str::to_string);
        let own = join(&own_items(req.get("input")));
        let input = match prev {
            Some(p) if self.last.as_ref().is_some_and(|l| l.id == p) => {
                let history = self.last.as_ref().map_or("", |l| l.items.as_str());
                let all = concat(history, &own);
                req.remove("previous_response_id");
                let items: Value = serde_json::from_str(&format!("[{all}]"))
                    .unwrap_or_else(|_| Value::Array(Vec::new()));
                req.insert("input".into(), items);
                Some(all)
            }
            Some(p) if self.forgotten.as_deref() == Some(p.as_str()) => {
                return Err(Refusal::invalid(
                    "previous_response_not_found",
                    format!(
                        "Previous response with id '{p}' not found: its conversation passed this socket's bound of {} bytes (server.max_request_body_bytes); send the full input without previous_response_id",
                        self.cap
                    ),
                    Some("previous_response_id"),
                ));
            }
            // The response store's (as over HTTP).
            Some(_) => None,
            None => Some(own),
        };
        let body = serde_json::to_vec(&Value::Object(req)).unwrap_or_default();
        Ok(Prepared {
            body: Bytes::from(body),
            stream_id,
            input,
        })
    }

    /// A `response.create` with `generate: false` ("prepare request state without model
    /// output", `openai` SDK 3.57.0; Codex sends one to warm a socket): answered on the
    /// socket without a subrequest (nothing goes upstream, nothing is charged or recorded in
    /// the ledger). Its input (expanded like [`Self::prepare`]'s) becomes the socket's
    /// conversation under a new response id; returns the `response` object of its
    /// `response.created` / `response.completed` events.
    ///
    /// # Errors
    /// As [`Self::prepare`]; and `previous_response_id` of a response the socket does not
    /// hold (`previous_response_not_found`: a state-only response is not stored).
    pub fn prepare_only(&mut self, req: Map<String, Value>) -> Result<Value, Refusal> {
        let model = req.get("model").cloned().unwrap_or(Value::Null);
        let store = req.get("store").cloned().unwrap_or(Value::Bool(true));
        let prev = req.get("previous_response_id").cloned();
        let prepared = self.prepare(req)?;
        let Some(input) = prepared.input else {
            return Err(Refusal::invalid(
                "previous_response_not_found",
                format!(
                    "Previous response with id '{}' not found on this socket: a response with `generate: false` continues only this socket's last response",
                    prev.as_ref().and_then(Value::as_str).unwrap_or_default()
                ),
                Some("previous_response_id"),
            ));
        };
        let id = format!("resp_{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
        let response = serde_json::json!({
            "id": id,
            "object": "response",
            "created_at": crate::conversation::now_ms() / 1000,
            "status": "completed",
            "model": model,
            "output": [],
            "previous_response_id": prev,
            "store": store,
            "error": null,
            "incomplete_details": null,
            "usage": {
                "input_tokens": 0,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": 0,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 0,
            },
        });
        self.answered(Some(input), &response);
        Ok(response)
    }

    /// Records the response that answered a request sent with `input` (see
    /// [`Prepared::input`]): `response` is the `response` object of its terminal event.
    pub fn answered(&mut self, input: Option<String>, response: &Value) {
        let id = response.get("id").and_then(Value::as_str);
        let (Some(input), Some(id)) = (input, id) else {
            self.last = None;
            self.forgotten = None;
            return;
        };
        let output = response
            .get("output")
            .and_then(Value::as_array)
            .map_or_else(String::new, |o| join(o));
        let items = concat(&input, &output);
        if items.len() > self.cap {
            self.last = None;
            self.forgotten = Some(id.to_string());
        } else {
            self.last = Some(Last {
                id: id.to_string(),
                items,
            });
            self.forgotten = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn create(v: Value) -> Map<String, Value> {
        match decode(&v.to_string()).unwrap() {
            ClientMessage::Create(m) => *m,
            other => panic!("{other:?}"),
        }
    }

    fn body(p: &Prepared) -> Value {
        serde_json::from_slice(&p.body).unwrap()
    }

    #[test]
    fn a_follow_up_naming_the_last_response_gets_the_whole_conversation() {
        let mut c = Conversation::new(10_000);
        let first = c
            .prepare(create(json!({"type":"response.create","model":"m","input":"hi","store":false,"stream_id":"lane"})))
            .unwrap();
        assert_eq!(first.stream_id.as_deref(), Some("lane"));
        let b = body(&first);
        assert_eq!(
            (b["stream"].clone(), b.get("type"), b.get("stream_id")),
            (json!(true), None, None)
        );
        c.answered(
            first.input,
            &json!({"id":"resp_1","output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"hello"}]}]}),
        );
        let second = c
            .prepare(create(json!({"type":"response.create","model":"m","previous_response_id":"resp_1","input":[{"role":"user","content":"again"}]})))
            .unwrap();
        let b = body(&second);
        assert!(b.get("previous_response_id").is_none());
        let input = b["input"].as_array().unwrap();
        assert_eq!(input.len(), 3);
        assert_eq!(input[0]["content"][0]["text"], "hi");
        assert_eq!(input[1]["role"], "assistant");
        assert_eq!(
            (input[2]["type"].clone(), input[2]["content"].clone()),
            (json!("message"), json!("again"))
        );
        assert!(second.input.is_some());
    }

    #[test]
    fn other_ids_go_to_the_store_and_a_forgotten_one_is_not_found() {
        let mut c = Conversation::new(60);
        let p = c
            .prepare(create(
                json!({"type":"response.create","previous_response_id":"resp_stored","input":"x"}),
            ))
            .unwrap();
        assert_eq!(body(&p)["previous_response_id"], "resp_stored");
        assert!(p.input.is_none());
        c.answered(p.input, &json!({"id":"resp_2","output":[]}));
        assert_eq!(c.bytes(), 0);
        // Over the bound: forgotten, and named as such.
        let p = c
            .prepare(create(
                json!({"type":"response.create","input":"y".repeat(100)}),
            ))
            .unwrap();
        c.answered(p.input, &json!({"id":"resp_3","output":[]}));
        let e = c
            .prepare(create(
                json!({"type":"response.create","previous_response_id":"resp_3","input":"z"}),
            ))
            .unwrap_err();
        assert_eq!(
            (e.code, e.param),
            ("previous_response_not_found", Some("previous_response_id"))
        );
    }

    #[test]
    fn a_state_only_response_holds_its_input_for_the_next() {
        let mut c = Conversation::new(10_000);
        let warm = c
            .prepare_only(create(json!({"type":"response.create","model":"m","generate":false,"input":"tools and context"})))
            .unwrap();
        assert_eq!(
            (warm["status"].clone(), warm["output"].clone()),
            (json!("completed"), json!([]))
        );
        let id = warm["id"].as_str().unwrap().to_string();
        let next = c
            .prepare(create(json!({"type":"response.create","model":"m","previous_response_id":id,"input":"go"})))
            .unwrap();
        let b = body(&next);
        assert_eq!(b["input"].as_array().unwrap().len(), 2);
        assert!(b.get("generate").is_none());
        let e = c
            .prepare_only(create(json!({"type":"response.create","generate":false,"previous_response_id":"resp_elsewhere"})))
            .unwrap_err();
        assert_eq!(e.code, "previous_response_not_found");
    }

    #[test]
    fn background_is_refused_and_other_types_are_named() {
        let c = Conversation::new(100);
        let e = c
            .prepare(create(json!({"type":"response.create","background":true})))
            .unwrap_err();
        assert_eq!(e.param, Some("background"));
        assert!(
            matches!(decode(r#"{"type":"session.update"}"#).unwrap(), ClientMessage::Unknown(t) if t == "session.update")
        );
        assert!(matches!(
            decode(r#"{"type":"response.cancel"}"#).unwrap(),
            ClientMessage::Cancel
        ));
        assert_eq!(decode("[1]").unwrap_err().code, "invalid_json");
    }
}
