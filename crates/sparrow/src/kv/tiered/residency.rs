//! Which blocks of the cold file are believed to be in the OS's page cache, so a plan's
//! `MADV_WILLNEED` goes only to blocks that may need a disk read.
//!
//! Advising a range the page cache already holds is not free: the kernel looks up every
//! page of it. Asked for each layer of each decode step, that cost more than the reads it
//! hides — a quest step at depth 32K advised megabytes of cached pages per layer. Blocks
//! this process wrote (a write leaves its pages cached) or has advised since are marked;
//! the map is forgotten when the process takes a major page fault (something it read had
//! been evicted: the OS is short of memory, so nothing marked can be trusted) and when the
//! cold pages are dropped on purpose (`drop_cold_pages`).

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

/// One bit per block of `block` positions, per global layer.
pub(super) struct Residency {
    block: usize,
    words_per_layer: usize,
    bits: Vec<AtomicU64>,
    /// The process's major faults when the map was last checked against them.
    major_faults: AtomicU64,
}

impl Residency {
    pub(super) fn new(n_global: usize, n_ctx: usize, block: usize) -> Self {
        let words_per_layer = n_ctx.div_ceil(block).div_ceil(64);
        Residency {
            block,
            words_per_layer,
            bits: (0..n_global * words_per_layer)
                .map(|_| AtomicU64::new(0))
                .collect(),
            major_faults: AtomicU64::new(major_faults()),
        }
    }

    /// Positions `range` of global layer `gl` are in the page cache (just written).
    pub(super) fn mark(&self, gl: usize, range: Range<usize>) {
        for b in self.blocks(range) {
            let (w, bit) = self.word(gl, b);
            self.bits[w].fetch_or(bit, Ordering::Relaxed);
        }
    }

    /// Mark the blocks of `range` and return the runs of positions among them that were
    /// not marked before (whole blocks, within `range`'s blocks).
    pub(super) fn claim(&self, gl: usize, range: Range<usize>, out: &mut Vec<Range<usize>>) {
        for b in self.blocks(range) {
            let (w, bit) = self.word(gl, b);
            if self.bits[w].fetch_or(bit, Ordering::Relaxed) & bit == 0 {
                let r = b * self.block..(b + 1) * self.block;
                match out.last_mut() {
                    Some(last) if last.end == r.start => last.end = r.end,
                    _ => out.push(r),
                }
            }
        }
    }

    /// Forget every mark.
    pub(super) fn clear(&self) {
        for w in &self.bits {
            w.store(0, Ordering::Relaxed);
        }
    }

    /// Forget every mark if the process has taken a major fault since the last check.
    pub(super) fn forget_if_evicted(&self) {
        let now = major_faults();
        if self.major_faults.swap(now, Ordering::Relaxed) != now {
            self.clear();
        }
    }

    fn blocks(&self, range: Range<usize>) -> Range<usize> {
        if range.is_empty() {
            return 0..0;
        }
        range.start / self.block..(range.end - 1) / self.block + 1
    }

    fn word(&self, gl: usize, block: usize) -> (usize, u64) {
        (gl * self.words_per_layer + block / 64, 1 << (block % 64))
    }
}

/// The process's major page faults so far (reads that had to go to the disk), from
/// `/proc/self/stat`; 0 where that cannot be read (the map is then only cleared on purpose).
fn major_faults() -> u64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| parse_major_faults(&s))
        .unwrap_or(0)
}

/// Field 12 of `/proc/PID/stat` (`majflt`), counted after the parenthesised command name
/// (which may itself hold spaces and parentheses).
fn parse_major_faults(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(9)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn major_faults_are_read_after_the_command_name() {
        let stat = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 1500 0 7 0 12 3";
        assert_eq!(parse_major_faults(stat), Some(7));
        assert_eq!(parse_major_faults("4242 (x) S 1"), None);
        assert!(parse_major_faults(&std::fs::read_to_string("/proc/self/stat").unwrap()).is_some());
    }

    #[test]
    fn claims_each_block_once_and_forgets_on_clear() {
        let r = Residency::new(2, 1000, 16);
        r.mark(0, 0..32);
        let mut out = Vec::new();
        r.claim(0, 10..100, &mut out);
        assert_eq!(out, vec![32..112]);
        out.clear();
        r.claim(0, 0..112, &mut out);
        assert!(out.is_empty());
        r.claim(1, 40..41, &mut out);
        assert_eq!(out, vec![32..48], "layers are independent");
        r.clear();
        out.clear();
        r.claim(0, 0..20, &mut out);
        assert_eq!(out, vec![0..32]);
        out.clear();
        r.claim(0, 5..5, &mut out);
        assert!(out.is_empty());
        // The last block of a context that is not a multiple of the block.
        r.claim(1, 990..1000, &mut out);
        assert_eq!(out, vec![976..1008]);
    }
}
