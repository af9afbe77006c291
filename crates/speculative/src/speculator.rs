//! One speculative cycle on a target model and its cache.

use std::time::Instant;

use tandem_kernels::ThreadPool;
use tandem_model::{ForwardOutput, KvCache, LogitRows, Model, ModelError};

use crate::drafter::{Draft, Drafter};
use crate::sampling::Sampler;
use crate::scheduler::{Scheduler, SchedulerConfig};
use crate::stats::SpecStats;
use crate::verify;

/// Timed runs per width when profiling forward costs.
const PROFILE_RUNS: usize = 2;

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("{0}")]
    BadOption(String),
    #[error("draft model vocabulary does not match the target: {0}")]
    VocabMismatch(String),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("drafter: {0}")]
    Drafter(String),
}

/// One cycle's proposal, as recorded by [`Speculator::record_drafts`].
#[derive(Debug, Clone, PartialEq)]
pub struct CycleDraft {
    /// Position of the anchor (the committed length before the cycle).
    pub pos: usize,
    /// The target's token the drafts follow.
    pub anchor: u32,
    pub tokens: Vec<u32>,
    pub confidence: Vec<f32>,
    /// A free (lookup) proposal rather than the drafter's.
    pub free: bool,
}

/// Speculation settings.
#[derive(Debug, Clone)]
pub struct SpecConfig {
    /// Most tokens drafted per cycle.
    pub max_draft: usize,
    /// Scheduler settings (adaptive length by default).
    pub scheduler: SchedulerConfig,
    /// ds4's faster, NOT distribution-exact acceptance at temperature > 0.
    pub opportunistic: bool,
    /// Print one line per cycle on stderr.
    pub log: bool,
}

impl Default for SpecConfig {
    fn default() -> Self {
        SpecConfig {
            max_draft: 8,
            scheduler: SchedulerConfig::default(),
            opportunistic: false,
            log: std::env::var("TANDEM_SPEC_LOG").map(|v| v == "1").unwrap_or(false),
        }
    }
}

/// Drafter + scheduler + statistics, and the target token chosen at the end of
/// the previous cycle but not yet emitted.
pub struct Speculator {
    drafter: Box<dyn Drafter>,
    pub sched: Scheduler,
    pub stats: SpecStats,
    cfg: SpecConfig,
    pending: Option<u32>,
    draft: Draft,
    /// The drafter's free proposal of this cycle (see [`Drafter::propose_free`]).
    free: Draft,
    out: ForwardOutput,
    /// When tracing: the logits each emitted token was chosen from.
    trace: Option<Vec<Vec<f32>>>,
    /// When recording: every cycle's proposal (see [`Speculator::record_drafts`]).
    drafts: Option<Vec<CycleDraft>>,
    /// Hidden taps the drafter asked for (empty: none).
    taps: Vec<tandem_model::HiddenTap>,
    /// Positions whose hidden rows the drafter has been given.
    observed: usize,
    /// The drafter was asked for a proposal in the previous cycle.
    proposed_last: bool,
}

impl Speculator {
    pub fn new(drafter: Box<dyn Drafter>, cfg: SpecConfig) -> Result<Self, SpecError> {
        if cfg.max_draft == 0 || cfg.max_draft > crate::MAX_DRAFT {
            return Err(SpecError::BadOption(format!("draft length {}: need 1..={}", cfg.max_draft, crate::MAX_DRAFT)));
        }
        let mut sched = Scheduler::new(cfg.scheduler.clone(), cfg.max_draft + 1);
        sched.set_fixed_draft_cost(drafter.fixed_cost());
        let taps = drafter.taps();
        Ok(Speculator {
            drafter,
            sched,
            stats: SpecStats::default(),
            cfg,
            pending: None,
            draft: Draft::default(),
            free: Draft::default(),
            out: ForwardOutput::default(),
            trace: None,
            drafts: None,
            taps,
            observed: 0,
            proposed_last: false,
        })
    }

    pub fn drafter_name(&self) -> String {
        self.drafter.name()
    }

    pub fn config(&self) -> &SpecConfig {
        &self.cfg
    }

    /// Record, for every emitted token, the logits row it was chosen from
    /// (for `verify-spec`).
    pub fn trace(&mut self, on: bool) {
        self.trace = on.then(Vec::new);
    }

