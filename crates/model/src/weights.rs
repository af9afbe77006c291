use std::ops::Range;
use std::sync::Arc;

use tandem_gguf::{GgmlType, Gguf};
use tandem_kernels::matmul::{Layout, Weight};

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

/// Source bytes packed per step at load: the packed copy grows while the
/// mapped pages it came from are released, so loading never holds a large
/// matrix twice.
const PACK_CHUNK_BYTES: usize = 4 << 20;

/// The packed layout for a matrix of type `ty`, if one applies (Q4_0/Q4_1 as
/// Q4x8, Q4_K as Q4Kx8, Q5_0 as Q5x8, Q6_K as Q6x8 and Q8_0 as Q8x8), built a
/// few MiB of rows at a time; `consumed(range)` is called with the source
/// bytes used so far after each step. Packing works per group of 8 rows, so
/// the chunks concatenate to the layout of the whole matrix.
fn pack(ty: GgmlType, n: usize, k: usize, bytes: &[u8], mut consumed: impl FnMut(Range<usize>)) -> Option<Storage> {
    use tandem_kernels::pack::{pack_q4kx8, pack_q4x8, pack_q5x8, pack_q6x8, pack_q8x8};
    let layout = match ty {
        GgmlType::Q8_0 => Layout::Q8x8,
        GgmlType::Q5_0 => Layout::Q5x8,
        GgmlType::Q6K => Layout::Q6x8,
        GgmlType::Q4K => Layout::Q4Kx8,
        GgmlType::Q4_0 | GgmlType::Q4_1 => Layout::Q4x8,
        _ => return None,
    };
    if n == 0 || !n.is_multiple_of(8) || !bytes.len().is_multiple_of(n) {
        return None;
    }
    let row_bytes = bytes.len() / n;
    let rows = (PACK_CHUNK_BYTES / row_bytes.max(1)).max(8) / 8 * 8;
    let mut out = Vec::new();
    for r0 in (0..n).step_by(rows) {
        let r1 = (r0 + rows).min(n);
        let src = &bytes[r0 * row_bytes..r1 * row_bytes];
        let part = match layout {
            Layout::Q8x8 => pack_q8x8(r1 - r0, k, src),
            Layout::Q5x8 => pack_q5x8(r1 - r0, k, src),
            Layout::Q6x8 => pack_q6x8(r1 - r0, k, src),
            Layout::Q4Kx8 => pack_q4kx8(r1 - r0, k, src),
            _ => pack_q4x8(ty, r1 - r0, k, src),
        }?;
        if r0 == 0 {
            out.reserve_exact(part.len() / (r1 - r0) * n);
        }
        out.extend_from_slice(&part);
        consumed(0..r1 * row_bytes);
    }
    Some(Storage::Packed(layout, Arc::new(out)))
}

#[derive(Debug, Clone)]
enum Storage {
    /// Bytes inside the GGUF map, in GGUF's row layout.
    Mapped { start: usize, len: usize },
    /// A repacked copy in one of the kernels' interleaved layouts (see
    /// `tandem_kernels::pack`).
    Packed(Layout, Arc<Vec<u8>>),
    /// An owned matrix in GGUF's row layout (e.g. rows gathered for a reduced
    /// draft vocabulary).
    Owned(Arc<Vec<u8>>),
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

    /// Like [`load`](Self::load), but Q4_0/Q4_1, Q4_K, Q5_0, Q6_K and Q8_0 matrices with a
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
            if let Some(p) = pack(w.ty, n, k, bytes, |used| g.release(start + used.start..start + used.end)) {
                w.storage = p;
            }
        }
        Ok(w)
    }

    /// Rows `rows` of matrix `name` (`[k, n]` in ggml order), packed like
    /// [`load_packed`](Self::load_packed): one rank's share of a split
    /// matrix. Only those rows' pages of the map are read, and released
    /// once packed.
    pub fn load_packed_rows(g: &Gguf, name: &str, k: usize, n: usize, rows: Range<usize>) -> Result<Self, ModelError> {
        if rows.start == 0 && rows.end == n {
            return Self::load_packed(g, name, k, n);
        }
        let w = Self::load(g, name, k, n)?;
        let Storage::Mapped { start, len } = w.storage else { unreachable!("load maps") };
        let rb = len / n.max(1);
        if rows.end > n || rows.start > rows.end {
            return Err(ModelError::BadConfig(format!("{name}: rows {rows:?} of {n}")));
        }
        let (a, b) = (start + rows.start * rb, start + rows.end * rb);
        let bytes = &g.bytes()[a..b];
        let nr = rows.len();
        Weight::new(name, w.ty, nr, k, bytes)?;
        let packed = if std::env::var("TANDEM_NO_REPACK").is_ok() {
            None
        } else {
            pack(w.ty, nr, k, bytes, |used| g.release(a + used.start..a + used.end))
        };
        let storage = packed.unwrap_or(Storage::Mapped { start: a, len: b - a });
        Ok(WeightRef { name: w.name, ty: w.ty, n: nr, k, storage })
    }

    /// Like [`load`](Self::load), but dequantized to an owned f32 matrix:
    /// products with it keep activations in f32 too, so a model loaded this
    /// way computes what its quantized weights mean without activation
    /// rounding (a slow reference for checking).
    pub fn load_f32(g: &Gguf, name: &str, k: usize, n: usize) -> Result<Self, ModelError> {
        let w = Self::load(g, name, k, n)?;
        let (t, data) = g.tensor(name)?;
        let rb = t.ty.row_bytes(k as u64).unwrap_or(0) as usize;
        let mut row = vec![0f32; k];
        let mut bytes = Vec::with_capacity(n * k * 4);
        for r in 0..n {
            tandem_kernels::quant::dequantize_row(t.ty, &data[r * rb..(r + 1) * rb], &mut row);
            bytes.extend(row.iter().flat_map(|x| x.to_le_bytes()));
        }
        Weight::new(name, GgmlType::F32, n, k, &bytes)?;
        Ok(WeightRef { name: w.name, ty: GgmlType::F32, n, k, storage: Storage::Owned(Arc::new(bytes)) })
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
        let packed = if std::env::var("TANDEM_NO_REPACK").is_ok() { None } else { pack(t.ty, n, self.k, &bytes, |_| {}) };
        let storage = packed.unwrap_or_else(|| Storage::Owned(Arc::new(bytes)));
        Ok(WeightRef { name: name.into(), ty: t.ty, n, k: self.k, storage })
    }

    #[inline]
    pub fn view<'a>(&'a self, g: &'a Gguf) -> Weight<'a> {
        match &self.storage {
            Storage::Mapped { start, len } => Weight::new(&self.name, self.ty, self.n, self.k, &g.bytes()[*start..*start + *len]),
            Storage::Packed(layout, p) => match layout {
                Layout::Q4x8 => Weight::packed_q4x8(&self.name, self.ty, self.n, self.k, p),
                Layout::Q5x8 => Weight::packed_q5x8(&self.name, self.n, self.k, p),
                Layout::Q6x8 => Weight::packed_q6x8(&self.name, self.n, self.k, p),
                Layout::Q4Kx8 => Weight::packed_q4kx8(&self.name, self.n, self.k, p),
                Layout::Q8x8 => Weight::packed_q8x8(&self.name, self.n, self.k, p),
                Layout::Rows => Weight::new(&self.name, self.ty, self.n, self.k, p),
            },
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
