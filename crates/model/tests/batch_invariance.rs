//! Forward-pass batch invariance: evaluating M positions in one call gives, for
//! every row, the same bits (logits and hidden states) as evaluating them one at
//! a time — for any M and thread count. Also: truncating the cache and
//! re-evaluating reproduces the same bits (rollback is truncation).

use std::sync::Arc;

use proptest::prelude::*;
use tandem_gguf::{GgmlType, Gguf};
use tandem_kernels::ThreadPool;
use tandem_model::synthetic::{synthetic_llama, SyntheticSpec};
use tandem_model::{ForwardOutput, HiddenTap, LogitRows, Model};

fn model(ty: GgmlType, seed: u64, tied: bool) -> Model {
    let spec = SyntheticSpec { ty, seed, tied, ..Default::default() };
    Model::from_gguf(Arc::new(Gguf::from_bytes(synthetic_llama(&spec)).unwrap())).unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

const TYPES: [GgmlType; 7] =
    [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1];

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, .. ProptestConfig::default() })]
    #[test]
    fn batched_rows_equal_single_steps(ty_i in 0usize..TYPES.len(), prefix in 0usize..40, m in 1usize..=16,
                                       seed in 1u64..1000, tied in any::<bool>()) {
        let md = model(TYPES[ty_i], seed, tied);
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

#[test]
fn truncate_and_reevaluate_gives_same_bits() {
    let md = model(GgmlType::Q4_1, 5, true);
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
