//! Files in the layout llama.cpp's converter writes for `dflash` drafters
//! (no `tandem.*` key, llama.cpp's optional keys and tensors) load with the
//! meaning llama.cpp gives them, or are refused with a message that names
//! the part tandem does not run.
//!
//! The base file is the committed DSpark drafter with tandem's keys taken
//! out, as the converter would write it. A variant whose values are neutral
//! (a scale of 1, unit RoPE divisors, a window wider than the text, sinks at
//! −1e30) must draft exactly what the base drafts, cycle for cycle and
//! confidence for confidence (bits); the same variant with a real value must
//! draft something else, which shows the loader reads it.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::rewrite;
use tandem_engine::{Engine, GenParams, SamplerParams, SpecLog, SpecOptions};
use tandem_gguf::{GgmlType, TensorData, Value, ValueType};

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tandem-dspark-interop-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

type Meta = Vec<(String, Value)>;
type Tensors = Vec<TensorData>;

/// The committed drafter as llama.cpp's converter lays it out: no
/// `tandem.support.*` binding, no `tandem-dspark.*` keys, no `dflash.vocab_size`.
fn converter_file() -> Vec<u8> {
    let bytes = std::fs::read(common::dspark_path()).unwrap();
    rewrite(&bytes, |m, _| m.retain(|(k, _)| !k.starts_with("tandem.") && !k.starts_with("tandem-dspark.") && k != "dflash.vocab_size"))
}

/// A plain DFlash drafter (no Markov or confidence head, keys dropped).
fn dflash_file(base: &[u8]) -> Vec<u8> {
    rewrite(base, |m, t| {
        m.retain(|(k, _)| k != "dflash.sample_from_anchor" && k != "dflash.has_confidence_head");
        t.retain(|x| !x.name.starts_with("markov_") && !x.name.starts_with("conf_proj"));
    })
}

fn f32_tensor(name: &str, v: &[f32]) -> TensorData {
    TensorData { name: name.into(), dims: vec![v.len() as u64], ty: GgmlType::F32, data: v.iter().flat_map(|x| x.to_le_bytes()).collect() }
}

fn with_key(base: &[u8], key: &str, v: Value) -> Vec<u8> {
    let key = key.to_string();
    rewrite(base, move |m, _| {
        m.retain(|(k, _)| *k != key);
        m.push((key, v));
    })
}

fn with_tensors(base: &[u8], add: Vec<TensorData>) -> Vec<u8> {
    rewrite(base, move |_, t| t.extend(add))
}

fn edit(base: &[u8], f: impl FnOnce(&mut Meta, &mut Tensors)) -> Vec<u8> {
    rewrite(base, f)
}

fn write(name: &str, bytes: &[u8]) -> PathBuf {
    let path = tmp(name);
    common::write_atomically(&path, bytes);
    path
}

fn opts(path: PathBuf) -> SpecOptions {
    SpecOptions { mtp: Some(path), dspark: true, require: true, fixed_length: true, ..Default::default() }
}

/// Every cycle of a 40-token greedy decode with the drafter in `bytes`:
/// position, drafts and the bits of their confidences. The output itself is
/// checked against plain decoding.
fn cycles(engine: &Arc<Engine>, name: &str, bytes: &[u8], prompt: &[u32], plain: &[u32]) -> Vec<(usize, Vec<u32>, Vec<u32>)> {
    let mut sp = engine.speculator(&opts(write(name, bytes)), 512).unwrap_or_else(|e| panic!("{name}: {e}")).expect("a speculator");
    let log = SpecLog::memory();
    sp.set_log(Some(log.clone()));
    let params = GenParams { max_tokens: 40, sampler: SamplerParams::greedy() };
    let mut out = Vec::new();
    engine
        .new_session(512)
        .generate_with(prompt, &params, Some(&mut sp), None, |t, _| {
            if t != u32::MAX {
                out.push(t)
            }
            true
        })
        .unwrap();
    assert_eq!(out, plain, "{name}: speculative output differs from plain");
    let recs = log.take_records();
    assert!(recs.iter().any(|c| !c.drafted.is_empty()), "{name}: nothing drafted");
    recs.into_iter().map(|c| (c.pos, c.drafted.clone(), c.drafted_confidence().iter().map(|x| x.to_bits()).collect())).collect()
}

