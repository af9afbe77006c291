use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tandem_kernels::ThreadPool;
use tandem_model::{ForwardOutput, KvCache, KvSnapshot, LogitRows, Model, ModelError};
use tandem_tokenizer::{ChatMessage, ChatTemplate, StreamDecoder, Tokenizer, TokenizerError};

use crate::sampling::{Sampler, SamplerParams};
use tandem_speculative::decoder::{Decoder, PlainDecoder, Target};
use tandem_speculative::{SpecError, SpecStats, Speculator};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Gguf(#[from] tandem_gguf::GgufError),
    #[error("prompt of {prompt} tokens does not fit the context of {ctx} tokens")]
    PromptTooLong { prompt: usize, ctx: usize },
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Fetch(#[from] crate::fetch::FetchError),
    #[error("empty prompt")]
    EmptyPrompt,
    /// A support file that cannot be used with this target.
    #[error("support file {}: {problem}", path.display())]
    SupportFile { path: std::path::PathBuf, problem: SupportProblem },
    /// Speculative options that do not go together.
    #[error("{0}")]
    Conflict(Conflict),
    /// A draft model file that is not there.
    #[error("draft model not found: {}", .0.display())]
    DraftModelNotFound(std::path::PathBuf),
    /// A snapshot taken from a session of another model or a larger context.
    #[error("the snapshot does not fit this session (another model, or a larger context)")]
    SnapshotMismatch,
    /// The spec log could not be created.
    #[error("cannot create the spec log {}: {source}", path.display())]
    SpecLog { path: std::path::PathBuf, source: std::io::Error },
}

/// Why a support file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SupportProblem {
    #[error("file not found")]
    NotFound,
    /// It does not read or does not fit the target (the message says which).
    #[error("{0}")]
    Invalid(String),
    /// It holds a DSpark drafter and DSpark drafting was not asked for.
    #[error("DSpark drafter detected; ask for DSpark drafting to decode with it")]
    DSparkNotAskedFor,
    /// DSpark drafting was asked for and it holds an MTP head.
    #[error("the file holds an MTP head, not a DSpark drafter")]
    NotDSpark,
}

/// Speculative options that do not go together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Conflict {
    #[error("a draft model cannot be combined with prompt lookup or a support file")]
    DraftModelWithOthers,
    #[error("DSpark settings need a support file that holds a DSpark drafter")]
    DSparkWithoutSupportFile,
    #[error("the support file is given twice")]
    SupportFileTwice,
    #[error("suffix speculation already searches the prompt and the output; use it or prompt lookup, not both")]
    SuffixWithLookup,
}

/// A model ready to run: weights, tokenizer, chat template and worker pool.
pub struct Engine {
    /// The model file it was loaded from (support files named in the
    /// catalogue are found by it).
    pub path: std::path::PathBuf,
    pub model: Arc<Model>,
    pub tokenizer: Arc<Tokenizer>,
    pub template: ChatTemplate,
    pub pool: Arc<ThreadPool>,
}

impl Engine {
    pub fn load(path: impl AsRef<std::path::Path>, threads: usize) -> Result<Self, EngineError> {
        let path = path.as_ref().to_path_buf();
        let gguf = Arc::new(tandem_gguf::Gguf::open(&path)?);
        // one rank of several (`mpirun`): this rank's share of the model
        let model = Arc::new(match crate::distributed::group() {
            Some(comm) => crate::distributed::load_split(gguf.clone(), comm.clone())?,
            None => Model::from_gguf(gguf.clone())?,
        });
        crate::distributed::lead(&model);
        let tokenizer = Arc::new(Tokenizer::from_gguf(&gguf)?);
        let template = match tokenizer.chat_template() {
            Some(src) => ChatTemplate::new(src)?,
            None => ChatTemplate::fallback(&tokenizer),
        };
        Ok(Engine { path, model, tokenizer, template, pool: Arc::new(ThreadPool::new(threads)) })
    }

