//! Byte-level BPE merging by rank.
//!
//! A word (one pre-token) starts as one symbol per byte. Adjacent pairs that
//! have a merge rule are kept in a min-heap ordered by (rank, position); the
//! best pair is merged, its neighbours' pairs are pushed, and stale heap
//! entries are skipped when popped. This is the order llama.cpp and the
//! Hugging Face tokenizers use: lowest rank first, leftmost on ties.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

/// Marks a symbol whose text is not a vocabulary token.
pub const NO_TOKEN: u32 = u32::MAX;

/// A small multiplicative hasher for the `u64` pair keys of the merge table.
#[derive(Default, Clone, Copy)]
pub struct PairHasher(u64);

impl Hasher for PairHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    #[inline]
    fn write_u64(&mut self, v: u64) {
        // Fibonacci hashing; the high bits are well mixed.
        let h = (self.0 ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 29);
    }
}

/// Merge table keyed by `(left_id << 32) | right_id`, valued `(rank, merged_id)`.
pub type MergeMap = HashMap<u64, (u32, u32), BuildHasherDefault<PairHasher>>;

/// The [`MergeMap`] key of the pair `(left, right)`.
#[inline]
pub fn pair_key(left: u32, right: u32) -> u64 {
    ((left as u64) << 32) | right as u64
}

#[derive(Clone, Copy)]
struct Symbol {
    id: u32,
    /// Byte offset of the symbol in the word.
    start: u32,
    /// Byte length; 0 marks a symbol merged into its left neighbour.
    len: u32,
    prev: u32,
    next: u32,
}

const NONE: u32 = u32::MAX;

/// Reusable buffers for [`merge_word`].
#[derive(Default)]
pub struct BpeScratch {
    symbols: Vec<Symbol>,
    heap: BinaryHeap<Reverse<u64>>,
}

/// Runs BPE on `word` and appends the resulting ids to `out`.
///
/// `byte_ids[b]` is the token of the single byte `b` ([`NO_TOKEN`] if the
/// vocabulary lacks it). Symbols that end up without a token are emitted
/// byte by byte, skipping bytes that have no token either (as llama.cpp does).
pub fn merge_word(
    word: &[u8],
    byte_ids: &[u32; 256],
    merges: &MergeMap,
    scratch: &mut BpeScratch,
    out: &mut Vec<u32>,
) {
    let n = word.len();
    if n == 0 {
        return;
    }
    if n == 1 {
        emit_symbol(byte_ids[word[0] as usize], word, byte_ids, out);
        return;
    }
    let symbols = &mut scratch.symbols;
    let heap = &mut scratch.heap;
    symbols.clear();
    heap.clear();
    for (i, &b) in word.iter().enumerate() {
        symbols.push(Symbol {
            id: byte_ids[b as usize],
            start: i as u32,
            len: 1,
            prev: if i == 0 { NONE } else { i as u32 - 1 },
            next: if i + 1 == n { NONE } else { i as u32 + 1 },
        });
    }

    let rank_of = |l: u32, r: u32| -> Option<u32> {
        if l == NO_TOKEN || r == NO_TOKEN {
            return None;
        }
        merges.get(&pair_key(l, r)).map(|&(rank, _)| rank)
    };

    for i in 0..n - 1 {
        if let Some(rank) = rank_of(symbols[i].id, symbols[i + 1].id) {
            heap.push(Reverse(((rank as u64) << 32) | i as u64));
        }
    }

    while let Some(Reverse(entry)) = heap.pop() {
        let rank = (entry >> 32) as u32;
        let left = (entry & 0xFFFF_FFFF) as usize;
        let l = symbols[left];
        if l.len == 0 || l.next == NONE {
            continue;
        }
        let right = l.next as usize;
        let r = symbols[right];
        // Stale entry: the pair at this position is no longer the one ranked.
        let Some(&(cur_rank, merged)) = merges.get(&pair_key(l.id, r.id)) else {
            continue;
        };
        if cur_rank != rank || l.id == NO_TOKEN || r.id == NO_TOKEN {
            continue;
        }
        symbols[left].id = merged;
        symbols[left].len = l.len + r.len;
        symbols[left].next = r.next;
        symbols[right].len = 0;
        if r.next != NONE {
            symbols[r.next as usize].prev = left as u32;
        }
        if l.prev != NONE {
            let p = l.prev as usize;
            if let Some(rk) = rank_of(symbols[p].id, merged) {
                heap.push(Reverse(((rk as u64) << 32) | p as u64));
            }
        }
        if r.next != NONE {
            if let Some(rk) = rank_of(merged, symbols[r.next as usize].id) {
                heap.push(Reverse(((rk as u64) << 32) | left as u64));
            }
        }
    }

    let mut i = 0usize;
    while i != NONE as usize {
        let s = symbols[i];
        let bytes = &word[s.start as usize..(s.start + s.len) as usize];
        emit_symbol(s.id, bytes, byte_ids, out);
        i = s.next as usize;
    }
}

#[inline]
fn emit_symbol(id: u32, bytes: &[u8], byte_ids: &[u32; 256], out: &mut Vec<u32>) {
    if id != NO_TOKEN {
        out.push(id);
    } else {
        out.extend(
            bytes
                .iter()
                .map(|&b| byte_ids[b as usize])
                .filter(|&t| t != NO_TOKEN),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Vocabulary: bytes a=0 b=1 c=2, "ab"=3, "bc"=4, "abc"=5, "aa"=6.
    fn setup() -> ([u32; 256], MergeMap) {
        let mut byte_ids = [NO_TOKEN; 256];
        byte_ids[b'a' as usize] = 0;
        byte_ids[b'b' as usize] = 1;
        byte_ids[b'c' as usize] = 2;
        let mut m = MergeMap::default();
        m.insert(pair_key(1, 2), (0, 4)); // b c
        m.insert(pair_key(0, 1), (1, 3)); // a b
        m.insert(pair_key(3, 2), (2, 5)); // ab c
        m.insert(pair_key(0, 0), (3, 6)); // a a
        (byte_ids, m)
    }

    fn run(word: &str) -> Vec<u32> {
        let (b, m) = setup();
        let mut out = Vec::new();
        merge_word(
            word.as_bytes(),
            &b,
            &m,
            &mut BpeScratch::default(),
            &mut out,
        );
        out
    }

    #[test]
    fn lowest_rank_wins() {
        // "b c" (rank 0) beats "a b" (rank 1): a + bc, and "a bc" has no merge.
        assert_eq!(run("abc"), vec![0, 4]);
        assert_eq!(run("ab"), vec![3]);
        assert_eq!(run("abab"), vec![3, 3]);
    }

    #[test]
    fn leftmost_on_ties() {
        assert_eq!(run("aaa"), vec![6, 0]);
        assert_eq!(run("aaaa"), vec![6, 6]);
    }

    #[test]
    fn unknown_bytes_are_dropped_known_kept() {
        assert_eq!(run("axb"), vec![0, 1]);
        assert_eq!(run(""), Vec::<u32>::new());
        assert_eq!(run("x"), Vec::<u32>::new());
    }
}