fn prompt_and_plain(engine: &Arc<Engine>) -> (Vec<u32>, Vec<u32>) {
    let text = engine
        .render_chat(&[tandem_tokenizer::ChatMessage::new("user", "Write a short note to a friend about a day at the lake.")])
        .unwrap();
    let prompt = engine.tokenize_prompt(&text);
    let params = GenParams { max_tokens: 40, sampler: SamplerParams::greedy() };
    let mut out = Vec::new();
    engine
        .new_session(512)
        .generate_with(&prompt, &params, None, None, |t, _| {
            if t != u32::MAX {
                out.push(t)
            }
            true
        })
        .unwrap();
    (prompt, out)
}

/// The drafter in `bytes` is refused with a message containing `want`.
fn refused(engine: &Arc<Engine>, name: &str, bytes: &[u8], want: &str) {
    let path = write(name, bytes);
    let err = engine.load_dspark(&path).err().unwrap_or_else(|| panic!("{name}: accepted"));
    let msg = err.to_string();
    assert!(msg.contains(want), "{name}: message {msg:?} does not contain {want:?}");
}

#[test]
fn converter_file_binds_by_its_token_list_and_warns() {
    let engine = common::engine(2);
    let base = converter_file();
    let m = engine.load_dspark(&write("base.gguf", &base)).expect("a converter file loads");
    assert!(m.warnings().iter().any(|w| w.contains("carries no tandem binding")), "{:?}", m.warnings());
    assert!(m.cfg.has_markov() && m.cfg.sample_from_anchor);

    // the same file with tandem's binding keys drafts the same: the binding changes nothing
    let (prompt, plain) = prompt_and_plain(&engine);
    let committed = std::fs::read(common::dspark_path()).unwrap();
    let bound = rewrite(&committed, |m, _| m.retain(|(k, _)| !k.starts_with("tandem-dspark.")));
    assert!(engine.load_dspark(&write("bound.gguf", &bound)).unwrap().warnings().iter().all(|w| !w.contains("binding")));
    assert_eq!(cycles(&engine, "base.gguf", &base, &prompt, &plain), cycles(&engine, "bound.gguf", &bound, &prompt, &plain));

    // a token list that is not the target's
    let other = edit(&base, |m, _| {
        for (k, v) in m.iter_mut() {
            if k == "tokenizer.ggml.tokens" {
                if let Value::Array(_, items) = v {
                    items[100] = Value::String("not-a-token".into());
                }
            }
        }
    });
    refused(&engine, "other-tokens.gguf", &other, "made for another model: the token list hash");
    let short = edit(&base, |m, _| {
        for (k, v) in m.iter_mut() {
            if k == "tokenizer.ggml.tokens" {
                if let Value::Array(_, items) = v {
                    items.truncate(320);
                }
            }
        }
    });
    refused(&engine, "short-tokens.gguf", &short, "vocabulary size is 320 in the file but 49152 in the target");
    let unbound = edit(&base, |m, _| m.retain(|(k, _)| k != "tokenizer.ggml.tokens"));
    refused(&engine, "unbound.gguf", &unbound, "no binding metadata");
    // a file with any tandem binding key is checked in full
    let partial = with_key(&base, "tandem.support.kind", Value::String("dspark".into()));
    refused(&engine, "partial.gguf", &partial, "missing key tandem.support.target.vocab_size");

    // the tap past the last layer runs in tandem but not in llama.cpp: a warning
    let last = with_key(&base, "dflash.target_layers", Value::Array(ValueType::I32, vec![Value::I32(2), Value::I32(30)]));
    let last = edit(&last, |_, t| {
        for x in t.iter_mut().filter(|x| x.name == "fc.weight") {
            x.dims[0] = 2 * 576;
            x.data.truncate(x.data.len() / 2);
        }
    });
    let m = engine.load_dspark(&write("last.gguf", &last)).expect("tap 30 loads");
    assert!(m.warnings().iter().any(|w| w.contains("holds 30")), "{:?}", m.warnings());
}

