//! The DSpark drafter: one backbone pass drafts a whole block, the Markov head
//! chains the tokens left to right, and the confidence head says how far the
//! block is worth verifying.
//!
//! The drafter's KV cache holds one context row per committed position, made
//! from the target's hidden states at several layers (handed over through
//! [`Drafter::observe`]). A draft runs the block `[next, mask, …]` at the
//! positions after the history; its rows are dropped again. A rollback of the
//! target truncates the context rows the same way.

use std::sync::Arc;

use tandem_kernels::ThreadPool;
use tandem_model::{DSparkModel, HiddenTap, KvCache};

use crate::drafter::{Drafter, Proposal};
use crate::{Setting, SpecError};
use tandem_sampling::{argmax, Rng, Sampler, SamplerParams};

/// Runtime settings of the DSpark drafter.
#[derive(Debug, Clone, Copy)]
pub struct DSparkOptions {
    /// Slots per backbone pass (≤ the trained block size).
    pub block_size: usize,
    /// Stop at the first position whose confidence is below this (None: let
    /// the scheduler choose the length from the confidences).
    pub confidence: Option<f32>,
}

pub struct DSparkDrafter {
    model: Arc<DSparkModel>,
    pool: Arc<ThreadPool>,
    opts: DSparkOptions,
    /// Context rows of positions `0..cache.len()`.
    cache: KvCache,
    /// Target features of positions `cache.len()..cache.len() + pending_rows`,
    /// not yet projected: injection waits until a draft is asked for, so
    /// cycles the scheduler keeps plain cost nothing, and the rows of several
    /// cycles go through one batched matmul.
    feats: Vec<f32>,
    pending_rows: usize,
    /// The history as last synced: context row p was made from `tokens[..=p]`.
    tokens: Vec<u32>,
    e: Vec<f32>,
    base: Vec<f32>,
    logits: Vec<f32>,
    /// The history, the anchor and the drafts so far (copy hints only).
    text: Vec<u32>,
    /// The confidences of a proposal so far and of its next slot.
    seen: Vec<f32>,
}

impl DSparkDrafter {
    pub fn new(model: Arc<DSparkModel>, pool: Arc<ThreadPool>, ctx: usize, opts: DSparkOptions) -> Result<Self, SpecError> {
        let trained = model.cfg.block_size;
        if opts.block_size == 0 || opts.block_size > trained {
            return Err(SpecError::setting(Setting::DSparkBlockSize, opts.block_size, format!("need 1..={trained} (the trained size)")));
        }
        if !model.cfg.sample_from_anchor && opts.block_size < 2 {
            return Err(SpecError::setting(
                Setting::DSparkBlockSize,
                opts.block_size,
                "need at least 2: this drafter's anchor slot does not predict, so one slot drafts nothing",
            ));
        }
        if let Some(c) = opts.confidence {
            if !(0.0..=1.0).contains(&c) {
                return Err(SpecError::setting(Setting::DSparkConfidence, c, "need a value in 0..=1"));
            }
            if !model.has_confidence() {
                return Err(SpecError::setting(Setting::DSparkConfidence, c, "this drafter has no confidence head"));
            }
        }
        for w in model.warnings() {
            tracing::warn!("{w}");
        }
        let cache = model.new_cache(ctx);
        Ok(DSparkDrafter {
            model,
            pool,
            opts,
            cache,
            feats: Vec::new(),
            pending_rows: 0,
            tokens: Vec::new(),
            e: Vec::new(),
            base: Vec::new(),
            logits: Vec::new(),
            seen: Vec::new(),
            text: Vec::new(),
        })
    }

    /// Drafts one pass yields.
    /// Positions with features (injected or pending).
    fn known(&self) -> usize {
        self.cache.len() + self.pending_rows
    }

    /// Keep features of positions `< n` only.
    fn forget_from(&mut self, n: usize) {
        if n < self.cache.len() {
            self.cache.truncate(n);
            self.pending_rows = 0;
            self.feats.clear();
        } else if n < self.known() {
            self.pending_rows = n - self.cache.len();
            self.feats.truncate(self.pending_rows * self.model.cfg.feat_dim());
        }
    }

