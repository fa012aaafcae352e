//! Owns the WebSocket framing of one socket (RFC 6455 §5): a [`tungstenite`] protocol
//! engine driven over an in-memory pipe, so that Pingora keeps the socket. Bytes the client
//! sent (read from the upgraded session as raw body bytes) are [`Codec::feed`]-ed in, whole
//! messages come out of [`Codec::next_message`], and frames to send accumulate until the caller
//! takes them with [`Codec::take_output`] and writes them to the session.
//!
//! tungstenite does the protocol: masking (an unmasked client frame is a protocol error),
//! fragmentation and continuation frames, UTF-8 of text messages, the message size bound
//! (checked on each frame head, before a payload is buffered), answering pings with pongs
//! and the close handshake. Nothing here blocks: the pipe's reads return `WouldBlock` when
//! the bytes fed so far end mid-frame.

use std::io::{self, Read, Write};

use bytes::{Buf, Bytes, BytesMut};
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::protocol::{CloseFrame, Role, WebSocket, WebSocketConfig};
use tungstenite::{Error, Message, Utf8Bytes};

/// Read chunk of the protocol engine, bytes: small, as idle sockets hold one each.
const READ_CHUNK: usize = 4096;

/// The in-memory transport under the protocol engine.
#[derive(Debug, Default)]
struct Pipe {
    /// Bytes received and not yet parsed.
    input: BytesMut,
    /// Encoded frames not yet written to the client.
    output: Vec<u8>,
}

impl Read for Pipe {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.input.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = buf.len().min(self.input.len());
        buf[..n].copy_from_slice(&self.input[..n]);
        self.input.advance(n);
        Ok(n)
    }
}

impl Write for Pipe {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.output.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A message the client sent.
#[derive(Debug)]
pub enum Incoming {
    /// A text message (whole: fragments joined).
    Text(Utf8Bytes),
    /// A binary message (this API speaks JSON text only).
    Binary,
    /// A pong (an answer to a heartbeat ping).
    Pong,
    /// The client started or answered the close handshake (the reply is queued).
    Close,
}

/// Why the socket must end, with the close code sent (when one could be).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The close handshake finished (or the socket was already closed): nothing to send.
    Closed,
    /// A message over the size bound: close 1009 (message too big).
    TooBig,
    /// A protocol violation (e.g. an unmasked frame): close 1002.
    Protocol,
    /// A text message that is not UTF-8: close 1007.
    InvalidUtf8,
}

/// One socket's protocol engine (server role).
pub struct Codec {
    ws: WebSocket<Pipe>,
}

impl std::fmt::Debug for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Codec").finish_non_exhaustive()
    }
}

impl Codec {
    /// A server-side engine accepting messages (and frames) of at most `max_message_bytes`.
    pub fn new(max_message_bytes: usize) -> Self {
        let config = WebSocketConfig::default()
            .read_buffer_size(READ_CHUNK)
            .write_buffer_size(0)
            .max_message_size(Some(max_message_bytes))
            .max_frame_size(Some(max_message_bytes));
        Self {
            ws: WebSocket::from_raw_socket(Pipe::default(), Role::Server, Some(config)),
        }
    }

