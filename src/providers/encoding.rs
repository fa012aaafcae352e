//! Owns the content codings of provider answers: what Sluice says it accepts upstream
//! ([`ACCEPT_ENCODING`]), reading a `Content-Encoding` ([`ContentCoding::from_header`]) and
//! decoding bodies as they arrive ([`Decoder`]), streams and whole bodies alike.
//!
//! Codings (RFC 9110 §8.4.1): `gzip` (and `x-gzip`), `deflate` (zlib, RFC 1950; a raw
//! RFC 1951 stream, which some servers send under that name, is recognised by its first
//! byte), `br` (Brotli, RFC 7932) and `zstd` (RFC 8878); `identity` is no coding. The
//! codecs are the `flate2`, `brotli` and `zstd` crates that Pingora itself builds on.
//! Pingora 0.9.1's own `protocols::http::compression` module is not used: it has no
//! `deflate` and no `zstd` decoder, and each of its decode calls returns the whole output of
//! its input in one buffer, unbounded, so one small compressed chunk could expand to
//! gigabytes in memory before anyone could look at its size.
//!
//! Decompression bombs: every decode call has an output limit; the decoders write into a
//! sink that refuses bytes beyond it (so memory stays bounded while decoding, not checked
//! afterwards) and the call fails with [`DecodeError::TooLarge`].

use std::io::{self, Write};

/// The `Accept-Encoding` Sluice sends upstream: exactly the codings [`Decoder`] decodes.
pub const ACCEPT_ENCODING: &str = "gzip, deflate, br, zstd";

/// Internal output buffer of the codecs, bytes.
const CODEC_BUFFER_BYTES: usize = 16 * 1024;

/// One content coding of a provider answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentCoding {
    /// No `Content-Encoding`, or `identity`.
    Identity,
    /// `gzip` / `x-gzip`.
    Gzip,
    /// `deflate` (zlib, or raw deflate).
    Deflate,
    /// `br`.
    Brotli,
    /// `zstd`.
    Zstd,
}

impl ContentCoding {
    /// Reads a `Content-Encoding` header value (`None`: no header).
    ///
    /// # Errors
    /// The header text, when it names a coding Sluice does not decode, or several codings
    /// (`gzip, br`), which no provider sends.
    pub fn from_header(value: Option<&[u8]>) -> Result<Self, String> {
        let Some(value) = value else {
            return Ok(ContentCoding::Identity);
        };
        let text = String::from_utf8_lossy(value);
        let coding = text.trim();
        Ok(match coding.to_ascii_lowercase().as_str() {
            "" | "identity" => ContentCoding::Identity,
            "gzip" | "x-gzip" => ContentCoding::Gzip,
            "deflate" => ContentCoding::Deflate,
            "br" => ContentCoding::Brotli,
            "zstd" => ContentCoding::Zstd,
            _ => return Err(coding.to_string()),
        })
    }

    /// The coding's name as in `Content-Encoding`.
    pub fn name(self) -> &'static str {
        match self {
            ContentCoding::Identity => "identity",
            ContentCoding::Gzip => "gzip",
            ContentCoding::Deflate => "deflate",
            ContentCoding::Brotli => "br",
            ContentCoding::Zstd => "zstd",
        }
    }
}

/// Why decoding failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// One decode call would have produced more than its output limit.
    #[error("the {coding}-decoded answer exceeds {limit_bytes} bytes")]
    TooLarge {
        /// The coding.
        coding: &'static str,
        /// The limit of the call, bytes.
        limit_bytes: usize,
    },
    /// The bytes are not valid in the coding (or end before its stream does).
    #[error("the answer is not valid {coding}: {detail}")]
    Corrupt {
        /// The coding.
        coding: &'static str,
        /// The codec's message.
        detail: String,
    },
}

/// Where the codecs write: a buffer that refuses bytes beyond `limit`.
#[derive(Debug, Default)]
struct Sink {
    buf: Vec<u8>,
    limit: usize,
    over: bool,
}

