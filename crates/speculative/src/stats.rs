//! Per-generation speculative statistics.

use serde::Serialize;

use crate::cycle::CycleRecord;

#[derive(Debug, Clone, Default, Serialize)]
pub struct SpecStats {
    /// Verify cycles run (each commits ≥ 1 token).
    pub cycles: u64,
    /// Cycles that verified no draft (plain steps chosen by the scheduler).
    pub plain_cycles: u64,
    /// Tokens the drafter proposed.
    pub proposed: u64,
    /// Draft tokens sent to verification (after truncation).
    pub drafted: u64,
    pub accepted: u64,
    /// Tokens committed by cycles (accepted + one target token each).
    pub committed: u64,
    /// Histogram of verified draft lengths (index = length).
    pub draft_hist: Vec<u64>,
    /// Histogram of accepted lengths.
    pub accept_hist: Vec<u64>,
    /// Per draft position: how often it was verified and accepted.
    pub pos_verified: Vec<u64>,
    pub pos_accepted: Vec<u64>,
    /// Confidence calibration, per draft position i: cycles that verified
    /// position i with all earlier drafts accepted (i was "reached"), the sum
    /// of the drafter's confidence there (its predicted conditional
    /// acceptance), and how many of those were accepted.
    pub pos_reached: Vec<u64>,
    pub pos_conf_sum: Vec<f64>,
    pub pos_hit: Vec<u64>,
    pub draft_secs: f64,
    pub verify_secs: f64,
    /// Seconds of a one-row forward measured by the scheduler's cost
    /// profile (0 when none ran). Only a fallback for the plain step: the
    /// profile runs once, and the machine's speed drifts after it.
    pub plain_step_secs: f64,
    /// Verify seconds by verified draft length (index as `draft_hist`: the
    /// forward had index + 1 rows). With `draft_hist` this gives the mean
    /// cost of each width as decoding met it, to set against a plain run's
    /// time per token.
    pub width_secs: Vec<f64>,
}

/// Entry `i` of a per-position vector, grown with zeros to reach it.
fn slot<T: Copy + Default>(v: &mut Vec<T>, i: usize) -> &mut T {
    if v.len() <= i {
        v.resize(i + 1, T::default());
    }
    &mut v[i]
}

fn bump(h: &mut Vec<u64>, i: usize) {
    *slot(h, i) += 1;
}

/// `dst += src` elementwise, `dst` grown to `src`'s length.
fn add_into<T: Copy + Default + std::ops::AddAssign>(dst: &mut Vec<T>, src: &[T]) {
    if dst.len() < src.len() {
        dst.resize(src.len(), T::default());
    }
    dst.iter_mut().zip(src).for_each(|(a, &b)| *a += b);
}

impl SpecStats {
    /// Count one cycle.
    pub fn record(&mut self, rec: &CycleRecord) {
        if let Some(&(_, secs)) = rec.profile.iter().find(|p| p.0 == 1) {
            self.plain_step_secs = secs;
        }
        let (proposed, drafted, accepted) = (rec.drafted.len(), rec.plan.verify, rec.verification.accepted);
        self.cycles += 1;
        if drafted == 0 {
            self.plain_cycles += 1;
        }
        self.proposed += proposed as u64;
        self.drafted += drafted as u64;
        self.accepted += accepted as u64;
        self.committed += accepted as u64 + 1;
        bump(&mut self.draft_hist, drafted);
        bump(&mut self.accept_hist, accepted);
        for i in 0..drafted {
            bump(&mut self.pos_verified, i);
            let hit = slot(&mut self.pos_accepted, i);
            if i < accepted {
                *hit += 1;
            }
        }
        self.draft_secs += rec.draft_secs;
        self.verify_secs += rec.verify_secs;
        *slot(&mut self.width_secs, drafted) += rec.verify_secs;
        if !rec.plan.ask.free {
            // calibration statistics of the drafter's own confidences
            let conf = rec.drafted_confidence();
            self.record_confidence(&conf[..drafted.min(conf.len())], accepted);
        }
    }

    /// Mean seconds of the verify forwards of `rows` rows (`rows` ≥ 1), None
    /// when there was none.
    pub fn mean_forward_secs(&self, rows: usize) -> Option<f64> {
        let k = rows.checked_sub(1)?;
        let n = *self.draft_hist.get(k)?;
        (n > 0).then(|| self.width_secs[k] / n as f64)
    }

