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

/// With copy hints: slot 0 carries a hint inside the draft vocabulary
/// (suffix length 2), slot 2 one outside it (its own logit column), the
/// others none; the second block hints at slot 1.
#[test]
fn candle_forward_matches_engine_dspark_with_copy_hints() {
    check(true);
}

fn check(hints: bool) {
    let (target, d2t) = target_with_reduced_vocab();
    let tc = target.cfg.clone();
    let d = tc.d_model;
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
        copy_embed: if hints { vec![0.8, -1.3] } else { Vec::new() },
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
                                                    // copy hints per slot of both blocks: (target token, suffix length);
                                                    // token 4 is outside the draft vocabulary (4 % 3 == 1)
    let hint: [Option<(u32, usize)>; 8] =
        if hints { [Some((6, 2)), None, Some((4, 1)), None, None, Some((9, 2)), None, None] } else { [None; 8] };
    let pool = ThreadPool::new(1);
    let mut cache = dm.new_cache(64);
    dm.inject(&pool, &mut cache, &feats, a).unwrap();
    let (mut e, mut base) = (Vec::new(), Vec::new());
    dm.block(&pool, &mut cache, anchor, hint[0], 4, &mut e, &mut base).unwrap();
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
    let (mut hint_row, mut hint_len, mut hint_out, mut hint_oov, mut hint_in) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    if hints {
        // slot 0's hint embedding joins its input
        hint_in = vec![0f32; 8 * d];
        for r in [0, 4] {
            if let Some((t, _)) = hint[r] {
                target.embed(t, &mut hint_in[r * d..(r + 1) * d]).unwrap();
            }
        }
        let out_w = target.output_weight().view(target.gguf());
        hint_out = vec![0f32; 8 * d];
        for (r, h) in hint.iter().enumerate() {
            let (row, len, oov) = match h {
                None => (u32::MAX, 0, 0.0),
                Some((t, n)) => match d2t.iter().position(|x| x == t) {
                    Some(row) => (row as u32, *n as u32, 0.0),
                    None => {
                        out_w.row_f32(*t as usize, &mut hint_out[r * d..(r + 1) * d]);
                        (u32::MAX, *n as u32, 1.0)
                    }
                },
            };
            hint_row.push(row);
            hint_len.push(len);
            hint_oov.push(oov);
        }
    }
    let b = Blocks { feats: feats.clone(), l: a, anchors: vec![a, 5], emb, prev: prevs, hint_row, hint_len, hint_out, hint_oov, hint_in };
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
        let lg: &Vec<f32> = &eng_logits[i];
        // the engine appends a column only for a hint outside the draft vocabulary
        assert_eq!(lg.len(), if hints && i == 2 { vd + 1 } else { vd }, "slot {i}: logit columns");
        cmp(&format!("slot {i} logits"), lg, &cl[i][..lg.len()]);
        if hints && lg.len() == vd {
            assert!(cl[i][vd] < -1e8, "slot {i}: the extra column is off without such a hint");
        }
        assert_eq!(am(lg), am(&cl[i]), "slot {i}: argmax differs");
        let c = 1.0 / (1.0 + (-cz[i]).exp());
        assert!((c - eng_conf[i]).abs() < 1e-4, "slot {i}: confidence engine {} candle {c}", eng_conf[i]);
    }
    // the fused loss (`--fused-loss`) gives the candle loss and gradients:
    // labels inside and outside the draft vocabulary, an unlabelled slot,
    // slots past the sequence's end
    let mut labels: Vec<u32> = (0..8u32).map(|r| (r * 5 + 1) % vd as u32).collect();
    labels[3] = u32::MAX;
    if hints {
        labels[2] = vd as u32; // slot 2's hint is outside the draft vocabulary: its own column
    }
    let valid = vec![true, true, true, true, true, true, false, false];
    let h_last: Vec<f32> = (0..8 * d).map(|_| 3.0 * r.next()).collect();
    let t = tandem_train::dspark::Targets { labels, valid, h_last };
    {
        let run = |fused: bool| {
            let (loss, count) = net.loss(&b, &t, 0.1, fused, &dev).unwrap();
            let grads = loss.backward().unwrap();
            let g: Vec<Vec<f32>> = net
                .vars()
                .iter()
                .map(|v| grads.get(v.as_tensor()).map(|g| g.flatten_all().unwrap().to_vec1().unwrap()).unwrap_or_default())
                .collect();
            (loss.to_scalar::<f32>().unwrap(), count, g)
        };
        let (lc, nc, gc) = run(false);
        let (lf, nf, gf) = run(true);
        assert_eq!(nc, nf);
        assert!((lc - lf).abs() <= 1e-5 * lc.abs().max(1.0), "loss candle {lc}, fused {lf}");
        for (i, (a, b)) in gc.iter().zip(&gf).enumerate() {
            assert_eq!(a.len(), b.len(), "var {i}: gradient presence");
            cmp(&format!("gradient of var {i}"), b, a);
        }
        assert!(gc.iter().any(|g| g.iter().any(|v| *v != 0.0)), "some gradient is non-zero");
    }

    // the markov term matters (not a vacuous comparison)
    let plain: Vec<f32> = base[..vd].to_vec();
    assert!(plain.iter().zip(&eng_logits[0]).any(|(x, y)| (x - y).abs() > 1e-3));
    if hints {
        // the hint's bias matters too: the hinted row moved by more than the Markov term elsewhere
        let mut no_hint = base[..vd].to_vec();
        let c0 = dm.markov(&pool, prev[0], None, &e[..d], &mut no_hint).unwrap().unwrap();
        let row = d2t.iter().position(|&t| t == 6).unwrap();
        assert!((eng_logits[0][row] - no_hint[row] - 1.9).abs() < 1e-5);
        assert!((c0 - eng_conf[0]).abs() > 1e-3, "the confidence bias applies");
        // and slot 0's hint embedding changes the block's states
        let (mut e2, mut base2) = (Vec::new(), Vec::new());
        dm.block(&pool, &mut cache, anchor, None, 4, &mut e2, &mut base2).unwrap();
        assert!(e2[..d].iter().zip(&e[..d]).any(|(x, y)| (x - y).abs() > 1e-3), "the hint embedding applies");
    }
}

