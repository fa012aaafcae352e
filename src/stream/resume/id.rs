//! Owns the shape of stream ids and event ids.
//!
//! A stream id is `s{c|m|r}_<replica_id>_<32 hex>`: the letter is the client dialect (Chat
//! Completions, Messages, Responses), so any replica can answer about any id in the right
//! dialect; the replica tag (`server.replica_id`, which has no `_`) says which replica
//! holds it; 128 random bits make it unguessable. An event id is `<stream_id>:<seq>`.

use crate::protocol::ClientDialect;

/// Longest stream id accepted, bytes (`s` + letter + `_` + 32-char replica + `_` + 32 hex).
const MAX_ID_BYTES: usize = 2 + 1 + 32 + 1 + 32;

/// A stream id's parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StreamId<'a> {
    /// The client dialect of the stream.
    pub(crate) dialect: ClientDialect,
    /// The replica that holds it.
    pub(crate) replica: &'a str,
}

/// The dialect letter of a stream id.
fn letter(d: ClientDialect) -> char {
    match d {
        ClientDialect::ChatCompletions => 'c',
        ClientDialect::Messages => 'm',
        ClientDialect::Responses => 'r',
    }
}

/// A fresh stream id for a stream of `dialect` held by `replica`.
pub(crate) fn new_id(dialect: ClientDialect, replica: &str) -> String {
    format!(
        "s{}_{replica}_{:016x}{:016x}",
        letter(dialect),
        fastrand::u64(..),
        fastrand::u64(..)
    )
}

/// Parses a stream id (`None`: not one Sluice could have made).
pub(crate) fn parse(id: &str) -> Option<StreamId<'_>> {
    if id.len() > MAX_ID_BYTES {
        return None;
    }
    let rest = id.strip_prefix('s')?;
    let dialect = match rest.as_bytes().first()? {
        b'c' => ClientDialect::ChatCompletions,
        b'm' => ClientDialect::Messages,
        b'r' => ClientDialect::Responses,
        _ => return None,
    };
    let rest = rest[1..].strip_prefix('_')?;
    let (replica, random) = rest.split_once('_')?;
    let replica_ok = !replica.is_empty()
        && replica.len() <= 32
        && replica
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-');
    let random_ok = random.len() == 32 && random.bytes().all(|b| b.is_ascii_hexdigit());
    (replica_ok && random_ok).then_some(StreamId { dialect, replica })
}

/// The event number of `last_event_id` (`<stream_id>:<seq>`) when it names an event of
/// `stream_id`; an empty value is "from the first event" (0).
///
/// # Errors
/// When it names another stream or is not an event id.
pub(crate) fn event_seq(stream_id: &str, last_event_id: &str) -> Result<u64, ()> {
    let v = last_event_id.trim();
    if v.is_empty() {
        return Ok(0);
    }
    let (sid, seq) = v.rsplit_once(':').ok_or(())?;
    if sid != stream_id {
        return Err(());
    }
    seq.parse().map_err(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_with_their_dialect_and_replica() {
        for d in [
            ClientDialect::ChatCompletions,
            ClientDialect::Messages,
            ClientDialect::Responses,
        ] {
            let id = new_id(d, "eu-1");
            assert_eq!(
                parse(&id),
                Some(StreamId {
                    dialect: d,
                    replica: "eu-1"
                })
            );
            assert_ne!(id, new_id(d, "eu-1"));
        }
        for bad in [
            "",
            "sx_r_00000000000000000000000000000000",
            "sc_r_0000",
            "sc__00000000000000000000000000000000",
            "sc_r_0000000000000000000000000000000g",
            "sc_a_b_00000000000000000000000000000000",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn event_ids_name_an_event_of_this_stream() {
        assert_eq!(event_seq("sc_a_1", "sc_a_1:7"), Ok(7));
        assert_eq!(event_seq("sc_a_1", " "), Ok(0));
        assert!(event_seq("sc_a_1", "sc_a_2:7").is_err());
        assert!(event_seq("sc_a_1", "7").is_err());
        assert!(event_seq("sc_a_1", "sc_a_1:x").is_err());
    }
}
