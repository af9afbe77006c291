//! Gemma-3-shaped models with a tiny sliding window: local layers keep a
//! ring of rows, and still every row has the bits it has when evaluated
//! alone (any batch width, thread count, ring wrap or growth), rolling back
//! across the window boundary is exact, and a row sees exactly its window.

use std::sync::Arc;

use proptest::prelude::*;
use tandem_gguf::{GgmlType, Gguf};
use tandem_kernels::ThreadPool;
use tandem_model::synthetic::{synthetic_llama, SyntheticSpec};
use tandem_model::{ForwardOutput, HiddenTap, KvCache, KvType, LogitRows, Model, Segment, SegmentLogits};

/// A synthetic Gemma 3 model; odd seeds keep their caches in f16 rows, so
/// every property also runs on rings of f16 rows, and seeds with bit 1 set
/// have 64-wide heads (where the attention kernels keep a head in
/// registers and pair rows on 512-bit registers).
fn gemma(window: usize, seed: u64, n_layer: usize, ty: GgmlType) -> Model {
    let d_model = if seed & 2 != 0 { 128 } else { 64 };
    let spec = SyntheticSpec { window: Some(window), seed, n_layer, ty, ctx: 1024, d_model, ..Default::default() };
    let md = Model::from_gguf(Arc::new(Gguf::from_bytes(synthetic_llama(&spec)).unwrap())).unwrap();
    md.set_kv_type(if seed % 2 == 1 { KvType::F16 } else { KvType::F32 });
    md
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn toks(n: usize, seed: u64, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i as u64 * 7919 + seed * 31) % vocab as u64) as u32).collect()
}

/// Evaluate `t` in chunks of `chunk` positions.
fn feed(md: &Model, pool: &ThreadPool, c: &mut KvCache, t: &[u32], chunk: usize) {
    let mut out = ForwardOutput::default();
    for piece in t.chunks(chunk.max(1)) {
        md.forward(pool, c, piece, &LogitRows::None, &[], &mut out).unwrap();
    }
}

#[test]
fn the_config_has_local_and_global_layers() {
    let md = gemma(8, 1, 4, GgmlType::Q8_0);
    assert_eq!(md.cfg.arch, "gemma3");
    assert_eq!((0..4).map(|l| md.cfg.layer_window(l)).collect::<Vec<_>>(), [Some(8), None, Some(8), None]);
    assert_eq!(md.cfg.head_dim, 2 * md.cfg.d_model / md.cfg.n_head);
    let c = md.new_cache(1024);
    assert_eq!(c.windows(), [Some(8), None, Some(8), None]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]
    /// M rows in one call equal M single steps, at positions where the
    /// rings have wrapped (prefix up to 400, rings of 128 rows) or grown
    /// (a prefix evaluated in one call of up to 400 rows).
    #[test]
    fn batched_rows_equal_single_steps(window in 1usize..=12, prefix in 0usize..400, m in 1usize..=16,
                                       chunk in prop_oneof![Just(1usize), 5usize..70, Just(400usize)],
                                       seed in 1u64..1000, q4 in any::<bool>()) {
        let md = gemma(window, seed, 3, if q4 { GgmlType::Q4_0 } else { GgmlType::Q8_0 });
        let t = toks(prefix + m, seed, md.cfg.vocab);
        let taps = [HiddenTap::Layer(0), HiddenTap::Final];
        let (d, v) = (md.cfg.d_model, md.cfg.vocab);
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads);
            let mut a = md.new_cache(1024);
            feed(&md, &pool, &mut a, &t[..prefix], chunk);
            let mut b = a.clone();
            let mut out = ForwardOutput::default();
            md.forward(&pool, &mut a, &t[prefix..], &LogitRows::All, &taps, &mut out).unwrap();
            let mut one = ForwardOutput::default();
            for i in 0..m {
                md.forward(&pool, &mut b, &t[prefix + i..prefix + i + 1], &LogitRows::All, &taps, &mut one).unwrap();
                prop_assert_eq!(bits(&out.logits[i * v..(i + 1) * v]), bits(&one.logits), "row {} threads {}", i, threads);
                for k in 0..taps.len() {
                    prop_assert_eq!(bits(&out.hidden[k][i * d..(i + 1) * d]), bits(&one.hidden[k]), "tap {} row {}", k, i);
                }
            }
        }
    }

    /// A rejected draft that straddles the window boundary: evaluate k
    /// wrong tokens, roll back r of them, continue with the true ones; the
    /// rows equal a run that never saw the wrong tokens.
    #[test]
    fn rollback_across_the_window_is_exact(window in 1usize..=12, prefix in 1usize..300, k in 1usize..=16,
                                           seed in 1u64..1000) {
        let md = gemma(window, seed, 2, GgmlType::Q8_0);
        let pool = ThreadPool::new(2);
        let v = md.cfg.vocab;
        let t = toks(prefix + 20, seed, v);
        let mut plain = md.new_cache(1024);
        feed(&md, &pool, &mut plain, &t[..prefix], 64);
        let mut spec = plain.clone();
        let mut want = ForwardOutput::default();
        md.forward(&pool, &mut plain, &t[prefix..prefix + 20], &LogitRows::All, &[], &mut want).unwrap();
        // accept `keep` of the k draft rows, the rest wrong
        let keep = (seed as usize) % (k + 1);
        let mut draft: Vec<u32> = t[prefix..prefix + k].to_vec();
        for x in draft.iter_mut().skip(keep) {
            *x = (*x + 1) % v as u32;
        }
        let mut out = ForwardOutput::default();
        md.forward(&pool, &mut spec, &draft, &LogitRows::All, &[], &mut out).unwrap();
        prop_assert_eq!(spec.keepable(prefix + keep), prefix + keep);
        spec.truncate(prefix + keep);
        prop_assert_eq!(spec.len(), prefix + keep);
        md.forward(&pool, &mut spec, &t[prefix + keep..prefix + 20], &LogitRows::All, &[], &mut out).unwrap();
        prop_assert_eq!(bits(&out.logits), bits(&want.logits[keep * v..]));
    }

    /// Segments of several sequences in one forward (a server batch) over
    /// sliding-window caches equal each segment alone.
    #[test]
    fn segments_equal_their_own_forwards(window in 1usize..=12, lens in proptest::collection::vec(1usize..=12, 1..=5),
                                         prefix in 0usize..200, seed in 1u64..1000) {
        let md = gemma(window, seed, 2, GgmlType::Q8_0);
        let v = md.cfg.vocab;
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads);
            let mut alone: Vec<KvCache> = (0..lens.len()).map(|s| {
                let mut c = md.new_cache(1024);
                feed(&md, &pool, &mut c, &toks(1 + (prefix + 37 * s) % 220, seed + s as u64, v), 50);
                c
            }).collect();
            let mut together = alone.clone();
            let seg_toks: Vec<Vec<u32>> = lens.iter().enumerate().map(|(s, &n)| toks(n, seed * 3 + s as u64, v)).collect();
            let segs: Vec<Segment> = seg_toks.iter().map(|t| Segment { tokens: t, logits: SegmentLogits::All }).collect();
            let mut refs: Vec<&mut KvCache> = together.iter_mut().collect();
            let mut out = ForwardOutput::default();
            md.forward_batch(&pool, &mut refs, &segs, &[], &mut out).unwrap();
            let mut one = ForwardOutput::default();
            let mut row = 0;
            for (s, c) in alone.iter_mut().enumerate() {
                md.forward(&pool, c, &seg_toks[s], &LogitRows::All, &[], &mut one).unwrap();
                let n = seg_toks[s].len();
                prop_assert_eq!(bits(&out.logits[row * v..(row + n) * v]), bits(&one.logits), "seq {} threads {}", s, threads);
                row += n;
            }
        }
    }
}