#[test]
fn plain_dflash_drafts_raw_argmax_after_the_anchor() {
    let engine = common::engine(2);
    let (prompt, plain) = prompt_and_plain(&engine);
    let base = converter_file();
    let dflash = dflash_file(&base);
    let m = engine.load_dspark(&write("dflash.gguf", &dflash)).expect("a DFlash file loads");
    assert!(!m.cfg.has_markov() && !m.cfg.sample_from_anchor && !m.has_confidence());
    assert_eq!(m.cfg.max_draft(), m.cfg.block_size - 1);
    // the key does not make the anchor predict without a Markov head
    let keyed = with_key(&dflash, "dflash.sample_from_anchor", Value::Bool(true));
    assert!(!engine.load_dspark(&write("dflash-keyed.gguf", &keyed)).unwrap().cfg.sample_from_anchor);
    let got = cycles(&engine, "dflash.gguf", &dflash, &prompt, &plain);
    assert!(got.iter().all(|c| c.1.len() < 4), "at most block − 1 drafts");
    // a DSpark head whose Markov bias is zero, without the anchor's slot
    // and without confidence, is the raw argmax of the same backbone
    let zero_markov = edit(&base, |m, t| {
        m.retain(|(k, _)| k != "dflash.has_confidence_head");
        m.push(("dflash.sample_from_anchor".into(), Value::Bool(false)));
        t.retain(|x| !x.name.starts_with("conf_proj"));
        for x in t.iter_mut().filter(|x| x.name == "markov_w2.weight") {
            x.data.iter_mut().for_each(|b| *b = 0);
        }
    });
    assert_eq!(got, cycles(&engine, "zero-markov.gguf", &zero_markov, &prompt, &plain));
    // and the real head changes the drafts
    assert_ne!(got, cycles(&engine, "specforge.gguf", &with_key(&base, "dflash.sample_from_anchor", Value::Bool(false)), &prompt, &plain));

    // a confidence head or half a Markov head without markov_w1 is not a llama.cpp layout
    let half = edit(&base, |_, t| t.retain(|x| x.name != "markov_w1.weight"));
    refused(&engine, "half-markov.gguf", &half, "markov_w2.weight without markov_w1.weight");
}

#[test]
fn own_token_embeddings_feed_the_block_and_tie_the_head() {
    let engine = common::engine(2);
    let (prompt, plain) = prompt_and_plain(&engine);
    // a full-vocabulary DFlash file: no d2t, no head, so the target's head
    let full = edit(&dflash_file(&converter_file()), |_, t| t.retain(|x| x.name != "d2t" && x.name != "output.weight"));
    let got = cycles(&engine, "full.gguf", &full, &prompt, &plain);
    // SmolLM2 ties its head to its embeddings: the file's own copy of them computes the same
    let tg = engine.model.gguf();
    let (info, data) = tg.tensor("token_embd.weight").unwrap();
    let embd = TensorData { name: "token_embd.weight".into(), dims: info.dims.clone(), ty: info.ty, data: data.to_vec() };
    let row_bytes = data.len() / 49152;
    let own = with_tensors(&full, vec![embd.clone()]);
    let m = engine.load_dspark(&write("own-embd.gguf", &own)).unwrap();
    assert!(m.warnings().iter().any(|w| w.contains("binding")));
    assert_eq!(got, cycles(&engine, "own-embd.gguf", &own, &prompt, &plain));
    // the mask token's embedding (row 4) comes from the file
    let mut masked = embd.clone();
    masked.data[4 * row_bytes..5 * row_bytes].iter_mut().for_each(|b| *b = 0);
    assert_ne!(got, cycles(&engine, "own-embd-mask.gguf", &with_tensors(&full, vec![masked]), &prompt, &plain));
    // and the head is the file's embeddings, not the target's: a row zeroed
    // in the file's copy cannot win a draft
    let mut head = embd;
    let first = got.iter().find_map(|c| c.1.first().copied()).expect("a draft");
    head.data[first as usize * row_bytes..(first as usize + 1) * row_bytes].iter_mut().for_each(|b| *b = 0);
    let changed = cycles(&engine, "own-embd-row.gguf", &with_tensors(&full, vec![head]), &prompt, &plain);
    assert_ne!(got, changed);
    // its logit is 0 in every slot, below the winners' (positive) logits
    assert!(changed.iter().all(|c| !c.1.contains(&first)), "token {first} still drafted: the head is not the file's");
}

