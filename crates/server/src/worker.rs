//! The engine worker: one std thread owns a [`Batch`] of slots, each a
//! sequence with its own KV cache (and speculator), decoded together one
//! forward per step. Requests reach it through a bounded channel and join at
//! the next step while a slot is free; results go back per request through
//! an unbounded channel. Free slots keep their caches and the batch keeps
//! prompt prefixes, so a prompt that extends or shares an earlier one only
//! evaluates its new tokens.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tandem_engine::sampling::{log_softmax_at, top_logprobs};
use tandem_engine::{Batch, BatchConfig, Engine, GenParams, GenStats, Request, SlotEvent, SpecOptions, StopReason};
use tandem_tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::stop::StopFilter;

/// One generation for the worker.
pub struct Job {
    pub prompt: Vec<u32>,
    pub params: GenParams,
    pub stops: Vec<String>,
    /// Some(n): report each token's log-probability and n alternatives.
    pub logprobs: Option<usize>,
    /// Set when the client is gone: the generation stops at the next token.
    pub cancel: Arc<AtomicBool>,
    pub events: UnboundedSender<Event>,
    pub enqueued: Instant,
}

/// What the worker sends back for a job, in order: `Chunk`s, then `Done` or `Error`.
#[derive(Debug)]
pub enum Event {
    /// Text released to the client (stop strings held back and cut), with the
    /// log-probabilities of the tokens whose text it completes.
    Chunk {
        text: String,
        logprobs: Vec<TokenLogprob>,
    },
    Done(Box<Outcome>),
    Error(ApiError),
}

#[derive(Debug, Clone)]
pub struct Alt {
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

#[derive(Debug, Clone)]
pub struct TokenLogprob {
    pub chosen: Alt,
    pub top: Vec<Alt>,
    /// Byte offset of the token's text in the completion.
    pub offset: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// End-of-generation token or a stop string.
    Stop,
    /// max_tokens or the context reached.
    Length,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

/// Per-request speculative figures (the delta of the speculator's counters).
#[derive(Debug, Clone, serde::Serialize)]
pub struct SpecReport {
    pub drafter: String,
    pub cycles: u64,
    pub drafted_tokens: u64,
    pub accepted_tokens: u64,
    pub acceptance_rate: f64,
    /// Tokens committed per verify cycle.
    pub tokens_per_cycle: f64,
}

#[derive(Debug, Clone)]
pub struct Outcome {
    pub finish: Finish,
    pub prompt_tokens: usize,
    /// Prompt tokens reused from the kept KV cache.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    pub queue_time: Duration,
    pub prefill_time: Duration,
    pub decode_time: Duration,
    pub decode_tps: f64,
    pub spec: Option<SpecReport>,
}

/// Shared between the HTTP side and the worker.
pub struct Shared {
    pub metrics: Metrics,
    /// Cancel every generation now (shutdown past its grace period).
    pub abort: AtomicBool,
    /// The worker leaves once the queue is empty (the server has stopped).
    pub exit: AtomicBool,
}

/// How the worker batches.
#[derive(Debug, Clone)]
pub struct BatchSettings {
    pub slots: usize,
    pub ctx: usize,
    pub prefill_chunk: usize,
    pub kv_budget: usize,
}

/// A request running in a slot, and what its text filter holds back.
struct Running {
    job: Job,
    queue_time: Duration,
    filter: StopFilter,
    /// Tokens whose log-probabilities wait for their text to be released.
    held: Vec<(usize, usize, TokenLogprob)>,
    hit_stop: bool,
    /// The client was told to stop (cancel sent to the batch).
    cancelling: bool,
}

impl Running {
    fn new(job: Job) -> Running {
        Running {
            queue_time: job.enqueued.elapsed(),
            filter: StopFilter::new(job.stops.clone()),
            held: Vec::new(),
            hit_stop: false,
            cancelling: false,
            job,
        }
    }

    /// Log-probabilities whose text is released (before a stop, a token
    /// is released once all its text is; at a stop, every token that
    /// contributed text before the cut is).
    fn release(&mut self, upto: usize, stopped: bool) -> Vec<TokenLogprob> {
        let n = self.held.iter().take_while(|(s, e, _)| if stopped { *s < upto } else { *e <= upto }).count();
        let out = self.held.drain(..n).map(|x| x.2).collect();
        if stopped {
            self.held.clear();
        }
        out
    }

