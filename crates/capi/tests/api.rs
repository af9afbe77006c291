//! The C API driven from Rust as C would drive it: handles, buffers, errors,
//! and generation that equals the engine's own, plain and speculative.
//! Uses the default model (fetched on first use).

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr::{null, null_mut};

use tandem::*;

const PROMPT: &str = "<|im_start|>user\nList three colours.<|im_end|>\n<|im_start|>assistant\n";

fn last_error() -> String {
    // SAFETY: tandem_last_error returns a live NUL-terminated string
    unsafe { CStr::from_ptr(tandem_last_error()) }.to_string_lossy().into_owned()
}

fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn mtp_file() -> CString {
    CString::new(repo().join("models/support/smollm2-135m-instruct-mtp.gguf").to_str().unwrap()).unwrap()
}

/// An engine on the default model with a 1024-token context.
fn open(drafter: Option<&CString>, lookup: bool) -> *mut tandem_engine {
    let mut o = tandem_engine_options_default();
    o.threads = 2;
    o.ctx = 1024;
    o.drafter = drafter.map_or(null(), |d| d.as_ptr());
    o.lookup = lookup;
    let mut e = null_mut();
    // SAFETY: valid options and output
    let s = unsafe { tandem_engine_open(&o, &mut e) };
    assert_eq!(s, tandem_status::TANDEM_OK, "{}", last_error());
    e
}

fn tokenize(e: *const tandem_engine, text: &str) -> Vec<u32> {
    let c = CString::new(text).unwrap();
    let mut n = 0;
    // SAFETY: NULL buffer with capacity 0 asks for the count
    let s = unsafe { tandem_tokenize(e, c.as_ptr(), null_mut(), 0, &mut n) };
    let want = if n == 0 { tandem_status::TANDEM_OK } else { tandem_status::TANDEM_ERR_BUFFER_TOO_SMALL };
    assert_eq!(s, want);
    let mut ids = vec![0u32; n];
    // SAFETY: room for n ids
    let s = unsafe { tandem_tokenize(e, c.as_ptr(), ids.as_mut_ptr(), ids.len(), &mut n) };
    assert_eq!(s, tandem_status::TANDEM_OK, "{}", last_error());
    assert_eq!(n, ids.len());
    ids
}

struct Collected {
    ids: Vec<u32>,
    text: String,
    stop_after: Option<usize>,
    reenter: Option<*mut tandem_session>,
    reenter_status: Option<tandem_status>,
}

unsafe extern "C" fn collect(id: u32, piece: *const c_char, len: usize, user: *mut c_void) -> c_int {
    // SAFETY: `user` is the &mut Collected passed to generate
    let c = unsafe { &mut *(user as *mut Collected) };
    // SAFETY: the piece is `len` bytes followed by a NUL
    let bytes = unsafe { std::slice::from_raw_parts(piece as *const u8, len + 1) };
    assert_eq!(bytes[len], 0, "pieces are NUL-terminated");
    c.text.push_str(std::str::from_utf8(&bytes[..len]).expect("whole UTF-8 characters"));
    if id != TANDEM_TOKEN_NONE {
        c.ids.push(id);
    }
    if let Some(s) = c.reenter.take() {
        c.reenter_status = Some(tandem_session_truncate(s, 0));
    }
    c.stop_after.is_some_and(|n| c.ids.len() >= n) as c_int
}

fn generate(s: *mut tandem_session, prompt: &[u32], p: &tandem_generate_params) -> (Collected, tandem_stats) {
    generate_with(s, prompt, p, None, None)
}

fn generate_with(
    s: *mut tandem_session,
    prompt: &[u32],
    p: &tandem_generate_params,
    stop_after: Option<usize>,
    reenter: Option<*mut tandem_session>,
) -> (Collected, tandem_stats) {
    let mut c = Collected { ids: Vec::new(), text: String::new(), stop_after, reenter, reenter_status: None };
    let mut stats = std::mem::MaybeUninit::<tandem_stats>::uninit();
    // SAFETY: valid session, prompt, params, callback with its user data, stats output
    let st = unsafe {
        tandem_session_generate(s, prompt.as_ptr(), prompt.len(), p, Some(collect), &mut c as *mut _ as *mut c_void, stats.as_mut_ptr())
    };
    assert_eq!(st, tandem_status::TANDEM_OK, "{}", last_error());
    // SAFETY: written on success
    (c, unsafe { stats.assume_init() })
}