#[test]
fn backbone_options_have_llama_cpp_meaning() {
    let engine = common::engine(2);
    let (prompt, plain) = prompt_and_plain(&engine);
    let base = converter_file();
    let want = cycles(&engine, "base.gguf", &base, &prompt, &plain);
    let same = |name: &str, bytes: Vec<u8>| assert_eq!(cycles(&engine, name, &bytes, &prompt, &plain), want, "{name}: a neutral value");
    let differs = |name: &str, bytes: Vec<u8>| assert_ne!(cycles(&engine, name, &bytes, &prompt, &plain), want, "{name}: not read");

    same("causal-false.gguf", with_key(&base, "dflash.attention.causal", Value::Bool(false)));
    differs("causal.gguf", with_key(&base, "dflash.attention.causal", Value::Bool(true)));
    same("embed-scale-1.gguf", with_key(&base, "dflash.embedding_scale", Value::F32(1.0)));
    differs("embed-scale-4.gguf", with_key(&base, "dflash.embedding_scale", Value::F32(4.0)));
    same("attn-scale.gguf", with_key(&base, "dflash.attention.scale", Value::F32(0.125)));
    differs("attn-scale-1.gguf", with_key(&base, "dflash.attention.scale", Value::F32(1.0)));
    same("value-scale-1.gguf", with_key(&base, "dflash.attention.value_scale", Value::F32(1.0)));
    differs("value-scale-4.gguf", with_key(&base, "dflash.attention.value_scale", Value::F32(4.0)));
    same("silu.gguf", with_key(&base, "dflash.hidden_activation", Value::String("silu".into())));
    differs("gelu.gguf", with_key(&base, "dflash.hidden_activation", Value::String("gelu_pytorch_tanh".into())));
    same("rope-dims.gguf", with_key(&base, "dflash.rope.dimension_count", Value::U32(64)));
    differs("rope-dims-32.gguf", with_key(&base, "dflash.rope.dimension_count", Value::U32(32)));
    let sections = |s: [i32; 4]| Value::Array(ValueType::I32, s.iter().map(|&x| Value::I32(x)).collect());
    same("mrope.gguf", with_key(&base, "dflash.rope.dimension_sections", sections([32, 0, 0, 0])));
    same("rope-freqs-1.gguf", with_tensors(&base, vec![f32_tensor("rope_freqs.weight", &[1.0; 32])]));
    let mut proportional = vec![1.0f32; 16];
    proportional.extend([1e30; 16]);
    differs("rope-freqs.gguf", with_tensors(&base, vec![f32_tensor("rope_freqs.weight", &proportional)]));
    same("rope-none.gguf", with_key(&base, "dflash.rope.scaling.type", Value::String("none".into())));
    let linear = |f: f32| {
        edit(&base, move |m, _| {
            m.push(("dflash.rope.scaling.type".into(), Value::String("linear".into())));
            m.push(("dflash.rope.scaling.factor".into(), Value::F32(f)));
        })
    };
    same("rope-linear-1.gguf", linear(1.0));
    differs("rope-linear-8.gguf", linear(8.0));
    let window = |w: u32, pattern: Vec<bool>| {
        edit(&base, move |m, _| {
            m.push(("dflash.attention.sliding_window".into(), Value::U32(w)));
            m.push((
                "dflash.attention.sliding_window_pattern".into(),
                Value::Array(ValueType::Bool, pattern.into_iter().map(Value::Bool).collect()),
            ));
        })
    };
    same("window-wide.gguf", window(100_000, vec![true]));
    same("window-off.gguf", window(4, vec![false]));
    differs("window-4.gguf", window(4, vec![true]));
    same("sinks-off.gguf", with_tensors(&base, vec![f32_tensor("blk.0.attn_sinks.weight", &[-1e30; 9])]));
    differs("sinks.gguf", with_tensors(&base, vec![f32_tensor("blk.0.attn_sinks.weight", &[2.0; 9])]));
    same("out-scale-1.gguf", with_tensors(&base, vec![f32_tensor("blk.0.layer_output_scale.weight", &[1.0])]));
    // one layer feeds the scale-invariant output norm: only a scale small
    // enough for its epsilon to matter shows (in the confidences)
    differs("out-scale.gguf", with_tensors(&base, vec![f32_tensor("blk.0.layer_output_scale.weight", &[1e-4])]));
    differs("post-attn-norm.gguf", with_tensors(&base, vec![f32_tensor("blk.0.post_attention_norm.weight", &[1.0; 576])]));
    differs("post-ffw-norm.gguf", with_tensors(&base, vec![f32_tensor("blk.0.post_ffw_norm.weight", &[1.0; 576])]));
    // Gemma 4's k_eq_v: values from the keys' projection
    differs("no-attn-v.gguf", edit(&base, |_, t| t.retain(|x| x.name != "blk.0.attn_v.weight")));
    // keys llama.cpp reads for DFlash2 only, or never: no effect
    same(
        "logit-scale.gguf",
        edit(&base, |m, _| {
            m.push(("dflash.logit_scale".into(), Value::F32(3.0)));
            m.push(("dflash.final_logit_softcapping".into(), Value::F32(5.0)));
            m.push(("dflash.rope.freq_base_swa".into(), Value::F32(10.0)));
        }),
    );
}

