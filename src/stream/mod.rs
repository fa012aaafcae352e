//! Owns the bytes of a committed answer: the stream pump (heartbeats, deadlines, coalesced
//! writes, disconnect detection), the per-stream pipe that transforms upstream events into
//! the client's dialect, and the unary exchange of a non-streaming answer.

pub(crate) mod budget;
pub(crate) mod end;
pub(crate) mod pipe;
pub(crate) mod pump;
pub(crate) mod unary;
