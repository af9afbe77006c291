//! Plain and speculative decoding behind one interface.
//!
//! A session drives a [`Decoder`] step by step over a [`Target`]: the model,
//! its KV cache, the committed tokens and the logits after them. A plain
//! decoder emits one token per step; the [`Speculator`](crate::Speculator)
//! emits a cycle's committed tokens. Either way the cache holds exactly the
//! committed tokens between steps, so the session needs to know nothing of
//! how they were chosen.

use tandem_kernels::ThreadPool;
use tandem_model::{ForwardOutput, HiddenTap, KvCache, LogitRows, Model};
use tandem_sampling::Sampler;

use crate::cycle::CycleRecord;
use crate::speculator::Speculator;
use crate::SpecError;

/// What a decoder extends: the target model and its worker pool, the KV
/// cache, the tokens it holds and the logits after the last of them.
pub struct Target<'a> {
    pub model: &'a Model,
    pub pool: &'a ThreadPool,
    pub cache: &'a mut KvCache,
    /// The committed tokens: exactly what `cache` holds.
    pub history: &'a mut Vec<u32>,
    /// The target's logits after `history`.
    pub logits: &'a mut Vec<f32>,
}

/// What one step emitted.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The tokens, in order.
    pub emitted: Vec<u32>,
    /// The last token was emitted without being evaluated (end of
    /// generation, token budget or context reached): the generation ends.
    pub stopped: bool,
    /// The speculative cycle behind the step, if it was one.
    pub cycle: Option<Box<CycleRecord>>,
}

/// A way of decoding.
pub trait Decoder {
    /// What decodes (for logs and reports).
    fn name(&self) -> String;

    /// Hidden taps the decoder needs for every committed position (none for
    /// plain decoding).
    fn taps(&self) -> &[HiddenTap] {
        &[]
    }

    /// How many leading positions the decoder has hidden rows for; cached
    /// positions beyond it must be evaluated again before it decodes after
    /// them.
    fn observed(&self) -> usize {
        usize::MAX
    }

    /// Hidden rows of positions `start..start + rows` (a prefill), one
    /// `rows × d` matrix per tap.
    fn observe(&mut self, _start: usize, _rows: usize, _hidden: &[Vec<f32>]) {}

    /// A generation starts after `history` (anything kept from an earlier
    /// one is dropped).
    fn begin(&mut self, history: &[u32]) -> Result<(), SpecError>;

    /// Emit the next tokens, at most `remaining`. With `rows`, the logits
    /// row each emitted token was chosen from is appended to it.
    fn step(
        &mut self,
        target: &mut Target<'_>,
        sampler: &mut Sampler,
        remaining: usize,
        is_eog: &dyn Fn(u32) -> bool,
        rows: Option<&mut Vec<Vec<f32>>>,
    ) -> Result<Step, SpecError>;
}

/// One token per step: sample from the logits, then (at the next step)
/// evaluate it. The token is emitted before its forward, so a stream shows it
/// as soon as it is chosen, and the last token of a generation is never
/// evaluated for nothing.
#[derive(Default)]
pub struct PlainDecoder {
    /// The token emitted by the last step, not yet evaluated.
    pending: Option<u32>,
    out: ForwardOutput,
}

impl Decoder for PlainDecoder {
    fn name(&self) -> String {
        "plain".into()
    }

    fn begin(&mut self, _history: &[u32]) -> Result<(), SpecError> {
        self.pending = None;
        Ok(())
    }

    fn step(
        &mut self,
        t: &mut Target<'_>,
        sampler: &mut Sampler,
        remaining: usize,
        is_eog: &dyn Fn(u32) -> bool,
        rows: Option<&mut Vec<Vec<f32>>>,
    ) -> Result<Step, SpecError> {
        if let Some(p) = self.pending.take() {
            t.model.forward(t.pool, t.cache, &[p], &LogitRows::Last, &[], &mut self.out)?;
            t.history.push(p);
            t.logits.clear();
            t.logits.extend_from_slice(self.out.logits_row(0));
        }
        let tok = sampler.sample(t.logits);
        if let Some(rows) = rows {
            rows.push(t.logits.clone());
        }
        let stopped = is_eog(tok) || remaining <= 1 || t.cache.len() + 1 > t.cache.ctx();
        if !stopped {
            self.pending = Some(tok);
        }
        Ok(Step { emitted: vec![tok], stopped, cycle: None })
    }
}

impl Decoder for Speculator {
    fn name(&self) -> String {
        self.drafter_name()
    }

    fn taps(&self) -> &[HiddenTap] {
        Speculator::taps(self)
    }

    fn observed(&self) -> usize {
        Speculator::observed(self)
    }

    fn observe(&mut self, start: usize, rows: usize, hidden: &[Vec<f32>]) {
        Speculator::observe(self, start, rows, hidden)
    }

    fn begin(&mut self, history: &[u32]) -> Result<(), SpecError> {
        Speculator::begin(self, history)
    }

    fn step(
        &mut self,
        t: &mut Target<'_>,
        sampler: &mut Sampler,
        remaining: usize,
        is_eog: &dyn Fn(u32) -> bool,
        mut rows: Option<&mut Vec<Vec<f32>>>,
    ) -> Result<Step, SpecError> {
        // the first token is chosen from the logits on entry, which the
        // cycle replaces
        if let Some(rows) = rows.as_deref_mut() {
            rows.push(t.logits.clone());
        }
        let step = self.cycle(t.model, t.pool, t.cache, t.history, t.logits, sampler, remaining, is_eog)?;
        if let Some(rows) = rows {
            // the committed drafts were chosen from the verify rows before them
            rows.extend((1..step.emitted.len()).map(|i| self.verify_row(i - 1).to_vec()));
        }
        Ok(step)
    }
}
