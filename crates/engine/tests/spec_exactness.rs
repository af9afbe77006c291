//! Speculative greedy decoding on the default model: every shared dev prompt
//! gives output identical to plain decoding with `--lookup` and with
//! `--draft-model <the target itself>` (whose drafts are then all accepted),
//! with the committed MTP head (adaptive and with fixed chains of 3; alone and
//! behind prompt lookup), and with the committed DSpark drafter (adaptive, and
//! verifying every full block).

mod common;

use tandem_engine::{GenParams, SamplerParams, Session, SpecOptions};
use tandem_tokenizer::ChatMessage;

#[test]
fn dev_prompts_identical_with_lookup_and_draft_model() {
    let engine = common::engine(2);
    let file = common::read_jsonl(&common::data_dir().join("prompts-dev.jsonl"));
    let n = if common::slow_tests() { 96 } else { 32 };
    let params = GenParams { max_tokens: n, sampler: SamplerParams::greedy() };
    let lookup = SpecOptions { lookup: Some((1, 4)), ..Default::default() };
    let self_draft = SpecOptions { draft_model: Some(common::model_path()), max_draft: Some(4), ..Default::default() };
    let mut lk = engine.speculator(&lookup, 2048).unwrap().unwrap();
    let mut dm = engine.speculator(&self_draft, 2048).unwrap().unwrap();
    let head = common::mtp_head_path();
    let mtp = |fixed| SpecOptions { mtp: Some(head.clone()), mtp_draft: Some(3), fixed_length: fixed, require: true, ..Default::default() };
    let mut mt = engine.speculator(&mtp(false), 2048).unwrap().unwrap();
    let mut mf = engine.speculator(&mtp(true), 2048).unwrap().unwrap();
    let hybrid = |fixed| SpecOptions { lookup: Some((2, 8)), ..mtp(fixed) };
    let mut ha = engine.speculator(&hybrid(false), 2048).unwrap().unwrap();
    let mut hf = engine.speculator(&hybrid(true), 2048).unwrap().unwrap();
    let dspark =
        |fixed| SpecOptions { mtp: Some(common::dspark_path()), dspark: true, fixed_length: fixed, require: true, ..Default::default() };
    let mut da = engine.speculator(&dspark(false), 2048).unwrap().unwrap();
    let mut df = engine.speculator(&dspark(true), 2048).unwrap().unwrap();
    for p in &file {
        let id = p["id"].as_str().unwrap();
        let text = match (p.get("user"), p.get("raw")) {
            (Some(u), _) => engine.render_chat(&[ChatMessage::new("user", u.as_str().unwrap())]).unwrap(),
            (None, Some(r)) => r.as_str().unwrap().to_string(),
            _ => panic!("{id}: no user/raw"),
        };
        let prompt = engine.tokenize_prompt(&text);
        let run = |sp: Option<&mut tandem_engine::Speculator>| {
            let mut s = Session::new(engine.clone(), 2048);
            let mut out = vec![];
            s.generate_with(&prompt, &params, sp, None, |id, _| {
                out.push(id);
                true
            })
            .unwrap();
            out
        };
        let plain = run(None);
        assert_eq!(run(Some(&mut lk)), plain, "{id}: lookup output differs from plain");
        let before = dm.stats.clone();
        assert_eq!(run(Some(&mut dm)), plain, "{id}: draft-model output differs from plain");
        let (d, a) = (dm.stats.drafted - before.drafted, dm.stats.accepted - before.accepted);
        assert_eq!(d, a, "{id}: the target drafting for itself must have every draft accepted");
        assert_eq!(run(Some(&mut mt)), plain, "{id}: MTP (adaptive) output differs from plain");
        assert_eq!(run(Some(&mut mf)), plain, "{id}: MTP (fixed 3) output differs from plain");
        assert_eq!(run(Some(&mut ha)), plain, "{id}: lookup + MTP (adaptive) output differs from plain");
        assert_eq!(run(Some(&mut hf)), plain, "{id}: lookup + MTP (fixed) output differs from plain");
        assert_eq!(run(Some(&mut da)), plain, "{id}: DSpark (adaptive) output differs from plain");
        assert_eq!(run(Some(&mut df)), plain, "{id}: DSpark (full blocks) output differs from plain");
    }
    assert!(mf.stats.accepted > 0, "the trained head gets drafts accepted");
    assert!(df.stats.accepted > 0, "the trained DSpark drafter gets drafts accepted");
    println!("lookup: {}", lk.stats.report());
    println!("self draft: {}", dm.stats.report());
    println!("mtp adaptive: {}", mt.stats.report());
    println!("mtp fixed 3: {}", mf.stats.report());
    println!("lookup + mtp adaptive: {}", ha.stats.report());
    println!("lookup + mtp fixed: {}", hf.stats.report());
    println!("dspark adaptive: {}", da.stats.report());
    println!("dspark full blocks: {}", df.stats.report());
}
