use std::io::Write;

use crate::error::GgufError;
use crate::types::GgmlType;
use crate::value::Value;
use crate::DEFAULT_ALIGNMENT;

/// A tensor to be written: raw bytes already in `ty`'s block layout.
#[derive(Debug, Clone)]
pub struct TensorData {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    pub data: Vec<u8>,
}

/// Builds a GGUF v3 file: metadata in insertion order, tensors aligned.
#[derive(Debug, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<TensorData>,
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Set (or replace) a metadata key.
    pub fn set(&mut self, key: impl Into<String>, value: Value) -> &mut Self {
        let key = key.into();
        if let Some(slot) = self.metadata.iter_mut().find(|(k, _)| *k == key) {
            slot.1 = value;
        } else {
            self.metadata.push((key, value));
        }
        self
    }

    pub fn add_tensor(&mut self, t: TensorData) -> Result<&mut Self, GgufError> {
        if t.dims.is_empty() || t.dims.len() > 4 || t.dims.contains(&0) {
            return Err(GgufError::Write(format!("tensor '{}': bad shape {:?}", t.name, t.dims)));
        }
        let n: u64 = t.dims.iter().product();
        let row = t.ty.row_bytes(t.dims[0]).ok_or_else(|| {
            GgufError::Write(format!("tensor '{}': row {} not a multiple of block {}", t.name, t.dims[0], t.ty.block_elems()))
        })?;
        let expect = row * (n / t.dims[0]);
        if expect != t.data.len() as u64 {
            return Err(GgufError::Write(format!(
                "tensor '{}': {} bytes given, shape {:?} of {} needs {}",
                t.name,
                t.data.len(),
                t.dims,
                t.ty,
                expect
            )));
        }
        if self.tensors.iter().any(|x| x.name == t.name) {
            return Err(GgufError::Write(format!("duplicate tensor '{}'", t.name)));
        }
        self.tensors.push(t);
        Ok(self)
    }

    /// The data alignment, validated exactly as the reader will validate it,
    /// so the writer never produces a file the reader rejects.
    fn alignment(&self) -> Result<u64, GgufError> {
        match self.metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => Ok(DEFAULT_ALIGNMENT),
            Some((_, v)) => crate::reader::alignment_from_value(v),
        }
    }

    /// Serialize to bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>, GgufError> {
        let align = self.alignment()?;
        let mut out = Vec::new();
        out.extend_from_slice(crate::MAGIC);
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut out, k);
            out.extend_from_slice(&v.value_type().to_u32().to_le_bytes());
            put_value(&mut out, v)?;
        }
        let mut offset = 0u64;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            put_str(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ty.to_u32().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + t.data.len() as u64).div_ceil(align) * align;
        }
        let pad_to = |out: &mut Vec<u8>, a: u64| {
            let n = (out.len() as u64).div_ceil(a) * a;
            out.resize(n as usize, 0);
        };
        pad_to(&mut out, align);
        let base = out.len() as u64;
        for (t, off) in self.tensors.iter().zip(offsets) {
            out.resize((base + off) as usize, 0);
            out.extend_from_slice(&t.data);
        }
        Ok(out)
    }

    /// Serialize to a file (written to a temporary name, then renamed into place).
    pub fn write_to(&self, path: impl AsRef<std::path::Path>) -> Result<(), GgufError> {
        let path = path.as_ref();
        let io = |e| GgufError::Io { path: path.display().to_string(), source: e };
        let bytes = self.to_bytes()?;
        let tmp = path.with_extension("gguf.tmp");
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        f.write_all(&bytes).map_err(io)?;
        f.sync_all().map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)?;
        Ok(())
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) -> Result<(), GgufError> {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_str(out, s),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Array(ety, items) => {
            out.extend_from_slice(&ety.to_u32().to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for it in items {
                if it.value_type() != *ety {
                    return Err(GgufError::Write(format!("array declared {:?} holds a {}", ety, it.type_name())));
                }
                put_value(out, it)?;
            }
        }
    }
    Ok(())
}

/// A GGUF image read, edited and written again: `edit` gets the metadata (in
/// file order) and every tensor with its bytes, and may change, add or drop
/// any of them. For tools and tests that derive one file from another.
pub fn rewrite(bytes: &[u8], edit: impl FnOnce(&mut Vec<(String, Value)>, &mut Vec<TensorData>)) -> Result<Vec<u8>, GgufError> {
    let g = crate::Gguf::from_bytes(bytes.to_vec())?;
    let mut meta = g.metadata.clone();
    let mut tensors: Vec<TensorData> = g
        .tensors
        .iter()
        .map(|t| TensorData { name: t.name.clone(), dims: t.dims.clone(), ty: t.ty, data: g.tensor_data(t).to_vec() })
        .collect();
    edit(&mut meta, &mut tensors);
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        w.set(k, v);
    }
    for t in tensors {
        w.add_tensor(t)?;
    }
    w.to_bytes()
}
