//! Plain vs speculative decoding on a file of real prompts (`tandem bench
//! --prompts`): per-prompt decode throughput, speculative statistics, an
//! exactness check (greedy speculative output must equal plain output), a
//! per-category summary, CSV and a hand-written SVG bar chart.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tandem_speculative::{SpecStats, Speculator};
use tandem_tokenizer::ChatMessage;

use tandem_engine::{Engine, EngineError, GenParams, GenStats, SamplerParams, Session, SpecOptions};

#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    #[error("reading {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}:{line}: {msg}")]
    Parse { path: PathBuf, line: usize, msg: String },
    #[error("{0}: no prompts")]
    Empty(PathBuf),
    #[error("prompt {id}: {tokens} tokens leave no room to generate in a context of {ctx}")]
    TooLong { id: String, tokens: usize, ctx: usize },
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// How a prompt's text becomes tokens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PromptText {
    /// A user chat message, rendered with the model's chat template.
    User(String),
    /// Text tokenized as is.
    Raw(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BenchPrompt {
    pub id: String,
    pub category: String,
    pub text: PromptText,
}

#[derive(Deserialize)]
struct PromptLine {
    id: Option<String>,
    /// `kind` is the code benchmark's name for it (`prompts-code-dev.jsonl`).
    #[serde(alias = "kind")]
    category: Option<String>,
    user: Option<String>,
    raw: Option<String>,
}

/// Parse JSON-lines prompts (`id`, `category` or `kind`, and exactly one of
/// `user` or `raw`). Blank lines are skipped. `path` only names the source in errors.
pub fn parse_prompts(text: &str, path: &Path) -> Result<Vec<BenchPrompt>, PromptError> {
    let mut out = Vec::new();
    let mut ids = HashSet::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let err = |msg: String| PromptError::Parse { path: path.to_path_buf(), line: line_no, msg };
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let p: PromptLine = serde_json::from_str(line).map_err(|e| {
            // serde counts lines within this one line: keep only the column
            let msg = e.to_string();
            let msg = msg.split(" at line ").next().unwrap_or(&msg).to_string();
            err(format!("invalid JSON at column {}: {msg}", e.column()))
        })?;
        let id = p.id.filter(|s| !s.is_empty()).ok_or_else(|| err("missing \"id\"".into()))?;
        let category =
            p.category.filter(|s| !s.is_empty()).ok_or_else(|| err(format!("prompt {id}: missing \"category\" (or \"kind\")")))?;
        let text = match (p.user, p.raw) {
            (Some(u), None) => PromptText::User(u),
            (None, Some(r)) => PromptText::Raw(r),
            (Some(_), Some(_)) => return Err(err(format!("prompt {id}: has both \"user\" and \"raw\""))),
            (None, None) => return Err(err(format!("prompt {id}: needs \"user\" or \"raw\""))),
        };
        if !ids.insert(id.clone()) {
            return Err(err(format!("duplicate id {id}")));
        }
        out.push(BenchPrompt { id, category, text });
    }
    if out.is_empty() {
        return Err(PromptError::Empty(path.to_path_buf()));
    }
    Ok(out)
}

/// Read a prompt file (see [`parse_prompts`]).
pub fn load_prompts(path: impl AsRef<Path>) -> Result<Vec<BenchPrompt>, PromptError> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|source| PromptError::Io { path: path.to_path_buf(), source })?;
    parse_prompts(&text, path)
}

impl BenchPrompt {
    /// The text the tokenizer reads: a user message rendered with the
    /// model's chat template, or the raw text as is. Other engines given this
    /// text (special tokens parsed) see the same prompt.
    pub fn render(&self, engine: &Engine) -> Result<String, EngineError> {
        Ok(match &self.text {
            PromptText::User(u) => engine.render_chat(&[ChatMessage::new("user", u.as_str())])?,
            PromptText::Raw(r) => r.clone(),
        })
    }

    pub fn tokenize(&self, engine: &Engine) -> Result<Vec<u32>, EngineError> {
        Ok(engine.tokenize_prompt(&self.render(engine)?))
    }
}

/// One prompt's measurements. The `spec_*` fields and the speculative
/// statistics are None when no drafter was configured.
#[derive(Debug, Clone, Serialize)]
pub struct PromptRow {
    pub id: String,
    pub category: String,
    pub prompt_tokens: usize,
    /// The prompt as the tokenizer read it (chat template applied).
    pub prompt_text: String,
    /// Plain decoding's output, detokenized.
    pub plain_text: String,
    /// Tokens generated by plain decoding (end-of-generation included).
    pub gen_tokens: usize,
    pub plain_secs: f64,
    pub plain_tps: f64,
    pub plain_stop: String,
    pub spec_gen_tokens: Option<usize>,
    pub spec_secs: Option<f64>,
    pub spec_tps: Option<f64>,
    pub spec_stop: Option<String>,
    /// spec_tps / plain_tps.
    pub speedup: Option<f64>,
    pub cycles: Option<u64>,
    pub drafted: Option<u64>,
    pub accepted: Option<u64>,
    /// accepted / drafted.
    pub acceptance: Option<f64>,
    /// Tokens committed per verify cycle.
    pub mean_committed: Option<f64>,
    /// Plain and speculative token sequences are identical.
    pub identical: Option<bool>,
    /// First position where they differ.
    pub first_mismatch: Option<usize>,
    /// Which ran first ("plain" or "spec"; alternates per prompt).
    pub first: String,
    /// Mean seconds of the speculative run's one-row verify forwards (its
    /// plain cycles), to set against `plain_secs / gen_tokens`.
    pub spec_one_row_secs: Option<f64>,
}

