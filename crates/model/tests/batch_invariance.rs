//! Forward-pass batch invariance: evaluating M positions in one call gives, for
//! every row, the same bits (logits and hidden states) as evaluating them one at
//! a time — for any M and thread count. Also: truncating the cache and
//! re-evaluating reproduces the same bits (rollback is truncation). Each
//! property runs with caches of f32 and of f16 rows, and with 16- and
//! 64-wide heads (64 is where the attention kernels keep a head in
//! registers).

use std::sync::Arc;

use proptest::prelude::*;
use tandem_gguf::{GgmlType, Gguf};
use tandem_kernels::ThreadPool;
use tandem_model::synthetic::{synthetic_llama, SyntheticSpec};
use tandem_model::{ForwardOutput, HiddenTap, KvType, LogitRows, Model, Segment, SegmentLogits};

fn model(ty: GgmlType, seed: u64, tied: bool) -> Model {
    let spec = SyntheticSpec { ty, seed, tied, ..Default::default() };
    Model::from_gguf(Arc::new(Gguf::from_bytes(synthetic_llama(&spec)).unwrap())).unwrap()
}

/// A model with the cache type and heads of `variant` (bit 0: f16 rows;
/// bit 1: 64-wide heads; bit 2: three query heads on one key/value head, so
/// that the heads do not divide evenly over two threads and a verify pass
/// splits its rows between them).
fn model_variant(ty: GgmlType, seed: u64, tied: bool, variant: u8) -> Model {
    let mut spec = SyntheticSpec { ty, seed, tied, ..Default::default() };
    let hd = if variant & 2 != 0 { 64 } else { 32 };
    if variant & 4 != 0 {
        (spec.d_model, spec.n_head, spec.n_kv_head) = (3 * hd, 3, 1);
    } else if variant & 2 != 0 {
        (spec.d_model, spec.n_head, spec.n_kv_head) = (128, 2, 1);
    }
    let md = Model::from_gguf(Arc::new(Gguf::from_bytes(synthetic_llama(&spec)).unwrap())).unwrap();
    md.set_kv_type(if variant & 1 != 0 { KvType::F16 } else { KvType::F32 });
    md
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

const TYPES: [GgmlType; 7] = [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1];

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, .. ProptestConfig::default() })]
    #[test]
    fn batched_rows_equal_single_steps(ty_i in 0usize..TYPES.len(), prefix in 0usize..200, m in 1usize..=16,
                                       seed in 1u64..1000, tied in any::<bool>(), variant in 0u8..8) {
        let md = model_variant(TYPES[ty_i], seed, tied, variant);
        let vocab = md.cfg.vocab as u32;
        let toks: Vec<u32> = (0..prefix + m).map(|i| ((i as u64 * 7919 + seed * 31) % vocab as u64) as u32).collect();
        let taps = [HiddenTap::Layer(0), HiddenTap::Final];
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads);
            let mut a = md.new_cache(512);
            let mut out = ForwardOutput::default();
            if prefix > 0 {
                md.forward(&pool, &mut a, &toks[..prefix], &LogitRows::None, &[], &mut out).unwrap();
            }
            let mut b = a.clone();
            md.forward(&pool, &mut a, &toks[prefix..], &LogitRows::All, &taps, &mut out).unwrap();
            let d = md.cfg.d_model;
            let v = md.cfg.vocab;
            let mut single = ForwardOutput::default();
            for i in 0..m {
                md.forward(&pool, &mut b, &toks[prefix + i..prefix + i + 1], &LogitRows::All, &taps, &mut single).unwrap();
                prop_assert_eq!(bits(&out.logits[i * v..(i + 1) * v]), bits(&single.logits), "logits row {} threads {}", i, threads);
                for t in 0..taps.len() {
                    prop_assert_eq!(bits(&out.hidden[t][i * d..(i + 1) * d]), bits(&single.hidden[t]), "tap {} row {}", t, i);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]
    /// One decode row per sequence (`forward_multi`, used to generate training
    /// data for many prompts at once) gives each sequence the same bits as
    /// decoding it alone.
    #[test]
    fn rows_of_different_sequences_equal_their_own_steps(ty_i in 0usize..TYPES.len(), n_seq in 1usize..=7,
                                                         steps in 1usize..4, seed in 1u64..1000, variant in 0u8..8) {
        let md = model_variant(TYPES[ty_i], seed, seed % 2 == 0, variant);
        let vocab = md.cfg.vocab as u64;
        let (d, v) = (md.cfg.d_model, md.cfg.vocab);
        let taps = [HiddenTap::Layer(1), HiddenTap::Final];
        let tok = |s: usize, i: usize| ((s as u64 * 104_729 + i as u64 * 7919 + seed * 31) % vocab) as u32;
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads);
            let mut out = ForwardOutput::default();
            // prompts of different lengths, prefilled one sequence at a time
            let mut alone: Vec<_> = (0..n_seq).map(|s| {
                let mut c = md.new_cache(256);
                let p: Vec<u32> = (0..1 + 5 * s % 17).map(|i| tok(s, i)).collect();
                md.forward(&pool, &mut c, &p, &LogitRows::None, &[], &mut out).unwrap();
                c
            }).collect();
            let mut together = alone.clone();
            for step in 0..steps {
                let toks: Vec<u32> = (0..n_seq).map(|s| tok(s, 100 + step)).collect();
                let mut refs: Vec<&mut tandem_model::KvCache> = together.iter_mut().collect();
                md.forward_multi(&pool, &mut refs, &toks, &taps, &mut out).unwrap();
                let mut one = ForwardOutput::default();
                for (s, c) in alone.iter_mut().enumerate() {
                    md.forward(&pool, c, &toks[s..s + 1], &LogitRows::All, &taps, &mut one).unwrap();
                    prop_assert_eq!(bits(&out.logits[s * v..(s + 1) * v]), bits(&one.logits), "seq {} step {} threads {}", s, step, threads);
                    for t in 0..taps.len() {
                        prop_assert_eq!(bits(&out.hidden[t][s * d..(s + 1) * d]), bits(&one.hidden[t]), "tap {} seq {}", t, s);
                    }
                    prop_assert_eq!(together[s].len(), c.len());
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]
    /// Segments of different sequences in one forward (what a server batch
    /// holds: decode rows, speculative verify rows and a chunk of a prompt)
    /// give every row the bits of that segment evaluated alone.
    #[test]
    fn segments_of_different_sequences_equal_their_own_forwards(ty_i in 0usize..TYPES.len(),
                                                                lens in proptest::collection::vec(1usize..=12, 1..=5),
                                                                prefix in 0usize..80, seed in 1u64..1000, variant in 0u8..8) {
        let md = model_variant(TYPES[ty_i], seed, seed % 3 == 0, variant);
        let vocab = md.cfg.vocab as u64;
        let (d, v) = (md.cfg.d_model, md.cfg.vocab);
        let taps = [HiddenTap::Layer(0), HiddenTap::Final];
        let tok = |s: usize, i: usize| ((s as u64 * 104_729 + i as u64 * 7919 + seed * 31) % vocab) as u32;
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads);
            let mut out = ForwardOutput::default();
            let mut alone: Vec<_> = (0..lens.len()).map(|s| {
                let mut c = md.new_cache(256);
                let p: Vec<u32> = (0..1 + (prefix + 13 * s) % 90).map(|i| tok(s, i)).collect();
                md.forward(&pool, &mut c, &p, &LogitRows::None, &[], &mut out).unwrap();
                c
            }).collect();
            let mut together = alone.clone();
            let toks: Vec<Vec<u32>> = lens.iter().enumerate().map(|(s, &n)| (0..n).map(|i| tok(s, 500 + i)).collect()).collect();
            // odd segments are prompt chunks (last row's logits only)
            let kind = |s: usize| if s % 2 == 1 { SegmentLogits::Last } else { SegmentLogits::All };
            let segs: Vec<Segment> = toks.iter().enumerate().map(|(s, t)| Segment { tokens: t, logits: kind(s) }).collect();
            let mut refs: Vec<&mut tandem_model::KvCache> = together.iter_mut().collect();
            md.forward_batch(&pool, &mut refs, &segs, &taps, &mut out).unwrap();
            let mut one = ForwardOutput::default();
            let (mut row, mut lrow) = (0, 0);
            for (s, c) in alone.iter_mut().enumerate() {
                let rows = if kind(s) == SegmentLogits::All { LogitRows::All } else { LogitRows::Last };
                md.forward(&pool, c, &toks[s], &rows, &taps, &mut one).unwrap();
                for r in 0..one.rows.len() {
                    prop_assert_eq!(out.rows[lrow], row + one.rows[r]);
                    prop_assert_eq!(bits(&out.logits[lrow * v..(lrow + 1) * v]), bits(one.logits_row(r)), "seq {} row {} threads {}", s, r, threads);
                    lrow += 1;
                }
                for t in 0..taps.len() {
                    let n = toks[s].len();
                    prop_assert_eq!(bits(&out.hidden[t][row * d..(row + n) * d]), bits(&one.hidden[t]), "tap {} seq {}", t, s);
                }
                prop_assert_eq!(together[s].len(), c.len());
                row += toks[s].len();
            }
            prop_assert_eq!(lrow, out.rows.len());
        }
    }
}

