//! The MTP drafter on small random models: greedy speculative output equals
//! plain greedy decoding for any chain depth, margin, draft vocabulary,
//! scheduling mode and thread count, with or without prompt lookup in front,
//! and the head's cache follows the target's rollbacks.

mod common;

use std::sync::Arc;

use proptest::prelude::*;
use tandem_gguf::{GgmlType, Gguf};
use tandem_kernels::ThreadPool;
use tandem_model::mtp::{CopyWeights, FusedWeights, MtpWeights};
use tandem_model::synthetic::{synthetic_llama, SyntheticSpec};
use tandem_model::{ForwardOutput, LogitRows, Model, MtpHead, TargetId};
use tandem_sampling::{Rng, SamplerParams};
use tandem_speculative::{
    Drafter, HybridDrafter, MtpDrafter, NgramDrafter, Proposal, SchedulerConfig, SpecConfig, Speculator, SuffixCache, SuffixDrafter,
    SuffixOptions,
};

fn target(seed: u64) -> Arc<Model> {
    let spec = SyntheticSpec { seed, ty: GgmlType::Q8_0, n_layer: 2, ..Default::default() };
    Arc::new(Model::from_gguf(Arc::new(Gguf::from_bytes(synthetic_llama(&spec)).unwrap())).unwrap())
}

/// A head that starts as "one more target layer" (so it agrees with the
/// target now and then), optionally with a reduced draft vocabulary.
fn head(t: &Arc<Model>, seed: u64, reduced: bool) -> Arc<MtpHead> {
    head_with(t, seed, reduced, false)
}

/// [`head`], optionally fusing both target layers' inputs through a small
/// random `fc` (so the features change the drafts).
fn head_with(t: &Arc<Model>, seed: u64, reduced: bool, fused: bool) -> Arc<MtpHead> {
    head_with_copy(t, seed, reduced, fused, false)
}

