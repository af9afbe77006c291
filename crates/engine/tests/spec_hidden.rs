//! Drafters that ask for hidden states get, for every committed position, the
//! exact rows a single forward over the whole committed sequence produces —
//! through prompt prefill, speculative cycles with rejections, and a second
//! turn that reuses the cached prefix.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tandem_engine::{Engine, GenParams, SamplerParams, Session};
use tandem_model::synthetic::{synthetic_llama, SyntheticSpec};
use tandem_model::{ForwardOutput, HiddenTap, LogitRows};
use tandem_sampling::{Rng, SamplerParams as Sp};
use tandem_speculative::drafter::{Drafter, Proposal};
use tandem_speculative::{SpecConfig, SpecError, Speculator};

type Rows = Arc<Mutex<HashMap<usize, Vec<Vec<f32>>>>>;

struct Recorder {
    rows: Rows,
    rng: Rng,
}

impl Drafter for Recorder {
    fn name(&self) -> String {
        "recorder".into()
    }
    fn max_draft(&self) -> usize {
        4
    }
    fn sync(&mut self, _h: &[u32]) -> Result<(), SpecError> {
        Ok(())
    }
    fn propose(&mut self, _h: &[u32], next: u32, max: usize, _p: &Sp, _r: &mut Rng, out: &mut Proposal) -> Result<(), SpecError> {
        out.clear();
        for i in 0..max {
            // sometimes right by luck on a tiny vocabulary, mostly wrong
            out.tokens.push((next + i as u32 + (self.rng.next_u64() % 3) as u32) % 300 + 4);
        }
        Ok(())
    }
    fn taps(&self) -> Vec<HiddenTap> {
        vec![HiddenTap::Layer(0), HiddenTap::Final]
    }
    fn observe(&mut self, start: usize, rows: usize, hidden: &[&[f32]]) {
        let d = hidden[0].len() / rows;
        let mut m = self.rows.lock().unwrap();
        for r in 0..rows {
            m.insert(start + r, hidden.iter().map(|h| h[r * d..(r + 1) * d].to_vec()).collect());
        }
    }
}

#[test]
fn drafter_sees_exact_hidden_rows_of_committed_positions() {
    let path = std::env::temp_dir().join(format!("tandem-speculative-hidden-{}.gguf", std::process::id()));
    std::fs::write(&path, synthetic_llama(&SyntheticSpec { seed: 9, ..Default::default() })).unwrap();
    let engine = Arc::new(Engine::load(&path, 2).unwrap());
    let rows: Rows = Arc::default();
    let cfg = SpecConfig {
        max_draft: 4,
        scheduler: tandem_speculative::SchedulerConfig { adaptive: false, ..Default::default() },
        ..Default::default()
    };
    let mut sp = Speculator::new(Box::new(Recorder { rows: rows.clone(), rng: Rng::new(1) }), cfg).unwrap();
    let mut s = Session::new(engine.clone(), 512);
    let params = GenParams { max_tokens: 30, sampler: SamplerParams::greedy() };
    let mut prompt: Vec<u32> = (0..300).map(|i| 4 + (i * 7 % 300) as u32).collect(); // > one prefill chunk
    for turn in 0..2 {
        let mut out = vec![];
        s.generate_with(&prompt, &params, Some(&mut sp), None, |id, _| {
            out.push(id);
            true
        })
        .unwrap();
        // reference: one forward over the committed sequence
        let committed = s.tokens.clone();
        let mut cache = engine.model.new_cache(512);
        let mut o = ForwardOutput::default();
        engine
            .model
            .forward(&engine.pool, &mut cache, &committed, &LogitRows::None, &[HiddenTap::Layer(0), HiddenTap::Final], &mut o)
            .unwrap();
        let d = engine.model.cfg.d_model;
        let m = rows.lock().unwrap();
        for p in 0..committed.len() {
            let got = m.get(&p).unwrap_or_else(|| panic!("turn {turn}: position {p} never observed"));
            for (t, g) in got.iter().enumerate().take(2) {
                let want = &o.hidden[t][p * d..(p + 1) * d];
                assert!(g.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()), "turn {turn} pos {p} tap {t}");
            }
        }
        drop(m);
        // next turn extends the conversation (prefix reuse)
        prompt = committed;
        prompt.extend([5, 6, 7]);
    }
    assert!(sp.stats.drafted > 0);
    std::fs::remove_file(&path).ok();
}
