//! A free source (prompt lookup, suffix speculation) in front of a model
//! drafter, or alone.
//!
//! A small head predicts well where the text is new and badly where it
//! repeats: a summary that copies the source sentence, a list that runs on in
//! a loop, a digit run, a file resent with one change. Lookup and suffix
//! trees are the reverse: they are free, propose many tokens at once, and are
//! right almost exactly where the context repeats. So each cycle the free
//! source gets the first word, as a free proposal
//! ([`Drafter::propose_free`]): when the text before has occurred, its
//! continuation is offered, and the speculator takes it where it beats what
//! the model drafter is expected to give (or, with no model drafter, a plain
//! step); otherwise the scheduler decides whether the model drafter
//! proposes, as it would alone. Which source proposes depends only on the
//! committed history (and, for a shared suffix cache, on other generations'
//! committed outputs), never on drafted tokens or random draws, so
//! truncation stays lossless.
//!
//! A free source names, per proposed token, a calibration cell (for lookup:
//! the matched n-gram length and the position; for suffix trees: the tree,
//! match length, the token's empirical probability and its evidence, and
//! the position) and a prior relative to the token before. The hybrid
//! reports as confidence the acceptance measured in that cell (decayed
//! counts, shrunk towards the estimate of the token before times the
//! prior), and the scheduler verifies as much of the proposal as those pay
//! for.

use tandem_model::HiddenTap;

use crate::cycle::CycleRecord;
use crate::drafter::{Drafter, Proposal};
use crate::SpecError;
use tandem_sampling::{Rng, SamplerParams};

/// Decay of a cell's counts each time a proposal uses it, verified or
/// declined: the estimate of a cell the scheduler keeps declining drifts
/// back towards the prior, so it gets verified (re-tested) again now and then.
const DECAY: f64 = 0.98;
/// Pseudo-count of the prior: for lookup a coin flip at the first
/// position, and the estimate of the position before at the others (a
/// lookup that got this far is usually inside a repeat).
const PRIOR_N: f64 = 2.0;

/// Decay per verified free proposal of the recent predicted and observed
/// acceptance behind [`HybridDrafter`]'s scale: about the last 20 proposals.
const RECENT_DECAY: f64 = 0.95;
/// Pseudo-count (in tokens) of the scale's prior of 1.
const RECENT_N: f64 = 4.0;

/// A free source's proposal: tokens, each with its calibration cell and
/// optionally a prior acceptance.
#[derive(Debug, Clone, Default)]
pub struct FreeDraft {
    pub tokens: Vec<u32>,
    /// Calibration cell of each token (below [`FreeSource::keys`]).
    pub keys: Vec<u32>,
    /// Prior acceptance of each token relative to the estimate of the
    /// token before (the first's is absolute): 1 says "as likely as the
    /// one before", so positions that have not been verified yet inherit
    /// what the ones before them have shown.
    pub priors: Vec<f32>,
}

impl FreeDraft {
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.keys.clear();
        self.priors.clear();
    }
}

/// A drafter that costs next to nothing and proposes only where the text
/// before has occurred (prompt lookup, suffix trees).
pub trait FreeSource: Send {
    fn name(&self) -> String;

    /// Largest proposal.
    fn max_draft(&self) -> usize;

    /// Number of calibration cells its proposals name.
    fn keys(&self) -> usize;

    /// A generation starts after `history` (its prompt).
    fn begin(&mut self, history: &[u32]) -> Result<(), SpecError> {
        self.sync(history)
    }

    /// The committed history is now exactly `history`.
    fn sync(&mut self, history: &[u32]) -> Result<(), SpecError>;

    /// Propose up to `max` tokens after `history ++ [next]` (nothing when
    /// the text before has not occurred).
    fn propose(&mut self, history: &[u32], next: u32, max: usize, out: &mut FreeDraft) -> Result<(), SpecError>;
}

/// Which source made the last proposal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    None,
    Free,
    Model,
}

pub struct HybridDrafter {
    free: Box<dyn FreeSource>,
    model: Option<Box<dyn Drafter>>,
    last: Source,
    /// Decayed counts of free drafts reached (all earlier ones accepted)
    /// and accepted, per calibration cell.
    reached: Vec<f64>,
    hits: Vec<f64>,
    /// The last free proposal and the confidences reported for it.
    draft: FreeDraft,
    reported: Vec<f32>,
    /// Decayed sums over recent verified free drafts (reached ones): the
    /// confidences reported and the acceptances seen. Their ratio scales
    /// what the cells say, so a generation whose text repeats less than the
    /// cells learned elsewhere (a log after code edits) is priced by what
    /// it shows now, within a few proposals.
    recent_pred: f64,
    recent_seen: f64,
    /// Proposals by source (for the name and tests).
    pub free_proposals: u64,
    pub model_proposals: u64,
}

