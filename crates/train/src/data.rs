//! Self-distilled training data: the target answers the corpus prompts, and
//! for every position we keep the token, the target's argmax there (what
//! greedy verification accepts) and the hidden row the drafter is fed (the
//! last block's output).
//!
//! Stored as one little-endian binary file: a header, then per sequence
//! `len, prompt_len, tokens[len], argmax[len], hidden[len × d] (f16)`.
//!
//! Everything but the tokens is a function of the tokens: the target's
//! kernels give each row the same bits in a prefill as in the decode step that
//! made it. So a data file can be kept as a small token file (tokens and
//! prompt lengths, gzipped; [`Dataset::save_tokens`]) and rebuilt by one
//! prefill pass per sequence ([`Dataset::rebuild`]), about three times faster
//! than generating it and byte-identical to it. The token files of the data
//! behind the committed support models are in `models/support/data/`.

use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use half::f16;
use indicatif::{ProgressBar, ProgressStyle};
use tandem_engine::Engine;

use crate::code_corpus::Prompt;
use tandem_model::{ForwardOutput, HiddenTap, LogitRows};
use tandem_sampling::{argmax, Sampler, SamplerParams};
use tandem_tokenizer::ChatMessage;

const MAGIC: &[u8; 8] = b"TDMDATA1";
const TOKENS_MAGIC: &[u8; 8] = b"TDMTOKS1";

#[derive(Debug, Clone, Default)]
pub struct Sequence {
    pub tokens: Vec<u32>,
    /// `argmax[p]`: the target's greedy choice for position p + 1.
    pub argmax: Vec<u32>,
    /// `len × d` hidden rows (f16).
    pub hidden: Vec<f16>,
    /// Positions that belong to the prompt.
    pub prompt_len: usize,
}

#[derive(Debug, Clone, Default)]
pub struct Dataset {
    pub d: usize,
    pub vocab_hash: u64,
    pub seqs: Vec<Sequence>,
}

/// How the target generates.
#[derive(Debug, Clone)]
pub struct GenConfig {
    pub max_new: usize,
    /// Share of prompts answered by sampling (temperature `temp`) instead of
    /// greedily, for diversity; labels are always the argmax.
    pub sampled_share: f32,
    pub temp: f32,
    pub seed: u64,
    /// Answers decoded together (rows of one forward); does not change the data.
    pub parallel: usize,
}

