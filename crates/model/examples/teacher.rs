use tandem_kernels::ThreadPool;
use tandem_model::{ForwardOutput, LogitRows, Model};

fn main() {
    let path = std::env::args().nth(1).unwrap();
    let which: usize = std::env::args().nth(2).map(|s| s.parse().unwrap()).unwrap_or(1);
    let model = Model::load(&path).unwrap();
    let pool = ThreadPool::new(2);
    let text = std::fs::read_to_string("../shared/vectors/greedy_smollm2.jsonl").unwrap();
    let v: serde_json::Value = serde_json::from_str(text.lines().nth(which).unwrap()).unwrap();
    let ids: Vec<u32> = v["prompt_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let want: Vec<u32> = v["greedy_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let mut all = ids.clone();
    all.extend(&want);
    let mut cache = model.new_cache(2048);
    let mut out = ForwardOutput::default();
    model.forward(&pool, &mut cache, &all, &LogitRows::All, &[], &mut out).unwrap();
    let mut worst = 0f32; let mut sum = 0f32; let mut cnt = 0;
    for (step, tl) in v["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let l = out.logits_row(ids.len() - 1 + step);
        let mx = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let lse = mx + l.iter().map(|x| ((x - mx) as f64).exp()).sum::<f64>().ln() as f32;
        let mut md = 0f32;
        for e in tl.as_array().unwrap().iter().take(1) {
            let id = e[0].as_u64().unwrap() as usize;
            let lp = e[1].as_f64().unwrap() as f32;
            md = md.max((l[id] - lse - lp).abs());
        }
        worst = worst.max(md); sum += md; cnt += 1;

    }
    println!("worst {worst:.3} mean {:.4}", sum / cnt as f32);
}
