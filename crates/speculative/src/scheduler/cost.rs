//! What a cycle costs: a forward of w rows, and a proposal.
//!
//! The cost of a forward of w rows is the machine's present speed times a
//! relative cost of that width. Every forward, whatever its width, updates
//! the speed; its width's relative cost learns only a small share of the
//! surprise. A width measured only now and then so keeps its cost relative
//! to the others, instead of an absolute cost from another moment: on a
//! host whose speed drifts, absolute costs of rarely used widths went stale
//! and priced them out for good.

use crate::cycle::BatchLoad;

/// At least one plain step in this many cycles, so the one-row cost that
/// every rate is compared with stays measured: a start-up profile that
/// caught the machine slow would otherwise price drafting as always
/// paying, and a scheduler that always drafts never measures one row again.
pub const COST_REFRESH: usize = 64;

/// Weight of a forward's surprise (log of measured over predicted time) in
/// its width's relative cost, as a share of the moving-average weight that
/// the machine's speed gets. Small, so that a drift of the whole machine
/// seen through one width goes mostly (~92%) to the speed and leaves the
/// ratios between widths nearly as they were; the ratios themselves are
/// steadier than the machine and are learned over a few hundred forwards.
pub const WIDTH_SHARE: f64 = 0.1;

/// What the draft costs when rates are compared.
#[derive(Debug, Clone, Copy)]
pub enum DraftCost {
    /// Not drafted yet: k tokens cost k drafts (a block drafter: one pass
    /// for any k > 0), none for k = 0.
    Ahead,
    /// Already drafted: these seconds, whatever length is verified.
    Sunk(f64),
}

/// Measured costs of forwards by width and of proposals.
#[derive(Debug, Clone)]
pub struct CostModel {
    /// Weight of a new observation in the moving averages.
    ema: f64,
    /// Relative cost of a forward of w positions, index w (0 unused):
    /// seconds = `speed · relative[w]`.
    relative: Vec<f64>,
    /// How fast the machine is now, tracked by every forward.
    speed: f64,
    /// Measured widths (others are interpolated).
    measured: Vec<bool>,
    /// Seconds per drafted token (or per proposal when `fixed_draft`).
    draft_cost: f64,
    /// The drafter's cost is per proposal (a block drafter), not per token.
    fixed_draft: bool,
    /// Cycles since a one-row forward was last measured.
    one_row_age: usize,
    /// Widest forward of the sequence's own rows.
    own_width: usize,
    /// The rest of the batch the next verify joins.
    load: BatchLoad,
}

impl CostModel {
    /// Costs of forwards up to `max_width` rows.
    pub fn new(max_width: usize, ema: f64) -> Self {
        CostModel {
            ema,
            relative: vec![0.0; max_width + 1],
            speed: 1.0,
            measured: vec![false; max_width + 1],
            draft_cost: 0.0,
            fixed_draft: false,
            one_row_age: 0,
            own_width: max_width,
            load: BatchLoad::default(),
        }
    }

    /// The rest of the batch the next cycle's verify rows join: rates count
    /// its tokens and price the whole forward. Widths up to the batch's are
    /// learned from then on.
    pub fn set_load(&mut self, load: BatchLoad) {
        let need = load.rows + self.own_width + 1;
        if self.relative.len() < need {
            self.relative.resize(need, 0.0);
            self.measured.resize(need, false);
        }
        self.load = load;
    }

    /// Whether a one-row forward has been measured (the start-up profile ran).
    pub fn has_profile(&self) -> bool {
        self.measured.get(1).copied().unwrap_or(false)
    }

    /// A one-row forward has not been measured for [`COST_REFRESH`] cycles.
    pub fn one_row_stale(&self) -> bool {
        self.one_row_age >= COST_REFRESH
    }

    /// Record the measured time of a forward of `width` positions.
    pub fn observe_verify(&mut self, width: usize, secs: f64) {
        if width >= self.relative.len() {
            return;
        }
        // a one-row cost measured after a long gap says more about the
        // machine's present state than the average from before it
        let stale = width == 1 && self.one_row_stale();
        if width == 1 {
            self.one_row_age = 0;
        }
        if !(secs > 0.0 && secs.is_finite()) {
            return;
        }
        if self.measured[width] {
            // a cost above a wider width's was a slow sample: start from the bound
            self.relative[width] = self.bounded_relative(width);
            // the surprise in log terms, shared out between the machine's
            // speed (most of it: all widths drift together) and this width's
            // relative cost
            let e = (secs / (self.speed * self.relative[width])).ln();
            let a = self.ema;
            let ar = if stale { a.max(0.5) } else { a * WIDTH_SHARE };
            self.speed *= (a * e).exp();
            self.relative[width] *= ((ar - a * ar).max(0.0) * e).exp();
        } else {
            self.relative[width] = secs / self.speed;
            self.measured[width] = true;
        }
    }

