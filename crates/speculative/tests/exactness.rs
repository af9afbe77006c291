//! Exactness of speculative decoding on small random models: at temperature 0
//! the committed stream equals plain greedy decoding for every drafter, draft
//! length (1..=16), scheduling mode and thread count.

mod common;

use std::sync::Arc;

use proptest::prelude::*;
use tandem_gguf::{GgmlType, Gguf};
use tandem_kernels::ThreadPool;
use tandem_model::synthetic::{synthetic_llama, SyntheticSpec};
use tandem_model::Model;
use tandem_sampling::{Rng, SamplerParams};
use tandem_speculative::drafter::{Drafter, Proposal};
use tandem_speculative::{
    DraftModel, HybridDrafter, NgramDrafter, SchedulerConfig, SpecConfig, SpecError, Speculator, SuffixCache, SuffixDrafter, SuffixOptions,
};

fn model(seed: u64, ty: GgmlType, n_layer: usize) -> Arc<Model> {
    let spec = SyntheticSpec { seed, ty, n_layer, ..Default::default() };
    Arc::new(Model::from_gguf(Arc::new(Gguf::from_bytes(synthetic_llama(&spec)).unwrap())).unwrap())
}

/// Proposes the true continuation, corrupted at random positions.
struct Oracle {
    truth: Vec<u32>,
    prompt_len: usize,
    rng: Rng,
    corrupt: f64,
    k: usize,
}

impl Drafter for Oracle {
    fn name(&self) -> String {
        "oracle".into()
    }
    fn max_draft(&self) -> usize {
        self.k
    }
    fn sync(&mut self, _h: &[u32]) -> Result<(), SpecError> {
        Ok(())
    }
    fn propose(
        &mut self,
        history: &[u32],
        _next: u32,
        max: usize,
        _p: &SamplerParams,
        _r: &mut Rng,
        out: &mut Proposal,
    ) -> Result<(), SpecError> {
        out.clear();
        let start = history.len() + 1 - self.prompt_len;
        for i in 0..max {
            let Some(&t) = self.truth.get(start + i) else { break };
            let t = if self.rng.uniform() < self.corrupt { (t + 1 + (self.rng.next_u64() % 50) as u32) % 320 } else { t };
            out.tokens.push(t);
            out.confidence.push(self.rng.uniform() as f32);
        }
        Ok(())
    }
}

fn cfg(k: usize, adaptive: bool) -> SpecConfig {
    SpecConfig { max_draft: k, scheduler: SchedulerConfig { adaptive, ..Default::default() }, ..Default::default() }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, .. ProptestConfig::default() })]
    #[test]
    fn greedy_speculation_equals_plain(seed in 1u64..10_000, k in 1usize..=16, adaptive in any::<bool>(),
                                       corrupt in 0.0f64..0.6, plen in 1usize..24, q8 in any::<bool>()) {
        let ty = if q8 { GgmlType::Q8_0 } else { GgmlType::Q4_1 };
        let m = model(seed, ty, 2);
        let prompt: Vec<u32> = (0..plen).map(|i| 4 + ((i as u64 * 97 + seed) % 300) as u32).collect();
        let n = 40;
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads);
            let want = common::plain(&m, &pool, &prompt, n);
            // oracle with corruption: partial acceptance at every position
            let oracle = Oracle { truth: want.clone(), prompt_len: prompt.len(), rng: Rng::new(seed), corrupt, k };
            let mut sp = Speculator::new(Box::new(oracle), cfg(k, adaptive)).unwrap();
            prop_assert_eq!(&common::speculative(&m, &pool, &prompt, n, &mut sp), &want, "oracle k={} threads={}", k, threads);
            // n-gram lookup
            let mut sp = Speculator::new(Box::new(NgramDrafter::new(1, 4, k).unwrap()), cfg(k, adaptive)).unwrap();
            prop_assert_eq!(&common::speculative(&m, &pool, &prompt, n, &mut sp), &want, "lookup k={}", k);
            // n-gram lookup in front of the corrupted oracle
            let oracle = Oracle { truth: want.clone(), prompt_len: prompt.len(), rng: Rng::new(seed ^ 1), corrupt, k };
            let hybrid = HybridDrafter::new(Box::new(NgramDrafter::new(1, 4, k).unwrap()), Some(Box::new(oracle)));
            let mut sp = Speculator::new(Box::new(hybrid), cfg(k, adaptive)).unwrap();
            prop_assert_eq!(&common::speculative(&m, &pool, &prompt, n, &mut sp), &want, "lookup before oracle k={}", k);
            // a different model of the same vocabulary as draft model
            let dm = DraftModel::new(model(seed + 1, ty, 1), Arc::new(ThreadPool::new(1)), m.cfg.vocab, 512, k).unwrap();
            let mut sp = Speculator::new(Box::new(dm), cfg(k, adaptive)).unwrap();
            prop_assert_eq!(&common::speculative(&m, &pool, &prompt, n, &mut sp), &want, "draft model k={}", k);
            // suffix trees alone, over a cache that holds earlier outputs:
            // the true continuation, a corrupted copy of it, and what this
            // run itself writes (so both trees propose, right and wrong)
            let cache = SuffixCache::new(64 + (seed % 200) as usize, 8 + (seed % 24) as usize);
            let mut rng = Rng::new(seed ^ 7);
            let corrupted: Vec<u32> =
                want.iter().map(|&t| if rng.uniform() < corrupt { (t + 1) % 320 } else { t }).collect();
            cache.append(None, &corrupted);
            if seed % 2 == 0 {
                cache.append(None, &want[..n / 2]);
            }
            let opts = SuffixOptions { max_draft: k, max_match: (cache.depth() / 2).max(1), min_prob: 0.05 };
            let suffix = SuffixDrafter::new(cache.clone(), opts.clone()).unwrap();
            let mut sp = Speculator::new(Box::new(HybridDrafter::new(Box::new(suffix), None)), cfg(k, adaptive)).unwrap();
            prop_assert_eq!(&common::speculative(&m, &pool, &prompt, n, &mut sp), &want, "suffix k={}", k);
            prop_assert!(cache.tokens() <= cache.capacity());
            // suffix trees in front of the corrupted oracle, and of a draft model
            let oracle = Oracle { truth: want.clone(), prompt_len: prompt.len(), rng: Rng::new(seed ^ 3), corrupt, k };
            let suffix = SuffixDrafter::new(cache.clone(), opts.clone()).unwrap();
            let mut sp = Speculator::new(Box::new(HybridDrafter::new(Box::new(suffix), Some(Box::new(oracle)))), cfg(k, adaptive)).unwrap();
            prop_assert_eq!(&common::speculative(&m, &pool, &prompt, n, &mut sp), &want, "suffix before oracle k={}", k);
            let dm = DraftModel::new(model(seed + 1, ty, 1), Arc::new(ThreadPool::new(1)), m.cfg.vocab, 512, k).unwrap();
            let suffix = SuffixDrafter::new(cache.clone(), opts).unwrap();
            let mut sp = Speculator::new(Box::new(HybridDrafter::new(Box::new(suffix), Some(Box::new(dm)))), cfg(k, adaptive)).unwrap();
            prop_assert_eq!(&common::speculative(&m, &pool, &prompt, n, &mut sp), &want, "suffix before draft model k={}", k);
        }
    }
}

