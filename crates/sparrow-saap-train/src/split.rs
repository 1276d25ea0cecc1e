//! The held-out split: which recorded query positions are kept out of training.
//!
//! Decided by a hash of (seed, the record's source, the position), not by drawing from a
//! random stream, so [`crate::evaluate()`] can name exactly the positions [`crate::train`]
//! held out without being told, whatever the order the records come in. A whole position
//! is held out (every head, every layer): the group of query heads sharing a KV head is
//! routed together, so it is evaluated together.

/// Whether the query at `position` of the record from `source` is held out, for a
/// held-out `fraction` and `seed`.
pub fn is_held_out(seed: u64, source: &str, position: usize, fraction: f64) -> bool {
    if fraction <= 0.0 {
        return false;
    }
    // FNV-1a of the source, mixed with the seed and the position.
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in source.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    let h = mix(mix(h ^ mix(seed)) ^ position as u64);
    ((h >> 11) as f64 / (1u64 << 53) as f64) < fraction
}

/// SplitMix64's finaliser: every input bit moves every output bit.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// About the asked fraction is held out, none at 0, and the split depends on the seed
    /// and the source.
    #[test]
    fn holds_out_the_fraction_asked() {
        let n = 20_000;
        let count = |seed, src: &str, f| (0..n).filter(|&p| is_held_out(seed, src, p, f)).count();
        assert_eq!(count(1, "a", 0.0), 0);
        let c = count(1, "a", 0.1);
        assert!((1800..2200).contains(&c), "{c}");
        let same = |s2, src2: &str| {
            (0..n)
                .filter(|&p| is_held_out(1, "a", p, 0.1) == is_held_out(s2, src2, p, 0.1))
                .count()
        };
        assert_eq!(same(1, "a"), n);
        assert!(same(2, "a") < n * 9 / 10);
        assert!(same(1, "b") < n * 9 / 10);
    }
}
