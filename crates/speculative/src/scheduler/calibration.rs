//! What a draft is worth: per-position acceptance estimates, and an online
//! calibration of the drafter's confidences against what verification
//! accepted.
//!
//! Only past cycles feed it, so a decision made from it never looks at the
//! tokens being decided on, and truncation stays lossless.

/// Confidence bins of the calibration.
pub const CONF_BINS: usize = 10;
/// Decay of the calibration evidence per cycle (an effective memory of ~200
/// cycles). Evidence ages with cycles, not with observations: a head judged
/// on one kind of text, and then rarely verified, is judged afresh on the
/// next kind instead of being held to the old verdict for good.
pub const CAL_DECAY: f64 = 0.995;
/// Decay per observation of the per-position sums behind the calibration
/// ratio (a memory of ~20 verified drafts while drafting).
pub const RATIO_DECAY: f64 = 0.95;
/// Pseudo-observations of a ratio of 1 (the confidences as they are), which
/// the per-position ratio returns to as its evidence ages.
pub const RATIO_PRIOR: f64 = 0.5;
/// Pseudo-observations of a ratio of 1 that new per-position sums start
/// with. They age like real evidence, so they only steady the start:
/// without them two early misses of a head that is right 70% of the time
/// priced its drafts at a fifth of their confidence, and the first prompt of
/// a run went plain for dozens of cycles.
pub const RATIO_START: f64 = 4.0;
/// Pseudo-count pulling a bin towards the per-position ratio.
pub const BIN_PRIOR: f64 = 8.0;

/// Acceptance estimates and confidence calibration per draft position.
#[derive(Debug, Clone)]
pub struct Calibration {
    /// Weight of a new observation in the moving averages.
    ema: f64,
    /// Conditional acceptance estimate per draft position.
    alpha: Vec<f64>,
    /// Decayed sums of the predicted confidence and of the observed outcome,
    /// per position, over positions that were reached (all earlier drafts
    /// accepted).
    conf_pred: Vec<f64>,
    conf_obs: Vec<f64>,
    /// Finer calibration per position and confidence tenth: decayed counts
    /// of reached drafts and of accepted ones. A head's confidence can be too
    /// high at the bottom and too low at the top at once, which one ratio per
    /// position cannot express.
    bin_n: Vec<[f64; CONF_BINS]>,
    bin_hit: Vec<[f64; CONF_BINS]>,
}

impl Calibration {
    /// `positions` draft positions, each estimated at `prior` until observed.
    pub fn new(positions: usize, prior: f64, ema: f64) -> Self {
        Calibration {
            ema,
            alpha: vec![prior; positions],
            conf_pred: vec![RATIO_START; positions],
            conf_obs: vec![RATIO_START; positions],
            bin_n: vec![[0.0; CONF_BINS]; positions],
            bin_hit: vec![[0.0; CONF_BINS]; positions],
        }
    }

    /// The running conditional acceptance estimate per position.
    pub fn alpha(&self) -> &[f64] {
        &self.alpha
    }

    /// Update per-position acceptance from one verified draft.
    pub fn observe_acceptance(&mut self, verified: usize, accepted: usize) {
        let a = self.ema;
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
        let a = self.ema;
        for (i, &conf) in confidence.iter().enumerate().take(self.alpha.len()).skip(verified) {
            let c = self.calibrated(i, conf);
            self.alpha[i] = (1.0 - a) * self.alpha[i] + a * c;
        }
    }

    /// Record the confidences of a verified draft of which the first
    /// `accepted` were accepted.
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

    /// One cycle has passed: the evidence ages.
    pub fn end_cycle(&mut self) {
        for i in 0..self.bin_n.len() {
            for b in 0..CONF_BINS {
                self.bin_n[i][b] *= CAL_DECAY;
                self.bin_hit[i][b] *= CAL_DECAY;
            }
            self.conf_pred[i] *= CAL_DECAY;
            self.conf_obs[i] *= CAL_DECAY;
        }
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
}

fn bin(c: f32) -> usize {
    ((c.clamp(0.0, 1.0) * CONF_BINS as f32) as usize).min(CONF_BINS - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cal() -> Calibration {
        Calibration::new(9, 0.5, 0.1)
    }

    #[test]
    fn acceptance_estimates_follow_the_reached_positions() {
        let mut c = cal();
        for _ in 0..100 {
            c.observe_acceptance(4, 1);
        }
        // position 0 always accepted, position 1 always rejected, 2.. never reached
        assert!(c.alpha()[0] > 0.99 && c.alpha()[1] < 0.01, "{:?}", c.alpha());
        assert_eq!(c.alpha()[2], 0.5);
    }

    #[test]
    fn calibration_corrects_an_overconfident_head() {
        let mut c = cal();
        for _ in 0..500 {
            // the head says 0.9, but only half of its first drafts are accepted
            c.observe_confidence(&[0.9, 0.9], 0);
            c.observe_confidence(&[0.9, 0.9], 1);
        }
        assert!((c.calibrated(0, 0.9) - 0.5).abs() < 0.05, "{}", c.calibrated(0, 0.9));
        assert_eq!(c.calibrated(5, 0.7), 0.7_f32 as f64);
    }

    #[test]
    fn calibration_per_confidence_bin() {
        let mut c = cal();
        for i in 0..400 {
            // unsure drafts are worse than they say, sure ones better
            c.observe_confidence(&[0.2], usize::from(i % 20 == 0));
            c.observe_confidence(&[0.6], usize::from(i % 10 != 0));
        }
        assert!((c.calibrated(0, 0.2) - 0.05).abs() < 0.06, "{}", c.calibrated(0, 0.2));
        assert!((c.calibrated(0, 0.6) - 0.9).abs() < 0.06, "{}", c.calibrated(0, 0.6));
    }

    #[test]
    fn two_early_misses_do_not_condemn_a_head() {
        let mut c = cal();
        c.observe_confidence(&[0.7], 0);
        c.observe_confidence(&[0.7], 0);
        let p = c.calibrated(0, 0.7);
        assert!(p > 0.35, "{p}"); // (0.15 without the starting evidence)
                                  // while a run of misses still does
        for _ in 0..40 {
            c.observe_confidence(&[0.7], 0);
            c.end_cycle();
        }
        let p = c.calibrated(0, 0.7);
        assert!(p < 0.15, "{p}");
    }

    /// Evidence ages with cycles: without new observations a verdict
    /// returns towards the confidences as they are.
    #[test]
    fn old_evidence_fades() {
        let mut c = cal();
        for _ in 0..200 {
            c.observe_confidence(&[0.8], 0);
        }
        assert!(c.calibrated(0, 0.8) < 0.1);
        for _ in 0..2000 {
            c.end_cycle();
        }
        assert!((c.calibrated(0, 0.8) - 0.8).abs() < 0.02, "{}", c.calibrated(0, 0.8));
    }

    /// Unverified positions move towards their calibrated confidence.
    #[test]
    fn unverified_positions_follow_their_confidences() {
        let mut c = cal();
        for _ in 0..200 {
            c.observe_unverified(1, &[0.9, 0.1, 0.1]);
        }
        assert_eq!(c.alpha()[0], 0.5, "verified positions are left alone");
        assert!((c.alpha()[1] - 0.1).abs() < 0.01, "{:?}", c.alpha());
    }
}
