//! Owns how pumping a committed stream ends ([`Pumped`]) and the fields of the SSE error
//! event a stream ends badly with ([`StreamError`]): shared by the stream pump and the
//! mid-stream continuation that splices another upstream's answer into it.

use bytes::Bytes;

use crate::protocol;

/// How pumping a committed stream (`pump_body`) ended.
pub(crate) enum Pumped {
    /// The stream ended cleanly; its final output, to be written after the upstream
    /// connection went back to the pool (`end_cleanly`).
    End(Option<Bytes>),
    /// It failed; the pipe may hold events completed before the failure, which are the
    /// client's (`write_pending`).
    Failed(StreamError),
    /// The client left (the caller closes the upstream and records usage).
    Gone,
}

/// How a committed stream ends badly: the SSE error event's fields.
pub(crate) struct StreamError {
    /// `sluice_stream_errors_total` reason, and the event's `code`.
    pub reason: &'static str,
    /// Canonical kind (types the error event of non-Chat clients).
    pub kind: protocol::ErrorKind,
    /// OpenAI error type: the provider's own for an in-band error, else `api_error`.
    pub error_type: String,
    /// What the client is told.
    pub message: String,
}

impl StreamError {
    /// An error Sluice itself ends the stream with.
    pub(crate) fn gateway(reason: &'static str, message: String) -> Self {
        Self {
            reason,
            kind: match reason {
                "shutdown" => protocol::ErrorKind::Overloaded,
                "idle_timeout" | "first_event_timeout" => protocol::ErrorKind::Timeout,
                _ => protocol::ErrorKind::Api,
            },
            error_type: "api_error".into(),
            message,
        }
    }
}