impl Write for Sink {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len() + data.len() > self.limit {
            self.over = true;
            return Err(io::Error::other("decoded output over the limit"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

enum Codec {
    Gzip(flate2::write::GzDecoder<Sink>),
    /// `deflate` before its first byte told zlib from raw deflate.
    DeflatePending(Sink),
    Zlib(flate2::write::ZlibDecoder<Sink>),
    RawDeflate(flate2::write::DeflateDecoder<Sink>),
    Brotli(Box<brotli::DecompressorWriter<Sink>>),
    Zstd(zstd::stream::write::Decoder<'static, Sink>),
}

impl Codec {
    fn sink(&mut self) -> &mut Sink {
        match self {
            Codec::Gzip(d) => d.get_mut(),
            Codec::DeflatePending(s) => s,
            Codec::Zlib(d) => d.get_mut(),
            Codec::RawDeflate(d) => d.get_mut(),
            Codec::Brotli(d) => d.get_mut(),
            Codec::Zstd(d) => d.get_mut(),
        }
    }

    fn write_all_flush(&mut self, input: &[u8]) -> io::Result<()> {
        fn go<W: Write>(w: &mut W, input: &[u8]) -> io::Result<()> {
            w.write_all(input)?;
            w.flush()
        }
        match self {
            Codec::Gzip(d) => go(d, input),
            Codec::DeflatePending(_) => Ok(()),
            Codec::Zlib(d) => go(d, input),
            Codec::RawDeflate(d) => go(d, input),
            Codec::Brotli(d) => go(d.as_mut(), input),
            Codec::Zstd(d) => go(d, input),
        }
    }

    fn finish(&mut self) -> io::Result<()> {
        match self {
            Codec::Gzip(d) => d.try_finish(),
            Codec::DeflatePending(_) => Ok(()),
            Codec::Zlib(d) => d.try_finish(),
            Codec::RawDeflate(d) => d.try_finish(),
            Codec::Brotli(d) => d.close().and_then(|()| d.flush()),
            Codec::Zstd(d) => d.flush(),
        }
    }
}

/// Streaming decoder of one answer body in one [`ContentCoding`]; `Identity` passes
/// bytes through.
pub struct Decoder {
    coding: ContentCoding,
    codec: Option<Codec>,
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder")
            .field("coding", &self.coding)
            .finish_non_exhaustive()
    }
}

impl Decoder {
    /// A decoder for `coding`.
    ///
    /// # Errors
    /// [`DecodeError::Corrupt`] if the codec cannot be set up (zstd's context allocation).
    pub fn new(coding: ContentCoding) -> Result<Self, DecodeError> {
        let sink = Sink::default();
        let codec = match coding {
            ContentCoding::Identity => None,
            ContentCoding::Gzip => Some(Codec::Gzip(flate2::write::GzDecoder::new(sink))),
            ContentCoding::Deflate => Some(Codec::DeflatePending(sink)),
            ContentCoding::Brotli => Some(Codec::Brotli(Box::new(
                brotli::DecompressorWriter::new(sink, CODEC_BUFFER_BYTES),
            ))),
            ContentCoding::Zstd => Some(Codec::Zstd(
                zstd::stream::write::Decoder::new(sink).map_err(|e| DecodeError::Corrupt {
                    coding: "zstd",
                    detail: e.to_string(),
                })?,
            )),
        };
        Ok(Decoder { coding, codec })
    }

    /// Decodes the next piece of the body (`end`: it is the last; `input` may be empty),
    /// producing at most `max_out` bytes, and returns the decoded bytes (valid until the
    /// next call).
    ///
    /// # Errors
    /// [`DecodeError::TooLarge`] when the output of this call would exceed `max_out`;
    /// [`DecodeError::Corrupt`] when the input is not valid in the coding or, at `end`,
    /// the coded stream is incomplete. The decoder is unusable after an error.
    pub fn decode<'s>(
        &'s mut self,
        input: &'s [u8],
        end: bool,
        max_out: usize,
    ) -> Result<&'s [u8], DecodeError> {
        let name = self.coding.name();
        let Some(codec) = self.codec.as_mut() else {
            if input.len() > max_out {
                return Err(DecodeError::TooLarge {
                    coding: name,
                    limit_bytes: max_out,
                });
            }
            return Ok(input);
        };
        {
            let sink = codec.sink();
            sink.buf.clear();
            sink.limit = max_out;
        }
        if let Codec::DeflatePending(sink) = codec {
            if let Some(&first) = input.first() {
                // zlib starts with CMF: compression method 8 in the low nibble, a window
                // of at most 32 KiB in the high one (and a header checksum the codec
                // checks); anything else is taken for a raw deflate stream.
                let zlib = first & 0x0f == 8 && first >> 4 <= 7;
                let sink = std::mem::take(sink);
                *codec = if zlib {
                    Codec::Zlib(flate2::write::ZlibDecoder::new(sink))
                } else {
                    Codec::RawDeflate(flate2::write::DeflateDecoder::new(sink))
                };
            }
        }
        let mut r = codec.write_all_flush(input);
        if r.is_ok() && end {
            r = codec.finish();
        }
        let sink = codec.sink();
        match r {
            Ok(()) => Ok(&sink.buf),
            Err(_) if sink.over => Err(DecodeError::TooLarge {
                coding: name,
                limit_bytes: max_out,
            }),
            Err(e) => Err(DecodeError::Corrupt {
                coding: name,
                detail: e.to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn all_codings(data: &[u8]) -> Vec<(ContentCoding, Vec<u8>)> {
        let mut zlib = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        zlib.write_all(data).unwrap();
        let mut raw =
            flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
        raw.write_all(data).unwrap();
        let mut br = Vec::new();
        {
            let mut w = brotli::CompressorWriter::new(&mut br, 4096, 5, 22);
            w.write_all(data).unwrap();
        }
        vec![
            (ContentCoding::Gzip, gzip(data)),
            (ContentCoding::Deflate, zlib.finish().unwrap()),
            (ContentCoding::Deflate, raw.finish().unwrap()),
            (ContentCoding::Brotli, br),
            (ContentCoding::Zstd, zstd::encode_all(data, 3).unwrap()),
        ]
    }

    #[test]
    fn header_values() {
        assert_eq!(
            ContentCoding::from_header(None),
            Ok(ContentCoding::Identity)
        );
        assert_eq!(
            ContentCoding::from_header(Some(b" GZIP ")),
            Ok(ContentCoding::Gzip)
        );
        assert_eq!(
            ContentCoding::from_header(Some(b"x-gzip")),
            Ok(ContentCoding::Gzip)
        );
        assert_eq!(
            ContentCoding::from_header(Some(b"identity")),
            Ok(ContentCoding::Identity)
        );
        assert_eq!(
            ContentCoding::from_header(Some(b"br")),
            Ok(ContentCoding::Brotli)
        );
        assert_eq!(
            ContentCoding::from_header(Some(b"zstd")),
            Ok(ContentCoding::Zstd)
        );
        assert_eq!(
            ContentCoding::from_header(Some(b"compress")),
            Err("compress".to_string())
        );
        assert_eq!(
            ContentCoding::from_header(Some(b"gzip, br")),
            Err("gzip, br".to_string())
        );
    }

    #[test]
    fn every_coding_decodes_in_any_chunking() {
        let data: Vec<u8> = (0..4000)
            .flat_map(|i| format!("data: {{\"n\":{i}}}\n\n").into_bytes())
            .collect();
        for (coding, coded) in all_codings(&data) {
            for piece in [1usize, 7, 1000, coded.len()] {
                let mut d = Decoder::new(coding).unwrap();
                let mut out = Vec::new();
                let pieces: Vec<&[u8]> = coded.chunks(piece).collect();
                for (i, p) in pieces.iter().enumerate() {
                    let end = i + 1 == pieces.len();
                    out.extend_from_slice(d.decode(p, end, 1 << 20).unwrap());
                }
                assert_eq!(out, data, "{coding:?} in pieces of {piece}");
            }
        }
    }

    #[test]
    fn output_is_bounded_per_call() {
        // 64 MiB of zeros compress to a few KiB: a bomb for an unbounded decoder.
        let zeros = vec![0u8; 64 << 20];
        for (coding, coded) in all_codings(&zeros) {
            assert!(coded.len() < 1 << 20, "{coding:?}");
            let mut d = Decoder::new(coding).unwrap();
            let err = d.decode(&coded, true, 1 << 20).unwrap_err();
            assert_eq!(
                err,
                DecodeError::TooLarge {
                    coding: coding.name(),
                    limit_bytes: 1 << 20
                },
                "{coding:?}"
            );
        }
    }

    #[test]
    fn corrupt_and_truncated_input_is_an_error() {
        let mut d = Decoder::new(ContentCoding::Gzip).unwrap();
        assert!(matches!(
            d.decode(b"not gzip at all", true, 1024),
            Err(DecodeError::Corrupt { coding: "gzip", .. })
        ));
        let coded = gzip(b"{\"model\":\"x\"}");
        let mut d = Decoder::new(ContentCoding::Gzip).unwrap();
        assert!(d.decode(&coded[..coded.len() - 4], true, 1024).is_err());
    }
}
