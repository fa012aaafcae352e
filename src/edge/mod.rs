//! Owns the downstream edge, before any request is routed: the connection loop (keep-alive,
//! the deadline on each request head, HTTP/1.1 pipelining), the head guard (size and count
//! limits on a request head as it is read), and the screening of each request (head limits, per-IP connection and rate caps).

pub mod connection;
pub mod head_guard;
pub mod screen;