    /// A token: filter its text, stream what is released; false ends the
    /// generation (a stop string, or the client is gone).
    fn on_token(&mut self, tok: &Tokenizer, id: u32, text: &str, row: &[f32], abort: bool) -> bool {
        let want = self.job.logprobs;
        if let (Some(n), false) = (want, id == u32::MAX || row.is_empty()) {
            let alt = |t: u32, lp: f32| {
                let b = tok.token_bytes(t);
                let s = if b.is_empty() { tok.token_str(t).to_string() } else { String::from_utf8_lossy(b).into_owned() };
                Alt { token: s, bytes: b.to_vec(), logprob: lp }
            };
            let lp = log_softmax_at(row, &[id])[0];
            let top = if n > 0 { top_logprobs(row, n).into_iter().map(|(t, l)| alt(t, l)).collect() } else { vec![] };
            let start = self.filter.pushed();
            self.held.push((start, start + text.len(), TokenLogprob { chosen: alt(id, lp), top, offset: start }));
        }
        let r = self.filter.push(text);
        let lps = if want.is_some() { self.release(self.filter.released(), r.stopped) } else { vec![] };
        if (!r.text.is_empty() || !lps.is_empty()) && self.job.events.send(Event::Chunk { text: r.text, logprobs: lps }).is_err() {
            return false;
        }
        if r.stopped {
            self.hit_stop = true;
            return false;
        }
        !(self.job.cancel.load(Ordering::Relaxed) || abort)
    }
}

pub struct Worker {
    engine: Arc<Engine>,
    settings: BatchSettings,
    spec_opts: SpecOptions,
    batch: Batch,
    running: Vec<Option<Running>>,
    shared: Arc<Shared>,
}

/// The job queue's sender, the worker thread, and the drafter's name when speculating.
pub type Spawned = (SyncSender<Job>, std::thread::JoinHandle<()>, Option<String>);

/// Start the worker thread; the returned sender holds at most `max_queue` waiting jobs.
pub fn spawn(
    engine: Arc<Engine>,
    settings: BatchSettings,
    spec_opts: SpecOptions,
    max_queue: usize,
    shared: Arc<Shared>,
) -> Result<Spawned, crate::ServerError> {
    let batch = new_batch(&engine, &settings, &spec_opts)?;
    let drafter = batch.drafter_name();
    if let Some(d) = &drafter {
        let _ = shared.metrics.drafter.set(d.clone());
    }
    if let Some(c) = &spec_opts.suffix {
        let _ = shared.metrics.suffix.set(c.clone());
    }
    shared.metrics.slots.store(settings.slots as i64, Ordering::Relaxed);
    let (tx, rx) = std::sync::mpsc::sync_channel::<Job>(max_queue);
    let running = (0..settings.slots).map(|_| None).collect();
    let mut w = Worker { engine, settings, spec_opts, batch, running, shared };
    let h = std::thread::Builder::new().name("tandem-engine".into()).spawn(move || w.run(rx))?;
    Ok((tx, h, drafter))
}

fn new_batch(engine: &Arc<Engine>, st: &BatchSettings, spec: &SpecOptions) -> Result<Batch, tandem_engine::EngineError> {
    let cfg = BatchConfig { slots: st.slots, ctx: st.ctx, prefill_chunk: st.prefill_chunk, kv_budget: st.kv_budget };
    Batch::new(engine.clone(), cfg, spec)
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

impl Worker {
    fn run(&mut self, rx: Receiver<Job>) {
        let shared = self.shared.clone();
        let m = &shared.metrics;
        let mut disconnected = false;
        loop {
            // admit waiting jobs while slots are free (wait for one when idle)
            while !disconnected && self.batch.free_slots() > 0 {
                let job = if self.batch.is_idle() {
                    match rx.recv_timeout(Duration::from_millis(100)) {
                        Ok(job) => job,
                        Err(RecvTimeoutError::Timeout) => break,
                        Err(RecvTimeoutError::Disconnected) => {
                            disconnected = true;
                            break;
                        }
                    }
                } else {
                    match rx.try_recv() {
                        Ok(job) => job,
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) => {
                            disconnected = true;
                            break;
                        }
                    }
                };
                m.queue_depth.fetch_sub(1, Ordering::Relaxed);
                self.admit(job);
            }
            if self.batch.is_idle() {
                if disconnected || (shared.exit.load(Ordering::Relaxed) && m.queue_depth.load(Ordering::Relaxed) <= 0) {
                    break;
                }
                continue;
            }
            // clients gone or shutdown: their slots free at this step
            let abort = shared.abort.load(Ordering::Relaxed);
            for (i, r) in self.running.iter_mut().enumerate() {
                if let Some(r) = r {
                    if !r.cancelling && (abort || r.job.cancel.load(Ordering::Relaxed) || r.job.events.is_closed()) {
                        r.cancelling = true;
                        self.batch.cancel(i);
                    }
                }
            }
            let tok = self.engine.tokenizer.clone();
            let running = &mut self.running;
            let spec_opts = &self.spec_opts;
            let res = std::panic::catch_unwind(AssertUnwindSafe(|| {
                self.batch.step(&mut |slot, ev| handle(running, slot, ev, &tok, &shared, spec_opts))
            }));
            match res {
                Ok(r) if r.rows > 0 => {
                    m.steps.fetch_add(1, Ordering::Relaxed);
                    m.step_rows.fetch_add(r.rows as u64, Ordering::Relaxed);
                    m.step_sequences.fetch_add(r.sequences as u64, Ordering::Relaxed);
                    m.step_us.fetch_add((r.secs * 1e6) as u64, Ordering::Relaxed);
                }
                Ok(_) => {}
                Err(p) => {
                    let msg = panic_message(&*p);
                    tracing::error!("engine panicked: {msg}");
                    for r in self.running.iter_mut() {
                        if let Some(r) = r.take() {
                            m.failed.fetch_add(1, Ordering::Relaxed);
                            let _ = r.job.events.send(Event::Error(ApiError::internal(format!("internal error in the engine: {msg}"))));
                        }
                    }
                    self.reset();
                }
            }
            let ps = self.batch.prefix_stats();
            m.busy.store(self.batch.busy() as i64, Ordering::Relaxed);
            m.prefix_hits.store(ps.hits, Ordering::Relaxed);
            m.kept_prefixes.store(ps.kept as i64, Ordering::Relaxed);
            m.kept_bytes.store(ps.kept_bytes as i64, Ordering::Relaxed);
            m.live_bytes.store(ps.live_bytes as i64, Ordering::Relaxed);
        }
        tracing::info!("engine worker stopped");
    }

    /// Give a job a slot, or answer it at once.
    fn admit(&mut self, job: Job) {
        let m = &self.shared.metrics;
        if job.cancel.load(Ordering::Relaxed) || job.events.is_closed() {
            m.cancelled.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if self.shared.abort.load(Ordering::Relaxed) {
            let _ = job.events.send(Event::Error(ApiError::shutting_down()));
            m.cancelled.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let req = Request { prompt: job.prompt.clone(), params: job.params.clone(), with_rows: job.logprobs.is_some() };
        let r = Running::new(job);
        m.queue_wait_us.fetch_add(r.queue_time.as_micros() as u64, Ordering::Relaxed);
        m.admitted.fetch_add(1, Ordering::Relaxed);
        match std::panic::catch_unwind(AssertUnwindSafe(|| self.batch.admit(req))) {
            Ok(Ok(slot)) => {
                self.running[slot] = Some(r);
                m.busy.store(self.batch.busy() as i64, Ordering::Relaxed);
            }
            Ok(Err(e)) => {
                let e = match e {
                    tandem_engine::EngineError::PromptTooLong { .. } | tandem_engine::EngineError::EmptyPrompt => {
                        ApiError::bad_request(e.to_string())
                    }
                    e => ApiError::internal(format!("engine error: {e}")),
                };
                m.failed.fetch_add(1, Ordering::Relaxed);
                let _ = r.job.events.send(Event::Error(e));
            }
            Err(p) => {
                let msg = panic_message(&*p);
                tracing::error!("engine panicked: {msg}");
                m.failed.fetch_add(1, Ordering::Relaxed);
                let _ = r.job.events.send(Event::Error(ApiError::internal(format!("internal error in the engine: {msg}"))));
                self.reset();
            }
        }
    }

    /// Fresh slots after a failure (the old state may be inconsistent); the
    /// generations running are answered with an error first.
    fn reset(&mut self) {
        for r in self.running.iter_mut() {
            if let Some(r) = r.take() {
                self.shared.metrics.failed.fetch_add(1, Ordering::Relaxed);
                let _ = r.job.events.send(Event::Error(ApiError::internal("internal error in the engine")));
            }
        }
        match new_batch(&self.engine, &self.settings, &self.spec_opts) {
            Ok(b) => self.batch = b,
            Err(e) => tracing::error!("could not rebuild the batch, keeping the old one: {e}"),
        }
    }
}

/// One event of the batch for the request in `slot`.
fn handle(running: &mut [Option<Running>], slot: usize, ev: SlotEvent, tok: &Tokenizer, shared: &Shared, spec: &SpecOptions) -> bool {
    let m = &shared.metrics;
    match ev {
        SlotEvent::Token { id, text, row } => match running[slot].as_mut() {
            Some(r) => r.on_token(tok, id, text, row, shared.abort.load(Ordering::Relaxed)),
            None => false,
        },
        SlotEvent::Done(stats) => {
            if let Some(r) = running[slot].take() {
                // the suffix cache keeps what this request wrote, if asked to
                spec.persist();
                // the gauge drops before the client hears the end
                m.busy.fetch_sub(1, Ordering::Relaxed);
                let (last, to) = outcome(r, &stats, shared);
                let _ = to.send(last);
            }
            true
        }
        SlotEvent::Failed(e) => {
            if let Some(r) = running[slot].take() {
                m.busy.fetch_sub(1, Ordering::Relaxed);
                m.failed.fetch_add(1, Ordering::Relaxed);
                let _ = r.job.events.send(Event::Error(ApiError::internal(format!("engine error: {e}"))));
            }
            true
        }
    }
}

/// The final event of a finished generation (Done, or an Error for a
/// cancelled one), after the held-back text; and where it goes.
fn outcome(mut r: Running, stats: &GenStats, shared: &Shared) -> (Event, UnboundedSender<Event>) {
    let m = &shared.metrics;
    let events = r.job.events.clone();
    let reused = stats.prompt_tokens - stats.prefill_tokens;
    m.prompt_tokens.fetch_add(stats.prompt_tokens as u64, Ordering::Relaxed);
    m.cached_tokens.fetch_add(reused as u64, Ordering::Relaxed);
    m.generated_tokens.fetch_add(stats.gen_tokens as u64, Ordering::Relaxed);
    m.prefill_us.fetch_add(stats.prefill_time.as_micros() as u64, Ordering::Relaxed);
    m.decode_us.fetch_add(stats.decode_time.as_micros() as u64, Ordering::Relaxed);
    m.decode_steps.fetch_add(stats.gen_tokens.saturating_sub(1) as u64, Ordering::Relaxed);
    let spec = stats.spec.as_ref().map(|st| {
        m.spec_cycles.fetch_add(st.cycles, Ordering::Relaxed);
        m.spec_drafted.fetch_add(st.drafted, Ordering::Relaxed);
        m.spec_accepted.fetch_add(st.accepted, Ordering::Relaxed);
        SpecReport {
            drafter: shared.metrics.drafter.get().cloned().unwrap_or_default(),
            cycles: st.cycles,
            drafted_tokens: st.drafted,
            accepted_tokens: st.accepted,
            acceptance_rate: st.acceptance_rate(),
            tokens_per_cycle: st.mean_committed(),
        }
    });
    let stop = stats.stop.unwrap_or(StopReason::Length);
    let finish = match stop {
        _ if r.hit_stop => Finish::Stop,
        StopReason::Eog => Finish::Stop,
        StopReason::Length | StopReason::Context => Finish::Length,
        StopReason::Cancelled => {
            m.cancelled.fetch_add(1, Ordering::Relaxed);
            let e = if shared.abort.load(Ordering::Relaxed) {
                ApiError::shutting_down()
            } else {
                ApiError::bad_request("cancelled: the client disconnected")
            };
            return (Event::Error(e), events);
        }
    };
    if !r.hit_stop {
        let text = r.filter.finish();
        let lps = r.release(usize::MAX, false);
        if !text.is_empty() || !lps.is_empty() {
            let _ = events.send(Event::Chunk { text, logprobs: lps });
        }
    }
    let tps = stats.decode_tps();
    m.last_decode_mtps.store((tps * 1e3) as u64, Ordering::Relaxed);
    m.completed.fetch_add(1, Ordering::Relaxed);
    let out = Outcome {
        finish,
        prompt_tokens: stats.prompt_tokens,
        cached_tokens: reused,
        completion_tokens: stats.gen_tokens,
        queue_time: r.queue_time,
        prefill_time: stats.prefill_time,
        decode_time: stats.decode_time,
        decode_tps: tps,
        spec,
    };
    tracing::info!(
        "generation: {} prompt tokens ({} cached), {} generated, queued {:.0} ms, prefill {:.0} ms, decode {:.1} tok/s, finish {}",
        out.prompt_tokens,
        out.cached_tokens,
        out.completion_tokens,
        out.queue_time.as_secs_f64() * 1e3,
        out.prefill_time.as_secs_f64() * 1e3,
        tps,
        finish.as_str()
    );
    (Event::Done(Box::new(out)), events)
}
