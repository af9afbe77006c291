#![allow(dead_code)]
//! Shared helpers for the speculative tests: plain greedy decoding, and the
//! same generation through a [`Speculator`] (with the drafter's hidden taps
//! observed from the prompt prefill).

use tandem_kernels::ThreadPool;
use tandem_model::{ForwardOutput, HiddenTap, LogitRows, Model};
use tandem_sampling::{argmax, Sampler, SamplerParams};
use tandem_speculative::Speculator;

/// `n` tokens of plain greedy decoding after `prompt`.
pub fn plain(m: &Model, pool: &ThreadPool, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut cache = m.new_cache(512);
    let mut out = ForwardOutput::default();
    m.forward(pool, &mut cache, prompt, &LogitRows::Last, &[], &mut out).unwrap();
    let mut res = vec![];
    for _ in 0..n {
        let t = argmax(out.logits_row(0));
        res.push(t);
        m.forward(pool, &mut cache, &[t], &LogitRows::Last, &[], &mut out).unwrap();
    }
    res
}

/// `n` tokens of greedy speculative decoding after `prompt`; checks that the
/// cache always holds exactly the committed history.
pub fn speculative(m: &Model, pool: &ThreadPool, prompt: &[u32], n: usize, sp: &mut Speculator) -> Vec<u32> {
    let mut cache = m.new_cache(512);
    let mut out = ForwardOutput::default();
    sp.begin(&[]).unwrap();
    let taps: Vec<HiddenTap> = sp.taps().to_vec();
    m.forward(pool, &mut cache, prompt, &LogitRows::Last, &taps, &mut out).unwrap();
    sp.observe(0, prompt.len(), &out.hidden);
    let mut history = prompt.to_vec();
    let mut logits = out.logits_row(0).to_vec();
    let mut sampler = Sampler::new(SamplerParams::greedy());
    sp.begin(&history).unwrap();
    let mut res = vec![];
    while res.len() < n {
        let c = sp.cycle(m, pool, &mut cache, &mut history, &mut logits, &mut sampler, n - res.len(), &|_| false).unwrap();
        res.extend(&c.emitted);
        assert_eq!(cache.len(), history.len());
        if c.stopped {
            break;
        }
    }
    res
}

/// Re-write a GGUF image, letting `f` edit the metadata and tensor list.
pub fn rewrite(bytes: &[u8], f: impl FnOnce(&mut Vec<(String, tandem_gguf::Value)>, &mut Vec<tandem_gguf::TensorData>)) -> Vec<u8> {
    tandem_gguf::rewrite(bytes, f).unwrap()
}

/// A DSpark file as a plain DFlash drafter: no Markov head, no confidence
/// head, and none of the keys that only make sense with them (as
/// llama.cpp's converter writes a `dflash` file).
pub fn plain_dflash(bytes: &[u8]) -> Vec<u8> {
    rewrite(bytes, |m, t| {
        m.retain(|(k, _)| k != "dflash.sample_from_anchor" && k != "dflash.has_confidence_head");
        t.retain(|x| !x.name.starts_with("markov_") && !x.name.starts_with("conf_proj"));
    })
}