/// The distillation target with copy hints: for a slot whose hint lies outside
/// the draft vocabulary it is the target's softmax over the draft rows plus
/// the hinted token; elsewhere over the draft rows alone (extra column 0).
#[test]
fn teacher_covers_a_hint_outside_the_draft_vocabulary() {
    let (target, d2t) = target_with_reduced_vocab();
    let tc = target.cfg.clone();
    let d = tc.d_model;
    let mut cfg = DSparkConfig::for_target(&tc, 1, 2, vec![1, 2], 8, d2t.len(), 3);
    cfg.copy_bias = vec![1.0];
    cfg.copy_conf_bias = vec![0.0];
    let w = DSparkWeights::init_from_target(&target, cfg, Some(d2t.clone()), 5);
    let dev = Device::Cpu;
    let net = DSparkNet::new(&target, &w, &dev).unwrap();
    let mut r = Rng(99);
    let h: Vec<f32> = (0..2 * d).map(|_| 3.0 * r.next()).collect();
    let hint_tok = 7u32; // 7 % 3 == 1: outside
    let mut hint_out = vec![0f32; 2 * d];
    target.output_weight().view(target.gguf()).row_f32(hint_tok as usize, &mut hint_out[..d]);
    let b = Blocks {
        feats: Vec::new(),
        l: 0,
        anchors: vec![1],
        emb: Vec::new(),
        prev: vec![0, 0],
        hint_row: vec![u32::MAX; 2],
        hint_len: vec![1, 0],
        hint_out,
        hint_oov: vec![1.0, 0.0],
        hint_in: Vec::new(),
    };
    let pt = net.target_probs(&h, &b, 2, &dev).unwrap().to_vec2::<f32>().unwrap();
    let pool = ThreadPool::new(1);
    for row in 0..2 {
        let mut hn = vec![0f32; d];
        tandem_kernels::ops::rmsnorm(&h[row * d..(row + 1) * d], target.output_norm(), tc.eps, &mut hn);
        let mut full = Vec::new();
        target.lm_head(&pool, &hn, 1, &mut full);
        let mut keep: Vec<u32> = d2t.clone();
        if row == 0 {
            keep.push(hint_tok);
        }
        let mx = keep.iter().map(|&t| full[t as usize]).fold(f32::MIN, f32::max);
        let z: f32 = keep.iter().map(|&t| (full[t as usize] - mx).exp()).sum();
        for (j, &t) in keep.iter().enumerate() {
            let want = (full[t as usize] - mx).exp() / z;
            assert!((pt[row][j] - want).abs() < 1e-5, "row {row} column {j}: {} vs {want}", pt[row][j]);
        }
        if row == 1 {
            assert!(pt[row][d2t.len()] < 1e-12, "no hint: the extra column is empty");
        }
    }
}

