//! The `tandem` Python package's native module (`tandem._tandem`).
//!
//! A `Model` is an engine (weights, tokenizer, threads) with its speculation
//! settings and a pool of idle sessions. A generation takes a session from
//! the pool and runs on its own thread with the GIL released; text pieces
//! come back over a channel, so a stream can be read while the model works,
//! Ctrl-C is seen between pieces, and a stream dropped midway cancels its
//! generation and returns the session to the pool.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyFileNotFoundError, PyStopIteration, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use tandem_engine::{
    fetch, speculation, Engine, EngineError, GenParams, GenStats, SamplerParams, Session, SpecOptions, Speculator, StopReason,
};
use tandem_tokenizer::ChatMessage;

create_exception!(_tandem, TandemError, PyException, "A model, support file or generation that failed.");

/// How often a waiting call looks for Ctrl-C.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

fn engine_err(e: EngineError) -> PyErr {
    match e {
        EngineError::PromptTooLong { .. } | EngineError::EmptyPrompt | EngineError::SnapshotMismatch => {
            PyValueError::new_err(e.to_string())
        }
        EngineError::Model(tandem_engine::ModelError::BadToken { .. }) => PyValueError::new_err(e.to_string()),
        EngineError::DraftModelNotFound(_) => PyFileNotFoundError::new_err(e.to_string()),
        EngineError::SupportFile { problem: tandem_engine::SupportProblem::NotFound, .. } => PyFileNotFoundError::new_err(e.to_string()),
        e => TandemError::new_err(e.to_string()),
    }
}

/// A session with its drafter state, idle in the model's pool or lent to one
/// generation.
struct Slot {
    session: Session,
    spec: Option<Speculator>,
}

struct Shared {
    engine: Arc<Engine>,
    spec: SpecOptions,
    ctx: usize,
    idle: Mutex<Vec<Slot>>,
    lent: Mutex<usize>,
}

impl Shared {
    fn take(&self) -> Result<Slot, EngineError> {
        let slot = self.idle.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let slot = match slot {
            Some(s) => s,
            None => Slot { session: self.engine.new_session(self.ctx), spec: self.engine.speculator(&self.spec, self.ctx)? },
        };
        *self.lent.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        Ok(slot)
    }

    fn give_back(&self, slot: Slot) {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner).push(slot);
        *self.lent.lock().unwrap_or_else(PoisonError::into_inner) -= 1;
    }
}

/// A language model, loaded once, that generates from raw text or a chat.
///
/// ``model`` is a GGUF file or a catalogue name ("smollm2-135m",
/// "qwen2.5-coder-0.5b"; fetched on first use into ``$TANDEM_MODELS_DIR``);
/// None is the default model. ``drafter`` is a support file (an MTP head or a
/// DSpark drafter) and ``lookup`` turns on n-gram prompt lookup; either makes
/// generation speculative, which changes its speed and never its output.
#[pyclass(module = "tandem._tandem", frozen)]
struct Model {
    shared: Arc<Shared>,
    drafter_name: Option<String>,
}

#[derive(FromPyObject)]
enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

#[pymethods]
impl Model {
    #[new]
    #[pyo3(signature = (model=None, *, threads=None, ctx=None, drafter=None, lookup=false, max_draft=None))]
    fn new(
        py: Python<'_>,
        model: Option<PathBuf>,
        threads: Option<usize>,
        ctx: Option<usize>,
        drafter: Option<PathBuf>,
        lookup: bool,
        max_draft: Option<usize>,
    ) -> PyResult<Self> {
        if threads == Some(0) {
            return Err(PyValueError::new_err("threads must be at least 1"));
        }
        if ctx == Some(0) {
            return Err(PyValueError::new_err("ctx must be at least 1"));
        }
        let spec = SpecOptions {
            drafter,
            lookup: lookup.then_some(speculation::LOOKUP_DEFAULT_NGRAM),
            max_draft,
            require: true,
            ..Default::default()
        };
        let (engine, ctx, name) = py.detach(|| -> PyResult<_> {
            let path = fetch::resolve(model.as_deref(), true).map_err(|e| match e {
                fetch::FetchError::UnknownModel { .. } => PyFileNotFoundError::new_err(e.to_string()),
                e => TandemError::new_err(e.to_string()),
            })?;
            let engine = Arc::new(Engine::load(&path, threads.unwrap_or_else(tandem_engine::physical_cores)).map_err(engine_err)?);
            let ctx = ctx.unwrap_or(engine.model.cfg.ctx_train);
            // a drafter that cannot be used fails here, not at the first generation
            let name = engine.speculator(&spec, ctx).map_err(engine_err)?.map(|s| s.drafter_name());
            Ok((engine, ctx, name))
        })?;
        let shared = Arc::new(Shared { engine, spec, ctx, idle: Mutex::new(Vec::new()), lent: Mutex::new(0) });
        Ok(Model { shared, drafter_name: name })
    }