    /// Render a conversation with the model's template (generation prompt added).
    pub fn render_chat(&self, messages: &[ChatMessage]) -> Result<String, EngineError> {
        let t = &self.tokenizer;
        let bos = t.bos_id().map(|i| t.token_str(i).to_string()).unwrap_or_default();
        let eos = t.eos_id().map(|i| t.token_str(i).to_string()).unwrap_or_default();
        Ok(self.template.render(messages, true, &bos, &eos)?)
    }

    /// Tokenize a prompt: special tokens are parsed, BOS added if the model wants it.
    pub fn tokenize_prompt(&self, text: &str) -> Vec<u32> {
        let mut ids = Vec::new();
        if self.tokenizer.add_bos() {
            if let Some(b) = self.tokenizer.bos_id() {
                if !text.starts_with(self.tokenizer.token_str(b)) {
                    ids.push(b);
                }
            }
        }
        ids.extend(self.tokenizer.encode(text, true));
        ids
    }

    /// Refuse token ids outside the vocabulary (before detokenizing ids a
    /// caller made up; the forward pass refuses them itself).
    pub fn check_tokens(&self, ids: &[u32]) -> Result<(), EngineError> {
        let vocab = self.tokenizer.vocab_size();
        match ids.iter().find(|&&id| id as usize >= vocab) {
            Some(&id) => Err(EngineError::Model(ModelError::BadToken { id, vocab })),
            None => Ok(()),
        }
    }

    pub fn new_session(self: &Arc<Self>, ctx: usize) -> Session {
        Session::new(self.clone(), ctx)
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// End-of-generation token.
    Eog,
    /// `max_tokens` reached.
    Length,
    /// The context is full.
    Context,
    /// Cancelled by the caller (Ctrl-C, client gone).
    Cancelled,
}

#[derive(Debug, Clone)]
pub struct GenParams {
    pub max_tokens: usize,
    pub sampler: SamplerParams,
}

/// Timings and counts of one generation.
#[derive(Debug, Clone, Default)]
pub struct GenStats {
    pub prompt_tokens: usize,
    /// Prompt tokens actually evaluated (the rest were reused from the cache).
    pub prefill_tokens: usize,
    pub prefill_time: Duration,
    pub gen_tokens: usize,
    pub decode_time: Duration,
    pub stop: Option<StopReason>,
    /// This generation's speculative cycles (None without a speculator).
    pub spec: Option<SpecStats>,
}

impl GenStats {
    pub fn prefill_tps(&self) -> f64 {
        self.prefill_tokens as f64 / self.prefill_time.as_secs_f64().max(1e-9)
    }
    pub fn decode_tps(&self) -> f64 {
        // the first generated token comes from the prefill logits; decode steps = gen - 1
        let steps = self.gen_tokens.saturating_sub(1);
        steps as f64 / self.decode_time.as_secs_f64().max(1e-9)
    }
}

/// One conversation's state: a KV cache, the tokens it holds, the last logits.
pub struct Session {
    pub engine: Arc<Engine>,
    pub cache: KvCache,
    /// Tokens whose K/V rows are in the cache.
    pub tokens: Vec<u32>,
    out: ForwardOutput,
    /// Logits after the last token in `tokens`.
    pub(crate) logits: Vec<f32>,
}

/// A saved session state: the cache rows, the tokens they hold and the
/// logits after the last one. Restoring it is exact: decoding afterwards gives
/// the bits it would have given when the snapshot was taken.
#[derive(Debug, Clone)]
pub struct SessionSnapshot {
    cache: KvSnapshot,
    tokens: Vec<u32>,
    logits: Vec<f32>,
}

impl SessionSnapshot {
    /// Tokens the snapshot holds.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }
}

/// Prompts are evaluated in chunks of this many positions.
pub const PREFILL_CHUNK: usize = 256;

impl Session {
    pub fn new(engine: Arc<Engine>, ctx: usize) -> Self {
        let cache = engine.model.new_cache(ctx);
        Session { engine, cache, tokens: Vec::new(), out: ForwardOutput::default(), logits: Vec::new() }
    }

    pub fn ctx(&self) -> usize {
        self.cache.ctx()
    }

    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    pub fn reset(&mut self) {
        self.cache.clear();
        self.tokens.clear();
        self.logits.clear();
    }