#[test]
fn forward_multi_rejects_bad_inputs() {
    let md = model(GgmlType::Q4_1, 3, true);
    let pool = ThreadPool::new(1);
    let mut out = ForwardOutput::default();
    let mut a = md.new_cache(4);
    let mut b = md.new_cache(1);
    md.forward(&pool, &mut b, &[1], &LogitRows::None, &[], &mut out).unwrap();
    // b is full
    assert!(md.forward_multi(&pool, &mut [&mut a, &mut b], &[1, 2], &[], &mut out).is_err());
    // token count differs from cache count
    assert!(md.forward_multi(&pool, &mut [&mut a], &[1, 2], &[], &mut out).is_err());
    // bad token
    assert!(md.forward_multi(&pool, &mut [&mut a], &[u32::MAX], &[], &mut out).is_err());
    assert_eq!(a.len(), 0, "a failed call leaves the caches alone");
}

#[test]
fn truncate_and_reevaluate_gives_same_bits() {
    for variant in 0..8 {
        truncate_and_reevaluate(variant);
    }
}

fn truncate_and_reevaluate(variant: u8) {
    let md = model_variant(GgmlType::Q4_1, 5, true, variant);
    let pool = ThreadPool::new(2);
    let toks: Vec<u32> = (0..30).map(|i| (i * 13 % 300) as u32).collect();
    let mut c = md.new_cache(512);
    let mut o1 = ForwardOutput::default();
    md.forward(&pool, &mut c, &toks, &LogitRows::All, &[], &mut o1).unwrap();
    let snap = c.snapshot();
    // roll back 10 positions, evaluate different tokens, roll back again, redo the originals
    c.truncate(20);
    let mut o2 = ForwardOutput::default();
    md.forward(&pool, &mut c, &[1, 2, 3, 4, 5], &LogitRows::All, &[], &mut o2).unwrap();
    c.truncate(20);
    md.forward(&pool, &mut c, &toks[20..], &LogitRows::All, &[], &mut o2).unwrap();
    let v = md.cfg.vocab;
    assert_eq!(bits(&o1.logits[20 * v..]), bits(&o2.logits));
    c.restore(&snap);
    assert_eq!(c.len(), 30);
    // a prefix copied into another cache continues with the same bits
    let mut d = md.new_cache(512);
    d.copy_prefix_from(&c, 20);
    md.forward(&pool, &mut d, &toks[20..], &LogitRows::All, &[], &mut o2).unwrap();
    assert_eq!(bits(&o1.logits[20 * v..]), bits(&o2.logits));
    let mut e = c.prefix(20);
    md.forward(&pool, &mut e, &toks[20..], &LogitRows::All, &[], &mut o2).unwrap();
    assert_eq!(bits(&o1.logits[20 * v..]), bits(&o2.logits));
}

