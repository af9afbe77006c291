//! The trainer's candle forward must compute what the engine's DSpark drafter
//! computes: same weights (exported with F32 matrices and loaded back), same
//! context features, same anchor — same logits (Markov included) and the same
//! confidences for every slot of the block.

use std::sync::Arc;

use candle_core::Device;
use tandem_gguf::{GgmlType, Gguf};
use tandem_kernels::ThreadPool;
use tandem_model::synthetic::{synthetic_llama, SyntheticSpec};
use tandem_model::{DSparkConfig, DSparkModel, DSparkWeights, Model, TargetId};
use tandem_train::dspark::{Blocks, DSparkNet};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        let s = &mut self.0;
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        (*s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }
}

fn perturb(w: &mut DSparkWeights, seed: u64) {
    let mut r = Rng(seed | 1);
    for v in w.fc.iter_mut() {
        *v += 0.1 * r.next();
    }
    for v in w.enc_norm.iter_mut().chain(w.output_norm.iter_mut()) {
        *v += 0.2 * r.next();
    }
    for b in &mut w.blocks {
        for (_, t) in b.tensors.iter_mut() {
            for v in t.iter_mut() {
                *v += 0.1 * r.next();
            }
        }
    }
    for v in w.markov_w1.iter_mut().chain(w.markov_w2.iter_mut()) {
        *v += 0.5 * r.next();
    }
    let (cw, cb) = w.conf.as_mut().unwrap();
    for v in cw.iter_mut() {
        *v += 0.2 * r.next();
    }
    *cb = 0.3;
}

#[test]
fn candle_forward_matches_engine_dspark() {
    check(false);
}

/// With copy hints: slots 0 and 2 carry a hint (suffix lengths 2 and 1),
/// the others none; the second block hints at slot 1.
#[test]
fn candle_forward_matches_engine_dspark_with_copy_hints() {
    check(true);
}