    /// Project pending features into context rows.
    fn inject_pending(&mut self) -> Result<(), SpecError> {
        if self.pending_rows == 0 {
            return Ok(());
        }
        let room = self.cache.ctx().saturating_sub(self.model.cfg.block_size + self.cache.len());
        let rows = self.pending_rows.min(room);
        let fd = self.model.cfg.feat_dim();
        let r = self.model.inject(&self.pool, &mut self.cache, &self.feats[..rows * fd], rows);
        self.pending_rows = 0;
        self.feats.clear();
        r.map_err(SpecError::from)
    }

    fn drafts_per_pass(&self) -> usize {
        if self.model.cfg.sample_from_anchor {
            self.opts.block_size
        } else {
            self.opts.block_size - 1
        }
    }
}

impl Drafter for DSparkDrafter {
    fn name(&self) -> String {
        let c = &self.model.cfg;
        format!(
            "{}(block {} of {}, {} layer{}, taps {:?}, {}, draft vocab {}, confidence {}{})",
            if c.has_markov() { "dspark" } else { "dspark/dflash" },
            self.opts.block_size,
            c.block_size,
            c.n_layer,
            if c.n_layer == 1 { "" } else { "s" },
            c.target_layers,
            if c.has_markov() { format!("rank {}", c.markov_rank) } else { "no Markov head".into() },
            c.draft_vocab,
            match self.opts.confidence {
                Some(v) => format!("cut {v}"),
                None if self.model.has_confidence() => "scheduled".into(),
                None => "none".into(),
            },
            match c.copy_ngram() {
                0 => String::new(),
                n => format!(", copy hints up to {n}-grams"),
            }
        )
    }

    fn max_draft(&self) -> usize {
        self.drafts_per_pass()
    }

    fn fixed_cost(&self) -> bool {
        true
    }

    fn taps(&self) -> Vec<HiddenTap> {
        self.model.cfg.taps()
    }

    fn sync(&mut self, history: &[u32]) -> Result<(), SpecError> {
        let common = self.tokens.iter().zip(history).take_while(|(a, b)| a == b).count();
        if common < self.tokens.len() {
            self.forget_from(common);
        }
        self.tokens.clear();
        self.tokens.extend_from_slice(history);
        Ok(())
    }

    fn observe(&mut self, start: usize, rows: usize, hidden: &[&[f32]]) {
        if start > self.known() || rows == 0 {
            // a gap: rows in between were never seen; drafting waits for a resync
            return;
        }
        self.forget_from(start);
        let d = self.model.cfg.d_model;
        self.feats.reserve(rows * hidden.len() * d);
        for r in 0..rows {
            for h in hidden {
                self.feats.extend_from_slice(&h[r * d..(r + 1) * d]);
            }
        }
        self.pending_rows += rows;
    }

    fn propose(
        &mut self,
        history: &[u32],
        next: u32,
        max: usize,
        params: &SamplerParams,
        rng: &mut Rng,
        out: &mut Proposal,
    ) -> Result<(), SpecError> {
        self.propose_until(history, next, max, params, rng, out, &|_| true)
    }