/// `--target-layers` with `--init` appends layers whose `fc` columns start
/// at zero: the extended drafter drafts exactly what the old one did,
/// whatever the new layer's features are; a list that does not extend the
/// old one is refused. Likewise `--layers` adds blocks that start as the
/// identity.
#[test]
fn appended_target_layers_and_blocks_start_without_effect() {
    let spec =
        SyntheticSpec { ty: GgmlType::F32, n_layer: 2, d_model: 64, n_head: 4, n_kv_head: 2, ffn: 128, vocab: 320, ..Default::default() };
    let target = Arc::new(Model::from_gguf(Arc::new(Gguf::from_bytes(synthetic_llama(&spec)).unwrap())).unwrap());
    let tc = target.cfg.clone();
    let d = tc.d_model;
    let cfg = DSparkConfig::for_target(&tc, 1, 4, vec![1], 8, tc.vocab, 3);
    let mut w = DSparkWeights::init_from_target(&target, cfg, None, 9);
    perturb(&mut w, 31);
    let mut wide = w.clone();
    tandem_train::dspark::extend_target_layers(&mut wide, &[1, 2], tc.n_layer).unwrap();
    assert_eq!(wide.cfg.target_layers, vec![1, 2]);
    let id = TargetId::new(&tc, 0x1234);
    let load = |w: &DSparkWeights| {
        let file = w.to_gguf(target.gguf(), &id, GgmlType::F32, &[]).unwrap().to_bytes().unwrap();
        DSparkModel::load(Arc::new(Gguf::from_bytes(file).unwrap()), target.clone(), &id).unwrap()
    };
    let (narrow_m, wide_m) = (load(&w), load(&wide));
    let a = 9;
    let mut r = Rng(99);
    let f1: Vec<f32> = (0..a * d).map(|_| 4.0 * r.next()).collect();
    let mut f12 = Vec::with_capacity(2 * a * d);
    for p in 0..a {
        f12.extend_from_slice(&f1[p * d..(p + 1) * d]);
        f12.extend((0..d).map(|_| 4.0 * r.next()));
    }
    let pool = ThreadPool::new(2);
    let run = |m: &DSparkModel, feats: &[f32]| {
        let mut cache = m.new_cache(64);
        m.inject(&pool, &mut cache, feats, a).unwrap();
        let (mut e, mut base) = (Vec::new(), Vec::new());
        m.block(&pool, &mut cache, 17, None, 4, &mut e, &mut base).unwrap();
        (e, base)
    };
    let (e0, b0) = run(&narrow_m, &f1);
    let (e1, b1) = run(&wide_m, &f12);
    assert!(e0.iter().zip(&e1).all(|(x, y)| x.to_bits() == y.to_bits()), "slot states differ");
    assert!(b0.iter().zip(&b1).all(|(x, y)| x.to_bits() == y.to_bits()), "base logits differ");
    for bad in [&[2usize][..], &[2, 1], &[1, 3], &[1, 1]] {
        let mut x = w.clone();
        assert!(tandem_train::dspark::extend_target_layers(&mut x, bad, tc.n_layer).is_err(), "{bad:?} accepted");
    }
    // `--layers` with `--init` appends blocks that start as the identity
    let mut deep = w.clone();
    tandem_train::dspark::grow_layers(&mut deep, 3).unwrap();
    assert_eq!((deep.cfg.n_layer, deep.blocks.len()), (3, 3));
    let (e2, b2) = run(&load(&deep), &f1);
    assert!(e0.iter().zip(&e2).all(|(x, y)| x.to_bits() == y.to_bits()), "slot states differ after growing");
    assert!(b0.iter().zip(&b2).all(|(x, y)| x.to_bits() == y.to_bits()), "base logits differ after growing");
    assert!(tandem_train::dspark::grow_layers(&mut deep, 2).is_err(), "shrinking accepted");
}