impl Dataset {
    pub fn tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.tokens.len()).sum()
    }
    pub fn generated_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.tokens.len() - s.prompt_len).sum()
    }

    /// Let the target answer `prompts`, capturing what the drafter trains on.
    ///
    /// Up to `cfg.parallel` answers are decoded together, one row per sequence
    /// per forward ([`tandem_model::Model::forward_multi`]). Each row has the
    /// same bits as decoding that sequence alone, and every sequence draws its
    /// sampling choice and seed in prompt order, so the data file is the same
    /// for any `parallel` and thread count.
    pub fn generate(engine: &Arc<Engine>, prompts: &[String], cfg: &GenConfig) -> Result<Dataset> {
        let prompts: Vec<Prompt> = prompts.iter().map(|p| Prompt::User(p.clone())).collect();
        Self::generate_prompts(engine, &prompts, cfg)
    }

    /// [`Dataset::generate`] over user turns and raw texts (code to complete,
    /// tokenized as is, without the chat template).
    pub fn generate_prompts(engine: &Arc<Engine>, prompts: &[Prompt], cfg: &GenConfig) -> Result<Dataset> {
        struct Active {
            idx: usize,
            seq: Sequence,
            cache: tandem_model::KvCache,
            sampler: Sampler,
            last: Vec<f32>,
            steps: usize,
        }
        let model = &engine.model;
        let d = model.cfg.d_model;
        let taps = [HiddenTap::Layer(model.cfg.n_layer - 1)];
        let pb = ProgressBar::new(prompts.len() as u64);
        pb.set_style(
            ProgressStyle::with_template("generating {bar:30} {pos}/{len} prompts, {msg} [{elapsed_precise}<{eta_precise}]").unwrap(),
        );
        let mut rng = crate::corpus::SplitMix::new(cfg.seed ^ 0xDA7A);
        let mut done: Vec<Option<Sequence>> = vec![None; prompts.len()];
        let mut active: Vec<Active> = Vec::new();
        let mut out = ForwardOutput::default();
        let (mut total, mut next, mut finished) = (0usize, 0usize, 0usize);
        loop {
            // start new answers in prompt order (prefill one prompt at a time)
            while active.len() < cfg.parallel.max(1) && next < prompts.len() {
                let text = match &prompts[next] {
                    Prompt::User(u) => engine.render_chat(&[ChatMessage::new("user", u)])?,
                    Prompt::Raw(r) => r.clone(),
                };
                let ids = engine.tokenize_prompt(&text);
                let sampled = rng.f32() < cfg.sampled_share;
                let sampler = Sampler::new(if sampled {
                    SamplerParams { temperature: cfg.temp, top_k: 40, top_p: 0.95, min_p: 0.05, seed: rng.next_u64() }
                } else {
                    SamplerParams::greedy()
                });
                let mut cache = model.new_cache(ids.len() + cfg.max_new + 1);
                let mut seq = Sequence { prompt_len: ids.len(), ..Default::default() };
                model.forward(&engine.pool, &mut cache, &ids, &LogitRows::All, &taps, &mut out)?;
                seq.tokens.extend_from_slice(&ids);
                for r in 0..ids.len() {
                    seq.argmax.push(argmax(out.logits_row(r)) as u32);
                }
                seq.hidden.extend(out.hidden[0].iter().map(|&v| f16::from_f32(v)));
                let last = out.logits_row(ids.len() - 1).to_vec();
                active.push(Active { idx: next, seq, cache, sampler, last, steps: 0 });
                next += 1;
            }
            // choose each answer's next token; finished answers leave
            let mut toks = Vec::with_capacity(active.len());
            let mut i = 0;
            while i < active.len() {
                let a = &mut active[i];
                let t = if a.steps < cfg.max_new { Some(a.sampler.sample(&a.last)) } else { None };
                match t {
                    Some(t) if !engine.tokenizer.is_eog(t) && a.cache.len() < a.cache.ctx() => {
                        toks.push(t);
                        i += 1;
                    }
                    _ => {
                        let a = active.remove(i);
                        total += a.seq.tokens.len() - a.seq.prompt_len;
                        done[a.idx] = Some(a.seq);
                        finished += 1;
                        pb.set_message(format!("{total} tokens"));
                        pb.inc(1);
                        if pb.is_hidden() && finished % 50 == 0 {
                            // no terminal (CI logs): a line now and then instead of the bar
                            eprintln!(
                                "generating: {finished}/{} prompts, {total} tokens, {:.0} s",
                                prompts.len(),
                                pb.elapsed().as_secs_f64()
                            );
                        }
                    }
                }
            }
            if active.is_empty() {
                if next >= prompts.len() {
                    break;
                }
                continue;
            }
            let mut caches: Vec<&mut tandem_model::KvCache> = active.iter_mut().map(|a| &mut a.cache).collect();
            model.forward_multi(&engine.pool, &mut caches, &toks, &taps, &mut out)?;
            for (r, (a, &t)) in active.iter_mut().zip(&toks).enumerate() {
                a.last.copy_from_slice(out.logits_row(r));
                a.seq.tokens.push(t);
                a.seq.argmax.push(argmax(&a.last) as u32);
                a.seq.hidden.extend(out.hidden[0][r * d..(r + 1) * d].iter().map(|&v| f16::from_f32(v)));
                a.steps += 1;
            }
        }
        pb.finish();
        let seqs = done.into_iter().map(|s| s.expect("every prompt answered")).collect();
        Ok(Dataset { d, vocab_hash: engine.tokenizer.vocab_hash(), seqs })
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = path.with_extension("tmp");
        let mut w = BufWriter::new(std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?);
        w.write_all(MAGIC)?;
        for v in [self.d as u64, self.vocab_hash, self.seqs.len() as u64] {
            w.write_all(&v.to_le_bytes())?;
        }
        for s in &self.seqs {
            w.write_all(&(s.tokens.len() as u32).to_le_bytes())?;
            w.write_all(&(s.prompt_len as u32).to_le_bytes())?;
            for &t in s.tokens.iter().chain(&s.argmax) {
                w.write_all(&t.to_le_bytes())?;
            }
            for h in &s.hidden {
                w.write_all(&h.to_bits().to_le_bytes())?;
            }
        }
        w.flush()?;
        drop(w);
        std::fs::rename(&tmp, path)?;
        Ok(())
    }

    pub fn load(path: &Path) -> Result<Dataset> {
        let mut r = BufReader::new(std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?);
        let mut magic = [0u8; 8];
        r.read_exact(&mut magic)?;
        if &magic != MAGIC {
            bail!("{}: not a tandem training-data file", path.display());
        }
        let mut u64s = [0u64; 3];
        for v in &mut u64s {
            let mut b = [0u8; 8];
            r.read_exact(&mut b)?;
            *v = u64::from_le_bytes(b);
        }
        let [d, vocab_hash, n] = u64s;
        let d = d as usize;
        if d == 0 || d > 1 << 16 || n > 1 << 24 {
            bail!("{}: implausible header (width {d}, {n} sequences)", path.display());
        }
        let u32s = |count: usize, r: &mut BufReader<std::fs::File>| -> Result<Vec<u32>> {
            let mut b = vec![0u8; count * 4];
            r.read_exact(&mut b)?;
            Ok(b.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
        };
        let mut seqs = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let hdr = u32s(2, &mut r)?;
            let (len, prompt_len) = (hdr[0] as usize, hdr[1] as usize);
            if len > 1 << 20 || prompt_len > len {
                bail!("{}: corrupt sequence header", path.display());
            }
            let tokens = u32s(len, &mut r)?;
            let argmax = u32s(len, &mut r)?;
            let mut b = vec![0u8; len * d * 2];
            r.read_exact(&mut b)?;
            let hidden = b.chunks_exact(2).map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]]))).collect();
            seqs.push(Sequence { tokens, argmax, hidden, prompt_len });
        }
        Ok(Dataset { d, vocab_hash, seqs })
    }
}

