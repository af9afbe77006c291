//! Adaptive draft length.
//!
//! Each cycle the scheduler picks k (0 = a plain step) maximising the expected
//! committed tokens per second,
//!
//! ```text
//!   E(k) / (T_draft(k) + T_verify(k + 1)),   E(k) = 1 + Σ_{j≤k} Π_{i≤j} α_i
//! ```
//!
//! where T_verify(w) is the measured cost of a forward pass of w positions
//! (profiled on the first cycle, then tracked as the machine's present
//! speed times a slowly learned ratio per width) and α_i the probability that draft position i is accepted given the
//! ones before it: the drafter's confidence where it gives one, else a running
//! per-position estimate. The decision never looks at the drafted tokens
//! themselves (only at confidences, which depend on earlier tokens), so
//! truncation keeps sampling lossless.

/// Relative gain in expected tokens per second a longer draft must promise.
pub const MIN_GAIN: f64 = 0.02;

/// Confidence bins of the calibration.
const CONF_BINS: usize = 10;
/// Decay of the calibration evidence per cycle (an effective memory of ~200
/// cycles). Evidence ages with cycles, not with observations: a head judged
/// on one kind of text, and then rarely verified, is judged afresh on the
/// next kind instead of being held to the old verdict for good.
const CAL_DECAY: f64 = 0.995;
/// Decay per observation of the per-position sums behind the calibration
/// ratio (a memory of ~20 verified drafts while drafting).
const RATIO_DECAY: f64 = 0.95;
/// Pseudo-observations of a ratio of 1 (the confidences as they are), which
/// the per-position ratio returns to as its evidence ages.
const RATIO_PRIOR: f64 = 0.5;
/// Pseudo-observations of a ratio of 1 that a new scheduler's per-position
/// sums start with. They age like real evidence, so they only steady the
/// start: without them two early misses of a head that is right 70% of the
/// time priced its drafts at a fifth of their confidence, and the first
/// prompt of a run went plain for dozens of cycles (BENCHMARKS.md §7p).
const RATIO_START: f64 = 4.0;
/// Pseudo-count pulling a bin towards the per-position ratio.
const BIN_PRIOR: f64 = 8.0;

/// Confidence vectors of recent proposals kept to price proposing.
const RECENT: usize = 64;
/// Proposals seen before their confidences price the next ones.
const MIN_RECENT: usize = 32;
/// While confidences say plain, keep proposing now and then (truncation
/// still decides what is verified) at most this share of a plain step, so
/// the confidences and their calibration stay current.
const PROPOSE_OVERHEAD: f64 = 0.01;
/// When no draft has been verified for a while, verify one anyway (a probe):
/// as often as costs at most this share of the plain steps in between, even
/// if every probe is rejected. Only verified drafts tell whether the
/// drafter's confidences still mean what the calibration says.
const PROBE_OVERHEAD: f64 = 0.01;

/// At least one plain step in this many cycles, so the one-row cost that
/// every rate is compared with stays measured: a start-up profile that
/// caught the machine slow would otherwise price drafting as always
/// paying, and a scheduler that always drafts never measures one row again
/// (BENCHMARKS.md §6h).
const COST_REFRESH: usize = 64;

/// Weight of a forward's surprise (log of measured over predicted time) in
/// its width's relative cost, as a share of the moving-average weight that
/// the machine's speed gets. Small, so that a drift of the whole machine
/// seen through one width goes mostly (~92%) to the speed and leaves the
/// ratios between widths nearly as they were; the ratios themselves are
/// steadier than the machine and are learned over a few hundred forwards.
const WIDTH_SHARE: f64 = 0.1;

/// Settings.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Adaptive (true) or always draft the maximum offered (false).
    pub adaptive: bool,
    /// Prior acceptance probability per position before anything is observed.
    pub prior: f64,
    /// Weight of a new observation in the moving averages.
    pub ema: f64,
    /// At most this many cycles without a verified draft: then one draft
    /// token is verified anyway (a probe), so the acceptance estimate and the
    /// calibration can recover. Probes come sooner where they are cheap (see
    /// `PROBE_OVERHEAD`).
    pub probe_every: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig { adaptive: true, prior: 0.5, ema: 0.1, probe_every: 128 }
    }
}

