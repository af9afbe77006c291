//! A depth-limited suffix tree with counts: every substring of up to
//! `depth` tokens of the sequences put in is a path from the root, and each
//! node counts the occurrences of its substring. What followed a context, and
//! how often, is a walk down from the node of the context.
//!
//! Nodes live in one arena and are found by a hash map keyed by (parent,
//! token), so a step down is one lookup whatever the number of children.
//! Each node keeps its most frequent child up to date as counts grow, so
//! choosing a continuation is O(1) too; a draft step never iterates over
//! children (an adversarial prompt can give a node thousands of them).
//!
//! A sequence is put in token by token ([`SuffixTree::extend`], O(depth) per
//! token through the nodes of its current suffixes) and taken out whole
//! ([`SuffixTree::remove`], O(depth) per token), which is how a bounded
//! cache evicts its oldest sequences.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// The root's index.
pub const ROOT: u32 = 0;
const NONE: u32 = u32::MAX;

/// Largest depth a tree may have.
pub const MAX_DEPTH: usize = 256;

/// A multiplicative hash for the (parent, token) keys: they are ours, not an
/// attacker's choice of bytes, and SipHash would cost more than the rest of
/// a step down.
#[derive(Default)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u64(&mut self, x: u64) {
        let h = (self.0 ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = h ^ (h >> 29);
    }
}

type KeyMap = HashMap<u64, u32, BuildHasherDefault<KeyHasher>>;

fn key(parent: u32, token: u32) -> u64 {
    (parent as u64) << 32 | token as u64
}

#[derive(Debug, Clone, Copy)]
struct Node {
    token: u32,
    /// Occurrences of this node's substring.
    count: u32,
    /// Occurrences followed by another token (the sum of the children's counts).
    cont: u32,
    parent: u32,
    /// The most frequent child (NONE: no children), kept as counts grow;
    /// after an eviction removes it, another child takes its place.
    best: u32,
    first_child: u32,
    next_sibling: u32,
    prev_sibling: u32,
    depth: u16,
}

impl Node {
    fn new(token: u32, parent: u32, depth: u16) -> Node {
        Node { token, count: 0, cont: 0, parent, best: NONE, first_child: NONE, next_sibling: NONE, prev_sibling: NONE, depth }
    }
}

/// A continuation found below a node.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Continuation {
    pub node: u32,
    pub token: u32,
    /// Occurrences of the path extended by this token.
    pub count: u32,
    /// Occurrences of the path that were followed by some token.
    pub of: u32,
}

/// The tree. Node 0 is the root (the empty substring).
#[derive(Debug, Clone)]
pub struct SuffixTree {
    depth: usize,
    nodes: Vec<Node>,
    free: Vec<u32>,
    children: KeyMap,
}

impl SuffixTree {
    /// A tree of substrings of up to `depth` tokens (1..=[`MAX_DEPTH`]).
    pub fn new(depth: usize) -> SuffixTree {
        assert!((1..=MAX_DEPTH).contains(&depth), "suffix tree depth {depth} out of 1..={MAX_DEPTH}");
        SuffixTree { depth, nodes: vec![Node::new(NONE, NONE, 0)], free: Vec::new(), children: KeyMap::default() }
    }

    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Nodes in use, the root included.
    pub fn nodes(&self) -> usize {
        self.nodes.len() - self.free.len()
    }

    /// Approximate bytes held (arena and map).
    pub fn bytes(&self) -> usize {
        self.nodes.capacity() * std::mem::size_of::<Node>()
            + self.free.capacity() * 4
            + self.children.capacity() * (std::mem::size_of::<(u64, u32)>() + 1)
    }

    /// Node depth (its substring's length).
    pub fn node_depth(&self, n: u32) -> usize {
        self.nodes[n as usize].depth as usize
    }

    /// The child of `n` for `token`.
    pub fn child(&self, n: u32, token: u32) -> Option<u32> {
        self.children.get(&key(n, token)).copied()
    }

    /// The most frequent continuation below `n`.
    pub fn best(&self, n: u32) -> Option<Continuation> {
        let node = &self.nodes[n as usize];
        (node.best != NONE).then(|| {
            let c = &self.nodes[node.best as usize];
            Continuation { node: node.best, token: c.token, count: c.count, of: node.cont }
        })
    }

    /// Follow `tokens` down from the root.
    pub fn walk(&self, tokens: &[u32]) -> Option<u32> {
        tokens.iter().try_fold(ROOT, |n, &t| self.child(n, t))
    }

