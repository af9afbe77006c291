//! End-to-end distribution exactness at temperature 0.8: the joint distribution
//! of the first two emitted tokens under speculative decoding equals the
//! target's own, for a deterministic drafter (point masses) and for a sampling
//! draft model (p/q acceptance). 100k generations each, Pearson chi-square
//! against a 1e-6 quantile bound.

use std::sync::Arc;

use tandem_gguf::{GgmlType, Gguf};
use tandem_kernels::ThreadPool;
use tandem_model::synthetic::{synthetic_llama, SyntheticSpec};
use tandem_model::{ForwardOutput, LogitRows, Model};
use tandem_sampling::{Rng, Sampler, SamplerParams};
use tandem_speculative::drafter::{Drafter, Proposal};
use tandem_speculative::{
    DraftModel, HybridDrafter, SchedulerConfig, SpecConfig, SpecError, Speculator, SuffixCache, SuffixDrafter, SuffixOptions,
};

fn model(seed: u64) -> Arc<Model> {
    let spec = SyntheticSpec { seed, ty: GgmlType::F32, n_layer: 1, d_model: 32, n_head: 2, n_kv_head: 1, ffn: 64, ..Default::default() };
    Arc::new(Model::from_gguf(Arc::new(Gguf::from_bytes(synthetic_llama(&spec)).unwrap())).unwrap())
}

/// Proposes a fixed token sequence chosen so that it is sometimes right.
struct Fixed(Vec<u32>);
impl Drafter for Fixed {
    fn name(&self) -> String {
        "fixed".into()
    }
    fn max_draft(&self) -> usize {
        self.0.len()
    }
    fn sync(&mut self, _h: &[u32]) -> Result<(), SpecError> {
        Ok(())
    }
    fn propose(&mut self, _h: &[u32], _n: u32, max: usize, _p: &SamplerParams, _r: &mut Rng, out: &mut Proposal) -> Result<(), SpecError> {
        out.clear();
        out.tokens.extend(self.0.iter().take(max));
        Ok(())
    }
}

const N: usize = 100_000;

fn params() -> SamplerParams {
    SamplerParams { temperature: 0.8, top_k: 4, top_p: 1.0, min_p: 0.0, seed: 0 }
}

/// The exact joint distribution of (x1, x2) under the target and sampler.
fn exact_joint(m: &Model, pool: &ThreadPool, prompt: &[u32]) -> Vec<((u32, u32), f64)> {
    let s = Sampler::new(params());
    let mut cache = m.new_cache(64);
    let mut out = ForwardOutput::default();
    m.forward(pool, &mut cache, prompt, &LogitRows::Last, &[], &mut out).unwrap();
    let p1 = s.distribution(out.logits_row(0));
    let mut joint = vec![];
    for &(x1, q1) in &p1 {
        let mut c = cache.clone();
        m.forward(pool, &mut c, &[x1], &LogitRows::Last, &[], &mut out).unwrap();
        for (x2, q2) in s.distribution(out.logits_row(0)) {
            joint.push(((x1, x2), q1 as f64 * q2 as f64));
        }
    }
    joint
}

fn run(m: &Model, pool: &ThreadPool, prompt: &[u32], mut make: impl FnMut() -> Speculator) -> std::collections::HashMap<(u32, u32), u64> {
    let mut cache0 = m.new_cache(64);
    let mut out = ForwardOutput::default();
    m.forward(pool, &mut cache0, prompt, &LogitRows::Last, &[], &mut out).unwrap();
    let logits0 = out.logits_row(0).to_vec();
    let mut counts = std::collections::HashMap::new();
    let mut sp = make();
    for i in 0..N {
        let mut cache = cache0.clone();
        let mut hist = prompt.to_vec();
        let mut logits = logits0.clone();
        let mut sampler = Sampler::new(SamplerParams { seed: i as u64 * 7919 + 1, ..params() });
        sp.begin(&hist).unwrap();
        let mut em = vec![];
        while em.len() < 2 {
            em.extend(sp.cycle(m, pool, &mut cache, &mut hist, &mut logits, &mut sampler, 3, &|_| false).unwrap().emitted);
        }
        *counts.entry((em[0], em[1])).or_insert(0) += 1;
    }
    counts
}

fn check(name: &str, joint: &[((u32, u32), f64)], counts: &std::collections::HashMap<(u32, u32), u64>) {
    let mut chi = 0.0;
    let mut df = 0usize;
    for &(k, p) in joint {
        let e = p * N as f64;
        let c = counts.get(&k).copied().unwrap_or(0) as f64;
        chi += (c - e).powi(2) / e;
        df += 1;
    }
    let seen: u64 = joint.iter().map(|(k, _)| counts.get(k).copied().unwrap_or(0)).sum();
    assert_eq!(seen as usize, N, "{name}: a pair outside the target's support was emitted");
    let k = (df - 1) as f64;
    let bound = k * (1.0 - 2.0 / (9.0 * k) + 4.753_424 * (2.0 / (9.0 * k)).sqrt()).powi(3);
    println!("{name}: chi2 {chi:.2} with {} dof (bound {bound:.2})", df - 1);
    assert!(chi < bound, "{name}: chi2 {chi} ≥ {bound}");
}

fn cfg() -> SpecConfig {
    SpecConfig { max_draft: 2, scheduler: SchedulerConfig { adaptive: false, ..Default::default() }, ..Default::default() }
}

#[test]
fn point_mass_drafts_at_temperature_0_8() {
    let m = model(21);
    let pool = ThreadPool::new(1);
    let prompt = [10u32, 20, 30];
    let joint = exact_joint(&m, &pool, &prompt);
    // draft the target's most likely continuation pair so acceptance is frequent
    let best = joint.iter().max_by(|a, b| a.1.total_cmp(&b.1)).unwrap().0;
    let counts = run(&m, &pool, &prompt, || Speculator::new(Box::new(Fixed(vec![best.1, best.0])), cfg()).unwrap());
    check("point mass", &joint, &counts);
}

#[test]
fn sampled_draft_model_at_temperature_0_8() {
    let m = model(21);
    let pool = ThreadPool::new(1);
    let prompt = [10u32, 20, 30];
    let joint = exact_joint(&m, &pool, &prompt);
    let draft = model(22);
    let counts = run(&m, &pool, &prompt, || {
        let dm = DraftModel::new(draft.clone(), Arc::new(ThreadPool::new(1)), m.cfg.vocab, 64, 2).unwrap();
        Speculator::new(Box::new(dm), cfg()).unwrap()
    });
    check("draft model p/q", &joint, &counts);
}

#[test]
fn suffix_drafts_at_temperature_0_8() {
    let m = model(21);
    let pool = ThreadPool::new(1);
    let prompt = [10u32, 20, 30];
    let joint = exact_joint(&m, &pool, &prompt);
    // a cache whose earlier outputs continue the likeliest first token with
    // the likeliest second one; the cache keeps growing with what is
    // sampled, so later drafts follow the sampled outputs too
    let best = joint.iter().max_by(|a, b| a.1.total_cmp(&b.1)).unwrap().0;
    let cache = SuffixCache::new(512, 8);
    cache.append(None, &[best.0, best.1, best.0, best.1]);
    let counts = run(&m, &pool, &prompt, || {
        let d = SuffixDrafter::new(cache.clone(), SuffixOptions { max_draft: 2, max_match: 4, min_prob: 0.01 }).unwrap();
        Speculator::new(Box::new(HybridDrafter::new(Box::new(d), None)), cfg()).unwrap()
    });
    assert!(cache.tokens() > 4);
    check("suffix", &joint, &counts);
}