/// A Gemma-3-shaped model whose local layers attend over a window of
/// `window` positions (rings of 128 rows for windows up to 64).
fn windowed(seed: u64, window: usize, n_layer: usize) -> Arc<Model> {
    let spec = SyntheticSpec { seed, n_layer, window: Some(window), ..Default::default() };
    Arc::new(Model::from_gguf(Arc::new(Gguf::from_bytes(synthetic_llama(&spec)).unwrap())).unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]
    /// Sliding-window targets: drafts straddle the window boundary (windows
    /// of 1–12 positions, 40 tokens decoded) and the rings wrap (prompts of
    /// up to 200 tokens); lookup, a corrupted oracle and a sliding-window
    /// draft model all give plain greedy output.
    #[test]
    fn sliding_window_speculation_equals_plain(seed in 1u64..10_000, k in 1usize..=16, window in 1usize..=12,
                                               corrupt in 0.0f64..0.6, plen in 1usize..200) {
        let m = windowed(seed, window, 2);
        let prompt: Vec<u32> = (0..plen).map(|i| 4 + ((i as u64 * 97 + seed) % 300) as u32).collect();
        let n = 40;
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads);
            let want = common::plain(&m, &pool, &prompt, n);
            let oracle = Oracle { truth: want.clone(), prompt_len: prompt.len(), rng: Rng::new(seed), corrupt, k };
            let mut sp = Speculator::new(Box::new(oracle), cfg(k, seed % 2 == 0)).unwrap();
            prop_assert_eq!(&common::speculative(&m, &pool, &prompt, n, &mut sp), &want, "oracle k={} window={}", k, window);
            let mut sp = Speculator::new(Box::new(NgramDrafter::new(1, 4, k).unwrap()), cfg(k, false)).unwrap();
            prop_assert_eq!(&common::speculative(&m, &pool, &prompt, n, &mut sp), &want, "lookup k={} window={}", k, window);
            let dm = DraftModel::new(windowed(seed + 1, window, 1), Arc::new(ThreadPool::new(1)), m.cfg.vocab, 512, k).unwrap();
            let mut sp = Speculator::new(Box::new(dm), cfg(k, false)).unwrap();
            prop_assert_eq!(&common::speculative(&m, &pool, &prompt, n, &mut sp), &want, "draft model k={} window={}", k, window);
        }
    }
}

#[test]
fn target_as_its_own_draft_model_accepts_everything() {
    let m = model(7, GgmlType::Q8_0, 2);
    let pool = ThreadPool::new(2);
    let prompt = [5u32, 6, 7, 8];
    let want = common::plain(&m, &pool, &prompt, 48);
    for k in [1, 4, 8, 16] {
        let dm = DraftModel::new(m.clone(), Arc::new(ThreadPool::new(1)), m.cfg.vocab, 512, k).unwrap();
        let mut sp = Speculator::new(Box::new(dm), cfg(k, false)).unwrap();
        assert_eq!(common::speculative(&m, &pool, &prompt, 48, &mut sp), want);
        let st = &sp.stats;
        assert_eq!(st.accepted, st.drafted, "k={k}: every draft accepted");
        assert!(st.mean_committed() > 1.0);
    }
}

#[test]
fn bad_options_are_errors() {
    let m = model(3, GgmlType::Q8_0, 1);
    let other = Arc::new(
        Model::from_gguf(Arc::new(Gguf::from_bytes(synthetic_llama(&SyntheticSpec { vocab: 400, ..Default::default() })).unwrap()))
            .unwrap(),
    );
    assert!(matches!(DraftModel::new(other, Arc::new(ThreadPool::new(1)), m.cfg.vocab, 64, 4), Err(SpecError::VocabMismatch(_))));
    assert!(Speculator::new(Box::new(NgramDrafter::new(1, 2, 4).unwrap()), cfg(0, true)).is_err());
    assert!(Speculator::new(Box::new(NgramDrafter::new(1, 2, 4).unwrap()), cfg(1000, true)).is_err());
}
