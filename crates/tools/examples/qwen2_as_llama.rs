//! A Qwen2 GGUF relabelled as a `llama` model with the same function, for
//! llama.cpp's DFlash/DSpark path: at 0c1e570 its `qwen2` graph does not
//! export the layer inputs a DFlash drafter reads (it aborts with "layer input
//! tensor is null"), while its `llama` graph does and loads the optional
//! Q/K/V biases Qwen2 has.
//!
//! Qwen2 rotates the halves of each head (NEOX order); llama.cpp's `llama`
//! rotates adjacent pairs. The rows of `attn_q`/`attn_k` and their biases are
//! therefore permuted within each head (row `i` of the first half to `2i`, of
//! the second half to `2i + 1`), which leaves every attention score and so
//! the model's output unchanged; quantized rows move as whole rows. The
//! `qwen2.*` keys become `llama.*`.
//!
//!     cargo run --release -p tandem-tools --example qwen2_as_llama -- IN.gguf OUT.gguf

use tandem_gguf::{GgmlType, TensorData, Value};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: qwen2_as_llama IN.gguf OUT.gguf");
        std::process::exit(2);
    }
    if let Err(e) = run(&args[1], &args[2]) {
        eprintln!("qwen2_as_llama: {e}");
        std::process::exit(1);
    }
}

fn run(input: &str, output: &str) -> Result<(), String> {
    let bytes = std::fs::read(input).map_err(|e| format!("{input}: {e}"))?;
    let g = tandem_gguf::Gguf::from_bytes(bytes.clone()).map_err(|e| format!("{input}: {e}"))?;
    if g.get("general.architecture").and_then(Value::as_str) != Some("qwen2") {
        return Err(format!("{input}: not a qwen2 model"));
    }
    let get = |k: &str| g.get(&format!("qwen2.{k}")).and_then(Value::as_u64).ok_or(format!("{input}: no qwen2.{k}"));
    let (heads, kv_heads, width) = (get("attention.head_count")?, get("attention.head_count_kv")?, get("embedding_length")?);
    let head_dim = width / heads;
    let mut failure = None;
    let out = tandem_gguf::rewrite(&bytes, |meta, tensors| {
        for (k, v) in meta.iter_mut() {
            if k == "general.architecture" {
                *v = Value::String("llama".into());
            } else if let Some(rest) = k.strip_prefix("qwen2.") {
                *k = format!("llama.{rest}");
            }
        }
        for t in tensors.iter_mut() {
            let n_heads = if t.name.contains("attn_q.") {
                heads
            } else if t.name.contains("attn_k.") {
                kv_heads
            } else {
                continue;
            };
            if let Err(e) = permute_heads(t, n_heads, head_dim) {
                failure = Some(e);
            }
        }
    })
    .map_err(|e| e.to_string())?;
    if let Some(e) = failure {
        return Err(e);
    }
    std::fs::write(output, out).map_err(|e| format!("{output}: {e}"))?;
    eprintln!("wrote {output}: {heads} query heads, {kv_heads} key heads of {head_dim}, rows permuted to llama's rotary order");
    Ok(())
}

/// Reorder the output rows (the last dimension; for a bias, its elements) of
/// each head from halves to interleaved pairs.
fn permute_heads(t: &mut TensorData, n_heads: u64, head_dim: u64) -> Result<(), String> {
    let (rows, row_bytes) = if t.dims.len() == 1 {
        if t.ty != GgmlType::F32 {
            return Err(format!("{}: bias of type {} (F32 expected)", t.name, t.ty));
        }
        (t.dims[0], 4)
    } else {
        let rb = t.ty.row_bytes(t.dims[0]).ok_or(format!("{}: bad row", t.name))?;
        (t.dims[1..].iter().product(), rb)
    };
    if rows != n_heads * head_dim || !head_dim.is_multiple_of(2) {
        return Err(format!("{}: {rows} rows, expected {n_heads} heads of {head_dim}", t.name));
    }
    let (rb, half) = (row_bytes as usize, (head_dim / 2) as usize);
    let mut out = vec![0u8; t.data.len()];
    for h in 0..n_heads as usize {
        let base = h * head_dim as usize;
        for i in 0..half {
            for (dst, src) in [(base + 2 * i, base + i), (base + 2 * i + 1, base + half + i)] {
                out[dst * rb..(dst + 1) * rb].copy_from_slice(&t.data[src * rb..(src + 1) * rb]);
            }
        }
    }
    t.data = out;
    Ok(())
}
