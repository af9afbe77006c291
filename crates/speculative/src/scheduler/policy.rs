//! How much to draft and how much to verify: decisions made over a
//! [`CostModel`] and a [`Calibration`].
//!
//! Each cycle the policy picks k (0 = a plain step) maximising the expected
//! committed tokens per second,
//!
//! ```text
//!   E(k) / (T_draft(k) + T_verify(k + 1)),   E(k) = 1 + Σ_{j≤k} Π_{i≤j} α_i
//! ```
//!
//! where α_i is the probability that draft position i is accepted given the
//! ones before it: the drafter's calibrated confidence where it gives one,
//! else the running per-position estimate. The decision never looks at the
//! drafted tokens themselves (only at confidences, which depend on earlier
//! tokens), so truncation keeps sampling lossless.
//!
//! The decisions are pure: [`Policy::budget`] returns a [`Budget`] that says
//! what it decided (a probe, a step of the gate) and the cycle's later
//! decisions take it as an argument; the policy's own state changes only
//! when the cycle's record is observed.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::calibration::{Calibration, CAL_DECAY};
use super::cost::{expected_tokens, CostModel, DraftCost};
use super::SchedulerConfig;

/// Relative gain in expected tokens per second a longer draft must promise:
/// keeps timing noise from buying useless drafts.
pub const MIN_GAIN: f64 = 0.02;
/// Confidence vectors of recent proposals kept to price proposing.
pub const RECENT: usize = 64;
/// Proposals seen before their confidences price the next ones.
pub const MIN_RECENT: usize = 32;
/// While confidences say plain, keep proposing now and then (truncation
/// still decides what is verified) at most this share of a plain step, so
/// the confidences and their calibration stay current.
pub const PROPOSE_OVERHEAD: f64 = 0.01;
/// When no draft has been verified for a while, verify one anyway (a probe):
/// as often as costs at most this share of the plain steps in between, even
/// if every probe is rejected. Only verified drafts tell whether the
/// drafter's confidences still mean what the calibration says.
pub const PROBE_OVERHEAD: f64 = 0.01;

/// How many tokens to ask the drafter for, decided before anything is
/// drafted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    /// Tokens to ask for (0: no proposal).
    pub tokens: usize,
    /// The proposal is a probe: one token of it is verified whatever its
    /// confidences say.
    #[serde(default, skip_serializing_if = "is_false")]
    pub probe: bool,
    /// What the decision does to the gate's count of plain cycles.
    #[serde(default, skip_serializing_if = "Gate::is_untouched")]
    pub gate: Gate,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A budget decision's effect on the count of plain cycles that the
/// confidence gate keeps (it proposes now and then while the confidences
/// say plain).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Gate {
    /// The gate was not asked.
    #[default]
    Untouched,
    /// The gate proposed: the count starts again.
    Reset,
    /// One more plain cycle.
    Tick,
}

impl Gate {
    fn is_untouched(&self) -> bool {
        *self == Gate::Untouched
    }
}

/// A recent proposal's confidences.
#[derive(Debug, Clone)]
struct RecentProposal {
    /// The cycle it was made in.
    cycle: u64,
    /// The length asked for.
    asked: usize,
    confidence: Vec<f32>,
}

/// The policy's memory: recent proposals and the streaks behind probes and
/// the gate.
#[derive(Debug, Clone)]
pub struct Policy {
    cfg: SchedulerConfig,
    /// Raw confidences of the most recent proposals (drafters that give
    /// them). Proposing is worth its cost when truncation by confidence would
    /// pay on such drafts, even if the average acceptance alone would not.
    /// Each with the length that was asked for (a proposal cut by its
    /// budget is priced beyond its length with the running acceptance
    /// estimates, see `gated_rate`) and the cycle it was made in (older ones
    /// weigh less: while proposals are rare, the window reaches back over
    /// other text).
    recent: VecDeque<RecentProposal>,
    /// Cycles so far.
    cycle: u64,
    /// Plain cycles since the last proposal, while confidences say plain.
    gated_streak: usize,
    /// Cycles since a draft of this drafter was last verified.
    unverified_streak: usize,
}

impl Policy {
    pub fn new(cfg: SchedulerConfig) -> Self {
        Policy { cfg, recent: VecDeque::with_capacity(RECENT), cycle: 0, gated_streak: 0, unverified_streak: 0 }
    }

