//! One-shot generation and the interactive chat loop.

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use tandem_engine::{Engine, GenParams, GenStats, SamplerParams, Session, SpecOptions, Speculator};
use tandem_tokenizer::ChatMessage;

use crate::args::RunArgs;

/// Set while a generation runs; Ctrl-C then cancels it instead of exiting.
static GENERATING: AtomicBool = AtomicBool::new(false);
static CANCEL: AtomicBool = AtomicBool::new(false);

fn install_ctrlc() {
    let _ = ctrlc::set_handler(|| {
        if GENERATING.load(Ordering::SeqCst) {
            CANCEL.store(true, Ordering::SeqCst);
        } else {
            eprintln!();
            std::process::exit(130);
        }
    });
}

fn params(a: &RunArgs) -> GenParams {
    let seed = a
        .seed
        .unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0));
    GenParams {
        max_tokens: a.n_predict,
        sampler: SamplerParams { temperature: a.temp, top_k: a.top_k, top_p: a.top_p, min_p: a.min_p, seed },
    }
}

/// Peak resident set size of this process in MiB (Linux; None elsewhere).
pub fn peak_rss_mib() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

fn print_stats(s: &GenStats) {
    let rss = peak_rss_mib().map(|m| format!(", peak RSS: {m:.1} MiB")).unwrap_or_default();
    eprintln!(
        "\n[prompt tokens: {} ({} evaluated), prefill: {:.1} tok/s, generated tokens: {}, decode: {:.1} tok/s, stop: {:?}{rss}]",
        s.prompt_tokens,
        s.prefill_tokens,
        s.prefill_tps(),
        s.gen_tokens,
        s.decode_tps(),
        s.stop.unwrap(),
    );
}

fn generate(session: &mut Session, spec: &mut Option<Speculator>, prompt: &[u32], p: &GenParams) -> Result<(String, GenStats)> {
    let mut text = String::new();
    let stdout = std::io::stdout();
    CANCEL.store(false, Ordering::SeqCst);
    GENERATING.store(true, Ordering::SeqCst);
    let r = session.generate_with(prompt, p, spec.as_mut(), Some(&CANCEL), |_, piece| {
        let mut out = stdout.lock();
        let _ = out.write_all(piece.as_bytes());
        let _ = out.flush();
        text.push_str(piece);
        true
    });
    GENERATING.store(false, Ordering::SeqCst);
    let stats = r?;
    Ok((text, stats))
}

fn messages_with_system(a: &RunArgs, history: &[ChatMessage]) -> Vec<ChatMessage> {
    let mut m = Vec::new();
    if let Some(s) = &a.system {
        m.push(ChatMessage::new("system", s.clone()));
    }
    m.extend_from_slice(history);
    m
}

pub fn run(a: &RunArgs) -> Result<()> {
    let engine = crate::load_engine(&a.model)?;
    let ctx = a.ctx.unwrap_or(engine.model.cfg.ctx_train);
    let mut session = engine.new_session(ctx);
    let opts = a.spec.options(&engine)?;
    let mut spec = engine.speculator(&opts, ctx)?;
    if let Some(sp) = &spec {
        eprintln!("speculative decoding: {}", sp.drafter_name());
    }
    install_ctrlc();
    let p = params(a);

    let prompt_text = match (&a.prompt, &a.file) {
        (Some(p), _) => Some(p.clone()),
        (None, Some(f)) => Some(std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?),
        _ => None,
    };
    if let Some(text) = prompt_text {
        let rendered = if a.raw { text } else { engine.render_chat(&messages_with_system(a, &[ChatMessage::new("user", text)]))? };
        let ids = engine.tokenize_prompt(&rendered);
        let (_, stats) = generate(&mut session, &mut spec, &ids, &p)?;
        opts.persist();
        println!();
        print_stats(&stats);
        print_spec_stats(a, &spec);
        return Ok(());
    }
    interactive(a, &engine, &mut session, &mut spec, &opts, &p)
}

const HELP: &str =
    "commands: /help  this text · /reset  forget the conversation · /quit  leave (or Ctrl-D)\nCtrl-C stops the current answer.";

fn print_spec_stats(a: &RunArgs, spec: &Option<Speculator>) {
    if let (true, Some(sp)) = (a.spec.spec_stats, spec) {
        eprintln!("{}", sp.stats.report());
    }
}

fn interactive(
    a: &RunArgs,
    engine: &Arc<Engine>,
    session: &mut Session,
    spec: &mut Option<Speculator>,
    opts: &SpecOptions,
    p: &GenParams,
) -> Result<()> {
    eprintln!("interactive chat. {HELP}");
    let stdin = std::io::stdin();
    let mut history: Vec<ChatMessage> = Vec::new();
    let mut line = String::new();
    loop {
        eprint!("\n> ");
        let _ = std::io::stderr().flush();
        line.clear();
        if stdin.lock().read_line(&mut line)? == 0 {
            eprintln!();
            return Ok(());
        }
        let input = line.trim_end_matches(['\n', '\r']);
        match input.trim() {
            "" => continue,
            "/quit" | "/exit" => return Ok(()),
            "/help" => {
                eprintln!("{HELP}");
                continue;
            }
            "/reset" => {
                history.clear();
                session.reset();
                eprintln!("(conversation reset)");
                continue;
            }
            s if s.starts_with('/') => {
                eprintln!("unknown command {s}. {HELP}");
                continue;
            }
            _ => {}
        }
        history.push(ChatMessage::new("user", input));
        let rendered = if a.raw {
            history.iter().map(|m| m.content.as_str()).collect::<Vec<_>>().join("\n")
        } else {
            engine.render_chat(&messages_with_system(a, &history))?
        };
        let ids = engine.tokenize_prompt(&rendered);
        if ids.len() >= session.ctx() {
            eprintln!("(the conversation no longer fits the context of {} tokens; use /reset)", session.ctx());
            history.pop();
            continue;
        }
        let (answer, stats) = generate(session, spec, &ids, p)?;
        opts.persist();
        println!();
        print_stats(&stats);
        print_spec_stats(a, spec);
        history.push(ChatMessage::new("assistant", answer));
    }
}