    /// One more occurrence of `token` after `n`'s substring: the child,
    /// created if new.
    fn add(&mut self, n: u32, token: u32) -> u32 {
        let c = match self.children.get(&key(n, token)) {
            Some(&c) => c,
            None => {
                let depth = self.nodes[n as usize].depth + 1;
                let node = Node::new(token, n, depth);
                let c = match self.free.pop() {
                    Some(i) => {
                        self.nodes[i as usize] = node;
                        i
                    }
                    None => {
                        self.nodes.push(node);
                        (self.nodes.len() - 1) as u32
                    }
                };
                let head = self.nodes[n as usize].first_child;
                self.nodes[c as usize].next_sibling = head;
                if head != NONE {
                    self.nodes[head as usize].prev_sibling = c;
                }
                self.nodes[n as usize].first_child = c;
                self.children.insert(key(n, token), c);
                c
            }
        };
        self.nodes[c as usize].count += 1;
        let count = self.nodes[c as usize].count;
        let parent = &mut self.nodes[n as usize];
        parent.cont += 1;
        let best = parent.best;
        if best == NONE || (best != c && self.nodes[best as usize].count < count) {
            self.nodes[n as usize].best = c;
        }
        c
    }

    /// The nodes of a new sequence's suffixes (only the root: the empty
    /// one), for [`extend`](Self::extend).
    pub fn start(&self) -> Vec<u32> {
        vec![ROOT]
    }

    /// Append `token` to a sequence whose suffixes of up to `depth - 1`
    /// tokens have the nodes `active` (from [`start`](Self::start) and earlier
    /// calls); `active` becomes those of the extended sequence.
    pub fn extend(&mut self, active: &mut Vec<u32>, token: u32) {
        let mut w = 0;
        for r in 0..active.len() {
            let c = self.add(active[r], token);
            if (self.nodes[c as usize].depth as usize) < self.depth {
                active[w] = c;
                w += 1;
            }
        }
        active.truncate(w);
        active.push(ROOT);
    }

    /// Take out a sequence put in whole with [`extend`](Self::extend).
    /// Each start's path loses one occurrence; nodes left with none go.
    pub fn remove(&mut self, seq: &[u32]) {
        let mut path = Vec::with_capacity(self.depth);
        for s in 0..seq.len() {
            path.clear();
            let mut n = ROOT;
            for &t in &seq[s..(s + self.depth).min(seq.len())] {
                match self.child(n, t) {
                    Some(c) => {
                        path.push(c);
                        n = c;
                    }
                    // not put in (cannot happen for a sequence that was)
                    None => break,
                }
            }
            // deepest first: a child never counts more than its parent
            for &c in path.iter().rev() {
                self.decrement(c);
            }
        }
    }

    fn decrement(&mut self, c: u32) {
        let node = self.nodes[c as usize];
        let p = node.parent as usize;
        self.nodes[c as usize].count -= 1;
        self.nodes[p].cont -= 1;
        if node.count > 1 {
            return;
        }
        debug_assert_eq!(node.first_child, NONE, "a node went before its children");
        // unlink
        if node.prev_sibling != NONE {
            self.nodes[node.prev_sibling as usize].next_sibling = node.next_sibling;
        } else {
            self.nodes[p].first_child = node.next_sibling;
        }
        if node.next_sibling != NONE {
            self.nodes[node.next_sibling as usize].prev_sibling = node.prev_sibling;
        }
        self.children.remove(&key(node.parent, node.token));
        self.free.push(c);
        if self.nodes[p].best == c {
            self.nodes[p].best = self.best_of_children(p as u32);
        }
    }

    /// The most frequent of the first few children (a full scan could cost
    /// as much as the node has children; the best is a heuristic and the
    /// next increments restore it).
    fn best_of_children(&self, n: u32) -> u32 {
        const SCAN: usize = 16;
        let mut best = NONE;
        let mut c = self.nodes[n as usize].first_child;
        for _ in 0..SCAN {
            if c == NONE {
                break;
            }
            if best == NONE || self.nodes[c as usize].count > self.nodes[best as usize].count {
                best = c;
            }
            c = self.nodes[c as usize].next_sibling;
        }
        best
    }

