//! Property tests: corrupting a valid file anywhere never panics (the reader
//! returns Ok or a typed Err), a successful parse only ever hands out tensor
//! slices inside the buffer, and random writer output always reads back.

#[macro_use]
mod common;

use std::sync::OnceLock;

use common::*;
use proptest::prelude::*;
use proptest::sample::Index;
use tandem_gguf::{GgmlType, Gguf, GgufWriter, TensorData, Value, ValueType};

/// The valid sample file and the regions mutations aim at.
struct Base {
    file: Vec<u8>,
    /// Start of the tensor-info table.
    table: usize,
    /// Start of the data section (end of the header and its padding).
    data: usize,
}

fn base() -> &'static Base {
    static BASE: OnceLock<Base> = OnceLock::new();
    BASE.get_or_init(|| {
        let file = sample_file();
        let g = Gguf::from_bytes(file.clone()).unwrap();
        let first = &g.tensors[0].name;
        let mut needle = (first.len() as u64).to_le_bytes().to_vec();
        needle.extend_from_slice(first.as_bytes());
        let table = file.windows(needle.len()).position(|w| w == needle).unwrap();
        Base { table, data: g.data_offset() as usize, file }
    })
}

/// Exercise everything a caller might touch on a successfully parsed file.
fn check_ok(g: &Gguf) {
    check_tensor_bounds(g);
    for (k, v) in &g.metadata {
        // Identity, not equality: a corrupted f32 may be NaN.
        assert!(std::ptr::eq(g.get(k).unwrap(), v));
        let _ = v.display_short(4);
        let _ = (v.as_u64(), v.as_i64(), v.as_f64(), v.as_str(), v.as_array(), v.as_bool());
        let _ = (g.get_u64(k), g.get_f64(k), g.get_str(k), g.get_array(k));
    }
    for t in &g.tensors {
        let _ = (t.n_elements(), t.ne0(), t.n_rows());
        assert!(t.n_elements() > 0);
        assert_eq!(t.ty.row_bytes(t.ne0()).unwrap() * t.n_rows(), t.size);
    }
}

/// Values likely to hit limits when written over a count, length, offset or type field.
fn interesting_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(2),
        Just(3),
        Just(4),
        Just(5),
        Just(8),
        Just(9),
        Just(12),
        Just(13),
        Just(31),
        Just(32),
        Just(33),
        Just(64),
        Just(99),
        Just(255),
        Just(0x7FFF_FFFF),
        Just(u32::MAX as u64),
        Just(1 << 20),
        Just((1 << 20) + 1),
        Just(1 << 24),
        Just(1 << 32),
        Just(1 << 40),
        Just(1 << 48),
        Just(1 << 63),
        Just(u64::MAX - 31),
        Just(u64::MAX),
        any::<u64>(),
        0u64..4096,
    ]
}

/// Which part of the file a mutation lands in.
#[derive(Debug, Clone, Copy)]
enum Region {
    /// Anywhere, data section included.
    File,
    /// Fixed header, metadata and tensor table.
    Header,
    /// The tensor-info table only (names, dims, types, offsets).
    Table,
}

#[derive(Debug, Clone)]
enum Mutation {
    /// Flip one bit.
    Flip(Index, u8, Region),
    /// Overwrite one byte.
    Set(Index, u8, Region),
    /// Overwrite 4 bytes (little-endian u32).
    U32(Index, u32, Region),
    /// Overwrite 8 bytes (little-endian u64).
    U64(Index, u64, Region),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let region = prop_oneof![1 => Just(Region::File), 2 => Just(Region::Header), 2 => Just(Region::Table)];
    prop_oneof![
        3 => (any::<Index>(), 0u8..8, region.clone()).prop_map(|(i, b, r)| Mutation::Flip(i, b, r)),
        3 => (any::<Index>(), any::<u8>(), region.clone()).prop_map(|(i, b, r)| Mutation::Set(i, b, r)),
        2 => (any::<Index>(), interesting_u64(), region.clone()).prop_map(|(i, v, r)| Mutation::U32(i, v as u32, r)),
        2 => (any::<Index>(), interesting_u64(), region).prop_map(|(i, v, r)| Mutation::U64(i, v, r)),
    ]
}

