use tandem_gguf::{GgmlType, Gguf};
use tandem_kernels::matmul::Weight;

use crate::ModelError;

/// A weight matrix located inside the GGUF map (no copy). Turned into a
/// borrowed [`Weight`] view at use.
#[derive(Debug, Clone)]
pub struct WeightRef {
    pub name: String,
    pub ty: GgmlType,
    /// Output features (rows).
    pub n: usize,
    /// Input features (row length).
    pub k: usize,
    storage: Storage,
}

/// The packed layout for a matrix of type `ty`, if one applies: Q4_0/Q4_1 as
/// Q4x8, Q4_K as Q4Kx8, Q5_0 as Q5x8, Q6_K as Q6x8 and Q8_0 as Q8x8.
fn pack(ty: GgmlType, n: usize, k: usize, bytes: &[u8]) -> Option<Storage> {
    use tandem_kernels::pack::{pack_q4kx8, pack_q4x8, pack_q5x8, pack_q6x8, pack_q8x8};
    match ty {
        GgmlType::Q8_0 => pack_q8x8(n, k, bytes).map(|p| Storage::Q8x8(p.into())),
        GgmlType::Q5_0 => pack_q5x8(n, k, bytes).map(|p| Storage::Q5x8(p.into())),
        GgmlType::Q6K => pack_q6x8(n, k, bytes).map(|p| Storage::Q6x8(p.into())),
        GgmlType::Q4K => pack_q4kx8(n, k, bytes).map(|p| Storage::Q4Kx8(p.into())),
        _ => pack_q4x8(ty, n, k, bytes).map(|p| Storage::Q4x8(p.into())),
    }
}

#[derive(Debug, Clone)]
enum Storage {
    /// Bytes inside the GGUF map, in GGUF's row layout.
    Mapped { start: usize, len: usize },
    /// Repacked Q4_0/Q4_1 copy (see `tandem_kernels::pack`).
    Q4x8(std::sync::Arc<[u8]>),
    /// Repacked Q8_0 copy (see `tandem_kernels::pack`).
    Q8x8(std::sync::Arc<[u8]>),
    /// Repacked Q5_0 copy (see `tandem_kernels::pack`).
    Q5x8(std::sync::Arc<[u8]>),
    /// Repacked Q6_K copy (see `tandem_kernels::pack`).
    Q6x8(std::sync::Arc<[u8]>),
    /// Repacked Q4_K copy (see `tandem_kernels::pack`).
    Q4Kx8(std::sync::Arc<[u8]>),
    /// An owned matrix in GGUF's row layout (e.g. rows gathered for a reduced
    /// draft vocabulary).
    Owned(std::sync::Arc<[u8]>),
}

impl WeightRef {
    /// Look up a 2-D tensor `[k, n]` (ggml order) and check its shape.
    pub fn load(g: &Gguf, name: &str, k: usize, n: usize) -> Result<Self, ModelError> {
        let (t, data) = g.tensor(name)?;
        let want = vec![k as u64, n as u64];
        if t.dims != want {
            return Err(ModelError::BadShape { name: name.into(), got: t.dims.clone(), want });
        }
        // validate once; views are rebuilt cheaply later
        Weight::new(name, t.ty, n, k, data)?;
        let start = data.as_ptr() as usize - g.bytes().as_ptr() as usize;
        Ok(WeightRef { name: name.into(), ty: t.ty, n, k, storage: Storage::Mapped { start, len: data.len() } })
    }

    /// Like [`load`](Self::load), but Q4_0/Q4_1, Q5_0, Q6_K and Q8_0 matrices with a
    /// multiple of 8 rows are repacked into the interleaved layouts the batched
    /// kernels want, and the mapped pages they came from are released.
    /// `TANDEM_NO_REPACK` (any value) turns all repacking off.
    pub fn load_packed(g: &Gguf, name: &str, k: usize, n: usize) -> Result<Self, ModelError> {
        let mut w = Self::load(g, name, k, n)?;
        if std::env::var("TANDEM_NO_REPACK").is_ok() {
            return Ok(w);
        }
        if let Storage::Mapped { start, len } = w.storage {
            let bytes = &g.bytes()[start..start + len];
            if let Some(p) = pack(w.ty, n, k, bytes) {
                w.storage = p;
                g.release(start..start + len);
            }
        }
        Ok(w)
    }

    /// A new matrix made of rows `rows` of this one (in that order), read from
    /// the original bytes in the map; packed like [`load_packed`](Self::load_packed).
    /// Used for reduced draft vocabularies: the head is shared, not copied
    /// into support files.
    pub fn gather_rows(&self, g: &Gguf, rows: &[u32], name: &str) -> Result<Self, ModelError> {
        let (t, data) = g.tensor(&self.name)?;
        let rb = t.ty.row_bytes(self.k as u64).unwrap_or(0) as usize;
        let mut bytes = Vec::with_capacity(rows.len() * rb);
        for &r in rows {
            let r = r as usize;
            if r >= self.n {
                return Err(ModelError::BadConfig(format!("{name}: row {r} out of range ({} rows)", self.n)));
            }
            bytes.extend_from_slice(&data[r * rb..(r + 1) * rb]);
        }
        let n = rows.len();
        Weight::new(name, t.ty, n, self.k, &bytes)?;
        let packed = if std::env::var("TANDEM_NO_REPACK").is_ok() { None } else { pack(t.ty, n, self.k, &bytes) };
        let storage = packed.unwrap_or_else(|| Storage::Owned(bytes.into()));
        Ok(WeightRef { name: name.into(), ty: t.ty, n, k: self.k, storage })
    }

    #[inline]
    pub fn view<'a>(&'a self, g: &'a Gguf) -> Weight<'a> {
        match &self.storage {
            Storage::Mapped { start, len } => {
                Weight::new(&self.name, self.ty, self.n, self.k, &g.bytes()[*start..*start + *len])
            }
            Storage::Q4x8(p) => Weight::packed_q4x8(&self.name, self.ty, self.n, self.k, p),
            Storage::Q8x8(p) => Weight::packed_q8x8(&self.name, self.n, self.k, p),
            Storage::Q6x8(p) => Weight::packed_q6x8(&self.name, self.n, self.k, p),
            Storage::Q5x8(p) => Weight::packed_q5x8(&self.name, self.n, self.k, p),
            Storage::Q4Kx8(p) => Weight::packed_q4kx8(&self.name, self.n, self.k, p),
            Storage::Owned(b) => Weight::new(&self.name, self.ty, self.n, self.k, b),
        }
        .expect("validated at load")
    }
}

/// A 1-D f32 vector (norm weights, biases), dequantized at load.
pub fn load_vec(g: &Gguf, name: &str, n: usize) -> Result<Vec<f32>, ModelError> {
    let (t, data) = g.tensor(name)?;
    if t.dims != [n as u64] {
        return Err(ModelError::BadShape { name: name.into(), got: t.dims.clone(), want: vec![n as u64] });
    }
    let mut v = vec![0f32; n];
    tandem_kernels::quant::dequantize_row(t.ty, data, &mut v);
    Ok(v)
}

pub fn load_opt_vec(g: &Gguf, name: &str, n: usize) -> Result<Option<Vec<f32>>, ModelError> {
    if g.tensor_info(name).is_none() {
        return Ok(None);
    }
    load_vec(g, name, n).map(Some)
}
