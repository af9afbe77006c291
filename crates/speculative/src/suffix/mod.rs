//! Suffix speculation: a model-free drafter that remembers across requests.
//!
//! Agents and coding assistants send the same material again and again (a
//! file, the file with one change, a log that repeats lines) and the model's
//! answers repeat what it wrote before, in this conversation and in others.
//! Prompt lookup only searches the current text, and proposes whatever
//! followed the latest occurrence. The suffix drafter (after SuffixDecoding,
//! Oliaro et al. 2024) keeps two suffix trees with counts:
//!
//! - a local one over the prompt of the current generation;
//! - a global one over recent outputs, the current one included as it is
//!   written, shared by every drafter built on the same [`SuffixCache`] (all
//!   requests of a server; runs of the CLI with `--suffix-cache FILE`), and
//!   bounded in tokens with the oldest outputs evicted first.
//!
//! Each cycle it matches the longest recent suffix of the context in each
//! tree, walks down the most frequent continuation while the path's
//! empirical probability stays above a floor, and keeps the tree whose path
//! promises more accepted tokens. It is a free source
//! ([`FreeSource`](crate::hybrid::FreeSource)): the
//! [`HybridDrafter`](crate::HybridDrafter) calibrates its per-token
//! probabilities into acceptance estimates and the scheduler verifies as
//! much as they pay for, alone or in front of a model drafter.
//!
//! The cost of a proposal is bounded whatever the input: a match is a
//! bisection over at most `max_match` tokens per tree, each drafted token one
//! lookup (a re-anchoring bisection every `depth - max_match` tokens), and no
//! step iterates over a node's children. [`SuffixDrafter::last_steps`]
//! counts the lookups so tests can hold it to [`SuffixDrafter::step_bound`].

pub mod cache;
pub mod tree;

pub use cache::{SuffixCache, SuffixCacheError, VocabId};
pub use tree::SuffixTree;

use crate::hybrid::{FreeDraft, FreeSource};
use crate::{Setting, SpecError};
#[cfg(test)]
use tree::ROOT;

/// How the suffix drafter matches and drafts.
#[derive(Debug, Clone, PartialEq)]
pub struct SuffixOptions {
    /// Most tokens proposed per cycle.
    pub max_draft: usize,
    /// Longest context suffix matched (the rest of the tree's depth is what
    /// one match can draft before it re-anchors).
    pub max_match: usize,
    /// Drafting stops where the path's empirical probability falls below this.
    pub min_prob: f32,
}

/// Default tree depth (longest substring counted).
pub const DEFAULT_DEPTH: usize = 40;
/// Default bound of the global cache, in tokens of stored outputs.
pub const DEFAULT_CACHE_TOKENS: usize = 1 << 15;
/// Default proposal length.
pub const DEFAULT_DRAFT: usize = 16;

impl Default for SuffixOptions {
    fn default() -> Self {
        SuffixOptions { max_draft: DEFAULT_DRAFT, max_match: 20, min_prob: 0.1 }
    }
}

/// Prior acceptance of a proposal's first token by match length (1..=16
/// in four steps), before anything was verified.
const MATCH_PRIOR: [f32; 4] = [0.5, 0.6, 0.7, 0.8];

/// Re-anchorings per walk (each is a bisection): a path that keeps ending
/// (a node never followed by anything) stops the walk instead.
const MAX_ANCHORS: usize = 4;

/// Shorter matches tried when the longest one was never followed by anything.
const BACKOFF: usize = 4;

/// Calibration cells: which tree, match length, the token's conditional
/// probability, the evidence behind it, and its position in the proposal.
const TREES: usize = 2;
const MATCH_BUCKETS: usize = 5;
const PROB_BUCKETS: usize = 4;
const EVIDENCE_BUCKETS: usize = 3;
const POS_BUCKETS: usize = 4;
const KEYS: usize = TREES * MATCH_BUCKETS * PROB_BUCKETS * EVIDENCE_BUCKETS * POS_BUCKETS;

fn cell(tree: usize, matched: usize, count: u32, of: u32, pos: usize) -> u32 {
    let m = match matched {
        0..=1 => 0,
        2..=3 => 1,
        4..=7 => 2,
        8..=15 => 3,
        _ => 4,
    };
    let q = count as f32 / of.max(1) as f32;
    let p = if count == of {
        3
    } else if q >= 0.8 {
        2
    } else if q >= 0.5 {
        1
    } else {
        0
    };
    let e = match of {
        0..=1 => 0,
        2..=3 => 1,
        _ => 2,
    };
    let s = match pos {
        0 => 0,
        1..=3 => 1,
        4..=9 => 2,
        _ => 3,
    };
    ((((tree * MATCH_BUCKETS + m) * PROB_BUCKETS + p) * EVIDENCE_BUCKETS + e) * POS_BUCKETS + s) as u32
}

