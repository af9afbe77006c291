//! The trainer's candle forward must compute what the engine's MTP drafter
//! computes: same inputs, same weights (exported to a support file and loaded
//! back), same logits — for the first draft and for a chained one.

use std::sync::Arc;

use candle_core::Device;
use tandem_gguf::{GgmlType, Gguf};
use tandem_kernels::ThreadPool;
use tandem_model::mtp::{copy_hint, CopyWeights, FusedWeights, MtpWeights};
use tandem_model::synthetic::{synthetic_llama, SyntheticSpec};
use tandem_model::{Model, MtpHead, TargetId};
use tandem_train::mtp::{Batch, MtpNet};

fn perturb(w: &mut MtpWeights, seed: u64) {
    let mut s = seed | 1;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2
    };
    for v in w.enorm.iter_mut().chain(w.hnorm.iter_mut()).chain(w.head_norm.iter_mut()) {
        *v += next();
    }
    for v in w.eh_proj.iter_mut() {
        *v += next();
    }
    for (_, t) in w.block.iter_mut() {
        for v in t.iter_mut() {
            *v += 0.2 * next();
        }
    }
}

fn synthetic_target() -> Arc<Model> {
    let spec =
        SyntheticSpec { ty: GgmlType::F32, n_layer: 2, d_model: 64, n_head: 4, n_kv_head: 2, ffn: 128, vocab: 320, ..Default::default() };
    Arc::new(Model::from_gguf(Arc::new(Gguf::from_bytes(synthetic_llama(&spec)).unwrap())).unwrap())
}

/// The trainable head over the target's whole vocabulary (no `d2t`).
fn full_vocab_net(target: &Model, w: &MtpWeights, dev: &Device) -> MtpNet {
    let all: Vec<u32> = (0..target.cfg.vocab as u32).collect();
    net_over(target, w, &all, dev)
}

/// The trainable head over the draft rows `d2t`.
fn net_over(target: &Model, w: &MtpWeights, d2t: &[u32], dev: &Device) -> MtpNet {
    let d = target.cfg.d_model;
    let mut head_rows = vec![0f32; d2t.len() * d];
    let hw = target.output_weight().view(target.gguf());
    for (r, &t) in d2t.iter().enumerate() {
        hw.row_f32(t as usize, &mut head_rows[r * d..(r + 1) * d]);
    }
    MtpNet::new(&target.cfg, w, head_rows, target.output_norm().to_vec(), dev).unwrap()
}

#[test]
fn candle_forward_matches_engine_drafter() {
    forward_matches(false, false);
}

/// The same with fused target layers: `h + fc·[fnorm_i(f_i)]` on the
/// first-draft rows, none on the chained one.
#[test]
fn fused_candle_forward_matches_engine_drafter() {
    forward_matches(true, false);
}

/// The same with copy hints (fused too, as the committed head): the hints
/// come from the text before each row, chained rows included.
#[test]
fn copy_hint_candle_forward_matches_engine_drafter() {
    forward_matches(false, true);
    forward_matches(true, true);
}

/// The same with a reduced draft vocabulary that leaves out the tokens the
/// last rows' hints name: the engine appends the hint's own logit row, the
/// trainer its column `V`.
#[test]
fn out_of_vocabulary_hint_candle_forward_matches_engine_drafter() {
    forward_matches_over(true, true, true);
}

fn forward_matches(fused: bool, copy: bool) {
    forward_matches_over(fused, copy, false)
}

