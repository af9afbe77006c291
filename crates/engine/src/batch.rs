//! Continuous batching: several sequences decoded together, one forward per
//! step over the rows of all of them.
//!
//! Each slot holds a [`Session`] (a KV cache and the tokens in it) and, when
//! speculating, its own [`Speculator`]. A step gathers one segment per busy
//! slot — the next token of a plain decoder, the anchor and drafts of a
//! speculative cycle, or a chunk of a prompt — and evaluates all of them in
//! one [`Model::forward_batch`](tandem_model::Model::forward_batch). Every
//! row has the bits it would have alone, so a request's output does not
//! depend on what else is in the batch.
//!
//! Prompts are evaluated in chunks of [`PREFILL_CHUNK`] tokens when nothing
//! else runs. While other sequences decode, a step takes as many prompt
//! tokens (at most `prefill_chunk`) as fit in [`PREFILL_STEP_SHARE`] of a
//! decode-only step, priced by a cost measured as steps run: a prompt row
//! costs its matmuls plus attention over the positions before it, so rows
//! deep in a long prompt cost more and fewer are taken per step.
//!
//! Prompt prefixes are kept across requests: a free slot keeps what it last
//! held, and what a slot would lose when it takes a new request is kept in
//! a store of prefixes (least recently used first out), within the K/V
//! budget that live sequences and kept prefixes share.

use std::sync::Arc;
use std::time::Instant;

use tandem_model::{ForwardOutput, HiddenTap, KvCache, Segment, SegmentLogits};
use tandem_speculative::{BatchLoad, PendingCycle, Prepared, SpecStats, Speculator};
use tandem_tokenizer::StreamDecoder;

use crate::sampling::Sampler;
use crate::session::{Engine, EngineError, GenParams, GenStats, Session, StopReason, PREFILL_CHUNK};
use crate::speculation::SpecOptions;

/// A prefix shorter than this is not worth keeping when its slot moves on.
pub const MIN_KEPT_PREFIX: usize = 32;

/// Most prompt tokens per step while other sequences decode, by default.
pub const DEFAULT_PREFILL_CHUNK: usize = 64;

/// While other sequences decode, prompt rows may add at most this share of
/// a decode-only step's time to a step: their inter-token time stays
/// within (1 + share) of what it is without the prompt.
pub const PREFILL_STEP_SHARE: f64 = 0.8;

/// Weight of a new step in the moving averages of step costs.
const STEP_EMA: f64 = 0.2;

#[derive(Debug, Clone)]
pub struct BatchConfig {
    /// Sequences decoded together.
    pub slots: usize,
    /// Context of each sequence.
    pub ctx: usize,
    /// Prompt tokens evaluated per step while other sequences decode.
    pub prefill_chunk: usize,
    /// Bytes of K/V rows held in all: live sequences plus kept prefixes
    /// (kept prefixes are evicted to stay under it).
    pub kv_budget: usize,
}

/// A generation to run in a slot.
#[derive(Debug, Clone)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub params: GenParams,
    /// Hand each token's logits row to the caller (for log-probabilities).
    pub with_rows: bool,
}

/// What a step reports for a slot.
#[derive(Debug)]
pub enum SlotEvent<'a> {
    /// A token and its decoded text (never half a UTF-8 character), with
    /// the logits row it was chosen from when asked for. The final flush
    /// of held-back text comes as id `u32::MAX` with an empty row. The
    /// callback returns false to end the generation (cancelled).
    Token { id: u32, text: &'a str, row: &'a [f32] },
    /// The generation ended; the slot is free.
    Done(Box<GenStats>),
    /// The generation failed; the slot is free (and emptied).
    Failed(EngineError),
}

/// What one step did.
#[derive(Debug, Clone, Copy, Default)]
pub struct StepReport {
    /// Rows of the forward (0: no forward ran).
    pub rows: usize,
    /// Sequences with rows in it.
    pub sequences: usize,
    /// Of the rows, prompt rows.
    pub prefill_rows: usize,
    pub secs: f64,
}

