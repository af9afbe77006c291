//! A separate (smaller) model of the same vocabulary as the drafter. It keeps
//! its own KV cache and rolls it back to the committed history every cycle.

use std::sync::Arc;

use tandem_kernels::ThreadPool;
use tandem_model::{ForwardOutput, KvCache, LogitRows, Model};

use crate::drafter::{Drafter, Proposal};
use crate::{Setting, SpecError};
use tandem_sampling::{argmax, Rng, Sampler, SamplerParams};

pub struct DraftModel {
    model: Arc<Model>,
    pool: Arc<ThreadPool>,
    cache: KvCache,
    /// Tokens in `cache`.
    tokens: Vec<u32>,
    logits: Vec<f32>,
    out: ForwardOutput,
    max_draft: usize,
}

impl DraftModel {
    /// `target_vocab` is the target's vocabulary size; the caller also checks the
    /// token lists (see the engine), this checks the shapes.
    pub fn new(model: Arc<Model>, pool: Arc<ThreadPool>, target_vocab: usize, ctx: usize, max_draft: usize) -> Result<Self, SpecError> {
        if model.cfg.vocab != target_vocab {
            return Err(SpecError::VocabMismatch(format!("draft model has {} tokens, the target {}", model.cfg.vocab, target_vocab)));
        }
        if max_draft == 0 || max_draft > crate::MAX_DRAFT {
            return Err(SpecError::setting(Setting::DraftLength, max_draft, format!("need 1..={}", crate::MAX_DRAFT)));
        }
        let cache = model.new_cache(ctx);
        Ok(DraftModel { model, pool, cache, tokens: Vec::new(), logits: Vec::new(), out: ForwardOutput::default(), max_draft })
    }

    fn feed(&mut self, toks: &[u32]) -> Result<(), SpecError> {
        for chunk in toks.chunks(256) {
            self.model.forward(&self.pool, &mut self.cache, chunk, &LogitRows::Last, &[], &mut self.out)?;
            self.tokens.extend_from_slice(chunk);
        }
        self.logits.clear();
        self.logits.extend_from_slice(self.out.logits_row(0));
        Ok(())
    }

    /// Forget everything after the first `n` tokens (or more: a
    /// sliding-window cache may only go back to empty).
    fn rollback(&mut self, n: usize) {
        self.cache.truncate(n);
        self.tokens.truncate(self.cache.len());
        self.logits.clear();
    }
}

impl Drafter for DraftModel {
    fn name(&self) -> String {
        format!("draft-model({} layers, k={})", self.model.cfg.n_layer, self.max_draft)
    }

    fn max_draft(&self) -> usize {
        self.max_draft
    }

    fn sync(&mut self, history: &[u32]) -> Result<(), SpecError> {
        let common = self.tokens.iter().zip(history).take_while(|(a, b)| a == b).count();
        if common < self.tokens.len() {
            self.rollback(common);
        }
        Ok(())
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
        out.clear();
        let seq_len = history.len() + 1;
        let at = |i: usize| if i < history.len() { history[i] } else { next };
        let mut common = self.tokens.iter().enumerate().take_while(|&(i, &t)| i < seq_len && t == at(i)).count();
        if common == seq_len {
            common -= 1; // need fresh logits after the last token
        }
        self.rollback(common);
        let common = self.tokens.len();
        let rest: Vec<u32> = (common..seq_len).map(at).collect();
        let room = self.cache.ctx().saturating_sub(seq_len);
        self.feed(&rest)?;
        let max = max.min(self.max_draft).min(room);
        let sampler = Sampler::new(params.clone());
        for i in 0..max {
            let d = if params.is_greedy() {
                argmax(&self.logits)
            } else {
                let dist = sampler.distribution(&self.logits);
                let d = Sampler::draw(&dist, rng.uniform());
                out.dists.push(dist);
                d
            };
            out.tokens.push(d);
            if i + 1 < max {
                self.feed(&[d])?;
            }
        }
        Ok(())
    }
}