/// A walk's proposal from one tree.
#[derive(Debug, Default, Clone)]
struct Walk {
    tokens: Vec<u32>,
    keys: Vec<u32>,
    priors: Vec<f32>,
    /// Expected accepted tokens under the path's probabilities.
    score: f64,
    matched: usize,
}

/// Draft from `tree` after `ctx` (the context's tail, at least `max_match`
/// tokens when it has them).
fn walk(t: &SuffixTree, which: usize, ctx: &[u32], o: &SuffixOptions, max: usize, steps: &mut usize, w: &mut Walk) {
    w.tokens.clear();
    w.keys.clear();
    w.priors.clear();
    w.score = 0.0;
    let (mut node, matched) = t.longest_match(ctx, o.max_match, BACKOFF, steps);
    w.matched = matched;
    if matched == 0 {
        return;
    }
    let mut m = matched;
    let mut path = 1.0f64;
    let mut tail: Vec<u32> = Vec::new();
    let mut anchors = 0;
    while w.tokens.len() < max {
        if t.node_depth(node) >= t.depth() || t.best(node).is_none() {
            anchors += 1;
            if anchors > MAX_ANCHORS {
                break;
            }
            // the tree ends here: match again on the context and the draft
            tail.clear();
            tail.extend_from_slice(&ctx[ctx.len().saturating_sub(o.max_match)..]);
            tail.extend_from_slice(&w.tokens);
            let (n, mm) = t.longest_match(&tail, o.max_match, BACKOFF, steps);
            if mm == 0 {
                break;
            }
            (node, m) = (n, mm);
        }
        let Some(c) = t.best(node) else { break };
        *steps += 1;
        let q = c.count as f64 / c.of.max(1) as f64;
        path *= q;
        if path < o.min_prob as f64 {
            break;
        }
        w.keys.push(cell(which, m, c.count, c.of, w.tokens.len()));
        // relative to the token before; the first token's is a coin flip
        // made likelier by a long match
        let first = if w.tokens.is_empty() { MATCH_PRIOR[(m.min(16) * MATCH_PRIOR.len() / 17).min(MATCH_PRIOR.len() - 1)] } else { 1.0 };
        w.priors.push(first * q as f32);
        w.tokens.push(c.token);
        w.score += path;
        node = c.node;
    }
}

/// The suffix drafter of one generation stream (a session, a server slot).
pub struct SuffixDrafter {
    opts: SuffixOptions,
    cache: SuffixCache,
    /// The tree over the prompt, the tokens in it and its open suffixes.
    local: SuffixTree,
    local_seq: Vec<u32>,
    local_active: Vec<u32>,
    /// This generation's output in the global cache (None until it has a token).
    live: Option<u64>,
    /// History length when the generation began.
    prompt_len: usize,
    /// History length already taken in.
    synced: usize,
    /// Node lookups of the last proposal.
    steps: usize,
    ctx: Vec<u32>,
    walks: [Walk; TREES],
}

impl SuffixDrafter {
    /// A drafter over the shared `cache` (whose depth the local tree takes too).
    pub fn new(cache: SuffixCache, opts: SuffixOptions) -> Result<Self, SpecError> {
        if opts.max_draft == 0 || opts.max_draft > crate::MAX_DRAFT {
            return Err(SpecError::setting(Setting::DraftLength, opts.max_draft, format!("need 1..={}", crate::MAX_DRAFT)));
        }
        let depth = cache.depth();
        if opts.max_match == 0 || opts.max_match >= depth {
            return Err(SpecError::setting(Setting::SuffixMatch, opts.max_match, format!("need 1..{depth} (below the tree depth)")));
        }
        if !(opts.min_prob > 0.0 && opts.min_prob <= 1.0) {
            return Err(SpecError::setting(Setting::SuffixMinProb, opts.min_prob, "need a probability in (0, 1]"));
        }
        let local = SuffixTree::new(depth);
        let local_active = local.start();
        Ok(SuffixDrafter {
            opts,
            cache,
            local,
            local_seq: Vec::new(),
            local_active,
            live: None,
            prompt_len: 0,
            synced: 0,
            steps: 0,
            ctx: Vec::new(),
            walks: Default::default(),
        })
    }

