//! The MTP support file's format: metadata keys and tensor names, and the
//! head's weights in f32 as the trainer initialises, writes and reads them
//! back. The runtime head ([`super::MtpHead`]) loads and validates a file on
//! its own, into packed weights.

use tandem_gguf::{GgmlType, Gguf};

use crate::support::TargetId;
use crate::{Model, ModelError};

/// Metadata keys of an MTP support file (besides the target binding).
pub mod keys {
    /// Index N in the tensor names `blk.N.*` (llama.cpp's nextn convention:
    /// the MTP block numbers after the target's last block).
    pub const LAYER_INDEX: &str = "tandem-mtp.layer_index";
    /// Rows of the reduced draft vocabulary (`blk.N.nextn.d2t`); absent: full.
    pub const DRAFT_VOCAB: &str = "tandem-mtp.draft_vocab_size";
    /// Target layers whose inputs are fused into `h` (1..=n_layer, as
    /// `dflash.target_layers`); absent: a plain head.
    pub const FUSED_LAYERS: &str = "tandem-mtp.fused_layers";
    /// Longest suffix the copy hint matches (1..=8); absent: no copy hint.
    pub const COPY_NGRAM: &str = "tandem-mtp.copy_ngram_max";
}

/// The optional copy-hint tensors (present exactly when [`keys::COPY_NGRAM`] is).
pub const COPY_TENSORS: [&str; 4] = ["nextn.copy_norm.weight", "nextn.copy_proj.weight", "nextn.copy_len.weight", "nextn.copy_bias.weight"];

/// The optional fused-feature tensors (present exactly when
/// [`keys::FUSED_LAYERS`] is).
pub const FUSED_TENSORS: [&str; 2] = ["nextn.fnorm.weight", "nextn.fc.weight"];

pub const KIND: &str = "mtp";
pub const ARCH: &str = "tandem-mtp";

/// Tensor names of the head for layer index `n`.
pub fn tensor_name(n: usize, what: &str) -> String {
    format!("blk.{n}.{what}")
}

/// The parts of the head that are not the transformer block.
pub const HEAD_TENSORS: [&str; 4] = ["nextn.enorm.weight", "nextn.hnorm.weight", "nextn.eh_proj.weight", "nextn.shared_head_norm.weight"];

/// The block's tensors, in the target's own names.
pub const BLOCK_TENSORS: [&str; 9] = [
    "attn_norm.weight",
    "attn_q.weight",
    "attn_k.weight",
    "attn_v.weight",
    "attn_output.weight",
    "ffn_norm.weight",
    "ffn_gate.weight",
    "ffn_up.weight",
    "ffn_down.weight",
];

/// The fused layers a support file's metadata declares (None: a plain head,
/// or no list of integers under the key). Unchecked: [`MtpHead::load`]
/// validates them.
pub fn declared_fused_layers(g: &Gguf) -> Option<Vec<usize>> {
    match g.get(keys::FUSED_LAYERS) {
        Some(tandem_gguf::Value::Array(_, items)) => Some(items.iter().filter_map(|v| v.as_i64()).map(|l| l as usize).collect()),
        _ => None,
    }
}

/// Copy-hint weights of a head in f32.
#[derive(Debug, Clone)]
pub struct CopyWeights {
    /// Longest suffix matched, 1..=8.
    pub nmax: usize,
    /// `nmax × d`: row n − 1 for suffix length n.
    pub norm: Vec<f32>,
    /// `d × d`.
    pub proj: Vec<f32>,
    /// `(nmax + 1) × d`: row n for suffix length n (0: no hint).
    pub len: Vec<f32>,
    /// `nmax`: entry n − 1 for suffix length n.
    pub bias: Vec<f32>,
}

impl CopyWeights {
    /// The identity start: a unit norm and zero projection and length rows,
    /// so the head computes exactly what it did without hints.
    pub fn zero(nmax: usize, d: usize) -> Self {
        CopyWeights { nmax, norm: vec![1.0; nmax * d], proj: vec![0.0; d * d], len: vec![0.0; (nmax + 1) * d], bias: vec![0.0; nmax] }
    }
}

/// Fused-feature weights of a head in f32.
#[derive(Debug, Clone)]
pub struct FusedWeights {
    /// Target layers (inputs of), 1..=n_layer.
    pub layers: Vec<usize>,
    /// `k·d`.
    pub fnorm: Vec<f32>,
    /// `d × k·d`.
    pub fc: Vec<f32>,
}

impl FusedWeights {
    /// The identity start: unit norms and a zero `fc`, so the head computes
    /// exactly what it did without fusion.
    pub fn zero(layers: &[usize], d: usize) -> Self {
        let k = layers.len();
        FusedWeights { layers: layers.to_vec(), fnorm: vec![1.0; k * d], fc: vec![0.0; d * k * d] }
    }
}

