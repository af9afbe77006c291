//! Adaptive draft length, in three parts:
//!
//! - [`cost`]: what a forward of w rows and a proposal cost, measured as
//!   decoding goes;
//! - [`calibration`]: what a draft position is worth, from past
//!   verifications and the drafter's confidences;
//! - [`policy`]: the decisions — how many tokens to ask for, how many of a
//!   proposal to verify — made over the other two.
//!
//! [`Scheduler`] holds the three and takes a cycle's [`CycleRecord`] to
//! update them. Its decisions are pure: a cycle's [`CyclePlan`] is a value
//! computed from the state before the cycle, the proposal and the costs
//! measured before it (the start-up profile, the proposal's own cost), so a
//! recorded cycle can be replayed and its plan checked.

pub mod calibration;
pub mod cost;
pub mod policy;

pub use calibration::Calibration;
pub use cost::CostModel;
pub use policy::{Budget, Gate, Policy};

use crate::cycle::{Ask, CyclePlan, CycleRecord};

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
    /// [`policy::PROBE_OVERHEAD`]).
    pub probe_every: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig { adaptive: true, prior: 0.5, ema: 0.1, probe_every: 128 }
    }
}

/// Cost model, calibration and policy of one speculator.
#[derive(Debug, Clone)]
pub struct Scheduler {
    pub cfg: SchedulerConfig,
    pub cost: CostModel,
    pub calibration: Calibration,
    pub policy: Policy,
}

impl Scheduler {
    /// A scheduler for forwards of up to `max_width` rows.
    pub fn new(cfg: SchedulerConfig, max_width: usize) -> Self {
        Scheduler {
            cost: CostModel::new(max_width + 1, cfg.ema),
            calibration: Calibration::new(max_width + 1, cfg.prior, cfg.ema),
            policy: Policy::new(cfg.clone()),
            cfg,
        }
    }

    pub fn has_profile(&self) -> bool {
        self.cost.has_profile()
    }

    /// Record the measured time of a forward of `width` positions.
    pub fn observe_verify(&mut self, width: usize, secs: f64) {
        self.cost.observe_verify(width, secs);
    }

    /// The rest of the batch the next cycle's verify rows join (see
    /// [`BatchLoad`](crate::cycle::BatchLoad)); the default when alone.
    pub fn set_load(&mut self, load: crate::cycle::BatchLoad) {
        self.cost.set_load(load);
    }

    /// Price drafts per proposal instead of per token (block drafters).
    pub fn set_fixed_draft_cost(&mut self, fixed: bool) {
        self.cost.set_fixed_draft(fixed);
    }

    /// Record what a proposal of `tokens` tokens cost.
    pub fn observe_draft(&mut self, tokens: usize, secs: f64) {
        self.cost.observe_draft(tokens, secs);
    }

    pub fn verify_cost(&self, w: usize) -> f64 {
        self.cost.verify_cost(w)
    }

    pub fn calibrated(&self, i: usize, c: f32) -> f64 {
        self.calibration.calibrated(i, c)
    }

    pub fn alpha(&self) -> &[f64] {
        self.calibration.alpha()
    }

    /// How many tokens to ask the drafter for, of `offered`.
    pub fn budget(&self, offered: usize) -> Budget {
        self.policy.budget(&self.cost, &self.calibration, offered)
    }

    /// Whether a proposal being drafted under `budget` is worth extending
    /// by its next slot (see [`Policy::extends`]).
    pub fn extends(&self, budget: &Budget, confidence: &[f32]) -> bool {
        self.policy.extends(&self.cost, &self.calibration, budget, confidence)
    }

    /// How many of `drafted` tokens to verify (see [`Policy::truncate`]).
    pub fn truncate(&self, budget: &Budget, drafted: usize, confidence: &[f32]) -> usize {
        self.policy.truncate(&self.cost, &self.calibration, budget, drafted, confidence)
    }

