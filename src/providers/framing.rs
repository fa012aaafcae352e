//! Owns the seam for providers whose streams are not SSE: an [`Unframer`] turns the
//! upstream body (after content decoding) into the SSE events of the route's dialect, so
//! the stream pipe, the normalizer and the dialect translators stay the ones every provider
//! uses. Today one framing needs it, AWS's binary event stream (Bedrock,
//! [`super::bedrock::eventstream`]); an SSE provider has no unframer.

use bytes::BytesMut;

use super::bedrock::eventstream::{EventStreamDecoder, EventStreamError};
use crate::config::Route;

/// Why an upstream stream's framing cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FramingError {
    /// The `sluice_stream_errors_total` reason: `event_too_large`, `upstream_truncated` or
    /// `upstream_framing`.
    pub reason: &'static str,
    /// What went wrong (no upstream bytes in it).
    pub detail: String,
}

/// A per-stream decoder of a non-SSE upstream framing into SSE bytes.
#[derive(Debug)]
pub struct Unframer {
    decoder: EventStreamDecoder,
    /// SSE output of the last [`push`](Self::push), reused.
    out: BytesMut,
}

impl Unframer {
    /// The unframer of `route`'s streams (`None`: the provider streams SSE): Bedrock's
    /// event stream of InvokeModel (Claude) or of ConverseStream (every other model); one
    /// event may decode to at most `max_event_bytes`.
    pub fn for_route(route: &Route, max_event_bytes: usize) -> Option<Self> {
        let decoder =
            super::adapter(route.provider.kind).unframer(route.dialect(), max_event_bytes)?;
        Some(Self {
            decoder,
            out: BytesMut::with_capacity(512),
        })
    }

    /// Decodes `chunk`; the SSE bytes of the messages it completed are then in
    /// [`output`](Self::output) (also after an error: the events before the bad message).
    ///
    /// # Errors
    /// [`FramingError`] for a malformed or oversized message.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), FramingError> {
        self.out.clear();
        self.decoder
            .push(chunk, &mut self.out)
            .map_err(framing_error)
    }

    /// The SSE bytes decoded by the last [`push`](Self::push).
    pub fn output(&self) -> &[u8] {
        &self.out
    }

    /// The verdict at the end of the body.
    ///
    /// # Errors
    /// [`FramingError`] with reason `upstream_truncated` when it ended inside a message.
    pub fn finish(&self) -> Result<(), FramingError> {
        self.decoder.finish().map_err(framing_error)
    }
}

fn framing_error(e: EventStreamError) -> FramingError {
    let reason = match e {
        EventStreamError::TooLarge { .. } => "event_too_large",
        EventStreamError::Truncated => "upstream_truncated",
        EventStreamError::Malformed(_) => "upstream_framing",
    };
    FramingError {
        reason,
        detail: e.to_string(),
    }
}