fn apply(buf: &mut [u8], base: &Base, m: &Mutation) {
    let pick = |i: &Index, r: Region, width: usize| {
        let (lo, hi) = match r {
            Region::File => (0, buf.len()),
            Region::Header => (0, base.data),
            Region::Table => (base.table, base.data),
        };
        lo + i.index((hi - lo).saturating_sub(width) + 1)
    };
    match m {
        Mutation::Flip(i, bit, w) => {
            let p = pick(i, *w, 1);
            buf[p] ^= 1 << bit;
        }
        Mutation::Set(i, b, w) => {
            let p = pick(i, *w, 1);
            buf[p] = *b;
        }
        Mutation::U32(i, v, w) => {
            let p = pick(i, *w, 4);
            buf[p..p + 4].copy_from_slice(&v.to_le_bytes());
        }
        Mutation::U64(i, v, w) => {
            let p = pick(i, *w, 8);
            buf[p..p + 8].copy_from_slice(&v.to_le_bytes());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random corruption of a valid file (optionally also truncated): never a
    /// panic; when it parses, every tensor slice is inside the buffer.
    #[test]
    fn corrupted_file_never_panics(
        muts in prop::collection::vec(mutation(), 1..6),
        truncate in prop::option::weighted(0.15, any::<Index>()),
    ) {
        let base = base();
        let mut buf = base.file.clone();
        for m in &muts {
            apply(&mut buf, base, m);
        }
        if let Some(i) = truncate {
            buf.truncate(i.index(buf.len()));
        }
        // `parse` also asserts that no allocation was out of proportion to the input.
        match parse(buf) {
            Ok(g) => check_ok(&g),
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, failure_persistence: None, ..ProptestConfig::default() })]

    /// A valid fixed header followed by arbitrary bytes.
    #[test]
    fn random_body_never_panics(
        version in prop_oneof![Just(2u32), Just(3u32)],
        n_tensors in prop_oneof![0u64..4, interesting_u64()],
        n_kv in prop_oneof![0u64..4, interesting_u64()],
        body in prop::collection::vec(any::<u8>(), 0..600),
    ) {
        let mut f = B::new().raw(b"GGUF").u32(version).u64(n_tensors).u64(n_kv).0;
        f.extend_from_slice(&body);
        if let Ok(g) = parse(f) {
            check_ok(&g);
        }
    }
}

// ---------------------------------------------------------------------------
// Random valid files: writer -> reader round trip, and any prefix is rejected
// ---------------------------------------------------------------------------

const PRIMS: [ValueType; 12] = [
    ValueType::U8,
    ValueType::I8,
    ValueType::U16,
    ValueType::I16,
    ValueType::U32,
    ValueType::I32,
    ValueType::F32,
    ValueType::Bool,
    ValueType::String,
    ValueType::U64,
    ValueType::I64,
    ValueType::F64,
];

fn prim(ty: ValueType) -> BoxedStrategy<Value> {
    match ty {
        ValueType::U8 => any::<u8>().prop_map(Value::U8).boxed(),
        ValueType::I8 => any::<i8>().prop_map(Value::I8).boxed(),
        ValueType::U16 => any::<u16>().prop_map(Value::U16).boxed(),
        ValueType::I16 => any::<i16>().prop_map(Value::I16).boxed(),
        ValueType::U32 => any::<u32>().prop_map(Value::U32).boxed(),
        ValueType::I32 => any::<i32>().prop_map(Value::I32).boxed(),
        // NaN != NaN would break the equality check, not the reader.
        ValueType::F32 => any::<f32>().prop_filter("nan", |f| !f.is_nan()).prop_map(Value::F32).boxed(),
        ValueType::Bool => any::<bool>().prop_map(Value::Bool).boxed(),
        ValueType::String => "\\PC{0,12}".prop_map(Value::String).boxed(),
        ValueType::U64 => any::<u64>().prop_map(Value::U64).boxed(),
        ValueType::I64 => any::<i64>().prop_map(Value::I64).boxed(),
        ValueType::F64 => any::<f64>().prop_filter("nan", |f| !f.is_nan()).prop_map(Value::F64).boxed(),
        ValueType::Array => unreachable!(),
    }
}

/// An array value nested at most `depth` more levels.
fn array(depth: u32) -> BoxedStrategy<Value> {
    let flat = prop::sample::select(&PRIMS[..])
        .prop_flat_map(|ty| prop::collection::vec(prim(ty), 0..6).prop_map(move |v| Value::Array(ty, v)))
        .boxed();
    if depth == 0 {
        return flat;
    }
    prop_oneof![
        3 => flat,
        1 => prop::collection::vec(array(depth - 1), 0..4).prop_map(|v| Value::Array(ValueType::Array, v)),
    ]
    .boxed()
}

fn value() -> BoxedStrategy<Value> {
    prop_oneof![
        4 => prop::sample::select(&PRIMS[..]).prop_flat_map(prim),
        1 => array(3),
    ]
    .boxed()
}

const TYPES: [GgmlType; 12] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];

