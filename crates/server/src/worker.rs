//! The engine worker: one std thread owns the session (its KV cache is kept
//! between requests, so a prompt that extends the last conversation only
//! evaluates the new tokens) and the speculator. Requests reach it through a
//! bounded channel; results go back per request through an unbounded channel.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tandem_engine::sampling::{log_softmax_at, top_logprobs};
use tandem_engine::{Engine, GenParams, Session, SpecOptions, Speculator, StopReason};
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

pub struct Worker {
    engine: Arc<Engine>,
    ctx: usize,
    spec_opts: SpecOptions,
    session: Session,
    spec: Option<Speculator>,
    shared: Arc<Shared>,
}

/// The job queue's sender, the worker thread, and the drafter's name when speculating.
pub type Spawned = (SyncSender<Job>, std::thread::JoinHandle<()>, Option<String>);

/// Start the worker thread; the returned sender holds at most `max_queue` waiting jobs.
pub fn spawn(
    engine: Arc<Engine>,
    ctx: usize,
    spec_opts: SpecOptions,
    max_queue: usize,
    shared: Arc<Shared>,
) -> Result<Spawned, crate::ServerError> {
    let spec = engine.speculator(&spec_opts, ctx)?;
    let drafter = spec.as_ref().map(|s| s.drafter_name());
    if let Some(c) = &spec_opts.suffix {
        let _ = shared.metrics.suffix.set(c.clone());
    }
    let session = engine.new_session(ctx);
    let (tx, rx) = std::sync::mpsc::sync_channel::<Job>(max_queue);
    let mut w = Worker { engine, ctx, spec_opts, session, spec, shared };
    let h = std::thread::Builder::new().name("tandem-engine".into()).spawn(move || w.run(rx))?;
    Ok((tx, h, drafter))
}

impl Worker {
    fn run(&mut self, rx: Receiver<Job>) {
        let shared = self.shared.clone();
        let m = &shared.metrics;
        loop {
            let job = match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(job) => job,
                Err(RecvTimeoutError::Timeout) if shared.exit.load(Ordering::Relaxed) => break,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => break,
            };
            m.queue_depth.fetch_sub(1, Ordering::Relaxed);
            if job.cancel.load(Ordering::Relaxed) || job.events.is_closed() {
                m.cancelled.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if self.shared.abort.load(Ordering::Relaxed) {
                let _ = job.events.send(Event::Error(ApiError::shutting_down()));
                m.cancelled.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            m.busy.fetch_add(1, Ordering::Relaxed);
            let events = job.events.clone();
            let r = std::panic::catch_unwind(AssertUnwindSafe(|| self.generate(job)));
            // the suffix cache keeps what this request wrote, if asked to
            self.spec_opts.persist();
            // the gauge drops before the client hears the end
            m.busy.fetch_sub(1, Ordering::Relaxed);
            let failed = match r {
                Ok(Ok(last)) => {
                    let _ = events.send(last);
                    None
                }
                Ok(Err(e)) => Some(e),
                Err(p) => {
                    let msg = p
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| p.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "unknown panic".into());
                    tracing::error!("engine panicked: {msg}");
                    Some(ApiError::internal(format!("internal error in the engine: {msg}")))
                }
            };
            if let Some(e) = failed {
                m.failed.fetch_add(1, Ordering::Relaxed);
                let _ = events.send(Event::Error(e));
                self.reset();
            }
        }
        tracing::info!("engine worker stopped");
    }

    /// Fresh session and speculator after a failure (the old state may be inconsistent).
    fn reset(&mut self) {
        self.session = self.engine.new_session(self.ctx);
        match self.engine.speculator(&self.spec_opts, self.ctx) {
            Ok(s) => self.spec = s,
            Err(e) => {
                tracing::error!("could not rebuild the speculator, continuing without: {e}");
                self.spec = None;
            }
        }
    }

