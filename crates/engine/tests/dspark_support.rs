//! DSpark support files that do not fit the target are refused with a message
//! that names the problem, and speculation falls back to plain decoding
//! (unless `require`). A valid drafter loads, `--dspark-strict` keeps decoding
//! target-only, and speculative output equals plain output.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::rewrite;
use tandem_engine::{
    Conflict, Engine, EngineError, GenParams, SamplerParams, Setting, SpecError, SpecLog, SpecOptions, Speculator, SupportProblem,
};
use tandem_gguf::{GgmlType, Gguf, TensorData, Value};
use tandem_model::dspark::{DSparkConfig, DSparkWeights};
use tandem_model::mtp::MtpWeights;
use tandem_model::synthetic::{synthetic_llama, SyntheticSpec};
use tandem_model::{Model, TargetId};

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tandem-dspark-support-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn valid_bytes(engine: &Engine) -> Vec<u8> {
    let m = &engine.model;
    let cfg = DSparkConfig::for_target(&m.cfg, 1, 4, vec![2, 10, 20, 30], 32, 4096, 4);
    let w = DSparkWeights::init_from_target(m, cfg, Some((0..4096).collect()), 1);
    w.to_gguf(m.gguf(), &engine.target_id(), GgmlType::Q8_0, &[]).unwrap().to_bytes().unwrap()
}

fn set(key: &'static str, value: Value) -> impl FnOnce(&mut Vec<(String, Value)>, &mut Vec<TensorData>) {
    move |m, _| {
        for (k, v) in m.iter_mut() {
            if k == key {
                *v = value.clone();
            }
        }
    }
}

fn opts(path: &Path, require: bool) -> SpecOptions {
    SpecOptions { mtp: Some(path.to_path_buf()), dspark: true, require, ..Default::default() }
}

/// The file is refused with a message containing `want`: a warning and plain
/// decoding by default, an error with `require`.
fn refused(engine: &Arc<Engine>, name: &str, bytes: &[u8], want: &str) {
    let path = tmp(name);
    common::write_atomically(&path, bytes);
    let err = engine.load_dspark(&path).err().unwrap_or_else(|| panic!("{name}: accepted"));
    let msg = err.to_string();
    assert!(msg.contains(want), "{name}: message {msg:?} does not contain {want:?}");
    assert!(msg.contains(&path.display().to_string()), "{name}: message {msg:?} does not name the file");
    assert!(engine.speculator(&opts(&path, false), 256).unwrap().is_none(), "{name}: falls back to plain decoding");
    let e = engine.speculator(&opts(&path, true), 256).err().unwrap_or_else(|| panic!("{name}: require must fail"));
    assert!(e.to_string().contains(want), "{name}: {e}");
}