    fn propose_until(
        &mut self,
        history: &[u32],
        next: u32,
        max: usize,
        params: &SamplerParams,
        rng: &mut Rng,
        out: &mut Proposal,
        more: &dyn Fn(&[f32]) -> bool,
    ) -> Result<(), SpecError> {
        out.clear();
        let n = history.len();
        if max == 0 || n == 0 || self.known() < n {
            return Ok(());
        }
        self.forget_from(n);
        self.inject_pending()?;
        if self.cache.len() < n {
            return Ok(());
        }
        let slots = self.opts.block_size;
        if self.cache.len() + slots > self.cache.ctx() {
            return Ok(());
        }
        let hints = self.model.cfg.copy_ngram() > 0;
        if hints {
            self.text.clear();
            self.text.extend_from_slice(history);
            self.text.push(next);
        }
        // slot 0's hint (over the history and the anchor) may feed its input
        let hint0 = if hints { self.model.copy_hint(&self.text) } else { None };
        self.model.block(&self.pool, &mut self.cache, next, hint0, slots, &mut self.e, &mut self.base)?;
        let dv = self.model.cfg.draft_vocab;
        let d = self.model.cfg.d_model;
        let first = if self.model.cfg.sample_from_anchor { 0 } else { 1 };
        let take = max.min(self.drafts_per_pass());
        let sampler = (!params.is_greedy()).then(|| Sampler::new(params.clone()));
        let mut prev = next;
        for j in 0..take {
            let i = first + j;
            self.logits.clear();
            self.logits.extend_from_slice(&self.base[i * dv..(i + 1) * dv]);
            // the first step's text is the one hint0 was found in
            let hint = if j == 0 {
                hint0
            } else if hints {
                self.model.copy_hint(&self.text)
            } else {
                None
            };
            let e = &self.e[i * d..(i + 1) * d];
            let m = self.model.markov_input(prev, hint)?;
            let head = self.model.markov_confidence(&m, e);
            if let Some(c) = head {
                // decided before the token is chosen: truncation stays lossless
                if self.opts.confidence.is_some_and(|cut| c < cut) {
                    break;
                }
                // sampling: the scheduler's cut, asked before the slot's
                // logits are paid for
                if sampler.is_some() && !more_after(&mut self.seen, &out.confidence, c, more) {
                    break;
                }
            }
            self.model.markov_logits(&self.pool, &m, e, &mut self.logits)?;
            // a row after the draft rows is a copy hint outside them
            let model = &self.model;
            let row_token = |r: usize| if r < dv { model.to_target(r) } else { hint.map_or(0, |h| h.0) };
            let (tok, conf) = match &sampler {
                None => {
                    let row = argmax(&self.logits) as usize;
                    let p = top_prob(&mut self.logits, row);
                    // greedy: the scheduler's cut, asked once the token's
                    // probability is known (any cut is lossless here)
                    if !more_after(&mut self.seen, &out.confidence, p, more) {
                        break;
                    }
                    (row_token(row), Some(p))
                }
                Some(s) => {
                    let dist: Vec<(u32, f32)> = s.distribution(&self.logits).into_iter().map(|(r, p)| (row_token(r as usize), p)).collect();
                    let t = Sampler::draw(&dist, rng.uniform());
                    out.dists.push(dist);
                    (t, head)
                }
            };
            out.tokens.push(tok);
            if let Some(c) = conf {
                out.confidence.push(c);
            }
            if let Some(c) = head {
                out.head.push(c);
            }
            prev = tok;
            if hints {
                self.text.push(tok);
            }
        }
        if out.confidence.len() != out.tokens.len() {
            out.confidence.clear();
        }
        if out.head.len() != out.tokens.len() {
            out.head.clear();
        }
        Ok(())
    }
}

/// Whether the proposal goes on to a slot of confidence `c` after the
/// slots of `so_far` (the scheduler's `more`; `seen` is scratch).
fn more_after(seen: &mut Vec<f32>, so_far: &[f32], c: f32, more: &dyn Fn(&[f32]) -> bool) -> bool {
    seen.clear();
    seen.extend_from_slice(so_far);
    seen.push(c);
    more(seen)
}

/// The draft distribution's probability of row `top` (its argmax), from the
/// logits, which are overwritten. At greedy decoding it ranks drafts far
/// better than the confidence head, which is trained on the acceptance of
/// sampling (Σ min(p_draft, p_target)): on the dev prompts its AUC for the
/// next draft's acceptance is 0.81 against the head's 0.71 (BENCHMARKS.md
/// §7q). A top logit that is not finite gives 0.
fn top_prob(logits: &mut [f32], top: usize) -> f32 {
    let Some(&m) = logits.get(top).filter(|m| m.is_finite()) else { return 0.0 };
    tandem_kernels::ops::exp_sub_inplace(logits, m);
    let z = tandem_kernels::ops::sum_f32(logits);
    if z >= 1.0 && z.is_finite() {
        1.0 / z
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_prob_is_the_softmax_of_the_argmax() {
        let mut l = vec![0.0, 3f32.ln(), f32::NEG_INFINITY];
        assert!((top_prob(&mut l, 1) - 0.75).abs() < 1e-6);
        let logits: Vec<f32> = (0..1000).map(|i| ((i * 7919) % 1013) as f32 * 0.01 - 5.0).collect();
        let top = argmax(&logits) as usize;
        let z: f64 = logits.iter().map(|&v| ((v - logits[top]) as f64).exp()).sum();
        let mut l = logits.clone();
        assert!((top_prob(&mut l, top) as f64 - 1.0 / z).abs() < 1e-5);
    }

    #[test]
    fn top_prob_of_broken_logits_is_zero() {
        assert_eq!(top_prob(&mut [f32::NAN, 1.0], 0), 0.0);
        assert_eq!(top_prob(&mut [f32::INFINITY, 1.0], 0), 0.0);
        assert_eq!(top_prob(&mut [], 0), 0.0);
    }
}
