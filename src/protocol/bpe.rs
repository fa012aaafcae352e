//! A compact `o200k_base` token counter: the same pieces and the same merges as
//! `tiktoken-rs` (its pattern, its rank data and its merge loop), in about a tenth of the
//! memory. `tiktoken-rs`'s `CoreBPE` keeps an encoder and a decoder map of 200k separately
//! allocated byte strings plus a sorted copy (~45 MB resident); this table keeps the token
//! bytes once, end to end in rank order, with an open-addressing index of ranks (~4 MB).
//!
//! The table is built from `tiktoken-rs`'s own `o200k_base` (built once, read rank by rank
//! and dropped), so the ranks are tiktoken's. Counts equal `CoreBPE::encode_ordinary(..).len()`
//! on every input: the unit tests compare them on every token's text, a fixed corpus and
//! random text (`proptest`).

use std::collections::BinaryHeap;
use std::sync::LazyLock;

use fancy_regex::Regex;

/// A token's rank (its id), as in `tiktoken-rs`.
type Rank = u32;

/// The ranks of `o200k_base`'s ordinary tokens, by their bytes.
struct Table {
    /// Every token's bytes, in rank order, end to end.
    bytes: Box<[u8]>,
    /// Where token `r`'s bytes end in `bytes` (they start where token `r - 1`'s end).
    ends: Box<[u32]>,
    /// Open addressing, linear probing: `rank + 1` of the token whose bytes hash here, or 0.
    slots: Box<[u32]>,
}