    /// Remember the confidences of a proposal (before truncation) made
    /// when `asked` tokens were asked for.
    pub fn observe_proposal(&mut self, confidence: &[f32], asked: usize) {
        if confidence.is_empty() {
            return;
        }
        // reuse the oldest vector's buffer once the window is full
        let mut v =
            if self.recent.len() == RECENT { self.recent.pop_front().map(|p| p.confidence).unwrap_or_default() } else { Vec::new() };
        v.clear();
        v.extend_from_slice(confidence);
        self.recent.push_back(RecentProposal { cycle: self.cycle, asked, confidence: v });
    }

    /// Apply what a budget decision did to the gate.
    pub fn commit_budget(&mut self, budget: &Budget) {
        match budget.gate {
            Gate::Untouched => {}
            Gate::Reset => self.gated_streak = 0,
            Gate::Tick => self.gated_streak += 1,
        }
    }

    /// End of a cycle: `verified` tells whether a draft of this drafter was
    /// verified in it (a free proposal's is not).
    pub fn end_cycle(&mut self, verified: bool) {
        self.unverified_streak = if verified { 0 } else { self.unverified_streak + 1 };
        self.cycle += 1;
    }

    /// Cycles without a verified draft after which one is verified anyway:
    /// a probe (a draft token and one more verified row) costs at most
    /// [`PROBE_OVERHEAD`] of the plain steps in between, and none waits
    /// longer than `probe_every`.
    pub fn probe_interval(&self, cost: &CostModel) -> usize {
        let v1 = cost.verify_cost(1);
        let probe = cost.draft_cost() + (cost.verify_cost(2) - v1).max(0.0);
        // (less a rounding error, so an exact quotient is not rounded up)
        let every = (probe / (PROBE_OVERHEAD * v1).max(1e-12) - 1e-9).ceil();
        (every.clamp(1.0, 1e6) as usize).min(self.cfg.probe_every.max(1))
    }

    fn probe_due(&self, cost: &CostModel) -> bool {
        self.unverified_streak >= self.probe_interval(cost)
    }

    /// How many tokens to ask the drafter for (before any are drafted), of
    /// `offered` the cycle has room for.
    pub fn budget(&self, cost: &CostModel, cal: &Calibration, offered: usize) -> Budget {
        let plain = Budget::default();
        if offered == 0 {
            return plain;
        }
        if !self.cfg.adaptive {
            return Budget { tokens: offered, ..plain };
        }
        if cost.one_row_stale() {
            return plain;
        }
        let alpha = cal.alpha();
        let mut b = if let Some(mut b) = self.gated_budget(cost, cal, offered) {
            // a block drafter's pass costs the same whatever it is asked
            // for: when drafting pays, ask for the whole block and let its
            // confidences truncate it. A cap would also hide the later
            // confidences, so nothing could show that it no longer pays
            // (with a cap of one the scheduler verified one token in 95% of
            // cycles where blocks of two paid 6% more)
            if b.tokens > 0 && cost.fixed_draft() {
                b.tokens = offered;
            }
            b
        } else if cost.fixed_draft() {
            // one pass pays for the whole block, so the first draft token
            // alone may not pay while several do: take the best length
            // overall (the choice only uses past statistics, so it is lossless)
            let mut best = (0, cost.rate(0, alpha, DraftCost::Ahead));
            for k in 1..=offered.min(alpha.len()) {
                let r = cost.rate(k, alpha, DraftCost::Ahead);
                if r > best.1 * (1.0 + MIN_GAIN) {
                    best = (k, r);
                }
            }
            Budget { tokens: best.0, ..plain }
        } else {
            Budget { tokens: best(cost, offered, alpha, DraftCost::Ahead), ..plain }
        };
        if b.tokens == 0 && self.probe_due(cost) {
            b.tokens = 1;
            b.probe = true;
        }
        b
    }

