//! Re-quantize a GGUF file's block-quantized matrices to another block type
//! (`tandem quantize`), as llama-quantize does for a draft model.
//!
//! Why: a drafter's step reads all of its weights once per cycle, after the
//! target's verify pass has pushed them out of the caches, so its draft time
//! follows its bytes (docs/experiments/005-dspark.md §7m: the DSpark drafter in Q4_1 drafts
//! 28% faster than in Q8_0 and proposes the same tokens on the dev prompts).
//! Speculative output stays exact whatever the drafter's precision: the
//! target decides every token.
//!
//! Only tensors already stored in a block-quantized type are converted
//! (dequantized to f32, then quantized); float tensors (norms, biases, small
//! heads read as f32) and integer tensors (`d2t`) are copied unchanged, and
//! so is the metadata, plus one key recording the conversion.

use std::path::Path;

use tandem_gguf::{GgmlType, Gguf, GgufError, GgufWriter, TensorData, Value};
use tandem_kernels::quant::dequantize_row;
use tandem_kernels::quant::quantize::quantize_row;

/// Metadata key naming the type the file's matrices were converted to.
pub const REQUANTIZED_KEY: &str = "tandem.requantized_to";

#[derive(Debug, thiserror::Error)]
pub enum RequantizeError {
    #[error("quantize: {0}")]
    Gguf(#[from] GgufError),
    #[error("quantize: cannot write {name}: only q4_0, q4_1, q5_0, q5_1 and q8_0 can be written", name = .0.name())]
    UnsupportedTarget(GgmlType),
    #[error("quantize: tensor {name}: {why}")]
    BadTensor { name: String, why: String },
    #[error("quantize: the output would overwrite the input ({0})")]
    SamePath(String),
    #[error("quantize: writing {path}: {source}")]
    Write { path: String, source: GgufError },
}

/// One converted tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Converted {
    pub name: String,
    pub from: GgmlType,
    pub bytes_before: usize,
    pub bytes_after: usize,
}

/// The block-quantized source types (those `dequantize_row` reads).
fn is_block_quant(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 | GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K
    )
}

/// The types `quantize_row` writes, the targets of a conversion.
pub const TARGETS: [GgmlType; 5] = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0];

/// Parse a type name as the CLI takes it (`q4_1`, case-insensitive).
pub fn parse_target(s: &str) -> Option<GgmlType> {
    TARGETS.into_iter().find(|t| t.name().eq_ignore_ascii_case(s))
}

/// Build the re-quantized file in memory: every block-quantized tensor not
/// already of type `to`, and whose name does not start with one of `keep`,
/// becomes `to`. Returns the writer and what was converted, in file order.
pub fn requantize(src: &Gguf, to: GgmlType, keep: &[String]) -> Result<(GgufWriter, Vec<Converted>), RequantizeError> {
    if !TARGETS.contains(&to) {
        return Err(RequantizeError::UnsupportedTarget(to));
    }
    let mut w = GgufWriter::new();
    for (k, v) in &src.metadata {
        if k != REQUANTIZED_KEY {
            w.set(k.clone(), v.clone());
        }
    }
    w.set(REQUANTIZED_KEY, Value::String(to.name().to_ascii_lowercase()));
    let mut done = Vec::new();
    for t in &src.tensors {
        let data = src.tensor_data(t);
        let convert = is_block_quant(t.ty) && t.ty != to && !keep.iter().any(|p| t.name.starts_with(p.as_str()));
        if !convert {
            w.add_tensor(TensorData { name: t.name.clone(), dims: t.dims.clone(), ty: t.ty, data: data.to_vec() })?;
            continue;
        }
        let bad = |why: String| RequantizeError::BadTensor { name: t.name.clone(), why };
        let k = t.ne0() as usize;
        let rb =
            t.ty.row_bytes(k as u64).filter(|&b| b > 0).ok_or_else(|| bad(format!("{k} columns do not fit {}", t.ty.name())))? as usize;
        if !k.is_multiple_of(32) {
            return Err(bad(format!("{k} columns are not a multiple of 32")));
        }
        if !data.len().is_multiple_of(rb) {
            return Err(bad(format!("{} bytes are not whole rows of {rb}", data.len())));
        }
        let mut out = Vec::with_capacity(data.len() / rb * to.row_bytes(k as u64).unwrap_or(0) as usize);
        let mut row = vec![0f32; k];
        for r in data.chunks_exact(rb) {
            dequantize_row(t.ty, r, &mut row);
            if let Some(i) = row.iter().position(|v| !v.is_finite()) {
                return Err(bad(format!("value {} is not finite", row[i])));
            }
            out.extend(quantize_row(to, &row).ok_or(RequantizeError::UnsupportedTarget(to))?);
        }
        done.push(Converted { name: t.name.clone(), from: t.ty, bytes_before: data.len(), bytes_after: out.len() });
        w.add_tensor(TensorData { name: t.name.clone(), dims: t.dims.clone(), ty: to, data: out })?;
    }
    Ok((w, done))
}