    /// The deepest node for a suffix of `ctx` of at most `max_len` tokens
    /// that has a continuation, and the suffix's length; (ROOT, 0) when no
    /// suffix occurred with a continuation. Suffixes that occur are nested
    /// (a suffix of one that occurs occurs), so the longest is found by
    /// bisection; from there it backs off at most `backoff` tokens to one
    /// that was followed by something. `steps` counts node lookups.
    pub fn longest_match(&self, ctx: &[u32], max_len: usize, backoff: usize, steps: &mut usize) -> (u32, usize) {
        let hi_limit = max_len.min(ctx.len()).min(self.depth - 1);
        let at = |m: usize, steps: &mut usize| -> Option<u32> {
            *steps += m;
            self.walk(&ctx[ctx.len() - m..])
        };
        // invariant: length lo occurs, hi + 1 does not (or is beyond the limit)
        let (mut lo, mut hi) = (0usize, hi_limit);
        let mut lo_node = ROOT;
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            match at(mid, steps) {
                Some(n) => {
                    lo = mid;
                    lo_node = n;
                }
                None => hi = mid - 1,
            }
        }
        let (mut m, mut n) = (lo, lo_node);
        for _ in 0..backoff {
            if m == 0 || self.nodes[n as usize].cont > 0 {
                break;
            }
            m -= 1;
            n = match at(m, steps) {
                Some(n) => n,
                None => return (ROOT, 0),
            };
        }
        if m == 0 || self.nodes[n as usize].cont == 0 {
            return (ROOT, 0);
        }
        (n, m)
    }

    /// Check the invariants (tests): counts add up, links agree with the map.
    #[cfg(test)]
    pub fn check(&self) {
        let free: std::collections::HashSet<u32> = self.free.iter().copied().collect();
        for (i, n) in self.nodes.iter().enumerate() {
            let i = i as u32;
            if free.contains(&i) {
                continue;
            }
            let mut sum = 0;
            let mut max = 0;
            let mut c = n.first_child;
            let mut kids = 0;
            while c != NONE {
                let k = &self.nodes[c as usize];
                assert_eq!(k.parent, i);
                assert_eq!(self.child(i, k.token), Some(c));
                assert!(k.count > 0);
                sum += k.count;
                max = max.max(k.count);
                kids += 1;
                c = k.next_sibling;
            }
            assert_eq!(sum, n.cont, "node {i}");
            assert_eq!(n.best == NONE, kids == 0);
            if i != ROOT {
                assert!(n.count >= n.cont);
            }
        }
        assert_eq!(self.children.len(), self.nodes() - 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(t: &mut SuffixTree, seq: &[u32]) {
        let mut a = t.start();
        for &x in seq {
            t.extend(&mut a, x);
        }
    }

    #[test]
    fn counts_occurrences_of_substrings() {
        let mut t = SuffixTree::new(4);
        put(&mut t, &[1, 2, 3, 1, 2, 4, 1, 2, 3]);
        t.check();
        let n12 = t.walk(&[1, 2]).unwrap();
        let b = t.best(n12).unwrap();
        assert_eq!((b.token, b.count, b.of), (3, 2, 3));
        // depth limit: no substring longer than 4
        assert!(t.walk(&[1, 2, 3, 1]).is_some());
        assert!(t.walk(&[1, 2, 3, 1, 2]).is_none());
    }

    #[test]
    fn removal_restores_the_empty_tree() {
        let mut t = SuffixTree::new(5);
        let a = [5, 5, 5, 5, 5, 5, 5, 1];
        let b = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3];
        put(&mut t, &a);
        put(&mut t, &b);
        t.check();
        t.remove(&a);
        t.check();
        assert!(t.walk(&[5, 5]).is_none());
        assert!(t.walk(&[5, 6]).is_some());
        t.remove(&b);
        t.check();
        assert_eq!(t.nodes(), 1);
        // freed nodes are reused
        put(&mut t, &b);
        t.check();
        assert_eq!(t.nodes.len(), t.nodes() + t.free.len());
    }

    #[test]
    fn best_child_follows_counts() {
        let mut t = SuffixTree::new(3);
        put(&mut t, &[7, 1, 7, 2, 7, 2]);
        let n7 = t.walk(&[7]).unwrap();
        assert_eq!(t.best(n7).unwrap().token, 2);
        t.remove(&[7, 1, 7, 2, 7, 2]);
        put(&mut t, &[7, 1]);
        assert_eq!(t.best(t.walk(&[7]).unwrap()).unwrap().token, 1);
    }

    #[test]
    fn longest_match_with_a_continuation() {
        let mut t = SuffixTree::new(8);
        put(&mut t, &[1, 2, 3, 4, 9, 2, 3, 4, 5]);
        let mut steps = 0;
        // "2 3 4" occurs twice, "1 2 3 4" once, both followed
        assert_eq!(t.longest_match(&[8, 1, 2, 3, 4], 8, 2, &mut steps).1, 4);
        assert_eq!(t.longest_match(&[7, 2, 3, 4], 8, 2, &mut steps).1, 3);
        // "4 5" ends the sequence: back off to "5"? it has no continuation either
        assert_eq!(t.longest_match(&[4, 5], 8, 2, &mut steps), (ROOT, 0));
        assert_eq!(t.longest_match(&[6], 8, 2, &mut steps), (ROOT, 0));
        assert!(steps > 0);
    }
}
