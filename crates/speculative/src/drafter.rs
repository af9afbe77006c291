use tandem_model::HiddenTap;

use crate::cycle::CycleRecord;
use crate::SpecError;
use tandem_sampling::{Rng, SamplerParams};

/// A proposal: tokens, and optionally the distribution each was drawn from
/// (for exact acceptance at temperature > 0) and a per-token confidence
/// (estimated probability that the target accepts it, given the ones before).
#[derive(Debug, Clone, Default)]
pub struct Proposal {
    pub tokens: Vec<u32>,
    /// Empty for deterministic drafts; else one sparse distribution per token.
    pub dists: Vec<Vec<(u32, f32)>>,
    /// Empty when the drafter has no confidence estimate. What the
    /// scheduler prices and calibrates; for DSpark at temperature 0 the
    /// draft's own probability of the token, else its confidence head.
    pub confidence: Vec<f32>,
    /// A DSpark drafter's confidence head per token (for logs; empty for
    /// other drafters), whatever `confidence` holds.
    pub head: Vec<f32>,
}

impl Proposal {
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.dists.clear();
        self.confidence.clear();
        self.head.clear();
    }
    /// Keep the first `k` proposals.
    pub fn truncate(&mut self, k: usize) {
        self.tokens.truncate(k);
        self.dists.truncate(k);
        self.confidence.truncate(k);
        self.head.truncate(k);
    }
}

/// Anything that proposes tokens for the target to verify.
///
/// Protocol per cycle: the target has committed `history` (its KV cache holds
/// exactly these tokens) and chosen `next`; the drafter proposes up to `max`
/// tokens to follow `history ++ [next]`; after verification [`sync`](Drafter::sync)
/// is called with the new history and [`feedback`](Drafter::feedback) with the
/// outcome.
pub trait Drafter: Send {
    fn name(&self) -> String;

    /// Largest proposal this drafter can make.
    fn max_draft(&self) -> usize;

    /// The committed history is now exactly `history` (called after every
    /// cycle and after any rollback).
    fn sync(&mut self, history: &[u32]) -> Result<(), SpecError>;

    /// A generation starts after `history`, its prompt (drafters that treat
    /// the prompt and the output apart, such as suffix speculation, mark the
    /// boundary here).
    fn begin(&mut self, history: &[u32]) -> Result<(), SpecError> {
        self.sync(history)
    }

    /// False for a drafter whose only proposals are free ones
    /// ([`propose_free`](Drafter::propose_free)): the scheduler then weighs
    /// them against plain steps and never asks [`propose`](Drafter::propose).
    fn proposes(&self) -> bool {
        true
    }

    /// Propose up to `max` tokens after `history ++ [next]`. Drafters that
    /// sample use `params` and `rng` and fill `out.dists`.
    fn propose(
        &mut self,
        history: &[u32],
        next: u32,
        max: usize,
        params: &SamplerParams,
        rng: &mut Rng,
        out: &mut Proposal,
    ) -> Result<(), SpecError>;

    /// [`propose`](Drafter::propose), asking `more` before each token is
    /// added whether the proposal is still worth extending: `more` gets the
    /// confidences of the tokens so far and the next one's, and false ends
    /// the proposal before that token. When sampling, that confidence must
    /// be known before the token is drawn (so the cut stays lossless); at
    /// temperature 0 any cut is lossless.
    /// Only drafters with confidences whose proposals cost more the longer
    /// they are use it (a block drafter's Markov chain); the default ignores
    /// it. A proposal cut this way is what truncation would have kept of the
    /// longer one, so the cut saves work and changes nothing else.
    #[allow(clippy::too_many_arguments)]
    fn propose_until(
        &mut self,
        history: &[u32],
        next: u32,
        max: usize,
        params: &SamplerParams,
        rng: &mut Rng,
        out: &mut Proposal,
        _more: &dyn Fn(&[f32]) -> bool,
    ) -> Result<(), SpecError> {
        self.propose(history, next, max, params, rng, out)
    }

    /// A proposal that costs next to nothing (a lookup in front of a model
    /// drafter), asked for every cycle before the scheduler picks a budget,
    /// with confidences that are the drafter's own measured acceptance per
    /// position. The speculator verifies it (as much as those confidences
    /// pay for) instead of calling [`propose`](Drafter::propose) when it
    /// beats the rate the scheduler expects from `propose`, or when the
    /// scheduler would not call `propose` this cycle; otherwise it is
    /// dropped and `propose` may follow. The choice to propose must depend
    /// on the history only.
    fn propose_free(&mut self, _history: &[u32], _next: u32, _max: usize, _out: &mut Proposal) -> Result<bool, SpecError> {
        Ok(false)
    }

    /// The cycle is over: what was verified and accepted.
    fn feedback(&mut self, _cycle: &CycleRecord) {}

    /// True when one proposal costs about the same whatever its length (a
    /// block drafter); false when the cost grows with each drafted token.
    fn fixed_cost(&self) -> bool {
        false
    }

    /// Target hidden states this drafter needs for every committed position
    /// (MTP: the final hidden; DSpark: several layers). Empty: none.
    fn taps(&self) -> Vec<HiddenTap> {
        Vec::new()
    }

    /// Hidden rows of committed positions `start..start + rows`, one
    /// `rows × d_model` slice per tap in [`taps`](Drafter::taps) order. Called
    /// for prompt prefill and after every cycle, in position order; after a
    /// rollback (`sync` with a shorter history) positions are observed again.
    fn observe(&mut self, _start: usize, _rows: usize, _hidden: &[&[f32]]) {}
}