/// The hash of a token's bytes (multiply-xorshift over 8-byte words; tokens are short).
fn hash(b: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ b.len() as u64;
    for chunk in b.chunks(8) {
        let mut w = [0u8; 8];
        w[..chunk.len()].copy_from_slice(chunk);
        h = (h ^ u64::from_le_bytes(w)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^= h >> 29;
    }
    h
}

impl Table {
    /// The table of `tiktoken-rs`'s `o200k_base`: every rank from 0 up that decodes (the
    /// ordinary tokens are ranks 0..199,997; the special tokens follow a gap and are not
    /// read).
    fn o200k() -> Self {
        let core = tiktoken_rs::o200k_base().expect("tiktoken-rs's o200k_base data is valid");
        let mut bytes = Vec::with_capacity(2 << 20);
        let mut ends = Vec::with_capacity(200_000);
        while let Ok(b) = core.decode_bytes(&[ends.len() as Rank]) {
            bytes.extend_from_slice(&b);
            ends.push(u32::try_from(bytes.len()).expect("o200k's bytes fit in u32"));
        }
        drop(core);
        let size = (ends.len() * 2).next_power_of_two();
        let mut table = Self {
            bytes: bytes.into_boxed_slice(),
            ends: ends.into_boxed_slice(),
            slots: vec![0u32; size].into_boxed_slice(),
        };
        for r in 0..table.ends.len() {
            let mask = table.slots.len() - 1;
            let mut i = hash(table.token(r)) as usize & mask;
            while table.slots[i] != 0 {
                i = (i + 1) & mask;
            }
            table.slots[i] = r as u32 + 1;
        }
        table
    }

    /// The bytes of the token of rank `r`.
    fn token(&self, r: usize) -> &[u8] {
        let start = if r == 0 { 0 } else { self.ends[r - 1] as usize };
        &self.bytes[start..self.ends[r] as usize]
    }

    /// The rank of the token whose bytes are `b`, if there is one.
    fn rank(&self, b: &[u8]) -> Option<Rank> {
        let mask = self.slots.len() - 1;
        let mut i = hash(b) as usize & mask;
        loop {
            let slot = self.slots[i];
            if slot == 0 {
                return None;
            }
            if self.token(slot as usize - 1) == b {
                return Some(slot - 1);
            }
            i = (i + 1) & mask;
        }
    }

    /// Heap bytes the table holds.
    fn heap_bytes(&self) -> usize {
        self.bytes.len() + 4 * (self.ends.len() + self.slots.len())
    }

    /// The rank of `b`, or `Rank::MAX` (no token): the merge loops' form.
    fn rank_or_max(&self, b: &[u8]) -> Rank {
        self.rank(b).unwrap_or(Rank::MAX)
    }
}

/// The counter: the table and `tiktoken-rs`'s `o200k_base` pattern.
struct Counter {
    table: Table,
    pattern: Regex,
}

static COUNTER: LazyLock<Counter> = LazyLock::new(|| Counter {
    table: Table::o200k(),
    pattern: Regex::new(tiktoken_rs::O200K_BASE_PAT_STR).expect("tiktoken-rs's pattern compiles"),
});

/// Loads the table (about 0.2 s of CPU in a release build, once per process; the
/// `tiktoken-rs` table it is read from is held only meanwhile) and returns the heap bytes it
/// keeps.
pub(crate) fn load() -> usize {
    COUNTER.table.heap_bytes()
}

/// The `o200k_base` tokens of `text`, special-token text counted as ordinary text: the
/// length of `tiktoken-rs`'s `CoreBPE::encode_ordinary(text)`. CPU time is quadratic in the
/// length of one run the pattern does not split (callers cut long text first).
pub(crate) fn count_ordinary(text: &str) -> u64 {
    let c = &*COUNTER;
    let mut n = 0u64;
    for m in c.pattern.find_iter(text) {
        // The pattern has no construct that can exceed fancy-regex's backtrack limit on a
        // match it found (its look-ahead is one character); count an error's rest as bytes.
        let Ok(m) = m else {
            return n + text.len() as u64;
        };
        let piece = m.as_str().as_bytes();
        n += if c.table.rank(piece).is_some() {
            1
        } else {
            piece_tokens(&c.table, piece)
        };
    }
    n
}

/// The tokens of one piece that is not itself a token (`tiktoken-rs`'s `byte_pair_encode`).
fn piece_tokens(t: &Table, piece: &[u8]) -> u64 {
    match piece.len() {
        0 => 0,
        1 => 1,
        2..100 => merge_small(t, piece),
        _ => merge_large(t, piece),
    }
}

/// `tiktoken-rs`'s `_byte_pair_merge`, counting the parts: repeatedly merge the adjacent
/// pair of least rank (the leftmost of equals).
fn merge_small(t: &Table, piece: &[u8]) -> u64 {
    // (start, rank of the pair starting at start).
    let mut parts: Vec<(usize, Rank)> = Vec::with_capacity(piece.len() + 1);
    let mut min_rank: (Rank, usize) = (Rank::MAX, usize::MAX);
    for i in 0..piece.len() - 1 {
        let rank = t.rank_or_max(&piece[i..i + 2]);
        if rank < min_rank.0 {
            min_rank = (rank, i);
        }
        parts.push((i, rank));
    }
    parts.push((piece.len() - 1, Rank::MAX));
    parts.push((piece.len(), Rank::MAX));
    let get_rank = |parts: &Vec<(usize, Rank)>, i: usize| {
        if i + 3 < parts.len() {
            t.rank_or_max(&piece[parts[i].0..parts[i + 3].0])
        } else {
            Rank::MAX
        }
    };
    while min_rank.0 != Rank::MAX {
        let i = min_rank.1;
        if i > 0 {
            parts[i - 1].1 = get_rank(&parts, i - 1);
        }
        parts[i].1 = get_rank(&parts, i);
        parts.remove(i + 1);
        min_rank = (Rank::MAX, usize::MAX);
        for (i, &(_, rank)) in parts[..parts.len() - 1].iter().enumerate() {
            if rank < min_rank.0 {
                min_rank = (rank, i);
            }
        }
    }
    parts.len() as u64 - 1
}

/// A candidate merge of [`merge_large`]'s heap: least rank first, then leftmost.
#[derive(Eq, PartialEq, Clone, Copy)]
struct Merge {
    start: usize,
    rank: Rank,
}

impl Ord for Merge {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other
            .rank
            .cmp(&self.rank)
            .then_with(|| other.start.cmp(&self.start))
    }
}