/// A cache of f16 rows holds half the bytes of an f32 one, and its logits
/// stay close to f32's (rounding K and V to f16 moves them by about f16's
/// precision, not more).
#[test]
fn f16_rows_take_half_the_bytes_and_stay_close_to_f32() {
    let pool = ThreadPool::new(2);
    let toks: Vec<u32> = (0..60).map(|i| (i * 29 % 300) as u32).collect();
    let mut logits = Vec::new();
    let mut bytes = Vec::new();
    for variant in [2u8, 3] {
        let md = model_variant(GgmlType::Q8_0, 9, true, variant);
        let mut c = md.new_cache(128);
        let mut o = ForwardOutput::default();
        md.forward(&pool, &mut c, &toks, &LogitRows::All, &[], &mut o).unwrap();
        assert_eq!(c.kv_type(), if variant & 1 != 0 { KvType::F16 } else { KvType::F32 });
        bytes.push((c.bytes_used(), md.kv_bytes_full(128, 1)));
        logits.push(o.logits.clone());
    }
    assert_eq!(bytes[0].0, 2 * bytes[1].0);
    assert_eq!(bytes[0].1, 2 * bytes[1].1);
    let (a, b) = (&logits[0], &logits[1]);
    assert_ne!(bits(a), bits(b), "the f16 cache is in use");
    let scale = a.iter().fold(0f32, |m, x| m.max(x.abs()));
    let worst = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(worst <= 1e-2 * scale, "f16 logits {worst} from f32's (scale {scale})");
}

#[test]
fn bad_inputs_are_errors() {
    let md = model(GgmlType::Q8_0, 3, true);
    let pool = ThreadPool::new(1);
    let mut c = md.new_cache(8);
    let mut o = ForwardOutput::default();
    assert!(md.forward(&pool, &mut c, &[100000], &LogitRows::Last, &[], &mut o).is_err());
    assert!(md.forward(&pool, &mut c, &[1; 9], &LogitRows::Last, &[], &mut o).is_err());
    assert!(md.forward(&pool, &mut c, &[1], &LogitRows::Rows(vec![3]), &[], &mut o).is_err());
    assert!(md.forward(&pool, &mut c, &[1], &LogitRows::Last, &[HiddenTap::Layer(99)], &mut o).is_err());
    assert_eq!(c.len(), 0, "failed calls leave the cache untouched");
}
