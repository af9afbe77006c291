//! Shared helpers for the tandem-gguf integration tests:
//! - a per-thread allocation tracker (so tests can prove that a malformed
//!   header never makes the reader request a huge buffer),
//! - a byte-level builder for hand-made GGUF images (so tests can inject
//!   any bad field, not only patch writer output),
//! - a "kitchen sink" valid file built with `GgufWriter`.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use tandem_gguf::{GgmlType, Gguf, GgufError, GgufWriter, TensorData, Value, ValueType};

// ---------------------------------------------------------------------------
// Allocation tracking
// ---------------------------------------------------------------------------

/// Wraps the system allocator and records, per thread, the largest single
/// allocation (or reallocation target) requested since the last reset.
pub struct Tracking;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // `try_with`: never touch a thread-local that is being torn down.
    let _ = LARGEST.try_with(|m| {
        if size > m.get() {
            m.set(size)
        }
    });
}

unsafe impl GlobalAlloc for Tracking {
    /// # Safety
    /// As [`GlobalAlloc::alloc`], which this forwards to `System`.
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
    }
    /// # Safety
    /// As [`GlobalAlloc::alloc_zeroed`], which this forwards to `System`.
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    /// # Safety
    /// As [`GlobalAlloc::dealloc`], which this forwards to `System`.
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    /// # Safety
    /// As [`GlobalAlloc::realloc`], which this forwards to `System`.
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Tracking = Tracking;

/// Run `f` and return its result together with the largest single allocation
/// it made on this thread.
pub fn largest_alloc_during<R>(f: impl FnOnce() -> R) -> (R, usize) {
    LARGEST.with(|m| m.set(0));
    let r = f();
    (r, LARGEST.with(|m| m.get()))
}

/// Parse `bytes` with `Gguf::from_bytes` (the buffer is moved in, not copied)
/// and assert that no single allocation was out of proportion to the input.
/// Legitimate parsing needs at most a few dozen bytes of bookkeeping per input
/// byte (a `Value` is 32 bytes and a 1-byte array element becomes one), so the
/// bound is 64x the input plus a small constant.
pub fn parse(bytes: Vec<u8>) -> Result<Gguf, GgufError> {
    let len = bytes.len();
    let (r, largest) = largest_alloc_during(|| Gguf::from_bytes(bytes));
    let bound = 64 * len + (64 << 10);
    assert!(
        largest <= bound,
        "parsing {len} bytes made a {largest}-byte allocation (bound {bound}); result: {:?}",
        r.as_ref().map(|_| ()).map_err(|e| e.to_string())
    );
    r
}

/// Parse and demand an error.
#[track_caller]
pub fn parse_err(bytes: Vec<u8>) -> GgufError {
    match parse(bytes) {
        Ok(g) => panic!("expected an error, parsed fine: {g:?}"),
        Err(e) => {
            // Every error must render (Display is what users see).
            assert!(!e.to_string().is_empty());
            e
        }
    }
}

/// Assert a parse fails with a specific variant: `assert_err!(bytes, GgufError::Truncated { .. })`.
#[allow(unused_macros)]
macro_rules! assert_err {
    ($bytes:expr, $pat:pat $(if $guard:expr)?) => {{
        let e = crate::common::parse_err($bytes);
        assert!(
            matches!(e, $pat $(if $guard)?),
            "wrong error variant: {e:?} ({e}); expected {}",
            stringify!($pat)
        );
        e
    }};
}

/// Every tensor's data slice lies inside the file image, has the declared size
/// and is aligned as promised.
pub fn check_tensor_bounds(g: &Gguf) {
    let len = g.bytes().len() as u64;
    assert_eq!(g.data_offset() % g.alignment, 0);
    for t in &g.tensors {
        let start = g.data_offset().checked_add(t.offset).expect("start overflows");
        let end = start.checked_add(t.size).expect("end overflows");
        assert!(end <= len, "tensor {} [{start}, {end}) outside file of {len}", t.name);
        assert_eq!(t.offset % g.alignment, 0);
        assert_eq!(g.tensor_data(t).len() as u64, t.size);
        let (t2, d2) = g.tensor(&t.name).expect("tensor by name");
        assert_eq!(t2.name, t.name);
        assert_eq!(d2.len() as u64, t.size);
    }
}

// ---------------------------------------------------------------------------
// Raw byte builder
// ---------------------------------------------------------------------------

