//! Continuous batching on the default model: every request's output (tokens
//! and, for greedy decoding, the logits rows they were chosen from) is what
//! the same request gives alone in a session, whatever else is in the batch
//! and whenever it joins — plain, and speculative with lookup, suffix, the
//! MTP head and the DSpark drafter. Kept prompt prefixes are reused exactly.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use tandem_engine::{Batch, BatchConfig, Engine, GenParams, Request, SamplerParams, Session, SlotEvent, SpecOptions, StopReason};
use tandem_tokenizer::ChatMessage;

fn prompts(engine: &Engine, n: usize) -> Vec<Vec<u32>> {
    let file = common::read_jsonl(&common::data_dir().join("prompts-dev.jsonl"));
    file.iter()
        .take(n)
        .map(|p| {
            let text = match (p.get("user"), p.get("raw")) {
                (Some(u), _) => engine.render_chat(&[ChatMessage::new("user", u.as_str().unwrap())]).unwrap(),
                (None, Some(r)) => r.as_str().unwrap().to_string(),
                _ => panic!("no user/raw"),
            };
            engine.tokenize_prompt(&text)
        })
        .collect()
}

/// Tokens (and greedy logits rows, as bit patterns) of one request alone.
fn alone(engine: &Arc<Engine>, prompt: &[u32], params: &GenParams, spec: &SpecOptions) -> (Vec<u32>, Vec<Vec<u32>>) {
    let mut sp = engine.speculator(spec, 1024).unwrap();
    let mut s = Session::new(engine.clone(), 1024);
    let (mut ids, mut rows) = (vec![], vec![]);
    s.generate_with_logits(prompt, params, sp.as_mut(), None, |id, _, row| {
        if id != u32::MAX {
            ids.push(id);
            rows.push(row.iter().map(|x| x.to_bits()).collect());
        }
        true
    })
    .unwrap();
    (ids, rows)
}

struct Seen {
    ids: Vec<u32>,
    rows: Vec<Vec<u32>>,
    done: Option<tandem_engine::GenStats>,
}

/// Run `reqs` through a batch of `slots`, admitting request j once `at[j]`
/// steps have run (or later, when no slot is free).
fn batched(
    engine: &Arc<Engine>,
    slots: usize,
    chunk: usize,
    spec: &SpecOptions,
    reqs: &[(Vec<u32>, GenParams)],
    at: &[usize],
) -> Vec<Seen> {
    let cfg = BatchConfig { slots, ctx: 1024, prefill_chunk: chunk, kv_budget: 1 << 30 };
    let mut b = Batch::new(engine.clone(), cfg, spec).unwrap();
    let mut seen: Vec<Seen> = reqs.iter().map(|_| Seen { ids: vec![], rows: vec![], done: None }).collect();
    let mut in_slot: HashMap<usize, usize> = HashMap::new();
    let (mut next, mut steps, mut widest, mut mixed) = (0, 0, 0, false);
    while next < reqs.len() || !b.is_idle() {
        while next < reqs.len() && at[next] <= steps && b.free_slots() > 0 {
            let (prompt, params) = &reqs[next];
            let slot = b.admit(Request { prompt: prompt.clone(), params: params.clone(), with_rows: true }).unwrap();
            in_slot.insert(slot, next);
            next += 1;
        }
        let r = b.step(&mut |slot, ev| {
            let s = &mut seen[in_slot[&slot]];
            match ev {
                SlotEvent::Token { id, row, .. } => {
                    if id != u32::MAX {
                        s.ids.push(id);
                        s.rows.push(row.iter().map(|x| x.to_bits()).collect());
                    }
                }
                SlotEvent::Done(st) => s.done = Some(*st),
                SlotEvent::Failed(e) => panic!("request failed: {e}"),
            }
            true
        });
        widest = widest.max(r.sequences);
        mixed |= r.prefill_rows > 0 && r.rows > r.prefill_rows;
        steps += 1;
        assert!(steps < 20_000, "the batch does not finish");
    }
    assert!(widest >= slots.min(reqs.len()).min(2), "sequences never shared a forward");
    assert!(mixed, "a prompt chunk never shared a forward with decode rows");
    seen
}

fn check(spec: &SpecOptions, name: &str, slots: usize, chunk: usize) {
    check_with(spec, name, slots, chunk, tandem_model::KvType::F32)
}

