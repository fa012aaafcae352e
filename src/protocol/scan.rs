//! A strict, allocation-free JSON reader for the per-event hot path of the
//! stream decoders: one pass over an upstream event's `data`, reading the
//! few members a decoder needs and skipping (but still validating) the rest.
//!
//! Why not serde: a derived `Deserialize` costs ~30 instructions per byte of
//! an upstream chunk (per-field visitor calls, identifier matching, a UTF-8
//! check per string); this reader walks the bytes directly and checks UTF-8
//! only in the strings it returns (as serde_json's slice reader, skipped
//! strings are not decoded; the SSE normalizer has validated every line). Rare sub-objects (`message`, `usage`, `error`,
//! `content_block`) are handed to serde as borrowed spans
//! ([`Scan::value_span`] + [`from_span`]).
//!
//! Strictness matches serde_json where it matters for an upstream fault:
//! malformed JSON (bad tokens, unterminated strings, raw control characters
//! in strings, invalid escapes or lone surrogates, trailing bytes) and a
//! member of the wrong type are errors. Member names are compared as written
//! (a name spelled with escapes is an unknown member).

use std::borrow::Cow;

use serde::Deserialize;

use super::ProtocolError;

/// Bytes that end the plain run of a JSON string: `"`, `\` and the control
/// characters JSON forbids raw.
static STOP: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 0x20 {
        t[i] = true;
        i += 1;
    }
    t[b'"' as usize] = true;
    t[b'\\' as usize] = true;
    t
};

/// Nesting depth at which skipping gives up (serde_json's recursion limit).
const MAX_DEPTH: usize = 128;

/// Reader over one JSON text.
pub(crate) struct Scan<'a> {
    b: &'a [u8],
    i: usize,
    what: &'static str,
}

type R<T> = Result<T, ProtocolError>;

impl<'a> Scan<'a> {
    /// A reader over `data`; `what` names the event kind in errors
    /// (`chat chunk`, `messages event`).
    pub(crate) fn new(data: &'a [u8], what: &'static str) -> Self {
        Scan {
            b: data,
            i: 0,
            what,
        }
    }

