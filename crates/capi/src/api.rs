//! The exported functions and the types they take.
//!
//! Each function checks its handles against the registries, reads its
//! arguments through [`crate::raw`], and runs its body under
//! [`crate::status::guard`]: failures and panics come back as a status with
//! a message, never as an unwind into C.

use std::ffi::{c_char, c_int, c_void};
use std::path::Path;
use std::sync::{Arc, Mutex};

use ::tandem_engine as rt;
use rt::{fetch, Engine, EngineError, GenParams, SamplerParams, SpecOptions, StopReason};
use tandem_tokenizer::ChatMessage;

use crate::handles::{lock, EngineState, SessionState, SnapshotState, ENGINES, SESSIONS, SNAPSHOTS};
use crate::raw;
use crate::status::{guard, last_error_ptr, tandem_status, tandem_stop, Failure};

/// An open engine (a model, its tokenizer, threads and speculation settings).
#[allow(non_camel_case_types)]
pub struct tandem_engine {
    _opaque: [u8; 0],
}

/// A conversation: a KV cache, the tokens it holds, and drafter state.
#[allow(non_camel_case_types)]
pub struct tandem_session {
    _opaque: [u8; 0],
}

/// A saved session state.
#[allow(non_camel_case_types)]
pub struct tandem_snapshot {
    _opaque: [u8; 0],
}

/// How to open an engine. Start from `tandem_engine_options_default()`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tandem_engine_options {
    /// A GGUF file, or a catalogue name such as "smollm2-135m" or
    /// "qwen2.5-coder-0.5b" (fetched on first use). NULL: the default model.
    pub model: *const c_char,
    /// Worker threads; 0: the physical cores.
    pub threads: u32,
    /// Context of each session in tokens; 0: the model's training context.
    pub ctx: u32,
    /// A support file to draft with (an MTP head or a DSpark drafter, used as
    /// its kind says). NULL: none.
    pub drafter: *const c_char,
    /// Draft with n-gram prompt lookup (with a drafter: in front of it).
    pub lookup: bool,
    /// Most tokens drafted per cycle; 0: the drafter's default.
    pub max_draft: u32,
    /// Fetch a catalogue model that is not in the models directory yet
    /// (`$TANDEM_MODELS_DIR`); false: such a model is an error.
    pub fetch: bool,
}

/// One chat message.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tandem_message {
    /// "system", "user" or "assistant".
    pub role: *const c_char,
    pub content: *const c_char,
}

/// How to generate. Start from `tandem_generate_params_default()`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tandem_generate_params {
    /// Most tokens to generate.
    pub max_tokens: u32,
    /// 0: greedy (argmax); otherwise sample at this temperature.
    pub temperature: f32,
    /// Keep the k most likely tokens; 0: all.
    pub top_k: u32,
    /// Keep the smallest set of tokens whose probability reaches top_p; 1: all.
    pub top_p: f32,
    /// Drop tokens less likely than min_p times the most likely; 0: none.
    pub min_p: f32,
    /// Seed of the sampler's random numbers.
    pub seed: u64,
    /// Speculate with the engine's drafter (when it has one). Greedy output
    /// and the sampled distribution are the same either way.
    pub speculative: bool,
}

/// What one generation did.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tandem_stats {
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Prompt tokens evaluated (the rest were already in the session).
    pub prefill_tokens: usize,
    /// Tokens generated (an end-of-generation token included).
    pub generated_tokens: usize,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    pub stop: tandem_stop,
    /// Speculative cycles (0 without speculation).
    pub cycles: u64,
    /// Draft tokens verified by the target.
    pub drafted: u64,
    /// Draft tokens the target agreed with.
    pub accepted: u64,
}

/// Receives each generated token and its text (never half a UTF-8
/// character; `piece` is NUL-terminated and `len` bytes long). Returns 0 to
/// go on, anything else to stop. The text held back at the end comes with
/// `id` = `TANDEM_TOKEN_NONE`.
#[allow(non_camel_case_types)]
pub type tandem_token_callback = Option<unsafe extern "C" fn(id: u32, piece: *const c_char, len: usize, user_data: *mut c_void) -> c_int>;