fn session(e: *const tandem_engine) -> *mut tandem_session {
    let mut s = null_mut();
    // SAFETY: valid output
    assert_eq!(unsafe { tandem_session_new(e, &mut s) }, tandem_status::TANDEM_OK, "{}", last_error());
    s
}

fn greedy(n: u32) -> tandem_generate_params {
    tandem_generate_params { max_tokens: n, ..tandem_generate_params_default() }
}

#[test]
fn invalid_handles_are_refused_not_dereferenced() {
    let bogus = 0xdead_bee0usize as *mut tandem_session;
    let mut n = 0usize;
    // SAFETY: the handles are never dereferenced; the outputs are valid
    unsafe {
        assert_eq!(tandem_session_n_tokens(null(), &mut n), tandem_status::TANDEM_ERR_INVALID_HANDLE);
        assert!(last_error().contains("session handle"), "{}", last_error());
        assert_eq!(tandem_session_n_tokens(bogus, &mut n), tandem_status::TANDEM_ERR_INVALID_HANDLE);
        assert_eq!(tandem_tokenize(null(), c"hi".as_ptr(), null_mut(), 0, &mut n), tandem_status::TANDEM_ERR_INVALID_HANDLE);
        assert!(last_error().contains("engine handle"), "{}", last_error());
    }
    assert_eq!(tandem_session_truncate(bogus, 0), tandem_status::TANDEM_ERR_INVALID_HANDLE);
    assert_eq!(tandem_session_free(bogus), tandem_status::TANDEM_ERR_INVALID_HANDLE);
    assert_eq!(tandem_session_free(null_mut()), tandem_status::TANDEM_OK);
    assert_eq!(tandem_engine_free(null_mut()), tandem_status::TANDEM_OK);
    assert_eq!(tandem_snapshot_free(null_mut()), tandem_status::TANDEM_OK);

    // a freed handle stays invalid, and an engine's handle is not a session's
    let e = open(None, false);
    let s = session(e);
    assert_eq!(tandem_session_truncate(e as *mut tandem_session, 0), tandem_status::TANDEM_ERR_INVALID_HANDLE);
    assert_eq!(tandem_session_free(s), tandem_status::TANDEM_OK);
    assert_eq!(tandem_session_free(s), tandem_status::TANDEM_ERR_INVALID_HANDLE);
    assert_eq!(tandem_session_truncate(s, 0), tandem_status::TANDEM_ERR_INVALID_HANDLE);
    let s2 = session(e);
    assert_ne!(s2, s, "handle numbers are not reused");
    assert_eq!(tandem_engine_free(e), tandem_status::TANDEM_OK);
    // the session outlives its engine handle
    let ids = vec![1u32, 2, 3];
    let (c, _) = generate(s2, &ids, &greedy(2));
    assert_eq!(c.ids.len(), 2);
    assert_eq!(tandem_session_free(s2), tandem_status::TANDEM_OK);
}

