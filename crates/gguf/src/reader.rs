use std::collections::HashMap;
use std::path::Path;

use crate::error::GgufError;
use crate::types::GgmlType;
use crate::value::{Value, ValueType};
use crate::DEFAULT_ALIGNMENT;

/// Limits on counts read from the header. Real models are far below them; a
/// file above them is treated as corrupt rather than allowed to allocate.
const MAX_TENSORS: u64 = 1 << 20;
const MAX_KV: u64 = 1 << 20;
const MAX_DIMS: u32 = 4;
const MAX_NESTING: u32 = 4;
/// Most elements one metadata array may hold. Real vocabularies are ~2^18; the
/// cap stops a corrupt length in a large file from turning gigabytes of tensor
/// data into a `Vec<Value>` (32 bytes per element) before anything fails.
const MAX_ARRAY_LEN: u64 = 1 << 24;
/// Most entries reserved up front for any count read from the file; beyond
/// this, vectors grow only as entries are actually parsed.
const MAX_PREALLOC: u64 = 1024;

fn prealloc(n: u64) -> usize {
    n.min(MAX_PREALLOC) as usize
}

/// Validate a `general.alignment` value: an integer type (not bool, float,
/// string or array) holding a power of two in 1..=65536.
pub(crate) fn alignment_from_value(v: &Value) -> Result<u64, GgufError> {
    let a = match v {
        Value::Bool(_) => None,
        _ => v.as_u64(),
    }
    .ok_or_else(|| GgufError::WrongType { key: "general.alignment".into(), expected: "unsigned integer", found: v.type_name() })?;
    if a == 0 || !a.is_power_of_two() || a > 65536 {
        return Err(GgufError::BadAlignment(a));
    }
    Ok(a)
}

/// Where the bytes live: a read-only memory map (zero-copy) or an owned buffer.
enum Backing {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// One entry of the tensor table.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` is the contiguous (row) length.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset relative to the start of the data section.
    pub offset: u64,
    /// Size of the data in bytes.
    pub size: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
    /// Row length (elements along the contiguous axis).
    pub fn ne0(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }
    /// Number of rows (product of all dims but the first).
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }
}

/// An opened GGUF file. Metadata is parsed eagerly; tensor data is borrowed from the map.
pub struct Gguf {
    backing: Backing,
    pub version: u32,
    pub alignment: u64,
    /// Metadata in file order.
    pub metadata: Vec<(String, Value)>,
    index: HashMap<String, usize>,
    pub tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    data_offset: u64,
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf")
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], GgufError> {
        let len = self.buf.len() as u64;
        let end = (self.pos as u64).checked_add(n).filter(|&e| e <= len).ok_or(GgufError::Truncated {
            what,
            offset: self.pos as u64,
            needed: n,
            len,
        })?;
        let s = &self.buf[self.pos..end as usize];
        self.pos = end as usize;
        Ok(s)
    }
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, GgufError> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &'static str) -> Result<u16, GgufError> {
        Ok(u16::from_le_bytes(self.take(2, what)?.try_into().unwrap()))
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }
    fn string(&mut self, what: &'static str) -> Result<String, GgufError> {
        let n = self.u64(what)?;
        let at = self.pos as u64;
        let b = self.take(n, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| GgufError::BadUtf8(at))
    }
    /// Bound an element count by what the remaining bytes could possibly hold
    /// (before anything is reserved for it). A count below the hard limits that
    /// the rest of the file is too short for means the file was cut off, so this
    /// reports `Truncated` with the least number of bytes the count implies.
    fn check_count(&self, what: &'static str, n: u64, min_size: u64) -> Result<(), GgufError> {
        let limit = self.remaining() / min_size.max(1);
        if n > limit {
            return Err(GgufError::Truncated {
                what,
                offset: self.pos as u64,
                needed: n.saturating_mul(min_size.max(1)),
                len: self.buf.len() as u64,
            });
        }
        Ok(())
    }

    fn value(&mut self, ty: ValueType, depth: u32) -> Result<Value, GgufError> {
        const W: &str = "metadata value";
        Ok(match ty {
            ValueType::U8 => Value::U8(self.u8(W)?),
            ValueType::I8 => Value::I8(self.u8(W)? as i8),
            ValueType::U16 => Value::U16(self.u16(W)?),
            ValueType::I16 => Value::I16(self.u16(W)? as i16),
            ValueType::U32 => Value::U32(self.u32(W)?),
            ValueType::I32 => Value::I32(self.u32(W)? as i32),
            ValueType::F32 => Value::F32(f32::from_bits(self.u32(W)?)),
            ValueType::Bool => Value::Bool(self.u8(W)? != 0),
            ValueType::String => Value::String(self.string("metadata string")?),
            ValueType::U64 => Value::U64(self.u64(W)?),
            ValueType::I64 => Value::I64(self.u64(W)? as i64),
            ValueType::F64 => Value::F64(f64::from_bits(self.u64(W)?)),
            ValueType::Array => {
                if depth >= MAX_NESTING {
                    return Err(GgufError::AbsurdCount { what: "array nesting depth", value: depth as u64 + 1, limit: MAX_NESTING as u64 });
                }
                let raw = self.u32("array element type")?;
                let ety = ValueType::from_u32(raw).ok_or(GgufError::UnknownValueType(raw))?;
                let n = self.u64("array length")?;
                if n > MAX_ARRAY_LEN {
                    return Err(GgufError::AbsurdCount { what: "array length", value: n, limit: MAX_ARRAY_LEN });
                }
                self.check_count("array length", n, ety.min_size())?;
                let mut items = Vec::with_capacity(prealloc(n));
                for _ in 0..n {
                    items.push(self.value(ety, depth + 1)?);
                }
                Value::Array(ety, items)
            }
        })
    }
}