impl HybridDrafter {
    /// `free` in front of `model`; with no model, the free source alone.
    pub fn new(free: Box<dyn FreeSource>, model: Option<Box<dyn Drafter>>) -> Self {
        let n = free.keys();
        HybridDrafter {
            free,
            model,
            last: Source::None,
            reached: vec![0.0; n],
            hits: vec![0.0; n],
            draft: FreeDraft::default(),
            reported: Vec::new(),
            recent_pred: 0.0,
            recent_seen: 0.0,
            free_proposals: 0,
            model_proposals: 0,
        }
    }

    /// Estimated acceptance of each token of `d`, given the ones before:
    /// the cell's decayed counts, shrunk towards the prior (the estimate of
    /// the token before times the token's relative prior), times the
    /// recent scale.
    fn confidences<'a>(&'a self, d: &'a FreeDraft) -> impl Iterator<Item = f32> + 'a {
        let scale = self.recent_scale();
        self.cell_estimates(d).map(move |c| (c * scale).min(1.0) as f32)
    }

    /// What the cells say of each token of `d`, given the ones before.
    fn cell_estimates<'a>(&'a self, d: &'a FreeDraft) -> impl Iterator<Item = f64> + 'a {
        d.keys.iter().zip(&d.priors).scan(1.0f64, move |before, (&k, &rel)| {
            let prior = *before * rel.clamp(0.0, 1.0) as f64;
            let k = k as usize;
            *before = (self.hits[k] + PRIOR_N * prior) / (self.reached[k] + PRIOR_N);
            Some(*before)
        })
    }

    /// Recent acceptance seen over recent acceptance reported (1 until
    /// there is evidence).
    fn recent_scale(&self) -> f64 {
        (self.recent_seen + RECENT_N) / (self.recent_pred + RECENT_N)
    }
}

impl Drafter for HybridDrafter {
    fn name(&self) -> String {
        match &self.model {
            Some(m) => format!("{} before {}", self.free.name(), m.name()),
            None => self.free.name(),
        }
    }

    fn max_draft(&self) -> usize {
        self.free.max_draft().max(self.model.as_ref().map_or(0, |m| m.max_draft()))
    }

    fn proposes(&self) -> bool {
        self.model.is_some()
    }

    fn begin(&mut self, history: &[u32]) -> Result<(), SpecError> {
        self.free.begin(history)?;
        self.model.as_mut().map_or(Ok(()), |m| m.begin(history))
    }

    fn sync(&mut self, history: &[u32]) -> Result<(), SpecError> {
        self.free.sync(history)?;
        self.model.as_mut().map_or(Ok(()), |m| m.sync(history))
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
        let Some(model) = self.model.as_mut() else {
            out.clear();
            return Ok(());
        };
        model.propose_until(history, next, max, params, rng, out, more)?;
        self.last = if out.tokens.is_empty() { Source::None } else { Source::Model };
        if self.last == Source::Model {
            self.model_proposals += 1;
        }
        Ok(())
    }

    fn propose_free(&mut self, history: &[u32], next: u32, max: usize, out: &mut Proposal) -> Result<bool, SpecError> {
        out.clear();
        let mut d = std::mem::take(&mut self.draft);
        self.free.propose(history, next, max, &mut d)?;
        let offered = !d.tokens.is_empty();
        if offered {
            for &k in &d.keys {
                self.reached[k as usize] *= DECAY;
                self.hits[k as usize] *= DECAY;
            }
            out.tokens.extend_from_slice(&d.tokens);
            out.confidence.extend(self.confidences(&d));
            self.reported.clear();
            self.reported.extend_from_slice(&out.confidence);
            self.last = Source::Free;
            self.free_proposals += 1;
        }
        self.draft = d;
        Ok(offered)
    }

    fn feedback(&mut self, cycle: &CycleRecord) {
        let (proposed, accepted) = (cycle.plan.verify, cycle.verification.accepted);
        match std::mem::replace(&mut self.last, Source::None) {
            Source::Free => {
                if proposed > 0 {
                    self.recent_pred *= RECENT_DECAY;
                    self.recent_seen *= RECENT_DECAY;
                    // the drafts that were reached: all accepted ones and the first miss
                    let reached = proposed.min(accepted + 1).min(self.reported.len());
                    self.recent_pred += self.reported[..reached].iter().map(|&c| c as f64).sum::<f64>();
                    self.recent_seen += accepted.min(reached) as f64;
                }
                for (i, &k) in self.draft.keys.iter().take(proposed).enumerate() {
                    self.reached[k as usize] += 1.0;
                    if i >= accepted {
                        break;
                    }
                    self.hits[k as usize] += 1.0;
                }
            }
            Source::Model => {
                if let Some(m) = self.model.as_mut() {
                    m.feedback(cycle)
                }
            }
            Source::None => {}
        }
    }

    fn fixed_cost(&self) -> bool {
        self.model.as_ref().is_some_and(|m| m.fixed_cost())
    }