/// Prefix reuse so far.
#[derive(Debug, Clone, Copy, Default)]
pub struct PrefixStats {
    /// Prefixes kept outside the slots.
    pub kept: usize,
    /// Bytes of their K/V rows.
    pub kept_bytes: usize,
    /// Bytes of K/V rows held by the slots.
    pub live_bytes: usize,
    /// Requests that reused a cached prefix, and the tokens they reused.
    pub hits: u64,
    pub hit_tokens: u64,
}

enum Phase {
    /// Prompt tokens `prompt[..done]` are in the cache.
    Prefill,
    Decode,
}

struct Seq {
    prompt: Vec<u32>,
    params: GenParams,
    with_rows: bool,
    sampler: Sampler,
    dec: StreamDecoder,
    phase: Phase,
    stats: GenStats,
    admitted: Instant,
    decode_start: Instant,
    /// Admission order (prompts are evaluated in it).
    order: u64,
    cancelled: bool,
    /// Rows and committed tokens of its last step (what the scheduler of
    /// another slot expects from it in the next).
    last_rows: usize,
    last_tokens: f64,
}

struct Slot {
    session: Session,
    spec: Option<Speculator>,
    seq: Option<Seq>,
    /// When the slot last finished a generation (free slots keep their
    /// cache; the least recently used is taken first).
    used: u64,
}

struct Kept {
    tokens: Vec<u32>,
    cache: KvCache,
    used: u64,
}

/// This step's work for one slot.
enum Work {
    /// A plain decoder's token, emitted, to evaluate.
    Plain(u32),
    /// A speculative cycle to verify, and the logits its anchor came from.
    Spec(Box<PendingCycle>, Option<Vec<f32>>),
    /// Prompt tokens `from..from + n`.
    Prefill { from: usize, n: usize },
}

/// Several sequences decoded together (see the module documentation).
pub struct Batch {
    engine: Arc<Engine>,
    cfg: BatchConfig,
    slots: Vec<Slot>,
    kept: Vec<Kept>,
    taps: Vec<HiddenTap>,
    out: ForwardOutput,
    clock: u64,
    hits: u64,
    hit_tokens: u64,
    /// Seconds of a step without prompt rows (moving average).
    decode_secs: Option<f64>,
    /// Seconds per unit of prompt work beside decode rows (moving average).
    unit_secs: Option<f64>,
    /// Position at which a prompt row's attention costs as much as its
    /// matmuls (see [`prompt_units`]).
    attn_even: f64,
}

/// Work of prompt rows `p..p + n`, in units of one row's matmuls: each row
/// costs its matmuls (1) plus attention over its position (`pos / even`).
fn prompt_units(p: usize, n: usize, even: f64) -> f64 {
    n as f64 * (1.0 + (p as f64 + n as f64 / 2.0) / even)
}

impl Batch {
    /// `cfg.slots` sessions, each with its own speculator when `spec` asks
    /// for speculation.
    pub fn new(engine: Arc<Engine>, cfg: BatchConfig, spec: &SpecOptions) -> Result<Batch, EngineError> {
        let mut slots = Vec::with_capacity(cfg.slots);
        let mut taps = Vec::new();
        for _ in 0..cfg.slots.max(1) {
            let sp = engine.speculator(spec, cfg.ctx)?;
            if let Some(s) = &sp {
                taps = s.taps().to_vec();
            }
            slots.push(Slot { session: engine.new_session(cfg.ctx), spec: sp, seq: None, used: 0 });
        }
        let c = &engine.model.cfg;
        let row_macs = c.d_model * (c.q_dim() + 2 * c.kv_dim()) + c.q_dim() * c.d_model + 3 * c.d_model * c.ffn;
        let attn_even = row_macs as f64 / (2 * c.n_head * c.head_dim) as f64;
        Ok(Batch {
            engine,
            cfg,
            slots,
            kept: Vec::new(),
            taps,
            out: ForwardOutput::default(),
            clock: 0,
            hits: 0,
            hit_tokens: 0,
            decode_secs: None,
            unit_secs: None,
            attn_even,
        })
    }

    pub fn config(&self) -> &BatchConfig {
        &self.cfg
    }

    /// The drafter's name when speculating.
    pub fn drafter_name(&self) -> Option<String> {
        self.slots[0].spec.as_ref().map(|s| s.drafter_name())
    }