#[test]
fn broken_and_mismatched_files_are_refused() {
    let engine = common::engine(2);
    let good = valid_bytes(&engine);
    let d = engine.model.cfg.d_model as u64;

    refused(&engine, "truncated.gguf", &good[..good.len() / 2], "cannot read support file");

    // made for another model (the synthetic test model)
    let other = Arc::new(Model::from_gguf(Arc::new(Gguf::from_bytes(synthetic_llama(&SyntheticSpec::default())).unwrap())).unwrap());
    let ocfg = DSparkConfig::for_target(&other.cfg, 1, 4, vec![1, 2], 32, other.cfg.vocab, 3);
    let ow = DSparkWeights::init_from_target(&other, ocfg, None, 1);
    let ob = ow.to_gguf(other.gguf(), &TargetId::new(&other.cfg, 42), GgmlType::Q8_0, &[]).unwrap().to_bytes().unwrap();
    refused(&engine, "other-model.gguf", &ob, "made for another model: vocabulary size is 320");
    refused(
        &engine,
        "other-vocab.gguf",
        &rewrite(&good, set("tandem.support.target.vocab_hash", Value::String("0123456789abcdef".into()))),
        "token list hash",
    );

    // metadata rules
    refused(&engine, "block0.gguf", &rewrite(&good, set("dflash.block_size", Value::U32(0))), "DSpark metadata error: block_size 0");
    let layers = Value::Array(tandem_gguf::ValueType::I32, vec![Value::I32(2), Value::I32(40)]);
    refused(&engine, "layer40.gguf", &rewrite(&good, set("dflash.target_layers", layers)), "target layer 40 out of range (30 layers)");
    refused(
        &engine,
        "nolayers.gguf",
        &rewrite(&good, |m, _| m.retain(|(k, _)| k != "dflash.target_layers")),
        "DSpark metadata error: missing key dflash.target_layers",
    );
    refused(
        &engine,
        "width.gguf",
        &rewrite(&good, set("dflash.embedding_length", Value::U32(512))),
        "embedding_length 512 differs from the target's 576",
    );
    refused(
        &engine,
        "mask.gguf",
        &rewrite(&good, set("tokenizer.ggml.mask_token_id", Value::U32(60_000))),
        "mask token 60000 outside the vocabulary",
    );
    refused(
        &engine,
        "arch.gguf",
        &rewrite(&good, set("general.architecture", Value::String("llama".into()))),
        "architecture is llama, expected dflash",
    );
    refused(
        &engine,
        "conf-flag.gguf",
        &rewrite(&good, set("dflash.has_confidence_head", Value::Bool(false))),
        "disagrees with the presence of conf_proj.weight",
    );
    refused(
        &engine,
        "blocks.gguf",
        &rewrite(&good, set("tandem.support.target.block_count", Value::U32(31))),
        "block count is 31 in the file but 30 in the target",
    );
    // copy hints: both bias arrays, the same length, finite values
    let floats = |v: &[f32]| Value::Array(tandem_gguf::ValueType::F32, v.iter().map(|&x| Value::F32(x)).collect());
    let hinted = |b: &[f32], c: Option<&[f32]>| {
        let (b, c) = (floats(b), c.map(floats));
        rewrite(&good, move |m, _| {
            m.push(("tandem-dspark.copy_bias".into(), b));
            if let Some(c) = c {
                m.push(("tandem-dspark.copy_conf_bias".into(), c));
            }
        })
    };
    refused(
        &engine,
        "copy-half.gguf",
        &hinted(&[1.0, 2.0], None),
        "copy hints need tandem-dspark.copy_bias and tandem-dspark.copy_conf_bias with the same length in 1..=16 (got 2 values and none)",
    );
    refused(&engine, "copy-len.gguf", &hinted(&[1.0, 2.0], Some(&[0.0])), "(got 2 values and 1 values)");
    refused(
        &engine,
        "copy-nan.gguf",
        &hinted(&[1.0, f32::NAN], Some(&[0.0, 0.0])),
        "tandem-dspark.copy_bias holds a value that is not a finite number",
    );
    refused(&engine, "copy-long.gguf", &hinted(&[1.0; 17], Some(&[0.0; 17])), "(got 17 values and 17 values)");
    // slot 0's hint embedding factors: one per hint length, finite
    let embed = |b: &[f32], e: &[f32]| {
        let hints = (!b.is_empty()).then(|| (floats(b), floats(&vec![0.0; b.len()])));
        let e = floats(e);
        rewrite(&good, move |m, _| {
            if let Some((b, c)) = hints {
                m.push(("tandem-dspark.copy_bias".into(), b));
                m.push(("tandem-dspark.copy_conf_bias".into(), c));
            }
            m.push(("tandem-dspark.copy_embed".into(), e));
        })
    };
    refused(
        &engine,
        "embed-len.gguf",
        &embed(&[1.0, 2.0], &[0.5]),
        "tandem-dspark.copy_embed needs one value per copy-hint length (1 values, tandem-dspark.copy_bias has 2)",
    );
    refused(
        &engine,
        "embed-alone.gguf",
        &embed(&[], &[0.5]),
        "tandem-dspark.copy_embed needs one value per copy-hint length (1 values, tandem-dspark.copy_bias has 0)",
    );
    refused(
        &engine,
        "embed-inf.gguf",
        &embed(&[1.0], &[f32::INFINITY]),
        "tandem-dspark.copy_embed holds a value that is not a finite number",
    );

    // tensor rules
    let renamed = rewrite(&good, |_, t| {
        for x in t.iter_mut() {
            if x.name == "blk.0.attn_q_norm.weight" {
                x.name = "blk.0.attn_qnorm.weight".into();
            }
        }
    });
    refused(&engine, "renamed.gguf", &renamed, "DSpark tensor missing: blk.0.attn_q_norm.weight");
    let misshaped = rewrite(&good, |_, t| {
        for x in t.iter_mut() {
            if x.name == "fc.weight" {
                x.dims = vec![3 * d, d];
                x.data.truncate(x.data.len() / 4 * 3);
            }
        }
    });
    refused(&engine, "fc-shape.gguf", &misshaped, &format!("'fc.weight' has shape [{}, {d}], expected [{}, {d}]", 3 * d, 4 * d));
    let d2t_range = rewrite(&good, |_, t| {
        for x in t.iter_mut() {
            if x.name == "d2t" {
                x.data[0..8].copy_from_slice(&999_999i64.to_le_bytes());
            }
        }
    });
    refused(&engine, "d2t-range.gguf", &d2t_range, "d2t maps to token 999999 outside the vocabulary");
    let d2t_dup = rewrite(&good, |_, t| {
        for x in t.iter_mut() {
            if x.name == "d2t" {
                x.data[8..16].copy_from_slice(&0i64.to_le_bytes());
            }
        }
    });
    refused(&engine, "d2t-dup.gguf", &d2t_dup, "d2t maps two draft rows to token 0");
    let no_head = rewrite(&good, |_, t| t.retain(|x| x.name != "output.weight"));
    refused(&engine, "no-output.gguf", &no_head, "output.weight (required with d2t)");
    let no_markov = rewrite(&good, |_, t| t.retain(|x| x.name != "markov_w2.weight"));
    refused(&engine, "no-markov.gguf", &no_markov, "DSpark tensor missing: markov_w2.weight");

    // an MTP head given to --dspark
    let mtp = MtpWeights::init_from_target(&engine.model, 1)
        .to_gguf(&engine.model.cfg, &engine.target_id(), GgmlType::Q8_0, &[])
        .unwrap()
        .to_bytes()
        .unwrap();
    refused(&engine, "mtp.gguf", &mtp, "holds an MTP head, not a DSpark drafter");
}