    fn taps(&self) -> Vec<HiddenTap> {
        self.model.as_ref().map_or_else(Vec::new, |m| m.taps())
    }

    fn observe(&mut self, start: usize, rows: usize, hidden: &[&[f32]]) {
        if let Some(m) = self.model.as_mut() {
            m.observe(start, rows, hidden)
        }
    }
}

/// In front of a model drafter: a proposal's calibration cells are the
/// matched n-gram length and the position.
impl FreeSource for crate::NgramDrafter {
    fn name(&self) -> String {
        Drafter::name(self)
    }

    fn max_draft(&self) -> usize {
        Drafter::max_draft(self)
    }

    fn keys(&self) -> usize {
        let (lo, hi) = self.ngram_range();
        (hi - lo + 1) * Drafter::max_draft(self)
    }

    fn sync(&mut self, history: &[u32]) -> Result<(), SpecError> {
        Drafter::sync(self, history)
    }

    fn propose(&mut self, history: &[u32], next: u32, max: usize, out: &mut FreeDraft) -> Result<(), SpecError> {
        let mut p = Proposal::default();
        Drafter::propose(self, history, next, max, &SamplerParams::greedy(), &mut Rng::new(0), &mut p)?;
        out.clear();
        let lo = self.ngram_range().0;
        let row = (self.matched().max(lo) - lo) * Drafter::max_draft(self);
        out.keys.extend((0..p.tokens.len()).map(|i| (row + i) as u32));
        out.priors.extend((0..p.tokens.len()).map(|i| if i == 0 { 0.5 } else { 1.0 }));
        out.tokens = p.tokens;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NgramDrafter;

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

    /// The estimate of lookup position `i` after a match of bucket `m`
    /// (proposals of up to 6 tokens).
    fn lookup_confidence(h: &HybridDrafter, m: usize, i: usize) -> f32 {
        let priors = (0..=i).map(|j| if j == 0 { 0.5 } else { 1.0 }).collect();
        let d = FreeDraft { tokens: vec![0; i + 1], keys: (0..=i).map(|j| (m * 6 + j) as u32).collect(), priors };
        let c = h.cell_estimates(&d).nth(i).unwrap() as f32;
        c
    }

    #[test]
    fn lookup_first_then_model() {
        let model = Box::new(Fixed);
        let mut h = HybridDrafter::new(Box::new(NgramDrafter::new(2, 4, 6).unwrap()), Some(model));
        let hist = [1, 2, 3, 4, 5, 1];
        h.sync(&hist).unwrap();
        let (p, mut rng, mut out) = (SamplerParams::greedy(), Rng::new(0), Proposal::default());
        // "1 2" occurred before: the lookup proposes what followed, with the prior confidence
        assert!(h.propose_free(&hist, 2, 6, &mut out).unwrap());
        assert_eq!(out.tokens, vec![3, 4, 5, 1, 2]);
        assert_eq!(out.confidence, vec![0.5; 5]);
        h.feedback(&verified(5, 2));
        // matched "1 2": bucket 0 (n = 2); position 2 was reached and missed
        let c: Vec<f32> = (0..4).map(|i| lookup_confidence(&h, 0, i)).collect();
        assert!(c[0] > 0.5 && c[1] > c[0] && c[2] < c[1], "{c:?}");
        // unreached positions inherit the estimate before them
        assert_eq!(c[3], c[2]);
        assert_eq!(lookup_confidence(&h, 1, 0), 0.5);
        // "1 9" did not: nothing free, the model drafter proposes
        assert!(!h.propose_free(&hist, 9, 6, &mut out).unwrap());
        assert!(out.tokens.is_empty());
        h.propose(&hist, 9, 6, &p, &mut rng, &mut out).unwrap();
        assert_eq!(out.tokens, vec![7]);
        assert_eq!(out.confidence, vec![0.9]);
        h.feedback(&verified(1, 1));
        assert_eq!((h.free_proposals, h.model_proposals), (1, 1));
        // 2 of the 3 reached drafts accepted at 0.5 reported: the scale rises
        assert!(h.recent_scale() > 1.0);
    }
}

#[cfg(test)]
mod alone {
    use super::*;
    use crate::NgramDrafter;

    #[test]
    fn a_free_source_alone_never_asks_a_model() {
        let mut h = HybridDrafter::new(Box::new(NgramDrafter::new(1, 2, 4).unwrap()), None);
        assert!(!h.proposes());
        let hist = [1, 2, 3, 1];
        h.begin(&hist).unwrap();
        let mut out = Proposal::default();
        assert!(h.propose_free(&hist, 2, 4, &mut out).unwrap());
        assert_eq!(out.tokens, vec![3, 1, 2]);
        h.propose(&hist, 2, 4, &SamplerParams::greedy(), &mut Rng::new(0), &mut out).unwrap();
        assert!(out.tokens.is_empty());
        assert!(h.taps().is_empty() && !h.fixed_cost());
    }
}