    /// The global cache this drafter adds its outputs to.
    pub fn cache(&self) -> &SuffixCache {
        &self.cache
    }

    /// Node lookups the last proposal made.
    pub fn last_steps(&self) -> usize {
        self.steps
    }

    /// Most node lookups a proposal of up to `max` tokens can make,
    /// whatever the trees hold: per tree a bisection and a back-off for the
    /// first match and for each re-anchoring, one lookup per drafted token.
    pub fn step_bound(&self, max: usize) -> usize {
        let m = self.opts.max_match;
        let one_match = m * ((usize::BITS - m.leading_zeros()) as usize + 1) + BACKOFF * m;
        TREES * ((1 + MAX_ANCHORS) * one_match + max.min(self.opts.max_draft))
    }

    fn reset_local(&mut self, history: &[u32]) {
        if history.starts_with(&self.local_seq) {
            for &t in &history[self.local_seq.len()..] {
                self.local.extend(&mut self.local_active, t);
            }
        } else {
            self.local = SuffixTree::new(self.cache.depth());
            self.local_active = self.local.start();
            for &t in history {
                self.local.extend(&mut self.local_active, t);
            }
            self.local_seq.clear();
        }
        self.local_seq.extend_from_slice(&history[self.local_seq.len()..]);
    }
}

impl FreeSource for SuffixDrafter {
    fn name(&self) -> String {
        format!("suffix(k={}, cache={} tokens)", self.opts.max_draft, self.cache.capacity())
    }

    fn max_draft(&self) -> usize {
        self.opts.max_draft
    }

    fn keys(&self) -> usize {
        KEYS
    }

    fn begin(&mut self, history: &[u32]) -> Result<(), SpecError> {
        // the last output stays in the cache as it is
        self.live = None;
        self.reset_local(history);
        self.prompt_len = history.len();
        self.synced = history.len();
        Ok(())
    }

    fn sync(&mut self, history: &[u32]) -> Result<(), SpecError> {
        if history.len() < self.synced {
            // a rollback: what is left is the prompt of what follows
            return self.begin(history);
        }
        let new = &history[self.synced.max(self.prompt_len)..];
        if !new.is_empty() {
            self.live = Some(self.cache.append(self.live, new));
        }
        self.synced = history.len();
        Ok(())
    }

    fn propose(&mut self, history: &[u32], next: u32, max: usize, out: &mut FreeDraft) -> Result<(), SpecError> {
        out.clear();
        self.steps = 0;
        let max = max.min(self.opts.max_draft);
        if max == 0 {
            return Ok(());
        }
        if history.len() != self.synced {
            self.sync(history)?;
        }
        self.ctx.clear();
        self.ctx.extend_from_slice(&history[history.len().saturating_sub(self.opts.max_match)..]);
        self.ctx.push(next);
        let [a, b] = &mut self.walks;
        walk(&self.local, 0, &self.ctx, &self.opts, max, &mut self.steps, a);
        self.cache.with_tree(|t| walk(t, 1, &self.ctx, &self.opts, max, &mut self.steps, b));
        let w = if (b.score, b.matched) > (a.score, a.matched) { b } else { a };
        out.tokens.extend_from_slice(&w.tokens);
        out.keys.extend_from_slice(&w.keys);
        out.priors.extend_from_slice(&w.priors);
        Ok(())
    }
}