    /// Slots without a generation.
    pub fn free_slots(&self) -> usize {
        self.slots.iter().filter(|s| s.seq.is_none()).count()
    }

    /// Slots with a generation.
    pub fn busy(&self) -> usize {
        self.slots.len() - self.free_slots()
    }

    pub fn is_idle(&self) -> bool {
        self.busy() == 0
    }

    /// End the generation in `slot` at the next step (reported as cancelled).
    pub fn cancel(&mut self, slot: usize) {
        if let Some(s) = self.slots.get_mut(slot).and_then(|s| s.seq.as_mut()) {
            s.cancelled = true;
        }
    }

    pub fn prefix_stats(&self) -> PrefixStats {
        PrefixStats {
            kept: self.kept.len(),
            kept_bytes: self.kept.iter().map(|k| k.cache.bytes_reserved()).sum(),
            live_bytes: self.slots.iter().map(|s| s.session.cache.bytes_reserved()).sum(),
            hits: self.hits,
            hit_tokens: self.hit_tokens,
        }
    }

    /// Start a generation in a free slot (the one that already holds the
    /// longest prefix of the prompt); returns the slot. Its prompt is
    /// evaluated by the next steps, after what is reused.
    pub fn admit(&mut self, req: Request) -> Result<usize, EngineError> {
        let ctx = self.cfg.ctx;
        if req.prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if req.prompt.len() > ctx {
            return Err(EngineError::PromptTooLong { prompt: req.prompt.len(), ctx });
        }
        self.engine.check_tokens(&req.prompt)?;
        let prompt = req.prompt;
        let shared = |a: &[u32]| a.iter().zip(&prompt).take_while(|(x, y)| x == y).count();
        let Some(i) = (0..self.slots.len())
            .filter(|&i| self.slots[i].seq.is_none())
            .max_by_key(|&i| (shared(&self.slots[i].session.tokens), std::cmp::Reverse(self.slots[i].used)))
        else {
            return Err(EngineError::Model(tandem_model::ModelError::BadConfig("no free slot".into())));
        };
        self.clock += 1;
        let clock = self.clock;
        let own = shared(&self.slots[i].session.tokens);
        // a longer kept prefix (not for drafters that need hidden rows of
        // every position: they did not see the kept one evaluated)
        // (a split model's followers hold only the sequences they saw)
        let split = self.engine.model.is_split();
        let best =
            if self.taps.is_empty() && !split { self.kept.iter().map(|k| shared(&k.tokens)).max().filter(|&n| n > own) } else { None };
        let slot = &mut self.slots[i];
        let held = slot.session.tokens.len();
        if held >= MIN_KEPT_PREFIX && own < held && !split {
            // what this slot holds beyond the shared part would be lost
            let tokens = slot.session.tokens.clone();
            let cache = slot.session.cache.prefix(held);
            self.kept.retain(|k| !tokens.starts_with(&k.tokens));
            if !self.kept.iter().any(|k| k.tokens.starts_with(&tokens)) {
                self.kept.push(Kept { tokens, cache, used: clock });
            }
        }
        let slot = &mut self.slots[i];
        let mut common = own;
        if let Some(n) = best {
            if let Some(k) = self.kept.iter_mut().filter(|k| shared(&k.tokens) == n).max_by_key(|k| k.used) {
                slot.session.cache.copy_prefix_from(&k.cache, n);
                // a sliding-window cache may hold less than asked
                let n = slot.session.cache.len();
                slot.session.tokens.clear();
                slot.session.tokens.extend_from_slice(&prompt[..n]);
                slot.session.logits.clear();
                k.used = clock;
                common = n;
            }
        }
        if let Some(sp) = slot.spec.as_mut() {
            sp.begin(&prompt[..common])?;
            common = common.min(sp.observed());
        }
        let s = &mut slot.session;
        // at least one token is evaluated, for fresh logits
        let ready = common == prompt.len() && common == s.tokens.len() && !s.logits.is_empty();
        if !ready && common == prompt.len() {
            common -= 1;
        }
        if !ready {
            s.truncate(common);
            if s.tokens.len() < common {
                // a sliding-window cache could not go back that far
                common = s.tokens.len();
                if let Some(sp) = slot.spec.as_mut() {
                    sp.begin(&prompt[..common])?;
                }
            }
        }
        if common > 0 {
            self.hits += 1;
            self.hit_tokens += common as u64;
        }
        let now = Instant::now();
        let stats = GenStats { prompt_tokens: prompt.len(), prefill_tokens: prompt.len() - common, ..Default::default() };
        let mut seq = Seq {
            sampler: Sampler::new(req.params.sampler.clone()),
            params: req.params,
            with_rows: req.with_rows,
            dec: StreamDecoder::new(),
            phase: Phase::Prefill,
            stats,
            admitted: now,
            decode_start: now,
            order: clock,
            cancelled: false,
            last_rows: 1,
            last_tokens: 1.0,
            prompt,
        };
        if ready {
            seq.phase = Phase::Decode;
            if let Some(sp) = slot.spec.as_mut() {
                sp.begin(&slot.session.tokens)?;
            }
        }
        if slot.spec.is_some() {
            seq.stats.spec = Some(SpecStats::default());
        }
        slot.seq = Some(seq);
        self.enforce_budget();
        Ok(i)
    }