    /// Record the drafter's confidences for a verified draft of which the
    /// first `accepted` were accepted.
    fn record_confidence(&mut self, confidence: &[f32], accepted: usize) {
        for (i, &c) in confidence.iter().enumerate() {
            if i > accepted {
                break;
            }
            bump(&mut self.pos_reached, i);
            *slot(&mut self.pos_conf_sum, i) += c as f64;
            let hit = slot(&mut self.pos_hit, i);
            if i < accepted {
                *hit += 1;
            }
        }
    }

    /// Per position: (reached, mean predicted confidence, observed
    /// conditional acceptance).
    pub fn calibration(&self) -> Vec<(u64, f64, f64)> {
        (0..self.pos_reached.len())
            .filter(|&i| self.pos_reached[i] > 0)
            .map(|i| {
                let n = self.pos_reached[i] as f64;
                (self.pos_reached[i], self.pos_conf_sum[i] / n, self.pos_hit[i] as f64 / n)
            })
            .collect()
    }

    pub fn acceptance_rate(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }

    pub fn mean_committed(&self) -> f64 {
        if self.cycles == 0 {
            0.0
        } else {
            self.committed as f64 / self.cycles as f64
        }
    }

    /// What a plain decode step costs, as this run measured it: the mean
    /// one-row forward of its plain cycles, else the profile's one-row
    /// forward; None when neither ran (fixed drafting never verifies one
    /// row, and a wider forward is no stand-in for it).
    pub fn plain_step_estimate(&self) -> Option<f64> {
        self.mean_forward_secs(1).or((self.plain_step_secs > 0.0).then_some(self.plain_step_secs))
    }

    /// Time saved against plain decoding of the same tokens at
    /// [`Self::plain_step_estimate`] (negative = lost); None without one.
    pub fn saved_secs(&self) -> Option<f64> {
        let step = self.plain_step_estimate()?;
        Some(self.committed as f64 * step - (self.draft_secs + self.verify_secs))
    }

    pub fn merge(&mut self, o: &SpecStats) {
        self.cycles += o.cycles;
        self.plain_cycles += o.plain_cycles;
        self.proposed += o.proposed;
        self.drafted += o.drafted;
        self.accepted += o.accepted;
        self.committed += o.committed;
        for (dst, src) in [
            (&mut self.draft_hist, &o.draft_hist),
            (&mut self.accept_hist, &o.accept_hist),
            (&mut self.pos_verified, &o.pos_verified),
            (&mut self.pos_accepted, &o.pos_accepted),
            (&mut self.pos_reached, &o.pos_reached),
            (&mut self.pos_hit, &o.pos_hit),
        ] {
            add_into(dst, src);
        }
        add_into(&mut self.pos_conf_sum, &o.pos_conf_sum);
        add_into(&mut self.width_secs, &o.width_secs);
        self.draft_secs += o.draft_secs;
        self.verify_secs += o.verify_secs;
        if self.plain_step_secs == 0.0 {
            self.plain_step_secs = o.plain_step_secs;
        }
    }

    /// The plain step this run measured and the time saved against it, or
    /// why there is no such figure.
    fn plain_step_line(&self) -> String {
        let source = if self.mean_forward_secs(1).is_some() { "mean one-row forward" } else { "profiled one-row forward" };
        match (self.plain_step_estimate(), self.saved_secs()) {
            (Some(step), Some(saved)) => {
                format!("plain step {:.2} ms ({source}), net saved vs plain {:.1} ms", step * 1e3, saved * 1e3)
            }
            _ => "plain step not measured (no one-row forward), net saved vs plain unknown".to_string(),
        }
    }

