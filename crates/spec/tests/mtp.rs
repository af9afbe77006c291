//! The MTP drafter on small random models: greedy speculative output equals
//! plain greedy decoding for any chain depth, margin, draft vocabulary,
//! scheduling mode and thread count, with or without prompt lookup in front,
//! and the head's cache follows the target's rollbacks.

mod common;

use std::sync::Arc;

use proptest::prelude::*;
use tandem_gguf::{GgmlType, Gguf};
use tandem_kernels::ThreadPool;
use tandem_model::mtp::MtpWeights;
use tandem_model::synthetic::{synthetic_llama, SyntheticSpec};
use tandem_model::{Model, MtpHead, TargetId};
use tandem_spec::{HybridDrafter, MtpDrafter, NgramDrafter, SchedulerConfig, SpecConfig, Speculator};

fn target(seed: u64) -> Arc<Model> {
    let spec = SyntheticSpec { seed, ty: GgmlType::Q8_0, n_layer: 2, ..Default::default() };
    Arc::new(Model::from_gguf(Arc::new(Gguf::from_bytes(synthetic_llama(&spec)).unwrap())).unwrap())
}

/// A head that starts as "one more target layer" (so it agrees with the
/// target now and then), optionally with a reduced draft vocabulary.
fn head(t: &Arc<Model>, seed: u64, reduced: bool) -> Arc<MtpHead> {
    let mut w = MtpWeights::init_from_target(t, seed);
    if reduced {
        w.d2t = Some((0..t.cfg.vocab as u32).filter(|i| i % 3 != 1).take(200).collect());
    }
    let id = TargetId::new(&t.cfg, 7);
    let bytes = w.to_gguf(&t.cfg, &id, GgmlType::Q8_0, &[]).unwrap().to_bytes().unwrap();
    Arc::new(MtpHead::load(Arc::new(Gguf::from_bytes(bytes).unwrap()), t.clone(), &id).unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn mtp_greedy_equals_plain(seed in 1u64..10_000, k in 1usize..=8, adaptive in any::<bool>(),
                               threads in 1usize..=2, reduced in any::<bool>(), margin in prop::sample::select(vec![0.0f32, 0.5])) {
        let m = target(seed);
        let pool = Arc::new(ThreadPool::new(threads));
        let prompt: Vec<u32> = (0..12).map(|i| ((seed as u32).wrapping_mul(31) + i * 17) % 300 + 4).collect();
        let want = common::plain(&m, &pool, &prompt, 40);
        let drafter = MtpDrafter::new(head(&m, seed, reduced), pool.clone(), 512, k, margin).unwrap();
        let cfg = SpecConfig { max_draft: k, scheduler: SchedulerConfig { adaptive, ..Default::default() }, opportunistic: false, log: false };
        let mut sp = Speculator::new(Box::new(drafter), cfg).unwrap();
        let got = common::speculative(&m, &pool, &prompt, 40, &mut sp);
        prop_assert_eq!(got, want);
        if !adaptive && margin == 0.0 {
            prop_assert!(sp.stats.drafted > 0, "fixed mode drafts");
        }
        // prompt lookup in front of the head, on a prompt that repeats so
        // both sources propose; the head's cache must follow cycles in which
        // it was not asked
        let rep: Vec<u32> = prompt.iter().chain(&prompt[..6]).chain(&prompt[3..9]).copied().collect();
        let want = common::plain(&m, &pool, &rep, 40);
        let drafter = MtpDrafter::new(head(&m, seed, reduced), pool.clone(), 512, k.min(2), margin).unwrap();
        let hybrid = HybridDrafter::new(NgramDrafter::new(2, 4, k).unwrap(), Box::new(drafter));
        let cfg = SpecConfig { max_draft: k, scheduler: SchedulerConfig { adaptive, ..Default::default() }, opportunistic: false, log: false };
        let mut sp = Speculator::new(Box::new(hybrid), cfg).unwrap();
        prop_assert_eq!(common::speculative(&m, &pool, &rep, 40, &mut sp), want, "lookup before mtp");
    }
}

#[test]
fn bad_options_are_errors() {
    let m = target(1);
    let pool = Arc::new(ThreadPool::new(1));
    let h = head(&m, 1, false);
    assert!(MtpDrafter::new(h.clone(), pool.clone(), 64, 0, 0.0).is_err());
    assert!(MtpDrafter::new(h.clone(), pool.clone(), 64, 33, 0.0).is_err());
    assert!(MtpDrafter::new(h, pool, 64, 2, f32::NAN).is_err());
}