    /// Drop everything after the first `n` tokens (logits become stale: the
    /// caller must evaluate at least one more token before sampling). A
    /// model with sliding-window layers may keep fewer (see
    /// `KvCache::keepable`): `tokens` says what is held.
    pub fn truncate(&mut self, n: usize) {
        self.cache.truncate(n);
        self.tokens.truncate(self.cache.len());
        self.logits.clear();
    }

    /// Save the state (cache rows, tokens, logits).
    pub fn snapshot(&self) -> SessionSnapshot {
        SessionSnapshot { cache: self.cache.snapshot(), tokens: self.tokens.clone(), logits: self.logits.clone() }
    }

    /// Return to a saved state. A speculator used with this session must be
    /// told with `begin` (the session's generation calls do that).
    pub fn restore(&mut self, s: &SessionSnapshot) -> Result<(), EngineError> {
        if !self.cache.fits(&s.cache) {
            return Err(EngineError::SnapshotMismatch);
        }
        self.cache.restore(&s.cache);
        self.tokens.clone_from(&s.tokens);
        self.logits.clone_from(&s.logits);
        Ok(())
    }

    /// Evaluate `tokens` after what is cached; keep the last row's logits.
    pub fn feed(&mut self, tokens: &[u32]) -> Result<(), EngineError> {
        let e = self.engine.clone();
        for chunk in tokens.chunks(PREFILL_CHUNK) {
            e.model.forward(&e.pool, &mut self.cache, chunk, &LogitRows::Last, &[], &mut self.out)?;
            self.tokens.extend_from_slice(chunk);
        }
        if !tokens.is_empty() {
            self.logits.clear();
            self.logits.extend_from_slice(self.out.logits_row(0));
        }
        Ok(())
    }

    /// Make the cache hold exactly `prompt`, reusing the longest common prefix.
    /// Returns how many tokens were reused.
    pub fn sync(&mut self, prompt: &[u32]) -> Result<usize, EngineError> {
        self.sync_for(prompt, &mut PlainDecoder::default())
    }

    /// [`sync`](Self::sync) for a decoder: positions whose hidden rows it
    /// lacks are re-evaluated, and it is given the hidden rows of every
    /// evaluated prompt position.
    fn sync_for(&mut self, prompt: &[u32], decoder: &mut dyn Decoder) -> Result<usize, EngineError> {
        if prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if prompt.len() > self.ctx() {
            return Err(EngineError::PromptTooLong { prompt: prompt.len(), ctx: self.ctx() });
        }
        let mut common = self.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        let limit = decoder.observed();
        if common > limit {
            common = limit;
            self.logits.clear();
        }
        // at least one token must be evaluated to have fresh logits
        if common == prompt.len() {
            if common == self.tokens.len() && !self.logits.is_empty() {
                return Ok(common);
            }
            common -= 1;
        }
        self.truncate(common);
        let common = self.tokens.len();
        match decoder.taps().is_empty() {
            true => self.feed(&prompt[common..])?,
            false => {
                let e = self.engine.clone();
                let taps = decoder.taps().to_vec();
                for chunk in prompt[common..].chunks(PREFILL_CHUNK) {
                    let start = self.tokens.len();
                    e.model.forward(&e.pool, &mut self.cache, chunk, &LogitRows::Last, &taps, &mut self.out)?;
                    self.tokens.extend_from_slice(chunk);
                    decoder.observe(start, chunk.len(), &self.out.hidden);
                }
                self.logits.clear();
                self.logits.extend_from_slice(self.out.logits_row(0));
            }
        }
        Ok(common)
    }

    /// Generate after `prompt`. `on_token(id, text)` receives each token with its
    /// decoded text (never half a UTF-8 character); it returns false to stop.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        params: &GenParams,
        cancel: Option<&AtomicBool>,
        on_token: impl FnMut(u32, &str) -> bool,
    ) -> Result<GenStats, EngineError> {
        self.generate_with(prompt, params, None, cancel, on_token)
    }