    /// Evict kept prefixes, least recently used first, until live and kept
    /// rows fit the budget.
    fn enforce_budget(&mut self) {
        let live: usize = self.slots.iter().map(|s| s.session.cache.bytes_reserved()).sum();
        let mut kept: usize = self.kept.iter().map(|k| k.cache.bytes_reserved()).sum();
        while live + kept > self.cfg.kv_budget && !self.kept.is_empty() {
            let (j, _) = self.kept.iter().enumerate().min_by_key(|(_, k)| k.used).expect("not empty");
            kept -= self.kept.swap_remove(j).cache.bytes_reserved();
        }
    }

    /// One step: every busy slot advances (a decode step, a speculative
    /// cycle or a prompt chunk) in one forward; `on_event(slot, event)`
    /// hears its tokens and, when it ends, its result.
    pub fn step(&mut self, on_event: &mut dyn FnMut(usize, SlotEvent) -> bool) -> StepReport {
        let engine = self.engine.clone();
        let tok = engine.tokenizer.clone();
        let is_eog = |id: u32| tok.is_eog(id);
        let n = self.slots.len();

        // cancelled and exhausted generations end first
        for i in 0..n {
            let end = match &self.slots[i].seq {
                Some(s) if s.cancelled => Some(StopReason::Cancelled),
                Some(s) if matches!(s.phase, Phase::Decode) && s.stats.gen_tokens >= s.params.max_tokens => Some(StopReason::Length),
                _ => None,
            };
            if let Some(r) = end {
                self.finish(i, r, on_event);
            }
        }

        // prompt chunks, in admission order, within the step's prompt budget
        let decoding = self.slots.iter().filter(|s| matches!(s.seq.as_ref().map(|q| &q.phase), Some(Phase::Decode))).count();
        let cap = if decoding == 0 { PREFILL_CHUNK.max(self.cfg.prefill_chunk) } else { self.cfg.prefill_chunk.max(1) };
        let mut budget = cap;
        // beside decode rows: the prompt work that fits the step's share
        let mut work_left = match (decoding, self.decode_secs, self.unit_secs) {
            (0, _, _) => f64::INFINITY,
            (_, Some(d), Some(u)) if u > 0.0 => PREFILL_STEP_SHARE * d / u,
            // not measured yet: a small chunk, to measure
            _ => prompt_units(0, cap.min(8), self.attn_even),
        };
        let mut prompt_work = 0.0;
        let mut work: Vec<Option<Work>> = (0..n).map(|_| None).collect();
        let mut prefilling: Vec<(u64, usize)> =
            (0..n).filter_map(|i| self.slots[i].seq.as_ref().filter(|q| matches!(q.phase, Phase::Prefill)).map(|q| (q.order, i))).collect();
        prefilling.sort();
        let mut prefill_rows = 0;
        for &(_, i) in &prefilling {
            if budget == 0 {
                break;
            }
            let s = &self.slots[i];
            let q = s.seq.as_ref().expect("prefilling");
            let from = s.session.tokens.len();
            let mut take = (q.prompt.len() - from).min(budget);
            while take > 1 && prompt_units(from, take, self.attn_even) > work_left {
                take = take * 3 / 4;
            }
            if prefill_rows > 0 && prompt_units(from, take, self.attn_even) > work_left {
                break;
            }
            let units = prompt_units(from, take, self.attn_even);
            work_left -= units;
            prompt_work += units;
            budget -= take;
            prefill_rows += take;
            work[i] = Some(Work::Prefill { from, n: take });
        }

        // decode rows: what the others put in the forward, as far as known
        let others = |work: &[Option<Work>], slots: &[Slot], me: usize| -> BatchLoad {
            let mut load = BatchLoad::default();
            for (j, s) in slots.iter().enumerate() {
                if j == me {
                    continue;
                }
                match (&work[j], &s.seq) {
                    (Some(Work::Prefill { n, .. }), _) => load.rows += n,
                    (Some(Work::Plain(_)), _) => {
                        load.rows += 1;
                        load.tokens += 1.0;
                    }
                    (Some(Work::Spec(p, _)), _) => {
                        load.rows += p.tokens.len();
                        load.tokens += s.seq.as_ref().map_or(1.0, |q| q.last_tokens);
                    }
                    (None, Some(q)) if matches!(q.phase, Phase::Decode) => {
                        load.rows += q.last_rows;
                        load.tokens += q.last_tokens;
                    }
                    _ => {}
                }
            }
            load
        };
        let mut ended: Vec<(usize, StopReason)> = Vec::new();
        let mut failed: Vec<(usize, EngineError)> = Vec::new();
        for i in 0..n {
            let decode = matches!(self.slots[i].seq.as_ref().map(|q| &q.phase), Some(Phase::Decode));
            if !decode {
                continue;
            }
            let load = others(&work, &self.slots, i);
            let slot = &mut self.slots[i];
            let q = slot.seq.as_mut().expect("decoding");
            let remaining = q.params.max_tokens - q.stats.gen_tokens;
            let s = &mut slot.session;
            match slot.spec.as_mut() {
                None => {
                    let t = q.sampler.sample(&s.logits);
                    let row = if q.with_rows { s.logits.clone() } else { Vec::new() };
                    let stopped = is_eog(t) || remaining <= 1 || s.cache.len() + 1 > s.cache.ctx();
                    match emit(q, &tok, i, &[t], &[row], stopped, s.tokens.len() >= s.ctx(), on_event) {
                        Some(r) => ended.push((i, r)),
                        None => work[i] = Some(Work::Plain(t)),
                    }
                }
                Some(sp) => {
                    let entry = q.with_rows.then(|| s.logits.clone());
                    let (model, pool) = (&engine.model, &engine.pool);
                    let r = sp.prepare(model, pool, &mut s.cache, &s.tokens, &s.logits, &mut q.sampler, remaining, &is_eog, load);
                    match r {
                        Ok(Prepared::Stopped(step)) => {
                            let rows = vec![entry.unwrap_or_default()];
                            let r = emit(q, &tok, i, &step.emitted, &rows, true, true, on_event).unwrap_or(StopReason::Context);
                            ended.push((i, r));
                        }
                        Ok(Prepared::Verify(p)) => work[i] = Some(Work::Spec(p, entry)),
                        Err(e) => failed.push((i, e.into())),
                    }
                }
            }
        }
        for (i, r) in ended {
            self.finish(i, r, on_event);
        }
        for (i, e) in failed.drain(..) {
            self.fail(i, e, on_event);
        }

        // the forward over every slot's segment
        let order: Vec<usize> = (0..n).filter(|&i| work[i].is_some()).collect();
        if order.is_empty() {
            self.enforce_budget();
            return StepReport::default();
        }
        let seg_tokens: Vec<(Vec<u32>, SegmentLogits)> = order
            .iter()
            .map(|&i| {
                let s = &self.slots[i];
                match work[i].as_ref().expect("work") {
                    Work::Plain(t) => (vec![*t], SegmentLogits::All),
                    Work::Spec(p, _) => (p.tokens.clone(), SegmentLogits::All),
                    Work::Prefill { from, n } => {
                        let q = s.seq.as_ref().expect("prefilling");
                        let last = from + n == q.prompt.len();
                        (q.prompt[*from..from + n].to_vec(), if last { SegmentLogits::Last } else { SegmentLogits::None })
                    }
                }
            })
            .collect();
        let segs: Vec<Segment> = seg_tokens.iter().map(|(t, l)| Segment { tokens: t, logits: *l }).collect();
        let rows: usize = seg_tokens.iter().map(|(t, _)| t.len()).sum();
        let t0 = Instant::now();
        let res = {
            let mut caches: Vec<&mut KvCache> = Vec::with_capacity(order.len());
            let mut it = order.iter().peekable();
            for (i, s) in self.slots.iter_mut().enumerate() {
                if it.peek() == Some(&&i) {
                    it.next();
                    caches.push(&mut s.session.cache);
                }
            }
            engine.model.forward_batch(&engine.pool, &mut caches, &segs, &self.taps, &mut self.out)
        };
        let secs = t0.elapsed().as_secs_f64();
        if let Err(e) = res {
            let msg = e.to_string();
            for &i in &order {
                self.fail(i, EngineError::Model(tandem_model::ModelError::BadConfig(msg.clone())), on_event);
            }
            return StepReport { rows, sequences: order.len(), prefill_rows, secs };
        }

        // what steps cost, for the next steps' prompt chunks
        let decode_rows = rows - prefill_rows;
        if prefill_rows == 0 {
            self.decode_secs = Some(self.decode_secs.map_or(secs, |d| (1.0 - STEP_EMA) * d + STEP_EMA * secs));
        } else if decode_rows > 0 {
            if let Some(d) = self.decode_secs {
                let per = (secs - d).max(0.0) / prompt_work.max(1e-9);
                self.unit_secs = Some(self.unit_secs.map_or(per, |u| (1.0 - STEP_EMA) * u + STEP_EMA * per));
            }
        }

        // each slot takes its rows
        let d = engine.model.cfg.d_model;
        let (mut row, mut lrow) = (0, 0);
        let mut ended: Vec<(usize, StopReason)> = Vec::new();
        for (&i, (toks, kind)) in order.iter().zip(&seg_tokens) {
            let nrows = toks.len();
            let nlog = match kind {
                SegmentLogits::All => nrows,
                SegmentLogits::Last => 1,
                SegmentLogits::None => 0,
            };
            let w = work[i].take().expect("work");
            let slot = &mut self.slots[i];
            let q = slot.seq.as_mut().expect("busy");
            let s = &mut slot.session;
            match w {
                Work::Plain(t) => {
                    s.tokens.push(t);
                    s.logits.clear();
                    s.logits.extend_from_slice(self.out.logits_row(lrow));
                    q.last_rows = 1;
                    q.last_tokens = 1.0;
                    if s.tokens.len() >= s.ctx() {
                        ended.push((i, StopReason::Context));
                    }
                }
                Work::Spec(p, entry) => {
                    let sp = slot.spec.as_mut().expect("speculating");
                    let r = sp.finish_from(
                        *p,
                        &self.out,
                        row,
                        lrow,
                        rows,
                        d,
                        secs,
                        &mut s.cache,
                        &mut s.tokens,
                        &mut s.logits,
                        &mut q.sampler,
                        &is_eog,
                    );
                    match r {
                        Ok(step) => {
                            if let (Some(st), Some(rec)) = (&mut q.stats.spec, &step.cycle) {
                                st.record(rec);
                            }
                            q.last_rows = nrows;
                            q.last_tokens = step.emitted.len() as f64;
                            let mut rowv: Vec<Vec<f32>> = Vec::new();
                            if q.with_rows {
                                rowv.push(entry.unwrap_or_default());
                                rowv.extend((1..step.emitted.len()).map(|k| sp.verify_row(k - 1).to_vec()));
                            }
                            let full = s.tokens.len() >= s.ctx();
                            if let Some(r) = emit(q, &tok, i, &step.emitted, &rowv, step.stopped, full, on_event) {
                                ended.push((i, r));
                            }
                        }
                        Err(e) => failed.push((i, e.into())),
                    }
                }
                Work::Prefill { from, n } => {
                    s.tokens.extend_from_slice(&q.prompt[from..from + n]);
                    if let Some(sp) = slot.spec.as_mut() {
                        if !self.taps.is_empty() {
                            let hs: Vec<Vec<f32>> = self.out.hidden.iter().map(|h| h[row * d..(row + n) * d].to_vec()).collect();
                            sp.observe(from, n, &hs);
                        }
                    }
                    if from + n == q.prompt.len() {
                        s.logits.clear();
                        s.logits.extend_from_slice(self.out.logits_row(lrow));
                        q.phase = Phase::Decode;
                        q.stats.prefill_time = q.admitted.elapsed();
                        q.decode_start = Instant::now();
                        if let Some(sp) = slot.spec.as_mut() {
                            if let Err(e) = sp.begin(&s.tokens) {
                                failed.push((i, e.into()));
                            }
                        }
                    }
                }
            }
            row += nrows;
            lrow += nlog;
        }
        for (i, r) in ended {
            self.finish(i, r, on_event);
        }
        for (i, e) in failed {
            self.fail(i, e, on_event);
        }
        self.enforce_budget();
        StepReport { rows, sequences: order.len(), prefill_rows, secs }
    }