/// The tokens of a data file: per sequence its tokens and where the prompt ends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenFile {
    pub vocab_hash: u64,
    pub seqs: Vec<(Vec<u32>, usize)>,
}

impl TokenFile {
    /// Gzipped little-endian: magic, vocab hash, sequence count, then per
    /// sequence `len, prompt_len` (u32) and the tokens as u16 when the
    /// vocabulary fits (a header byte says 2 or 4 bytes per token).
    pub fn save(&self, path: &Path) -> Result<()> {
        use flate2::{write::GzEncoder, Compression};
        let wide = self.seqs.iter().flat_map(|(t, _)| t).any(|&t| t > u16::MAX as u32);
        let tmp = path.with_extension("tmp");
        let f = std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        let mut w = GzEncoder::new(BufWriter::new(f), Compression::best());
        w.write_all(TOKENS_MAGIC)?;
        w.write_all(&self.vocab_hash.to_le_bytes())?;
        w.write_all(&(self.seqs.len() as u64).to_le_bytes())?;
        w.write_all(&[if wide { 4 } else { 2 }])?;
        for (toks, prompt_len) in &self.seqs {
            w.write_all(&(toks.len() as u32).to_le_bytes())?;
            w.write_all(&(*prompt_len as u32).to_le_bytes())?;
            for &t in toks {
                if wide {
                    w.write_all(&t.to_le_bytes())?;
                } else {
                    w.write_all(&(t as u16).to_le_bytes())?;
                }
            }
        }
        w.finish()?.flush()?;
        std::fs::rename(&tmp, path)?;
        Ok(())
    }