/// Aggregate over a set of prompts (a category, or all).
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub category: String,
    pub prompts: usize,
    pub plain_tokens: usize,
    pub plain_secs: f64,
    /// Total generated tokens / total decode time.
    pub plain_tps: f64,
    pub spec_tokens: Option<usize>,
    pub spec_secs: Option<f64>,
    pub spec_tps: Option<f64>,
    /// spec_tps / plain_tps (of the totals).
    pub speedup: Option<f64>,
    /// Mean of the per-prompt speedups.
    pub mean_speedup: Option<f64>,
    pub drafted: Option<u64>,
    pub accepted: Option<u64>,
    pub acceptance: Option<f64>,
    pub mean_committed: Option<f64>,
    pub identical: Option<usize>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PromptBenchReport {
    /// Drafter description, None when speculation is off.
    pub drafter: Option<String>,
    pub n_predict: usize,
    pub ctx: usize,
    pub threads: usize,
    pub rows: Vec<PromptRow>,
    pub categories: Vec<Summary>,
    pub overall: Summary,
    /// Speculative statistics over all measured prompts (warm-up excluded).
    pub spec_stats: Option<SpecStats>,
}

impl PromptBenchReport {
    /// Prompts whose speculative output differed from plain.
    pub fn mismatches(&self) -> Vec<&PromptRow> {
        self.rows.iter().filter(|r| r.identical == Some(false)).collect()
    }

    pub fn overall_line(&self) -> String {
        let o = &self.overall;
        match (o.spec_tps, o.speedup) {
            (Some(s), Some(x)) => format!(
                "overall: plain {:.2} tok/s, spec {:.2} tok/s, speedup {:.3}×, acceptance {:.1}%, mean committed {:.2}, identical {}/{}",
                o.plain_tps,
                s,
                x,
                100.0 * o.acceptance.unwrap_or(0.0),
                o.mean_committed.unwrap_or(0.0),
                o.identical.unwrap_or(0),
                o.prompts
            ),
            _ => format!("overall: plain {:.2} tok/s (no drafter: speculative columns empty), {} prompts", o.plain_tps, o.prompts),
        }
    }

    pub const CSV_HEADER: &'static str =
        "id,category,prompt_tokens,gen_tokens,plain_tps,spec_tps,speedup,drafted,accepted,acceptance,mean_committed,identical";

    pub fn csv(&self) -> String {
        let mut s = String::from(Self::CSV_HEADER);
        s.push('\n');
        let f = |v: Option<f64>, d: usize| v.map(|x| format!("{x:.d$}")).unwrap_or_default();
        let u = |v: Option<u64>| v.map(|x| x.to_string()).unwrap_or_default();
        for r in &self.rows {
            let _ = writeln!(
                s,
                "{},{},{},{},{:.3},{},{},{},{},{},{},{}",
                csv_field(&r.id),
                csv_field(&r.category),
                r.prompt_tokens,
                r.gen_tokens,
                r.plain_tps,
                f(r.spec_tps, 3),
                f(r.speedup, 4),
                u(r.drafted),
                u(r.accepted),
                f(r.acceptance, 4),
                f(r.mean_committed, 3),
                r.identical.map(|b| b.to_string()).unwrap_or_default()
            );
        }
        s
    }

    /// A fixed-width table of the rows, the categories and the overall line.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let f = |v: Option<f64>, w: usize, d: usize| match v {
            Some(x) => format!("{x:>w$.d$}"),
            None => format!("{:>w$}", "-"),
        };
        let u = |v: Option<u64>, w: usize| match v {
            Some(x) => format!("{x:>w$}"),
            None => format!("{:>w$}", "-"),
        };
        let idw = self.rows.iter().map(|r| r.id.len()).max().unwrap_or(2).max(2);
        let cw = self.rows.iter().map(|r| r.category.len()).max().unwrap_or(8).max(8);
        let _ = writeln!(
            s,
            "{:<idw$} {:<cw$} {:>6} {:>5} {:>9} {:>9} {:>7} {:>7} {:>8} {:>6} {:>6} {:>5}",
            "id", "category", "prompt", "gen", "plain t/s", "spec t/s", "speedup", "drafted", "accepted", "acc%", "commit", "same"
        );
        for r in &self.rows {
            let same = match r.identical {
                Some(true) => "yes".to_string(),
                Some(false) => format!("NO@{}", r.first_mismatch.unwrap_or(0)),
                None => "-".into(),
            };
            let _ = writeln!(
                s,
                "{:<idw$} {:<cw$} {:>6} {:>5} {:>9.2} {} {} {} {} {} {} {:>5}",
                r.id,
                r.category,
                r.prompt_tokens,
                r.gen_tokens,
                r.plain_tps,
                f(r.spec_tps, 9, 2),
                f(r.speedup, 6, 3).to_string() + if r.speedup.is_some() { "×" } else { " " },
                u(r.drafted, 7),
                u(r.accepted, 8),
                f(r.acceptance.map(|a| 100.0 * a), 6, 1),
                f(r.mean_committed, 6, 2),
                same
            );
        }
        let _ = writeln!(s);
        s.push_str(&summary_table(&self.categories, &self.overall, cw));
        let _ = writeln!(s);
        s.push_str(&self.overall_line());
        s.push('\n');
        s
    }
}

fn opt_f(v: Option<f64>, w: usize, d: usize) -> String {
    match v {
        Some(x) => format!("{x:>w$.d$}"),
        None => format!("{:>w$}", "-"),
    }
}

/// The per-category table (categories, then `overall`); `cw`: width of the
/// category column.
fn summary_table(categories: &[Summary], overall: &Summary, cw: usize) -> String {
    let f = opt_f;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<cw$} {:>3} {:>7} {:>9} {:>9} {:>7} {:>8} {:>6} {:>6} {:>5}",
        "category", "n", "tokens", "plain t/s", "spec t/s", "speedup", "mean spd", "acc%", "commit", "same"
    );
    for c in categories.iter().chain(std::iter::once(overall)) {
        let _ = writeln!(
            s,
            "{:<cw$} {:>3} {:>7} {:>9.2} {} {} {} {} {} {:>5}",
            c.category,
            c.prompts,
            c.plain_tokens,
            c.plain_tps,
            f(c.spec_tps, 9, 2),
            f(c.speedup, 6, 3) + if c.speedup.is_some() { "×" } else { " " },
            f(c.mean_speedup, 7, 3) + if c.mean_speedup.is_some() { "×" } else { " " },
            f(c.acceptance.map(|a| 100.0 * a), 6, 1),
            f(c.mean_committed, 6, 2),
            c.identical.map(|n| format!("{n}/{}", c.prompts)).unwrap_or_else(|| "-".into())
        );
    }
    s
}

