//! Sorting entries by bin: the one order a partitioned layer's rows are kept in (a store
//! sorting a segment's rows, a policy finding a segment's positions by bucket).

/// Counting sort of entries by bin, stable (entries keep their order within a bin, so a
/// bin's positions stay ascending): `bins[i]` is entry `i`'s bin, below `starts.len() − 1`;
/// `starts` (zeroed) receives where each bin's entries begin, and `put(place, i)` is called
/// for every entry `i`, in order, with its place. `next` is scratch.
pub fn sort_by_bin<B: Copy + Into<u64>>(
    bins: &[B],
    starts: &mut [u32],
    next: &mut Vec<u32>,
    mut put: impl FnMut(usize, usize),
) {
    let c = starts.len() - 1;
    for &b in bins {
        starts[b.into() as usize + 1] += 1;
    }
    for b in 0..c {
        starts[b + 1] += starts[b];
    }
    next.clear();
    next.extend_from_slice(&starts[..c]);
    for (i, &b) in bins.iter().enumerate() {
        let slot = &mut next[b.into() as usize];
        put(*slot as usize, i);
        *slot += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_go_to_their_bins_in_order() {
        let bins: [u16; 8] = [2, 0, 2, 1, 0, 2, 3, 0];
        let mut starts = vec![0u32; 5];
        let mut out = vec![usize::MAX; bins.len()];
        sort_by_bin(&bins, &mut starts, &mut Vec::new(), |place, i| {
            out[place] = i
        });
        assert_eq!(starts, [0, 3, 4, 7, 8]);
        assert_eq!(out, [1, 4, 7, 3, 0, 2, 5, 6]);
    }
}
