//! The test client itself: a chunked body that stops before its `0` chunk (or a body short
//! of its Content-Length) is a cut body, never a clean end. Every e2e test that reads a
//! stream to its end relies on this.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

use crate::harness::StreamReader;

/// Serves one connection: reads the request head, writes `response`, closes.
fn one_shot(response: Vec<u8>) -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        let (mut c, _) = l.accept().expect("accept");
        let mut buf = [0u8; 4096];
        let mut head = Vec::new();
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match c.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
        let _ = c.write_all(&response);
    });
    addr
}

const HEAD: &str = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";

fn open(response: impl Into<Vec<u8>>) -> StreamReader {
    StreamReader::open_raw(one_shot(response.into()), "GET", "/", &[], b"")
}

#[test]
fn a_chunked_body_with_its_terminator_is_done() {
    let r = format!("{HEAD}5\r\nhello\r\n0\r\n\r\n");
    let mut s = open(r);
    let (body, clean) = s.read_to_end_or_cut(Duration::from_secs(5));
    assert_eq!((body.as_slice(), clean), (&b"hello"[..], true));
    assert!(s.is_done() && !s.is_cut());
}

#[test]
fn eof_before_the_zero_chunk_is_a_cut_not_an_end() {
    for tail in ["", "0\r\n", "0\r\nx-trailer: 1\r\n", "3\r\nab"] {
        let r = format!("{HEAD}5\r\nhello\r\n{tail}");
        let mut s = open(r);
        let (body, clean) = s.read_to_end_or_cut(Duration::from_secs(5));
        assert!(!clean, "tail {tail:?}: a cut body read as complete");
        assert!(body.starts_with(b"hello"));
        assert!(!s.is_done() && s.is_cut(), "tail {tail:?}");
    }
}

#[test]
#[should_panic(expected = "EOF before the chunked terminator")]
fn read_to_end_panics_on_a_cut_chunked_body() {
    let r = format!("{HEAD}5\r\nhello\r\n");
    open(r).read_to_end(Duration::from_secs(5));
}

#[test]
fn eof_short_of_the_content_length_is_a_cut() {
    let mut s = open(&b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhello"[..]);
    let (body, clean) = s.read_to_end_or_cut(Duration::from_secs(5));
    assert_eq!((body.as_slice(), clean), (&b"hello"[..], false));
    assert!(s.is_cut());
}