    pub fn load(path: &Path) -> Result<TokenFile> {
        let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let mut r = BufReader::new(flate2::read::GzDecoder::new(BufReader::new(f)));
        let bad = |what: &str| anyhow::anyhow!("{}: {what}", path.display());
        let mut hdr = [0u8; 25];
        r.read_exact(&mut hdr).map_err(|_| bad("not a gzipped tandem token file"))?;
        if &hdr[..8] != TOKENS_MAGIC {
            bail!("{}: not a tandem token file", path.display());
        }
        let u = |i: usize| u64::from_le_bytes(hdr[i..i + 8].try_into().unwrap());
        let (vocab_hash, n, width) = (u(8), u(16), hdr[24] as usize);
        if n > 1 << 24 || !matches!(width, 2 | 4) {
            return Err(bad("implausible header"));
        }
        let mut seqs = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let mut h = [0u8; 8];
            r.read_exact(&mut h).map_err(|_| bad("truncated"))?;
            let len = u32::from_le_bytes(h[..4].try_into().unwrap()) as usize;
            let prompt_len = u32::from_le_bytes(h[4..].try_into().unwrap()) as usize;
            if len > 1 << 20 || prompt_len > len {
                return Err(bad("corrupt sequence header"));
            }
            let mut b = vec![0u8; len * width];
            r.read_exact(&mut b).map_err(|_| bad("truncated"))?;
            let toks = if width == 2 {
                b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]) as u32).collect()
            } else {
                b.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
            };
            seqs.push((toks, prompt_len));
        }
        Ok(TokenFile { vocab_hash, seqs })
    }
}

impl Dataset {
    /// The tokens of this data (what [`Dataset::rebuild`] needs).
    pub fn token_file(&self) -> TokenFile {
        TokenFile { vocab_hash: self.vocab_hash, seqs: self.seqs.iter().map(|s| (s.tokens.clone(), s.prompt_len)).collect() }
    }

    pub fn save_tokens(&self, path: &Path) -> Result<()> {
        self.token_file().save(path)
    }

    /// The data file these tokens came from: the target runs over each
    /// sequence (prefill, 256 positions per forward) and keeps what
    /// [`Dataset::generate`] kept at every position, the argmax and the last
    /// block's output, with the same bits.
    pub fn rebuild(engine: &Arc<Engine>, tokens: &TokenFile) -> Result<Dataset> {
        Ok(Self::rebuild_with_features(engine, tokens, &[])?.0)
    }