/// The id given with text that belongs to no single token.
pub const TANDEM_TOKEN_NONE: u32 = u32::MAX;

fn engine_id(e: *const tandem_engine) -> usize {
    e as usize
}

fn session_id(s: *const tandem_session) -> usize {
    s as usize
}

fn snapshot_id(s: *const tandem_snapshot) -> usize {
    s as usize
}

/// The library's version ("0.1.0"), a static string.
#[no_mangle]
pub extern "C" fn tandem_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// The message of this thread's last failed call ("" before any). Valid
/// until the next failing call on the same thread.
#[no_mangle]
pub extern "C" fn tandem_last_error() -> *const c_char {
    last_error_ptr()
}

/// Default engine options: the default model, all physical cores, the
/// model's context, no drafter, fetching allowed.
#[no_mangle]
pub extern "C" fn tandem_engine_options_default() -> tandem_engine_options {
    tandem_engine_options {
        model: std::ptr::null(),
        threads: 0,
        ctx: 0,
        drafter: std::ptr::null(),
        lookup: false,
        max_draft: 0,
        fetch: true,
    }
}

/// Default generation parameters: 256 tokens, greedy, speculative.
#[no_mangle]
pub extern "C" fn tandem_generate_params_default() -> tandem_generate_params {
    tandem_generate_params { max_tokens: 256, temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 0, speculative: true }
}

/// Load a model and check its speculation settings (a drafter that cannot
/// be used is an error, not a fallback).
///
/// # Safety
/// `options` is NULL (the defaults) or points to a `tandem_engine_options`
/// whose strings are NULL or NUL-terminated; `out` is valid for one write.
#[no_mangle]
pub unsafe extern "C" fn tandem_engine_open(options: *const tandem_engine_options, out: *mut *mut tandem_engine) -> tandem_status {
    guard(|| {
        // SAFETY: the caller's contract
        unsafe { raw::put(out, std::ptr::null_mut(), "out") }?;
        // SAFETY: the caller's contract
        let o = unsafe { raw::read_opt(options) }.unwrap_or_else(|| tandem_engine_options_default());
        // SAFETY: the caller's contract on the option strings
        let model = unsafe { raw::opt_str(o.model, "options.model") }?;
        // SAFETY: as above
        let drafter = unsafe { raw::opt_str(o.drafter, "options.drafter") }?;
        let path = match model {
            Some(m) if Path::new(m).exists() => Path::new(m).to_path_buf(),
            Some(m) if !o.fetch => {
                let spec =
                    fetch::find(m).ok_or_else(|| Failure::new(tandem_status::TANDEM_ERR_MODEL, format!("model file not found: {m}")))?;
                match fetch::fetched(spec, &fetch::models_dir()) {
                    Some(_) => spec.path_in(&fetch::models_dir()),
                    None => {
                        return Err(Failure::new(tandem_status::TANDEM_ERR_MODEL, format!("{m} is not fetched yet and fetching is off")))
                    }
                }
            }
            m => fetch::resolve(m.map(Path::new), false).map_err(|e| Failure::new(tandem_status::TANDEM_ERR_MODEL, e.to_string()))?,
        };
        let threads = match o.threads {
            0 => rt::physical_cores(),
            n => n as usize,
        };
        let engine = Arc::new(Engine::load(&path, threads)?);
        let ctx = match o.ctx {
            0 => engine.model.cfg.ctx_train,
            n => n as usize,
        };
        let spec = SpecOptions {
            drafter: drafter.map(Into::into),
            lookup: o.lookup.then_some(rt::speculation::LOOKUP_DEFAULT_NGRAM),
            max_draft: (o.max_draft > 0).then_some(o.max_draft as usize),
            require: true,
            ..Default::default()
        };
        // a drafter that does not fit fails here, not at the first session
        engine.speculator(&spec, ctx)?;
        let id = ENGINES.insert(EngineState { engine, spec, ctx });
        // SAFETY: the caller's contract
        unsafe { raw::put(out, id as *mut tandem_engine, "out") }
    })
}