/// [`requantize`] from file `input` to file `output` (which must differ).
pub fn requantize_file(input: &Path, output: &Path, to: GgmlType, keep: &[String]) -> Result<Vec<Converted>, RequantizeError> {
    let same = match (input.canonicalize(), output.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same {
        return Err(RequantizeError::SamePath(output.display().to_string()));
    }
    let src = Gguf::open(input)?;
    let (w, done) = requantize(&src, to, keep)?;
    w.write_to(output).map_err(|source| RequantizeError::Write { path: output.display().to_string(), source })?;
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q8(x: &[f32]) -> Vec<u8> {
        quantize_row(GgmlType::Q8_0, x).unwrap()
    }

    fn sample() -> Gguf {
        let mut w = GgufWriter::new();
        w.set("general.architecture", Value::String("dflash".into()));
        let vals: Vec<f32> = (0..4 * 64).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
        let data: Vec<u8> = vals.chunks(64).flat_map(q8).collect();
        w.add_tensor(TensorData { name: "blk.0.attn_q.weight".into(), dims: vec![64, 4], ty: GgmlType::Q8_0, data: data.clone() }).unwrap();
        w.add_tensor(TensorData { name: "output.weight".into(), dims: vec![64, 4], ty: GgmlType::Q8_0, data }).unwrap();
        let norm: Vec<u8> = (0..64).flat_map(|i| (1.0 + i as f32 / 64.0).to_le_bytes()).collect();
        w.add_tensor(TensorData { name: "output_norm.weight".into(), dims: vec![64], ty: GgmlType::F32, data: norm }).unwrap();
        Gguf::from_bytes(w.to_bytes().unwrap()).unwrap()
    }

    #[test]
    fn converts_block_matrices_and_keeps_the_rest() {
        let src = sample();
        let (w, done) = requantize(&src, GgmlType::Q4_1, &["output.".to_string()]).unwrap();
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].name, "blk.0.attn_q.weight");
        assert_eq!((done[0].bytes_before, done[0].bytes_after), (4 * 2 * 34, 4 * 2 * 20));
        let out = Gguf::from_bytes(w.to_bytes().unwrap()).unwrap();
        assert_eq!(out.get("general.architecture"), src.get("general.architecture"));
        assert_eq!(out.get_str(REQUANTIZED_KEY).unwrap(), "q4_1");
        let (t, q) = out.tensor("blk.0.attn_q.weight").unwrap();
        assert_eq!((t.ty, t.dims.clone()), (GgmlType::Q4_1, vec![64, 4]));
        // within half a Q4_1 step of the Q8_0 values (a step is at most 4/15)
        let (_, orig) = src.tensor("blk.0.attn_q.weight").unwrap();
        let (mut a, mut b) = (vec![0f32; 64], vec![0f32; 64]);
        for r in 0..4 {
            dequantize_row(GgmlType::Q8_0, &orig[r * 68..(r + 1) * 68], &mut a);
            dequantize_row(GgmlType::Q4_1, &q[r * 40..(r + 1) * 40], &mut b);
            assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() <= 0.14), "row {r}: {a:?} vs {b:?}");
        }
        // kept by name, and floats untouched
        for name in ["output.weight", "output_norm.weight"] {
            let (t0, d0) = src.tensor(name).unwrap();
            let (t1, d1) = out.tensor(name).unwrap();
            assert_eq!((t0.ty, d0), (t1.ty, d1), "{name}");
        }
    }

    #[test]
    fn refuses_what_it_cannot_write() {
        let src = sample();
        assert!(matches!(requantize(&src, GgmlType::Q6K, &[]), Err(RequantizeError::UnsupportedTarget(GgmlType::Q6K))));
        assert!(matches!(requantize(&src, GgmlType::F16, &[]), Err(RequantizeError::UnsupportedTarget(_))));
        assert_eq!(parse_target("Q4_1"), Some(GgmlType::Q4_1));
        assert_eq!(parse_target("q3_k"), None);
        let dir = std::env::temp_dir().join(format!("tandem-requant-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("a.gguf");
        std::fs::write(&p, src.bytes()).unwrap();
        assert!(matches!(requantize_file(&p, &p, GgmlType::Q4_1, &[]), Err(RequantizeError::SamePath(_))));
        std::fs::write(dir.join("bad.gguf"), b"not a gguf").unwrap();
        assert!(matches!(requantize_file(&dir.join("bad.gguf"), &dir.join("o.gguf"), GgmlType::Q4_1, &[]), Err(RequantizeError::Gguf(_))));
        // converting to the type a tensor already has changes nothing
        let (_, done) = requantize(&src, GgmlType::Q8_0, &[]).unwrap();
        assert!(done.is_empty());
        std::fs::remove_dir_all(&dir).ok();
    }
}
