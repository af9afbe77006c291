//! One speculative cycle on a target model and its cache.

use std::time::Instant;

use tandem_kernels::ThreadPool;
use tandem_model::{ForwardOutput, KvCache, LogitRows, Model, ModelError};

use crate::cycle::{BatchLoad, CycleRecord, FreeOffer, SpecLog, Verification};
use crate::decoder::Step;
use crate::drafter::{Drafter, Proposal};
use crate::scheduler::{Scheduler, SchedulerConfig};
use crate::stats::SpecStats;
use crate::verify;
use tandem_sampling::Sampler;

/// Timed runs per width when profiling forward costs.
const PROFILE_RUNS: usize = 2;

/// A speculative setting, named for what it sets (front ends name their
/// own flags for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    /// Most tokens drafted per cycle.
    DraftLength,
    /// The n-gram sizes prompt lookup matches.
    LookupNgram,
    /// Chained MTP draft steps per cycle.
    MtpDraftSteps,
    /// The MTP margin below which drafting stops.
    MtpMargin,
    /// DSpark slots per draft pass.
    DSparkBlockSize,
    /// The DSpark confidence threshold that ends a draft.
    DSparkConfidence,
    /// The longest context suffix a suffix tree matches.
    SuffixMatch,
    /// The path probability below which suffix drafting stops.
    SuffixMinProb,
    /// The most tokens the suffix cache holds.
    SuffixCacheTokens,
}

impl std::fmt::Display for Setting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Setting::DraftLength => "draft length",
            Setting::LookupNgram => "lookup n-gram sizes",
            Setting::MtpDraftSteps => "MTP draft steps",
            Setting::MtpMargin => "MTP margin",
            Setting::DSparkBlockSize => "DSpark block size",
            Setting::DSparkConfidence => "DSpark confidence threshold",
            Setting::SuffixMatch => "suffix match length",
            Setting::SuffixMinProb => "suffix minimum path probability",
            Setting::SuffixCacheTokens => "suffix cache size",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// A setting out of its range: `value` (as given) and what it needs.
    #[error("{setting} {value}: {need}")]
    Setting { setting: Setting, value: String, need: String },
    #[error("draft model vocabulary does not match the target: {0}")]
    VocabMismatch(String),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("drafter: {0}")]
    Drafter(String),
    #[error(transparent)]
    SuffixCache(#[from] crate::suffix::SuffixCacheError),
}

impl SpecError {
    /// A setting out of range.
    pub fn setting(setting: Setting, value: impl std::fmt::Display, need: impl Into<String>) -> SpecError {
        SpecError::Setting { setting, value: value.to_string(), need: need.into() }
    }
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
    /// Where each cycle's record goes (`--spec-log`), if anywhere.
    pub log: Option<SpecLog>,
}

impl Default for SpecConfig {
    fn default() -> Self {
        SpecConfig { max_draft: 8, scheduler: SchedulerConfig::default(), opportunistic: false, log: None }
    }
}

/// A cycle drafted and planned ([`Speculator::prepare`]), waiting for the
/// target to evaluate its tokens.
#[derive(Debug, Clone)]
pub struct PendingCycle {
    /// The rows to evaluate: the anchor, then the drafts to verify.
    pub tokens: Vec<u32>,
    /// Committed length before the cycle.
    base: usize,
    /// The record so far (inputs and decisions).
    rec: CycleRecord,
}

/// What [`Speculator::prepare`] decided.
#[derive(Debug, Clone)]
pub enum Prepared {
    /// The generation ends with this step's token: nothing to evaluate.
    Stopped(Step),
    /// Evaluate the cycle's tokens, then finish it.
    Verify(Box<PendingCycle>),
}