    /// How many tokens of a free proposal pay (see [`Policy::truncate_free`]).
    pub fn truncate_free(&self, drafted: usize, confidence: &[f32]) -> usize {
        self.policy.truncate_free(&self.cost, drafted, confidence)
    }

    /// See [`Policy::free_beats_drafter`].
    pub fn free_beats_drafter(&self, k: usize, confidence: &[f32], offered: usize) -> bool {
        self.policy.free_beats_drafter(&self.cost, &self.calibration, k, confidence, offered)
    }

    /// The decision before drafting, for a cycle with room for `offered`
    /// draft tokens and, when the drafter made one, a free proposal of
    /// `free.0` tokens with confidences `free.1`. The free proposal is
    /// verified when it beats what the drafter is priced at, and when the
    /// drafter is not asked.
    pub fn ask(&self, offered: usize, free: Option<(usize, &[f32])>) -> Ask {
        let free_len = free.map_or(0, |(n, c)| self.truncate_free(n, c));
        let first = free_len > 0 && self.free_beats_drafter(free_len, free.map_or(&[], |f| f.1), offered);
        let budget = if first { Budget::default() } else { self.budget(offered) };
        Ask { offered, free_len, free: budget.tokens == 0 && free_len > 0, budget }
    }

    /// The plan once the proposal is known: `drafted` tokens (after the
    /// budget's cut) with `confidence`.
    pub fn plan(&self, ask: Ask, drafted: usize, confidence: &[f32]) -> CyclePlan {
        let verify = if ask.free { ask.free_len } else { self.truncate(&ask.budget, drafted, confidence) };
        CyclePlan { ask, verify }
    }

    /// Remember the confidences of a proposal made when `asked` tokens were
    /// asked for.
    pub fn observe_proposal(&mut self, confidence: &[f32], asked: usize) {
        self.policy.observe_proposal(confidence, asked);
    }

    /// Apply what a budget decision did to the policy's gate.
    pub fn commit_budget(&mut self, budget: &Budget) {
        self.policy.commit_budget(budget);
    }

    pub fn observe_acceptance(&mut self, verified: usize, accepted: usize) {
        self.calibration.observe_acceptance(verified, accepted);
    }

    pub fn observe_unverified(&mut self, verified: usize, confidence: &[f32]) {
        self.calibration.observe_unverified(verified, confidence);
    }

    pub fn observe_confidence(&mut self, confidence: &[f32], accepted: usize) {
        self.calibration.observe_confidence(confidence, accepted);
    }

    /// End of a cycle: `verified` tells whether a draft of this drafter was
    /// verified in it (a free proposal's is not).
    pub fn end_cycle(&mut self, verified: bool) {
        self.policy.end_cycle(verified);
        self.cost.end_cycle();
        self.calibration.end_cycle();
    }

    /// Learn from a finished cycle: what its plan decided, what the
    /// proposal offered, what verification accepted and what the forward
    /// cost. (The start-up profile and the proposal's cost were observed
    /// when they were measured: the plan depends on them.)
    pub fn observe_cycle(&mut self, rec: &CycleRecord) {
        let plan = &rec.plan;
        let (k, free) = (plan.verify, plan.ask.free);
        self.commit_budget(&plan.ask.budget);
        if plan.ask.budget.tokens > 0 {
            // all the confidences the drafter gave, before the budget cut
            self.observe_proposal(&rec.confidence, plan.ask.budget.tokens);
        }
        let conf = &rec.confidence[..rec.confidence.len().min(rec.drafted.len())];
        if k < rec.drafted.len() && !free && !conf.is_empty() {
            self.observe_unverified(k, conf);
        }
        let width = if rec.forward_rows > 0 { rec.forward_rows } else { k + 1 };
        self.observe_verify(width, rec.verify_secs);
        // the estimates describe the drafter they price; a free proposal's
        // confidences are already measured acceptance
        if k > 0 && !free {
            self.observe_acceptance(k, rec.verification.accepted);
            self.observe_confidence(&conf[..k.min(conf.len())], rec.verification.accepted);
        }
        self.end_cycle(k > 0 && !free);
    }
}