    /// For drafters that give confidences: the proposal length with the best
    /// expected rate when each proposal is then truncated by its (calibrated)
    /// confidences, priced on the recent proposals; 0 when plain steps are
    /// better. A drafter that is right half the time pays when it knows which
    /// half, and the average acceptance cannot show that. None until enough
    /// proposals were seen.
    fn gated_budget(&self, cost: &CostModel, cal: &Calibration, offered: usize) -> Option<Budget> {
        if !self.recent.is_empty() && self.recent.len() < MIN_RECENT {
            // a drafter with confidences: propose and verify (like a probe)
            // until there are enough proposals to price proposing and
            // verified drafts to calibrate the confidences. A block drafter's
            // proposal is truncated by its confidences as they are instead:
            // probes of one token would only calibrate the first position,
            // and the first 32 cycles are most of a short generation's
            return Some(Budget { tokens: offered, probe: !cost.fixed_draft(), gate: Gate::Untouched });
        }
        let mut best: Option<(usize, f64)> = None;
        for (k, v) in self.gated_rates(cost, cal, offered) {
            let b = best.get_or_insert((0, cost.rate(0, &[], DraftCost::Ahead)));
            if v > b.1 * (1.0 + MIN_GAIN) {
                *b = (k, v);
            }
        }
        let k = best.map(|b| b.0)?;
        if k > 0 {
            return Some(Budget { tokens: k, probe: false, gate: Gate::Reset });
        }
        let every = (cost.draft_cost() / (PROPOSE_OVERHEAD * cost.verify_cost(1)).max(1e-12)).ceil().clamp(1.0, 1e6) as usize;
        if self.gated_streak + 1 >= every {
            return Some(Budget { tokens: offered, probe: false, gate: Gate::Reset });
        }
        Some(Budget { tokens: 0, probe: false, gate: Gate::Tick })
    }