/// Drafter + scheduler + statistics, and the target token chosen at the end of
/// the previous cycle but not yet emitted.
pub struct Speculator {
    drafter: Box<dyn Drafter>,
    pub sched: Scheduler,
    /// Statistics of every cycle this speculator ran.
    pub stats: SpecStats,
    cfg: SpecConfig,
    pending: Option<u32>,
    draft: Proposal,
    /// The drafter's free proposal of this cycle (see [`Drafter::propose_free`]).
    free: Proposal,
    out: ForwardOutput,
    /// Hidden taps the drafter asked for (empty: none).
    taps: Vec<tandem_model::HiddenTap>,
    /// Positions whose hidden rows the drafter has been given.
    observed: usize,
    /// The drafter was asked for a proposal in the previous cycle.
    proposed_last: bool,
    /// Cycles run in this generation.
    cycles: u64,
}

impl Speculator {
    pub fn new(drafter: Box<dyn Drafter>, cfg: SpecConfig) -> Result<Self, SpecError> {
        if cfg.max_draft == 0 || cfg.max_draft > crate::MAX_DRAFT {
            return Err(SpecError::setting(Setting::DraftLength, cfg.max_draft, format!("need 1..={}", crate::MAX_DRAFT)));
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
            draft: Proposal::default(),
            free: Proposal::default(),
            out: ForwardOutput::default(),
            taps,
            observed: 0,
            proposed_last: false,
            cycles: 0,
        })
    }

    pub fn drafter_name(&self) -> String {
        self.drafter.name()
    }

    pub fn config(&self) -> &SpecConfig {
        &self.cfg
    }

    /// Send each cycle's record to `log` from now on (None: nowhere).
    pub fn set_log(&mut self, log: Option<SpecLog>) {
        self.cfg.log = log;
    }

    /// Start a generation over `history` (drops any pending token from an
    /// earlier generation).
    pub fn begin(&mut self, history: &[u32]) -> Result<(), SpecError> {
        self.pending = None;
        self.proposed_last = false;
        self.cycles = 0;
        self.observed = self.observed.min(history.len());
        self.drafter.begin(history)
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

    /// The target's logits row `i` of the last cycle's verify forward: the
    /// row its committed draft `i` was chosen from (for log-probabilities).
    pub fn verify_row(&self, i: usize) -> &[f32] {
        self.out.logits_row(i)
    }

    /// Measure the cost of forward passes of a few widths at the current
    /// context (the cache is restored afterwards); returns (width, seconds).
    fn profile(&mut self, model: &Model, pool: &ThreadPool, cache: &mut KvCache, tok: u32) -> Result<Vec<(usize, f64)>, SpecError> {
        let base = cache.len();
        let maxw = (self.cfg.max_draft + 1).min(cache.ctx() - base);
        let mut widths: Vec<usize> = [1, 2, 4, 8, 16].into_iter().filter(|&w| w <= maxw).collect();
        if !widths.contains(&maxw) {
            widths.push(maxw);
        }
        // the fastest of a few runs per width: one preempted sample would
        // otherwise price a width out for many cycles (only widths that are
        // used get re-measured)
        let mut profile = Vec::with_capacity(widths.len());
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
            profile.push((w, best));
        }
        Ok(profile)
    }

    /// Run one cycle. On entry `cache` holds `history` and `logits` are the
    /// target's logits after it; on return (unless the step stopped) both include the
    /// committed tokens. `remaining` is how many more tokens the generation
    /// may emit.
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
    ) -> Result<Step, SpecError> {
        let p = match self.prepare(model, pool, cache, history, logits, sampler, remaining, is_eog, BatchLoad::default())? {
            Prepared::Stopped(step) => return Ok(step),
            Prepared::Verify(p) => p,
        };
        let t1 = Instant::now();
        model.forward(pool, cache, &p.tokens, &LogitRows::All, &self.taps, &mut self.out)?;
        let verify_secs = t1.elapsed().as_secs_f64();
        self.finish(*p, model.cfg.d_model, verify_secs, cache, history, logits, sampler, is_eog)
    }

    /// The first half of a cycle: choose the anchor, draft and plan. The
    /// caller evaluates [`PendingCycle::tokens`] on `cache` (alone, or as one
    /// segment of a batch of several sequences, whose other rows and tokens
    /// `load` describes to the scheduler), then calls
    /// [`finish`](Self::finish) or [`finish_from`](Self::finish_from).
    #[allow(clippy::too_many_arguments)]
    pub fn prepare(
        &mut self,
        model: &Model,
        pool: &ThreadPool,
        cache: &mut KvCache,
        history: &[u32],
        logits: &[f32],
        sampler: &mut Sampler,
        remaining: usize,
        is_eog: &dyn Fn(u32) -> bool,
        load: BatchLoad,
    ) -> Result<Prepared, SpecError> {
        let t = match self.pending.take() {
            Some(t) => t,
            None => sampler.sample(logits),
        };
        if is_eog(t) || remaining <= 1 || cache.len() + 1 > cache.ctx() {
            return Ok(Prepared::Stopped(Step { emitted: vec![t], stopped: true, cycle: None }));
        }
        let mut profile = Vec::new();
        if self.cfg.scheduler.adaptive && !self.sched.has_profile() {
            profile = self.profile(model, pool, cache, t)?;
        }
        self.sched.set_load(load);
        let room = (remaining - 1).min(cache.ctx() - cache.len() - 1).min(self.cfg.max_draft).min(self.drafter.max_draft());

        // the proposal: a free one (lookup) and, if the plan asks, the drafter's
        self.draft.clear();
        self.free.clear();
        let t0 = Instant::now();
        let free_offer = if self.drafter.propose_free(history, t, room, &mut self.free)? {
            self.free.truncate(room);
            Some(FreeOffer { tokens: self.free.tokens.len(), confidence: self.free.confidence.clone() })
        } else {
            None
        };
        let free_secs = t0.elapsed().as_secs_f64();
        // a drafter with only free proposals is offered nothing to draft
        let offered = if self.drafter.proposes() { room } else { 0 };
        let ask = self.sched.ask(offered, free_offer.as_ref().map(|f| (f.tokens, &f.confidence[..])));
        let budget = ask.budget;
        let mut draft_secs = 0.0;
        let mut draft_priced = false;
        if budget.tokens > 0 {
            let t0 = Instant::now();
            let params = sampler.params.clone();
            // a drafter that pays per slot stops where truncation would cut
            let sched = &self.sched;
            self.drafter
                .propose_until(history, t, budget.tokens, &params, sampler.rng(), &mut self.draft, &|c| sched.extends(&budget, c))?;
            draft_secs = t0.elapsed().as_secs_f64();
            // after cycles without a proposal (or a prompt) the drafter first
            // caught up on the positions committed meanwhile; pricing drafts
            // by that would make them dearer the rarer they are, and keep the
            // scheduler from drafting again. The price is what a draft costs
            // while drafting.
            draft_priced = self.proposed_last;
            if draft_priced {
                self.sched.observe_draft(self.draft.tokens.len().min(budget.tokens), draft_secs);
            }
        }
        self.proposed_last = budget.tokens > 0;
        if ask.free {
            std::mem::swap(&mut self.draft, &mut self.free);
            draft_secs = free_secs;
        }
        // the record keeps all the confidences a block drafter gave
        let confidence = self.draft.confidence.clone();
        let head = if self.draft.head == self.draft.confidence { Vec::new() } else { self.draft.head.clone() };
        if !ask.free {
            self.draft.truncate(budget.tokens);
        }
        let drafted = self.draft.tokens.clone();

        // the plan: the verify forward goes over [t, d1..dk]
        let plan = self.sched.plan(ask, drafted.len(), &self.draft.confidence);
        self.draft.truncate(plan.verify);
        let mut tokens = Vec::with_capacity(plan.verify + 1);
        tokens.push(t);
        tokens.extend_from_slice(&self.draft.tokens);
        Ok(Prepared::Verify(Box::new(PendingCycle {
            tokens,
            base: cache.len(),
            rec: CycleRecord {
                anchor: t,
                profile,
                free_offer,
                plan,
                drafted,
                confidence,
                head,
                draft_secs,
                draft_priced,
                load,
                ..Default::default()
            },
        })))
    }

    /// [`finish`](Self::finish) after a batched forward of `out.rows`-many
    /// rows in all: this cycle's rows are rows `row..row + n` of `out`
    /// (n = `p.tokens.len()`, all with logits, the first of them logits row
    /// `logit_row`); the forward had `forward_rows` rows in all.
    #[allow(clippy::too_many_arguments)]
    pub fn finish_from(
        &mut self,
        p: PendingCycle,
        out: &ForwardOutput,
        row: usize,
        logit_row: usize,
        forward_rows: usize,
        d_model: usize,
        verify_secs: f64,
        cache: &mut KvCache,
        history: &mut Vec<u32>,
        logits: &mut Vec<f32>,
        sampler: &mut Sampler,
        is_eog: &dyn Fn(u32) -> bool,
    ) -> Result<Step, SpecError> {
        let n = p.tokens.len();
        let v = out.logits.len() / out.rows.len().max(1);
        let own = &mut self.out;
        own.rows.clear();
        own.rows.extend(0..n);
        own.logits.clear();
        own.logits.extend_from_slice(&out.logits[logit_row * v..(logit_row + n) * v]);
        own.hidden.resize(out.hidden.len(), Vec::new());
        for (dst, src) in own.hidden.iter_mut().zip(&out.hidden) {
            dst.clear();
            dst.extend_from_slice(&src[row * d_model..(row + n) * d_model]);
        }
        let mut p = p;
        p.rec.forward_rows = forward_rows;
        self.finish(p, d_model, verify_secs, cache, history, logits, sampler, is_eog)
    }

    /// The second half of a cycle, once the verify rows are in the
    /// speculator's output: accept, commit (the cache is truncated to the
    /// committed tokens) and learn.
    #[allow(clippy::too_many_arguments)]
    pub fn finish(
        &mut self,
        p: PendingCycle,
        d_model: usize,
        verify_secs: f64,
        cache: &mut KvCache,
        history: &mut Vec<u32>,
        logits: &mut Vec<f32>,
        sampler: &mut Sampler,
        is_eog: &dyn Fn(u32) -> bool,
    ) -> Result<Step, SpecError> {
        let PendingCycle { tokens, base, mut rec } = p;
        let k = rec.plan.verify;
        let verification = self.verify(k, sampler, is_eog);
        let a = verification.committed - 1;
        cache.truncate(base + 1 + a);
        history.extend_from_slice(&tokens[..a + 1]);
        logits.clear();
        logits.extend_from_slice(self.out.logits_row(a));
        self.pending = Some(verification.next);
        self.drafter.sync(history)?;
        if !self.taps.is_empty() {
            // hidden rows of the committed positions base..=base+a
            let slices: Vec<&[f32]> = self.out.hidden.iter().map(|h| &h[..(a + 1) * d_model]).collect();
            self.drafter.observe(base, a + 1, &slices);
            self.observed = base + a + 1;
        }

        self.cycles += 1;
        rec.cycle = self.cycles;
        rec.pos = base;
        rec.verification = verification;
        rec.verify_secs = verify_secs;
        self.drafter.feedback(&rec);
        self.sched.observe_cycle(&rec);
        self.stats.record(&rec);
        if let Some(log) = &self.cfg.log {
            log.write(&rec);
        }
        Ok(Step { emitted: rec.emitted().collect(), stopped: false, cycle: Some(Box::new(rec)) })
    }

    /// The acceptance rule over the verify forward's rows for the first `k`
    /// drafts of `self.draft`.
    fn verify(&self, k: usize, sampler: &mut Sampler, is_eog: &dyn Fn(u32) -> bool) -> Verification {
        let rows: Vec<&[f32]> = (0..=k).map(|i| self.out.logits_row(i)).collect();
        let v = if sampler.params.is_greedy() {
            verify::greedy(&rows, &self.draft.tokens)
        } else if self.cfg.opportunistic {
            verify::opportunistic(&rows, &self.draft.tokens, sampler)
        } else {
            verify::sampled(&rows, &self.draft.tokens, &self.draft.dists, sampler)
        };
        // an accepted end-of-generation token ends the stream there
        let (committed, next) = match self.draft.tokens[..v.accepted].iter().position(|&x| is_eog(x)) {
            Some(j) => (j + 1, self.draft.tokens[j]),
            None => (v.accepted + 1, v.next),
        };
        Verification { accepted: v.accepted, committed, next }
    }
}
