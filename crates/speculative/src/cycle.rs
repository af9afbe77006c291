//! The speculative cycle as values.
//!
//! A cycle goes [`Proposal`](crate::Proposal) (what the drafter offers) →
//! [`CyclePlan`] (how much of it to verify: a pure decision of the
//! scheduler's policy over its cost model and calibration) →
//! [`Verification`] (one target forward and the acceptance rule) →
//! [`CycleRecord`] (everything the cycle decided, measured and committed).
//! The record is what the scheduler, the drafter, the statistics, the
//! `--spec-log` file and the server learn from; it is serialisable, so a
//! logged run can be replayed through the scheduler and its plans checked.

use std::io::Write;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::scheduler::Budget;

/// The decision made before drafting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ask {
    /// Most draft tokens the cycle had room for.
    pub offered: usize,
    /// Tokens of the free proposal (a lookup in front of a model drafter)
    /// worth verifying; 0 when there was none or it did not pay.
    pub free_len: usize,
    /// The free proposal is verified: the drafter is not asked.
    pub free: bool,
    /// What the drafter is asked for.
    pub budget: Budget,
}

/// How much of the proposal to verify.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CyclePlan {
    pub ask: Ask,
    /// Draft tokens verified (the forward has `verify + 1` rows).
    pub verify: usize,
}

/// What the target's forward and the acceptance rule decided.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verification {
    /// Draft tokens the acceptance rule accepted (a prefix).
    pub accepted: usize,
    /// Tokens committed: the anchor and the accepted drafts, up to and
    /// including an accepted end-of-generation token.
    pub committed: usize,
    /// The target's token after the committed ones (the correction, or the
    /// bonus token), emitted first by the next cycle.
    pub next: u32,
}

/// The rest of a batched forward that a cycle's verify rows join: the
/// rows of other sequences (decode, verify and prompt rows) and the tokens
/// the other sequences are expected to commit with it. The scheduler
/// prices a cycle as its share of that forward, so drafting backs off as
/// the batch fills. Zero when the sequence runs alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct BatchLoad {
    pub rows: usize,
    pub tokens: f64,
}

impl BatchLoad {
    /// No other sequence in the forward.
    pub fn is_alone(&self) -> bool {
        self.rows == 0
    }
}

/// A free proposal as the plan saw it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FreeOffer {
    pub tokens: usize,
    pub confidence: Vec<f32>,
}

/// One cycle, whole: its inputs, decisions, measurements and outcome, at
/// full precision.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CycleRecord {
    /// 1 for a generation's first cycle.
    pub cycle: u64,
    /// Committed length before the cycle (the anchor's position).
    pub pos: usize,
    /// The target's token the drafts follow (emitted by this cycle).
    pub anchor: u32,
    /// Forward costs measured before this cycle's plan (width, seconds):
    /// the start-up profile, in the first cycle.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub profile: Vec<(usize, f64)>,
    /// The free proposal the drafter made this cycle, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_offer: Option<FreeOffer>,
    pub plan: CyclePlan,
    /// The proposal verified from: the drafter's after the budget's cut
    /// (or the free proposal), before the plan's cut.
    pub drafted: Vec<u32>,
    /// Its confidences as the drafter gave them, before the budget's cut.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub confidence: Vec<f32>,
    /// A DSpark drafter's confidence head, where the scheduler was given
    /// other confidences.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub head: Vec<f32>,
    /// Seconds the proposal took.
    pub draft_secs: f64,
    /// The proposal's cost was given to the cost model (not when it
    /// included catching up on positions committed while it was not asked).
    #[serde(default, skip_serializing_if = "is_false")]
    pub draft_priced: bool,
    pub verification: Verification,
    /// Seconds of the verify forward (of the whole batch, when it ran in one).
    pub verify_secs: f64,
    /// The other sequences' part of the forward (none when alone).
    #[serde(default, skip_serializing_if = "BatchLoad::is_alone")]
    pub load: BatchLoad,
    /// Rows of the whole forward the verify ran in, when it ran beside
    /// other sequences (0: alone, `plan.verify + 1` rows).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub forward_rows: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl CycleRecord {
    /// A record of a cycle that proposed, verified and accepted so many
    /// drafts in these times, and nothing else (statistics are built from
    /// these fields alone).
    pub fn of_counts(proposed: usize, verified: usize, accepted: usize, draft_secs: f64, verify_secs: f64) -> CycleRecord {
        let mut c = CycleRecord { drafted: vec![0; proposed], draft_secs, verify_secs, ..Default::default() };
        c.plan.verify = verified;
        c.verification.accepted = accepted;
        c.verification.committed = accepted + 1;
        c
    }

    /// Tokens the cycle emitted, in order: the anchor, then the committed drafts.
    pub fn emitted(&self) -> impl Iterator<Item = u32> + '_ {
        std::iter::once(self.anchor).chain(self.drafted[..self.verification.committed - 1].iter().copied())
    }

    /// The drafter's confidences of the tokens it proposed (after the budget's cut).
    pub fn drafted_confidence(&self) -> &[f32] {
        &self.confidence[..self.confidence.len().min(self.drafted.len())]
    }
}