    /// End the generation in slot `i`: flush held-back text, report.
    fn finish(&mut self, i: usize, reason: StopReason, on_event: &mut dyn FnMut(usize, SlotEvent) -> bool) {
        let slot = &mut self.slots[i];
        let Some(mut q) = slot.seq.take() else { return };
        let rest = q.dec.flush();
        if !rest.is_empty() && reason != StopReason::Cancelled {
            on_event(i, SlotEvent::Token { id: u32::MAX, text: &rest, row: &[] });
        }
        if matches!(q.phase, Phase::Prefill) {
            q.stats.prefill_time = q.admitted.elapsed();
        } else {
            q.stats.decode_time = q.decode_start.elapsed();
        }
        q.stats.stop = Some(reason);
        self.clock += 1;
        slot.used = self.clock;
        // a prompt cut short leaves its evaluated part, which is still exact
        on_event(i, SlotEvent::Done(Box::new(q.stats)));
    }

    /// The generation in slot `i` failed: its state may be inconsistent, so
    /// the slot starts afresh.
    fn fail(&mut self, i: usize, e: EngineError, on_event: &mut dyn FnMut(usize, SlotEvent) -> bool) {
        let slot = &mut self.slots[i];
        if slot.seq.take().is_none() {
            return;
        }
        slot.session.reset();
        on_event(i, SlotEvent::Failed(e));
    }