fn check_with(spec: &SpecOptions, name: &str, slots: usize, chunk: usize, kv: tandem_model::KvType) {
    let engine = common::engine(2);
    engine.model.set_kv_type(kv);
    let n = if common::slow_tests() { 12 } else { 6 };
    let ps = prompts(&engine, n);
    let reqs: Vec<(Vec<u32>, GenParams)> = ps
        .iter()
        .enumerate()
        .map(|(j, p)| (p.clone(), GenParams { max_tokens: 12 + 7 * (j % 4), sampler: SamplerParams::greedy() }))
        .collect();
    // staggered arrivals: some join while others decode or prefill
    let at: Vec<usize> = (0..reqs.len()).map(|j| (j * 5) % 13).collect();
    let got = batched(&engine, slots, chunk, spec, &reqs, &at);
    for (j, (p, params)) in reqs.iter().enumerate() {
        let (ids, rows) = alone(&engine, p, params, spec);
        assert_eq!(got[j].ids, ids, "{name}: request {j} tokens differ from alone");
        assert!(got[j].rows == rows, "{name}: request {j} logits rows differ from alone");
        let st = got[j].done.as_ref().expect("done");
        assert!(matches!(st.stop, Some(StopReason::Eog | StopReason::Length)), "{name}: {:?}", st.stop);
    }
}

#[test]
fn batched_plain_outputs_equal_alone() {
    check(&SpecOptions::default(), "plain", 4, 8);
}

/// With the cache in f16 rows, batched outputs (plain and speculative)
/// still equal each request alone.
#[test]
fn batched_outputs_equal_alone_with_an_f16_cache() {
    use tandem_model::KvType::F16;
    check_with(&SpecOptions::default(), "plain f16", 4, 8, F16);
    check_with(&SpecOptions { lookup: Some((1, 4)), ..Default::default() }, "lookup f16", 3, 16, F16);
    let dspark = SpecOptions { mtp: Some(common::dspark_path()), dspark: true, require: true, ..Default::default() };
    check_with(&dspark, "dspark f16", 2, 32, F16);
}

#[test]
fn batched_speculative_outputs_equal_alone() {
    check(&SpecOptions { lookup: Some((1, 4)), ..Default::default() }, "lookup", 3, 16);
    let engine = common::engine(1);
    let suffix = SpecOptions { suffix: Some(engine.suffix_cache(None, 4096).unwrap()), ..Default::default() };
    check(&suffix, "suffix", 4, 8);
    let mtp = SpecOptions { mtp: Some(common::mtp_head_path()), require: true, ..Default::default() };
    check(&mtp, "mtp", 4, 8);
    let dspark = SpecOptions { mtp: Some(common::dspark_path()), dspark: true, require: true, ..Default::default() };
    check(&dspark, "dspark", 2, 32);
}

#[test]
fn a_shared_prompt_prefix_is_evaluated_once_and_the_budget_holds() {
    let engine = common::engine(2);
    let system = "You are a careful assistant. ".repeat(60);
    let render = |q: &str| engine.render_chat(&[ChatMessage::new("system", &system), ChatMessage::new("user", q)]).unwrap();
    let a = engine.tokenize_prompt(&render("Name a color."));
    let b = engine.tokenize_prompt(&render("Name a fruit."));
    let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    assert!(shared > 300, "{shared}");
    let params = GenParams { max_tokens: 8, sampler: SamplerParams::greedy() };
    let per_pos = 2 * engine.model.cfg.n_layer * engine.model.cfg.kv_dim() * 4;
    let budget = 3 * a.len().max(b.len()) * per_pos;
    let cfg = BatchConfig { slots: 2, ctx: 1024, prefill_chunk: 32, kv_budget: budget };
    let mut batch = Batch::new(engine.clone(), cfg, &SpecOptions::default()).unwrap();
    let run = |batch: &mut Batch, p: &[u32]| {
        batch.admit(Request { prompt: p.to_vec(), params: params.clone(), with_rows: false }).unwrap();
        let (mut ids, mut st) = (vec![], None);
        while !batch.is_idle() {
            batch.step(&mut |_, ev| {
                match ev {
                    SlotEvent::Token { id, .. } if id != u32::MAX => ids.push(id),
                    SlotEvent::Done(s) => st = Some(*s),
                    _ => {}
                }
                true
            });
            let ps = batch.prefix_stats();
            assert!(ps.kept_bytes + ps.live_bytes <= budget, "{ps:?} over the budget {budget}");
        }
        (ids, st.unwrap())
    };
    let (ia, sa) = run(&mut batch, &a);
    assert_eq!(sa.prefill_tokens, a.len());
    // the second request takes the slot that holds the first one's prompt
    let (ib, sb) = run(&mut batch, &b);
    assert_eq!(sb.prompt_tokens - sb.prefill_tokens, shared, "the shared prefix is reused");
    assert_eq!(ib, alone(&engine, &b, &params, &SpecOptions::default()).0);
    assert_eq!(ia, alone(&engine, &a, &params, &SpecOptions::default()).0);
    // a third prompt elsewhere moves the slot on; the first prompt is kept and comes back
    let other = engine.tokenize_prompt(&engine.render_chat(&[ChatMessage::new("user", "Something else entirely. ".repeat(20))]).unwrap());
    run(&mut batch, &other);
    run(&mut batch, &other);
    let (ia2, sa2) = run(&mut batch, &a);
    assert!(sa2.prompt_tokens - sa2.prefill_tokens >= shared, "{sa2:?}");
    assert_eq!(ia2, ia);
    assert!(batch.prefix_stats().hits >= 2);
}
