//! Tensor parallelism over ranks (threads here; processes under MPI): every
//! logit and hidden state of a split model has the bits of the whole model
//! in one process — for prompt chunks, verify batches, rollbacks (a shorter
//! start in the next frame), several sequences in one forward, 2 and 3
//! ranks (3 ranks over 2 key/value heads: attention computed on every
//! rank), llama- and Gemma-3-shaped models.

use std::sync::Arc;

use proptest::prelude::*;
use tandem_gguf::{GgmlType, Gguf};
use tandem_kernels::ThreadPool;
use tandem_model::shard::{Collective, LocalGroup};
use tandem_model::synthetic::{synthetic_llama, SyntheticSpec};
use tandem_model::{ForwardOutput, HiddenTap, KvCache, LogitRows, Model, Segment, SegmentLogits};

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// One step of the leader's script.
#[derive(Debug, Clone)]
enum Step {
    /// Evaluate these tokens on sequence `seq`, logits of every row.
    Forward { seq: usize, tokens: Vec<u32> },
    /// Roll sequence `seq` back by this many positions.
    Back { seq: usize, n: usize },
    /// One forward over both sequences.
    Both { a: Vec<u32>, b: Vec<u32> },
}

/// Logits and taps of every forward of `script`, run by `model` (rank 0
/// of a split model, or the whole model).
fn run(model: &Model, pool: &ThreadPool, script: &[Step]) -> Vec<(Vec<u32>, Vec<u32>)> {
    let mut caches: Vec<KvCache> = (0..2).map(|_| model.new_cache(512)).collect();
    let mut out = ForwardOutput::default();
    let taps = [HiddenTap::Layer(0), HiddenTap::Final];
    let mut seen = Vec::new();
    for st in script {
        match st {
            Step::Forward { seq, tokens } => {
                model.forward(pool, &mut caches[*seq], tokens, &LogitRows::All, &taps, &mut out).unwrap();
            }
            Step::Back { seq, n } => {
                let c = &mut caches[*seq];
                let len = c.len().saturating_sub(*n);
                c.truncate(len);
                continue;
            }
            Step::Both { a, b } => {
                let (x, y) = caches.split_at_mut(1);
                let segs = [Segment { tokens: a, logits: SegmentLogits::All }, Segment { tokens: b, logits: SegmentLogits::Last }];
                model.forward_batch(pool, &mut [&mut x[0], &mut y[0]], &segs, &taps, &mut out).unwrap();
            }
        }
        seen.push((bits(&out.logits), bits(&out.hidden.concat())));
    }
    seen
}

fn split_run(g: &Arc<Gguf>, ranks: usize, script: &[Step]) -> Vec<(Vec<u32>, Vec<u32>)> {
    let group = LocalGroup::new(ranks);
    std::thread::scope(|sc| {
        let mut handles = Vec::new();
        for member in group {
            let g = g.clone();
            handles.push(sc.spawn(move || {
                let comm: Arc<dyn Collective> = Arc::new(member);
                let rank = comm.rank();
                let model = Model::from_gguf_shard(g, comm).unwrap();
                assert!(model.is_split());
                let pool = ThreadPool::new(1);
                if rank == 0 {
                    let seen = run(&model, &pool, script);
                    model.stop_followers().unwrap();
                    Some(seen)
                } else {
                    model.follow(&pool).unwrap();
                    None
                }
            }));
        }
        handles.into_iter().map(|h| h.join().unwrap()).next().unwrap().unwrap()
    })
}

fn script(seed: u64, vocab: u32, steps: usize) -> Vec<Step> {
    let mut x = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut out = vec![Step::Forward { seq: 0, tokens: (0..1 + next() % 40).map(|_| (next() % vocab as u64) as u32).collect() }];
    for _ in 0..steps {
        let toks = |n: u64, next: &mut dyn FnMut() -> u64| (0..n).map(|_| (next() % vocab as u64) as u32).collect::<Vec<u32>>();
        out.push(match next() % 5 {
            0 => Step::Back { seq: (next() % 2) as usize, n: (next() % 6) as usize },
            1 => Step::Both { a: toks(1 + next() % 5, &mut next), b: toks(1 + next() % 5, &mut next) },
            _ => Step::Forward { seq: (next() % 2) as usize, tokens: toks(1 + next() % 6, &mut next) },
        });
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, .. ProptestConfig::default() })]
    #[test]
    fn split_models_give_the_bits_of_one_process(seed in 1u64..1000, ranks in 2usize..=3, gemma in any::<bool>(),
                                                 q4 in any::<bool>(), tied in any::<bool>()) {
        let spec = SyntheticSpec {
            seed,
            ty: if q4 { GgmlType::Q4_0 } else { GgmlType::Q8_0 },
            tied,
            window: gemma.then_some(6),
            ..Default::default()
        };
        let g = Arc::new(Gguf::from_bytes(synthetic_llama(&spec)).unwrap());
        let whole = Model::from_gguf(g.clone()).unwrap();
        let steps = script(seed, whole.cfg.vocab as u32, 24);
        let want = run(&whole, &ThreadPool::new(2), &steps);
        let got = split_run(&g, ranks, &steps);
        prop_assert_eq!(got.len(), want.len());
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            prop_assert!(a.0 == b.0, "logits of forward {} differ ({:?})", i, steps.get(i));
            prop_assert!(a.1 == b.1, "taps of forward {} differ", i);
        }
    }
}

/// What is not a continuation of the rows the ranks saw gets a new
/// sequence id: a follower then starts that sequence from nothing instead
/// of extending rows it holds for another history.
#[test]
fn clones_restores_and_copies_are_new_sequences() {
    let md = Model::from_gguf(Arc::new(Gguf::from_bytes(synthetic_llama(&SyntheticSpec::default())).unwrap())).unwrap();
    let pool = ThreadPool::new(1);
    let mut c = md.new_cache(64);
    let mut out = ForwardOutput::default();
    md.forward(&pool, &mut c, &[1, 2, 3], &LogitRows::None, &[], &mut out).unwrap();
    let id = c.id();
    c.truncate(2);
    assert_eq!(c.id(), id, "a rollback is the same sequence");
    assert_ne!(c.clone().id(), id);
    let snap = c.snapshot();
    c.restore(&snap);
    assert_ne!(c.id(), id);
    let mut d = md.new_cache(64);
    let before = d.id();
    d.copy_prefix_from(&c, 2);
    assert_ne!(d.id(), before);
    assert_ne!(c.prefix(1).id(), c.id());
}