    /// Context of each generation in tokens (prompt and output).
    #[getter]
    fn ctx(&self) -> usize {
        self.shared.ctx
    }

    /// Tokens in the vocabulary.
    #[getter]
    fn n_vocab(&self) -> usize {
        self.shared.engine.tokenizer.vocab_size()
    }

    /// What drafts for speculative generation, or None.
    #[getter]
    fn drafter(&self) -> Option<String> {
        self.drafter_name.clone()
    }

    /// Sessions lent to generations that have not finished (a stream dropped
    /// midway gives its session back at once).
    #[getter]
    fn sessions_in_use(&self) -> usize {
        *self.shared.lent.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Token ids of text as a prompt (special tokens parsed, BOS added when
    /// the model wants it).
    fn tokenize(&self, text: &str) -> Vec<u32> {
        self.shared.engine.tokenize_prompt(text)
    }

    /// The text of token ids.
    fn detokenize(&self, ids: Vec<u32>) -> PyResult<String> {
        self.shared.engine.check_tokens(&ids).map_err(engine_err)?;
        Ok(self.shared.engine.tokenizer.decode(&ids))
    }

    /// A conversation rendered with the model's chat template, ready for the
    /// assistant's answer. ``messages``: dicts with "role" and "content".
    fn render_chat(&self, messages: &Bound<'_, PyList>) -> PyResult<String> {
        let chat = chat_messages(messages)?;
        self.shared.engine.render_chat(&chat).map_err(engine_err)
    }

    /// Generate after a raw prompt (text, no chat template; or token ids).
    /// Returns a Completion, or with ``stream=True`` a Stream of text pieces.
    #[pyo3(signature = (prompt, *, max_tokens=256, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, seed=None, stream=false, speculative=true))]
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &self,
        py: Python<'_>,
        prompt: Prompt,
        max_tokens: usize,
        temperature: f32,
        top_k: usize,
        top_p: f32,
        min_p: f32,
        seed: Option<u64>,
        stream: bool,
        speculative: bool,
    ) -> PyResult<Py<PyAny>> {
        let ids = match prompt {
            Prompt::Text(t) => self.shared.engine.tokenize_prompt(&t),
            Prompt::Ids(ids) => ids,
        };
        let sampler = SamplerParams { temperature, top_k, top_p, min_p, seed: seed.unwrap_or_else(time_seed) };
        self.start(py, ids, GenParams { max_tokens, sampler }, stream, speculative)
    }

    /// Answer a conversation (dicts with "role" and "content"), rendered with
    /// the model's chat template. Same options and results as ``generate``.
    #[pyo3(signature = (messages, *, max_tokens=256, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, seed=None, stream=false, speculative=true))]
    #[allow(clippy::too_many_arguments)]
    fn chat(
        &self,
        py: Python<'_>,
        messages: &Bound<'_, PyList>,
        max_tokens: usize,
        temperature: f32,
        top_k: usize,
        top_p: f32,
        min_p: f32,
        seed: Option<u64>,
        stream: bool,
        speculative: bool,
    ) -> PyResult<Py<PyAny>> {
        let ids = self.shared.engine.tokenize_prompt(&self.render_chat(messages)?);
        self.generate(py, Prompt::Ids(ids), max_tokens, temperature, top_k, top_p, min_p, seed, stream, speculative)
    }

    fn __repr__(&self) -> String {
        let cfg = &self.shared.engine.model.cfg;
        format!(
            "Model({} layers, width {}, vocab {}, ctx {}, drafter {})",
            cfg.n_layer,
            cfg.d_model,
            cfg.vocab,
            self.shared.ctx,
            self.drafter_name.as_deref().unwrap_or("none")
        )
    }
}

impl Model {
    fn start(&self, py: Python<'_>, ids: Vec<u32>, params: GenParams, stream: bool, speculative: bool) -> PyResult<Py<PyAny>> {
        params.sampler.check().map_err(|e| PyValueError::new_err(e.to_string()))?;
        if ids.is_empty() {
            return Err(PyValueError::new_err("empty prompt"));
        }
        self.shared.engine.check_tokens(&ids).map_err(engine_err)?;
        if ids.len() > self.shared.ctx {
            return Err(engine_err(EngineError::PromptTooLong { prompt: ids.len(), ctx: self.shared.ctx }));
        }
        let mut s = Stream::spawn(self.shared.clone(), ids, params, speculative, stream).map_err(engine_err)?;
        if stream {
            return Ok(Py::new(py, s)?.into_any());
        }
        while s.next_piece(py)?.is_some() {}
        let done = s.done.take().expect("a finished stream holds its completion");
        Ok(Py::new(py, done)?.into_any())
    }
}

fn time_seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

fn chat_messages(messages: &Bound<'_, PyList>) -> PyResult<Vec<ChatMessage>> {
    let mut chat = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let bad = || PyValueError::new_err(format!("messages[{i}] must be a dict with 'role' and 'content' strings"));
        let d = m.cast::<PyDict>().map_err(|_| bad())?;
        let field = |k: &str| -> PyResult<String> { d.get_item(k)?.ok_or_else(bad)?.extract::<String>().map_err(|_| bad()) };
        chat.push(ChatMessage::new(&field("role")?, field("content")?));
    }
    Ok(chat)
}