fn check(hints: bool) {
    let spec = SyntheticSpec { ty: GgmlType::F32, n_layer: 2, d_model: 64, n_head: 4, n_kv_head: 2, ffn: 128, vocab: 320, ..Default::default() };
    let target = Arc::new(Model::from_gguf(Arc::new(Gguf::from_bytes(synthetic_llama(&spec)).unwrap())).unwrap());
    let tc = target.cfg.clone();
    let d = tc.d_model;
    let d2t: Vec<u32> = (0..tc.vocab as u32).filter(|t| t % 3 != 1).collect();
    let cfg = DSparkConfig {
        n_layer: 2,
        d_model: d,
        n_head: tc.n_head,
        n_kv_head: tc.n_kv_head,
        head_dim: tc.head_dim,
        ffn: tc.ffn,
        eps: tc.eps,
        rope_base: 10000.0,
        ctx: 256,
        block_size: 4,
        target_layers: vec![1, 2],
        sample_from_anchor: true,
        mask_token: 3,
        markov_rank: 8,
        draft_vocab: d2t.len(),
        has_conf: true,
        copy_bias: if hints { vec![0.7, 1.9] } else { Vec::new() },
        copy_conf_bias: if hints { vec![0.4, -0.3] } else { Vec::new() },
    };
    let mut w = DSparkWeights::init_from_target(&target, cfg.clone(), Some(d2t.clone()), 5);
    perturb(&mut w, 77);
    let id = TargetId::new(&tc, 0x1234);
    let file = w.to_gguf(target.gguf(), &id, GgmlType::F32, &[]).unwrap().to_bytes().unwrap();
    let dm = DSparkModel::load(Arc::new(Gguf::from_bytes(file).unwrap()), target.clone(), &id).unwrap();

    // context of `a` rows of random features, then a block at anchor position a
    let a = 11;
    let fd = cfg.feat_dim();
    let mut r = Rng(4242);
    let feats: Vec<f32> = (0..a * fd).map(|_| 4.0 * r.next()).collect();
    let anchor = 17u32;
    let prev: Vec<u32> = vec![anchor, 250, 8, 101]; // Markov inputs of slots 0..3
    // copy hints per slot of both blocks: (draft row, suffix length)
    let hint: [Option<(usize, usize)>; 8] = if hints {
        [Some((5, 2)), None, Some((150, 1)), None, None, Some((7, 2)), None, None]
    } else {
        [None; 8]
    };
    let pool = ThreadPool::new(1);
    let mut cache = dm.new_cache(64);
    dm.inject(&pool, &mut cache, &feats, a).unwrap();
    let (mut e, mut base) = (Vec::new(), Vec::new());
    dm.block(&pool, &mut cache, anchor, 4, &mut e, &mut base).unwrap();
    assert_eq!(cache.len(), a, "block rows are dropped");
    let vd = cfg.draft_vocab;
    let mut eng_logits = Vec::new();
    let mut eng_conf = Vec::new();
    for i in 0..4 {
        let mut lg = base[i * vd..(i + 1) * vd].to_vec();
        let c = dm.markov(&pool, prev[i], hint[i], &e[i * d..(i + 1) * d], &mut lg).unwrap().unwrap();
        eng_logits.push(lg);
        eng_conf.push(c);
    }

    // candle: the same block, plus a second anchor in the same call (its
    // context is a prefix; it must not disturb the first block)
    let dev = Device::Cpu;
    let net = DSparkNet::new(&target, &w, &dev).unwrap();
    let mut emb = vec![0f32; 8 * d];
    let mut x = vec![0f32; d];
    for (k, t) in [anchor, 40].iter().enumerate() {
        target.embed(*t, &mut x).unwrap();
        emb[k * 4 * d..(k * 4 + 1) * d].copy_from_slice(&x);
        target.embed(cfg.mask_token, &mut x).unwrap();
        for i in 1..4 {
            emb[(k * 4 + i) * d..(k * 4 + i + 1) * d].copy_from_slice(&x);
        }
    }
    let mut prevs = prev.clone();
    prevs.extend([40, 1, 2, 3]);
    let (hint_row, hint_len) = if hints {
        (hint.iter().map(|h| h.map_or(u32::MAX, |x| x.0 as u32)).collect(), hint.iter().map(|h| h.map_or(0, |x| x.1 as u32)).collect())
    } else {
        (Vec::new(), Vec::new())
    };
    let b = Blocks { feats: feats.clone(), l: a, anchors: vec![a, 5], emb, prev: prevs, hint_row, hint_len };
    let (ce, cl, cz) = net.forward(&b, &dev).unwrap();
    let cl = cl.to_vec2::<f32>().unwrap();
    let ce = ce.to_vec2::<f32>().unwrap();
    let cz = cz.to_vec1::<f32>().unwrap();
    let cmp = |name: &str, a: &[f32], b: &[f32]| {
        let scale = a.iter().fold(0f32, |m, v| m.max(v.abs())).max(1.0);
        let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(diff <= 1e-4 * scale, "{name}: max |engine - candle| = {diff} (scale {scale})");
    };
    let am = |v: &[f32]| v.iter().enumerate().fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b }).0;
    for i in 0..4 {
        cmp(&format!("slot {i} state"), &e[i * d..(i + 1) * d], &ce[i]);
        cmp(&format!("slot {i} logits"), &eng_logits[i], &cl[i]);
        assert_eq!(am(&eng_logits[i]), am(&cl[i]), "slot {i}: argmax differs");
        let c = 1.0 / (1.0 + (-cz[i]).exp());
        assert!((c - eng_conf[i]).abs() < 1e-4, "slot {i}: confidence engine {} candle {c}", eng_conf[i]);
    }
    // the markov term matters (not a vacuous comparison)
    let plain: Vec<f32> = base[..vd].to_vec();
    assert!(plain.iter().zip(&eng_logits[0]).any(|(x, y)| (x - y).abs() > 1e-3));
    if hints {
        // the hint's bias matters too: the hinted row moved by more than the Markov term elsewhere
        let mut no_hint = base[..vd].to_vec();
        let c0 = dm.markov(&pool, prev[0], None, &e[..d], &mut no_hint).unwrap().unwrap();
        assert!((eng_logits[0][5] - no_hint[5] - 1.9).abs() < 1e-5);
        assert!((c0 - eng_conf[0]).abs() > 1e-3, "the confidence bias applies");
    }
}