#[test]
fn dspark_file_without_flag_is_reported_with_how_to_enable() {
    let engine = common::engine(1);
    let path = tmp("noflag.gguf");
    common::write_atomically(&path, &valid_bytes(&engine));
    let o = SpecOptions { mtp: Some(path.clone()), ..Default::default() };
    assert!(engine.speculator(&o, 256).unwrap().is_none(), "plain decoding without --dspark");
    let e = engine.speculator(&SpecOptions { require: true, ..o.clone() }, 256).err().expect("require fails");
    assert!(matches!(&e, EngineError::SupportFile { problem: SupportProblem::DSparkNotAskedFor, path: p } if *p == path), "{e}");
    assert!(e.to_string().contains("DSpark drafter detected; ask for DSpark drafting"), "{e}");
    let e = engine.speculator(&SpecOptions { dspark: true, ..Default::default() }, 256).err().expect("--dspark alone");
    assert!(matches!(e, EngineError::Conflict(Conflict::DSparkWithoutSupportFile)), "{e}");
    // a file given as `drafter` drafts as its kind says
    let sp = engine.speculator(&SpecOptions { drafter: Some(path), ..Default::default() }, 256).unwrap().expect("a speculator");
    assert!(sp.drafter_name().to_lowercase().contains("dspark"), "{}", sp.drafter_name());
}

/// 48 greedy tokens after `prompt`, with the speculator `sp` or plain.
fn greedy(engine: &Arc<Engine>, prompt: &[u32], sp: Option<&mut Speculator>) -> Vec<u32> {
    let params = GenParams { max_tokens: 48, sampler: SamplerParams::greedy() };
    let mut out = Vec::new();
    engine
        .new_session(512)
        .generate_with(prompt, &params, sp, None, |t, _| {
            if t != u32::MAX {
                out.push(t)
            }
            true
        })
        .unwrap();
    out
}