/// Median of `xs` (the mean of the middle two for an even count); None when
/// empty.
pub fn median(xs: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 { v[n / 2] } else { 0.5 * (v[n / 2 - 1] + v[n / 2]) })
}

/// Several rounds of the same prompt bench in one process (`tandem bench
/// --prompts F --rounds N`). On this shared machine plain decoding drifts
/// between runs by more than the changes under test (145 to 268 tok/s in
/// docs/experiments/005-dspark.md §7k), and the speculative ratio drifts with it: one round's
/// ratio is one sample. The rounds give its spread and its median.
#[derive(Debug, Clone, Serialize)]
pub struct RoundsReport {
    pub rounds: Vec<PromptBenchReport>,
    /// All rounds' prompts together, per category and overall (tok/s of the
    /// summed tokens and decode times).
    pub categories: Vec<Summary>,
    pub overall: Summary,
    /// Each round's overall speedup, in round order.
    pub speedups: Vec<f64>,
    /// Median of `speedups`.
    pub median_speedup: Option<f64>,
    /// Per category, the median over the rounds of that round's category
    /// speedup (categories in order of first appearance).
    pub category_median_speedups: Vec<(String, f64)>,
}

/// Where the time of the speculative runs went, set against the plain runs
/// of the same prompts: the plain time per token; the mean verify forward of
/// one row and of the multi-row width used most, as decoding met them (a
/// one-row forward slower than a plain token means the speculative loop
/// pays more per step than the model); all draft time over the cycles that
/// verified a draft (proposals the scheduler then cut to nothing included);
/// and the share of speculative decode time outside drafting and verifying.
/// None without speculative statistics.
pub fn cost_line(overall: &Summary, st: &SpecStats) -> Option<String> {
    let spec_secs = overall.spec_secs?;
    if overall.plain_tokens == 0 || spec_secs <= 0.0 {
        return None;
    }
    let plain = overall.plain_secs / overall.plain_tokens as f64;
    let fwd = |rows: usize| match st.mean_forward_secs(rows) {
        Some(t) => format!("{:.2} ms ({:.2}×)", t * 1e3, t / plain),
        None => "-".into(),
    };
    // the multi-row width decoding used most (2 when none was used)
    let wide = (1..st.draft_hist.len()).max_by_key(|&k| (st.draft_hist[k], std::cmp::Reverse(k))).map_or(2, |k| k + 1);
    let drafting = st.cycles - st.plain_cycles;
    let draft = if drafting > 0 { format!("{:.2} ms", st.draft_secs / drafting as f64 * 1e3) } else { "-".into() };
    let outside = 1.0 - (st.draft_secs + st.verify_secs) / spec_secs;
    Some(format!(
        "costs: plain {:.2} ms/token; verify forward of 1 row {}, of {wide} rows {}; draft {draft} per verified draft; {:.1}% of speculative time outside draft and verify",
        plain * 1e3,
        fwd(1),
        fwd(wide),
        100.0 * outside
    ))
}

impl PromptBenchReport {
    /// [`cost_line`] of this run.
    pub fn cost_line(&self) -> Option<String> {
        cost_line(&self.overall, self.spec_stats.as_ref()?)
    }
}

impl RoundsReport {
    pub fn new(rounds: Vec<PromptBenchReport>) -> Self {
        let (categories, overall) = summaries(rounds.iter().flat_map(|r| r.rows.iter()));
        let speedups: Vec<f64> = rounds.iter().filter_map(|r| r.overall.speedup).collect();
        let median_speedup = median(&speedups);
        let category_median_speedups = categories
            .iter()
            .filter_map(|c| {
                let per_round: Vec<f64> = rounds
                    .iter()
                    .filter_map(|r| r.categories.iter().find(|rc| rc.category == c.category).and_then(|rc| rc.speedup))
                    .collect();
                median(&per_round).map(|m| (c.category.clone(), m))
            })
            .collect();
        RoundsReport { rounds, categories, overall, speedups, median_speedup, category_median_speedups }
    }

    /// Speculative statistics of all rounds merged.
    pub fn spec_stats(&self) -> Option<SpecStats> {
        let mut out: Option<SpecStats> = None;
        for st in self.rounds.iter().filter_map(|r| r.spec_stats.as_ref()) {
            out.get_or_insert_with(SpecStats::default).merge(st);
        }
        out
    }

    /// [`cost_line`] of all rounds pooled.
    pub fn cost_line(&self) -> Option<String> {
        cost_line(&self.overall, &self.spec_stats()?)
    }

    /// Prompts (of any round) whose speculative output differed from plain.
    pub fn mismatches(&self) -> Vec<&PromptRow> {
        self.rounds.iter().flat_map(|r| r.mismatches()).collect()
    }

    /// The last line: median, spread and the pooled ratio.
    pub fn rounds_line(&self) -> String {
        let n = self.rounds.len();
        match self.median_speedup {
            Some(m) => {
                let lo = self.speedups.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = self.speedups.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let plain: Vec<f64> = self.rounds.iter().map(|r| r.overall.plain_tps).collect();
                format!(
                    "rounds: {n}, speedup median {m:.3}× (min {lo:.3}×, max {hi:.3}×), pooled {:.3}×; plain tok/s median {:.2} ({:.2}–{:.2}); identical {}/{}",
                    self.overall.speedup.unwrap_or(0.0),
                    median(&plain).unwrap_or(0.0),
                    plain.iter().copied().fold(f64::INFINITY, f64::min),
                    plain.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                    self.overall.identical.unwrap_or(0),
                    self.overall.prompts
                )
            }
            None => {
                let plain: Vec<f64> = self.rounds.iter().map(|r| r.overall.plain_tps).collect();
                format!("rounds: {n}, plain tok/s median {:.2} (no drafter)", median(&plain).unwrap_or(0.0))
            }
        }
    }