/// What a generation thread sends.
enum Event {
    Piece(u32, String),
    /// The end, with the text and ids not sent as pieces.
    Done(Box<(Result<GenStats, EngineError>, String, Vec<u32>)>),
}

/// The numbers of one generation.
#[pyclass(module = "tandem._tandem", frozen, get_all)]
#[derive(Clone)]
struct Stats {
    /// Tokens in the prompt.
    prompt_tokens: usize,
    /// Prompt tokens evaluated (the rest were reused from an earlier call).
    prefill_tokens: usize,
    /// Tokens generated (an end-of-generation token included).
    generated_tokens: usize,
    prefill_ms: f64,
    decode_ms: f64,
    /// Generated tokens per second after the first.
    decode_tps: f64,
    /// Speculative cycles (0 without speculation).
    cycles: u64,
    /// Draft tokens verified by the model.
    drafted: u64,
    /// Draft tokens the model agreed with.
    accepted: u64,
}

#[pymethods]
impl Stats {
    /// Accepted draft tokens per drafted one (0 without drafts).
    #[getter]
    fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "Stats(prompt_tokens={}, generated_tokens={}, decode_tps={:.1}, cycles={}, drafted={}, accepted={})",
            self.prompt_tokens, self.generated_tokens, self.decode_tps, self.cycles, self.drafted, self.accepted
        )
    }
}

impl From<&GenStats> for Stats {
    fn from(s: &GenStats) -> Self {
        let spec = s.spec.clone().unwrap_or_default();
        Stats {
            prompt_tokens: s.prompt_tokens,
            prefill_tokens: s.prefill_tokens,
            generated_tokens: s.gen_tokens,
            prefill_ms: s.prefill_time.as_secs_f64() * 1e3,
            decode_ms: s.decode_time.as_secs_f64() * 1e3,
            decode_tps: s.decode_tps(),
            cycles: spec.cycles,
            drafted: spec.drafted,
            accepted: spec.accepted,
        }
    }
}

/// A finished generation.
#[pyclass(module = "tandem._tandem", frozen, get_all)]
struct Completion {
    /// The generated text.
    text: String,
    /// The generated token ids (without an end-of-generation token).
    tokens: Vec<u32>,
    /// Why it ended: "eog", "length", "context" or "cancelled".
    stop: &'static str,
    stats: Stats,
}

#[pymethods]
impl Completion {
    fn __repr__(&self) -> String {
        format!("Completion(text={:?}, stop={:?}, {})", self.text, self.stop, self.stats.__repr__())
    }
}

/// Text pieces of a generation as they are made (never half a UTF-8
/// character). ``completion`` holds the whole result once the stream ends;
/// ``close()`` (or dropping the stream) cancels the generation.
#[pyclass(module = "tandem._tandem")]
struct Stream {
    events: Mutex<Receiver<Event>>,
    cancel: Arc<AtomicBool>,
    worker: Option<JoinHandle<()>>,
    text: String,
    tokens: Vec<u32>,
    done: Option<Completion>,
}

