//! Owns resumable streams (opt-in: `models.<id>.resumable`, or per request
//! `x-sluice-resumable: true|false`; streaming requests only).
//!
//! * **Ids** ([`id`], [`stamp`]): the stream gets an id (`s{c|m|r}_<replica>_<32 hex>`,
//!   sent as `x-sluice-stream-id`) and every SSE event Sluice writes on it carries
//!   `id: <stream_id>:<seq>` (seq 1, 2, …); comments carry none, Anthropic's `event: ping`
//!   heartbeat repeats the last id.
//! * **The buffer** ([`buffer`], [`entry`]): every event is kept in a replay buffer of at
//!   most `server.resume_buffer_bytes`, charged to `server.max_buffered_request_bytes`;
//!   events some client was sent are dropped oldest first to make room, and past the bound
//!   with events no client was sent the stream ends (as a client abort; a resume gets 410
//!   `stream_overflowed`).
//! * **Detach** ([`writer`]): when the client's connection drops, the generation is not
//!   cancelled: the pump reads the upstream on into the buffer (no heartbeats to nobody),
//!   and after `server.resume_grace_ms` with no client attached cancels it exactly as a
//!   client abort does (`client_abort`).
//! * **Resume** (`GET /v1/streams/<id>`, [`crate::ingress::streams`]): the same virtual
//!   key, `Last-Event-ID` (or `?last_event_id=`) → the events after that one, then the
//!   live rest. A resume takes the stream over from a reader still attached. `DELETE`
//!   cancels the generation at once.
//! * **One generation, one row**: the original request's task owns the upstream and the
//!   metering; after the upstream ended it waits (the upstream connection released) until
//!   the final event reached some client or the window passed, so its single ledger row
//!   has the final `resumptions`.
//!
//! The registry ([`registry`]) is per process; an id of another replica gets 421 naming
//! it (sticky load balancing on the path's replica tag is the deployment).

pub(crate) mod buffer;
pub(crate) mod entry;
pub(crate) mod id;
pub(crate) mod registry;
pub(crate) mod stamp;
pub mod writer;

/// The response header carrying the stream id of a resumable stream.
pub const STREAM_ID_HEADER: &str = "x-sluice-stream-id";

/// The request header opting a streaming request in (`true`) or out (`false`) of resumable
/// streams, over `models.<id>.resumable`.
pub const RESUMABLE_HEADER: &str = "x-sluice-resumable";

/// Whether a streaming request is resumable: its `x-sluice-resumable` header (`true` or
/// `false`, case-insensitive; anything else is ignored) over its model's `resumable`.
pub fn opted_in(header: Option<&[u8]>, model_default: bool) -> bool {
    match header.map(<[u8]>::trim_ascii) {
        Some(v) if v.eq_ignore_ascii_case(b"true") => true,
        Some(v) if v.eq_ignore_ascii_case(b"false") => false,
        _ => model_default,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_header_overrides_the_model() {
        assert!(super::opted_in(Some(b"true"), false));
        assert!(super::opted_in(Some(b" TRUE"), false));
        assert!(!super::opted_in(Some(b"false"), true));
        assert!(super::opted_in(Some(b"maybe"), true));
        assert!(!super::opted_in(None, false));
    }
}