fn forward_matches_over(fused: bool, copy: bool, reduced: bool) {
    let target = synthetic_target();
    let cfg = target.cfg.clone();
    let d = cfg.d_model;
    let mut w = MtpWeights::init_from_target(&target, 3);
    perturb(&mut w, 99);
    let layers = [1usize, 2];
    if fused {
        let mut f = FusedWeights::zero(&layers, d);
        for (i, v) in f.fc.iter_mut().enumerate() {
            *v = ((i * 4099 % 1000) as f32 / 500.0 - 1.0) * 0.05;
        }
        for (i, v) in f.fnorm.iter_mut().enumerate() {
            *v += ((i * 31 % 17) as f32 - 8.0) * 0.02;
        }
        w.fused = Some(f);
    }
    let nmax = 3;
    if copy {
        let mut c = CopyWeights::zero(nmax, d);
        for (i, v) in c.proj.iter_mut().enumerate() {
            *v = ((i * 2731 % 1000) as f32 / 500.0 - 1.0) * 0.1;
        }
        for (i, v) in c.norm.iter_mut().enumerate() {
            *v += ((i * 13 % 7) as f32 - 3.0) * 0.05;
        }
        for (i, v) in c.len.iter_mut().enumerate() {
            *v = ((i * 577 % 100) as f32 / 50.0 - 1.0) * 0.3;
        }
        c.bias = (0..nmax).map(|i| 1.5 + i as f32).collect();
        w.copy = Some(c);
    }
    // the draft vocabulary: all but 79 and 116 when reduced
    let d2t: Vec<u32> = (0..cfg.vocab as u32).filter(|&t| !reduced || (t != 79 && t != 116)).collect();
    let v = d2t.len();
    if reduced {
        w.d2t = Some(d2t.clone());
    }
    let id = TargetId::new(&cfg, 0x1234);
    let file = w.to_gguf(&cfg, &id, GgmlType::F32, &[]).unwrap().to_bytes().unwrap();
    let head = MtpHead::load(Arc::new(Gguf::from_bytes(file).unwrap()), target.clone(), &id).unwrap();

    // a sequence of m rows: tokens t[1..=m] (the token after each position) and hidden rows
    let m = 9;
    // repeats, so that rows get copy hints of every length (and none)
    let toks: Vec<u32> = vec![5, 42, 79, 5, 42, 116, 5, 42, 79, 79, 42];
    assert_eq!(toks.len(), m + 2);
    let mut hid = vec![0f32; m * d];
    for (i, v) in hid.iter_mut().enumerate() {
        *v = ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 2.0;
    }
    let pool = ThreadPool::new(1);
    let mut cache = head.new_cache(64);
    let (mut oh, mut lg) = (Vec::new(), Vec::new());
    // fused rows: per position the k layers' rows, in the head's order
    let kd = if fused { layers.len() * d } else { 0 };
    let feats: Vec<f32> = (0..m * kd).map(|i| ((i * 6007 % 1000) as f32 / 250.0 - 2.0) * 1.5).collect();
    // rows 1..=m of the text toks[0..=m]
    let x1 = head.forward_ctx(&pool, &mut cache, &toks[..=m], m, &hid, fused.then_some(&feats[..]), &mut oh, &mut lg).unwrap();
    let engine_d1 = lg.clone();
    // chained: token t[m+1] with the head's own last output
    let h_last = oh[(m - 1) * d..].to_vec();
    let x2 = head.forward_ctx(&pool, &mut cache, &toks[..m + 2], 1, &h_last, None, &mut oh, &mut lg).unwrap();
    let engine_d2 = lg.clone();
    // the last rows' hints (79 after "… 79", 79 after "42") are outside a reduced vocabulary
    let want = (copy && reduced).then_some(79);
    assert_eq!((x1, x2), (want, want), "appended hint rows");
    assert_eq!(engine_d1.len(), v + want.is_some() as usize);

    // candle: one window of m rows, depths 2
    let dev = Device::Cpu;
    let net = net_over(&target, &w, &d2t, &dev);
    let mut t2d = vec![u32::MAX; cfg.vocab];
    for (r, &t) in d2t.iter().enumerate() {
        t2d[t as usize] = r as u32;
    }
    let out_w = target.output_weight().view(target.gguf());
    let (mut copy_out, mut copy_out_mask) = (vec![vec![0f32; m * d]; 2], vec![vec![0f32; m]; 2]);
    let mut e = vec![0f32; d];
    let mut emb = vec![vec![0f32; m * d]; 2];
    let (mut copy_emb, mut copy_n) = (vec![vec![0f32; m * d]; 2], vec![vec![0u32; m]; 2]);
    let mut copy_row = vec![vec![u32::MAX; m]; 2];
    let mut lens = std::collections::BTreeSet::new();
    for p in 0..m {
        for k in 0..2 {
            target.embed(toks[p + k + 1], &mut e).unwrap();
            emb[k][p * d..(p + 1) * d].copy_from_slice(&e);
            let (hint, n) = copy_hint(&toks[..=p + k + 1], nmax);
            if let Some(t) = hint {
                target.embed(t, &mut e).unwrap();
                copy_emb[k][p * d..(p + 1) * d].copy_from_slice(&e);
                copy_row[k][p] = t2d[t as usize];
                if t2d[t as usize] == u32::MAX {
                    out_w.row_f32(t as usize, &mut copy_out[k][p * d..(p + 1) * d]);
                    copy_out_mask[k][p] = 1.0;
                }
            }
            copy_n[k][p] = n as u32;
            lens.insert(n);
        }
    }
    assert_eq!(lens.len(), nmax + 1, "the test text should give hints of every length");
    let (copy_emb, copy_n, copy_row, copy_out, copy_out_mask) =
        if copy { (copy_emb, copy_n, copy_row, copy_out, copy_out_mask) } else { Default::default() };
    let batch = Batch {
        b: 1,
        l: m,
        hidden: hid.clone(),
        feats: feats.clone(),
        copy_emb,
        copy_n,
        copy_row,
        copy_out,
        copy_out_mask,
        emb,
        labels: vec![vec![0; m]; 2],
        mask: vec![vec![1.0; m]; 2],
        teach: Vec::new(),
        teach_mask: Vec::new(),
        pos0: vec![0],
    };
    let outs = net.forward(&batch, 2, &dev).unwrap();
    let rows = |k: usize| outs[k].1.to_vec2::<f32>().unwrap();
    let (mut c1, mut c2) = (rows(0), rows(1));
    if copy {
        // column V: the out-of-vocabulary hint, or −1e9 without one
        for c in [&mut c1, &mut c2] {
            assert_eq!(c[m - 1].len(), v + 1);
            if want.is_none() {
                assert!(c[m - 1][v] <= -1e8, "no hint outside the vocabulary, but column V is {}", c[m - 1][v]);
                c[m - 1].pop();
            }
        }
    }
    let cmp = |name: &str, a: &[f32], b: &[f32]| {
        let scale = a.iter().fold(0f32, |m, v| m.max(v.abs())).max(1.0);
        let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(diff <= 1e-4 * scale, "{name}: max |engine - candle| = {diff} (scale {scale})");
        let am = |v: &[f32]| v.iter().enumerate().fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b }).0;
        assert_eq!(am(a), am(b), "{name}: argmax differs");
    };
    // depth 1 of the last row = the engine's first draft
    cmp("depth 1", &engine_d1, &c1[m - 1]);
    // depth 2 of anchor m-1 = the engine's chained draft
    cmp("depth 2", &engine_d2, &c2[m - 1]);
}