    /// [`Self::gated_rate`] for k = 1, 2, … up to `offered`, while it can be priced.
    fn gated_rates<'a>(&'a self, cost: &'a CostModel, cal: &'a Calibration, offered: usize) -> impl Iterator<Item = (usize, f64)> + 'a {
        (1..=offered.min(cal.alpha().len())).map_while(move |k| Some((k, self.gated_rate(cost, cal, k)?)))
    }

    /// Committed tokens per second if up to `k` tokens are asked for and
    /// truncated as [`Self::truncate`] would, averaged over the recent
    /// proposals (total tokens over total time). A proposal that stopped
    /// short of what was asked (a margin, a one-step head behind a lookup)
    /// counts as it was: asked for more, the drafter stops there too. One
    /// cut by its budget below `k` is extended with the running acceptance
    /// estimates of the positions it did not reach. (Skipping those instead
    /// trapped a block drafter at one token: once the budget asked for one,
    /// the window soon held too few longer proposals to price two, so it
    /// never asked for two again.)
    /// A proposal weighs [`CAL_DECAY`] less per cycle of age, like the
    /// calibration evidence.
    fn gated_rate(&self, cost: &CostModel, cal: &Calibration, k: usize) -> Option<f64> {
        let (mut tokens, mut secs, mut n) = (0.0, 0.0, 0);
        let run = cal.alpha();
        let mut alpha = Vec::with_capacity(k);
        for p in &self.recent {
            let v = &p.confidence;
            let cut_by_budget = v.len() < k && v.len() >= p.asked;
            n += 1;
            let w = CAL_DECAY.powf(self.cycle.saturating_sub(p.cycle) as f64);
            let kk = if cut_by_budget { k.min(run.len()) } else { k.min(v.len()) };
            alpha.clear();
            alpha.extend(v[..kk.min(v.len())].iter().enumerate().map(|(i, &c)| cal.calibrated(i, c)));
            alpha.extend(run[alpha.len()..kk].iter().copied());
            let sunk = cost.sunk_secs(kk);
            let j = best(cost, kk, &alpha, DraftCost::Sunk(sunk));
            tokens += w * expected_tokens(&alpha[..j]);
            secs += w * (sunk + cost.verify_cost(j + 1));
        }
        (n >= MIN_RECENT && secs > 0.0).then(|| tokens / secs)
    }

    /// Final length once the draft is known, from its confidences (if any):
    /// scan left to right and stop at the first k whose rate does not improve.
    pub fn truncate(&self, cost: &CostModel, cal: &Calibration, budget: &Budget, drafted: usize, confidence: &[f32]) -> usize {
        if budget.probe {
            return drafted.min(1);
        }
        if !self.cfg.adaptive || confidence.is_empty() {
            return drafted;
        }
        let alpha: Vec<f64> = confidence.iter().take(drafted).enumerate().map(|(i, &c)| cal.calibrated(i, c)).collect();
        let k = best(cost, drafted, &alpha, DraftCost::Sunk(cost.sunk_secs(drafted)));
        // a proposal made now and then while the confidences say plain is
        // verified once a probe is due, or the verdict could never change
        if k == 0 && self.probe_due(cost) {
            return drafted.min(1);
        }
        k
    }

    /// Whether a proposal being drafted is worth extending by its next slot:
    /// `confidence` holds the confidences of the slots drafted so far and,
    /// last, the next slot's (computed before its token is chosen). True
    /// when [`Self::truncate`] would keep that slot, so a drafter that stops
    /// at the first false (see
    /// [`Drafter::propose_until`](crate::Drafter::propose_until)) drafts
    /// exactly what truncation keeps. The first slot is always drafted (a
    /// probe may verify it). Prices the draft as sunk at the block's cost,
    /// which is exact for drafters whose proposals cost the same at any
    /// length.
    pub fn extends(&self, cost: &CostModel, cal: &Calibration, budget: &Budget, confidence: &[f32]) -> bool {
        let n = confidence.len();
        if n <= 1 || !self.cfg.adaptive {
            return true;
        }
        if budget.probe {
            return false;
        }
        let alpha: Vec<f64> = confidence.iter().enumerate().map(|(i, &c)| cal.calibrated(i, c)).collect();
        best(cost, n, &alpha, DraftCost::Sunk(cost.sunk_secs(n))) == n
    }

    /// Whether verifying `k` tokens of a free proposal beats what the cycle
    /// would otherwise expect: a plain step, or the drafter's proposals as
    /// recently priced. A lookup that is right half the time is worth
    /// verifying against a plain step, but not in place of a head that is
    /// right more often there.
    pub fn free_beats_drafter(&self, cost: &CostModel, cal: &Calibration, k: usize, confidence: &[f32], offered: usize) -> bool {
        if !self.cfg.adaptive {
            return true;
        }
        let alpha: Vec<f64> = confidence.iter().take(k).map(|&c| c.clamp(0.0, 1.0) as f64).collect();
        let free = cost.rate(k, &alpha, DraftCost::Sunk(0.0));
        let plain = cost.rate(0, &[], DraftCost::Ahead);
        let run = cal.alpha();
        let other = if self.recent.is_empty() {
            (1..=offered.min(run.len())).map(|j| cost.rate(j, run, DraftCost::Ahead)).fold(plain, f64::max)
        } else {
            self.gated_rates(cost, cal, offered).map(|(_, r)| r).fold(plain, f64::max)
        };
        // a tie goes to the proposal that is already made
        free >= other
    }

    /// Length to verify of a free proposal (see
    /// [`Drafter::propose_free`](crate::Drafter::propose_free)), whose
    /// confidences are the drafter's own measured acceptance: they are used
    /// as they are, and the proposal cost nothing.
    ///
    /// A free proposal is deterministic (its tokens and confidences follow
    /// from the history alone), so the cut may look at every length at once
    /// ([`best_overall`]) instead of stopping at the first that does not pay:
    /// a long repeat often pays at 12 or 16 tokens where 8 or 9 do not,
    /// because the widths a scheduler rarely uses are priced from older
    /// measurements than the ones it uses all the time.
    pub fn truncate_free(&self, cost: &CostModel, drafted: usize, confidence: &[f32]) -> usize {
        if !self.cfg.adaptive || confidence.is_empty() {
            return drafted;
        }
        let alpha: Vec<f64> = confidence.iter().take(drafted).map(|&c| c.clamp(0.0, 1.0) as f64).collect();
        best_overall(cost, drafted, &alpha, DraftCost::Sunk(0.0))
    }
}

/// The length with the best rate over all lengths up to `max`: the shortest
/// within [`MIN_GAIN`] of the best. Lossless only where the confidences do
/// not depend on random draws (free proposals); drafters that sample use
/// [`best`].
pub fn best_overall(cost: &CostModel, max: usize, alpha: &[f64], dc: DraftCost) -> usize {
    let rates: Vec<f64> = (0..=max.min(alpha.len())).map(|k| cost.rate(k, alpha, dc)).collect();
    let top = rates.iter().copied().fold(f64::MIN, f64::max);
    rates.iter().position(|&r| r * (1.0 + MIN_GAIN) >= top).unwrap_or(0)
}

/// Greedy scan: extend k while the rate improves by more than [`MIN_GAIN`]
/// (stops at the first non-improvement, which keeps the choice lossless).
pub fn best(cost: &CostModel, max: usize, alpha: &[f64], dc: DraftCost) -> usize {
    let mut k = 0;
    let mut r = cost.rate(0, alpha, dc);
    while k < max.min(alpha.len()) {
        let r2 = cost.rate(k + 1, alpha, dc);
        if r2 <= r * (1.0 + MIN_GAIN) {
            break;
        }
        k += 1;
        r = r2;
    }
    k
}