    /// Run one job, streaming its chunks; returns the final event (Done, or
    /// an Error for a cancelled generation).
    fn generate(&mut self, job: Job) -> Result<Event, ApiError> {
        let queue_time = job.enqueued.elapsed();
        let tok = self.engine.tokenizer.clone();
        let shared = self.shared.clone();
        let mut filter = StopFilter::new(job.stops.clone());
        // tokens whose log-probabilities wait for their text to be released
        let mut held: Vec<(usize, usize, TokenLogprob)> = Vec::new();
        let mut hit_stop = false;
        let events = &job.events;
        let cancel = &job.cancel;
        let want = job.logprobs;

        let release = |held: &mut Vec<(usize, usize, TokenLogprob)>, upto: usize, stopped: bool| -> Vec<TokenLogprob> {
            // before a stop, a token is released once all its text is; at a
            // stop, every token that contributed text before the cut is
            let n = held.iter().take_while(|(s, e, _)| if stopped { *s < upto } else { *e <= upto }).count();
            let out = held.drain(..n).map(|x| x.2).collect();
            if stopped {
                held.clear();
            }
            out
        };

        let mut on_token = |id: u32, text: &str, row: &[f32]| -> bool {
            if let (Some(n), false) = (want, id == u32::MAX || row.is_empty()) {
                let alt = |t: u32, lp: f32| {
                    let b = tok.token_bytes(t);
                    let s = if b.is_empty() { tok.token_str(t).to_string() } else { String::from_utf8_lossy(b).into_owned() };
                    Alt { token: s, bytes: b.to_vec(), logprob: lp }
                };
                let lp = log_softmax_at(row, &[id])[0];
                let top = if n > 0 { top_logprobs(row, n).into_iter().map(|(t, l)| alt(t, l)).collect() } else { vec![] };
                let start = filter.pushed();
                held.push((start, start + text.len(), TokenLogprob { chosen: alt(id, lp), top, offset: start }));
            }
            let r = filter.push(text);
            let lps = if want.is_some() { release(&mut held, filter.released(), r.stopped) } else { vec![] };
            if (!r.text.is_empty() || !lps.is_empty()) && events.send(Event::Chunk { text: r.text, logprobs: lps }).is_err() {
                return false;
            }
            if r.stopped {
                hit_stop = true;
                return false;
            }
            !(cancel.load(Ordering::Relaxed) || shared.abort.load(Ordering::Relaxed))
        };

        let res = if want.is_some() {
            self.session.generate_with_logits(&job.prompt, &job.params, self.spec.as_mut(), Some(cancel), &mut on_token)
        } else {
            self.session.generate_with(&job.prompt, &job.params, self.spec.as_mut(), Some(cancel), |id, text| on_token(id, text, &[]))
        };
        let stats = res.map_err(|e| match e {
            tandem_engine::EngineError::PromptTooLong { .. } | tandem_engine::EngineError::EmptyPrompt => {
                ApiError::bad_request(e.to_string())
            }
            e => ApiError::internal(format!("engine error: {e}")),
        })?;

        let m = &self.shared.metrics;
        let reused = stats.prompt_tokens - stats.prefill_tokens;
        m.prompt_tokens.fetch_add(stats.prompt_tokens as u64, Ordering::Relaxed);
        m.cached_tokens.fetch_add(reused as u64, Ordering::Relaxed);
        m.generated_tokens.fetch_add(stats.gen_tokens as u64, Ordering::Relaxed);
        m.prefill_us.fetch_add(stats.prefill_time.as_micros() as u64, Ordering::Relaxed);
        m.decode_us.fetch_add(stats.decode_time.as_micros() as u64, Ordering::Relaxed);
        m.decode_steps.fetch_add(stats.gen_tokens.saturating_sub(1) as u64, Ordering::Relaxed);
        let spec = match (&self.spec, &stats.spec) {
            (Some(sp), Some(st)) => {
                m.spec_cycles.fetch_add(st.cycles, Ordering::Relaxed);
                m.spec_drafted.fetch_add(st.drafted, Ordering::Relaxed);
                m.spec_accepted.fetch_add(st.accepted, Ordering::Relaxed);
                Some(SpecReport {
                    drafter: sp.drafter_name(),
                    cycles: st.cycles,
                    drafted_tokens: st.drafted,
                    accepted_tokens: st.accepted,
                    acceptance_rate: st.acceptance_rate(),
                    tokens_per_cycle: st.mean_committed(),
                })
            }
            _ => None,
        };

        let stop = stats.stop.unwrap_or(StopReason::Length);
        let finish = match stop {
            _ if hit_stop => Finish::Stop,
            StopReason::Eog => Finish::Stop,
            StopReason::Length | StopReason::Context => Finish::Length,
            StopReason::Cancelled => {
                m.cancelled.fetch_add(1, Ordering::Relaxed);
                let e = if self.shared.abort.load(Ordering::Relaxed) {
                    ApiError::shutting_down()
                } else {
                    ApiError::bad_request("cancelled: the client disconnected")
                };
                return Ok(Event::Error(e));
            }
        };
        if !hit_stop {
            let text = filter.finish();
            let lps = release(&mut held, usize::MAX, false);
            if !text.is_empty() || !lps.is_empty() {
                let _ = job.events.send(Event::Chunk { text, logprobs: lps });
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
            queue_time,
            prefill_time: stats.prefill_time,
            decode_time: stats.decode_time,
            decode_tps: tps,
            spec,
        };
        tracing::info!(
            "generation: {} prompt tokens ({} cached), {} generated, prefill {:.0} ms, decode {:.1} tok/s, finish {}",
            out.prompt_tokens,
            out.cached_tokens,
            out.completion_tokens,
            out.prefill_time.as_secs_f64() * 1e3,
            tps,
            finish.as_str()
        );
        Ok(Event::Done(Box::new(out)))
    }
}