impl Gguf {
    /// Open and memory-map a file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let io = |e| GgufError::Io { path: path.display().to_string(), source: e };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this process; tandem never
        // writes model files while they are open. Another process truncating the
        // file underneath us is outside what any mmap-based loader can defend against.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::parse(Backing::Mmap(map))
    }

    /// Parse a GGUF image held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, GgufError> {
        Self::parse(Backing::Owned(bytes))
    }

    fn parse(backing: Backing) -> Result<Self, GgufError> {
        let buf = backing.bytes();
        let mut c = Cursor { buf, pos: 0 };
        let magic: [u8; 4] = c.take(4, "magic")?.try_into().unwrap();
        if &magic != crate::MAGIC {
            return Err(GgufError::BadMagic(magic));
        }
        let version = c.u32("version")?;
        if version != 2 && version != 3 {
            return Err(GgufError::UnsupportedVersion(version));
        }
        let n_tensors = c.u64("tensor count")?;
        let n_kv = c.u64("metadata count")?;
        if n_tensors > MAX_TENSORS {
            return Err(GgufError::AbsurdCount { what: "tensor count", value: n_tensors, limit: MAX_TENSORS });
        }
        if n_kv > MAX_KV {
            return Err(GgufError::AbsurdCount { what: "metadata count", value: n_kv, limit: MAX_KV });
        }
        // Each KV takes at least 8 (key len) + 4 (type) + 1 bytes; each tensor info at least 8+4+4+8.
        c.check_count("metadata count", n_kv, 13)?;

        let mut metadata = Vec::with_capacity(prealloc(n_kv));
        let mut index = HashMap::with_capacity(prealloc(n_kv));
        for _ in 0..n_kv {
            let key = c.string("metadata key")?;
            let raw = c.u32("metadata type")?;
            let ty = ValueType::from_u32(raw).ok_or(GgufError::UnknownValueType(raw))?;
            let v = c.value(ty, 0)?;
            if index.insert(key.clone(), metadata.len()).is_some() {
                return Err(GgufError::DuplicateKey(key));
            }
            metadata.push((key, v));
        }

        let alignment = match index.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(&i) => alignment_from_value(&metadata[i].1)?,
        };

        c.check_count("tensor count", n_tensors, 24)?;
        let mut tensors = Vec::with_capacity(prealloc(n_tensors));
        let mut tensor_index = HashMap::with_capacity(prealloc(n_tensors));
        for _ in 0..n_tensors {
            let name = c.string("tensor name")?;
            let nd = c.u32("tensor dimension count")?;
            if nd == 0 || nd > MAX_DIMS {
                return Err(GgufError::bad_tensor(&name, format!("{nd} dimensions (allowed 1..={MAX_DIMS})")));
            }
            let mut dims = Vec::with_capacity(nd as usize);
            for _ in 0..nd {
                dims.push(c.u64("tensor dimension")?);
            }
            let raw = c.u32("tensor type")?;
            let ty = GgmlType::from_u32(raw).ok_or_else(|| GgufError::UnknownTensorType { name: name.clone(), ty: raw })?;
            let offset = c.u64("tensor offset")?;
            let mut n: u64 = 1;
            for &d in &dims {
                if d == 0 {
                    return Err(GgufError::bad_tensor(&name, "zero-sized dimension"));
                }
                n = n
                    .checked_mul(d)
                    .filter(|&n| n <= (1u64 << 48))
                    .ok_or_else(|| GgufError::bad_tensor(&name, format!("absurd shape {dims:?}")))?;
            }
            let row = ty.row_bytes(dims[0]).ok_or_else(|| {
                GgufError::bad_tensor(
                    &name,
                    format!("row length {} is not a multiple of the {} block size {}", dims[0], ty, ty.block_elems()),
                )
            })?;
            let size = row.checked_mul(n / dims[0]).ok_or_else(|| GgufError::bad_tensor(&name, "size overflows"))?;
            if offset % alignment != 0 {
                return Err(GgufError::MisalignedTensor { name, offset, alignment });
            }
            if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                return Err(GgufError::DuplicateTensor(name));
            }
            tensors.push(TensorInfo { name, dims, ty, offset, size });
        }

        let data_offset = (c.pos as u64).div_ceil(alignment) * alignment;
        let file_len = buf.len() as u64;
        let data_len = file_len.saturating_sub(data_offset);
        for t in &tensors {
            let end = t.offset.checked_add(t.size);
            match end {
                Some(end) if data_offset <= file_len && end <= data_len => {}
                _ => {
                    return Err(GgufError::TensorOutOfBounds {
                        name: t.name.clone(),
                        start: t.offset,
                        end: t.offset.saturating_add(t.size),
                        len: data_len,
                    })
                }
            }
        }
        Ok(Gguf { backing, version, alignment, metadata, index, tensors, tensor_index, data_offset })
    }

    /// The whole file image.
    pub fn bytes(&self) -> &[u8] {
        self.backing.bytes()
    }

    /// Tell the OS that the mapped pages wholly inside `range` (byte offsets in
    /// the file) are not needed now, so they stop counting toward our resident
    /// set (used after a tensor was repacked into memory of its own). The data
    /// stays valid: a later read faults the pages back in from the file.
    pub fn release(&self, range: std::ops::Range<usize>) {
        #[cfg(unix)]
        if let Backing::Mmap(m) = &self.backing {
            const PAGE: usize = 4096;
            let start = range.start.div_ceil(PAGE) * PAGE;
            let end = range.end.min(m.len()) / PAGE * PAGE;
            if end > start {
                // SAFETY: the map is private and read-only, so MADV_DONTNEED
                // only drops clean pages that are re-read from the unchanged
                // file on next access; no data we hand out is invalidated.
                let _ = unsafe { m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start) };
            }
        }
        #[cfg(not(unix))]
        let _ = range;
    }

    /// Total file size in bytes.
    pub fn file_size(&self) -> u64 {
        self.bytes().len() as u64
    }

    /// Absolute offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.metadata[i].1)
    }

    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.get(key).ok_or_else(|| GgufError::MissingKey(key.into()))?;
        v.as_u64().ok_or_else(|| GgufError::WrongType { key: key.into(), expected: "unsigned integer", found: v.type_name() })
    }

    pub fn get_f64(&self, key: &str) -> Result<f64, GgufError> {
        let v = self.get(key).ok_or_else(|| GgufError::MissingKey(key.into()))?;
        v.as_f64().ok_or_else(|| GgufError::WrongType { key: key.into(), expected: "number", found: v.type_name() })
    }

    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.get(key).ok_or_else(|| GgufError::MissingKey(key.into()))?;
        v.as_str().ok_or_else(|| GgufError::WrongType { key: key.into(), expected: "string", found: v.type_name() })
    }

    pub fn get_array(&self, key: &str) -> Result<&[Value], GgufError> {
        let v = self.get(key).ok_or_else(|| GgufError::MissingKey(key.into()))?;
        v.as_array().ok_or_else(|| GgufError::WrongType { key: key.into(), expected: "array", found: v.type_name() })
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The bytes of a tensor, borrowed from the file (bounds were checked at open).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let start = (self.data_offset + t.offset) as usize;
        &self.bytes()[start..start + t.size as usize]
    }

    /// Look a tensor up by name and return its info and bytes.
    pub fn tensor(&self, name: &str) -> Result<(&TensorInfo, &[u8]), GgufError> {
        let t = self.tensor_info(name).ok_or_else(|| GgufError::MissingTensor(name.into()))?;
        Ok((t, self.tensor_data(t)))
    }
}