#[test]
fn what_tandem_does_not_run_is_refused_by_name() {
    let engine = common::engine(1);
    let base = converter_file();
    refused(
        &engine,
        "relu.gguf",
        &with_key(&base, "dflash.hidden_activation", Value::String("relu".into())),
        "not supported: dflash.hidden_activation \"relu\"",
    );
    refused(
        &engine,
        "yarn.gguf",
        &with_key(&base, "dflash.rope.scaling.type", Value::String("yarn".into())),
        "not supported: dflash.rope.scaling.type \"yarn\"",
    );
    refused(
        &engine,
        "longrope.gguf",
        &with_key(&base, "dflash.rope.scaling.type", Value::String("longrope".into())),
        "dflash.rope.scaling.type \"longrope\"",
    );
    let sections = Value::Array(ValueType::I32, [16, 8, 0, 8].iter().map(|&x| Value::I32(x)).collect());
    refused(&engine, "mrope-vision.gguf", &with_key(&base, "dflash.rope.dimension_sections", sections), "dflash.rope.dimension_sections");
    refused(&engine, "rope-dims-odd.gguf", &with_key(&base, "dflash.rope.dimension_count", Value::U32(65)), "dflash.rope.dimension_count");
    refused(
        &engine,
        "window-no-pattern.gguf",
        &with_key(&base, "dflash.attention.sliding_window", Value::U32(8)),
        "dflash.attention.sliding_window > 0 needs dflash.attention.sliding_window_pattern",
    );
    refused(&engine, "dsv4.gguf", &with_key(&base, "dflash.hyper_connection.count", Value::U32(4)), "DeepSeek-V4");
    refused(
        &engine,
        "dflash2-key.gguf",
        &with_key(&base, "dflash.selector_rank", Value::U32(64)),
        "dflash.selector_rank belongs to a DFlash2 drafter",
    );
    refused(
        &engine,
        "dflash2-tensor.gguf",
        &with_tensors(&base, vec![f32_tensor("selector_hidden.weight", &[0.0; 64])]),
        "DSpark tensor not supported: selector_hidden.weight (a DFlash2",
    );
    refused(
        &engine,
        "moe.gguf",
        &with_key(&base, "dflash.expert_count", Value::U32(8)),
        "dflash.expert_count (a mixture-of-experts backbone)",
    );
    refused(
        &engine,
        "unknown.gguf",
        &with_tensors(&base, vec![f32_tensor("foo.weight", &[0.0; 4])]),
        "DSpark tensor not supported: foo.weight (not part of the DFlash/DSpark layout)",
    );
    refused(
        &engine,
        "layer-past.gguf",
        &with_tensors(&base, vec![f32_tensor("blk.1.attn_norm.weight", &[1.0; 576])]),
        "DSpark tensor not supported: blk.1.attn_norm.weight",
    );
    refused(
        &engine,
        "scale.gguf",
        &with_tensors(&base, vec![f32_tensor("fc.scale", &[1.0])]),
        "DSpark tensor not supported: fc.scale (a per-tensor scale, written with NVFP4 weights)",
    );
    // a tensor of ggml type 40 (NVFP4) is named as such
    let mut nvfp4 = with_tensors(&base, vec![f32_tensor("conf_proj.zzzz", &[0.0])]);
    let name = b"conf_proj.zzzz";
    let at = nvfp4.windows(name.len()).position(|w| w == name).expect("tensor name in the header") + name.len();
    // n_dims (u32) = 1, dim (u64), then the type (u32)
    assert_eq!(u32::from_le_bytes(nvfp4[at..at + 4].try_into().unwrap()), 1);
    nvfp4[at + 12..at + 16].copy_from_slice(&40u32.to_le_bytes());
    refused(&engine, "nvfp4.gguf", &nvfp4, "unknown tensor type 40 (NVFP4, not supported) for tensor 'conf_proj.zzzz'");
}