/// Close an engine. Its sessions keep working until they are freed. NULL
/// is accepted and does nothing.
#[no_mangle]
pub extern "C" fn tandem_engine_free(engine: *mut tandem_engine) -> tandem_status {
    guard(|| ENGINES.free(engine_id(engine)))
}

/// The context of the engine's sessions, in tokens.
///
/// # Safety
/// `ctx` is valid for one write.
#[no_mangle]
pub unsafe extern "C" fn tandem_engine_ctx(engine: *const tandem_engine, ctx: *mut usize) -> tandem_status {
    guard(|| {
        let e = ENGINES.get(engine_id(engine))?;
        // SAFETY: the caller's contract
        unsafe { raw::put(ctx, e.ctx, "ctx") }
    })
}

/// Tokenize text as a prompt: special tokens such as `<|im_start|>` are
/// parsed, and BOS is added when the model wants it. Writes up to `cap` ids
/// and the count in `n_out` (the count needed when it returns
/// `TANDEM_ERR_BUFFER_TOO_SMALL`).
///
/// # Safety
/// `text` is NUL-terminated; `ids` is valid for `cap` writes (or NULL with
/// `cap` 0); `n_out` is valid for one write.
#[no_mangle]
pub unsafe extern "C" fn tandem_tokenize(
    engine: *const tandem_engine,
    text: *const c_char,
    ids: *mut u32,
    cap: usize,
    n_out: *mut usize,
) -> tandem_status {
    guard(|| {
        let e = ENGINES.get(engine_id(engine))?;
        // SAFETY: the caller's contract
        let text = unsafe { raw::str(text, "text") }?;
        let tokens = e.engine.tokenize_prompt(text);
        // SAFETY: the caller's contract
        unsafe { raw::put_array(&tokens, ids, cap, n_out, "ids") }
    })
}

/// The text of `n` token ids, NUL-terminated, into `buf` of `cap` bytes;
/// `len_out` gets its length without the NUL (the length needed when it
/// returns `TANDEM_ERR_BUFFER_TOO_SMALL`).
///
/// # Safety
/// `ids` holds `n` ids (or is NULL with `n` 0); `buf` is valid for `cap`
/// writes (or NULL with `cap` 0); `len_out` is valid for one write.
#[no_mangle]
pub unsafe extern "C" fn tandem_detokenize(
    engine: *const tandem_engine,
    ids: *const u32,
    n: usize,
    buf: *mut c_char,
    cap: usize,
    len_out: *mut usize,
) -> tandem_status {
    guard(|| {
        let e = ENGINES.get(engine_id(engine))?;
        // SAFETY: the caller's contract
        let ids = unsafe { raw::slice(ids, n, "ids") }?;
        e.engine.check_tokens(ids)?;
        let text = e.engine.tokenizer.decode(ids);
        // SAFETY: the caller's contract
        unsafe { raw::put_text(&text, buf, cap, len_out) }
    })
}

/// Render a conversation with the model's chat template, ready for the
/// assistant's answer (what `tandem -p` does to its prompt). Output as
/// `tandem_detokenize`.
///
/// # Safety
/// `messages` holds `n` messages whose strings are NUL-terminated; `buf` and
/// `len_out` as in `tandem_detokenize`.
#[no_mangle]
pub unsafe extern "C" fn tandem_chat_render(
    engine: *const tandem_engine,
    messages: *const tandem_message,
    n: usize,
    buf: *mut c_char,
    cap: usize,
    len_out: *mut usize,
) -> tandem_status {
    guard(|| {
        let e = ENGINES.get(engine_id(engine))?;
        // SAFETY: the caller's contract
        let messages = unsafe { raw::slice(messages, n, "messages") }?;
        let mut chat = Vec::with_capacity(messages.len());
        for (i, m) in messages.iter().enumerate() {
            // SAFETY: the caller's contract on each message's strings
            let role = unsafe { raw::str(m.role, &format!("messages[{i}].role")) }?;
            // SAFETY: as above
            let content = unsafe { raw::str(m.content, &format!("messages[{i}].content")) }?;
            chat.push(ChatMessage::new(role, content));
        }
        let text = e.engine.render_chat(&chat)?;
        // SAFETY: the caller's contract
        unsafe { raw::put_text(&text, buf, cap, len_out) }
    })
}