    /// Every generation ends as failed (after a panic in the engine) and the
    /// slots start afresh.
    pub fn fail_all(&mut self, why: &str, on_event: &mut dyn FnMut(usize, SlotEvent) -> bool) {
        for i in 0..self.slots.len() {
            self.fail(i, EngineError::Model(tandem_model::ModelError::BadConfig(why.to_string())), on_event);
        }
    }
}

/// Hand emitted tokens to the caller as a session's generation does;
/// returns why the generation ends, if it does. `stopped`: the last token
/// was not evaluated (the generation cannot go on); `full`: the context is.
#[allow(clippy::too_many_arguments)]
fn emit(
    q: &mut Seq,
    tok: &tandem_tokenizer::Tokenizer,
    slot: usize,
    emitted: &[u32],
    rows: &[Vec<f32>],
    stopped: bool,
    full: bool,
    on_event: &mut dyn FnMut(usize, SlotEvent) -> bool,
) -> Option<StopReason> {
    for (k, &next) in emitted.iter().enumerate() {
        q.stats.gen_tokens += 1;
        if tok.is_eog(next) {
            return Some(StopReason::Eog);
        }
        let text = q.dec.push(tok, next);
        let row: &[f32] = rows.get(k).map_or(&[], |r| r.as_slice());
        if !on_event(slot, SlotEvent::Token { id: next, text: &text, row }) {
            return Some(StopReason::Cancelled);
        }
        if q.stats.gen_tokens >= q.params.max_tokens {
            return Some(StopReason::Length);
        }
    }
    if stopped || full {
        return Some(StopReason::Context);
    }
    None
}