    /// Multi-line human summary.
    pub fn report(&self) -> String {
        let hist = |h: &[u64]| h.iter().enumerate().map(|(i, c)| format!("{i}:{c}")).collect::<Vec<_>>().join(" ");
        let cal = self.calibration();
        let cal = if cal.is_empty() {
            String::new()
        } else {
            format!(
                "\nspec: confidence calibration per position (reached: predicted/observed) [{}]",
                cal.iter().enumerate().map(|(i, (n, p, o))| format!("{}:{n}: {:.2}/{:.2}", i + 1, p, o)).collect::<Vec<_>>().join(", ")
            )
        };
        let widths = (1..=self.draft_hist.len())
            .filter_map(|w| self.mean_forward_secs(w).map(|t| format!("{w}:{:.2}", t * 1e3)))
            .collect::<Vec<_>>()
            .join(" ");
        let pos = (0..self.pos_verified.len())
            .map(|i| format!("{}:{:.0}%", i + 1, 100.0 * self.pos_accepted[i] as f64 / self.pos_verified[i].max(1) as f64))
            .collect::<Vec<_>>()
            .join(" ");
        format!(
            "spec: cycles {} ({} plain), proposed {}, drafted {}, accepted {} ({:.1}%), mean committed/cycle {:.2}\n\
             spec: draft lengths [{}]\n\
             spec: accepted lengths [{}]\n\
             spec: acceptance per draft position [{}]\n\
             spec: draft {:.1} ms, verify {:.1} ms, {}\n\
             spec: mean ms per verify forward by rows [{}]{}",
            self.cycles,
            self.plain_cycles,
            self.proposed,
            self.drafted,
            self.accepted,
            100.0 * self.acceptance_rate(),
            self.mean_committed(),
            hist(&self.draft_hist),
            hist(&self.accept_hist),
            pos,
            self.draft_secs * 1e3,
            self.verify_secs * 1e3,
            self.plain_step_line(),
            widths,
            cal
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use CycleRecord as C;

    #[test]
    fn verify_time_is_kept_per_width_and_merged() {
        let mut a = SpecStats::default();
        a.record(&C::of_counts(0, 0, 0, 0.0, 0.004));
        a.record(&C::of_counts(0, 0, 0, 0.0, 0.006));
        a.record(&C::of_counts(2, 1, 1, 0.001, 0.007));
        assert_eq!(a.mean_forward_secs(1), Some(0.005));
        assert_eq!(a.mean_forward_secs(2), Some(0.007));
        assert_eq!(a.mean_forward_secs(3), None);
        assert_eq!(a.mean_forward_secs(0), None);
        let mut b = SpecStats::default();
        b.record(&C::of_counts(4, 3, 0, 0.001, 0.012));
        b.record(&C::of_counts(0, 0, 0, 0.0, 0.008));
        a.merge(&b);
        assert!((a.mean_forward_secs(1).unwrap() - 0.006).abs() < 1e-15);
        assert_eq!(a.mean_forward_secs(4), Some(0.012));
        assert_eq!(a.mean_forward_secs(3), None);
        assert!(a.report().contains("spec: mean ms per verify forward by rows [1:6.00 2:7.00 4:12.00]"), "{}", a.report());
    }

    #[test]
    fn plain_step_is_measured_one_row_forwards_or_nothing() {
        // fixed drafting: only 5-row forwards, nothing to price a plain step by
        let mut a = SpecStats::default();
        a.record(&C::of_counts(4, 4, 1, 0.001, 0.011));
        assert_eq!(a.plain_step_estimate(), None);
        assert_eq!(a.saved_secs(), None);
        assert!(a.report().contains("plain step not measured"), "{}", a.report());
        // the profile's one-row forward is the fallback
        a.plain_step_secs = 0.009;
        assert_eq!(a.plain_step_estimate(), Some(0.009));
        assert!(a.report().contains("plain step 9.00 ms (profiled one-row forward)"), "{}", a.report());
        // plain cycles measured later win over the (stale) profile
        a.record(&C::of_counts(0, 0, 0, 0.0, 0.006));
        a.record(&C::of_counts(0, 0, 0, 0.0, 0.008));
        assert_eq!(a.plain_step_estimate(), Some(0.007));
        // 2 + 1 + 1 committed at 7 ms, against 1 ms of drafting and 25 ms of verifies
        let saved = a.saved_secs().unwrap();
        assert!((saved - (4.0 * 0.007 - 0.026)).abs() < 1e-12, "{saved}");
        assert!(a.report().contains("plain step 7.00 ms (mean one-row forward), net saved vs plain 2.0 ms"), "{}", a.report());
    }
}