    /// Price drafts per proposal instead of per token (block drafters).
    pub fn set_fixed_draft(&mut self, fixed: bool) {
        self.fixed_draft = fixed;
    }

    pub fn fixed_draft(&self) -> bool {
        self.fixed_draft
    }

    /// Record what a proposal of `tokens` tokens cost.
    pub fn observe_draft(&mut self, tokens: usize, secs: f64) {
        if tokens > 0 {
            let per = if self.fixed_draft { secs } else { secs / tokens as f64 };
            let a = self.ema;
            self.draft_cost = if self.draft_cost == 0.0 { per } else { (1.0 - a) * self.draft_cost + a * per };
        }
    }

    /// Seconds per drafted token (per proposal for a block drafter).
    pub fn draft_cost(&self) -> f64 {
        self.draft_cost
    }

    /// One cycle has passed.
    pub fn end_cycle(&mut self) {
        self.one_row_age += 1;
    }

    /// Cost of a forward of `w` positions now: its relative cost (measured,
    /// else interpolated linearly from the nearest measured widths) times
    /// the machine's present speed.
    pub fn verify_cost(&self, w: usize) -> f64 {
        let w = w.min(self.relative.len() - 1).max(1);
        if !self.measured.iter().any(|&m| m) {
            return 1.0;
        }
        self.speed * self.bounded_relative(w)
    }

    /// The relative cost of width `w`, at most that of any wider measured
    /// width: a forward of more rows does not cost less, so a width whose
    /// first sample came out slow (a preempted forward) is priced no higher
    /// than the next wider one. Without the bound one slow sample of width
    /// 3 kept a free proposal at one verified token for hundreds of cycles:
    /// the greedy scan stops at the first width that does not pay, and a
    /// width that is never chosen is never measured again.
    /// The one-row cost is left as measured: it is the plain step every
    /// rate is compared with, refreshed on its own schedule.
    fn bounded_relative(&self, w: usize) -> f64 {
        if w == 1 {
            return self.relative_cost(1);
        }
        (w + 1..self.relative.len()).filter(|&v| self.measured[v]).fold(self.relative_cost(w), |r, v| r.min(self.relative[v]))
    }

