//! Owns the capture of a Responses answer for the store: what the request brought (its
//! tenant, `previous_response_id` and own input items, from [`super::expand`]) and what the
//! client received, the unary body or the client-bound terminal stream event
//! (`response.completed` / `response.incomplete`), made into a [`StoredResponse`] once the
//! answer was sent. The stream side keeps only the output chunk that carried the terminal
//! event (found by a byte search as chunks leave; parsed once, at the end), so the capture is
//! independent of translation or passthrough and of how the events were written.

use bytes::Bytes;
use serde_json::Value;

use super::{StoredItem, StoredResponse};

/// What a stored request brought, waiting for its answer (on the request context).
#[derive(Debug, Clone)]
pub struct Capture {
    /// The tenant of the virtual key.
    pub tenant: String,
    /// The request's `previous_response_id`.
    pub previous_response_id: Option<String>,
    /// The request's own input items, item references resolved.
    pub input: Vec<Value>,
    /// What the client received: the unary body, or the stream chunk with its terminal event.
    pub answer: Option<Answer>,
}

/// What the client received.
#[derive(Debug, Clone)]
pub enum Answer {
    /// A non-streaming answer's body (the Response object).
    Unary(Bytes),
    /// The client-bound stream chunk that carried `response.completed` or
    /// `response.incomplete` (whole SSE events).
    Stream(Bytes),
}

/// The two terminal events of a stream whose response is stored.
const TERMINAL: [&[u8]; 2] = [b"response.completed", b"response.incomplete"];

/// Whether a client-bound stream chunk may carry a terminal event (a byte search; the
/// final parse decides).
pub fn may_be_terminal(chunk: &[u8]) -> bool {
    TERMINAL
        .iter()
        .any(|t| memchr::memmem::find(chunk, t).is_some())
}

impl Capture {
    /// The stored response, when the answer was a completed or incomplete Response object
    /// with an id other than the one it continues (anything else, a failed or cut-off
    /// answer, is not stored).
    pub fn into_stored(self, now_ms: i64) -> Option<StoredResponse> {
        let raw = match self.answer? {
            Answer::Unary(b) => String::from_utf8(b.to_vec()).ok()?,
            Answer::Stream(b) => terminal_response(&b)?,
        };
        let v: Value = serde_json::from_str(&raw).ok()?;
        let id = v.get("id")?.as_str()?.to_string();
        // An answer that reuses the id it continues (an upstream's non-unique ids) would
        // make the conversation a cycle: not stored.
        if self.previous_response_id.as_deref() == Some(id.as_str()) {
            return None;
        }
        if !matches!(
            v.get("status").and_then(Value::as_str),
            Some("completed" | "incomplete")
        ) {
            return None;
        }
        let model = v
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let bare = id.strip_prefix("resp_").unwrap_or(&id).to_string();
        let items = |list: Vec<&Value>, tag: &str| -> Vec<StoredItem> {
            list.into_iter()
                .enumerate()
                .map(|(n, it)| StoredItem {
                    id: it
                        .get("id")
                        .and_then(Value::as_str)
                        .map_or_else(|| format!("item_{bare}_{tag}{n}"), str::to_string),
                    json: it.to_string(),
                })
                .collect()
        };
        let input = items(self.input.iter().collect(), "i");
        let output = items(
            v.get("output")
                .and_then(Value::as_array)
                .map(|a| a.iter().collect())
                .unwrap_or_default(),
            "o",
        );
        let size_bytes = (raw.len() + input.iter().map(|i| i.json.len()).sum::<usize>()) as u64;
        Some(StoredResponse {
            id,
            tenant: self.tenant,
            created_ms: now_ms,
            model,
            previous_response_id: self.previous_response_id,
            input,
            output,
            response: raw,
            size_bytes,
        })
    }
}

/// The `response` member, as sent, of the terminal event in a chunk of SSE events.
fn terminal_response(chunk: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(chunk).ok()?;
    let mut found = None;
    for event in text.split("\n\n") {
        let data: String = event
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect::<Vec<_>>()
            .join("\n");
        if !may_be_terminal(data.as_bytes()) {
            continue;
        }
        let Ok(v) = serde_json::from_str::<Value>(&data) else {
            continue;
        };
        if matches!(
            v.get("type").and_then(Value::as_str),
            Some("response.completed" | "response.incomplete")
        ) {
            found = member_text(&data, "response").map(str::to_string);
        }
    }
    found
}