    pub fn take_trace(&mut self) -> Vec<Vec<f32>> {
        self.trace.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Record every cycle's proposal (position, anchor, drafted tokens and
    /// confidences, before the scheduler's cut): tests check that a
    /// proposal depends only on the committed text, not on the rejected
    /// drafts before it.
    pub fn record_drafts(&mut self, on: bool) {
        self.drafts = on.then(Vec::new);
    }

    pub fn take_drafts(&mut self) -> Vec<CycleDraft> {
        self.drafts.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Start a generation over `history` (drops any pending token from an
    /// earlier generation).
    pub fn begin(&mut self, history: &[u32]) -> Result<(), SpecError> {
        self.pending = None;
        self.proposed_last = false;
        self.observed = self.observed.min(history.len());
        self.drafter.sync(history)
    }

    /// Hidden taps the drafter needs for every committed position.
    pub fn taps(&self) -> &[tandem_model::HiddenTap] {
        &self.taps
    }

    /// How many leading positions the drafter has hidden rows for; a session
    /// must not reuse cached positions beyond this without re-evaluating them.
    pub fn observed(&self) -> usize {
        if self.taps.is_empty() {
            usize::MAX
        } else {
            self.observed
        }
    }

    /// Hand the drafter hidden rows of positions `start..start + rows` (from a
    /// prefill); `hidden` holds one `rows × d` matrix per tap.
    pub fn observe(&mut self, start: usize, rows: usize, hidden: &[Vec<f32>]) {
        if self.taps.is_empty() || rows == 0 {
            return;
        }
        let d = hidden[0].len() / rows;
        let slices: Vec<&[f32]> = hidden.iter().map(|h| &h[..rows * d]).collect();
        self.drafter.observe(start, rows, &slices);
        self.observed = start + rows;
    }

    /// Measure the cost of forward passes of a few widths at the current
    /// context (the cache is restored afterwards).
    fn profile(&mut self, model: &Model, pool: &ThreadPool, cache: &mut KvCache, tok: u32) -> Result<(), SpecError> {
        let base = cache.len();
        let maxw = (self.cfg.max_draft + 1).min(cache.ctx() - base);
        let mut widths: Vec<usize> = [1, 2, 4, 8, 16].into_iter().filter(|&w| w <= maxw).collect();
        if !widths.contains(&maxw) {
            widths.push(maxw);
        }
        // the fastest of a few runs per width: one preempted sample would
        // otherwise price a width out for many cycles (only widths that are
        // used get re-measured)
        for &w in &widths {
            let toks = vec![tok; w];
            let mut best = f64::INFINITY;
            for _ in 0..PROFILE_RUNS {
                let t0 = Instant::now();
                model.forward(pool, cache, &toks, &LogitRows::All, &[], &mut self.out)?;
                best = best.min(t0.elapsed().as_secs_f64());
                cache.truncate(base);
            }
            self.sched.observe_verify(w, best);
        }
        if self.cfg.log {
            let c: Vec<String> = widths.iter().map(|&w| format!("{w}:{:.2}", self.sched.verify_cost(w) * 1e3)).collect();
            eprintln!("spec profile ms per forward by width [{}]", c.join(" "));
        }
        Ok(())
    }

    /// Run one cycle. On entry `cache` holds `history` and `logits` are the
    /// target's logits after it. Appends the emitted tokens to `emitted`
    /// (1 + accepted). Returns false when the first token was emitted without
    /// being evaluated (end of generation, token budget or context reached): the
    /// caller must stop.
    #[allow(clippy::too_many_arguments)]
    pub fn cycle(
        &mut self,
        model: &Model,
        pool: &ThreadPool,
        cache: &mut KvCache,
        history: &mut Vec<u32>,
        logits: &mut Vec<f32>,
        sampler: &mut Sampler,
        remaining: usize,
        is_eog: &dyn Fn(u32) -> bool,
        emitted: &mut Vec<u32>,
    ) -> Result<bool, SpecError> {
        let t = match self.pending.take() {
            Some(t) => t,
            None => sampler.sample(logits),
        };
        emitted.push(t);
        if let Some(tr) = &mut self.trace {
            tr.push(logits.clone());
        }
        if is_eog(t) || remaining <= 1 || cache.len() + 1 > cache.ctx() {
            return Ok(false);
        }
        if self.cfg.scheduler.adaptive && !self.sched.has_profile() {
            self.profile(model, pool, cache, t)?;
            self.stats.plain_step_secs = self.sched.verify_cost(1);
        }
        let room = (remaining - 1).min(cache.ctx() - cache.len() - 1).min(self.cfg.max_draft).min(self.drafter.max_draft());
        self.draft.clear();
        let mut draft_secs = 0.0;
        let t0 = Instant::now();
        // a free proposal (lookup) worth verifying: the length that pays
        self.free.clear();
        let mut free_k = 0;
        if self.drafter.propose_free(history, t, room, &mut self.free)? {
            self.free.truncate(room);
            free_k = self.sched.truncate_free(self.free.tokens.len(), &self.free.confidence);
        }
        let free_secs = t0.elapsed().as_secs_f64();
        // it replaces the drafter's proposal when it beats what the drafter
        // is priced at, and a plain step when the drafter is not asked
        let first = free_k > 0 && self.sched.free_beats_drafter(free_k, &self.free.confidence, room);
        let budget = if first { 0 } else { self.sched.budget(room) };
        if budget > 0 {
            let t0 = Instant::now();
            let params = sampler.params.clone();
            // a drafter that pays per slot stops where truncation would cut
            let sched = &self.sched;
            self.drafter.propose_until(history, t, budget, &params, sampler.rng(), &mut self.draft, &|c| sched.extends(c))?;
            draft_secs = t0.elapsed().as_secs_f64();
            // all the confidences a block drafter gave, before the budget cut
            self.sched.observe_proposal(&self.draft.confidence, budget);
            self.draft.truncate(budget);
            // after cycles without a proposal (or a prompt) the drafter first
            // caught up on the positions committed meanwhile; pricing drafts
            // by that would make them dearer the rarer they are, and keep the
            // scheduler from drafting again (BENCHMARKS.md §6h). The price is
            // what a draft costs while drafting.
            if self.proposed_last {
                self.sched.observe_draft(self.draft.tokens.len(), draft_secs);
            }
        }
        self.proposed_last = budget > 0;
        let free = budget == 0 && free_k > 0;
        if free {
            std::mem::swap(&mut self.draft, &mut self.free);
            draft_secs = free_secs;
        }
        let proposed = self.draft.tokens.len();
        if let Some(rec) = &mut self.drafts {
            rec.push(CycleDraft {
                pos: cache.len(),
                anchor: t,
                tokens: self.draft.tokens.clone(),
                confidence: self.draft.confidence.clone(),
                free,
            });
        }
        let k = if free { free_k } else { self.sched.truncate(proposed, &self.draft.confidence) };
        let conf_log = if self.cfg.log {
            let list = |name: &str, v: &[f32]| {
                let c: Vec<String> = v.iter().map(|c| format!("{c:.2}")).collect();
                if v.is_empty() {
                    String::new()
                } else {
                    format!(" {name}=[{}]", c.join(","))
                }
            };
            // a DSpark head's own confidences, where the scheduler was given others
            let head = if self.draft.head == self.draft.confidence { &[][..] } else { &self.draft.head[..] };
            list("conf", &self.draft.confidence) + &list("head", head)
        } else {
            String::new()
        };
        if k < proposed && !free && !self.draft.confidence.is_empty() {
            self.sched.observe_unverified(k, &self.draft.confidence);
        }
        self.draft.truncate(k);

        let base = cache.len();
        let mut toks = Vec::with_capacity(k + 1);
        toks.push(t);
        toks.extend_from_slice(&self.draft.tokens);
        let t1 = Instant::now();
        model.forward(pool, cache, &toks, &LogitRows::All, &self.taps, &mut self.out)?;
        let verify_secs = t1.elapsed().as_secs_f64();
        self.sched.observe_verify(k + 1, verify_secs);

        let rows: Vec<&[f32]> = (0..=k).map(|i| self.out.logits_row(i)).collect();
        let v = if sampler.params.is_greedy() {
            verify::greedy(&rows, &self.draft.tokens)
        } else if self.cfg.opportunistic {
            verify::opportunistic(&rows, &self.draft.tokens, sampler)
        } else {
            verify::sampled(&rows, &self.draft.tokens, &self.draft.dists, sampler)
        };
        let (mut a, mut next) = (v.accepted, v.next);
        // an accepted end-of-generation token ends the stream there
        if let Some(j) = self.draft.tokens[..a].iter().position(|&x| is_eog(x)) {
            a = j;
            next = self.draft.tokens[j];
        }
        cache.truncate(base + 1 + a);
        history.push(t);
        history.extend_from_slice(&self.draft.tokens[..a]);
        logits.clear();
        logits.extend_from_slice(rows[a]);
        emitted.extend_from_slice(&self.draft.tokens[..a]);
        if let Some(tr) = &mut self.trace {
            tr.extend(rows[..a].iter().map(|r| r.to_vec()));
        }
        self.pending = Some(next);

        self.drafter.sync(history)?;
        if !self.taps.is_empty() {
            // hidden rows of the committed positions base..=base+a
            let d = model.cfg.d_model;
            let slices: Vec<&[f32]> = self.out.hidden.iter().map(|h| &h[..(a + 1) * d]).collect();
            self.drafter.observe(base, a + 1, &slices);
            self.observed = base + a + 1;
        }
        // statistics count what verification accepted (an accepted end token
        // included), even when the commit stops at that end token
        self.drafter.feedback(k, v.accepted);
        // the scheduler's estimates describe the drafter it prices; a free
        // proposal's confidences are already measured acceptance
        if k > 0 && !free {
            self.sched.observe_acceptance(k, v.accepted);
            self.sched.observe_confidence(&self.draft.confidence, v.accepted);
        }
        self.sched.end_cycle(k > 0 && !free);
        self.stats.record(proposed, k, v.accepted, draft_secs, verify_secs);
        if !free {
            // calibration statistics of the drafter's own confidences
            self.stats.record_confidence(&self.draft.confidence, v.accepted);
        }
        if self.cfg.log {
            eprintln!(
                "spec cycle={} pos={base}{} drafted={proposed} cut={} verified={k} accepted={a} committed={}{conf_log} draft={:?} next={next} draft_ms={:.2} verify_ms={:.2}",
                self.stats.cycles,
                if free { " free" } else { "" },
                proposed - k,
                a + 1,
                self.draft.tokens,
                draft_secs * 1e3,
                verify_secs * 1e3
            );
        }
        Ok(true)
    }
}