    /// One line per round, the pooled per-category table with each
    /// category's median speedup, and the rounds line.
    pub fn table(&self) -> String {
        let f = opt_f;
        let mut s = String::new();
        let _ =
            writeln!(s, "{:<6} {:>9} {:>9} {:>8} {:>6} {:>6} {:>7}", "round", "plain t/s", "spec t/s", "speedup", "acc%", "commit", "same");
        for (i, r) in self.rounds.iter().enumerate() {
            let o = &r.overall;
            let _ = writeln!(
                s,
                "{:<6} {:>9.2} {} {} {} {} {:>7}",
                i + 1,
                o.plain_tps,
                f(o.spec_tps, 9, 2),
                f(o.speedup, 7, 3) + if o.speedup.is_some() { "×" } else { " " },
                f(o.acceptance.map(|a| 100.0 * a), 6, 1),
                f(o.mean_committed, 6, 2),
                o.identical.map(|n| format!("{n}/{}", o.prompts)).unwrap_or_else(|| "-".into())
            );
        }
        let _ = writeln!(s);
        let cw = self.categories.iter().map(|c| c.category.len()).max().unwrap_or(8).max(8);
        let _ = writeln!(s, "all rounds together:");
        s.push_str(&summary_table(&self.categories, &self.overall, cw));
        if !self.category_median_speedups.is_empty() {
            let parts: Vec<String> = self.category_median_speedups.iter().map(|(c, m)| format!("{c} {m:.3}×")).collect();
            let _ = writeln!(s, "median speedup per category over the rounds: {}", parts.join(", "));
        }
        let _ = writeln!(s);
        s.push_str(&self.rounds_line());
        s.push('\n');
        s
    }
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn stop_name(g: &GenStats) -> String {
    g.stop.map(|s| format!("{s:?}").to_lowercase()).unwrap_or_default()
}

fn tps(tokens: usize, secs: f64) -> f64 {
    tokens as f64 / secs.max(1e-9)
}

/// One greedy generation from a fresh session: (generated ids without the
/// end-of-generation token, stats).
fn generate(
    engine: &Arc<Engine>,
    ctx: usize,
    prompt: &[u32],
    n: usize,
    spec: Option<&mut Speculator>,
) -> Result<(Vec<u32>, GenStats), EngineError> {
    let mut session = Session::new(engine.clone(), ctx);
    let params = GenParams { max_tokens: n, sampler: SamplerParams::greedy() };
    let mut ids = Vec::with_capacity(n);
    let st = session.generate_with(prompt, &params, spec, None, |id, _| {
        if id != u32::MAX {
            ids.push(id);
        }
        true
    })?;
    Ok((ids, st))
}

/// Per-category summaries (categories in order of first appearance) and the
/// overall one.
fn summaries<'a>(rows: impl Iterator<Item = &'a PromptRow>) -> (Vec<Summary>, Summary) {
    let mut by_cat: BTreeMap<&str, Vec<&PromptRow>> = BTreeMap::new();
    let mut order: Vec<&str> = Vec::new();
    let mut all = Vec::new();
    for r in rows {
        if !by_cat.contains_key(r.category.as_str()) {
            order.push(&r.category);
        }
        by_cat.entry(&r.category).or_default().push(r);
        all.push(r);
    }
    let categories = order.iter().map(|c| summarize(c, &by_cat[c])).collect();
    (categories, summarize("overall", &all))
}

fn summarize(category: &str, rows: &[&PromptRow]) -> Summary {
    let plain_tokens: usize = rows.iter().map(|r| r.gen_tokens).sum();
    let plain_secs: f64 = rows.iter().map(|r| r.plain_secs).sum();
    let plain_tps = tps(plain_tokens, plain_secs);
    let has_spec = rows.iter().all(|r| r.spec_secs.is_some()) && !rows.is_empty();
    let (mut spec_tokens, mut spec_secs, mut spec_tps, mut speedup, mut mean_speedup) = (None, None, None, None, None);
    let (mut drafted, mut accepted, mut acceptance, mut mean_committed, mut identical) = (None, None, None, None, None);
    if has_spec {
        let tok: usize = rows.iter().map(|r| r.spec_gen_tokens.unwrap_or(0)).sum();
        let secs: f64 = rows.iter().map(|r| r.spec_secs.unwrap_or(0.0)).sum();
        let t = tps(tok, secs);
        spec_tokens = Some(tok);
        spec_secs = Some(secs);
        spec_tps = Some(t);
        speedup = Some(t / plain_tps.max(1e-9));
        mean_speedup = Some(rows.iter().map(|r| r.speedup.unwrap_or(0.0)).sum::<f64>() / rows.len() as f64);
        let d: u64 = rows.iter().map(|r| r.drafted.unwrap_or(0)).sum();
        let a: u64 = rows.iter().map(|r| r.accepted.unwrap_or(0)).sum();
        drafted = Some(d);
        accepted = Some(a);
        acceptance = Some(if d == 0 { 0.0 } else { a as f64 / d as f64 });
        let cycles: u64 = rows.iter().map(|r| r.cycles.unwrap_or(0)).sum();
        // committed = accepted + one target token per cycle
        mean_committed = Some(if cycles == 0 { 0.0 } else { (a + cycles) as f64 / cycles as f64 });
        identical = Some(rows.iter().filter(|r| r.identical == Some(true)).count());
    }
    Summary {
        category: category.to_string(),
        prompts: rows.len(),
        plain_tokens,
        plain_secs,
        plain_tps,
        spec_tokens,
        spec_secs,
        spec_tps,
        speedup,
        mean_speedup,
        drafted,
        accepted,
        acceptance,
        mean_committed,
        identical,
    }
}