impl Stream {
    /// Start a generation. Without `pieces` its text comes whole with the
    /// end, and the waiting thread wakes only to look for Ctrl-C.
    fn spawn(shared: Arc<Shared>, ids: Vec<u32>, params: GenParams, speculative: bool, pieces: bool) -> Result<Stream, EngineError> {
        let mut slot = shared.take()?;
        let (tx, rx) = channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let stop = cancel.clone();
        let worker = std::thread::Builder::new()
            .name("tandem-generate".into())
            .spawn(move || {
                let Slot { session, spec } = &mut slot;
                let spec = if speculative { spec.as_mut() } else { None };
                let (mut text, mut tokens) = (String::new(), Vec::new());
                let r = session.generate_with(&ids, &params, spec, Some(&stop), |id, piece| {
                    if pieces {
                        return tx.send(Event::Piece(id, piece.to_string())).is_ok();
                    }
                    if id != u32::MAX {
                        tokens.push(id);
                    }
                    text.push_str(piece);
                    true
                });
                shared.give_back(slot);
                let _ = tx.send(Event::Done(Box::new((r, text, tokens))));
            })
            .expect("spawn a generation thread");
        Ok(Stream { events: Mutex::new(rx), cancel, worker: Some(worker), text: String::new(), tokens: Vec::new(), done: None })
    }

    /// The next piece, or None once the generation has ended (then `done`
    /// holds its completion). Ctrl-C raises KeyboardInterrupt and cancels.
    fn next_piece(&mut self, py: Python<'_>) -> PyResult<Option<String>> {
        if self.worker.is_none() {
            return Ok(None);
        }
        loop {
            let rx = self.events.get_mut().unwrap_or_else(PoisonError::into_inner);
            let event = py.detach(move || rx.recv_timeout(SIGNAL_POLL));
            // Ctrl-C is looked for between pieces too: a fast generation never
            // waits long enough to time out
            if let Err(e) = py.check_signals() {
                self.cancel_and_wait(py);
                return Err(e);
            }
            match event {
                Ok(Event::Piece(id, text)) => {
                    if id != u32::MAX {
                        self.tokens.push(id);
                    }
                    self.text.push_str(&text);
                    return Ok(Some(text));
                }
                Ok(Event::Done(done)) => {
                    let (r, text, tokens) = *done;
                    self.finish();
                    self.text.push_str(&text);
                    self.tokens.extend(tokens);
                    let stats = r.map_err(engine_err)?;
                    let stop = match stats.stop {
                        Some(StopReason::Eog) => "eog",
                        Some(StopReason::Context) => "context",
                        Some(StopReason::Cancelled) => "cancelled",
                        Some(StopReason::Length) | None => "length",
                    };
                    self.done = Some(Completion {
                        text: std::mem::take(&mut self.text),
                        tokens: std::mem::take(&mut self.tokens),
                        stop,
                        stats: Stats::from(&stats),
                    });
                    return Ok(None);
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.finish();
                    return Err(TandemError::new_err("the generation thread ended without a result"));
                }
            }
        }
    }

    fn finish(&mut self) {
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }

    fn cancel_and_wait(&mut self, py: Python<'_>) {
        self.cancel.store(true, Ordering::Relaxed);
        let w = self.worker.take();
        py.detach(|| {
            if let Some(w) = w {
                let _ = w.join();
            }
        });
    }
}

#[pymethods]
impl Stream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<String> {
        match self.next_piece(py)? {
            Some(piece) => Ok(piece),
            None => Err(PyStopIteration::new_err(())),
        }
    }

    /// Stop the generation now and give its session back.
    fn close(&mut self, py: Python<'_>) {
        self.cancel_and_wait(py);
    }

    /// The finished generation (None until the stream has ended).
    #[getter]
    fn completion(&self, py: Python<'_>) -> PyResult<Option<Py<Completion>>> {
        self.done
            .as_ref()
            .map(|c| Py::new(py, Completion { text: c.text.clone(), tokens: c.tokens.clone(), stop: c.stop, stats: c.stats.clone() }))
            .transpose()
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __exit__(&mut self, py: Python<'_>, _t: Py<PyAny>, _v: Py<PyAny>, _tb: Py<PyAny>) -> bool {
        self.cancel_and_wait(py);
        false
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // an abandoned stream stops its generation; the thread gives the
        // session back before it ends
        self.cancel.store(true, Ordering::Relaxed);
        self.finish();
    }
}

#[pymodule]
fn _tandem(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Model>()?;
    m.add_class::<Completion>()?;
    m.add_class::<Stats>()?;
    m.add_class::<Stream>()?;
    m.add("TandemError", m.py().get_type::<TandemError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