#[test]
fn bad_arguments_get_a_status_and_a_message() {
    let e = open(None, false);
    let mut n = 0usize;
    let mut buf = [0 as c_char; 4];
    // SAFETY: every pointer is valid or NULL as each case says
    unsafe {
        assert_eq!(tandem_tokenize(e, null(), null_mut(), 0, &mut n), tandem_status::TANDEM_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("text is NULL"), "{}", last_error());
        let not_utf8 = [0xffu8 as c_char, 0xfe_u8 as c_char, 0];
        assert_eq!(tandem_tokenize(e, not_utf8.as_ptr(), null_mut(), 0, &mut n), tandem_status::TANDEM_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("UTF-8"), "{}", last_error());
        assert_eq!(tandem_tokenize(e, c"hi".as_ptr(), null_mut(), 0, null_mut()), tandem_status::TANDEM_ERR_INVALID_ARGUMENT);

        // detokenize: the length needed, then the text; ids out of range refused
        let ids = tokenize(e, "Hello, world");
        assert_eq!(
            tandem_detokenize(e, ids.as_ptr(), ids.len(), buf.as_mut_ptr(), buf.len(), &mut n),
            tandem_status::TANDEM_ERR_BUFFER_TOO_SMALL
        );
        assert_eq!(n, "Hello, world".len());
        let mut big = vec![0 as c_char; n + 1];
        assert_eq!(tandem_detokenize(e, ids.as_ptr(), ids.len(), big.as_mut_ptr(), big.len(), &mut n), tandem_status::TANDEM_OK);
        assert_eq!(CStr::from_ptr(big.as_ptr()).to_str().unwrap(), "Hello, world");
        let bad = [5u32, 9_999_999];
        assert_eq!(tandem_detokenize(e, bad.as_ptr(), 2, big.as_mut_ptr(), big.len(), &mut n), tandem_status::TANDEM_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("9999999"), "{}", last_error());
        assert_eq!(tandem_detokenize(e, null(), 3, big.as_mut_ptr(), big.len(), &mut n), tandem_status::TANDEM_ERR_INVALID_ARGUMENT);

        // chat messages with a NULL field
        let m = [tandem_message { role: c"user".as_ptr(), content: null() }];
        assert_eq!(tandem_chat_render(e, m.as_ptr(), 1, null_mut(), 0, &mut n), tandem_status::TANDEM_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("messages[0].content"), "{}", last_error());

        // generation: empty prompt, token out of range, bad sampling settings
        let s = session(e);
        let mut stats = std::mem::zeroed::<tandem_stats>();
        let p = greedy(4);
        assert_eq!(tandem_session_generate(s, null(), 0, &p, None, null_mut(), &mut stats), tandem_status::TANDEM_ERR_INVALID_ARGUMENT);
        assert_eq!(
            tandem_session_generate(s, bad.as_ptr(), 2, &p, None, null_mut(), &mut stats),
            tandem_status::TANDEM_ERR_INVALID_ARGUMENT
        );
        for (bad_p, name) in [
            (tandem_generate_params { temperature: -1.0, ..p }, "temperature"),
            (tandem_generate_params { temperature: f32::NAN, ..p }, "temperature"),
            (tandem_generate_params { top_p: 2.0, ..p }, "top_p"),
            (tandem_generate_params { min_p: -0.5, ..p }, "min_p"),
        ] {
            let st = tandem_session_generate(s, ids.as_ptr(), ids.len(), &bad_p, None, null_mut(), &mut stats);
            assert_eq!(st, tandem_status::TANDEM_ERR_INVALID_ARGUMENT);
            assert!(last_error().contains(&format!("params.{name}")), "{}", last_error());
        }
        // a prompt longer than the context
        let long = vec![ids[0]; 1025];
        assert_eq!(
            tandem_session_generate(s, long.as_ptr(), long.len(), &p, None, null_mut(), &mut stats),
            tandem_status::TANDEM_ERR_CONTEXT
        );
        // the session still works after all that
        let (c, st) = generate(s, &ids, &p);
        assert_eq!((c.ids.len(), st.generated_tokens), (4, 4));
        tandem_session_free(s);
    }
    tandem_engine_free(e);
}