impl PartialOrd for Merge {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// One part of [`merge_large`]'s piece, indexed by where it starts.
struct State {
    prev: usize,
    end: usize,
    next_end: usize,
    next_rank: Rank,
}

/// `tiktoken-rs`'s `_byte_pair_merge_large` (the same merges with a heap, for pieces of
/// 100 bytes or more), counting the parts.
fn merge_large(t: &Table, piece: &[u8]) -> u64 {
    let mut state = Vec::with_capacity(piece.len());
    state.push(State {
        prev: usize::MAX,
        end: 1,
        next_end: 2,
        next_rank: Rank::MAX,
    });
    let mut heap = BinaryHeap::with_capacity(piece.len());
    for i in 0..piece.len() - 1 {
        if let Some(rank) = t.rank(&piece[i..i + 2]) {
            heap.push(Merge { start: i, rank });
            state[i].next_rank = rank;
        }
        state.push(State {
            prev: i,
            end: i + 2,
            next_end: i + 3,
            next_rank: Rank::MAX,
        });
    }
    let potential_merge =
        |state: &mut Vec<State>, heap: &mut BinaryHeap<Merge>, start: usize, next_end: usize| {
            state[start].next_end = next_end;
            state[start].next_rank = Rank::MAX;
            if next_end <= piece.len() {
                if let Some(rank) = t.rank(&piece[start..next_end]) {
                    heap.push(Merge { start, rank });
                    state[start].next_rank = rank;
                }
            }
        };
    while let Some(left) = heap.pop() {
        if left.rank == Rank::MAX {
            break;
        }
        if left.rank != state[left.start].next_rank {
            continue; // invalidated
        }
        let left_start = left.start;
        let right_start = state[left_start].end;
        let right_end = state[left_start].next_end;
        let right_next_end = state[right_start].next_end;
        state[left_start].end = right_end;
        potential_merge(&mut state, &mut heap, left_start, right_next_end);
        if right_end < state.len() {
            state[right_end].prev = left_start;
        }
        if left_start > 0 {
            let prev_start = state[left_start].prev;
            potential_merge(&mut state, &mut heap, prev_start, right_end);
        }
        state[right_start].next_rank = Rank::MAX;
    }
    let (mut n, mut i) = (0u64, 0usize);
    while i < state.len() {
        n += 1;
        i = state[i].end;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn reference(text: &str) -> u64 {
        tiktoken_rs::o200k_base_singleton()
            .encode_ordinary(text)
            .len() as u64
    }

    #[test]
    fn every_token_is_in_the_table_under_its_rank() {
        let core = tiktoken_rs::o200k_base_singleton();
        let t = &COUNTER.table;
        assert_eq!(t.ends.len(), 199_998);
        for r in 0..t.ends.len() {
            assert_eq!(core.decode_bytes(&[r as Rank]).unwrap(), t.token(r));
            assert_eq!(t.rank(t.token(r)), Some(r as Rank));
        }
        assert_eq!(t.rank(b"<|endoftext|>"), None);
        assert!(t.heap_bytes() < 8 << 20, "{}", t.heap_bytes());
    }

    #[test]
    fn every_tokens_text_counts_as_tiktoken_counts_it() {
        let t = &COUNTER.table;
        for r in 0..t.ends.len() {
            let Ok(s) = std::str::from_utf8(t.token(r)) else {
                continue;
            };
            for text in [s.to_owned(), format!("{s}{s}"), format!(" {s}x{s}\n")] {
                assert_eq!(count_ordinary(&text), reference(&text), "{text:?}");
            }
        }
    }

    #[test]
    fn a_fixed_corpus_counts_as_tiktoken_counts_it() {
        let corpus = [
            "",
            "hello world",
            "fn main() {\n    let x: Vec<u8> = vec![1, 2, 3];\n    println!(\"{x:?}\");\n}\n",
            "def f(a, b):\n\treturn a ** b  # comment\n\n\n",
            "日本語のテキストとカタカナ、漢字。中文文本测试。한국어 텍스트입니다.",
            "emoji 😀🎉👩‍👩‍👧‍👦🇫🇷 and ✓ ✗ — “quotes” ‘single’",
            "   leading, trailing   \n\n\t  \r\n   ",
            "             ",
            "\n\n\n\n x",
            "Supercalifragilisticexpialidocious antidisestablishmentarianism",
            &"a".repeat(5000),
            &"ab1".repeat(400),
            &"😀".repeat(300),
            "<|endoftext|> <|endofprompt|><|fim_prefix|>",
            "I'm you're they'LL it'S WE'VE 12345678 3.14159 1,000,000",
            "http://example.com/a/b?c=d&e=f#g path/to/file.rs",
            "Überprüfung naïve café résumé ÀÉÎÕÜ",
            "{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\"}}",
        ];
        for text in corpus {
            assert_eq!(count_ordinary(text), reference(text), "{text:?}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn random_text_counts_as_tiktoken_counts_it(text in "\\PC{0,300}") {
            prop_assert_eq!(count_ordinary(&text), reference(&text));
        }

        #[test]
        fn random_ascii_and_whitespace_counts_as_tiktoken_counts_it(
            text in "[a-zA-Z0-9 \\t\\n\\r'.,;:!?/(){}<>_-]{0,400}"
        ) {
            prop_assert_eq!(count_ordinary(&text), reference(&text));
        }
    }
}