/// Where cycle records go: JSON lines to stderr or a file, or kept in
/// memory (tests, tools). Clones share the sink.
#[derive(Clone)]
pub enum SpecLog {
    Stderr,
    File(Arc<Mutex<std::io::LineWriter<std::fs::File>>>),
    Memory(Arc<Mutex<Vec<CycleRecord>>>),
}

impl std::fmt::Debug for SpecLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SpecLog::Stderr => "SpecLog::Stderr",
            SpecLog::File(_) => "SpecLog::File",
            SpecLog::Memory(_) => "SpecLog::Memory",
        })
    }
}

impl SpecLog {
    /// JSON lines to `path` (created or truncated); `-` is stderr.
    pub fn create(path: &std::path::Path) -> std::io::Result<SpecLog> {
        if path.as_os_str() == "-" {
            return Ok(SpecLog::Stderr);
        }
        let f = std::fs::File::create(path)?;
        Ok(SpecLog::File(Arc::new(Mutex::new(std::io::LineWriter::new(f)))))
    }

    /// Records kept in memory; read them with [`SpecLog::records`].
    pub fn memory() -> SpecLog {
        SpecLog::Memory(Arc::default())
    }

    /// Records kept so far (memory logs), taking them out.
    pub fn take_records(&self) -> Vec<CycleRecord> {
        match self {
            SpecLog::Memory(m) => std::mem::take(&mut *m.lock().unwrap_or_else(|e| e.into_inner())),
            _ => Vec::new(),
        }
    }

    /// Write one record. A log that cannot be written is reported on stderr
    /// and decoding goes on.
    pub fn write(&self, rec: &CycleRecord) {
        let line = || serde_json::to_string(rec).unwrap_or_default();
        let res = match self {
            SpecLog::Stderr => writeln!(std::io::stderr().lock(), "{}", line()),
            SpecLog::File(f) => writeln!(f.lock().unwrap_or_else(|e| e.into_inner()), "{}", line()),
            SpecLog::Memory(m) => {
                m.lock().unwrap_or_else(|e| e.into_inner()).push(rec.clone());
                Ok(())
            }
        };
        if let Err(e) = res {
            tracing::warn!("spec log: {e}");
        }
    }
}

/// Read a JSON-lines file of cycle records (blank lines skipped).
pub fn read_records(text: &str) -> Result<Vec<CycleRecord>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| format!("line {}: {e}", i + 1)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_through_json_at_full_precision() {
        let rec = CycleRecord {
            cycle: 3,
            pos: 17,
            anchor: 42,
            profile: vec![(1, 0.001_234_567_890_123), (2, 0.001_5)],
            free_offer: Some(FreeOffer { tokens: 2, confidence: vec![0.1f32 / 3.0, 0.7] }),
            plan: CyclePlan {
                ask: Ask { offered: 8, free_len: 1, free: false, budget: Budget { tokens: 4, probe: true, ..Budget::default() } },
                verify: 1,
            },
            drafted: vec![5, 6, 7, 8],
            confidence: vec![0.9, 1.0 / 3.0, 0.2, 0.1, 0.05],
            head: vec![],
            draft_secs: 1e-4 / 7.0,
            draft_priced: true,
            verification: Verification { accepted: 1, committed: 2, next: 9 },
            verify_secs: 2.0 / 3.0 * 1e-3,
            load: BatchLoad { rows: 7, tokens: 7.5 },
            forward_rows: 9,
        };
        let line = serde_json::to_string(&rec).unwrap();
        let back = read_records(&format!("{line}\n\n{line}\n")).unwrap();
        assert_eq!(back, vec![rec.clone(), rec.clone()]);
        assert_eq!(rec.emitted().collect::<Vec<_>>(), vec![42, 5]);
        assert_eq!(rec.drafted_confidence().len(), 4);
        assert!(read_records("{\"cycle\": 1}\n").unwrap_err().starts_with("line 1:"));
    }
}