/// Start a conversation with the engine's context and drafter.
///
/// # Safety
/// `out` is valid for one write.
#[no_mangle]
pub unsafe extern "C" fn tandem_session_new(engine: *const tandem_engine, out: *mut *mut tandem_session) -> tandem_status {
    guard(|| {
        // SAFETY: the caller's contract
        unsafe { raw::put(out, std::ptr::null_mut(), "out") }?;
        let e = ENGINES.get(engine_id(engine))?;
        let spec = e.engine.speculator(&e.spec, e.ctx)?;
        let session = e.engine.new_session(e.ctx);
        let id = SESSIONS.insert(Mutex::new(SessionState { engine: e, session, spec }));
        // SAFETY: the caller's contract
        unsafe { raw::put(out, id as *mut tandem_session, "out") }
    })
}

/// Free a session. NULL is accepted and does nothing.
#[no_mangle]
pub extern "C" fn tandem_session_free(session: *mut tandem_session) -> tandem_status {
    guard(|| SESSIONS.free(session_id(session)))
}

/// Generate after `prompt` (token ids; the session reuses what it already
/// holds of them and evaluates the rest). Each token goes to `callback`
/// (may be NULL); `stats` (may be NULL) receives counts, timings and the
/// speculative cycles of this call.
///
/// # Safety
/// `prompt` holds `n` ids; `params` is NULL (the defaults) or valid;
/// `callback`, if given, is safe to call with `user_data`; `stats` is NULL
/// or valid for one write.
#[no_mangle]
pub unsafe extern "C" fn tandem_session_generate(
    session: *mut tandem_session,
    prompt: *const u32,
    n: usize,
    params: *const tandem_generate_params,
    callback: tandem_token_callback,
    user_data: *mut c_void,
    stats: *mut tandem_stats,
) -> tandem_status {
    guard(|| {
        let s = SESSIONS.get(session_id(session))?;
        let mut s = lock(&s)?;
        // SAFETY: the caller's contract
        let prompt = unsafe { raw::slice(prompt, n, "prompt") }?;
        // SAFETY: the caller's contract
        let p = unsafe { raw::read_opt(params) }.unwrap_or_else(|| tandem_generate_params_default());
        let sampler = SamplerParams { temperature: p.temperature, top_k: p.top_k as usize, top_p: p.top_p, min_p: p.min_p, seed: p.seed };
        sampler.check().map_err(|e| Failure::invalid(format!("params.{e}")))?;
        s.engine.engine.check_tokens(prompt)?;
        let gen = GenParams { max_tokens: p.max_tokens as usize, sampler };
        let mut piece = Vec::new();
        let SessionState { session, spec, .. } = &mut *s;
        let spec = if p.speculative { spec.as_mut() } else { None };
        let out = session.generate_with(prompt, &gen, spec, None, |id, text| {
            let Some(cb) = callback else { return true };
            piece.clear();
            piece.extend_from_slice(text.as_bytes());
            piece.push(0);
            // SAFETY: the caller vouches for the callback and its user data
            unsafe { cb(id, piece.as_ptr().cast(), text.len(), user_data) == 0 }
        })?;
        let spec_stats = out.spec.unwrap_or_default();
        let stop = match out.stop {
            Some(StopReason::Eog) => tandem_stop::TANDEM_STOP_EOG,
            Some(StopReason::Context) => tandem_stop::TANDEM_STOP_CONTEXT,
            Some(StopReason::Cancelled) => tandem_stop::TANDEM_STOP_CALLBACK,
            Some(StopReason::Length) | None => tandem_stop::TANDEM_STOP_LENGTH,
        };
        let st = tandem_stats {
            prompt_tokens: out.prompt_tokens,
            prefill_tokens: out.prefill_tokens,
            generated_tokens: out.gen_tokens,
            prefill_ms: out.prefill_time.as_secs_f64() * 1e3,
            decode_ms: out.decode_time.as_secs_f64() * 1e3,
            stop,
            cycles: spec_stats.cycles,
            drafted: spec_stats.drafted,
            accepted: spec_stats.accepted,
        };
        // SAFETY: the caller's contract
        unsafe { raw::put_opt(stats, st) };
        Ok(())
    })
}