    /// [`rebuild`](Self::rebuild), also keeping the inputs of `feature_layers`
    /// (1-based target layers) at every position in the same pass: per
    /// sequence `len × (m·d)` f16 rows, the layers concatenated, the layout of
    /// the DSpark feature caches (`dspark::Features`).
    pub fn rebuild_with_features(engine: &Arc<Engine>, tokens: &TokenFile, feature_layers: &[usize]) -> Result<(Dataset, Vec<Vec<f16>>)> {
        anyhow::ensure!(
            tokens.vocab_hash == engine.tokenizer.vocab_hash(),
            "the token file was made with another vocabulary (hash {:016x}, this model {:016x})",
            tokens.vocab_hash,
            engine.tokenizer.vocab_hash()
        );
        let model = &engine.model;
        let (d, vocab) = (model.cfg.d_model, model.cfg.vocab);
        if let Some(&l) = feature_layers.iter().find(|&&l| l == 0 || l > model.cfg.n_layer) {
            bail!("feature layer {l} is out of range (1..={})", model.cfg.n_layer);
        }
        let m = feature_layers.len();
        let taps: Vec<HiddenTap> =
            std::iter::once(model.cfg.n_layer - 1).chain(feature_layers.iter().map(|&l| l - 1)).map(HiddenTap::Layer).collect();
        let mut feats = Vec::with_capacity(if m > 0 { tokens.seqs.len() } else { 0 });
        let total: usize = tokens.seqs.iter().map(|(t, _)| t.len()).sum();
        let pb = ProgressBar::new(total as u64);
        pb.set_style(ProgressStyle::with_template("rebuilding {bar:30} {pos}/{len} positions [{elapsed_precise}<{eta_precise}]").unwrap());
        let mut out = ForwardOutput::default();
        let mut seqs = Vec::with_capacity(tokens.seqs.len());
        for (i, (toks, prompt_len)) in tokens.seqs.iter().enumerate() {
            if let Some(&t) = toks.iter().find(|&&t| t as usize >= vocab) {
                bail!("sequence {i}: token {t} is outside the vocabulary ({vocab})");
            }
            let mut seq = Sequence { tokens: toks.clone(), prompt_len: *prompt_len, ..Default::default() };
            seq.argmax.reserve(toks.len());
            seq.hidden.reserve(toks.len() * d);
            let mut cache = model.new_cache(toks.len().max(1));
            let mut f = vec![f16::ZERO; if m > 0 { toks.len() * m * d } else { 0 }];
            for (ci, chunk) in toks.chunks(256).enumerate() {
                model.forward(&engine.pool, &mut cache, chunk, &LogitRows::All, &taps, &mut out)?;
                for r in 0..chunk.len() {
                    seq.argmax.push(argmax(out.logits_row(r)) as u32);
                }
                seq.hidden.extend(out.hidden[0].iter().map(|&v| f16::from_f32(v)));
                scatter_taps(&out.hidden[1..], ci * 256, chunk.len(), d, &mut f);
                pb.inc(chunk.len() as u64);
            }
            if m > 0 {
                feats.push(f);
            }
            if pb.is_hidden() && (i + 1) % 200 == 0 {
                eprintln!("rebuilding: {}/{} sequences, {:.0} s", i + 1, tokens.seqs.len(), pb.elapsed().as_secs_f64());
            }
            seqs.push(seq);
        }
        pb.finish();
        Ok((Dataset { d, vocab_hash: tokens.vocab_hash, seqs }, feats))
    }
}

/// Store the tap rows of one forward (`taps[t]`: `rows × d`, the forward's
/// positions from `first` on) into a sequence's feature rows `f`, laid out
/// `position × (taps·d)` as f16: the layout of the feature caches.
pub(crate) fn scatter_taps(taps: &[Vec<f32>], first: usize, rows: usize, d: usize, f: &mut [f16]) {
    let m = taps.len();
    for (t, h) in taps.iter().enumerate() {
        for r in 0..rows {
            let dst = ((first + r) * m + t) * d;
            for (o, &v) in f[dst..dst + d].iter_mut().zip(&h[r * d..(r + 1) * d]) {
                *o = f16::from_f32(v);
            }
        }
    }
}