    /// Adds bytes read from the client.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.ws.get_mut().input.extend_from_slice(bytes);
    }

    /// The next whole message from the bytes fed so far; `Ok(None)` when more bytes are
    /// needed. Pings are answered (the pong is queued in the output).
    ///
    /// # Errors
    /// A [`Failure`]: the socket must end (a close frame with its code is queued when the
    /// handshake allows one; take and write the output, then drop the connection).
    pub fn next_message(&mut self) -> Result<Option<Incoming>, Failure> {
        loop {
            match self.ws.read() {
                Ok(Message::Text(t)) => return Ok(Some(Incoming::Text(t))),
                Ok(Message::Binary(_)) => return Ok(Some(Incoming::Binary)),
                Ok(Message::Pong(_)) => return Ok(Some(Incoming::Pong)),
                Ok(Message::Close(_)) => {
                    // The reply is queued; flushing it ends the engine (server role).
                    let _ = self.ws.flush();
                    return Ok(Some(Incoming::Close));
                }
                Ok(Message::Ping(_) | Message::Frame(_)) => {}
                Err(Error::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {
                    // All fed bytes are parsed: an idle socket keeps no large buffer.
                    let input = &mut self.ws.get_mut().input;
                    if input.capacity() > 2 * READ_CHUNK {
                        *input = BytesMut::new();
                    }
                    return Ok(None);
                }
                Err(e) => return Err(self.fail(&e)),
            }
        }
    }

    /// Maps an engine error to its failure, queueing the close frame it calls for.
    fn fail(&mut self, e: &Error) -> Failure {
        let (failure, code, reason) = match e {
            Error::Capacity(_) => (Failure::TooBig, CloseCode::Size, "message too big"),
            Error::Utf8(_) => (
                Failure::InvalidUtf8,
                CloseCode::Invalid,
                "text message is not UTF-8",
            ),
            Error::ConnectionClosed | Error::AlreadyClosed => {
                return Failure::Closed;
            }
            _ => (Failure::Protocol, CloseCode::Protocol, "protocol error"),
        };
        self.close(code, reason);
        failure
    }

    /// Queues a text message.
    pub fn send_text(&mut self, text: Utf8Bytes) {
        // Writes go to memory: the only errors are "closing or closed", when nothing more
        // may be sent anyway.
        let _ = self.ws.write(Message::Text(text));
    }

    /// Queues a ping carrying `payload` (a heartbeat).
    pub fn ping(&mut self, payload: &[u8]) {
        let _ = self
            .ws
            .write(Message::Ping(Bytes::copy_from_slice(payload)));
    }

    /// Starts the close handshake with `code` and `reason` (queues the close frame).
    pub fn close(&mut self, code: CloseCode, reason: &str) {
        let _ = self.ws.close(Some(CloseFrame {
            code,
            reason: reason.into(),
        }));
    }

    /// Whether messages may still be sent (no close frame sent or received).
    pub fn open(&self) -> bool {
        self.ws.can_write()
    }

    /// The encoded frames to write to the client, if any.
    pub fn take_output(&mut self) -> Option<Bytes> {
        // Queued control frames (pongs, the close reply) are written out first.
        let _ = self.ws.flush();
        let out = &mut self.ws.get_mut().output;
        if out.is_empty() {
            return None;
        }
        Some(Bytes::from(std::mem::take(out)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client-side engine writing masked frames into a buffer.
    fn client() -> WebSocket<Pipe> {
        WebSocket::from_raw_socket(Pipe::default(), Role::Client, None)
    }

    fn client_bytes(msgs: Vec<Message>) -> Vec<u8> {
        let mut c = client();
        for m in msgs {
            c.write(m).unwrap();
        }
        c.flush().unwrap();
        std::mem::take(&mut c.get_mut().output)
    }

    #[test]
    fn messages_split_anywhere_come_out_whole_and_pings_get_pongs() {
        let bytes = client_bytes(vec![
            Message::text("{\"type\":\"response.create\"}"),
            Message::Ping(Bytes::from_static(b"hb")),
            Message::text("second"),
        ]);
        let mut s = Codec::new(1024);
        let mut got = Vec::new();
        for b in &bytes {
            s.feed(&[*b]);
            while let Some(m) = s.next_message().unwrap() {
                if let Incoming::Text(t) = m {
                    got.push(t.to_string());
                }
            }
        }
        assert_eq!(got, ["{\"type\":\"response.create\"}", "second"]);
        // The pong went out, unmasked (server frames are not masked): 0x8A, length 2.
        let out = s.take_output().unwrap();
        assert_eq!(&out[..], &[0x8A, 2, b'h', b'b']);
    }

    #[test]
    fn an_oversized_message_closes_with_1009() {
        let bytes = client_bytes(vec![Message::text("x".repeat(2000))]);
        let mut s = Codec::new(1024);
        s.feed(&bytes);
        assert_eq!(s.next_message().unwrap_err(), Failure::TooBig);
        let out = s.take_output().unwrap();
        // A close frame (0x88) whose payload starts with 1009 (0x03F1).
        assert_eq!((out[0], out[2], out[3]), (0x88, 0x03, 0xF1));
        assert!(!s.open());
    }

    #[test]
    fn an_unmasked_client_frame_is_a_protocol_error() {
        // A server-role engine writes unmasked frames: what a broken client would send.
        let mut server_like = WebSocket::from_raw_socket(Pipe::default(), Role::Server, None);
        server_like.write(Message::text("hi")).unwrap();
        server_like.flush().unwrap();
        let mut s = Codec::new(1024);
        s.feed(&server_like.get_mut().output);
        assert_eq!(s.next_message().unwrap_err(), Failure::Protocol);
    }

    #[test]
    fn a_client_close_is_answered() {
        let bytes = client_bytes(vec![Message::Close(Some(CloseFrame {
            code: CloseCode::Normal,
            reason: "bye".into(),
        }))]);
        let mut s = Codec::new(1024);
        s.feed(&bytes);
        assert!(matches!(s.next_message().unwrap(), Some(Incoming::Close)));
        let out = s.take_output().unwrap();
        assert_eq!(out[0], 0x88);
        assert!(!s.open());
    }
}