    fn relative_cost(&self, w: usize) -> f64 {
        let c = &self.relative;
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
    /// conditional acceptance probabilities: of the whole forward, when the
    /// verify rows join a batch of other sequences (their expected tokens
    /// over the batch's cost).
    pub fn rate(&self, k: usize, alpha: &[f64], cost: DraftCost) -> f64 {
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
        (self.load.tokens + e) / (draft + self.verify_cost(self.load.rows + k + 1))
    }

    /// The estimated cost of a proposal of `drafted` tokens once made.
    pub fn sunk_secs(&self, drafted: usize) -> f64 {
        if self.fixed_draft {
            self.draft_cost
        } else {
            self.draft_cost * drafted as f64
        }
    }
}

/// Expected committed tokens of a cycle whose drafts are accepted with the
/// conditional probabilities `alpha`: 1 + Σ_j Π_{i≤j} α_i.
pub fn expected_tokens(alpha: &[f64]) -> f64 {
    let (mut e, mut surv) = (1.0, 1.0);
    for a in alpha {
        surv *= a;
        e += surv;
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Costs of a forward of 1..=5 rows, as measured on this project's AVX2
    /// machine (in plain tokens).
    fn measured() -> CostModel {
        let mut c = CostModel::new(6, 0.1);
        for (w, t) in [1.0, 1.07, 1.2, 1.4, 1.75].into_iter().enumerate() {
            c.observe_verify(w + 1, t);
        }
        c
    }

    #[test]
    fn interpolates_costs() {
        let mut c = CostModel::new(17, 0.1);
        assert_eq!(c.verify_cost(3), 1.0, "nothing measured: every width costs one unit");
        c.observe_verify(1, 1.0);
        c.observe_verify(5, 2.0);
        assert!((c.verify_cost(3) - 1.5).abs() < 1e-9);
        assert!((c.verify_cost(9) - 3.0).abs() < 1e-9);
    }

    #[test]
    fn costs_follow_the_machine_and_keep_their_ratios() {
        let mut c = measured();
        // the machine slows down by half; only two-row forwards are measured
        for _ in 0..200 {
            c.observe_verify(2, 1.07 * 1.5);
        }
        // the three-row cost, not measured since the profile, drifted along
        // (all but the ~8% of the drift that the two-row ratio took)
        let r = c.verify_cost(3) / c.verify_cost(2);
        assert!((r / (1.2 / 1.07) - 1.0).abs() < 0.04, "ratio {r}");
        assert!((c.verify_cost(2) - 1.605).abs() < 0.01, "{}", c.verify_cost(2));
        assert!(c.verify_cost(3) > 1.2 * 1.4, "{}", c.verify_cost(3));
        // a width that really is dearer than the profile said is learned
        for _ in 0..400 {
            c.observe_verify(3, 1.4 * 1.5);
            c.observe_verify(2, 1.07 * 1.5);
        }
        let r = c.verify_cost(3) / c.verify_cost(2);
        assert!((r / (1.4 / 1.07) - 1.0).abs() < 0.03, "ratio {r}");
    }

    /// A one-row cost measured after a long gap moves the estimate over
    /// half of the way (in log terms) at once; a fresh one a tenth.
    #[test]
    fn a_stale_one_row_cost_is_learned_fast() {
        let mut fresh = measured();
        fresh.observe_verify(1, 2.0);
        assert!(fresh.verify_cost(1) < 1.1, "{}", fresh.verify_cost(1));
        let mut c = measured();
        for _ in 0..COST_REFRESH {
            c.end_cycle();
        }
        assert!(c.one_row_stale());
        c.observe_verify(1, 2.0);
        assert!(!c.one_row_stale());
        assert!(c.verify_cost(1) > 1.45, "{}", c.verify_cost(1));
    }

    /// A width whose first sample came out slow costs no more than a wider one.
    #[test]
    fn a_slow_sample_does_not_price_a_width_above_wider_ones() {
        let mut c = measured();
        c.observe_verify(6, 2.0);
        // width 3 once measured at three times its cost
        c.observe_verify(3, 3.6);
        assert!(c.verify_cost(3) <= c.verify_cost(4) + 1e-12, "{} > {}", c.verify_cost(3), c.verify_cost(4));
        assert!(c.verify_cost(5) <= c.verify_cost(6) + 1e-12);
        // and its next samples are learned from the bound
        for _ in 0..50 {
            c.observe_verify(3, 1.2);
        }
        assert!(c.verify_cost(3) < 1.4, "{}", c.verify_cost(3));
    }

    #[test]
    fn drafts_are_priced_per_token_or_per_proposal() {
        let mut c = measured();
        c.observe_draft(4, 0.4);
        assert!((c.sunk_secs(3) - 0.3).abs() < 1e-12);
        let mut b = measured();
        b.set_fixed_draft(true);
        b.observe_draft(4, 0.4);
        assert!((b.sunk_secs(1) - 0.4).abs() < 1e-12);
        // k = 0 costs no draft in either; a block costs its pass once
        assert!((b.rate(0, &[1.0; 4], DraftCost::Ahead) - 1.0).abs() < 1e-12);
        assert!((b.rate(2, &[1.0; 4], DraftCost::Ahead) - 3.0 / (0.4 + 1.2)).abs() < 1e-12);
        assert!((c.rate(2, &[1.0; 4], DraftCost::Ahead) - 3.0 / (0.2 + 1.2)).abs() < 1e-12);
    }

    #[test]
    fn expected_tokens_of_a_chain() {
        assert_eq!(expected_tokens(&[]), 1.0);
        assert!((expected_tokens(&[0.5, 0.5]) - 1.75).abs() < 1e-12);
    }

    #[test]
    fn drafting_that_pays_alone_does_not_pay_in_a_full_batch() {
        // each row costs a tenth of a one-row forward on top of it
        let mut c = CostModel::new(9, 0.1);
        for w in [1, 2, 4, 8, 16, 24] {
            c.set_load(BatchLoad { rows: w.max(8) - 8, tokens: 0.0 });
            c.observe_verify(w, 1.0 + 0.1 * (w - 1) as f64);
        }
        let alpha = [0.7; 8];
        c.set_load(BatchLoad::default());
        assert!(c.rate(4, &alpha, DraftCost::Ahead) > 1.5 * c.rate(0, &alpha, DraftCost::Ahead));
        // beside 8 other rows that commit 8 tokens, 4 drafts cost more than they bring
        c.set_load(BatchLoad { rows: 8, tokens: 8.0 });
        assert!(c.rate(4, &alpha, DraftCost::Ahead) < c.rate(0, &alpha, DraftCost::Ahead));
        assert!((c.verify_cost(12) - 2.1).abs() < 1e-9, "{}", c.verify_cost(12));
    }
}