/// The distillation teacher: the trainer's distribution from a stored hidden
/// row must be the softmax of the logits the engine computes from it.
#[test]
fn teacher_distribution_is_the_targets_softmax() {
    let target = synthetic_target();
    let cfg = target.cfg.clone();
    let d = cfg.d_model;
    let w = MtpWeights::init_from_target(&target, 3);
    let dev = Device::Cpu;
    let net = full_vocab_net(&target, &w, &dev);
    let n = 3;
    let hid: Vec<f32> = (0..n * d).map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 2.0).collect();
    let probs = net.teacher_probs(&hid, n, None, &dev).unwrap().to_vec2::<f32>().unwrap();
    let pool = ThreadPool::new(1);
    for (r, p) in probs.iter().enumerate() {
        let mut normed = vec![0f32; d];
        target.final_norm(&hid[r * d..(r + 1) * d], &mut normed);
        let mut logits = Vec::new();
        target.lm_head(&pool, &normed, 1, &mut logits);
        let mx = logits.iter().fold(f32::MIN, |m, &v| m.max(v));
        let z: f32 = logits.iter().map(|&v| (v - mx).exp()).sum();
        for (v, &lg) in p.iter().zip(&logits) {
            let want = (lg - mx).exp() / z;
            assert!((v - want).abs() <= 1e-5 + 1e-4 * want, "row {r}: teacher {v} vs engine {want}");
        }
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-4);
    }
}

/// With a hint outside a reduced draft vocabulary, the teacher is the
/// target's softmax over the draft rows and the hint's token together.
#[test]
fn teacher_distribution_includes_an_out_of_vocabulary_hint() {
    let target = synthetic_target();
    let cfg = target.cfg.clone();
    let d = cfg.d_model;
    let w = MtpWeights::init_from_target(&target, 3);
    let dev = Device::Cpu;
    let d2t: Vec<u32> = (0..cfg.vocab as u32).filter(|t| t % 3 != 0).collect();
    let net = net_over(&target, &w, &d2t, &dev);
    let n = 2;
    let hid: Vec<f32> = (0..n * d).map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 2.0).collect();
    // row 0 has hint 42 (outside: 42 % 3 == 0), row 1 none
    let mut rows = vec![0f32; n * d];
    target.output_weight().view(target.gguf()).row_f32(42, &mut rows[..d]);
    let mask = [1.0f32, 0.0];
    let probs = net.teacher_probs(&hid, n, Some((&rows, &mask)), &dev).unwrap().to_vec2::<f32>().unwrap();
    let pool = ThreadPool::new(1);
    for (r, p) in probs.iter().enumerate() {
        assert_eq!(p.len(), d2t.len() + 1);
        let mut normed = vec![0f32; d];
        target.final_norm(&hid[r * d..(r + 1) * d], &mut normed);
        let mut logits = Vec::new();
        target.lm_head(&pool, &normed, 1, &mut logits);
        let mut ids = d2t.clone();
        if r == 0 {
            ids.push(42);
        }
        let mx = ids.iter().fold(f32::MIN, |m, &t| m.max(logits[t as usize]));
        let z: f32 = ids.iter().map(|&t| (logits[t as usize] - mx).exp()).sum();
        for (c, &t) in ids.iter().enumerate() {
            let want = (logits[t as usize] - mx).exp() / z;
            assert!((p[c] - want).abs() <= 1e-5 + 1e-4 * want, "row {r}, token {t}: teacher {} vs {want}", p[c]);
        }
        if r == 1 {
            assert!(p[d2t.len()] < 1e-12, "no hint, yet column V has {}", p[d2t.len()]);
        }
    }
}
