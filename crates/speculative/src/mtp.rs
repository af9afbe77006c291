//! The MTP drafter: runs an [`MtpHead`] on the target's hidden states.
//!
//! The head's block has its own KV cache with one row per committed position
//! p, made from the target's hidden row at p and the token at p + 1. So the
//! row of the last committed position can only be added once the target has
//! chosen its next token: at propose time, where it also gives the first
//! draft. Deeper drafts chain the head on its own output; their rows are
//! dropped again (the cache is truncated to the committed positions), and a
//! rollback of the target truncates it the same way.

use std::sync::Arc;

use tandem_kernels::ThreadPool;
use tandem_model::{HiddenTap, KvCache, MtpHead};

use crate::drafter::{Drafter, Proposal};
use crate::{Setting, SpecError};
use tandem_sampling::{Rng, SamplerParams};

pub struct MtpDrafter {
    head: Arc<MtpHead>,
    pool: Arc<ThreadPool>,
    cache: KvCache,
    /// Target hidden rows (tap: last block's output) of positions `0..observed`.
    hidden: Vec<f32>,
    /// For a fused head: the fused layers' rows of the same positions, `k·d`
    /// per position.
    feats: Vec<f32>,
    observed: usize,
    /// The history as last synced (plus the proposed-after token): cache row
    /// p was built from `tokens[p + 1]`, hidden row p from `tokens[..=p]`.
    tokens: Vec<u32>,
    max_draft: usize,
    /// Stop drafting when a draft's top-1 minus top-2 logit is below this.
    margin: f32,
    out_hidden: Vec<f32>,
    logits: Vec<f32>,
}

impl MtpDrafter {
    pub fn new(head: Arc<MtpHead>, pool: Arc<ThreadPool>, ctx: usize, max_draft: usize, margin: f32) -> Result<Self, SpecError> {
        if max_draft == 0 || max_draft > crate::MAX_DRAFT {
            return Err(SpecError::setting(Setting::MtpDraftSteps, max_draft, format!("need 1..={}", crate::MAX_DRAFT)));
        }
        if !margin.is_finite() || margin < 0.0 {
            return Err(SpecError::setting(Setting::MtpMargin, margin, "need a finite value ≥ 0"));
        }
        let cache = head.new_cache(ctx + crate::MAX_DRAFT + 1);
        Ok(MtpDrafter {
            head,
            pool,
            cache,
            hidden: Vec::new(),
            feats: Vec::new(),
            observed: 0,
            tokens: Vec::new(),
            max_draft,
            margin,
            out_hidden: Vec::new(),
            logits: Vec::new(),
        })
    }

    fn d(&self) -> usize {
        self.head.target().cfg.d_model
    }

    /// Width of one position's fused rows (0: a plain head).
    fn feat_width(&self) -> usize {
        self.head.fused_layers().len() * self.d()
    }

    /// The softmax probability of the top draft row: the head was trained to
    /// predict the target's argmax, so this estimates the chance the target
    /// accepts the draft (given the drafts before it were accepted).
    fn top_prob(&self, top: f32) -> f32 {
        let z: f32 = self.logits.iter().map(|&v| (v - top).exp()).sum();
        1.0 / z.max(1.0)
    }

    /// Argmax of the draft logits (first of equals) and the top-1 − top-2 gap.
    fn top(&self) -> (usize, f32) {
        let (mut b1, mut v1, mut v2) = (0usize, f32::NEG_INFINITY, f32::NEG_INFINITY);
        for (i, &v) in self.logits.iter().enumerate() {
            if v > v1 {
                v2 = v1;
                v1 = v;
                b1 = i;
            } else if v > v2 {
                v2 = v;
            }
        }
        (b1, v1 - v2)
    }
}

