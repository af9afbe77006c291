//! Support files that do not fit the target are refused with a message that
//! names the problem, and speculation falls back to plain decoding (unless
//! `require`). A valid head loads and speculative output equals plain output.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::rewrite;
use tandem_engine::{Engine, GenParams, SamplerParams, SpecOptions};
use tandem_gguf::{GgmlType, Gguf, TensorData, Value};
use tandem_model::mtp::{CopyWeights, FusedWeights, MtpWeights};
use tandem_model::synthetic::{synthetic_llama, SyntheticSpec};
use tandem_model::{Model, TargetId};

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tandem-mtp-support-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn valid_head_bytes(engine: &Engine) -> Vec<u8> {
    let mut w = MtpWeights::init_from_target(&engine.model, 1);
    w.d2t = Some((0..4096).collect());
    w.to_gguf(&engine.model.cfg, &engine.target_id(), GgmlType::Q8_0, &[]).unwrap().to_bytes().unwrap()
}

/// `bytes` with metadata key `key` set to `value`.
fn set_key(bytes: &[u8], key: &str, value: Value) -> Vec<u8> {
    rewrite(bytes, |m, _| {
        for (k, v) in m.iter_mut() {
            if k == key {
                *v = value.clone();
            }
        }
    })
}

fn opts(path: &Path, require: bool) -> SpecOptions {
    SpecOptions { mtp: Some(path.to_path_buf()), require, ..Default::default() }
}