/// GGUF metadata value type ids.
pub mod vt {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// ggml tensor type ids.
pub mod tt {
    pub const F32: u32 = 0;
    pub const F16: u32 = 1;
    pub const Q4_1: u32 = 3;
    pub const Q8_0: u32 = 8;
    pub const Q4_K: u32 = 12;
}

/// Little-endian byte sink with chainable writers.
#[derive(Default, Clone, Debug)]
pub struct B(pub Vec<u8>);

impl B {
    pub fn new() -> Self {
        Self(Vec::new())
    }
    pub fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }
    pub fn u16(mut self, v: u16) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn i32(self, v: i32) -> Self {
        self.u32(v as u32)
    }
    pub fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn f32(self, v: f32) -> Self {
        self.u32(v.to_bits())
    }
    pub fn raw(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }
    /// A GGUF string: u64 length then the bytes (need not be UTF-8).
    pub fn bstr(self, b: &[u8]) -> Self {
        self.u64(b.len() as u64).raw(b)
    }
    pub fn str(self, s: &str) -> Self {
        self.bstr(s.as_bytes())
    }
    /// Array header: element type, then length.
    pub fn arr(self, elem_ty: u32, n: u64) -> Self {
        self.u32(elem_ty).u64(n)
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

/// One encoded metadata entry: key, type id, payload.
pub fn kv(key: &str, ty: u32, payload: B) -> Vec<u8> {
    kv_bytes(key.as_bytes(), ty, payload)
}

pub fn kv_bytes(key: &[u8], ty: u32, payload: B) -> Vec<u8> {
    B::new().bstr(key).u32(ty).raw(&payload.0).0
}

pub fn kv_u32(key: &str, v: u32) -> Vec<u8> {
    kv(key, vt::U32, B::new().u32(v))
}

/// One encoded tensor-info entry.
pub fn tinfo(name: &str, dims: &[u64], ty: u32, offset: u64) -> Vec<u8> {
    tinfo_bytes(name.as_bytes(), dims.len() as u32, dims, ty, offset)
}

/// Tensor-info entry with a free dimension count (may disagree with `dims`).
pub fn tinfo_bytes(name: &[u8], n_dims: u32, dims: &[u64], ty: u32, offset: u64) -> Vec<u8> {
    let mut b = B::new().bstr(name).u32(n_dims);
    for &d in dims {
        b = b.u64(d);
    }
    b.u32(ty).u64(offset).0
}

/// A hand-built GGUF image. Counts default to the number of entries given but
/// can be overridden to lie; the data section is zero-filled unless `data` is set.
#[derive(Clone, Debug)]
pub struct Raw {
    pub magic: [u8; 4],
    pub version: u32,
    pub n_tensors: Option<u64>,
    pub n_kv: Option<u64>,
    pub kvs: Vec<Vec<u8>>,
    pub tensors: Vec<Vec<u8>>,
    /// Alignment used to pad the header (independent of any `general.alignment` kv).
    pub align: u64,
    pub data: Vec<u8>,
}

impl Default for Raw {
    fn default() -> Self {
        Self { magic: *b"GGUF", version: 3, n_tensors: None, n_kv: None, kvs: vec![], tensors: vec![], align: 32, data: vec![] }
    }
}

impl Raw {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn kv(mut self, e: Vec<u8>) -> Self {
        self.kvs.push(e);
        self
    }
    pub fn tensor(mut self, e: Vec<u8>) -> Self {
        self.tensors.push(e);
        self
    }
    pub fn data(mut self, d: Vec<u8>) -> Self {
        self.data = d;
        self
    }
    pub fn data_len(self, n: usize) -> Self {
        self.data(vec![0xA5; n])
    }
    pub fn align(mut self, a: u64) -> Self {
        self.align = a;
        self
    }
    pub fn version(mut self, v: u32) -> Self {
        self.version = v;
        self
    }
    pub fn n_tensors(mut self, n: u64) -> Self {
        self.n_tensors = Some(n);
        self
    }
    pub fn n_kv(mut self, n: u64) -> Self {
        self.n_kv = Some(n);
        self
    }
    /// Header + kvs + tensor infos, unpadded.
    pub fn header(&self) -> Vec<u8> {
        let mut b = B::new()
            .raw(&self.magic)
            .u32(self.version)
            .u64(self.n_tensors.unwrap_or(self.tensors.len() as u64))
            .u64(self.n_kv.unwrap_or(self.kvs.len() as u64));
        for e in &self.kvs {
            b = b.raw(e);
        }
        for e in &self.tensors {
            b = b.raw(e);
        }
        b.0
    }
    /// The full image: header, zero padding to `align`, data.
    pub fn build(&self) -> Vec<u8> {
        let mut out = self.header();
        let a = self.align.max(1) as usize;
        out.resize(out.len().div_ceil(a) * a, 0);
        out.extend_from_slice(&self.data);
        out
    }
}

// ---------------------------------------------------------------------------
// A valid file built with the writer
// ---------------------------------------------------------------------------

/// Deterministic pseudo-random bytes (xorshift), different per seed.
pub fn pattern(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Metadata covering every value type, nested arrays, empty arrays, string arrays.
pub fn sample_metadata() -> Vec<(String, Value)> {
    use Value as V;
    let kv = |k: &str, v: Value| (k.to_string(), v);
    vec![
        kv("general.architecture", V::String("llama".into())),
        kv("t.u8", V::U8(0xFE)),
        kv("t.i8", V::I8(-7)),
        kv("t.u16", V::U16(0xBEEF)),
        kv("t.i16", V::I16(-12345)),
        kv("t.u32", V::U32(0xDEAD_BEEF)),
        kv("t.i32", V::I32(i32::MIN)),
        kv("t.f32", V::F32(-1.5e-3)),
        kv("t.f32.inf", V::F32(f32::INFINITY)),
        kv("t.bool.true", V::Bool(true)),
        kv("t.bool.false", V::Bool(false)),
        kv("t.string", V::String("héllo wörld ✓ 🦀".into())),
        kv("t.string.empty", V::String(String::new())),
        kv("t.u64", V::U64(u64::MAX)),
        kv("t.i64", V::I64(i64::MIN + 1)),
        kv("t.f64", V::F64(std::f64::consts::PI)),
        kv("t.arr.u8", V::Array(ValueType::U8, vec![V::U8(0), V::U8(1), V::U8(255)])),
        kv("t.arr.i8", V::Array(ValueType::I8, vec![V::I8(-128), V::I8(127)])),
        kv("t.arr.u16", V::Array(ValueType::U16, vec![V::U16(1), V::U16(65535)])),
        kv("t.arr.i16", V::Array(ValueType::I16, vec![V::I16(-1)])),
        kv("t.arr.u32", V::Array(ValueType::U32, vec![V::U32(3), V::U32(1 << 31)])),
        kv("t.arr.i32", V::Array(ValueType::I32, (-3..4).map(V::I32).collect())),
        kv("t.arr.f32", V::Array(ValueType::F32, vec![V::F32(0.5), V::F32(-0.0), V::F32(1e30)])),
        kv("t.arr.bool", V::Array(ValueType::Bool, vec![V::Bool(true), V::Bool(false), V::Bool(true)])),
        kv("t.arr.string", V::Array(ValueType::String, vec![V::String("<s>".into()), V::String(String::new()), V::String("Ġthe".into())])),
        kv("t.arr.u64", V::Array(ValueType::U64, vec![V::U64(u64::MAX), V::U64(0)])),
        kv("t.arr.i64", V::Array(ValueType::I64, vec![V::I64(-1), V::I64(i64::MAX)])),
        kv("t.arr.f64", V::Array(ValueType::F64, vec![V::F64(1e-300), V::F64(-2.25)])),
        kv("t.arr.empty.u32", V::Array(ValueType::U32, vec![])),
        kv("t.arr.empty.string", V::Array(ValueType::String, vec![])),
        kv("t.arr.empty.array", V::Array(ValueType::Array, vec![])),
        kv(
            "t.arr.nested",
            V::Array(
                ValueType::Array,
                vec![
                    V::Array(ValueType::I32, vec![V::I32(1), V::I32(2)]),
                    V::Array(ValueType::I32, vec![]),
                    V::Array(ValueType::String, vec![V::String("x".into())]),
                ],
            ),
        ),
        // Four levels of arrays: the deepest the reader accepts.
        kv(
            "t.arr.deep",
            V::Array(
                ValueType::Array,
                vec![V::Array(ValueType::Array, vec![V::Array(ValueType::Array, vec![V::Array(ValueType::U8, vec![V::U8(42)])])])],
            ),
        ),
        kv("general.quantization_version", V::U32(2)),
    ]
}

/// Tensors of several types (2-D, plus one 1-D), sizes chosen so that the
/// writer has to pad between most of them.
pub fn sample_tensors() -> Vec<TensorData> {
    let t = |name: &str, dims: &[u64], ty: GgmlType, seed: u64| {
        let n: u64 = dims.iter().product();
        let size = ty.row_bytes(dims[0]).unwrap() * (n / dims[0]);
        TensorData { name: name.into(), dims: dims.to_vec(), ty, data: pattern(seed, size as usize) }
    };
    vec![
        t("tok.f32", &[5, 3], GgmlType::F32, 1),  // 60 bytes
        t("w.f16", &[7, 2], GgmlType::F16, 2),    // 28 bytes
        t("w.q8_0", &[64, 3], GgmlType::Q8_0, 3), // 204 bytes
        t("w.q4_1", &[32, 4], GgmlType::Q4_1, 4), // 80 bytes
        t("w.q4_k", &[256, 2], GgmlType::Q4K, 5), // 288 bytes
        t("norm.f32", &[9], GgmlType::F32, 6),    // 36 bytes, last: file ends with it
    ]
}

pub fn sample_writer(extra: &[(&str, Value)]) -> GgufWriter {
    let mut w = GgufWriter::new();
    for (k, v) in sample_metadata() {
        w.set(k, v);
    }
    for (k, v) in extra {
        w.set(*k, v.clone());
    }
    for t in sample_tensors() {
        w.add_tensor(t).unwrap();
    }
    w
}

/// The valid sample file (default alignment).
pub fn sample_file() -> Vec<u8> {
    sample_writer(&[]).to_bytes().unwrap()
}

/// A unique scratch path under the system temp dir.
pub fn temp_path(tag: &str) -> std::path::PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("tandem-gguf-test-{}-{tag}-{n}.gguf", std::process::id()))
}