fn tensor() -> impl Strategy<Value = (GgmlType, Vec<u64>, u64)> {
    (prop::sample::select(&TYPES[..]), 1u64..4, prop::collection::vec(1u64..4, 0..3), any::<u64>()).prop_map(|(ty, blocks, rest, seed)| {
        let mut dims = vec![blocks * ty.block_elems() as u64];
        dims.extend(rest);
        (ty, dims, seed)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_valid_files_round_trip(
        kvs in prop::collection::vec(("\\PC{0,10}", value()), 0..12),
        tensors in prop::collection::vec(tensor(), 1..6),
        align in prop::option::of(prop::sample::select(&[1u64, 2, 8, 16, 32, 64, 128, 256][..])),
        v2 in any::<bool>(),
        cut in any::<Index>(),
    ) {
        let mut w = GgufWriter::new();
        let mut want = Vec::new();
        if let Some(a) = align {
            w.set("general.alignment", Value::U32(a as u32));
            want.push(("general.alignment".to_string(), Value::U32(a as u32)));
        }
        for (i, (k, v)) in kvs.into_iter().enumerate() {
            let key = format!("k{i}.{k}");
            w.set(key.clone(), v.clone());
            want.push((key, v));
        }
        let mut want_t = Vec::new();
        for (i, (ty, dims, seed)) in tensors.into_iter().enumerate() {
            let n: u64 = dims.iter().product();
            let size = ty.row_bytes(dims[0]).unwrap() * (n / dims[0]);
            let t = TensorData { name: format!("t{i}"), dims, ty, data: pattern(seed, size as usize) };
            w.add_tensor(t.clone()).unwrap();
            want_t.push(t);
        }
        let mut bytes = w.to_bytes().unwrap();
        if v2 {
            bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
        }

        let g = parse(bytes.clone()).unwrap();
        prop_assert_eq!(g.version, if v2 { 2 } else { 3 });
        prop_assert_eq!(g.alignment, align.unwrap_or(32));
        prop_assert_eq!(&g.metadata, &want);
        prop_assert_eq!(g.tensors.len(), want_t.len());
        for (t, w) in g.tensors.iter().zip(&want_t) {
            prop_assert_eq!(&t.name, &w.name);
            prop_assert_eq!(&t.dims, &w.dims);
            prop_assert_eq!(t.ty, w.ty);
            prop_assert_eq!(g.tensor_data(t), &w.data[..]);
        }
        check_ok(&g);

        // Any strict prefix of a file with tensors is an error.
        let len = cut.index(bytes.len());
        bytes.truncate(len);
        prop_assert!(parse(bytes).is_err());
    }
}
