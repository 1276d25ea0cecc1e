//! Byte tries over small sets of fixed spellings: an object's property keys, an `enum`'s
//! values. All tries of a schema live in one arena and a trie is named by its root, so the
//! automaton's state holds a single `u32` while matching one.

/// No such node.
pub const NONE: u32 = u32::MAX;

#[derive(Clone, Debug)]
struct Node {
    /// This node's edges: `edge_bytes[edges.0..edges.1]`, sorted by byte.
    edges: (u32, u32),
    /// The word that ends here, if any.
    word: u32,
    /// The words below this node (this one's included), sorted: `below[..]`.
    below: (u32, u32),
    /// Bytes matched to reach this node.
    depth: u32,
    /// Fewest bytes from here to the end of a word.
    min_rest: u32,
}

/// Tries stored together.
#[derive(Clone, Debug, Default)]
pub struct Tries {
    nodes: Vec<Node>,
    edge_bytes: Vec<u8>,
    edge_targets: Vec<u32>,
    below: Vec<u32>,
}

impl Tries {
    /// Add a trie over `words` (word `i` is `words[i]`; an empty word is ignored) and
    /// return its root.
    pub fn add(&mut self, words: &[&[u8]]) -> u32 {
        // Build with child lists, then flatten breadth-first so each node's edges are
        // contiguous.
        struct Tmp {
            children: Vec<(u8, usize)>,
            word: u32,
            below: Vec<u32>,
            depth: u32,
        }
        let mut tmp = vec![Tmp {
            children: Vec::new(),
            word: NONE,
            below: Vec::new(),
            depth: 0,
        }];
        for (i, w) in words.iter().enumerate() {
            if w.is_empty() {
                continue;
            }
            let mut at = 0;
            tmp[at].below.push(i as u32);
            for (d, &b) in w.iter().enumerate() {
                at = match tmp[at].children.iter().find(|c| c.0 == b) {
                    Some(&(_, n)) => n,
                    None => {
                        tmp.push(Tmp {
                            children: Vec::new(),
                            word: NONE,
                            below: Vec::new(),
                            depth: d as u32 + 1,
                        });
                        let n = tmp.len() - 1;
                        tmp[at].children.push((b, n));
                        n
                    }
                };
                tmp[at].below.push(i as u32);
            }
            if tmp[at].word == NONE {
                tmp[at].word = i as u32;
            }
        }
        // Fewest bytes to a word end, children before parents (children have larger ids).
        let mut min_rest = vec![u32::MAX; tmp.len()];
        for n in (0..tmp.len()).rev() {
            let mut m = if tmp[n].word != NONE { 0 } else { u32::MAX };
            for &(_, c) in &tmp[n].children {
                m = m.min(min_rest[c].saturating_add(1));
            }
            min_rest[n] = m;
        }
        let base = self.nodes.len() as u32;
        for (n, t) in tmp.iter_mut().enumerate() {
            t.children.sort_unstable();
            let e0 = self.edge_bytes.len() as u32;
            for &(b, c) in &t.children {
                self.edge_bytes.push(b);
                self.edge_targets.push(base + c as u32);
            }
            let b0 = self.below.len() as u32;
            t.below.sort_unstable();
            t.below.dedup();
            self.below.extend_from_slice(&t.below);
            self.nodes.push(Node {
                edges: (e0, self.edge_bytes.len() as u32),
                word: t.word,
                below: (b0, self.below.len() as u32),
                depth: t.depth,
                min_rest: min_rest[n],
            });
        }
        base
    }

    /// The node reached from `n` by byte `b`.
    #[inline]
    pub fn child(&self, n: u32, b: u8) -> Option<u32> {
        let (lo, hi) = self.nodes[n as usize].edges;
        let bytes = &self.edge_bytes[lo as usize..hi as usize];
        bytes
            .binary_search(&b)
            .ok()
            .map(|i| self.edge_targets[lo as usize + i])
    }

    /// The word ending at `n`, if one does.
    #[inline]
    pub fn word(&self, n: u32) -> Option<u32> {
        let w = self.nodes[n as usize].word;
        (w != NONE).then_some(w)
    }

    /// The words below `n`, sorted.
    #[inline]
    pub fn below(&self, n: u32) -> &[u32] {
        let (lo, hi) = self.nodes[n as usize].below;
        &self.below[lo as usize..hi as usize]
    }

    /// True if some word below `n` has an index in `lo..=hi`.
    #[inline]
    pub fn has_below_in(&self, n: u32, lo: u32, hi: u32) -> bool {
        let w = self.below(n);
        let i = w.partition_point(|&x| x < lo);
        i < w.len() && w[i] <= hi
    }

    /// Bytes matched to reach `n`.
    pub fn depth(&self, n: u32) -> usize {
        self.nodes[n as usize].depth as usize
    }

    /// Fewest bytes from `n` to the end of a word.
    pub fn min_rest(&self, n: u32) -> usize {
        self.nodes[n as usize].min_rest as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_and_ranges() {
        let mut t = Tries::default();
        let _other = t.add(&[b"zz"]);
        let r = t.add(&[b"ab\"", b"a\"", b"b\"", b"1", b"12"]);
        let a = t.child(r, b'a').unwrap();
        assert_eq!(t.below(a), &[0, 1]);
        assert!(t.has_below_in(a, 1, 4) && !t.has_below_in(a, 2, 4));
        assert_eq!(t.min_rest(a), 1);
        let q = t.child(a, b'"').unwrap();
        assert_eq!((t.word(q), t.depth(q)), (Some(1), 2));
        let one = t.child(r, b'1').unwrap();
        assert_eq!(t.word(one), Some(3));
        assert_eq!(t.word(t.child(one, b'2').unwrap()), Some(4));
        assert!(t.child(r, b'c').is_none());
        assert_eq!(t.min_rest(r), 1);
    }
}