/// One local layer: a row at position p sees positions p − W + 1 ..= p and
/// nothing older, so changing token 0 changes the logits of positions
/// 0..W and not one bit after.
#[test]
fn a_row_sees_exactly_its_window() {
    for window in [1, 4, 8] {
        let md = gemma(window, 9, 1, GgmlType::Q8_0);
        assert_eq!(md.cfg.layer_window(0), Some(window));
        let pool = ThreadPool::new(2);
        let a = toks(150, 9, md.cfg.vocab);
        let mut b = a.clone();
        b[0] = (b[0] + 1) % md.cfg.vocab as u32;
        let run = |t: &[u32]| {
            let mut c = md.new_cache(1024);
            let mut out = ForwardOutput::default();
            md.forward(&pool, &mut c, t, &LogitRows::All, &[], &mut out).unwrap();
            out
        };
        let (oa, ob) = (run(&a), run(&b));
        let v = md.cfg.vocab;
        for p in 0..150 {
            let same = bits(oa.logits_row(p)) == bits(ob.logits_row(p));
            assert_eq!(same, p >= window, "window {window}, position {p}");
        }
        let _ = v;
    }
}

/// A ring only reaches back so far: rolling back further starts over from
/// empty, and what is kept is exact.
#[test]
fn rolling_back_past_the_ring_starts_over() {
    let md = gemma(8, 3, 2, GgmlType::Q8_0);
    let pool = ThreadPool::new(1);
    let t = toks(300, 3, md.cfg.vocab);
    let mut c = md.new_cache(1024);
    feed(&md, &pool, &mut c, &t, 1);
    // a ring of 128 rows (window 8 + 64, rounded to 64) after 300 steps
    assert_eq!(c.keepable(299), 299);
    assert_eq!(c.keepable(300 - 64), 300 - 64);
    assert_eq!(c.keepable(100), 0);
    let mut d = c.clone();
    d.truncate(100);
    assert_eq!(d.len(), 0, "too far back: empty");
    // local layers hold their ring, global layers every position
    assert_eq!(c.rows_held(0), 128);
    assert_eq!(c.rows_held(1), 300);
    let mut p = c.prefix(250);
    assert_eq!(p.len(), 250);
    let mut q = md.new_cache(1024);
    q.copy_prefix_from(&c, 290);
    assert_eq!(q.len(), 290);
    // both continue exactly like the original
    let mut want = ForwardOutput::default();
    let mut fresh = md.new_cache(1024);
    feed(&md, &pool, &mut fresh, &t[..250], 64);
    md.forward(&pool, &mut fresh, &t[250..260], &LogitRows::All, &[], &mut want).unwrap();
    let mut got = ForwardOutput::default();
    md.forward(&pool, &mut p, &t[250..260], &LogitRows::All, &[], &mut got).unwrap();
    assert_eq!(bits(&got.logits), bits(&want.logits));
}