/// An MTP head's weights in f32, row-major `[out][in]` (what a trainer holds
/// and what [`MtpWeights::to_gguf`] writes).
#[derive(Debug, Clone)]
pub struct MtpWeights {
    pub layer_index: usize,
    pub enorm: Vec<f32>,
    pub hnorm: Vec<f32>,
    /// d × 2d: input `[enorm(e); hnorm(h)]`.
    pub eh_proj: Vec<f32>,
    /// The block, named as in [`BLOCK_TENSORS`], each `[out][in]` (norms: `[d]`).
    pub block: Vec<(String, Vec<f32>)>,
    pub head_norm: Vec<f32>,
    /// Draft row → target id.
    pub d2t: Option<Vec<u32>>,
    /// Fused target layers (None: a plain head).
    pub fused: Option<FusedWeights>,
    /// Copy hints (None: none).
    pub copy: Option<CopyWeights>,
}

/// Shape `(out, in)` of block tensor `what` for `cfg` (norms: `(d, 1)`).
pub fn block_shape(cfg: &crate::Config, what: &str) -> (usize, usize) {
    let (d, qd, kvd, f) = (cfg.d_model, cfg.q_dim(), cfg.kv_dim(), cfg.ffn);
    match what {
        "attn_q.weight" => (qd, d),
        "attn_k.weight" | "attn_v.weight" => (kvd, d),
        "attn_output.weight" => (d, qd),
        "ffn_gate.weight" | "ffn_up.weight" => (f, d),
        "ffn_down.weight" => (d, f),
        _ => (d, 1),
    }
}