/// `--hard-anchors` weighs anchors by how unsure the target is: `unsure` is
/// 1 − the largest of the target's probabilities over the draft rows, from
/// the final residual rows as the data file stores them (f16).
#[test]
fn unsure_is_one_minus_the_targets_top_draft_probability() {
    let (target, d2t) = target_with_reduced_vocab();
    let tc = target.cfg.clone();
    let d = tc.d_model;
    let cfg = DSparkConfig::for_target(&tc, 1, 2, vec![1, 2], 8, d2t.len(), 3);
    let w = DSparkWeights::init_from_target(&target, cfg, Some(d2t.clone()), 5);
    let dev = Device::Cpu;
    let net = DSparkNet::new(&target, &w, &dev).unwrap();
    let mut r = Rng(7);
    let h: Vec<half::f16> = (0..3 * d).map(|_| half::f16::from_f32(3.0 * r.next())).collect();
    let u = net.unsure(&h, &dev).unwrap();
    assert_eq!(u.len(), 3);
    let pool = ThreadPool::new(1);
    for row in 0..3 {
        let hf: Vec<f32> = h[row * d..(row + 1) * d].iter().map(|v| v.to_f32()).collect();
        let mut hn = vec![0f32; d];
        tandem_kernels::ops::rmsnorm(&hf, target.output_norm(), tc.eps, &mut hn);
        let mut full = Vec::new();
        target.lm_head(&pool, &hn, 1, &mut full);
        let mx = d2t.iter().map(|&t| full[t as usize]).fold(f32::MIN, f32::max);
        let z: f32 = d2t.iter().map(|&t| (full[t as usize] - mx).exp()).sum();
        let want = 1.0 - 1.0 / z;
        assert!((u[row] - want).abs() < 1e-5, "row {row}: {} vs {want}", u[row]);
        assert!((0.0..1.0).contains(&u[row]));
    }
}

/// A small synthetic target and a draft vocabulary of two thirds of its
/// tokens (those with `t % 3 != 1`).
fn target_with_reduced_vocab() -> (Arc<Model>, Vec<u32>) {
    let spec =
        SyntheticSpec { ty: GgmlType::F32, n_layer: 2, d_model: 64, n_head: 4, n_kv_head: 2, ffn: 128, vocab: 320, ..Default::default() };
    let target = Arc::new(Model::from_gguf(Arc::new(Gguf::from_bytes(synthetic_llama(&spec)).unwrap())).unwrap());
    let d2t = (0..target.cfg.vocab as u32).filter(|t| t % 3 != 1).collect();
    (target, d2t)
}
