//! Owns the client side of an LLM request: which endpoint and dialect a path is, the virtual
//! key, reading and bounding the body and decoding it in the client's dialect
//! ([`request`]), the token count endpoint, the stored-response endpoints
//! ([`stored_responses`]), the resume endpoints of resumable streams ([`streams`]), the
//! Responses API's WebSocket mode ([`websocket`]), and every answer Sluice writes itself in
//! the client's dialect ([`respond`]).

pub mod access;
pub mod compact;
pub mod count_tokens;
pub mod endpoints;
pub mod request;
pub mod respond;
pub mod stored_responses;
pub mod streams;
pub mod websocket;