    #[inline]
    fn bytes(&self) -> &'a [u8] {
        self.b
    }

    #[cold]
    fn err(&self, msg: &str) -> ProtocolError {
        ProtocolError::InvalidUpstream(format!("{}: {msg} at byte {}", self.what, self.i))
    }

    #[inline]
    fn ws(&mut self) {
        let b = self.bytes();
        while let Some(&c) = b.get(self.i) {
            if !matches!(c, b' ' | b'\n' | b'\r' | b'\t') {
                break;
            }
            self.i += 1;
        }
    }

    /// The next non-whitespace byte, not consumed.
    #[inline]
    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.bytes().get(self.i).copied()
    }

    #[inline]
    fn expect(&mut self, c: u8) -> R<()> {
        if self.peek() == Some(c) {
            self.i += 1;
            Ok(())
        } else {
            Err(self.err(&format!("expected `{}`", c as char)))
        }
    }

    fn literal(&mut self, word: &[u8]) -> R<()> {
        if self.bytes()[self.i..].starts_with(word) {
            self.i += word.len();
            Ok(())
        } else {
            Err(self.err("invalid literal"))
        }
    }

    /// Consumes a `null` if one is next.
    pub(crate) fn null(&mut self) -> R<bool> {
        if self.peek() == Some(b'n') {
            self.literal(b"null")?;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// Reads an object, calling `member(self, name)` with the reader at each
    /// member's value; `member` must consume the value ([`skip`](Self::skip)
    /// for unknown members).
    pub(crate) fn object(&mut self, mut member: impl FnMut(&mut Self, &'a [u8]) -> R<()>) -> R<()> {
        self.expect(b'{')?;
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Ok(());
        }
        loop {
            if self.peek() != Some(b'"') {
                return Err(self.err("expected a member name"));
            }
            let (name, _) = self.string_span()?;
            self.expect(b':')?;
            member(self, name)?;
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    return Ok(());
                }
                _ => return Err(self.err("expected `,` or `}`")),
            }
        }
    }

    /// Reads an array (or `null`, as no elements), calling `element(self)`
    /// with the reader at each element, which it must consume.
    pub(crate) fn array(&mut self, mut element: impl FnMut(&mut Self) -> R<()>) -> R<()> {
        if self.null()? {
            return Ok(());
        }
        self.expect(b'[')?;
        if self.peek() == Some(b']') {
            self.i += 1;
            return Ok(());
        }
        loop {
            element(self)?;
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b']') => {
                    self.i += 1;
                    return Ok(());
                }
                _ => return Err(self.err("expected `,` or `]`")),
            }
        }
    }

    /// (raw bytes between the quotes, whether they have escapes), the
    /// escapes and the absence of raw control characters checked.
    #[inline]
    fn string_span(&mut self) -> R<(&'a [u8], bool)> {
        self.expect(b'"')?;
        let b = self.b;
        let start = self.i;
        let mut i = start;
        let mut escaped = false;
        loop {
            while i < b.len() && !STOP[b[i] as usize] {
                i += 1;
            }
            match b.get(i) {
                Some(b'"') => {
                    self.i = i + 1;
                    return Ok((&b[start..i], escaped));
                }
                Some(b'\\') => {
                    escaped = true;
                    match b.get(i + 1) {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => i += 2,
                        Some(b'u')
                            if b.get(i + 2..i + 6)
                                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) =>
                        {
                            i += 6
                        }
                        _ => {
                            self.i = i;
                            return Err(self.err("invalid escape"));
                        }
                    }
                }
                Some(_) => {
                    self.i = i;
                    return Err(self.err("control character in string"));
                }
                None => {
                    self.i = i;
                    return Err(self.err("unterminated string"));
                }
            }
        }
    }

    /// A string value, borrowed unless it has escapes.
    pub(crate) fn str(&mut self) -> R<Cow<'a, str>> {
        if self.peek() != Some(b'"') {
            return Err(self.err("expected a string"));
        }
        let (raw, escaped) = self.string_span()?;
        let Ok(raw) = std::str::from_utf8(raw) else {
            return Err(self.err("invalid UTF-8 in string"));
        };
        if !escaped {
            return Ok(Cow::Borrowed(raw));
        }
        unescape(raw)
            .map(Cow::Owned)
            .ok_or_else(|| self.err("lone surrogate in \\u escape"))
    }

    /// A string or `null`.
    pub(crate) fn opt_str(&mut self) -> R<Option<Cow<'a, str>>> {
        if self.null()? {
            return Ok(None);
        }
        self.str().map(Some)
    }

    /// A non-negative integer or `null`.
    pub(crate) fn opt_u64(&mut self) -> R<Option<u64>> {
        if self.null()? {
            return Ok(None);
        }
        let b = self.bytes();
        let start = self.i;
        let mut n: u64 = 0;
        while let Some(&c) = b.get(self.i) {
            if !c.is_ascii_digit() {
                break;
            }
            n = n
                .checked_mul(10)
                .and_then(|n| n.checked_add(u64::from(c - b'0')))
                .ok_or_else(|| self.err("integer out of range"))?;
            self.i += 1;
        }
        let digits = self.i - start;
        if digits == 0
            || (digits > 1 && b[start] == b'0')
            || matches!(b.get(self.i), Some(b'.' | b'e' | b'E'))
        {
            return Err(self.err("expected a non-negative integer"));
        }
        Ok(Some(n))
    }

    /// A `u32` or `null`.
    pub(crate) fn opt_u32(&mut self) -> R<Option<u32>> {
        match self.opt_u64()? {
            Some(n) => u32::try_from(n)
                .map(Some)
                .map_err(|_| self.err("integer out of range")),
            None => Ok(None),
        }
    }

    /// Whether `data` is exactly one JSON value (whitespace around it allowed): the
    /// validating skip over the whole text, no allocation.
    pub(crate) fn is_one_value(data: &'a [u8]) -> bool {
        let mut s = Scan::new(data, "json");
        s.skip().is_ok() && s.peek().is_none()
    }

    /// Skips any value, validating it.
    pub(crate) fn skip(&mut self) -> R<()> {
        self.skip_depth(0)
    }

    /// Skips any value and returns its text (for serde: [`from_span`]).
    pub(crate) fn value_span(&mut self) -> R<&'a [u8]> {
        self.ws();
        let start = self.i;
        self.skip()?;
        Ok(&self.b[start..self.i])
    }

    fn skip_depth(&mut self, depth: usize) -> R<()> {
        if depth > MAX_DEPTH {
            return Err(self.err("nested too deeply"));
        }
        match self.peek() {
            Some(b'"') => self.string_span().map(|_| ()),
            Some(b'{') => self.object(|s, _| s.skip_depth(depth + 1)),
            Some(b'[') => self.array(|s| s.skip_depth(depth + 1)),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => Err(self.err("expected a value")),
        }
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`
    fn number(&mut self) -> R<()> {
        let b = self.bytes();
        let digits = |s: &mut Self| {
            let start = s.i;
            while b.get(s.i).is_some_and(u8::is_ascii_digit) {
                s.i += 1;
            }
            s.i - start
        };
        if b.get(self.i) == Some(&b'-') {
            self.i += 1;
        }
        let start = self.i;
        let n = digits(self);
        if n == 0 || (n > 1 && b[start] == b'0') {
            return Err(self.err("invalid number"));
        }
        if b.get(self.i) == Some(&b'.') {
            self.i += 1;
            if digits(self) == 0 {
                return Err(self.err("invalid number"));
            }
        }
        if matches!(b.get(self.i), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(b.get(self.i), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if digits(self) == 0 {
                return Err(self.err("invalid number"));
            }
        }
        Ok(())
    }

    /// Checks that only whitespace follows the value read.
    pub(crate) fn end(&mut self) -> R<()> {
        if self.peek().is_some() {
            return Err(self.err("trailing characters"));
        }
        Ok(())
    }

    /// Reads the next value as `T` with serde (for rare sub-objects).
    pub(crate) fn serde<T: Deserialize<'a>>(&mut self) -> R<T> {
        let span = self.value_span()?;
        from_span(span, self.what)
    }
}

/// Parses `span` (a value's text from [`Scan::value_span`]) with serde,
/// borrowing its strings.
pub(crate) fn from_span<'a, T: Deserialize<'a>>(span: &'a [u8], what: &str) -> R<T> {
    serde_json::from_slice(span).map_err(|e| ProtocolError::InvalidUpstream(format!("{what}: {e}")))
}

/// Decodes the escapes of a validated raw string; `None` for a lone
/// surrogate.
fn unescape(raw: &str) -> Option<String> {
    let b = raw.as_bytes();
    let mut out = String::with_capacity(raw.len());
    let mut i = 0;
    while i < b.len() {
        let Some(off) = b[i..].iter().position(|&c| c == b'\\') else {
            out.push_str(raw.get(i..)?);
            break;
        };
        out.push_str(raw.get(i..i + off)?);
        i += off;
        let c = match b.get(i + 1)? {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            _ => {
                let hi = hex4(b.get(i + 2..i + 6)?)?;
                i += 6;
                let c = if (0xD800..0xDC00).contains(&hi) {
                    if b.get(i..i + 2) != Some(b"\\u") {
                        return None;
                    }
                    let lo = hex4(b.get(i + 2..i + 6)?)?;
                    if !(0xDC00..0xE000).contains(&lo) {
                        return None;
                    }
                    i += 6;
                    char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))?
                } else {
                    char::from_u32(hi)?
                };
                out.push(c);
                continue;
            }
        };
        out.push(c);
        i += 2;
    }
    Some(out)
}

fn hex4(h: &[u8]) -> Option<u32> {
    let s = std::str::from_utf8(h).ok()?;
    u32::from_str_radix(s, 16).ok()
}

/// See [`super::is_balanced_json`].
pub(crate) fn is_balanced(data: &[u8]) -> bool {
    let d = data.trim_ascii();
    match (d.first(), d.last()) {
        (Some(b'{'), Some(b'}')) | (Some(b'['), Some(b']')) => {}
        _ => return false,
    }
    let mut depth = 0usize;
    let mut i = 0;
    while i < d.len() {
        match d[i] {
            b'"' => {
                // To the closing quote, over escapes (`\"` included).
                let mut j = i + 1;
                loop {
                    let Some(k) = memchr::memchr2(b'"', b'\\', &d[j..]) else {
                        return false;
                    };
                    if d[j + k] == b'\\' {
                        j += k + 2;
                        if j >= d.len() {
                            return false;
                        }
                    } else {
                        j += k + 1;
                        break;
                    }
                }
                i = j;
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                if depth == 0 {
                    return false;
                }
                depth -= 1;
                if depth == 0 && i + 1 != d.len() {
                    return false;
                }
            }
            _ => {}
        }
        i += 1;
    }
    depth == 0
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::Value;

    use super::Scan;

    #[test]
    fn balanced_structure_catches_cut_and_run_together_events() {
        for ok in [
            r#"{"a":1}"#,
            r#" {"a":"x}\"]","b":[1,{"c":null}]} "#,
            r#"[1,2]"#,
            r#"{"s":"\\"}"#,
        ] {
            assert!(super::is_balanced(ok.as_bytes()), "{ok}");
        }
        for bad in [
            "",
            "[DONE]x",
            "not json",
            r#"{"id":"mock-malformed","choices":[{"delta":{"content":"lost"}"#,
            r#"{"a":1}{"b":2}"#,
            r#"{"a":"unterminated}"#,
            r#"{"a":"\"}"#,
            r#"{"a":1]}"#,
            r#"{"a":1}}"#,
            "\"just a string\"",
        ] {
            assert!(!super::is_balanced(bad.as_bytes()), "{bad}");
        }
    }

    /// Skips `text` as one value: Ok exactly when serde_json parses it.
    fn accepts(text: &str) -> bool {
        let mut s = Scan::new(text.as_bytes(), "test");
        s.skip().and_then(|()| s.end()).is_ok()
    }

    #[test]
    fn validity_matches_serde_json() {
        for text in [
            r#"{"a":[1,-2.5e+3,true,false,null,"x\"\\\/\b\f\n\r\t\u00e9\ud83e\udd80"],"b":{}}"#,
            "  [ ]  ",
            "0",
            "-0.0e0",
            "01",
            "1.",
            "-",
            ".5",
            "1e",
            "[1,]",
            "{\"a\":1,}",
            "{\"a\" 1}",
            "{a:1}",
            "\"\\x\"",
            "\"\\u12g4\"",
            "\"a\u{1}b\"",
            "\"unterminated",
            "nul",
            "truex",
            "[1] 2",
            "{\"a\":1}}",
            "",
        ] {
            assert_eq!(
                accepts(text),
                serde_json::from_str::<Value>(text).is_ok(),
                "{text:?}"
            );
        }
    }

    #[test]
    fn strings_unescape_as_serde_json_does() {
        for text in [
            r#""plain""#,
            r#""q\"b\\s\/ \b\f\n\r\t""#,
            r#""\u00e9\u4e16\ud83e\udd80 \u0001""#,
        ] {
            let mut s = Scan::new(text.as_bytes(), "test");
            let got = s.str().unwrap();
            assert_eq!(got, serde_json::from_str::<String>(text).unwrap());
        }
        for lone in [r#""\ud83e""#, r#""\udd80""#, r#""\ud83e\u0041""#] {
            let mut s = Scan::new(lone.as_bytes(), "test");
            assert!(s.str().is_err(), "{lone}");
            assert!(serde_json::from_str::<String>(lone).is_err(), "{lone}");
        }
    }

    #[test]
    fn integers() {
        for (text, want) in [("0", Some(0)), ("42", Some(42)), ("null", None)] {
            let mut s = Scan::new(text.as_bytes(), "test");
            assert_eq!(s.opt_u64().unwrap(), want);
        }
        for bad in ["-1", "1.5", "1e3", "01", "18446744073709551616", "\"1\""] {
            let mut s = Scan::new(bad.as_bytes(), "test");
            assert!(s.opt_u64().is_err(), "{bad}");
        }
    }

    proptest! {
        /// Any JSON serde_json writes is accepted, and its strings read back.
        #[test]
        fn reads_what_serde_json_writes(text in "(?s).{0,24}", n in any::<u64>()) {
            let doc = serde_json::json!({"t": text, "n": n, "a": [text, null, 1.5]}).to_string();
            prop_assert!(accepts(&doc));
            let mut s = Scan::new(doc.as_bytes(), "test");
            let (mut t, mut m) = (None, None);
            s.object(|s, name| match name {
                b"t" => { t = Some(s.str()?.into_owned()); Ok(()) }
                b"n" => { m = s.opt_u64()?; Ok(()) }
                _ => s.skip(),
            }).unwrap();
            prop_assert_eq!(t.as_deref(), Some(text.as_str()));
            prop_assert_eq!(m, Some(n));
        }

        /// Arbitrary JSON-ish text: accepted exactly when serde_json accepts
        /// it. (No exponents: serde_json refuses numbers beyond f64, e.g.
        /// `1e999`, which a skipped member need not be.)
        #[test]
        fn arbitrary_text_validity_matches_serde_json(text in "[\\[\\]{}:,\"\\\\nulasftr0-9 .+-]{0,16}") {
            prop_assert_eq!(accepts(&text), serde_json::from_str::<Value>(&text).is_ok(), "{:?}", text);
        }
    }
}
