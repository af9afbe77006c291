//! Per-generation speculative statistics.

use serde::Serialize;

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
    pub draft_secs: f64,
    pub verify_secs: f64,
    /// Measured seconds of a one-position forward (a plain decode step).
    pub plain_step_secs: f64,
}

fn bump(h: &mut Vec<u64>, i: usize) {
    if h.len() <= i {
        h.resize(i + 1, 0);
    }
    h[i] += 1;
}

impl SpecStats {
    pub fn record(&mut self, proposed: usize, drafted: usize, accepted: usize, draft_secs: f64, verify_secs: f64) {
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
            if self.pos_accepted.len() <= i {
                self.pos_accepted.resize(i + 1, 0);
            }
            if i < accepted {
                self.pos_accepted[i] += 1;
            }
        }
        self.draft_secs += draft_secs;
        self.verify_secs += verify_secs;
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

    /// Time saved against plain decoding of the same tokens (negative = lost).
    pub fn saved_secs(&self) -> f64 {
        self.committed as f64 * self.plain_step_secs - (self.draft_secs + self.verify_secs)
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
        ] {
            if dst.len() < src.len() {
                dst.resize(src.len(), 0);
            }
            dst.iter_mut().zip(src).for_each(|(a, b)| *a += b);
        }
        self.draft_secs += o.draft_secs;
        self.verify_secs += o.verify_secs;
        if self.plain_step_secs == 0.0 {
            self.plain_step_secs = o.plain_step_secs;
        }
    }

    /// Multi-line human summary.
    pub fn report(&self) -> String {
        let hist = |h: &[u64]| h.iter().enumerate().map(|(i, c)| format!("{i}:{c}")).collect::<Vec<_>>().join(" ");
        format!(
            "spec: cycles {} ({} plain), proposed {}, drafted {}, accepted {} ({:.1}%), mean committed/cycle {:.2}\n\
             spec: draft lengths [{}]\n\
             spec: accepted lengths [{}]\n\
             spec: draft {:.1} ms, verify {:.1} ms, plain step {:.2} ms, net saved vs plain {:.1} ms",
            self.cycles,
            self.plain_cycles,
            self.proposed,
            self.drafted,
            self.accepted,
            100.0 * self.acceptance_rate(),
            self.mean_committed(),
            hist(&self.draft_hist),
            hist(&self.accept_hist),
            self.draft_secs * 1e3,
            self.verify_secs * 1e3,
            self.plain_step_secs * 1e3,
            self.saved_secs() * 1e3
        )
    }
}