/// Greedy generation of `n_predict` tokens per prompt, plain and (when
/// `spec` enables a drafter) speculative, each from a fresh session; the order
/// alternates per prompt. Only decode time is measured; tok/s is generated
/// tokens / decode time for both. One speculator serves all prompts (its
/// scheduler keeps what it learned); a warm-up generation of each kind runs
/// first. A suffix cache is emptied before each speculative generation, so
/// every prompt is measured as a fresh one, with no earlier outputs to draft
/// from (`scripts/bench-trace.py` measures what history brings). `ctx`: session context (None: longest prompt + n_predict + margin).
/// `round` shifts the alternation (prompt i runs speculative first when
/// i + round is odd), so that over two rounds every prompt runs each way
/// first once. `progress(i, n, row)` is called after each prompt.
pub fn run_prompt_bench(
    engine: &Arc<Engine>,
    prompts: &[BenchPrompt],
    n_predict: usize,
    spec: &SpecOptions,
    ctx: Option<usize>,
    round: usize,
    mut progress: impl FnMut(usize, usize, &PromptRow),
) -> Result<PromptBenchReport, PromptError> {
    let n_predict = n_predict.max(1);
    let tokenized: Vec<Vec<u32>> = prompts.iter().map(|p| p.tokenize(engine)).collect::<Result<_, _>>()?;
    let longest = tokenized.iter().map(|t| t.len()).max().unwrap_or(1);
    let ctx = ctx.unwrap_or(longest + n_predict + tandem_speculative::MAX_DRAFT + 2);
    if let Some((i, t)) = tokenized.iter().enumerate().find(|(_, t)| t.len() >= ctx) {
        return Err(PromptError::TooLong { id: prompts[i].id.clone(), tokens: t.len(), ctx });
    }
    let mut sp = engine.speculator(spec, ctx)?;

    // warm-up: page in weights, spin the pool, let the scheduler profile
    if let Some(first) = tokenized.first() {
        let n = n_predict.min(16);
        generate(engine, ctx, first, n, None)?;
        if let Some(sp) = sp.as_mut() {
            generate(engine, ctx, first, n, Some(sp))?;
        }
    }
    let mut total_stats = sp.as_ref().map(|_| SpecStats::default());

    let mut rows = Vec::with_capacity(prompts.len());
    for (i, (p, toks)) in prompts.iter().zip(&tokenized).enumerate() {
        let spec_first = (i + round) % 2 == 1 && sp.is_some();
        let mut plain = None;
        let mut specd = None;
        for pass in 0..2 {
            let do_spec = (pass == 0) == spec_first;
            if do_spec {
                if let Some(c) = &spec.suffix {
                    c.clear();
                }
                if let Some(s) = sp.as_mut() {
                    let r = generate(engine, ctx, toks, n_predict, Some(s))?;
                    let mine = r.1.spec.clone().unwrap_or_default();
                    specd = Some((r, mine));
                }
            } else {
                plain = Some(generate(engine, ctx, toks, n_predict, None)?);
            }
        }
        let (plain_ids, pst) = plain.expect("plain pass ran");
        let plain_secs = pst.decode_time.as_secs_f64();
        let plain_tps = tps(pst.gen_tokens, plain_secs);
        let mut row = PromptRow {
            id: p.id.clone(),
            category: p.category.clone(),
            prompt_tokens: toks.len(),
            prompt_text: p.render(engine)?,
            plain_text: engine.tokenizer.decode(&plain_ids),
            gen_tokens: pst.gen_tokens,
            plain_secs,
            plain_tps,
            plain_stop: stop_name(&pst),
            spec_gen_tokens: None,
            spec_secs: None,
            spec_tps: None,
            spec_stop: None,
            speedup: None,
            cycles: None,
            drafted: None,
            accepted: None,
            acceptance: None,
            mean_committed: None,
            identical: None,
            first_mismatch: None,
            first: if spec_first { "spec" } else { "plain" }.into(),
            spec_one_row_secs: None,
        };
        if let Some(((spec_ids, sst), stats)) = specd {
            let secs = sst.decode_time.as_secs_f64();
            let t = tps(sst.gen_tokens, secs);
            let same = spec_ids == plain_ids && sst.gen_tokens == pst.gen_tokens;
            row.spec_gen_tokens = Some(sst.gen_tokens);
            row.spec_secs = Some(secs);
            row.spec_tps = Some(t);
            row.spec_stop = Some(stop_name(&sst));
            row.speedup = Some(t / plain_tps.max(1e-9));
            row.cycles = Some(stats.cycles);
            row.drafted = Some(stats.drafted);
            row.accepted = Some(stats.accepted);
            row.acceptance = Some(stats.acceptance_rate());
            row.mean_committed = Some(stats.mean_committed());
            row.identical = Some(same);
            row.spec_one_row_secs = stats.mean_forward_secs(1);
            if !same {
                row.first_mismatch = Some(plain_ids.iter().zip(&spec_ids).take_while(|(a, b)| a == b).count());
            }
            if let Some(t) = total_stats.as_mut() {
                t.merge(&stats);
            }
        }
        progress(i, prompts.len(), &row);
        rows.push(row);
    }

    let (categories, overall) = summaries(rows.iter());
    Ok(PromptBenchReport {
        drafter: sp.as_ref().map(|s| s.drafter_name()),
        n_predict,
        ctx,
        threads: engine.pool.threads(),
        categories,
        overall,
        spec_stats: total_stats,
        rows,
    })
}

fn xml_escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            c => o.push(c),
        }
    }
    o
}