#[derive(Debug, Clone)]
pub struct Scheduler {
    pub cfg: SchedulerConfig,
    /// Cost of a forward of w positions, index w (0 unused), at the speed
    /// factor `speed`: seconds = `speed · verify_cost[w]`.
    verify_cost: Vec<f64>,
    /// How fast the machine is now, tracked by every forward whatever its
    /// width. A width measured only now and then keeps its cost relative to
    /// the others, instead of an absolute cost from another moment: on a
    /// host whose speed drifts, absolute costs of rarely used widths went
    /// stale and priced them out for good (BENCHMARKS.md §7p).
    speed: f64,
    /// Measured widths (others are interpolated).
    measured: Vec<bool>,
    /// Seconds per drafted token (or per proposal when `fixed_draft`).
    draft_cost: f64,
    /// The drafter's cost is per proposal (a block drafter), not per token.
    fixed_draft: bool,
    /// Conditional acceptance estimate per draft position.
    alpha: Vec<f64>,
    /// Online calibration of drafter confidences, per position: decayed sums
    /// of the predicted confidence and of the observed outcome over
    /// positions that were reached (all earlier drafts accepted).
    conf_pred: Vec<f64>,
    conf_obs: Vec<f64>,
    /// Finer calibration per position and confidence tenth: decayed counts
    /// of reached drafts and of accepted ones. A head's confidence can be too
    /// high at the bottom and too low at the top at once, which one ratio per
    /// position cannot express.
    bin_n: Vec<[f64; CONF_BINS]>,
    bin_hit: Vec<[f64; CONF_BINS]>,
    /// Cycles since a draft of this drafter was last verified.
    unverified_streak: usize,
    /// Cycles since a one-row forward was last measured.
    one_row_age: usize,
    /// The current proposal is a probe: verify it whatever the confidences say.
    probing: bool,
    /// Raw confidences of the most recent proposals (drafters that give
    /// them). Proposing is worth its cost when truncation by confidence would
    /// pay on such drafts, even if the average acceptance alone would not.
    /// Each with the length that was asked for (a proposal cut by its
    /// budget is priced beyond its length with the running acceptance
    /// estimates, see `gated_rate`) and the cycle it was made in
    /// (older ones weigh less: while proposals are rare, the window reaches
    /// back over other text).
    recent: std::collections::VecDeque<Proposal>,
    /// Cycles so far.
    cycle: u64,
    /// Plain cycles since the last proposal, while confidences say plain.
    gated_streak: usize,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig, max_width: usize) -> Self {
        let n = max_width + 1;
        Scheduler {
            alpha: vec![cfg.prior; n],
            conf_pred: vec![RATIO_START; n],
            conf_obs: vec![RATIO_START; n],
            bin_n: vec![[0.0; CONF_BINS]; n],
            bin_hit: vec![[0.0; CONF_BINS]; n],
            cfg,
            verify_cost: vec![0.0; n + 1],
            speed: 1.0,
            measured: vec![false; n + 1],
            draft_cost: 0.0,
            fixed_draft: false,
            unverified_streak: 0,
            one_row_age: 0,
            probing: false,
            recent: std::collections::VecDeque::with_capacity(RECENT),
            cycle: 0,
            gated_streak: 0,
        }
    }

    pub fn has_profile(&self) -> bool {
        self.measured.get(1).copied().unwrap_or(false)
    }

    /// Record the measured time of a forward of `width` positions.
    pub fn observe_verify(&mut self, width: usize, secs: f64) {
        if width >= self.verify_cost.len() {
            return;
        }
        // a one-row cost measured after a long gap says more about the
        // machine's present state than the average from before it
        let stale = width == 1 && self.one_row_age >= COST_REFRESH;
        if width == 1 {
            self.one_row_age = 0;
        }
        if !(secs > 0.0 && secs.is_finite()) {
            return;
        }
        if self.measured[width] {
            // the surprise in log terms, shared out between the machine's
            // speed (most of it: all widths drift together) and this width's
            // relative cost
            let e = (secs / (self.speed * self.verify_cost[width])).ln();
            let a = self.cfg.ema;
            let ar = if stale { a.max(0.5) } else { a * WIDTH_SHARE };
            self.speed *= (a * e).exp();
            self.verify_cost[width] *= ((ar - a * ar).max(0.0) * e).exp();
        } else {
            self.verify_cost[width] = secs / self.speed;
            self.measured[width] = true;
        }
    }

    /// Price drafts per proposal instead of per token (block drafters).
    pub fn set_fixed_draft_cost(&mut self, fixed: bool) {
        self.fixed_draft = fixed;
    }

    pub fn observe_draft(&mut self, tokens: usize, secs: f64) {
        if tokens > 0 {
            let per = if self.fixed_draft { secs } else { secs / tokens as f64 };
            let a = self.cfg.ema;
            self.draft_cost = if self.draft_cost == 0.0 { per } else { (1.0 - a) * self.draft_cost + a * per };
        }
    }

    /// Update per-position acceptance from one verified draft.
    pub fn observe_acceptance(&mut self, verified: usize, accepted: usize) {
        let a = self.cfg.ema;
        for i in 0..verified.min(self.alpha.len()) {
            // position i was reached; it was accepted iff i < accepted
            let hit = if i < accepted { 1.0 } else { 0.0 };
            self.alpha[i] = (1.0 - a) * self.alpha[i] + a * hit;
            if i >= accepted {
                break;
            }
        }
    }

    /// Positions `verified..` of a proposal were not verified (the
    /// confidences did not justify them): move their acceptance estimates
    /// towards the calibrated confidences, so the budget stops asking for
    /// drafts that truncation would throw away.
    pub fn observe_unverified(&mut self, verified: usize, confidence: &[f32]) {
        let a = self.cfg.ema;
        for (i, &conf) in confidence.iter().enumerate().take(self.alpha.len()).skip(verified) {
            let c = self.calibrated(i, conf);
            self.alpha[i] = (1.0 - a) * self.alpha[i] + a * c;
        }
    }

    /// Record the confidences of a verified draft of which the first
    /// `accepted` were accepted (calibration; only past cycles feed it, so
    /// using it keeps truncation lossless).
    pub fn observe_confidence(&mut self, confidence: &[f32], accepted: usize) {
        for (i, &c) in confidence.iter().enumerate().take(self.conf_pred.len()) {
            if i > accepted {
                break;
            }
            let hit = if i < accepted { 1.0 } else { 0.0 };
            let b = bin(c);
            self.bin_n[i][b] += 1.0;
            self.bin_hit[i][b] += hit;
            self.conf_pred[i] = self.conf_pred[i] * RATIO_DECAY + c.clamp(0.0, 1.0) as f64;
            self.conf_obs[i] = self.conf_obs[i] * RATIO_DECAY + hit;
        }
    }

    /// End of a cycle: `verified` tells whether a draft of this drafter was
    /// verified in it (a free proposal's is not). The calibration evidence
    /// ages by one cycle.
    pub fn end_cycle(&mut self, verified: bool) {
        self.unverified_streak = if verified { 0 } else { self.unverified_streak + 1 };
        self.cycle += 1;
        self.one_row_age += 1;
        for i in 0..self.bin_n.len() {
            for b in 0..CONF_BINS {
                self.bin_n[i][b] *= CAL_DECAY;
                self.bin_hit[i][b] *= CAL_DECAY;
            }
            self.conf_pred[i] *= CAL_DECAY;
            self.conf_obs[i] *= CAL_DECAY;
        }
    }

    /// Cycles without a verified draft after which one is verified anyway:
    /// a probe (a draft token and one more verified row) costs at most
    /// [`PROBE_OVERHEAD`] of the plain steps in between, and none waits
    /// longer than `probe_every`.
    fn probe_interval(&self) -> usize {
        let v1 = self.verify_cost(1);
        let probe = self.draft_cost + (self.verify_cost(2) - v1).max(0.0);
        // (less a rounding error, so an exact quotient is not rounded up)
        let every = (probe / (PROBE_OVERHEAD * v1).max(1e-12) - 1e-9).ceil();
        (every.clamp(1.0, 1e6) as usize).min(self.cfg.probe_every.max(1))
    }

    fn probe_due(&self) -> bool {
        self.unverified_streak >= self.probe_interval()
    }

    /// A confidence mapped through the calibration of position `i`: scaled
    /// by observed / predicted acceptance there (1 until observed, and back
    /// towards 1 as the evidence ages), then by what the drafts seen at
    /// about this confidence did.
    pub fn calibrated(&self, i: usize, c: f32) -> f64 {
        let c = c.clamp(0.0, 1.0) as f64;
        let ratio = match (self.conf_pred.get(i), self.conf_obs.get(i)) {
            (Some(&p), Some(&o)) => (c * (o + RATIO_PRIOR) / (p + RATIO_PRIOR)).clamp(0.0, 1.0),
            _ => c,
        };
        // the drafts seen at this confidence, shrunk towards the ratio
        match (self.bin_n.get(i), self.bin_hit.get(i)) {
            (Some(n), Some(h)) => {
                let b = bin(c as f32);
                (h[b] + BIN_PRIOR * ratio) / (n[b] + BIN_PRIOR)
            }
            _ => ratio,
        }
    }

    /// Cost of a forward of `w` positions now: its relative cost (measured,
    /// else interpolated linearly from the nearest measured widths) times
    /// the machine's present speed.
    pub fn verify_cost(&self, w: usize) -> f64 {
        let w = w.min(self.verify_cost.len() - 1).max(1);
        if !self.measured.iter().any(|&m| m) {
            return 1.0;
        }
        self.speed * self.relative_cost(w)
    }

    fn relative_cost(&self, w: usize) -> f64 {
        let c = &self.verify_cost;
        if self.measured[w] {
            return c[w];
        }
        let lo = (1..w).rev().find(|&i| self.measured[i]);
        let hi = (w + 1..c.len()).find(|&i| self.measured[i]);
        match (lo, hi) {
            (Some(l), Some(h)) => {
                let t = (w - l) as f64 / (h - l) as f64;
                c[l] * (1.0 - t) + c[h] * t
            }
            (Some(l), None) => {
                // extrapolate with the slope of the last two measured widths
                let l0 = (1..l).rev().find(|&i| self.measured[i]);
                let slope = l0.map(|p| (c[l] - c[p]) / (l - p) as f64).unwrap_or(c[l] * 0.3);
                c[l] + slope * (w - l) as f64
            }
            (None, Some(h)) => c[h],
            (None, None) => 1.0,
        }
    }

    /// Expected committed tokens per second with k drafts and the given
    /// conditional acceptance probabilities.
    fn rate(&self, k: usize, alpha: &[f64], cost: DraftCost) -> f64 {
        let e = expected_tokens(&alpha[..k.min(alpha.len())]);
        let draft = match cost {
            DraftCost::Ahead if self.fixed_draft => {
                if k > 0 {
                    self.draft_cost
                } else {
                    0.0
                }
            }
            DraftCost::Ahead => self.draft_cost * k as f64,
            DraftCost::Sunk(secs) => secs,
        };
        e / (draft + self.verify_cost(k + 1))
    }

    /// The estimated cost of a proposal of `drafted` tokens once made.
    fn sunk_secs(&self, drafted: usize) -> f64 {
        if self.fixed_draft {
            self.draft_cost
        } else {
            self.draft_cost * drafted as f64
        }
    }

    /// How many tokens to ask the drafter for (before any are drafted).
    pub fn budget(&mut self, offered: usize) -> usize {
        if offered == 0 {
            return 0;
        }
        if !self.cfg.adaptive {
            return offered;
        }
        if self.one_row_age >= COST_REFRESH {
            return 0;
        }
        let alpha = self.alpha.clone();
        let k = if let Some(k) = self.gated_budget(offered) {
            // a block drafter's pass costs the same whatever it is asked
            // for: when drafting pays, ask for the whole block and let its
            // confidences truncate it. A cap would also hide the later
            // confidences, so nothing could show that it no longer pays
            // (with a cap of one the scheduler verified one token in 95% of
            // cycles where blocks of two paid 6% more; BENCHMARKS.md §7p)
            if k > 0 && self.fixed_draft {
                offered
            } else {
                k
            }
        } else if self.fixed_draft {
            // one pass pays for the whole block, so the first draft token
            // alone may not pay while several do: take the best length
            // overall (the choice only uses past statistics, so it is lossless)
            let mut best = (0, self.rate(0, &alpha, DraftCost::Ahead));
            for k in 1..=offered.min(alpha.len()) {
                let r = self.rate(k, &alpha, DraftCost::Ahead);
                if r > best.1 * (1.0 + MIN_GAIN) {
                    best = (k, r);
                }
            }
            best.0
        } else {
            self.best(offered, &alpha, DraftCost::Ahead)
        };
        if k == 0 && self.probe_due() {
            self.probing = true;
            return 1;
        }
        k
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
        self.recent.push_back(Proposal { cycle: self.cycle, asked, confidence: v });
    }

    /// For drafters that give confidences: the proposal length with the best
    /// expected rate when each proposal is then truncated by its (calibrated)
    /// confidences, priced on the recent proposals; 0 when plain steps are
    /// better. A drafter that is right half the time pays when it knows which
    /// half, and the average acceptance cannot show that. None until enough
    /// proposals were seen.
    fn gated_budget(&mut self, offered: usize) -> Option<usize> {
        if !self.recent.is_empty() && self.recent.len() < MIN_RECENT {
            // a drafter with confidences: propose and verify (like a probe)
            // until there are enough proposals to price proposing and
            // verified drafts to calibrate the confidences. A block drafter's
            // proposal is truncated by its confidences as they are instead:
            // probes of one token would only calibrate the first position,
            // and the first 32 cycles are most of a short generation's
            if !self.fixed_draft {
                self.probing = true;
            }
            return Some(offered);
        }
        let mut best: Option<(usize, f64)> = None;
        for (k, v) in self.gated_rates(offered) {
            let b = best.get_or_insert((0, self.rate(0, &[], DraftCost::Ahead)));
            if v > b.1 * (1.0 + MIN_GAIN) {
                *b = (k, v);
            }
        }
        let k = best.map(|b| b.0)?;
        if k > 0 {
            self.gated_streak = 0;
            return Some(k);
        }
        self.gated_streak += 1;
        let every = (self.draft_cost / (PROPOSE_OVERHEAD * self.verify_cost(1)).max(1e-12)).ceil().clamp(1.0, 1e6) as usize;
        if self.gated_streak >= every {
            self.gated_streak = 0;
            return Some(offered);
        }
        Some(0)
    }

    /// [`Self::gated_rate`] for k = 1, 2, … up to `offered`, while it can be priced.
    fn gated_rates(&self, offered: usize) -> impl Iterator<Item = (usize, f64)> + '_ {
        (1..=offered.min(self.alpha.len())).map_while(|k| Some((k, self.gated_rate(k)?)))
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
    /// never asked for two again; BENCHMARKS.md §7o.)
    /// A proposal weighs [`CAL_DECAY`] less per cycle of age, like the
    /// calibration evidence.
    fn gated_rate(&self, k: usize) -> Option<f64> {
        let (mut tokens, mut secs, mut n) = (0.0, 0.0, 0);
        let mut alpha = Vec::with_capacity(k);
        for p in &self.recent {
            let v = &p.confidence;
            let cut_by_budget = v.len() < k && v.len() >= p.asked;
            n += 1;
            let w = CAL_DECAY.powf(self.cycle.saturating_sub(p.cycle) as f64);
            let kk = if cut_by_budget { k.min(self.alpha.len()) } else { k.min(v.len()) };
            alpha.clear();
            alpha.extend(v[..kk.min(v.len())].iter().enumerate().map(|(i, &c)| self.calibrated(i, c)));
            alpha.extend(self.alpha[alpha.len()..kk].iter().copied());
            let sunk = self.sunk_secs(kk);
            let j = self.best(kk, &alpha, DraftCost::Sunk(sunk));
            tokens += w * expected_tokens(&alpha[..j]);
            secs += w * (sunk + self.verify_cost(j + 1));
        }
        (n >= MIN_RECENT && secs > 0.0).then(|| tokens / secs)
    }

    /// Final length once the draft is known, from its confidences (if any):
    /// scan left to right and stop at the first k whose rate does not improve.
    pub fn truncate(&mut self, drafted: usize, confidence: &[f32]) -> usize {
        if std::mem::take(&mut self.probing) {
            return drafted.min(1);
        }
        if !self.cfg.adaptive || confidence.is_empty() {
            return drafted;
        }
        let alpha: Vec<f64> = confidence.iter().take(drafted).enumerate().map(|(i, &c)| self.calibrated(i, c)).collect();
        let k = self.best(drafted, &alpha, DraftCost::Sunk(self.sunk_secs(drafted)));
        // a proposal made now and then while the confidences say plain is
        // verified once a probe is due, or the verdict could never change
        if k == 0 && self.probe_due() {
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
    pub fn extends(&self, confidence: &[f32]) -> bool {
        let n = confidence.len();
        if n <= 1 || !self.cfg.adaptive {
            return true;
        }
        if self.probing {
            return false;
        }
        let alpha: Vec<f64> = confidence.iter().enumerate().map(|(i, &c)| self.calibrated(i, c)).collect();
        self.best(n, &alpha, DraftCost::Sunk(self.sunk_secs(n))) == n
    }

    /// Whether verifying `k` tokens of a free proposal beats what the cycle
    /// would otherwise expect: a plain step, or the drafter's proposals as
    /// recently priced. A lookup that is right half the time is worth
    /// verifying against a plain step, but not in place of a head that is
    /// right more often there.
    pub fn free_beats_drafter(&self, k: usize, confidence: &[f32], offered: usize) -> bool {
        if !self.cfg.adaptive {
            return true;
        }
        let alpha: Vec<f64> = confidence.iter().take(k).map(|&c| c.clamp(0.0, 1.0) as f64).collect();
        let free = self.rate(k, &alpha, DraftCost::Sunk(0.0));
        let plain = self.rate(0, &[], DraftCost::Ahead);
        let other = if self.recent.is_empty() {
            (1..=offered.min(self.alpha.len())).map(|j| self.rate(j, &self.alpha, DraftCost::Ahead)).fold(plain, f64::max)
        } else {
            self.gated_rates(offered).map(|(_, r)| r).fold(plain, f64::max)
        };
        // a tie goes to the proposal that is already made
        free >= other
    }

    /// Length to verify of a free proposal (see
    /// [`Drafter::propose_free`](crate::Drafter::propose_free)), whose
    /// confidences are the drafter's own measured acceptance: they are used
    /// as they are, and the proposal cost nothing.
    pub fn truncate_free(&self, drafted: usize, confidence: &[f32]) -> usize {
        if !self.cfg.adaptive || confidence.is_empty() {
            return drafted;
        }
        let alpha: Vec<f64> = confidence.iter().take(drafted).map(|&c| c.clamp(0.0, 1.0) as f64).collect();
        self.best(drafted, &alpha, DraftCost::Sunk(0.0))
    }

    /// Greedy scan: extend k while the rate improves by more than
    /// [`MIN_GAIN`] (stops at the first non-improvement, which keeps the choice
    /// lossless; the margin keeps timing noise from buying useless drafts).
    fn best(&self, max: usize, alpha: &[f64], cost: DraftCost) -> usize {
        let mut k = 0;
        let mut r = self.rate(0, alpha, cost);
        while k < max.min(alpha.len()) {
            let r2 = self.rate(k + 1, alpha, cost);
            if r2 <= r * (1.0 + MIN_GAIN) {
                break;
            }
            k += 1;
            r = r2;
        }
        k
    }

    pub fn alpha(&self) -> &[f64] {
        &self.alpha
    }
}

/// A recent proposal's confidences (see `Scheduler::recent`).
#[derive(Debug, Clone)]
struct Proposal {
    cycle: u64,
    asked: usize,
    confidence: Vec<f32>,
}

/// What the draft costs when rates are compared.
#[derive(Debug, Clone, Copy)]
enum DraftCost {
    /// Not drafted yet: k tokens cost k drafts (a block drafter: one pass
    /// for any k > 0), none for k = 0.
    Ahead,
    /// Already drafted: these seconds, whatever length is verified.
    Sunk(f64),
}

/// Expected committed tokens of a cycle whose drafts are accepted with the
/// conditional probabilities `alpha`: 1 + Σ_j Π_{i≤j} α_i.
fn expected_tokens(alpha: &[f64]) -> f64 {
    let (mut e, mut surv) = (1.0, 1.0);
    for a in alpha {
        surv *= a;
        e += surv;
    }
    e
}

fn bin(c: f32) -> usize {
    ((c.clamp(0.0, 1.0) * CONF_BINS as f32) as usize).min(CONF_BINS - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched() -> Scheduler {
        let mut s = Scheduler::new(SchedulerConfig::default(), 8);
        for w in 1..=9 {
            s.observe_verify(w, 0.010 * (1.0 + 0.25 * (w - 1) as f64));
        }
        s
    }

    #[test]
    fn backs_off_when_drafts_fail() {
        let mut s = sched();
        assert!(s.budget(8) > 0, "optimistic prior drafts");
        for _ in 0..100 {
            s.observe_acceptance(4, 0);
        }
        assert_eq!(s.budget(8), 0);
    }

    #[test]
    fn drafts_long_when_drafts_succeed() {
        let mut s = sched();
        for _ in 0..100 {
            s.observe_acceptance(8, 8);
        }
        assert_eq!(s.budget(8), 8);
    }

    /// Cycles (1-based) in which a scheduler that backs off verifies a
    /// probe, over `n` cycles.
    fn probe_cycles(s: &mut Scheduler, n: usize) -> Vec<usize> {
        let mut at = Vec::new();
        for cycle in 1..=n {
            let b = s.budget(8);
            let verified = b > 0 && s.truncate(b, &[]) > 0;
            if verified {
                at.push(cycle);
            }
            let w = 1 + usize::from(verified);
            s.observe_verify(w, s.verify_cost(w));
            s.end_cycle(verified);
        }
        at
    }

    #[test]
    fn probes_after_a_long_plain_streak() {
        // an expensive drafter: probes wait the longest allowed streak
        let mut s = sched();
        s.observe_draft(1, 1.0);
        for _ in 0..100 {
            s.observe_acceptance(4, 0);
        }
        assert_eq!(probe_cycles(&mut s, 400), vec![129, 258, 387]);
        // a cheap one (a 2-row verify costs 0.25 of a row more): a probe
        // every 25 plain cycles costs 1% of them
        let mut s = sched();
        s.observe_draft(1, 0.0);
        for _ in 0..100 {
            s.observe_acceptance(4, 0);
        }
        assert_eq!(s.probe_interval(), 25);
        assert_eq!(probe_cycles(&mut s, 100), vec![26, 52, 78]);
    }

    /// `cycles` cycles of a one-token drafter whose drafts have confidence
    /// `conf` and are right or wrong as `right` says; returns the verified
    /// drafts.
    fn simulate(s: &mut Scheduler, cycles: usize, conf: f32, right: bool) -> usize {
        let mut verified = 0;
        for _ in 0..cycles {
            let b = s.budget(1);
            let mut k = 0;
            if b > 0 {
                s.observe_proposal(&[conf], b);
                k = s.truncate(1, &[conf]);
                if k == 0 {
                    s.observe_unverified(0, &[conf]);
                }
            }
            if k > 0 {
                let acc = usize::from(right);
                s.observe_acceptance(1, acc);
                s.observe_confidence(&[conf], acc);
                verified += 1;
            }
            s.observe_verify(k + 1, s.verify_cost(k + 1));
            s.end_cycle(k > 0);
        }
        verified
    }

    fn one_token_drafter() -> Scheduler {
        let mut s = Scheduler::new(SchedulerConfig::default(), 4);
        s.observe_verify(1, 1.0);
        s.observe_verify(2, 1.25);
        s.observe_draft(1, 0.1);
        s
    }

    /// The stall of BENCHMARKS.md §6g: a head that was confident and wrong on
    /// one kind of text, then confident and right on the next, must be
    /// verified again; the old verdict may not hold for good.
    #[test]
    fn calibration_recovers_after_a_change_of_text() {
        let mut s = one_token_drafter();
        // poor text: drafting stops
        simulate(&mut s, 400, 0.8, false);
        assert_eq!(s.budget(1), 0);
        assert!(s.calibrated(0, 0.8) < 0.1, "{}", s.calibrated(0, 0.8));
        // good text: within 200 cycles it drafts on nearly every one (measured:
        // 1 probe in the first 50 cycles, 26 drafts in the next 50, then all)
        simulate(&mut s, 200, 0.8, true);
        let late = simulate(&mut s, 100, 0.8, true);
        assert!(late >= 90, "verified {late} of the last 100 cycles");
    }

    /// The proposals that price proposing age too: after a long stretch of
    /// unsure proposals, the few recent sure ones decide, although the window
    /// still holds mostly old ones (proposals are rare while the gate is shut).
    #[test]
    fn old_proposals_weigh_less() {
        let mut s = one_token_drafter();
        simulate(&mut s, 1000, 0.2, false);
        assert_eq!(s.budget(1), 0);
        // measured: verified drafts per 25 cycles 3, 11, then 25 each; with
        // every proposal of the window weighing the same: 3, 2, 3, 2, then 25
        simulate(&mut s, 50, 0.9, true);
        let late = simulate(&mut s, 50, 0.9, true);
        assert!(late >= 45, "verified {late} of cycles 51-100");
    }

    /// A profile that caught the machine slow prices one row too high, so
    /// drafting looks always worth it; a plain step now and then measures the
    /// one-row cost again.
    #[test]
    fn one_row_cost_stays_measured() {
        let mut s = Scheduler::new(SchedulerConfig::default(), 4);
        s.observe_verify(1, 2.0);
        s.observe_verify(2, 1.25);
        s.observe_draft(1, 0.05);
        let mut plain = 0;
        for _ in 0..200 {
            let b = s.budget(1);
            if b == 0 {
                plain += 1;
                s.observe_verify(1, 1.0);
            } else {
                let k = s.truncate(b, &[]);
                s.observe_verify(k + 1, 1.25);
                s.observe_acceptance(k, 0);
            }
            s.end_cycle(b > 0);
        }
        assert!(plain > 0);
        assert!((s.verify_cost(1) - 1.0).abs() < 0.05, "{}", s.verify_cost(1));
    }

    #[test]
    fn confidence_truncation() {
        let mut s = sched();
        assert_eq!(s.truncate(5, &[0.95, 0.9, 0.05, 0.9, 0.9]), 2);
        assert_eq!(s.truncate(3, &[]), 3);
    }

    #[test]
    fn block_drafter_pays_once_per_pass() {
        let mut s = sched();
        s.set_fixed_draft_cost(true);
        // a pass costs as much as a 4-wide verify; 1 draft alone cannot pay
        s.observe_draft(4, 0.010 * 1.75);
        for _ in 0..200 {
            s.observe_acceptance(4, 4);
        }
        assert_eq!(s.budget(4), 4);
        // once drafted, the pass is sunk: keep the confident prefix
        assert_eq!(s.truncate(4, &[0.9, 0.9, 0.05, 0.9]), 2);
        for _ in 0..200 {
            s.observe_acceptance(4, 0);
        }
        assert_eq!(s.budget(4), 0);
    }

    #[test]
    fn declined_proposals_stop_the_budget_and_probes_are_verified() {
        let mut s = sched();
        let low = [0.01f32, 0.01, 0.01];
        let mut asked = 0;
        for _ in 0..200 {
            let b = s.budget(3);
            if b > 0 {
                asked += 1;
                let k = s.truncate(b, &low[..b]);
                if k == 0 {
                    s.observe_unverified(0, &low[..b]);
                } else {
                    assert_eq!(k, 1, "a probe verifies one draft");
                }
            }
        }
        assert!(asked < 40, "the budget kept asking for drafts that were thrown away: {asked}");
    }

    #[test]
    fn calibration_corrects_an_overconfident_head() {
        let mut s = sched();
        for _ in 0..500 {
            // the head says 0.9, but only half of its first drafts are accepted
            s.observe_confidence(&[0.9, 0.9], 0);
            s.observe_confidence(&[0.9, 0.9], 1);
        }
        assert!((s.calibrated(0, 0.9) - 0.5).abs() < 0.05, "{}", s.calibrated(0, 0.9));
        assert_eq!(s.calibrated(5, 0.7), 0.7_f32 as f64);
    }

    /// Half the drafts are sure and right, half unsure and wrong: the mean
    /// acceptance (50%) does not pay for a 1.6× verify, gating on confidence does.
    #[test]
    fn confident_half_is_worth_proposing() {
        let mut s = Scheduler::new(SchedulerConfig::default(), 4);
        s.observe_verify(1, 1.0);
        s.observe_verify(2, 1.6);
        s.observe_draft(1, 0.02);
        for i in 0..200 {
            let (c, acc) = if i % 2 == 0 { (0.95f32, 1) } else { (0.05, 0) };
            s.observe_acceptance(1, acc);
            s.observe_confidence(&[c], acc);
        }
        // the average alone says plain
        assert_eq!(s.best(1, &s.alpha.clone(), DraftCost::Ahead), 0);
        assert_eq!(s.budget(1), 0, "no confidences seen yet: the mean decides");
        s.observe_proposal(&[0.95], 1);
        assert_eq!(s.budget(1), 1, "a few proposals are made to learn what confidences say");
        for i in 0..RECENT {
            s.observe_proposal(&[if i % 2 == 0 { 0.95 } else { 0.05 }], 1);
        }
        assert_eq!(s.budget(1), 1);
        assert_eq!(s.truncate(1, &[0.95]), 1);
        assert_eq!(s.truncate(1, &[0.05]), 0);
        // only unsure drafts lately: plain steps again
        for _ in 0..RECENT {
            s.observe_proposal(&[0.05], 1);
        }
        assert_eq!(s.budget(1), 0);
        // proposing now and then costs at most 1% of the plain steps
        let proposed = (0..1000).filter(|_| s.budget(1) > 0).count();
        assert!(proposed > 0 && proposed as f64 * 0.02 <= PROPOSE_OVERHEAD * 1000.0 * 1.0 + 1e-9, "{proposed}");
    }

    #[test]
    fn free_proposals_are_cut_by_their_own_confidences() {
        let s = sched();
        // verify costs 1 + 0.25 per extra row: a free draft pays above 25%
        assert_eq!(s.truncate_free(4, &[0.95, 0.95, 0.95, 0.1]), 3);
        assert_eq!(s.truncate_free(2, &[0.05, 0.9]), 0);
        // not recalibrated: the same confidences with a pessimistic calibration
        let mut c = sched();
        for _ in 0..200 {
            c.observe_confidence(&[0.95], 0);
        }
        assert!(c.calibrated(0, 0.95) < 0.2);
        assert_eq!(c.truncate_free(1, &[0.95]), 1);
        // against a drafter known only by its prior (50%) a 60% free draft
        // pays; against one whose recent proposals were confident and right,
        // a 40% one does not
        assert!(c.free_beats_drafter(1, &[0.6], 8));
        assert!(!c.free_beats_drafter(1, &[0.4], 8));
        let mut h = sched();
        for _ in 0..64 {
            h.observe_confidence(&[0.9], 1);
            h.observe_proposal(&[0.9], 1);
        }
        h.observe_draft(1, 0.0005);
        assert!(!h.free_beats_drafter(1, &[0.4], 8));
        assert!(h.free_beats_drafter(3, &[0.99, 0.99, 0.99], 8));
    }

    #[test]
    fn calibration_per_confidence_bin() {
        let mut s = sched();
        for i in 0..400 {
            // unsure drafts are worse than they say, sure ones better
            s.observe_confidence(&[0.2], usize::from(i % 20 == 0));
            s.observe_confidence(&[0.6], usize::from(i % 10 != 0));
        }
        assert!((s.calibrated(0, 0.2) - 0.05).abs() < 0.06, "{}", s.calibrated(0, 0.2));
        assert!((s.calibrated(0, 0.6) - 0.9).abs() < 0.06, "{}", s.calibrated(0, 0.6));
    }

    #[test]
    fn proposals_cut_by_the_budget_still_price_longer_ones() {
        let mut s = sched();
        s.set_fixed_draft_cost(true);
        s.observe_draft(4, 0.001);
        // right 90% of the time at the first two positions, but every recent
        // proposal was asked for one token only
        for _ in 0..200 {
            s.observe_acceptance(2, 2);
        }
        for _ in 0..RECENT {
            s.observe_confidence(&[0.9], 1);
            s.observe_proposal(&[0.9], 1);
        }
        assert!(s.budget(4) >= 2, "stuck at one-token proposals");
    }

    /// Costs of a forward of 1..=5 rows and of a block proposal, as
    /// measured on this project's AVX2 machine (BENCHMARKS.md §7o, in plain
    /// tokens).
    fn block_sched() -> Scheduler {
        let mut s = Scheduler::new(SchedulerConfig::default(), 5);
        for (w, c) in [1.0, 1.07, 1.2, 1.4, 1.75].into_iter().enumerate() {
            s.observe_verify(w + 1, c);
        }
        s.set_fixed_draft_cost(true);
        s.observe_draft(4, 0.14);
        s
    }

    #[test]
    fn a_block_drafter_is_asked_for_the_whole_block() {
        let mut s = block_sched();
        // the running estimate of the second position has fallen (a run of
        // misses there), and every recent proposal was asked for one token
        for _ in 0..100 {
            s.observe_acceptance(2, 1);
        }
        assert!(s.alpha()[1] < 0.05);
        for _ in 0..RECENT {
            s.observe_confidence(&[0.9], 1);
            s.observe_proposal(&[0.9], 1);
        }
        // drafting pays, so the block is asked for whole; its confidences
        // then decide what is verified
        assert_eq!(s.budget(4), 4, "a block drafter capped below its block");
        let conf = [0.9, 0.9, 0.9, 0.9];
        s.observe_proposal(&conf, 4);
        assert!(s.truncate(4, &conf) >= 2);
    }

    #[test]
    fn a_block_drafter_warms_up_on_its_confidences() {
        // (the first budget, with no proposal seen, comes from the prior)
        let started = |fixed: bool| {
            let mut s = block_sched();
            s.set_fixed_draft_cost(fixed);
            let k = s.budget(4);
            s.observe_proposal(&[0.5; 4][..k], k);
            s
        };
        // before enough proposals were seen to price them, a block drafter's
        // proposal is truncated by its confidences (not probed at one token) ...
        let mut s = started(true);
        assert_eq!(s.budget(4), 4);
        s.observe_proposal(&[0.95; 4], 4);
        assert!(s.truncate(4, &[0.95; 4]) >= 2);
        let mut s = started(true);
        assert_eq!(s.budget(4), 4);
        // (a sunk draft makes one more row worth it from about 7% on)
        s.observe_proposal(&[0.02; 4], 4);
        assert_eq!(s.truncate(4, &[0.02; 4]), 0);
        // ... while a per-token drafter's is verified one token at a time
        let mut s = started(false);
        assert_eq!(s.budget(4), 4);
        s.observe_proposal(&[0.95; 4], 4);
        assert_eq!(s.truncate(4, &[0.95; 4]), 1);
    }

    #[test]
    fn a_proposal_cut_by_extends_is_what_truncation_keeps() {
        let mut s = block_sched();
        for _ in 0..RECENT {
            s.observe_proposal(&[0.6, 0.6, 0.6, 0.6], 4);
            s.observe_confidence(&[0.6, 0.6], 1);
        }
        let mut r = 7u32;
        for _ in 0..500 {
            let conf: Vec<f32> = (0..4)
                .map(|_| {
                    r = r.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                    (r >> 16) as f32 / 65_536.0
                })
                .collect();
            // the drafter drafts slot j while `extends` says so (slot 0 always)
            let drafted = (1..=4).take_while(|&j| s.extends(&conf[..j])).last().unwrap();
            let mut t = s.clone();
            let k = t.truncate(drafted, &conf[..drafted]);
            let mut u = s.clone();
            let all = u.truncate(4, &conf);
            assert_eq!(k, all, "{conf:?}: drafted {drafted}");
            assert!(k == drafted || (drafted == 1 && k == 0), "{conf:?}: drafted {drafted}, kept {k}");
        }
    }

    #[test]
    fn costs_follow_the_machine_and_keep_their_ratios() {
        let mut s = block_sched();
        // the machine slows down by half; only two-row forwards are measured
        for _ in 0..200 {
            s.observe_verify(2, 1.07 * 1.5);
        }
        // the three-row cost, not measured since the profile, drifted along
        // (all but the ~8% of the drift that the two-row ratio took)
        let r = s.verify_cost(3) / s.verify_cost(2);
        assert!((r / (1.2 / 1.07) - 1.0).abs() < 0.04, "ratio {r}");
        assert!((s.verify_cost(2) - 1.605).abs() < 0.01, "{}", s.verify_cost(2));
        assert!(s.verify_cost(3) > 1.2 * 1.4, "{}", s.verify_cost(3));
        // a width that really is dearer than the profile said is learned
        for _ in 0..400 {
            s.observe_verify(3, 1.4 * 1.5);
            s.observe_verify(2, 1.07 * 1.5);
        }
        let r = s.verify_cost(3) / s.verify_cost(2);
        assert!((r / (1.4 / 1.07) - 1.0).abs() < 0.03, "ratio {r}");
    }

    #[test]
    fn two_early_misses_do_not_condemn_a_head() {
        let mut s = block_sched();
        s.observe_confidence(&[0.7], 0);
        s.observe_confidence(&[0.7], 0);
        let c = s.calibrated(0, 0.7);
        assert!(c > 0.35, "{c}"); // (0.15 without the starting evidence)
                                  // while a run of misses still does
        for _ in 0..40 {
            s.observe_confidence(&[0.7], 0);
            s.end_cycle(true);
        }
        let c = s.calibrated(0, 0.7);
        assert!(c < 0.15, "{c}");
    }

    #[test]
    fn interpolates_costs() {
        let mut s = Scheduler::new(SchedulerConfig::default(), 16);
        s.observe_verify(1, 1.0);
        s.observe_verify(5, 2.0);
        assert!((s.verify_cost(3) - 1.5).abs() < 1e-9);
        assert!((s.verify_cost(9) - 3.0).abs() < 1e-9);
    }
}