#[test]
fn files_that_cannot_be_used_fail_at_open() {
    let mut e = null_mut();
    let mut o = tandem_engine_options_default();
    o.model = c"/no/such/model.gguf".as_ptr();
    // SAFETY: valid options and output
    assert_eq!(unsafe { tandem_engine_open(&o, &mut e) }, tandem_status::TANDEM_ERR_MODEL);
    assert!(last_error().contains("/no/such/model.gguf"), "{}", last_error());
    assert!(e.is_null());

    let junk = std::env::temp_dir().join(format!("tandem-capi-junk-{}.gguf", std::process::id()));
    std::fs::write(&junk, b"GGUF but not really").unwrap();
    let junk_c = CString::new(junk.to_str().unwrap()).unwrap();
    o.model = junk_c.as_ptr();
    // SAFETY: as above
    assert_eq!(unsafe { tandem_engine_open(&o, &mut e) }, tandem_status::TANDEM_ERR_MODEL);

    // a drafter that is not a support file: an error, not a silent fallback
    o = tandem_engine_options_default();
    o.ctx = 512;
    o.drafter = junk_c.as_ptr();
    // SAFETY: as above
    assert_eq!(unsafe { tandem_engine_open(&o, &mut e) }, tandem_status::TANDEM_ERR_MODEL);
    assert!(last_error().contains("support file"), "{}", last_error());
    std::fs::remove_file(&junk).ok();
}

#[test]
fn generation_equals_the_engines_and_speculation_changes_nothing() {
    let e = open(None, false);
    let prompt = tokenize(e, PROMPT);
    let s = session(e);
    let (plain, st) = generate(s, &prompt, &greedy(48));
    assert_eq!(st.cycles, 0);
    assert_eq!(st.prompt_tokens, prompt.len());

    // the engine itself, same tokens
    let engine = std::sync::Arc::new(::tandem_engine::Engine::load(::tandem_engine::fetch::resolve(None, false).unwrap(), 2).unwrap());
    let mut session2 = engine.new_session(1024);
    let gp = ::tandem_engine::GenParams { max_tokens: 48, sampler: ::tandem_engine::SamplerParams::greedy() };
    let mut ids = Vec::new();
    session2
        .generate(&prompt, &gp, None, |id, _| {
            ids.push(id);
            true
        })
        .unwrap();
    assert_eq!(plain.ids, ids);

    for (drafter, lookup) in [(Some(mtp_file()), false), (None, true), (Some(mtp_file()), true)] {
        let es = open(drafter.as_ref(), lookup);
        let ss = session(es);
        let (spec, st) = generate(ss, &prompt, &greedy(48));
        assert_eq!(spec.ids, plain.ids, "drafter {drafter:?}, lookup {lookup}");
        assert_eq!(spec.text, plain.text);
        assert!(st.cycles > 0 && st.drafted >= st.accepted, "{st:?}");
        // speculation off for one call
        tandem_session_truncate(ss, 0);
        let (off, st) = generate(ss, &prompt, &tandem_generate_params { speculative: false, ..greedy(48) });
        assert_eq!((off.ids, st.cycles), (plain.ids.clone(), 0));
        tandem_session_free(ss);
        tandem_engine_free(es);
    }
    tandem_session_free(s);
    tandem_engine_free(e);
}