/// User requests written by the target itself: the chat template up to the
/// start of a user turn, then sampled text (temperature `temp`, top-p 0.95)
/// until the turn ends. This draws prompts from the target's own idea of what
/// users ask, which templates cannot cover. Deterministic for a seed and the
/// same for any `parallel` (each request has its own sampler, seeded in order);
/// empty, unfinished, very short and repeated requests are dropped.
///
/// With `openers` non-empty each request starts with one of them (drawn in
/// start order from the same seeded stream) and the target writes the rest:
/// left alone, the target opens half its requests with "I'm planning…", and
/// an opener spreads the requests over kinds of task. Empty `openers` gives
/// exactly the unseeded prompts.
pub fn target_prompts(engine: &Arc<Engine>, n: usize, seed: u64, temp: f32, parallel: usize, openers: &[&str]) -> Result<Vec<String>> {
    const MAX_TOKENS: usize = 80;
    const MARK: &str = "\u{1}MARK\u{1}";
    let model = &engine.model;
    let text = engine.render_chat(&[ChatMessage::new("user", MARK)])?;
    let prefix = &text[..text.find(MARK).context("chat template drops the user text")?];
    let ids = engine.tokenize_prompt(prefix);
    let mut base = model.new_cache(ids.len() + MAX_TOKENS + 1);
    let mut out = ForwardOutput::default();
    model.forward(&engine.pool, &mut base, &ids, &LogitRows::Last, &[], &mut out)?;
    let first = out.logits_row(0).to_vec();
    // each opener's tokens after the template prefix, tokenized once
    let opener_tails = openers
        .iter()
        .map(|o| {
            let all = engine.tokenize_prompt(&format!("{prefix}{o}"));
            anyhow::ensure!(all.len() > ids.len() && all[..ids.len()] == ids[..], "opener {o:?} changes the template's tokens");
            Ok(all[ids.len()..].to_vec())
        })
        .collect::<Result<Vec<_>>>()?;
    let pb = ProgressBar::new(n as u64);
    pb.set_style(ProgressStyle::with_template("writing prompts {bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}]").unwrap());
    let mut rng = crate::corpus::SplitMix::new(seed ^ 0x9A0B_7E57);
    struct Slot {
        idx: usize,
        cache: tandem_model::KvCache,
        sampler: Sampler,
        last: Vec<f32>,
        toks: Vec<u32>,
    }
    let mut slots: Vec<Slot> = Vec::new();
    // outcome of each started request, in start order (None: still running;
    // Some(None): dropped); the first n kept ones are the result, so the list
    // does not depend on `parallel`
    let mut results: Vec<Option<Option<String>>> = Vec::new();
    let mut prompts = Vec::with_capacity(n);
    let mut seen = std::collections::HashSet::new();
    let mut scan = 0;
    let budget = n * 4;
    loop {
        while scan < results.len() && prompts.len() < n {
            match &results[scan] {
                None => break,
                Some(Some(t)) => {
                    if seen.insert(t.clone()) {
                        prompts.push(t.clone());
                    }
                }
                Some(None) => {}
            }
            scan += 1;
        }
        let pending = results.len() - scan;
        while slots.len() < parallel.max(1) && results.len() < budget && prompts.len() + pending < n + parallel.max(1) {
            let sampler = Sampler::new(SamplerParams { temperature: temp, top_k: 0, top_p: 0.95, min_p: 0.0, seed: rng.next_u64() });
            let mut slot = Slot { idx: results.len(), cache: base.clone(), sampler, last: first.clone(), toks: Vec::new() };
            if !opener_tails.is_empty() {
                let tail = &opener_tails[rng.below(opener_tails.len())];
                model.forward(&engine.pool, &mut slot.cache, tail, &LogitRows::Last, &[], &mut out)?;
                slot.last.copy_from_slice(out.logits_row(0));
                slot.toks.extend_from_slice(tail);
            }
            slots.push(slot);
            results.push(None);
        }
        let mut toks = Vec::new();
        let mut i = 0;
        while i < slots.len() {
            let sl = &mut slots[i];
            let t = sl.sampler.sample(&sl.last);
            let over = sl.toks.len() >= MAX_TOKENS;
            if engine.tokenizer.is_eog(t) || over {
                let s = slots.remove(i);
                let text = engine.tokenizer.decode(&s.toks).trim().to_string();
                let ok = !over && text.split_whitespace().count() >= 3 && !text.contains("<|");
                results[s.idx] = Some(if ok { Some(text) } else { None });
            } else {
                slots[i].toks.push(t);
                toks.push(t);
                i += 1;
            }
        }
        pb.set_position(prompts.len() as u64);
        if slots.is_empty() {
            if prompts.len() >= n || results.len() >= budget {
                break;
            }
            continue;
        }
        let mut caches: Vec<&mut tandem_model::KvCache> = slots.iter_mut().map(|s| &mut s.cache).collect();
        model.forward_multi(&engine.pool, &mut caches, &toks, &[], &mut out)?;
        for (r, s) in slots.iter_mut().enumerate() {
            s.last.copy_from_slice(out.logits_row(r));
        }
    }
    pb.finish();
    for r in results[scan..].iter().flatten().flatten() {
        if prompts.len() < n && seen.insert(r.clone()) {
            prompts.push(r.clone());
        }
    }
    Ok(prompts)
}
