//! The `event` messages of a `ConverseStream` body: the payload is the event's JSON as is
//! (`{"contentBlockIndex":0,"delta":{"text":"Hi"},"p":"abcd"}`), the event's name in
//! `:event-type`
//! (<https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_ConverseStreamOutput.html>).

use bytes::BytesMut;

use super::{push_one_line, EventStreamError};

/// Appends one Converse event as `event: {name}\ndata: {json}\n\n`. The payload is not
/// parsed here (the protocol layer's decoder does, once; a payload that is no JSON is then
/// skipped and counted as every provider's malformed event is), only kept on one line.
///
/// # Errors
/// [`EventStreamError::Malformed`] for an event name that is not a plain identifier (it
/// goes into an SSE field).
pub(super) fn converse_event(
    name: &str,
    payload: &[u8],
    out: &mut BytesMut,
) -> Result<(), EventStreamError> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Err(EventStreamError::Malformed(format!(
            "Converse event type `{}` is not a name",
            name.escape_debug()
        )));
    }
    let json = payload.trim_ascii();
    out.reserve(json.len() + name.len() + 16);
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    push_one_line(json, out);
    out.extend_from_slice(b"\n\n");
    Ok(())
}

#[cfg(test)]
mod tests {
    use aws_smithy_eventstream::frame::write_message_to;
    use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
    use bytes::BytesMut;

    use super::super::EventStreamDecoder;

    fn message(headers: &[(&str, &str)], payload: &str) -> Vec<u8> {
        let headers = headers
            .iter()
            .map(|(k, v)| {
                Header::new(
                    (*k).to_string(),
                    HeaderValue::String((*v).to_string().into()),
                )
            })
            .collect();
        let mut out = Vec::new();
        write_message_to(
            &Message::new_from_parts(headers, payload.as_bytes().to_vec()),
            &mut out,
        )
        .expect("frames");
        out
    }

    fn event(name: &str, json: &str) -> Vec<u8> {
        message(
            &[
                (":event-type", name),
                (":content-type", "application/json"),
                (":message-type", "event"),
            ],
            json,
        )
    }

    const DELTA: &str = r#"{"contentBlockIndex":0,"delta":{"text":"héllo"},"p":"abcdefgh"}"#;
    const META: &str =
        "{\"usage\":{\"inputTokens\":3,\n\"outputTokens\":1},\"metrics\":{\"latencyMs\":9}}";

    #[test]
    fn converse_events_become_sse_at_every_chunk_boundary() {
        let mut all = event("messageStart", r#"{"role":"assistant"}"#);
        all.extend(event("contentBlockDelta", DELTA));
        all.extend(event("metadata", META));
        all.extend(message(
            &[
                (":exception-type", "modelStreamErrorException"),
                (":content-type", "application/json"),
                (":message-type", "exception"),
            ],
            r#"{"message":"broke"}"#,
        ));
        let want = format!(
            "event: messageStart\ndata: {{\"role\":\"assistant\"}}\n\nevent: contentBlockDelta\ndata: {DELTA}\n\nevent: metadata\ndata: {}\n\nevent: error\ndata: {{\"error\":{{\"message\":\"modelStreamErrorException: broke\",\"type\":\"api_error\"}},\"type\":\"error\"}}\n\n",
            META.replace('\n', " ")
        );
        for cut in 0..=all.len() {
            let mut d = EventStreamDecoder::converse(64 * 1024);
            let mut out = BytesMut::new();
            d.push(&all[..cut], &mut out).expect("first part");
            d.push(&all[cut..], &mut out).expect("second part");
            d.finish().expect("complete");
            assert_eq!(String::from_utf8_lossy(&out), want, "cut at {cut}");
        }
        // An InvokeModel decoder ignores Converse events (they are not `chunk`s).
        let mut d = EventStreamDecoder::new(64 * 1024);
        let mut out = BytesMut::new();
        d.push(&event("contentBlockDelta", DELTA), &mut out)
            .expect("decodes");
        assert!(out.is_empty());
    }

    #[test]
    fn names_that_are_no_identifiers_are_malformed() {
        for name in ["content\nBlock", "a b", ""] {
            let mut d = EventStreamDecoder::converse(64 * 1024);
            let mut out = BytesMut::new();
            assert!(d.push(&event(name, "{}"), &mut out).is_err(), "{name:?}");
        }
    }
}