#[cfg(test)]
mod tests {
    use super::policy::{PROPOSE_OVERHEAD, RECENT};
    use super::*;

    /// A scheduler driven one decision at a time, as a speculator drives
    /// it: the budget's effect on the gate is applied at once, and later
    /// decisions of the cycle see the budget.
    #[derive(Clone)]
    struct Sim {
        s: Scheduler,
        last: Budget,
    }

    impl Sim {
        fn new(max_width: usize) -> Self {
            Sim { s: Scheduler::new(SchedulerConfig::default(), max_width), last: Budget::default() }
        }
        fn budget(&mut self, offered: usize) -> usize {
            self.last = self.s.budget(offered);
            self.s.commit_budget(&self.last);
            self.last.tokens
        }
        fn truncate(&mut self, drafted: usize, confidence: &[f32]) -> usize {
            let k = self.s.truncate(&self.last, drafted, confidence);
            self.last = Budget::default();
            k
        }
        fn extends(&self, confidence: &[f32]) -> bool {
            self.s.extends(&self.last, confidence)
        }
    }

    impl std::ops::Deref for Sim {
        type Target = Scheduler;
        fn deref(&self) -> &Scheduler {
            &self.s
        }
    }

    impl std::ops::DerefMut for Sim {
        fn deref_mut(&mut self) -> &mut Scheduler {
            &mut self.s
        }
    }

    fn sched() -> Sim {
        let mut s = Sim::new(8);
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
    fn probe_cycles(s: &mut Sim, n: usize) -> Vec<usize> {
        let mut at = Vec::new();
        for cycle in 1..=n {
            let b = s.budget(8);
            let verified = b > 0 && s.truncate(b, &[]) > 0;
            if verified {
                at.push(cycle);
            }
            let w = 1 + usize::from(verified);
            let c = s.verify_cost(w);
            s.observe_verify(w, c);
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
        assert_eq!(s.policy.probe_interval(&s.cost), 25);
        assert_eq!(probe_cycles(&mut s, 100), vec![26, 52, 78]);
    }

    /// `cycles` cycles of a one-token drafter whose drafts have confidence
    /// `conf` and are right or wrong as `right` says; returns the verified
    /// drafts.
    fn simulate(s: &mut Sim, cycles: usize, conf: f32, right: bool) -> usize {
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
            let c = s.verify_cost(k + 1);
            s.observe_verify(k + 1, c);
            s.end_cycle(k > 0);
        }
        verified
    }

    fn one_token_drafter() -> Sim {
        let mut s = Sim::new(4);
        s.observe_verify(1, 1.0);
        s.observe_verify(2, 1.25);
        s.observe_draft(1, 0.1);
        s
    }

    /// The stall of docs/experiments/002-mtp-head.md §6g: a head that was confident and wrong on
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
        let mut s = Sim::new(4);
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

    /// Half the drafts are sure and right, half unsure and wrong: the mean
    /// acceptance (50%) does not pay for a 1.6× verify, gating on confidence does.
    #[test]
    fn confident_half_is_worth_proposing() {
        let mut s = Sim::new(4);
        s.observe_verify(1, 1.0);
        s.observe_verify(2, 1.6);
        s.observe_draft(1, 0.02);
        for i in 0..200 {
            let (c, acc) = if i % 2 == 0 { (0.95f32, 1) } else { (0.05, 0) };
            s.observe_acceptance(1, acc);
            s.observe_confidence(&[c], acc);
        }
        // the average alone says plain
        assert_eq!(policy::best(&s.cost, 1, s.alpha(), cost::DraftCost::Ahead), 0);
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
    /// measured on this project's AVX2 machine (docs/experiments/001-plain-decode-kernels.md §7o, in plain
    /// tokens).
    fn block_sched() -> Sim {
        let mut s = Sim::new(5);
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
}