#[test]
fn truncate_and_snapshot_are_exact() {
    for drafter in [None, Some(mtp_file())] {
        let e = open(drafter.as_ref(), false);
        let prompt = tokenize(e, "<|im_start|>user\nWrite a story about a dragon who learns to bake.<|im_end|>\n<|im_start|>assistant\n");
        let s = session(e);
        let (first, st) = generate(s, &prompt, &greedy(12));
        assert_eq!(st.stop, tandem_stop::TANDEM_STOP_LENGTH, "the test wants an answer cut short");
        let mut snap = null_mut();
        // SAFETY: valid output
        assert_eq!(unsafe { tandem_session_snapshot(s, &mut snap) }, tandem_status::TANDEM_OK);

        // continue the conversation, then go back and continue again
        let mut history = prompt.clone();
        history.extend(&first.ids);
        let bos = tokenize(e, "").len();
        let turn = tokenize(e, "<|im_end|>\n<|im_start|>user\nAnd three more?<|im_end|>\n<|im_start|>assistant\n");
        history.extend(&turn[bos..]);
        let (second, st) = generate(s, &history, &greedy(24));
        assert_eq!(st.prefill_tokens, turn.len() - bos + 1, "the session reused what it held");

        // truncate to the prompt: the first answer again
        assert_eq!(tandem_session_truncate(s, prompt.len()), tandem_status::TANDEM_OK);
        let (again, _) = generate(s, &prompt, &greedy(12));
        assert_eq!(again.ids, first.ids);

        // restore after the first answer: the second answer again, with
        // nothing re-evaluated but the new turn
        assert_eq!(tandem_session_truncate(s, 3), tandem_status::TANDEM_OK);
        assert_eq!(tandem_session_restore(s, snap), tandem_status::TANDEM_OK);
        let mut n = 0;
        // SAFETY: valid output
        unsafe { tandem_session_n_tokens(s, &mut n) };
        assert_eq!(n, prompt.len() + first.ids.len() - 1, "the last generated token is not evaluated yet");
        let (second_again, _) = generate(s, &history, &greedy(24));
        assert_eq!(second_again.ids, second.ids);

        // a snapshot restores into another session of the same engine only
        let s2 = session(e);
        assert_eq!(tandem_session_restore(s2, snap), tandem_status::TANDEM_OK);
        let (second_elsewhere, _) = generate(s2, &history, &greedy(24));
        assert_eq!(second_elsewhere.ids, second.ids);
        let other = open(None, false);
        let s3 = session(other);
        assert_eq!(tandem_session_restore(s3, snap), tandem_status::TANDEM_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("another engine"), "{}", last_error());

        assert_eq!(tandem_snapshot_free(snap), tandem_status::TANDEM_OK);
        assert_eq!(tandem_session_restore(s, snap), tandem_status::TANDEM_ERR_INVALID_HANDLE);
        for s in [s, s2, s3] {
            tandem_session_free(s);
        }
        tandem_engine_free(other);
        tandem_engine_free(e);
    }
}

#[test]
fn the_callback_stops_generation_and_cannot_reenter_its_session() {
    let e = open(None, false);
    let prompt = tokenize(e, PROMPT);
    let s = session(e);
    let (c, st) = generate_with(s, &prompt, &greedy(40), Some(5), None);
    assert_eq!((c.ids.len(), st.stop), (5, tandem_stop::TANDEM_STOP_CALLBACK));
    let (c, st) = generate_with(s, &prompt, &greedy(3), None, Some(s));
    assert_eq!(c.reenter_status, Some(tandem_status::TANDEM_ERR_BUSY));
    assert_eq!(st.stop, tandem_stop::TANDEM_STOP_LENGTH);
    let mut n = 0;
    // SAFETY: valid output
    assert_eq!(unsafe { tandem_session_n_tokens(s, &mut n) }, tandem_status::TANDEM_OK, "free again after the call");
    tandem_session_free(s);
    tandem_engine_free(e);
}

#[test]
fn the_chat_template_and_the_version() {
    let e = open(None, false);
    let m = [tandem_message { role: c"user".as_ptr(), content: c"List three colours.".as_ptr() }];
    let mut n = 0;
    // SAFETY: valid messages and outputs
    unsafe {
        assert_eq!(tandem_chat_render(e, m.as_ptr(), 1, null_mut(), 0, &mut n), tandem_status::TANDEM_ERR_BUFFER_TOO_SMALL);
        let mut buf = vec![0 as c_char; n + 1];
        assert_eq!(tandem_chat_render(e, m.as_ptr(), 1, buf.as_mut_ptr(), buf.len(), &mut n), tandem_status::TANDEM_OK);
        let text = CStr::from_ptr(buf.as_ptr()).to_str().unwrap();
        assert!(text.ends_with(PROMPT), "{text:?}");
        assert_eq!(CStr::from_ptr(tandem_version()).to_str().unwrap(), env!("CARGO_PKG_VERSION"));
        let mut ctx = 0;
        assert_eq!(tandem_engine_ctx(e, &mut ctx), tandem_status::TANDEM_OK);
        assert_eq!(ctx, 1024);
    }
    tandem_engine_free(e);
}