/// The text of top-level member `key` of the JSON object `json` (valid JSON), as written.
fn member_text<'a>(json: &'a str, key: &str) -> Option<&'a str> {
    let b = json.as_bytes();
    let mut i = json.find('{')? + 1;
    let skip_ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    loop {
        skip_ws(&mut i);
        if b.get(i) != Some(&b'"') {
            return None;
        }
        let kend = value_end(b, i)?;
        let name: String = serde_json::from_str(&json[i..kend]).ok()?;
        i = kend;
        skip_ws(&mut i);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i += 1;
        skip_ws(&mut i);
        let vend = value_end(b, i)?;
        if name == key {
            return Some(&json[i..vend]);
        }
        i = vend;
        skip_ws(&mut i);
        match b.get(i) {
            Some(b',') => i += 1,
            _ => return None,
        }
    }
}

/// The end (exclusive) of the JSON value starting at `start`.
fn value_end(b: &[u8], start: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = start;
    let mut in_str = false;
    while i < b.len() {
        let c = b[i];
        if in_str {
            match c {
                b'\\' => i += 1,
                b'"' => {
                    in_str = false;
                    if depth == 0 {
                        return Some(i + 1);
                    }
                }
                _ => {}
            }
        } else {
            match c {
                b'"' => in_str = true,
                b'}' | b']' | b',' if depth == 0 => return Some(i),
                b'{' | b'[' => depth += 1,
                b'}' | b']' => {
                    depth = depth.checked_sub(1)?;
                    if depth == 0 {
                        return Some(i + 1);
                    }
                }
                _ if depth == 0 && c.is_ascii_whitespace() => return Some(i),
                _ => {}
            }
        }
        i += 1;
    }
    (depth == 0 && !in_str).then_some(b.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capture(answer: Answer) -> Capture {
        Capture {
            tenant: "t".into(),
            previous_response_id: Some("resp_0".into()),
            input: vec![serde_json::json!({"type":"message","role":"user","content":"hi"})],
            answer: Some(answer),
        }
    }

    #[test]
    fn a_stream_stores_the_terminal_events_response_as_sent() {
        let resp = r#"{"id":"resp_1", "status":"completed","model":"m","output":[{"id":"msg_1","type":"message","content":[{"text":"a \"}\" b"}]}],"x":{"y":[1,2]}}"#;
        let chunk = format!(
            "event: response.output_text.done\ndata: {{\"type\":\"response.output_text.done\",\"text\":\"response.completed\"}}\n\n\
             event: response.completed\ndata: {{\"type\":\"response.completed\",\"sequence_number\":9,\"response\":{resp}}}\n\n"
        );
        let s = capture(Answer::Stream(Bytes::from(chunk)))
            .into_stored(5)
            .unwrap();
        assert_eq!(s.response, resp);
        assert_eq!(s.id, "resp_1");
        assert_eq!(s.output.len(), 1);
        assert_eq!(s.output[0].id, "msg_1");
        assert_eq!(s.input[0].id, "item_1_i0");
        assert_eq!(s.size_bytes, (resp.len() + s.input[0].json.len()) as u64);
        assert_eq!(s.previous_response_id.as_deref(), Some("resp_0"));
    }

    #[test]
    fn a_failed_or_unreadable_answer_is_not_stored() {
        let failed = r#"{"id":"resp_1","status":"failed","output":[]}"#;
        assert!(capture(Answer::Unary(Bytes::from(failed)))
            .into_stored(0)
            .is_none());
        assert!(capture(Answer::Stream(Bytes::from(
            "data: {\"type\":\"response.completed\"}\n\n"
        )))
        .into_stored(0)
        .is_none());
        let ok = r#"{"id":"resp_2","status":"incomplete","output":[]}"#;
        assert_eq!(
            capture(Answer::Unary(Bytes::from(ok)))
                .into_stored(0)
                .unwrap()
                .response,
            ok
        );
    }
}
