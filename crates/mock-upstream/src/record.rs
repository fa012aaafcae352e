//! The request log of the mock upstream: one [`RequestRecord`] per request that reached
//! a provider endpoint, updated live while the response is written.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;

use super::behavior::Behavior;

/// Maximum number of request body bytes copied into [`RequestRecord::body`] (64 KiB).
pub const BODY_COPY_LIMIT: usize = 64 * 1024;

/// Request headers whose values are copied into [`RequestRecord::headers`].
pub const SELECTED_HEADERS: &[&str] = &[
    "authorization",
    "x-api-key",
    "anthropic-version",
    "content-type",
    "content-length",
    "transfer-encoding",
    "accept-encoding",
    "x-request-id",
];

/// Where the response was when the peer closed the connection early.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// No byte of the response head was written yet.
    BeforeHead,
    /// The head was written, but no body byte.
    AfterHead,
    /// Some but not all body bytes were written.
    MidStream,
}

/// One recorded request (serialized as an element of `GET /_mock/log`'s `requests`).
/// All times are ms since the [`super::MockState`] was created; sizes are bytes.
#[derive(Debug, Clone, Serialize, Default)]
pub struct RequestRecord {
    /// Sequence number, 1-based, per process (restarts at 1 after `POST /_mock/reset`).
    pub seq: u64,
    /// Id of the TCP connection (1-based, per process).
    pub conn_id: u64,
    /// Index of this request on its connection (1-based; 2 = second keep-alive request).
    pub conn_seq: u64,
    /// HTTP method.
    pub method: String,
    /// Request target (path and query) as sent.
    pub path: String,
    /// Values of [`SELECTED_HEADERS`] (lowercase names; repeated headers joined by `", "`).
    pub headers: BTreeMap<String, String>,
    /// All request header names in order (lowercase).
    pub header_names: Vec<String>,
    /// All request headers `[name, value]` in order (name lowercase, value lossy UTF-8).
    pub all_headers: Vec<(String, String)>,
    /// `model` field of the JSON body.
    pub model: Option<String>,
    /// `stream` field of the JSON body.
    pub stream: Option<bool>,
    /// Size of the (de-chunked) request body, bytes.
    pub body_bytes: u64,
    /// Copy of the body (lossy UTF-8), truncated to [`BODY_COPY_LIMIT`] bytes.
    pub body: String,
    /// The body copy was truncated.
    pub body_truncated: bool,
    /// When the request (head and body) had been read, ms.
    pub received_at_ms: u64,
    /// The `tool_loop` knob: the text of the last tool result the request carried (in
    /// whichever dialect), whitespace collapsed, at most 300 characters; `None` without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_result: Option<String>,
    /// Effective behaviour used for this request (after merging all levels).
    pub behavior: Behavior,
    /// Response status, once decided.
    pub status: Option<u16>,
    /// When the response head was written, ms.
    pub head_at_ms: Option<u64>,
    /// Response body bytes written so far (payload, excluding chunked framing), updated live.
    pub bytes_written: u64,
    /// All response bytes written so far including head and chunked framing.
    pub wire_bytes: u64,
    /// The full response was written.
    pub completed: bool,
    /// When the response was completely written, ms.
    pub completed_at_ms: Option<u64>,
    /// When the mock saw the peer close (EOF/RST) before the response was complete, ms.
    pub peer_closed_at_ms: Option<u64>,
    /// Response phase when the peer closed early.
    pub phase: Option<Phase>,
    /// The mock closed the connection on purpose before completing (drop/close knobs, stall bound).
    pub mock_closed: bool,
}

/// Shared, live-updated handle to a record.
pub(crate) type RecordHandle = Arc<Mutex<RequestRecord>>;

/// Lock a mutex, recovering from poisoning.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Mark the peer as gone at `now_ms` (only if the response was not complete and not yet marked).
pub(crate) fn mark_peer_closed(rec: &RecordHandle, now_ms: u64) {
    let mut r = lock(rec);
    if r.completed || r.peer_closed_at_ms.is_some() || r.mock_closed {
        return;
    }
    r.peer_closed_at_ms = Some(now_ms);
    r.phase = Some(if r.head_at_ms.is_none() {
        Phase::BeforeHead
    } else if r.bytes_written == 0 {
        Phase::AfterHead
    } else {
        Phase::MidStream
    });
}