/// Is the local tree's root still the root (for tests of rebuilding)?
#[cfg(test)]
fn local_root_ok(d: &SuffixDrafter) -> bool {
    d.local.nodes() >= 1 && d.local.best(ROOT).is_some() != d.local_seq.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drafter(cap: usize) -> SuffixDrafter {
        SuffixDrafter::new(SuffixCache::new(cap, 16), SuffixOptions { max_draft: 8, max_match: 8, min_prob: 0.1 }).unwrap()
    }

    fn propose(d: &mut SuffixDrafter, h: &[u32], next: u32) -> Vec<u32> {
        let mut out = FreeDraft::default();
        d.propose(h, next, 8, &mut out).unwrap();
        assert!(d.last_steps() <= d.step_bound(8));
        assert_eq!(out.keys.len(), out.tokens.len());
        out.tokens
    }

    #[test]
    fn drafts_from_the_prompt() {
        let mut d = drafter(1000);
        let prompt = [1, 2, 3, 4, 5, 6, 7, 9, 9, 9, 1, 2];
        d.begin(&prompt).unwrap();
        assert!(local_root_ok(&d));
        assert_eq!(propose(&mut d, &prompt, 3), vec![4, 5, 6, 7, 9, 9, 9, 1]);
        assert!(propose(&mut d, &prompt, 42).is_empty());
    }

    #[test]
    fn remembers_outputs_across_generations() {
        let cache = SuffixCache::new(1000, 16);
        let o = SuffixOptions { max_draft: 8, max_match: 8, min_prob: 0.1 };
        let mut a = SuffixDrafter::new(cache.clone(), o.clone()).unwrap();
        a.begin(&[100, 101]).unwrap();
        a.sync(&[100, 101, 20, 21, 22, 23, 24, 25]).unwrap();
        // another drafter on the same cache, another prompt: the output is there
        let mut b = SuffixDrafter::new(cache.clone(), o).unwrap();
        b.begin(&[7, 8, 20]).unwrap();
        assert_eq!(propose(&mut b, &[7, 8, 20], 21), vec![22, 23, 24, 25]);
        // and the current output is searched as it grows
        let h = [7, 8, 20, 21, 30, 31, 32, 33, 30];
        b.sync(&h).unwrap();
        assert_eq!(propose(&mut b, &h, 31), vec![32, 33, 30, 31, 32, 33, 30, 31]);
        assert_eq!(cache.sequences(), 2);
    }

    #[test]
    fn prefers_the_frequent_continuation() {
        let mut d = drafter(1000);
        let prompt = [5, 1, 5, 2, 5, 2, 5, 2, 8];
        d.begin(&prompt).unwrap();
        assert_eq!(propose(&mut d, &prompt, 5)[0], 2);
    }

    #[test]
    fn rollback_takes_the_new_history_as_prompt() {
        let mut d = drafter(1000);
        d.begin(&[1, 2, 3]).unwrap();
        d.sync(&[1, 2, 3, 4, 5, 6]).unwrap();
        d.sync(&[9, 9]).unwrap();
        assert!(local_root_ok(&d));
        assert_eq!(d.local_seq, vec![9, 9]);
        assert_eq!(propose(&mut d, &[9, 9], 4), vec![5, 6]);
    }

    /// Inputs built to make a proposal expensive: a run of one token (the
    /// deepest paths, every suffix matches), one token followed by thousands
    /// of others (a node with thousands of children), sequences that end
    /// right after every match (re-anchoring), and a cache full of them.
    #[test]
    fn hostile_inputs_cannot_make_a_proposal_expensive() {
        let cache = SuffixCache::new(20_000, DEFAULT_DEPTH);
        let o = SuffixOptions::default();
        let mut d = SuffixDrafter::new(cache.clone(), o.clone()).unwrap();
        let bound = d.step_bound(o.max_draft);
        assert!(bound < 3000, "bound {bound}");
        let run: Vec<u32> = vec![7; 4000];
        let fan: Vec<u32> = (0..8000u32).flat_map(|i| [1, 100 + i]).collect();
        let ends: Vec<Vec<u32>> = (0..500u32).map(|i| vec![3, 4, 5, i % 7]).collect();
        for e in &ends {
            cache.append(None, e);
        }
        cache.append(None, &run[..3000]);
        let mut worst = 0;
        for prompt in [&run, &fan, &ends.concat()] {
            d.begin(prompt).unwrap();
            for next in [7, 1, 3, 4, 5, 100, 9999] {
                let mut out = FreeDraft::default();
                d.propose(prompt, next, o.max_draft, &mut out).unwrap();
                worst = worst.max(d.last_steps());
                assert!(d.last_steps() <= bound, "{} lookups > bound {bound}", d.last_steps());
            }
        }
        // the run drafts at full length
        d.begin(&run).unwrap();
        assert_eq!(propose(&mut d, &run, 7).len(), 8);
        assert!(worst > 0);
    }

    #[test]
    fn bad_options() {
        let c = SuffixCache::new(100, 16);
        let o = SuffixOptions::default();
        assert!(SuffixDrafter::new(c.clone(), SuffixOptions { max_draft: 0, ..o.clone() }).is_err());
        assert!(SuffixDrafter::new(c.clone(), SuffixOptions { max_match: 16, ..o.clone() }).is_err());
        assert!(SuffixDrafter::new(c.clone(), SuffixOptions { min_prob: 0.0, ..o.clone() }).is_err());
        assert!(SuffixDrafter::new(c, SuffixOptions { min_prob: f32::NAN, ..o }).is_err());
    }
}