/// [`head_with`], optionally with random copy-hint weights (suffixes up to 3).
fn head_with_copy(t: &Arc<Model>, seed: u64, reduced: bool, fused: bool, copy: bool) -> Arc<MtpHead> {
    let mut w = MtpWeights::init_from_target(t, seed);
    if reduced {
        w.d2t = Some((0..t.cfg.vocab as u32).filter(|i| i % 3 != 1).take(200).collect());
    }
    if fused {
        let d = t.cfg.d_model;
        let mut f = FusedWeights::zero(&[1, 2], d);
        let mut s = seed | 1;
        for v in f.fc.iter_mut().chain(f.fnorm.iter_mut()) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            *v += ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1;
        }
        w.fused = Some(f);
    }
    if copy {
        let d = t.cfg.d_model;
        let mut c = CopyWeights::zero(3, d);
        let mut s = seed.wrapping_mul(3) | 1;
        for v in c.proj.iter_mut().chain(c.len.iter_mut()).chain(c.bias.iter_mut()).chain(c.norm.iter_mut()) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            *v += ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.5;
        }
        w.copy = Some(c);
    }
    let id = TargetId::new(&t.cfg, 7);
    let bytes = w.to_gguf(&t.cfg, &id, GgmlType::Q8_0, &[]).unwrap().to_bytes().unwrap();
    Arc::new(MtpHead::load(Arc::new(Gguf::from_bytes(bytes).unwrap()), t.clone(), &id).unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn mtp_greedy_equals_plain(seed in 1u64..10_000, k in 1usize..=8, adaptive in any::<bool>(),
                               threads in 1usize..=2, reduced in any::<bool>(), margin in prop::sample::select(vec![0.0f32, 0.5]),
                               fused in any::<bool>(), copy in any::<bool>()) {
        let m = target(seed);
        let pool = Arc::new(ThreadPool::new(threads));
        let prompt: Vec<u32> = (0..12).map(|i| ((seed as u32).wrapping_mul(31) + i * 17) % 300 + 4).collect();
        let want = common::plain(&m, &pool, &prompt, 40);
        let drafter = MtpDrafter::new(head_with_copy(&m, seed, reduced, fused, copy), pool.clone(), 512, k, margin).unwrap();
        let cfg = SpecConfig { max_draft: k, scheduler: SchedulerConfig { adaptive, ..Default::default() }, opportunistic: false, log: None };
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
        let drafter = MtpDrafter::new(head_with(&m, seed, reduced, fused), pool.clone(), 512, k.min(2), margin).unwrap();
        let hybrid = HybridDrafter::new(Box::new(NgramDrafter::new(2, 4, k).unwrap()), Some(Box::new(drafter)));
        let cfg = SpecConfig { max_draft: k, scheduler: SchedulerConfig { adaptive, ..Default::default() }, opportunistic: false, log: None };
        let mut sp = Speculator::new(Box::new(hybrid), cfg).unwrap();
        prop_assert_eq!(common::speculative(&m, &pool, &rep, 40, &mut sp), want.clone(), "lookup before mtp");
        // suffix trees in front of the head, with the output of an earlier
        // generation in the cache
        let cache = SuffixCache::new(256, 16);
        cache.append(None, &want[..20]);
        let drafter = MtpDrafter::new(head_with(&m, seed, reduced, fused), pool.clone(), 512, k.min(2), margin).unwrap();
        let suffix = SuffixDrafter::new(cache, SuffixOptions { max_draft: k, max_match: 8, min_prob: 0.1 }).unwrap();
        let hybrid = HybridDrafter::new(Box::new(suffix), Some(Box::new(drafter)));
        let cfg = SpecConfig { max_draft: k, scheduler: SchedulerConfig { adaptive, ..Default::default() }, opportunistic: false, log: None };
        let mut sp = Speculator::new(Box::new(hybrid), cfg).unwrap();
        prop_assert_eq!(common::speculative(&m, &pool, &rep, 40, &mut sp), want, "suffix before mtp");
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

/// The drafter feeds the head the right rows: its first draft, after the
/// target's rows arrived in two pieces (as a prefill and a cycle), equals one
/// head pass over all rows at once — for a plain and a fused head. And the
/// fused features do change the logits.
#[test]
fn drafts_come_from_the_right_rows() {
    let m = target(5);
    let d = m.cfg.d_model;
    let pool = Arc::new(ThreadPool::new(1));
    // a text that repeats, so that a head with copy hints gets some
    let toks: Vec<u32> = (0..21u32).map(|i| ((i % 7) * 37 + (i / 14) * 3 + 11) % 300 + 4).collect();
    let n = toks.len() - 1; // history toks[..n], next toks[n]
    let mut firsts = Vec::new();
    for (fused, copy) in [(false, false), (true, false), (true, true)] {
        let h = head_with_copy(&m, 5, false, fused, copy);
        let taps = h.taps();
        let mut cache = m.new_cache(64);
        let mut out = ForwardOutput::default();
        m.forward(&pool, &mut cache, &toks[..n], &LogitRows::None, &taps, &mut out).unwrap();
        let k = taps.len() - 1;
        let feats: Vec<f32> = (0..n).flat_map(|r| out.hidden[1..].iter().flat_map(move |hh| hh[r * d..(r + 1) * d].to_vec())).collect();
        // reference: one pass, row p = (hidden p, token p + 1)
        let mut hc = h.new_cache(64);
        let (mut oh, mut lg) = (Vec::new(), Vec::new());
        let f = (k > 0).then_some(&feats[..]);
        // rows 1..=n of the text toks[..=n]
        h.forward_ctx(&pool, &mut hc, &toks[..=n], n, &out.hidden[0], f, &mut oh, &mut lg).unwrap();
        let best = lg.iter().enumerate().fold((0, f32::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0;
        // the drafter, rows in two pieces
        let mut dr = MtpDrafter::new(h.clone(), pool.clone(), 64, 1, 0.0).unwrap();
        dr.sync(&toks[..n]).unwrap();
        for (a, b) in [(0, 7), (7, n)] {
            let rows: Vec<Vec<f32>> = out.hidden.iter().map(|hh| hh[a * d..b * d].to_vec()).collect();
            let slices: Vec<&[f32]> = rows.iter().map(|r| &r[..]).collect();
            dr.observe(a, b - a, &slices);
        }
        let mut draft = Proposal::default();
        dr.propose(&toks[..n], toks[n], 1, &SamplerParams::greedy(), &mut Rng::new(1), &mut draft).unwrap();
        assert_eq!(draft.tokens, vec![h.to_target(best)], "fused {fused}, copy {copy}");
        firsts.push(lg);
    }
    assert_ne!(firsts[0], firsts[1], "the fused features change the logits");
    assert_ne!(firsts[1], firsts[2], "the copy hints change the logits");
}

/// A copy hint outside a reduced draft vocabulary gets a logit row of its
/// own, so the head can draft a token it has no row for: here a large copy
/// bias makes the hint win.
#[test]
fn a_hint_outside_the_draft_vocabulary_is_drafted() {
    let m = target(3);
    let d = m.cfg.d_model;
    let pool = Arc::new(ThreadPool::new(1));
    let mut w = MtpWeights::init_from_target(&m, 3);
    w.d2t = Some((0..m.cfg.vocab as u32).filter(|i| i % 3 != 1).collect());
    let mut c = CopyWeights::zero(3, d);
    c.bias = vec![60.0; 3];
    w.copy = Some(c);
    let id = TargetId::new(&m.cfg, 7);
    let bytes = w.to_gguf(&m.cfg, &id, GgmlType::Q8_0, &[]).unwrap().to_bytes().unwrap();
    let h = Arc::new(MtpHead::load(Arc::new(Gguf::from_bytes(bytes).unwrap()), m.clone(), &id).unwrap());
    // history … 10 13 20, next 10: the hint after "10" is 13, outside (13 % 3 == 1);
    // the chained hint after "10 13" is 20, inside
    let toks: Vec<u32> = vec![40, 41, 10, 13, 20, 10];
    let n = toks.len() - 1;
    let mut cache = m.new_cache(64);
    let mut out = ForwardOutput::default();
    m.forward(&pool, &mut cache, &toks[..n], &LogitRows::None, &h.taps(), &mut out).unwrap();
    let mut dr = MtpDrafter::new(h.clone(), pool.clone(), 64, 2, 0.0).unwrap();
    dr.sync(&toks[..n]).unwrap();
    let slices: Vec<&[f32]> = out.hidden.iter().map(|r| &r[..]).collect();
    dr.observe(0, n, &slices);
    let mut draft = Proposal::default();
    dr.propose(&toks[..n], toks[n], 2, &SamplerParams::greedy(), &mut Rng::new(1), &mut draft).unwrap();
    assert_eq!(draft.tokens, vec![13, 20]);
    assert!(draft.confidence[0] > 0.99, "the hint row dominates: {:?}", draft.confidence);
}
