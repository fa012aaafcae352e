//! Owns the bytes of a committed answer: the stream pump (heartbeats, deadlines, coalesced
//! writes, disconnect detection), the per-stream pipe that transforms upstream events into
//! the client's dialect, the unary exchange of a non-streaming answer, and the adaptation
//! of a whole JSON answer to a streaming request into the client's stream, and resumable
//! streams (event ids, the replay buffer, detach and resume).

pub(crate) mod adapt;
pub(crate) mod budget;
pub(crate) mod end;
pub(crate) mod pipe;
pub(crate) mod pump;
pub mod resume;
pub(crate) mod unary;