/// How many tokens the session holds.
///
/// # Safety
/// `n_out` is valid for one write.
#[no_mangle]
pub unsafe extern "C" fn tandem_session_n_tokens(session: *const tandem_session, n_out: *mut usize) -> tandem_status {
    guard(|| {
        let s = SESSIONS.get(session_id(session))?;
        let n = lock(&s)?.session.tokens.len();
        // SAFETY: the caller's contract
        unsafe { raw::put(n_out, n, "n_out") }
    })
}

/// The tokens the session holds (prompt and generated), as
/// `tandem_tokenize` writes ids.
///
/// # Safety
/// `ids` is valid for `cap` writes (or NULL with `cap` 0); `n_out` for one.
#[no_mangle]
pub unsafe extern "C" fn tandem_session_tokens(
    session: *const tandem_session,
    ids: *mut u32,
    cap: usize,
    n_out: *mut usize,
) -> tandem_status {
    guard(|| {
        let s = SESSIONS.get(session_id(session))?;
        let s = lock(&s)?;
        // SAFETY: the caller's contract
        unsafe { raw::put_array(&s.session.tokens, ids, cap, n_out, "ids") }
    })
}

/// Keep the first `n` tokens and forget the rest (exact: decoding after it
/// gives the bits it gave when the session held `n` tokens). `n` beyond the
/// session's length changes nothing.
#[no_mangle]
pub extern "C" fn tandem_session_truncate(session: *mut tandem_session, n: usize) -> tandem_status {
    guard(|| {
        let s = SESSIONS.get(session_id(session))?;
        let mut s = lock(&s)?;
        if n < s.session.tokens.len() {
            s.session.truncate(n);
        }
        Ok(())
    })
}

/// Save the session's state (its cache rows, tokens and last logits).
///
/// # Safety
/// `out` is valid for one write.
#[no_mangle]
pub unsafe extern "C" fn tandem_session_snapshot(session: *const tandem_session, out: *mut *mut tandem_snapshot) -> tandem_status {
    guard(|| {
        // SAFETY: the caller's contract
        unsafe { raw::put(out, std::ptr::null_mut(), "out") }?;
        let s = SESSIONS.get(session_id(session))?;
        let s = lock(&s)?;
        let id = SNAPSHOTS.insert(SnapshotState { engine: s.engine.clone(), snapshot: s.session.snapshot() });
        // SAFETY: the caller's contract
        unsafe { raw::put(out, id as *mut tandem_snapshot, "out") }
    })
}

/// Return a session to a saved state (a snapshot of any session of the same
/// engine). The snapshot stays valid.
#[no_mangle]
pub extern "C" fn tandem_session_restore(session: *mut tandem_session, snapshot: *const tandem_snapshot) -> tandem_status {
    guard(|| {
        let snap = SNAPSHOTS.get(snapshot_id(snapshot))?;
        let s = SESSIONS.get(session_id(session))?;
        let mut s = lock(&s)?;
        if !Arc::ptr_eq(&s.engine, &snap.engine) {
            return Err(Failure::invalid("the snapshot was taken from a session of another engine"));
        }
        let kept = s.session.tokens.iter().zip(snap.snapshot.tokens()).take_while(|(a, b)| a == b).count();
        s.session.restore(&snap.snapshot)?;
        // the drafter keeps only what the old and the restored history share
        let history = s.session.tokens[..kept].to_vec();
        if let Some(sp) = s.spec.as_mut() {
            sp.begin(&history).map_err(EngineError::from)?;
        }
        Ok(())
    })
}

/// Free a snapshot. NULL is accepted and does nothing.
#[no_mangle]
pub extern "C" fn tandem_snapshot_free(snapshot: *mut tandem_snapshot) -> tandem_status {
    guard(|| SNAPSHOTS.free(snapshot_id(snapshot)))
}

/// Live handles of each kind (engines, sessions, snapshots); for tests of
/// the binding that check nothing is kept after it is freed.
pub fn live_handles() -> (usize, usize, usize) {
    (ENGINES.len(), SESSIONS.len(), SNAPSHOTS.len())
}