    /// [`generate`](Self::generate), speculatively when `spec` is given: each
    /// cycle drafts, verifies in one batched pass and commits the agreeing
    /// prefix. Greedy output is identical to plain decoding.
    pub fn generate_with(
        &mut self,
        prompt: &[u32],
        params: &GenParams,
        spec: Option<&mut Speculator>,
        cancel: Option<&AtomicBool>,
        mut on_token: impl FnMut(u32, &str) -> bool,
    ) -> Result<GenStats, EngineError> {
        self.generate_inner(prompt, params, spec, cancel, false, &mut |id, text, _| on_token(id, text))
    }

    /// [`generate_with`](Self::generate_with) whose callback also receives the
    /// target's logits row each token was chosen from (for log-probabilities).
    /// The final flush of held-back text (id `u32::MAX`) comes with an empty
    /// row.
    pub fn generate_with_logits(
        &mut self,
        prompt: &[u32],
        params: &GenParams,
        spec: Option<&mut Speculator>,
        cancel: Option<&AtomicBool>,
        mut on_token: impl FnMut(u32, &str, &[f32]) -> bool,
    ) -> Result<GenStats, EngineError> {
        self.generate_inner(prompt, params, spec, cancel, true, &mut on_token)
    }

    fn generate_inner(
        &mut self,
        prompt: &[u32],
        params: &GenParams,
        spec: Option<&mut Speculator>,
        cancel: Option<&AtomicBool>,
        with_rows: bool,
        on_token: &mut dyn FnMut(u32, &str, &[f32]) -> bool,
    ) -> Result<GenStats, EngineError> {
        let mut plain = PlainDecoder::default();
        let speculative = spec.is_some();
        let decoder: &mut dyn Decoder = match spec {
            Some(sp) => sp,
            None => &mut plain,
        };
        let mut stats = GenStats { prompt_tokens: prompt.len(), ..Default::default() };
        let t0 = Instant::now();
        // the decoder forgets anything past the common prefix before prefill
        let common = self.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        decoder.begin(&prompt[..common])?;
        let reused = self.sync_for(prompt, decoder)?;
        stats.prefill_tokens = prompt.len() - reused;
        stats.prefill_time = t0.elapsed();
        let mut sampler = Sampler::new(params.sampler.clone());
        let mut dec = StreamDecoder::new();
        let tok = self.engine.tokenizer.clone();
        let engine = self.engine.clone();
        decoder.begin(&self.tokens)?;
        if speculative {
            stats.spec = Some(SpecStats::default());
        }
        let mut rows: Vec<Vec<f32>> = Vec::new();
        let is_eog = |id: u32| tok.is_eog(id);
        let t1 = Instant::now();
        let stop = 'outer: loop {
            if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                break StopReason::Cancelled;
            }
            if stats.gen_tokens >= params.max_tokens {
                break StopReason::Length;
            }
            rows.clear();
            let mut target = Target {
                model: &engine.model,
                pool: &engine.pool,
                cache: &mut self.cache,
                history: &mut self.tokens,
                logits: &mut self.logits,
            };
            let remaining = params.max_tokens - stats.gen_tokens;
            let step = decoder.step(&mut target, &mut sampler, remaining, &is_eog, with_rows.then_some(&mut rows))?;
            if let (Some(s), Some(rec)) = (&mut stats.spec, &step.cycle) {
                s.record(rec);
            }
            for (i, &next) in step.emitted.iter().enumerate() {
                stats.gen_tokens += 1;
                if tok.is_eog(next) {
                    break 'outer StopReason::Eog;
                }
                let text = dec.push(&tok, next);
                let row: &[f32] = rows.get(i).map_or(&[], |r| r.as_slice());
                if !on_token(next, &text, row) {
                    break 'outer StopReason::Cancelled;
                }
                if stats.gen_tokens >= params.max_tokens {
                    break 'outer StopReason::Length;
                }
            }
            if step.stopped || self.tokens.len() >= self.ctx() {
                // the last token could not be evaluated: the context is full
                break StopReason::Context;
            }
        };
        let rest = dec.flush();
        if !rest.is_empty() {
            on_token(u32::MAX, &rest, &[]);
        }
        stats.decode_time = t1.elapsed();
        stats.stop = Some(stop);
        Ok(stats)
    }
}