#[test]
fn valid_drafter_loads_strict_is_plain_and_greedy_output_is_unchanged() {
    let engine = common::engine(2);
    let path = tmp("valid.gguf");
    common::write_atomically(&path, &valid_bytes(&engine));
    let strict = SpecOptions { dspark_strict: true, ..opts(&path, true) };
    assert!(engine.speculator(&strict, 512).unwrap().is_none(), "--dspark-strict decodes target-only");
    let o = SpecOptions { fixed_length: true, ..opts(&path, true) };
    let mut sp = engine.speculator(&o, 512).unwrap().expect("a speculator");
    assert!(sp.drafter_name().starts_with("dspark"), "{}", sp.drafter_name());
    let text = engine.render_chat(&[tandem_tokenizer::ChatMessage::new("user", "Name three colors.")]).unwrap();
    let prompt = engine.tokenize_prompt(&text);
    let plain = greedy(&engine, &prompt, None);
    let spec = greedy(&engine, &prompt, Some(&mut sp));
    assert_eq!(spec, plain);
    assert!(sp.stats.drafted > 0);
    // the same drafter with copy hints: they fire (the text repeats) and the output is still plain's
    let m = &engine.model;
    let mut cfg = DSparkConfig::for_target(&m.cfg, 1, 4, vec![2, 10, 20, 30], 32, 4096, 4);
    cfg.copy_bias = vec![3.0, 6.0, 9.0, 12.0];
    cfg.copy_conf_bias = vec![0.0, 0.5, 1.0, 1.5];
    cfg.copy_embed = vec![0.5, 1.0, 1.5, 2.0];
    let w = DSparkWeights::init_from_target(m, cfg, Some((0..4096).collect()), 1);
    let hinted = tmp("hinted.gguf");
    common::write_atomically(&hinted, &w.to_gguf(m.gguf(), &engine.target_id(), GgmlType::Q8_0, &[]).unwrap().to_bytes().unwrap());
    let mut sp = engine.speculator(&SpecOptions { fixed_length: true, ..opts(&hinted, true) }, 512).unwrap().expect("a speculator");
    assert!(sp.drafter_name().contains("copy hints up to 4-grams"), "{}", sp.drafter_name());
    let text = engine
        .render_chat(&[tandem_tokenizer::ChatMessage::new("user", "Repeat after me three times: the red fox, the red fox.")])
        .unwrap();
    let prompt = engine.tokenize_prompt(&text);
    let plain = greedy(&engine, &prompt, None);
    let spec = greedy(&engine, &prompt, Some(&mut sp));
    assert_eq!(spec, plain);

    let bad = SpecOptions { dspark_block_size: Some(9), ..opts(&path, true) };
    let e = engine.speculator(&bad, 512).err().expect("block size above the trained one");
    assert!(matches!(&e, EngineError::Spec(SpecError::Setting { setting: Setting::DSparkBlockSize, value, .. }) if value == "9"), "{e}");
}

/// A proposal depends only on the committed text: the committed drafter's
/// block at every cycle of a speculative decode (after accepted and
/// rejected drafts, whose context rows must be gone) is the block a fresh
/// session drafts right after a prefill of the same text, token for token
/// and confidence for confidence (bits). The kernels give a row the same
/// bits in a prefill as in a verify, so any difference is drafter state
/// left over from earlier cycles.
#[test]
fn each_block_depends_only_on_the_committed_text() {
    let engine = common::engine(2);
    let path = common::dspark_path();
    let o = SpecOptions { fixed_length: true, ..opts(&path, true) };
    let text = engine
        .render_chat(&[tandem_tokenizer::ChatMessage::new(
            "user",
            "Write a short note to a friend about a day at the lake, then list three things to pack.",
        )])
        .unwrap();
    let prompt = engine.tokenize_prompt(&text);
    let mut sp = engine.speculator(&o, 512).unwrap().expect("a speculator");
    let log = SpecLog::memory();
    sp.set_log(Some(log.clone()));
    let out = greedy(&engine, &prompt, Some(&mut sp));
    let cycles = log.take_records();
    let all: Vec<u32> = prompt.iter().chain(&out).copied().collect();
    let bs = cycles.iter().map(|c| c.drafted.len()).max().unwrap();
    let full: Vec<_> = cycles.iter().filter(|c| !c.plan.ask.free && c.drafted.len() == bs).collect();
    assert!(full.len() >= 8, "{} full blocks", full.len());
    let rejected = cycles.windows(2).filter(|w| w[1].pos < w[0].pos + 1 + w[0].drafted.len()).count();
    assert!(rejected >= 3, "the decode should reject some drafts ({rejected})");
    for c in full {
        assert_eq!(all[c.pos], c.anchor, "anchor of the cycle at {}", c.pos);
        let mut fresh = engine.speculator(&o, 512).unwrap().expect("a speculator");
        let fresh_log = SpecLog::memory();
        fresh.set_log(Some(fresh_log.clone()));
        let params = GenParams { max_tokens: 2 * bs + 2, sampler: SamplerParams::greedy() };
        engine.new_session(512).generate_with(&all[..c.pos], &params, Some(&mut fresh), None, |_, _| true).unwrap();
        let first = fresh_log.take_records().into_iter().next().expect("a first cycle");
        assert_eq!((first.pos, first.anchor), (c.pos, c.anchor));
        assert_eq!(first.drafted, c.drafted, "block at {}", c.pos);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(first.drafted_confidence()), bits(c.drafted_confidence()), "confidences at {}", c.pos);
    }
}