/// The file is refused with a message containing `want`: a warning and plain
/// decoding by default, an error with `require`.
fn refused(engine: &Arc<Engine>, name: &str, bytes: &[u8], want: &str) {
    let path = tmp(name);
    common::write_atomically(&path, bytes);
    let err = engine.load_mtp_head(&path).err().unwrap_or_else(|| panic!("{name}: accepted"));
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
    let good = valid_head_bytes(&engine);
    let n = engine.model.cfg.n_layer;
    let d = engine.model.cfg.d_model as u64;

    // truncated
    refused(&engine, "truncated.gguf", &good[..good.len() / 2], "cannot read support file");
    refused(&engine, "empty.gguf", &[], "cannot read support file");

    // made for another model (the synthetic test model)
    let spec = SyntheticSpec::default();
    let other = Arc::new(Model::from_gguf(Arc::new(Gguf::from_bytes(synthetic_llama(&spec)).unwrap())).unwrap());
    let ow = MtpWeights::init_from_target(&other, 1);
    let other_bytes = ow.to_gguf(&other.cfg, &TargetId::new(&other.cfg, 42), GgmlType::Q8_0, &[]).unwrap().to_bytes().unwrap();
    refused(&engine, "other-model.gguf", &other_bytes, "made for another model: vocabulary size is 320");

    // same sizes, another token list
    let bad_hash = set_key(&good, "tandem.support.target.vocab_hash", Value::String("0123456789abcdef".into()));
    refused(&engine, "other-vocab.gguf", &bad_hash, "token list hash");

    // renamed tensor
    let renamed = rewrite(&good, |_, t| {
        for x in t.iter_mut() {
            if x.name == format!("blk.{n}.attn_q.weight") {
                x.name = format!("blk.{n}.attn_query.weight");
            }
        }
    });
    refused(&engine, "renamed.gguf", &renamed, &format!("MTP tensor missing: blk.{n}.attn_q.weight"));

    // wrong shape: eh_proj d × d instead of 2d × d
    let misshaped = rewrite(&good, |_, t| {
        for x in t.iter_mut() {
            if x.name.ends_with("nextn.eh_proj.weight") {
                x.dims = vec![d, d];
                x.data.truncate(x.data.len() / 2);
            }
        }
    });
    refused(&engine, "shape.gguf", &misshaped, &format!("blk.{n}.nextn.eh_proj.weight' has shape [{d}, {d}], expected [{}, {d}]", 2 * d));

    // wrong metadata: another block count, a missing key, a bad d2t
    let meta = set_key(&good, "tandem.support.target.block_count", Value::U32(31));
    refused(&engine, "blocks.gguf", &meta, "block count is 31 in the file but 30 in the target");
    let missing = rewrite(&good, |m, _| m.retain(|(k, _)| k != "tandem-mtp.layer_index"));
    refused(&engine, "nolayer.gguf", &missing, "MTP metadata error: missing key tandem-mtp.layer_index");
    let d2t = rewrite(&good, |_, t| {
        for x in t.iter_mut() {
            if x.name.ends_with("nextn.d2t") {
                x.data[0..4].copy_from_slice(&999_999i32.to_le_bytes());
            }
        }
    });
    refused(&engine, "d2t.gguf", &d2t, "d2t maps to token 999999 outside the vocabulary");

    // a head with fused target layers: the key and its tensors go together,
    // the layers must exist, the tensors must have their shapes
    let mut fw = MtpWeights::init_from_target(&engine.model, 1);
    fw.d2t = Some((0..4096).collect());
    fw.fused = Some(FusedWeights::zero(&[2, 10, 20, 29], d as usize));
    let fused = fw.to_gguf(&engine.model.cfg, &engine.target_id(), GgmlType::Q8_0, &[]).unwrap().to_bytes().unwrap();
    engine
        .load_mtp_head(&{
            let p = tmp("fused.gguf");
            common::write_atomically(&p, &fused);
            p
        })
        .expect("a valid fused head loads");
    let no_key = rewrite(&fused, |m, _| m.retain(|(k, _)| k != "tandem-mtp.fused_layers"));
    refused(&engine, "fused-nokey.gguf", &no_key, "present but no tandem-mtp.fused_layers");
    let no_fc = rewrite(&fused, |_, t| t.retain(|x| !x.name.ends_with("nextn.fc.weight")));
    refused(&engine, "fused-nofc.gguf", &no_fc, &format!("MTP tensor missing: blk.{n}.nextn.fc.weight"));
    let far = set_key(&fused, "tandem-mtp.fused_layers", Value::Array(tandem_gguf::ValueType::U32, vec![Value::U32(2), Value::U32(40)]));
    refused(&engine, "fused-range.gguf", &far, "fused layer 40 out of range (30 layers)");
    let narrow = rewrite(&fused, |_, t| {
        for x in t.iter_mut() {
            if x.name.ends_with("nextn.fc.weight") {
                x.dims = vec![2 * d, d];
                x.data.truncate(x.data.len() / 2);
            }
        }
    });
    refused(
        &engine,
        "fused-shape.gguf",
        &narrow,
        &format!("blk.{n}.nextn.fc.weight' has shape [{}, {d}], expected [{}, {d}]", 2 * d, 4 * d),
    );

    // copy hints: the key and its four tensors go together, the n-gram
    // length is 1..=8, the per-length tables have one row per length
    let mut cw = MtpWeights::init_from_target(&engine.model, 1);
    cw.d2t = Some((0..4096).collect());
    cw.copy = Some(CopyWeights::zero(4, d as usize));
    let copy = cw.to_gguf(&engine.model.cfg, &engine.target_id(), GgmlType::Q8_0, &[]).unwrap().to_bytes().unwrap();
    engine
        .load_mtp_head(&{
            let p = tmp("copy.gguf");
            common::write_atomically(&p, &copy);
            p
        })
        .expect("a valid head with copy hints loads");
    let no_key = rewrite(&copy, |m, _| m.retain(|(k, _)| k != "tandem-mtp.copy_ngram_max"));
    refused(
        &engine,
        "copy-nokey.gguf",
        &no_key,
        &format!("tensor blk.{n}.nextn.copy_norm.weight present but no tandem-mtp.copy_ngram_max"),
    );
    let no_proj = rewrite(&copy, |_, t| t.retain(|x| !x.name.ends_with("nextn.copy_proj.weight")));
    refused(&engine, "copy-noproj.gguf", &no_proj, &format!("MTP tensor missing: blk.{n}.nextn.copy_proj.weight"));
    let zero = set_key(&copy, "tandem-mtp.copy_ngram_max", Value::U32(0));
    refused(&engine, "copy-zero.gguf", &zero, "copy n-gram length 0 (need 1..=8)");
    let longer = set_key(&copy, "tandem-mtp.copy_ngram_max", Value::U32(6));
    refused(&engine, "copy-len.gguf", &longer, &format!("blk.{n}.nextn.copy_norm.weight' has shape [{}], expected [{}]", 4 * d, 6 * d));
    let no_bias = rewrite(&copy, |_, t| t.retain(|x| !x.name.ends_with("nextn.copy_bias.weight")));
    refused(&engine, "copy-nobias.gguf", &no_bias, &format!("MTP tensor missing: blk.{n}.nextn.copy_bias.weight"));

    // not a support file at all: the target itself
    let target_bytes = std::fs::read(common::model_path()).unwrap();
    refused(&engine, "target.gguf", &target_bytes, "not a support model");

    // a DSpark drafter is recognised by its tensors
    let dspark = rewrite(&good, |_, t| {
        t.retain(|x| !x.name.contains("nextn"));
        t.push(TensorData { name: "fc.weight".into(), dims: vec![4], ty: GgmlType::F32, data: vec![0; 16] });
    });
    refused(&engine, "dspark.gguf", &dspark, "DSpark drafter detected");

    // a missing file
    let e = engine.load_mtp_head(Path::new("/nonexistent/head.gguf")).unwrap_err();
    assert!(e.to_string().contains("file not found"), "{e}");
}

#[test]
fn valid_head_loads_and_greedy_output_is_unchanged() {
    let engine = common::engine(2);
    let path = tmp("valid.gguf");
    common::write_atomically(&path, &valid_head_bytes(&engine));
    let o = SpecOptions { mtp: Some(path), fixed_length: true, mtp_draft: Some(3), ..Default::default() };
    let mut sp = engine.speculator(&o, 512).unwrap().expect("a speculator");
    assert!(sp.drafter_name().starts_with("mtp"), "{}", sp.drafter_name());
    let text = engine.render_chat(&[tandem_tokenizer::ChatMessage::new("user", "Name three colors.")]).unwrap();
    let prompt = engine.tokenize_prompt(&text);
    let params = GenParams { max_tokens: 48, sampler: SamplerParams::greedy() };
    let mut plain = Vec::new();
    engine
        .new_session(512)
        .generate(&prompt, &params, None, |t, _| {
            if t != u32::MAX {
                plain.push(t)
            }
            true
        })
        .unwrap();
    let mut spec = Vec::new();
    engine
        .new_session(512)
        .generate_with(&prompt, &params, Some(&mut sp), None, |t, _| {
            if t != u32::MAX {
                spec.push(t)
            }
            true
        })
        .unwrap();
    assert_eq!(spec, plain);
    assert!(sp.stats.drafted > 0);
}
