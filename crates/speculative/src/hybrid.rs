//! Prompt lookup in front of a model drafter (`--mtp FILE --lookup`).
//!
//! A small head predicts well where the text is new and badly where it
//! repeats: a summary that copies the source sentence, a list that runs on in
//! a loop, a digit run. N-gram lookup is the reverse: it is free, proposes
//! many tokens at once, and is right almost exactly where the context
//! repeats. So each cycle the lookup gets the first word, as a free
//! proposal ([`Drafter::propose_free`]): when the last `min_n` or more tokens
//! occurred before, its continuation is offered, and the speculator takes it
//! where it beats what the model drafter is expected to give; otherwise the
//! scheduler decides whether the model drafter proposes, as it would alone.
//! Which source proposes depends only on the committed history, never on
//! drafted tokens or random draws, so truncation stays lossless.
//!
//! The lookup has no confidence of its own. It reports, per draft position,
//! the acceptance its own verified proposals had there (decayed counts), and
//! the scheduler verifies as much of the proposal as those pay for.

use tandem_model::HiddenTap;

use crate::cycle::CycleRecord;
use crate::drafter::{Drafter, Proposal};
use crate::ngram::NgramDrafter;
use crate::SpecError;
use tandem_sampling::{Rng, SamplerParams};

/// Decay of the lookup's counts per lookup proposal, verified or declined:
/// the estimate of a match length the scheduler keeps declining drifts back
/// towards the prior, so it gets verified (re-tested) again now and then.
const DECAY: f64 = 0.98;
/// Pseudo-count of the prior: a coin flip at the first position, and the
/// estimate of the position before at the others (a lookup that got this far
/// is usually inside a repeat).
const PRIOR_N: f64 = 2.0;

/// Which source made the last proposal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    None,
    Lookup,
    Model,
}

pub struct HybridDrafter {
    lookup: NgramDrafter,
    model: Box<dyn Drafter>,
    last: Source,
    /// Decayed counts of lookup drafts reached (all earlier ones accepted)
    /// and accepted, per matched n-gram length (from the lookup's smallest)
    /// and draft position: longer matches repeat more reliably.
    reached: Vec<Vec<f64>>,
    hits: Vec<Vec<f64>>,
    /// Matched n-gram length of the last lookup proposal.
    matched: usize,
    /// Proposals by source (for the name and tests).
    pub lookup_proposals: u64,
    pub model_proposals: u64,
}

impl HybridDrafter {
    pub fn new(lookup: NgramDrafter, model: Box<dyn Drafter>) -> Self {
        let n = lookup.max_draft();
        let (lo, hi) = lookup.ngram_range();
        HybridDrafter {
            lookup,
            model,
            last: Source::None,
            reached: vec![vec![0.0; n]; hi - lo + 1],
            hits: vec![vec![0.0; n]; hi - lo + 1],
            matched: 0,
            lookup_proposals: 0,
            model_proposals: 0,
        }
    }

    /// Estimated acceptance of each lookup draft position, given the ones
    /// before, after a match of bucket `m` (matched length − smallest): each
    /// position's counts, shrunk towards the estimate of the one before.
    fn lookup_confidences(&self, m: usize) -> impl Iterator<Item = f32> + '_ {
        self.hits[m].iter().zip(&self.reached[m]).scan(0.5f64, |prior, (h, r)| {
            *prior = (h + PRIOR_N * *prior) / (r + PRIOR_N);
            Some(*prior as f32)
        })
    }

    #[cfg(test)]
    fn lookup_confidence(&self, m: usize, i: usize) -> f32 {
        self.lookup_confidences(m).nth(i).unwrap()
    }
}

impl Drafter for HybridDrafter {
    fn name(&self) -> String {
        format!("{} before {}", self.lookup.name(), self.model.name())
    }

    fn max_draft(&self) -> usize {
        self.lookup.max_draft().max(self.model.max_draft())
    }

    fn sync(&mut self, history: &[u32]) -> Result<(), SpecError> {
        self.lookup.sync(history)?;
        self.model.sync(history)
    }

    fn propose(
        &mut self,
        history: &[u32],
        next: u32,
        max: usize,
        params: &SamplerParams,
        rng: &mut Rng,
        out: &mut Proposal,
    ) -> Result<(), SpecError> {
        self.propose_until(history, next, max, params, rng, out, &|_| true)
    }

    fn propose_until(
        &mut self,
        history: &[u32],
        next: u32,
        max: usize,
        params: &SamplerParams,
        rng: &mut Rng,
        out: &mut Proposal,
        more: &dyn Fn(&[f32]) -> bool,
    ) -> Result<(), SpecError> {
        self.model.propose_until(history, next, max, params, rng, out, more)?;
        self.last = if out.tokens.is_empty() { Source::None } else { Source::Model };
        if self.last == Source::Model {
            self.model_proposals += 1;
        }
        Ok(())
    }