impl MtpWeights {
    /// Start from the target: the block is a copy of its last block, the head
    /// norm its final norm, `eh_proj` passes the hidden half through (plus a
    /// little noise on the embedding half). Training starts from a head that
    /// already behaves like one more target layer.
    pub fn init_from_target(target: &Model, seed: u64) -> Self {
        let cfg = &target.cfg;
        let d = cfg.d_model;
        let g = target.gguf();
        let last = cfg.n_layer - 1;
        let block = BLOCK_TENSORS
            .iter()
            .map(|t| {
                let (o, i) = block_shape(cfg, t);
                let (info, data) = g.tensor(&format!("blk.{last}.{t}")).expect("target block tensor");
                let mut v = vec![0f32; o * i];
                tandem_kernels::quant::dequantize_row(info.ty, data, &mut v);
                (t.to_string(), v)
            })
            .collect();
        let mut head_norm = vec![0f32; d];
        let (info, data) = g.tensor("output_norm.weight").expect("output norm");
        tandem_kernels::quant::dequantize_row(info.ty, data, &mut head_norm);
        let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut eh_proj = vec![0f32; d * 2 * d];
        for r in 0..d {
            for c in 0..d {
                // xorshift noise, ±0.01
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                eh_proj[r * 2 * d + c] = ((rng >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.02;
            }
            eh_proj[r * 2 * d + d + r] = 1.0;
        }
        MtpWeights {
            layer_index: cfg.n_layer,
            enorm: vec![1.0; d],
            hnorm: vec![1.0; d],
            eh_proj,
            block,
            head_norm,
            d2t: None,
            fused: None,
            copy: None,
        }
    }

    /// Write a support file for target `id`; matrices in `ty` (F32, F16 or
    /// Q8_0), norms in F32. `extra` metadata (e.g. training provenance) is added.
    pub fn to_gguf(
        &self,
        cfg: &crate::Config,
        id: &TargetId,
        ty: GgmlType,
        extra: &[(String, tandem_gguf::Value)],
    ) -> Result<tandem_gguf::GgufWriter, tandem_gguf::GgufError> {
        use tandem_gguf::{GgufError, GgufWriter, TensorData, Value};
        let d = cfg.d_model;
        let n = self.layer_index;
        let mut w = GgufWriter::new();
        w.set("general.architecture", Value::String(ARCH.into()));
        w.set("general.name", Value::String(format!("MTP head for {} ({} layers, width {d})", id.arch, id.n_layer)));
        for (k, v) in id.metadata(KIND) {
            w.set(k, v);
        }
        w.set(keys::LAYER_INDEX, Value::U32(n as u32));
        if let Some(m) = &self.d2t {
            w.set(keys::DRAFT_VOCAB, Value::U32(m.len() as u32));
        }
        if let Some(f) = &self.fused {
            w.set(keys::FUSED_LAYERS, Value::Array(tandem_gguf::ValueType::U32, f.layers.iter().map(|&l| Value::U32(l as u32)).collect()));
        }
        if let Some(c) = &self.copy {
            w.set(keys::COPY_NGRAM, Value::U32(c.nmax as u32));
        }
        for (k, v) in extra {
            w.set(k.clone(), v.clone());
        }
        let vec_t = |name: String, v: &[f32]| TensorData {
            name,
            dims: vec![v.len() as u64],
            ty: GgmlType::F32,
            data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        };
        let mat_t = |name: String, v: &[f32], o: usize, i: usize| -> Result<TensorData, GgufError> {
            let mut data = Vec::new();
            for r in v.chunks_exact(i) {
                data.extend(
                    tandem_kernels::quant::quantize::quantize_row(ty, r)
                        .ok_or_else(|| GgufError::Write(format!("{name}: cannot quantize rows of {i} to {ty}")))?,
                );
            }
            Ok(TensorData { name, dims: vec![i as u64, o as u64], ty, data })
        };
        w.add_tensor(vec_t(tensor_name(n, "nextn.enorm.weight"), &self.enorm))?;
        w.add_tensor(vec_t(tensor_name(n, "nextn.hnorm.weight"), &self.hnorm))?;
        w.add_tensor(mat_t(tensor_name(n, "nextn.eh_proj.weight"), &self.eh_proj, d, 2 * d)?)?;
        for (name, v) in &self.block {
            let (o, i) = block_shape(cfg, name);
            if i == 1 {
                w.add_tensor(vec_t(tensor_name(n, name), v))?;
            } else {
                w.add_tensor(mat_t(tensor_name(n, name), v, o, i)?)?;
            }
        }
        w.add_tensor(vec_t(tensor_name(n, "nextn.shared_head_norm.weight"), &self.head_norm))?;
        if let Some(f) = &self.fused {
            let kd = f.layers.len() * d;
            w.add_tensor(vec_t(tensor_name(n, "nextn.fnorm.weight"), &f.fnorm))?;
            w.add_tensor(mat_t(tensor_name(n, "nextn.fc.weight"), &f.fc, d, kd)?)?;
        }
        if let Some(c) = &self.copy {
            w.add_tensor(vec_t(tensor_name(n, "nextn.copy_norm.weight"), &c.norm))?;
            w.add_tensor(mat_t(tensor_name(n, "nextn.copy_proj.weight"), &c.proj, d, d)?)?;
            w.add_tensor(vec_t(tensor_name(n, "nextn.copy_len.weight"), &c.len))?;
            w.add_tensor(vec_t(tensor_name(n, "nextn.copy_bias.weight"), &c.bias))?;
        }
        if let Some(m) = &self.d2t {
            w.add_tensor(TensorData {
                name: tensor_name(n, "nextn.d2t"),
                dims: vec![m.len() as u64],
                ty: GgmlType::I32,
                data: m.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect(),
            })?;
        }
        Ok(w)
    }
}

impl MtpWeights {
    /// Read the weights of an MTP support file back as f32 (to continue
    /// training from it). `cfg` is the target's configuration.
    pub fn from_gguf(g: &Gguf, cfg: &crate::Config) -> Result<Self, ModelError> {
        let n = g.get_u64(keys::LAYER_INDEX)? as usize;
        let read = |name: String, len: usize| -> Result<Vec<f32>, ModelError> {
            let (t, data) = g.tensor(&name)?;
            if t.n_elements() as usize != len {
                return Err(ModelError::BadShape { name, got: t.dims.clone(), want: vec![len as u64] });
            }
            let mut v = vec![0f32; len];
            tandem_kernels::quant::dequantize_row(t.ty, data, &mut v);
            Ok(v)
        };
        let d = cfg.d_model;
        let block = BLOCK_TENSORS
            .iter()
            .map(|t| {
                let (o, i) = block_shape(cfg, t);
                Ok((t.to_string(), read(tensor_name(n, t), o * i)?))
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let fused = match declared_fused_layers(g) {
            Some(layers) => {
                let kd = layers.len() * d;
                Some(FusedWeights {
                    fnorm: read(tensor_name(n, "nextn.fnorm.weight"), kd)?,
                    fc: read(tensor_name(n, "nextn.fc.weight"), kd * d)?,
                    layers,
                })
            }
            _ => None,
        };
        let copy = match g.get(keys::COPY_NGRAM).and_then(|v| v.as_u64()) {
            Some(nmax) => {
                let nmax = nmax as usize;
                Some(CopyWeights {
                    nmax,
                    norm: read(tensor_name(n, "nextn.copy_norm.weight"), nmax * d)?,
                    proj: read(tensor_name(n, "nextn.copy_proj.weight"), d * d)?,
                    len: read(tensor_name(n, "nextn.copy_len.weight"), (nmax + 1) * d)?,
                    bias: read(tensor_name(n, "nextn.copy_bias.weight"), nmax)?,
                })
            }
            None => None,
        };
        let d2t = match g.tensor(&tensor_name(n, "nextn.d2t")) {
            Ok((_, data)) => Some(data.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u32).collect()),
            Err(_) => None,
        };
        Ok(MtpWeights {
            layer_index: n,
            enorm: read(tensor_name(n, "nextn.enorm.weight"), d)?,
            hnorm: read(tensor_name(n, "nextn.hnorm.weight"), d)?,
            eh_proj: read(tensor_name(n, "nextn.eh_proj.weight"), 2 * d * d)?,
            block,
            head_norm: read(tensor_name(n, "nextn.shared_head_norm.weight"), d)?,
            d2t,
            fused,
            copy,
        })
    }
}
