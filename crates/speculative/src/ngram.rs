//! Prompt lookup: find the most recent earlier occurrence of the last n tokens
//! (longest n first) in prompt + generated text, and propose what followed it.

use std::collections::HashMap;

use crate::drafter::{Drafter, Proposal};
use crate::{Setting, SpecError};
use tandem_sampling::{Rng, SamplerParams};

pub struct NgramDrafter {
    min_n: usize,
    max_n: usize,
    max_draft: usize,
    /// The indexed history.
    seq: Vec<u32>,
    /// For each n (index n - min_n): n-gram hash → end position (exclusive) of
    /// its latest occurrence within `seq`.
    maps: Vec<HashMap<u64, usize>>,
    /// Length of the n-gram behind the last proposal (0: none).
    matched: usize,
}

fn hash(t: &[u32]) -> u64 {
    let mut h = 0xcbf29ce484222325u64;
    for &x in t {
        h = (h ^ x as u64).wrapping_mul(0x100000001b3);
    }
    h
}

impl NgramDrafter {
    /// n-grams of `min_n..=max_n` tokens; proposals of up to `max_draft` tokens.
    pub fn new(min_n: usize, max_n: usize, max_draft: usize) -> Result<Self, SpecError> {
        if min_n == 0 || max_n < min_n || max_n > 64 {
            return Err(SpecError::setting(Setting::LookupNgram, format!("{min_n}..{max_n}"), "need 1 ≤ min ≤ max ≤ 64"));
        }
        if max_draft == 0 || max_draft > crate::MAX_DRAFT {
            return Err(SpecError::setting(Setting::DraftLength, max_draft, format!("need 1..={}", crate::MAX_DRAFT)));
        }
        Ok(NgramDrafter { min_n, max_n, max_draft, seq: Vec::new(), maps: vec![HashMap::new(); max_n - min_n + 1], matched: 0 })
    }

    /// Smallest and largest n-gram matched.
    pub fn ngram_range(&self) -> (usize, usize) {
        (self.min_n, self.max_n)
    }

    /// Length of the n-gram behind the last proposal (0: it proposed nothing).
    pub fn matched(&self) -> usize {
        self.matched
    }

    fn index_from(&mut self, start: usize) {
        for end in start.max(1)..=self.seq.len() {
            for n in self.min_n..=self.max_n {
                if end >= n {
                    self.maps[n - self.min_n].insert(hash(&self.seq[end - n..end]), end);
                }
            }
        }
    }
}

impl Drafter for NgramDrafter {
    fn name(&self) -> String {
        format!("lookup(n={}..{}, k={})", self.min_n, self.max_n, self.max_draft)
    }

    fn max_draft(&self) -> usize {
        self.max_draft
    }

    fn sync(&mut self, history: &[u32]) -> Result<(), SpecError> {
        let common = self.seq.iter().zip(history).take_while(|(a, b)| a == b).count();
        if common < self.seq.len() {
            // rollback below what was indexed: rebuild (rare)
            self.seq.clear();
            self.maps.iter_mut().for_each(|m| m.clear());
            self.seq.extend_from_slice(history);
            self.index_from(1);
        } else {
            let old = self.seq.len();
            self.seq.extend_from_slice(&history[old..]);
            self.index_from(old + 1);
        }
        Ok(())
    }

    fn propose(
        &mut self,
        history: &[u32],
        next: u32,
        max: usize,
        _params: &SamplerParams,
        _rng: &mut Rng,
        out: &mut Proposal,
    ) -> Result<(), SpecError> {
        out.clear();
        self.matched = 0;
        if self.seq.as_slice() != history {
            self.sync(history)?;
        }
        let max = max.min(self.max_draft);
        if max == 0 {
            return Ok(());
        }
        let len = self.seq.len() + 1; // logical sequence: seq ++ [next]
        let at = |i: usize| if i < self.seq.len() { self.seq[i] } else { next };
        for n in (self.min_n..=self.max_n).rev() {
            if n > len {
                continue;
            }
            let tail: Vec<u32> = (len - n..len).map(at).collect();
            if let Some(&end) = self.maps[n - self.min_n].get(&hash(&tail)) {
                // guard against hash collisions
                if end < n || (0..n).any(|i| self.seq[end - n + i] != tail[i]) {
                    continue;
                }
                let mut i = end;
                while i < len && out.tokens.len() < max {
                    out.tokens.push(at(i));
                    i += 1;
                }
                if !out.tokens.is_empty() {
                    self.matched = n;
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_the_continuation_of_the_latest_match() {
        let mut d = NgramDrafter::new(1, 3, 4).unwrap();
        let hist = [1, 2, 3, 4, 5, 9, 1, 2];
        d.sync(&hist).unwrap();
        let mut out = Proposal::default();
        d.propose(&hist, 3, 4, &SamplerParams::greedy(), &mut Rng::new(0), &mut out).unwrap();
        assert_eq!(out.tokens, vec![4, 5, 9, 1]);
        // no match → nothing
        d.propose(&hist, 77, 4, &SamplerParams::greedy(), &mut Rng::new(0), &mut out).unwrap();
        assert!(out.tokens.is_empty());
    }

    #[test]
    fn rollback_reindexes() {
        let mut d = NgramDrafter::new(2, 2, 8).unwrap();
        d.sync(&[5, 6, 7, 5, 6, 8]).unwrap();
        d.sync(&[5, 6, 7, 5]).unwrap();
        let mut out = Proposal::default();
        d.propose(&[5, 6, 7, 5], 6, 8, &SamplerParams::greedy(), &mut Rng::new(0), &mut out).unwrap();
        assert_eq!(out.tokens, vec![7, 5, 6]);
    }

    #[test]
    fn bad_options() {
        assert!(NgramDrafter::new(0, 3, 4).is_err());
        assert!(NgramDrafter::new(3, 2, 4).is_err());
        assert!(NgramDrafter::new(1, 3, 0).is_err());
        assert!(NgramDrafter::new(1, 3, 1000).is_err());
    }
}