/// A step for axis ticks giving about `n` intervals over `0..max`.
fn nice_step(max: f64, n: f64) -> f64 {
    let raw = (max / n).max(1e-9);
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let m = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 2.5 {
        2.5
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * mag
}

/// A horizontal bar chart (one `<rect>` per bar) of `bars` = (label, value),
/// with a dashed reference line at 1.0, value labels, axis labels and a title.
pub fn speedup_svg(title: &str, subtitle: &str, bars: &[(String, f64)]) -> String {
    // wide enough for the title (≈ 9.5 px per character at 16 px bold)
    let label_w = bars.iter().map(|b| b.0.chars().count()).max().unwrap_or(0) as f64 * 7.5 + 40.0;
    let text_w = (title.chars().count() as f64 * 9.5).max(subtitle.chars().count() as f64 * 6.8) + 40.0;
    let (left, right, top, row_h, bottom) = (label_w.max(120.0), 70.0, 78.0, 34.0, 62.0);
    let w = ((left + right + 520.0).max(text_w)).round();
    let plot_w = w - left - right;
    let plot_h = row_h * bars.len().max(1) as f64;
    let h = top + plot_h + bottom;
    let vmax = bars.iter().map(|b| b.1).filter(|v| v.is_finite()).fold(1.0f64, f64::max) * 1.12;
    let step = nice_step(vmax, 6.0);
    let xmax = (vmax / step).ceil() * step;
    let x = |v: f64| left + plot_w * (v.max(0.0) / xmax);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="13">"#
    );
    let _ = writeln!(s, r#"<path d="M0 0H{w}V{h}H0Z" fill="white"/>"#);
    let _ =
        writeln!(s, r#"<text x="{}" y="26" text-anchor="middle" font-size="16" font-weight="bold">{}</text>"#, w / 2.0, xml_escape(title));
    let _ =
        writeln!(s, r##"<text x="{}" y="46" text-anchor="middle" font-size="12" fill="#444">{}</text>"##, w / 2.0, xml_escape(subtitle));
    // grid and ticks
    let mut v = 0.0;
    while v <= xmax + 1e-9 {
        let xv = x(v);
        let _ = writeln!(s, r##"<line x1="{xv:.1}" y1="{top}" x2="{xv:.1}" y2="{:.1}" stroke="#e3e3e3"/>"##, top + plot_h);
        let _ =
            writeln!(s, r#"<text x="{xv:.1}" y="{:.1}" text-anchor="middle" font-size="11">{}×</text>"#, top + plot_h + 17.0, trim_num(v));
        v += step;
    }
    // bars
    for (i, (label, val)) in bars.iter().enumerate() {
        let y = top + row_h * i as f64 + 6.0;
        let bh = row_h - 12.0;
        let val = if val.is_finite() { *val } else { 0.0 };
        let color = if val >= 1.0 { "#3a8f5c" } else { "#c0533f" };
        let bw = x(val) - left;
        let _ = writeln!(s, r#"<rect x="{left}" y="{y:.1}" width="{bw:.1}" height="{bh:.1}" fill="{color}"/>"#);
        let _ = writeln!(s, r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#, left - 8.0, y + bh / 2.0 + 4.5, xml_escape(label));
        let _ = writeln!(s, r#"<text x="{:.1}" y="{:.1}" font-weight="bold">{val:.2}×</text>"#, x(val) + 5.0, y + bh / 2.0 + 4.5);
    }
    // axes
    let _ = writeln!(s, r#"<path d="M{left} {top}V{:.1}H{:.1}" fill="none" stroke="black"/>"#, top + plot_h, left + plot_w);
    // reference line at 1.0×
    let x1 = x(1.0);
    let _ = writeln!(
        s,
        r#"<line x1="{x1:.1}" y1="{:.1}" x2="{x1:.1}" y2="{:.1}" stroke="black" stroke-width="1.5" stroke-dasharray="6 4"/>"#,
        top - 6.0,
        top + plot_h + 4.0
    );
    let _ = writeln!(s, r#"<text x="{x1:.1}" y="{:.1}" text-anchor="middle" font-size="11">plain = 1.0×</text>"#, top - 10.0);
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">mean speedup per prompt (speculative tok/s ÷ plain tok/s)</text>"#,
        left + plot_w / 2.0,
        h - 16.0
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle">category (prompts)</text>"#,
        top + plot_h / 2.0
    );
    s.push_str("</svg>\n");
    s
}

fn trim_num(v: f64) -> String {
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

/// Acceptance per draft position: bars for the observed conditional
/// acceptance (given the earlier drafts were accepted) and the share of
/// cycles reaching the position accepted, dots for the drafter's mean
/// predicted confidence where it gives one.
pub fn acceptance_svg(title: &str, subtitle: &str, st: &SpecStats) -> Option<String> {
    let cal = st.calibration();
    let n = st.pos_verified.len();
    if n == 0 {
        return None;
    }
    // conditional acceptance at position i: accepted at i / verified with all before accepted
    let cond: Vec<f64> = (0..n)
        .map(|i| {
            let reached = if i == 0 { st.pos_verified[0] } else { st.pos_accepted[i - 1].min(st.pos_verified[i]) };
            if reached == 0 {
                0.0
            } else {
                st.pos_accepted[i] as f64 / reached as f64
            }
        })
        .collect();
    let share: Vec<f64> = (0..n).map(|i| st.pos_accepted[i] as f64 / st.pos_verified[i].max(1) as f64).collect();
    let text_w = (title.chars().count() as f64 * 8.6).max(subtitle.chars().count() as f64 * 6.4) + 40.0;
    let (w, h, left, top, bottom) = (text_w.max(640.0).round(), 380.0f64, 60.0f64, 70.0f64, 60.0f64);
    let plot_w = w - left - 30.0;
    let plot_h = h - top - bottom;
    let gw = plot_w / n as f64;
    let y = |v: f64| top + plot_h * (1.0 - v.clamp(0.0, 1.0));
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<path d="M0 0H{w}V{h}H0Z" fill="white"/>"#);
    let _ =
        writeln!(s, r#"<text x="{}" y="24" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#, w / 2.0, xml_escape(title));
    let _ =
        writeln!(s, r##"<text x="{}" y="42" text-anchor="middle" font-size="11" fill="#444">{}</text>"##, w / 2.0, xml_escape(subtitle));
    for k in 0..=5 {
        let v = k as f64 / 5.0;
        let _ = writeln!(s, r##"<line x1="{left}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#e3e3e3"/>"##, y(v), left + plot_w, y(v));
        let _ =
            writeln!(s, r#"<text x="{:.1}" y="{:.1}" text-anchor="end" font-size="11">{:.0}%</text>"#, left - 6.0, y(v) + 4.0, v * 100.0);
    }
    for i in 0..n {
        let x0 = left + gw * i as f64;
        let bw = (gw * 0.35).min(40.0);
        let _ = writeln!(
            s,
            r##"<rect x="{:.1}" y="{:.1}" width="{bw:.1}" height="{:.1}" fill="#3a6f8f"/>"##,
            x0 + gw / 2.0 - bw,
            y(cond[i]),
            top + plot_h - y(cond[i])
        );
        let _ = writeln!(
            s,
            r##"<rect x="{:.1}" y="{:.1}" width="{bw:.1}" height="{:.1}" fill="#9cc3da"/>"##,
            x0 + gw / 2.0,
            y(share[i]),
            top + plot_h - y(share[i])
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="10">{:.0}%</text>"#,
            x0 + gw / 2.0 - bw / 2.0,
            y(cond[i]) - 4.0,
            cond[i] * 100.0
        );
        if let Some((_, pred, _)) = cal.get(i) {
            let _ = writeln!(s, r##"<circle cx="{:.1}" cy="{:.1}" r="4" fill="#c0533f"/>"##, x0 + gw / 2.0 - bw / 2.0, y(*pred));
        }
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{} (n={})</text>"#,
            x0 + gw / 2.0,
            top + plot_h + 16.0,
            i + 1,
            st.pos_verified[i]
        );
    }
    let _ = writeln!(s, r#"<path d="M{left} {top}V{:.1}H{:.1}" fill="none" stroke="black"/>"#, top + plot_h, left + plot_w);
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">draft position (verified count)</text>"#,
        left + plot_w / 2.0,
        h - 22.0
    );
    let legend = "dark: accepted given the earlier drafts were; light: accepted / verified; dot: mean predicted confidence";
    let _ = writeln!(
        s,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="10" fill="#444">{legend}</text>"##,
        left + plot_w / 2.0,
        h - 6.0
    );
    s.push_str("</svg>\n");
    Some(s)
}

impl PromptBenchReport {
    /// Acceptance per draft position (None without speculative statistics).
    pub fn acceptance_svg(&self, model: &str) -> Option<String> {
        let st = self.spec_stats.as_ref()?;
        let drafter = self.drafter.as_deref()?;
        let short = drafter.split('(').next().unwrap_or(drafter).trim();
        let subtitle = format!(
            "{drafter}; greedy, {} tokens/prompt, {} prompts; mean committed/cycle {:.2}, acceptance {:.1}%",
            self.n_predict,
            self.rows.len(),
            st.mean_committed(),
            100.0 * st.acceptance_rate()
        );
        acceptance_svg(&format!("Acceptance per draft position: {short} on {model}"), &subtitle, st)
    }

    /// The per-category mean speedup chart; None when speculation was off.
    pub fn svg(&self, model: &str) -> Option<String> {
        let drafter = self.drafter.as_deref()?;
        let bars: Vec<(String, f64)> =
            self.categories.iter().map(|c| (format!("{} ({})", c.category, c.prompts), c.mean_speedup.unwrap_or(0.0))).collect();
        let o = &self.overall;
        let subtitle = format!(
            "greedy, {} tokens/prompt, {} threads; overall {:.2} → {:.2} tok/s ({:.2}×), acceptance {:.1}%, identical {}/{}",
            self.n_predict,
            self.threads,
            o.plain_tps,
            o.spec_tps.unwrap_or(0.0),
            o.speedup.unwrap_or(0.0),
            100.0 * o.acceptance.unwrap_or(0.0),
            o.identical.unwrap_or(0),
            o.prompts
        );
        Some(speedup_svg(&format!("Speculative speedup: {drafter} on {model}"), &subtitle, &bars))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_names_the_category() {
        let text = r#"{"id": "code-1", "kind": "rename", "source": "x.py:f", "user": "Rename it"}"#;
        let ps = parse_prompts(text, Path::new("code.jsonl")).unwrap();
        assert_eq!(ps[0].category, "rename");
        let both = r#"{"id": "c", "kind": "a", "category": "b", "user": "x"}"#;
        assert!(parse_prompts(both, Path::new("code.jsonl")).is_err());
    }

    #[test]
    fn parses_good_file() {
        let text = r#"{"id": "a", "category": "chat", "user": "Hi there"}

{"id": "b", "category": "code", "raw": "fn main() {", "extra": 1}
"#;
        let dir = std::env::temp_dir().join(format!("tandem-prompts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("p.jsonl");
        std::fs::write(&path, text).unwrap();
        let ps = load_prompts(&path).unwrap();
        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(ps.len(), 2);
        assert_eq!(ps[0], BenchPrompt { id: "a".into(), category: "chat".into(), text: PromptText::User("Hi there".into()) });
        assert_eq!(ps[1].text, PromptText::Raw("fn main() {".into()));
    }

    #[test]
    fn malformed_lines_name_the_line() {
        let p = Path::new("x.jsonl");
        let good = r#"{"id": "a", "category": "chat", "user": "hi"}"#;
        for (bad, needle) in [
            ("{not json", "invalid JSON"),
            (r#"{"category": "chat", "user": "hi"}"#, "missing \"id\""),
            (r#"{"id": "b", "user": "hi"}"#, "category"),
            (r#"{"id": "b", "category": "c"}"#, "\"user\" or \"raw\""),
            (r#"{"id": "b", "category": "c", "user": "x", "raw": "y"}"#, "both"),
            (good, "duplicate id a"),
        ] {
            let text = format!("{good}\n\n{bad}\n");
            let e = parse_prompts(&text, p).unwrap_err();
            match &e {
                PromptError::Parse { line, .. } => assert_eq!(*line, 3, "{e}"),
                other => panic!("expected a parse error, got {other}"),
            }
            let msg = e.to_string();
            assert!(msg.starts_with("x.jsonl:3: "), "{msg}");
            assert!(msg.contains(needle), "{msg} should mention {needle}");
        }
        assert!(matches!(parse_prompts("\n\n", p), Err(PromptError::Empty(_))));
        assert!(matches!(load_prompts("/nonexistent/tandem/prompts.jsonl"), Err(PromptError::Io { .. })));
    }

    fn row(id: &str, cat: &str, plain_secs: f64, spec_secs: f64, same: bool) -> PromptRow {
        PromptRow {
            id: id.into(),
            category: cat.into(),
            prompt_tokens: 10,
            prompt_text: String::new(),
            plain_text: String::new(),
            gen_tokens: 100,
            plain_secs,
            plain_tps: 100.0 / plain_secs,
            plain_stop: "length".into(),
            spec_gen_tokens: Some(100),
            spec_secs: Some(spec_secs),
            spec_tps: Some(100.0 / spec_secs),
            spec_stop: Some("length".into()),
            speedup: Some(plain_secs / spec_secs),
            cycles: Some(50),
            drafted: Some(100),
            accepted: Some(50),
            acceptance: Some(0.5),
            mean_committed: Some(2.0),
            identical: Some(same),
            first_mismatch: if same { None } else { Some(3) },
            first: "plain".into(),
            spec_one_row_secs: None,
        }
    }

    fn report(rows: Vec<PromptRow>) -> PromptBenchReport {
        let (categories, overall) = summaries(rows.iter());
        PromptBenchReport { drafter: Some("d".into()), n_predict: 100, ctx: 256, threads: 2, rows, categories, overall, spec_stats: None }
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[f64::NAN, 1.5]), Some(1.5));
    }

    #[test]
    fn rounds_pool_totals_and_take_medians() {
        // round 1: 1.0 s plain and 0.5 s spec per prompt (2×); round 2: 1.25×; round 3: 1.0×
        let r1 = report(vec![row("a", "chat", 1.0, 0.5, true), row("b", "code", 1.0, 0.5, true)]);
        let r2 = report(vec![row("a", "chat", 1.0, 0.8, true), row("b", "code", 1.0, 0.8, true)]);
        let r3 = report(vec![row("a", "chat", 0.5, 0.5, true), row("b", "code", 2.0, 2.0, false)]);
        let rr = RoundsReport::new(vec![r1, r2, r3]);
        assert_eq!(rr.speedups.len(), 3);
        assert!((rr.speedups[0] - 2.0).abs() < 1e-12 && (rr.speedups[1] - 1.25).abs() < 1e-12);
        assert!((rr.median_speedup.unwrap() - 1.25).abs() < 1e-12);
        // pooled: 6.5 s plain against 5.1 s spec for the same 600 tokens
        assert_eq!(rr.overall.prompts, 6);
        assert!((rr.overall.speedup.unwrap() - 6.5 / 5.1).abs() < 1e-12);
        assert_eq!(rr.overall.identical, Some(5));
        assert_eq!(rr.mismatches().len(), 1);
        let cats: Vec<&str> = rr.category_median_speedups.iter().map(|(c, _)| c.as_str()).collect();
        assert_eq!(cats, ["chat", "code"]);
        assert!((rr.category_median_speedups[0].1 - 1.25).abs() < 1e-12);
        let t = rr.table();
        assert!(t.contains("speedup median 1.250× (min 1.000×, max 2.000×)"), "{t}");
        assert!(t.contains("identical 5/6"), "{t}");
        assert_eq!(t.lines().filter(|l| l.starts_with(|c: char| c.is_ascii_digit())).count(), 3, "{t}");
    }

    #[test]
    fn cost_line_sets_verify_forwards_against_the_plain_token() {
        // 2 prompts of 100 tokens: 0.5 s plain each (5 ms a token), 0.4 s spec each
        let mut r = report(vec![row("a", "chat", 0.5, 0.4, true), row("b", "code", 0.5, 0.4, true)]);
        assert_eq!(r.cost_line(), None, "no statistics, no line");
        let mut st = SpecStats::default();
        for _ in 0..10 {
            st.record(&tandem_speculative::CycleRecord::of_counts(0, 0, 0, 0.0, 0.0055));
        }
        for _ in 0..60 {
            st.record(&tandem_speculative::CycleRecord::of_counts(3, 1, 1, 0.001, 0.007));
        }
        r.spec_stats = Some(st);
        // verify 10·5.5 + 60·7 = 475 ms, draft 60 ms: 535 of 800 ms
        let c = r.cost_line().unwrap();
        assert_eq!(
            c,
            "costs: plain 5.00 ms/token; verify forward of 1 row 5.50 ms (1.10×), of 2 rows 7.00 ms (1.40×); \
             draft 1.00 ms per verified draft; 33.1% of speculative time outside draft and verify"
        );
        let rr = RoundsReport::new(vec![r.clone(), r.clone()]);
        assert_eq!(rr.cost_line().unwrap(), c, "pooled rounds of equal runs give the same line");
        // full blocks: the width used most is named
        let mut st = SpecStats::default();
        st.record(&tandem_speculative::CycleRecord::of_counts(4, 1, 0, 0.001, 0.007));
        for _ in 0..3 {
            st.record(&tandem_speculative::CycleRecord::of_counts(4, 4, 1, 0.001, 0.011));
        }
        r.spec_stats = Some(st);
        let c = r.cost_line().unwrap();
        assert!(c.contains("verify forward of 1 row -, of 5 rows 11.00 ms (2.20×)"), "{c}");
    }

    #[test]
    fn svg_has_one_rect_per_category() {
        let bars = vec![("chat (6)".to_string(), 1.31), ("code <&> (6)".to_string(), 0.87), ("math (3)".to_string(), 2.4)];
        let s = speedup_svg("Speedup: lookup(n=1..4) on \"model\"", "sub", &bars);
        assert!(s.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(s.trim_end().ends_with("</svg>"));
        assert_eq!(s.matches("<rect").count(), bars.len());
        assert!(s.contains("stroke-dasharray"));
        assert!(s.contains("1.31×") && s.contains("0.87×") && s.contains("2.40×"));
        assert!(s.contains("code &lt;&amp;&gt; (6)"));
        assert!(s.contains("&quot;model&quot;"));
        // every opened element is closed (self-closing or a matching end tag)
        for tag in ["svg", "text"] {
            assert_eq!(s.matches(&format!("<{tag} ")).count(), s.matches(&format!("</{tag}>")).count(), "{tag}");
        }
        for tag in ["rect", "line", "path"] {
            let opened = s.matches(&format!("<{tag} ")).count();
            assert!(opened > 0);
            let selfclosed = s.split(&format!("<{tag} ")).skip(1).filter(|rest| rest.split('>').next().unwrap().ends_with('/')).count();
            assert_eq!(opened, selfclosed, "{tag}");
        }
        // no raw ampersands outside entities
        for (i, _) in s.match_indices('&') {
            assert!(["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"].iter().any(|e| s[i..].starts_with(e)));
        }
    }

    #[test]
    fn nice_steps() {
        assert_eq!(nice_step(3.0, 6.0), 0.5);
        assert_eq!(nice_step(1.12, 6.0), 0.2);
        assert_eq!(trim_num(1.5), "1.5");
        assert_eq!(trim_num(2.0), "2");
    }
}