impl Drafter for MtpDrafter {
    fn name(&self) -> String {
        let fused = match self.head.fused_layers() {
            [] => String::new(),
            l => format!(", fused layers {l:?}"),
        };
        let copy = self.head.copy_ngram().map_or(String::new(), |n| format!(", copy hints up to {n}-grams"));
        format!("mtp(k={}, margin={}, draft vocab {}{fused}{copy})", self.max_draft, self.margin, self.head.draft_vocab())
    }

    fn max_draft(&self) -> usize {
        self.max_draft
    }

    fn taps(&self) -> Vec<HiddenTap> {
        self.head.taps()
    }

    fn sync(&mut self, history: &[u32]) -> Result<(), SpecError> {
        // rows stay valid while the tokens they were built from still match;
        // a pure extension of what we knew invalidates nothing
        let common = self.tokens.iter().zip(history).take_while(|(a, b)| a == b).count();
        if common < self.tokens.len() {
            self.observed = self.observed.min(common);
            self.hidden.truncate(self.observed * self.d());
            self.feats.truncate(self.observed * self.feat_width());
            let rows = self.cache.len().min(common.saturating_sub(1));
            self.cache.truncate(rows);
        }
        self.tokens.clear();
        self.tokens.extend_from_slice(history);
        Ok(())
    }

    fn observe(&mut self, start: usize, rows: usize, hidden: &[&[f32]]) {
        let d = self.d();
        if start > self.observed {
            // a gap: the rows in between were never seen; forget everything after them
            return;
        }
        self.observed = start;
        self.hidden.truncate(start * d);
        self.hidden.extend_from_slice(&hidden[0][..rows * d]);
        let fw = self.feat_width();
        self.feats.truncate(start * fw);
        if fw > 0 {
            for r in 0..rows {
                for h in &hidden[1..] {
                    self.feats.extend_from_slice(&h[r * d..(r + 1) * d]);
                }
            }
        }
        self.observed = start + rows;
    }

    fn propose(
        &mut self,
        history: &[u32],
        next: u32,
        max: usize,
        _params: &SamplerParams,
        _rng: &mut Rng,
        out: &mut Proposal,
    ) -> Result<(), SpecError> {
        out.clear();
        let n = history.len();
        let d = self.d();
        if max == 0 || n == 0 || self.observed < n {
            return Ok(());
        }
        // bring the cache up to position n - 1 (whose next token is `next`)
        self.tokens.clear();
        self.tokens.extend_from_slice(history);
        self.tokens.push(next);
        let have = self.cache.len().min(n - 1);
        self.cache.truncate(have);
        let hid = self.hidden[have * d..n * d].to_vec();
        let fw = self.feat_width();
        let feats = (fw > 0).then(|| self.feats[have * fw..n * fw].to_vec());
        // rows have+1..=n of the text so far (a head with copy hints searches all of it)
        let mut extra = self.head.forward_ctx(
            &self.pool,
            &mut self.cache,
            &self.tokens,
            n - have,
            &hid,
            feats.as_deref(),
            &mut self.out_hidden,
            &mut self.logits,
        )?;
        let max = max.min(self.max_draft).min(self.cache.ctx() - self.cache.len());
        for depth in 0..max {
            let (row, gap) = self.top();
            if gap < self.margin {
                break;
            }
            // a row after the draft rows is a copy hint outside them
            let tok = match extra {
                Some(t) if row >= self.head.draft_vocab() => t,
                _ => self.head.to_target(row),
            };
            out.tokens.push(tok);
            out.confidence.push(self.top_prob(self.logits[row]));
            if depth + 1 == max {
                break;
            }
            let h = self.out_hidden[self.out_hidden.len() - d..].to_vec();
            self.tokens.push(tok);
            extra =
                self.head.forward_ctx(&self.pool, &mut self.cache, &self.tokens, 1, &h, None, &mut self.out_hidden, &mut self.logits)?;
        }
        // chained rows are not committed positions
        self.cache.truncate(n);
        self.tokens.truncate(n + 1);
        Ok(())
    }
}
