//! Opens the real SmolLM2-135M-Instruct Q4_1 model under models/, checks its
//! header, and corrupts a few of its fields to make sure a big real file fails
//! as cleanly as a tiny one. Ignored by default (this crate cannot fetch the
//! model); `.ci/run` runs them after fetching it.

#[macro_use]
mod common;

use std::path::PathBuf;

use common::*;
use tandem_gguf::{GgmlType, Gguf, GgufError, ValueType};

fn model_path() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "{} not found: run `tandem fetch` first", p.display());
    p
}

#[test]
#[ignore = "reads the default model from models/: `tandem fetch` first"]
fn smollm2_header_and_tensors() {
    let path = model_path();
    let g = Gguf::open(&path).unwrap();
    println!("{}: version {}, {} metadata keys, {} tensors", path.display(), g.version, g.metadata.len(), g.tensors.len());
    assert_eq!(g.version, 3);
    assert_eq!(g.alignment, 32);
    assert_eq!(g.file_size(), std::fs::metadata(&path).unwrap().len());
    assert_eq!(g.tensors.len(), 272);
    assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(g.get_u64("llama.block_count").unwrap(), 30);
    assert_eq!(g.get_u64("llama.embedding_length").unwrap(), 576);
    assert_eq!(g.get_u64("llama.vocab_size").unwrap(), 49152);
    let tokens = g.get_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), 49152);
    assert_eq!(tokens[1].as_str(), Some("<|im_start|>"));
    assert!(matches!(g.get("tokenizer.ggml.tokens"), Some(tandem_gguf::Value::Array(ValueType::String, _))));
    assert_eq!(g.get_array("tokenizer.ggml.token_type").unwrap().len(), 49152);

    let (t, data) = g.tensor("token_embd.weight").unwrap();
    assert_eq!(t.ty, GgmlType::Q8_0);
    assert_eq!(t.dims, vec![576, 49152]);
    assert_eq!(t.size, 49152 * (576 / 32) * 34);
    assert_eq!(data.len() as u64, t.size);
    // Zero-copy: the slice points into the map.
    let base = g.bytes().as_ptr() as usize;
    assert_eq!(data.as_ptr() as usize - base, (g.data_offset() + t.offset) as usize);

    // Every layer is there, and all tensor slices are inside the file and do not overlap.
    for i in 0..30 {
        for n in ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "attn_norm", "ffn_norm"] {
            assert!(g.tensor_info(&format!("blk.{i}.{n}.weight")).is_some(), "blk.{i}.{n}.weight");
        }
    }
    check_tensor_bounds(&g);
    let mut spans: Vec<_> = g.tensors.iter().map(|t| (t.offset, t.offset + t.size)).collect();
    spans.sort();
    for w in spans.windows(2) {
        assert!(w[0].1 <= w[1].0, "overlapping tensors {w:?}");
    }
}

#[test]
#[ignore = "reads the default model from models/: `tandem fetch` first"]
fn smollm2_from_bytes_matches_open() {
    let path = model_path();
    let a = Gguf::open(&path).unwrap();
    let b = parse(std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(a.metadata, b.metadata);
    assert_eq!(a.data_offset(), b.data_offset());
    for (x, y) in a.tensors.iter().zip(&b.tensors) {
        assert_eq!((&x.name, &x.dims, x.ty, x.offset, x.size), (&y.name, &y.dims, y.ty, y.offset, y.size));
    }
    let (_, da) = a.tensor("output_norm.weight").unwrap();
    let (_, db) = b.tensor("output_norm.weight").unwrap();
    assert_eq!(da, db);
}

/// Byte offset of the u64 length field of the array stored under `key`.
fn array_len_field(file: &[u8], key: &str) -> usize {
    let mut needle = (key.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(key.as_bytes());
    let at = file.windows(needle.len()).position(|w| w == needle).expect("key present");
    let p = at + needle.len();
    assert_eq!(&file[p..p + 4], &9u32.to_le_bytes(), "{key} is an array");
    p + 8 // past the value type and the element type
}

#[test]
#[ignore = "reads the default model from models/: `tandem fetch` first"]
fn smollm2_corrupted_counts_fail_cleanly() {
    let path = model_path();
    let file = std::fs::read(&path).unwrap();
    let len_at = array_len_field(&file, "tokenizer.ggml.token_type");
    assert_eq!(u64::from_le_bytes(file[len_at..len_at + 8].try_into().unwrap()), 49152);

    // A corrupt element count that the ~98 MB behind it could still "hold"
    // (20M i32s = 80 MB): it must be refused up front, not turned into a
    // multi-hundred-MB Vec<Value>.
    for n in [20_000_000u64, 1 << 24 | 1, u64::MAX, 1 << 40] {
        let mut f = file.clone();
        f[len_at..len_at + 8].copy_from_slice(&n.to_le_bytes());
        let (r, largest) = largest_alloc_during(|| Gguf::from_bytes(f));
        assert!(matches!(r, Err(GgufError::AbsurdCount { what: "array length", .. })), "n={n}: {r:?}");
        assert!(largest < 64 << 20, "n={n}: largest allocation {largest} bytes");
    }
    // Slightly too long: parses into the next key's bytes and fails there.
    let mut f = file.clone();
    f[len_at..len_at + 8].copy_from_slice(&49153u64.to_le_bytes());
    parse_err(f);

    // Tensor count and metadata count: the hard limit, and one more than present.
    let g = Gguf::from_bytes(file.clone()).unwrap();
    let (nt, nkv) = (g.tensors.len() as u64, g.metadata.len() as u64);
    drop(g);
    for (at, n) in [(8usize, 1u64 << 20), (8, nt + 1), (16, 1 << 20), (16, nkv + 1)] {
        let mut f = file.clone();
        f[at..at + 8].copy_from_slice(&n.to_le_bytes());
        let (r, largest) = largest_alloc_during(|| Gguf::from_bytes(f));
        assert!(r.is_err(), "count at {at} = {n}");
        assert!(largest < 64 << 20, "count at {at} = {n}: largest allocation {largest} bytes");
    }
}

#[test]
#[ignore = "reads the default model from models/: `tandem fetch` first"]
fn smollm2_truncated_fails() {
    let path = model_path();
    let file = std::fs::read(&path).unwrap();
    let g = parse(file.clone()).unwrap();
    let d = g.data_offset() as usize;
    for len in [file.len() - 1, file.len() / 2, d + 1, d, d - 1, d / 2, 1000, 24, 0] {
        let e = parse_err(file[..len].to_vec());
        assert!(matches!(e, GgufError::Truncated { .. } | GgufError::TensorOutOfBounds { .. }), "len {len}: {e:?}");
    }
}