    fn propose_free(&mut self, history: &[u32], next: u32, max: usize, out: &mut Proposal) -> Result<bool, SpecError> {
        self.lookup.propose(history, next, max, &SamplerParams::greedy(), &mut Rng::new(0), out)?;
        if out.tokens.is_empty() {
            return Ok(false);
        }
        self.matched = self.lookup.matched() - self.lookup.ngram_range().0;
        self.reached[self.matched].iter_mut().for_each(|v| *v *= DECAY);
        self.hits[self.matched].iter_mut().for_each(|v| *v *= DECAY);
        out.confidence.clear();
        out.confidence.extend(self.lookup_confidences(self.matched).take(out.tokens.len()));
        self.last = Source::Lookup;
        self.lookup_proposals += 1;
        Ok(true)
    }

    fn feedback(&mut self, cycle: &CycleRecord) {
        let (proposed, accepted) = (cycle.plan.verify, cycle.verification.accepted);
        match std::mem::replace(&mut self.last, Source::None) {
            Source::Lookup => {
                let (reached, hits) = (&mut self.reached[self.matched], &mut self.hits[self.matched]);
                for i in 0..proposed.min(reached.len()) {
                    reached[i] += 1.0;
                    if i >= accepted {
                        break;
                    }
                    hits[i] += 1.0;
                }
            }
            Source::Model => self.model.feedback(cycle),
            Source::None => {}
        }
    }

    fn fixed_cost(&self) -> bool {
        self.model.fixed_cost()
    }

    fn taps(&self) -> Vec<HiddenTap> {
        self.model.taps()
    }

    fn observe(&mut self, start: usize, rows: usize, hidden: &[&[f32]]) {
        self.model.observe(start, rows, hidden)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Proposes `[7]` with confidence 0.9.
    struct Fixed;

    impl Drafter for Fixed {
        fn name(&self) -> String {
            "fixed".into()
        }
        fn max_draft(&self) -> usize {
            1
        }
        fn sync(&mut self, _history: &[u32]) -> Result<(), SpecError> {
            Ok(())
        }
        fn propose(
            &mut self,
            _h: &[u32],
            _n: u32,
            max: usize,
            _p: &SamplerParams,
            _r: &mut Rng,
            out: &mut Proposal,
        ) -> Result<(), SpecError> {
            out.clear();
            if max > 0 {
                out.tokens.push(7);
                out.confidence.push(0.9);
            }
            Ok(())
        }
    }

    /// A cycle that verified `k` drafts and accepted `a` of them.
    fn verified(k: usize, a: usize) -> CycleRecord {
        let mut c = CycleRecord::default();
        c.plan.verify = k;
        c.verification.accepted = a;
        c
    }

    #[test]
    fn lookup_first_then_model() {
        let model = Box::new(Fixed);
        let mut h = HybridDrafter::new(NgramDrafter::new(2, 4, 6).unwrap(), model);
        let hist = [1, 2, 3, 4, 5, 1];
        h.sync(&hist).unwrap();
        let (p, mut rng, mut out) = (SamplerParams::greedy(), Rng::new(0), Proposal::default());
        // "1 2" occurred before: the lookup proposes what followed, with the prior confidence
        assert!(h.propose_free(&hist, 2, 6, &mut out).unwrap());
        assert_eq!(out.tokens, vec![3, 4, 5, 1, 2]);
        assert_eq!(out.confidence, vec![0.5; 5]);
        h.feedback(&verified(5, 2));
        // matched "1 2": bucket 0 (n = 2); position 2 was reached and missed
        let c: Vec<f32> = (0..4).map(|i| h.lookup_confidence(0, i)).collect();
        assert!(c[0] > 0.5 && c[1] > c[0] && c[2] < c[1], "{c:?}");
        // unreached positions inherit the estimate before them
        assert_eq!(c[3], c[2]);
        assert_eq!(h.lookup_confidence(1, 0), 0.5);
        // "1 9" did not: nothing free, the model drafter proposes
        assert!(!h.propose_free(&hist, 9, 6, &mut out).unwrap());
        assert!(out.tokens.is_empty());
        h.propose(&hist, 9, 6, &p, &mut rng, &mut out).unwrap();
        assert_eq!(out.tokens, vec![7]);
        assert_eq!(out.confidence, vec![0.9]);
        h.feedback(&verified(1, 1));
        assert_eq!((h.lookup_proposals, h.model_proposals), (1, 1));
    }
}
