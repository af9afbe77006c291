//! Malformed input must give a typed `GgufError`: never a panic, a hang, a huge
//! allocation (see `common::parse`, which bounds the largest single allocation
//! made while parsing) or an out-of-bounds read.

#[macro_use]
mod common;

use common::*;
use tandem_gguf::{Gguf, GgufError};

/// A file with one tensor described by `ti` and `data_len` bytes of data.
fn one_tensor(ti: Vec<u8>, data_len: usize) -> Vec<u8> {
    Raw::new().tensor(ti).data_len(data_len).build()
}

// ---------------------------------------------------------------------------
// Truncation
// ---------------------------------------------------------------------------

/// Every strict prefix of a valid file is rejected, with `Truncated` while the
/// header is cut (including where a count no longer fits in the bytes that are
/// left) and `TensorOutOfBounds` once only data is missing.
fn check_every_prefix(full: &[u8]) {
    let g = parse(full.to_vec()).unwrap();
    assert!(!g.tensors.is_empty());
    let data_off = g.data_offset() as usize;
    let mut first_oob = None;
    let (mut n_trunc, mut n_oob) = (0, 0);
    for len in 0..full.len() {
        let e = parse_err(full[..len].to_vec());
        match &e {
            GgufError::Truncated { len: l, offset, needed, .. } => {
                assert_eq!(*l, len as u64);
                assert!(offset.saturating_add(*needed) > len as u64, "{e}");
                assert!(first_oob.is_none(), "prefix {len}: {e} after out-of-bounds at shorter prefix");
                n_trunc += 1;
            }
            GgufError::TensorOutOfBounds { len: data_len, end, .. } => {
                assert!(end > data_len);
                first_oob.get_or_insert(len);
                n_oob += 1;
            }
            other => panic!("prefix {len} of {}: unexpected error {other:?}", full.len()),
        }
        if len >= data_off {
            assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "prefix {len}: {e}");
        }
    }
    // The header itself ends somewhere in [data_off - align, data_off].
    let first_oob = first_oob.unwrap();
    assert!(first_oob <= data_off && first_oob + g.alignment as usize > data_off);
    assert!(n_trunc > 0 && n_oob > 0);
    eprintln!("{} prefixes: {n_trunc} Truncated, {n_oob} TensorOutOfBounds", full.len());
}

#[test]
fn every_prefix_of_the_sample_file_is_rejected() {
    check_every_prefix(&sample_file());
}

#[test]
fn every_prefix_of_a_v2_file_is_rejected() {
    let mut f = sample_file();
    f[4..8].copy_from_slice(&2u32.to_le_bytes());
    check_every_prefix(&f);
}

#[test]
fn every_prefix_of_a_64_aligned_file_is_rejected() {
    let f = sample_writer(&[("general.alignment", tandem_gguf::Value::U32(64))]).to_bytes().unwrap();
    check_every_prefix(&f);
}

#[test]
fn truncated_files_on_disk_via_mmap() {
    let full = sample_file();
    let g = parse(full.clone()).unwrap();
    let path = temp_path("trunc");
    for len in [0, 1, 4, 8, 23, 24, 100, g.data_offset() as usize - 1, g.data_offset() as usize, full.len() - 1] {
        std::fs::write(&path, &full[..len]).unwrap();
        let e = Gguf::open(&path).unwrap_err();
        assert!(matches!(e, GgufError::Truncated { .. } | GgufError::TensorOutOfBounds { .. }), "len {len}: {e:?}");
    }
    std::fs::write(&path, &full).unwrap();
    assert_eq!(Gguf::open(&path).unwrap().tensors.len(), sample_tensors().len());
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn open_errors_are_typed() {
    let missing = temp_path("missing");
    assert!(matches!(Gguf::open(&missing), Err(GgufError::Io { .. })));
    // A directory cannot be mapped (or read): an error, not a panic.
    let e = Gguf::open(std::env::temp_dir()).unwrap_err();
    assert!(!e.to_string().is_empty());
}

// ---------------------------------------------------------------------------
// Magic and version
// ---------------------------------------------------------------------------

#[test]
fn wrong_magic() {
    for m in [b"GGUG", b"gguf", b"FUGG", b"\0\0\0\0", b"GGML", b"GGJT", b"\xff\xff\xff\xff"] {
        let mut raw = Raw::new();
        raw.magic = *m;
        assert_err!(raw.build(), GgufError::BadMagic(got) if &got == m);
    }
    // Valid files of other formats.
    assert_err!(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0".to_vec(), GgufError::BadMagic(_));
    assert_err!(b"PK\x03\x04 some zip".to_vec(), GgufError::BadMagic(_));
    // Too short even for the magic.
    assert_err!(b"GGU".to_vec(), GgufError::Truncated { what: "magic", .. });
}

#[test]
fn unsupported_versions() {
    for v in [0, 1, 4, 5, 0x0300_0000 /* big-endian 3 */, u32::MAX] {
        // Put a valid v3 body behind the bad version: it must still be refused.
        let mut f = sample_file();
        f[4..8].copy_from_slice(&v.to_le_bytes());
        assert_err!(f, GgufError::UnsupportedVersion(got) if got == v);
        assert_err!(Raw::new().version(v).build(), GgufError::UnsupportedVersion(got) if got == v);
    }
}

// ---------------------------------------------------------------------------
// Absurd counts and lengths
// ---------------------------------------------------------------------------

#[test]
fn absurd_tensor_count() {
    for n in [u64::MAX, 1 << 40, (1 << 20) + 1, 1 << 63] {
        assert_err!(Raw::new().n_tensors(n).build(), GgufError::AbsurdCount { what: "tensor count", value, .. } if value == n);
    }
    // Under the hard limit but more than the remaining bytes could hold: the
    // file is reported as cut short, before anything is reserved for the entries.
    for n in [1 << 20, 1000, 2] {
        let raw = Raw::new().n_tensors(n).tensor(tinfo("t", &[1], tt::F32, 0));
        assert_err!(raw.header(), GgufError::Truncated { what: "tensor count", needed, len: 57, .. } if needed == 24 * n);
    }
    // Count one higher than the entries present, with the data section behind
    // them: the reader walks into the data and must fail cleanly.
    let f = Raw::new().n_tensors(2).tensor(tinfo("t", &[64], tt::F32, 0)).data_len(256).build();
    parse_err(f);
}

#[test]
fn absurd_metadata_count() {
    for n in [u64::MAX, 1 << 40, (1 << 20) + 1] {
        assert_err!(Raw::new().n_kv(n).build(), GgufError::AbsurdCount { what: "metadata count", value, .. } if value == n);
    }
    for n in [1 << 20, 100, 2] {
        let raw = Raw::new().n_kv(n).kv(kv_u32("a", 1));
        assert_err!(raw.header(), GgufError::Truncated { what: "metadata count", offset: 24, .. });
    }
    // Claims more kvs than present; the tensor table is misread as metadata.
    let f = Raw::new().n_kv(2).kv(kv_u32("a", 1)).tensor(tinfo("t", &[8], tt::F32, 0)).data_len(32).build();
    parse_err(f);
    // Claims fewer: leftover kv bytes are misread as a tensor entry.
    let f = Raw::new().n_kv(1).kv(kv_u32("a", 1)).kv(kv_u32("b", 2)).tensor(tinfo("t", &[8], tt::F32, 0)).data_len(32).build();
    parse_err(f);
}

#[test]
fn absurd_array_lengths() {
    for (ety, n) in [
        (vt::U8, u64::MAX),
        (vt::U8, 1 << 40),
        (vt::STRING, u64::MAX),
        (vt::STRING, 1 << 40),
        (vt::ARRAY, u64::MAX),
        (vt::F64, 1 << 62),
        (vt::BOOL, u64::MAX / 2),
    ] {
        let raw = Raw::new().kv(kv("a", vt::ARRAY, B::new().arr(ety, n).raw(&[0; 64])));
        assert_err!(raw.build(), GgufError::AbsurdCount { what: "array length", value, .. } if value == n);
    }
    // Exactly at the edge: 3 bytes left, 3 u8 elements fit, 4 do not.
    let at = |n: u64| Raw::new().kv(kv("a", vt::ARRAY, B::new().arr(vt::U8, n).raw(&[7, 8, 9]))).header();
    let g = parse(at(3)).unwrap();
    assert_eq!(g.get_array("a").unwrap().len(), 3);
    assert_err!(at(4), GgufError::Truncated { what: "array length", needed: 4, .. });
    // Same for 8-byte elements: 16 bytes left.
    let at64 = |n: u64| Raw::new().kv(kv("a", vt::ARRAY, B::new().arr(vt::U64, n).raw(&[1; 16]))).header();
    assert_eq!(parse(at64(2)).unwrap().get_array("a").unwrap().len(), 2);
    assert_err!(at64(3), GgufError::Truncated { what: "array length", needed: 24, .. });
    // Nested: the inner array's length is absurd.
    let raw = Raw::new().kv(kv("a", vt::ARRAY, B::new().arr(vt::ARRAY, 1).arr(vt::U32, u64::MAX)));
    assert_err!(raw.build(), GgufError::AbsurdCount { what: "array length", .. });
    // A plausible count of strings whose first length is absurd.
    let raw = Raw::new().kv(kv("a", vt::ARRAY, B::new().arr(vt::STRING, 2).u64(u64::MAX).raw(&[0; 16])));
    assert_err!(raw.build(), GgufError::Truncated { what: "metadata string", .. });
}

#[test]
fn array_length_has_an_absolute_cap() {
    // 2^24 + 1 one-byte elements that really are in the file: every byte is a
    // valid u8, so only an absolute limit stops the reader from building a
    // 2^24-element Vec<Value> (32 bytes each) out of a corrupt length field.
    let n = (1u64 << 24) + 1;
    let mut f = Raw::new().kv(kv("a", vt::ARRAY, B::new().arr(vt::U8, n))).header();
    f.resize(f.len() + n as usize, 1);
    assert_err!(f, GgufError::AbsurdCount { what: "array length", value, .. } if value == n);
}

#[test]
fn plausible_counts_do_not_preallocate() {
    // 16 MiB of zeros behind a header claiming 2^20 kvs. The zeros decode as
    // kvs with an empty key, so the second one is a duplicate; the reader must
    // get there without first reserving room for a million entries.
    let mut f = Raw::new().n_kv(1 << 20).header();
    f.resize(16 << 20, 0);
    let (r, largest) = largest_alloc_during(|| Gguf::from_bytes(f));
    assert!(matches!(r, Err(GgufError::DuplicateKey(ref k)) if k.is_empty()), "{r:?}");
    assert!(largest < 4 << 20, "largest allocation {largest} bytes for a 2-entry parse");

    // Same for the tensor table: zeros decode as a tensor with 0 dimensions.
    let mut f = Raw::new().n_tensors(1 << 20).header();
    f.resize(32 << 20, 0);
    let (r, largest) = largest_alloc_during(|| Gguf::from_bytes(f));
    assert!(matches!(r, Err(GgufError::BadTensor { .. })), "{r:?}");
    assert!(largest < 4 << 20, "largest allocation {largest} bytes for a 1-entry parse");

    // And for arrays: 9 MiB of 0xFF after a string array claiming 2^20
    // elements (8 bytes each at least: they fit); the first string's length is absurd.
    let mut f = Raw::new().kv(kv("a", vt::ARRAY, B::new().arr(vt::STRING, 1 << 20))).header();
    f.resize(9 << 20, 0xFF);
    let (r, largest) = largest_alloc_during(|| Gguf::from_bytes(f));
    assert!(matches!(r, Err(GgufError::Truncated { .. })), "{r:?}");
    assert!(largest < 4 << 20, "largest allocation {largest} bytes for a 0-element parse");
}

#[test]
fn absurd_string_lengths() {
    let lens = [u64::MAX, u64::MAX - 30, 1 << 40, 1 << 63];
    for n in lens {
        // Key.
        let f = Raw::new().kv(B::new().u64(n).raw(b"abc").u32(vt::U8).u8(0).0).build();
        assert_err!(f, GgufError::Truncated { what: "metadata key", needed, .. } if needed == n);
        // String value.
        let f = Raw::new().kv(kv("k", vt::STRING, B::new().u64(n).raw(b"abc"))).build();
        assert_err!(f, GgufError::Truncated { what: "metadata string", .. });
        // Tensor name.
        let f = Raw::new().tensor(B::new().u64(n).raw(&[0; 40]).0).build();
        assert_err!(f, GgufError::Truncated { what: "tensor name", .. });
    }
    // One byte longer than what is left.
    let body = B::new().u64(4).raw(b"abc");
    let f = Raw::new().kv(kv("k", vt::STRING, body)).header();
    assert_err!(f, GgufError::Truncated { what: "metadata string", needed: 4, .. });
}

// ---------------------------------------------------------------------------
// Unknown types
// ---------------------------------------------------------------------------

#[test]
fn unknown_metadata_value_type() {
    for ty in [13, 14, 99, 0x8000_0000, u32::MAX] {
        let f = Raw::new().kv(kv("k", ty, B::new().u64(0))).build();
        assert_err!(f, GgufError::UnknownValueType(got) if got == ty);
        // As an array element type.
        let f = Raw::new().kv(kv("k", vt::ARRAY, B::new().arr(ty, 1).u64(0))).build();
        assert_err!(f, GgufError::UnknownValueType(got) if got == ty);
    }
}

#[test]
fn unknown_tensor_type() {
    // 4 and 5 were Q4_2/Q4_3 (removed); 10/11 are Q2_K/Q3_K, which tandem does not support.
    for ty in [4, 5, 10, 11, 99, 1000, u32::MAX] {
        let f = one_tensor(tinfo("w", &[32, 2], ty, 0), 1024);
        assert_err!(f, GgufError::UnknownTensorType { ref name, ty: got } if name == "w" && got == ty);
    }
}

// ---------------------------------------------------------------------------
// Tensor shapes
// ---------------------------------------------------------------------------

#[test]
fn bad_dimension_counts() {
    assert_err!(one_tensor(tinfo("t", &[], tt::F32, 0), 64), GgufError::BadTensor { ref name, .. } if name == "t");
    assert_err!(one_tensor(tinfo("t", &[1, 1, 1, 1, 1], tt::F32, 0), 64), GgufError::BadTensor { .. });
    // A huge dimension count with no dimensions behind it: rejected before
    // anything is read or reserved for the dims.
    for nd in [5, 1000, u32::MAX] {
        let f = one_tensor(tinfo_bytes(b"t", nd, &[], tt::F32, 0), 64);
        assert_err!(f, GgufError::BadTensor { .. });
    }
    // 4 dims is the maximum and fine.
    let g = parse(one_tensor(tinfo("t", &[2, 1, 3, 1], tt::F32, 0), 24)).unwrap();
    assert_eq!(g.tensors[0].dims, vec![2, 1, 3, 1]);
}

#[test]
fn zero_sized_dimension() {
    for dims in [&[0u64][..], &[4, 0], &[0, 4], &[32, 1, 0, 2]] {
        assert_err!(one_tensor(tinfo("t", dims, tt::F32, 0), 64), GgufError::BadTensor { .. });
    }
}

#[test]
fn dimension_product_overflow() {
    for dims in [
        &[1u64 << 32, 1 << 32][..],
        &[u64::MAX, 2],
        &[2, u64::MAX],
        &[u64::MAX],
        &[1 << 16, 1 << 16, 1 << 16, 1 << 16],
        &[1 << 25, 1 << 24], // 2^49: over the 2^48-element sanity limit
    ] {
        assert_err!(one_tensor(tinfo("t", dims, tt::F32, 0), 64), GgufError::BadTensor { .. });
        assert_err!(one_tensor(tinfo("t", dims, tt::Q8_0, 0), 64), GgufError::BadTensor { .. });
    }
    // 2^48 elements is accepted as a shape but its 2^50 bytes are not in the file.
    let e = assert_err!(one_tensor(tinfo("t", &[1 << 24, 1 << 24], tt::F32, 0), 64), GgufError::TensorOutOfBounds { .. });
    if let GgufError::TensorOutOfBounds { start, end, len, .. } = e {
        assert_eq!((start, end, len), (0, 1 << 50, 64));
    }
}

#[test]
fn row_length_not_a_multiple_of_the_block() {
    for (dims, ty) in [
        (&[33u64, 2][..], tt::Q8_0),
        (&[16], tt::Q8_0),
        (&[31, 1], tt::Q4_1),
        (&[48], tt::Q4_1),
        (&[128, 4], tt::Q4_K),
        (&[255], tt::Q4_K),
        (&[257, 1], tt::Q4_K),
    ] {
        let e = assert_err!(one_tensor(tinfo("t", dims, ty, 0), 4096), GgufError::BadTensor { .. });
        assert!(e.to_string().contains("block"), "{e}");
    }
    // The non-contiguous dims need no block alignment.
    let g = parse(one_tensor(tinfo("t", &[32, 3], tt::Q8_0, 0), 3 * 34)).unwrap();
    assert_eq!(g.tensors[0].size, 102);
    let g = parse(one_tensor(tinfo("t", &[256, 3], tt::Q4_K, 0), 3 * 144)).unwrap();
    assert_eq!(g.tensors[0].size, 432);
    let g = parse(one_tensor(tinfo("t", &[64, 5], tt::Q4_1, 0), 5 * 40)).unwrap();
    assert_eq!(g.tensors[0].size, 200);
}

// ---------------------------------------------------------------------------
// Tensor offsets
// ---------------------------------------------------------------------------

#[test]
fn tensor_offset_past_the_end() {
    // F32 [16] = 64 bytes.
    let t = |off| tinfo("t", &[16], tt::F32, off);
    assert!(parse(one_tensor(t(0), 64)).is_ok());
    let e = assert_err!(one_tensor(t(0), 63), GgufError::TensorOutOfBounds { .. });
    assert!(matches!(e, GgufError::TensorOutOfBounds { start: 0, end: 64, len: 63, .. }), "{e:?}");
    assert_err!(one_tensor(t(32), 64), GgufError::TensorOutOfBounds { start: 32, end: 96, len: 64, .. });
    assert_err!(one_tensor(t(64), 64), GgufError::TensorOutOfBounds { .. });
    assert_err!(one_tensor(t(1 << 40), 64), GgufError::TensorOutOfBounds { .. });
    // No data section at all (file ends inside the header padding or right after it).
    let raw = Raw::new().tensor(t(0));
    assert_err!(raw.header(), GgufError::TensorOutOfBounds { .. });
    assert_err!(raw.build(), GgufError::TensorOutOfBounds { len: 0, .. });
    // The second of two tensors is the one out of bounds.
    let f = Raw::new().tensor(tinfo("a", &[8], tt::F32, 0)).tensor(tinfo("b", &[8], tt::F32, 32)).data_len(63).build();
    assert_err!(f, GgufError::TensorOutOfBounds { ref name, .. } if name == "b");
}

#[test]
fn tensor_offset_plus_size_overflows() {
    for off in [u64::MAX - 31, u64::MAX - 63, 1 << 63, (1 << 63) + 32] {
        let e = assert_err!(one_tensor(tinfo("t", &[16], tt::F32, off), 64), GgufError::TensorOutOfBounds { .. });
        if let GgufError::TensorOutOfBounds { start, end, .. } = e {
            assert_eq!(start, off);
            assert!(end >= start, "end is saturated, not wrapped");
        }
    }
    // Large size and large offset together.
    let f = one_tensor(tinfo("t", &[1 << 24, 1 << 24], tt::F32, 1 << 62), 64);
    assert_err!(f, GgufError::TensorOutOfBounds { .. });
}

#[test]
fn misaligned_tensor_offset() {
    for off in [1, 4, 16, 31, 33, u64::MAX] {
        let f = one_tensor(tinfo("t", &[4], tt::F32, off), 4096);
        assert_err!(f, GgufError::MisalignedTensor { ref name, offset, alignment: 32 } if name == "t" && offset == off);
    }
    // With a custom alignment of 64, 32 is misaligned.
    let f = Raw::new().align(64).kv(kv_u32("general.alignment", 64)).tensor(tinfo("t", &[4], tt::F32, 32)).data_len(128).build();
    assert_err!(f, GgufError::MisalignedTensor { offset: 32, alignment: 64, .. });
}

// ---------------------------------------------------------------------------
// Alignment metadata
// ---------------------------------------------------------------------------

#[test]
fn bad_alignment_values() {
    let with = |e: Vec<u8>| Raw::new().kv(e).tensor(tinfo("t", &[4], tt::F32, 0)).data_len(16).build();
    for a in [0u32, 3, 6, 48, 96, 1 << 17, u32::MAX] {
        assert_err!(with(kv_u32("general.alignment", a)), GgufError::BadAlignment(got) if got == a as u64);
    }
    for a in [0u64, 3, u64::MAX, 1 << 63, 1 << 32] {
        let e = kv("general.alignment", vt::U64, B::new().u64(a));
        assert_err!(with(e), GgufError::BadAlignment(got) if got == a);
    }
    // Non-integer types.
    for (ty, payload) in [
        (vt::F32, B::new().f32(32.0)),
        (vt::F64, B::new().u64(32f64.to_bits())),
        (vt::STRING, B::new().str("32")),
        (vt::I32, B::new().i32(-32)),
        (vt::I8, B::new().u8(0x80)),
        (vt::BOOL, B::new().u8(1)),
        (vt::ARRAY, B::new().arr(vt::U32, 1).u32(32)),
    ] {
        let e = kv("general.alignment", ty, payload);
        assert_err!(with(e), GgufError::WrongType { ref key, .. } if key == "general.alignment");
    }
    // Duplicate alignment keys are a duplicate-key error.
    let f = Raw::new().kv(kv_u32("general.alignment", 32)).kv(kv_u32("general.alignment", 64)).build();
    assert_err!(f, GgufError::DuplicateKey(ref k) if k == "general.alignment");
}

// ---------------------------------------------------------------------------
// Duplicates, UTF-8, nesting
// ---------------------------------------------------------------------------

#[test]
fn duplicate_keys() {
    let f = Raw::new().kv(kv_u32("a", 1)).kv(kv_u32("b", 2)).kv(kv_u32("a", 1)).build();
    assert_err!(f, GgufError::DuplicateKey(ref k) if k == "a");
    // Different types under the same key.
    let f = Raw::new().kv(kv_u32("a", 1)).kv(kv("a", vt::STRING, B::new().str("x"))).build();
    assert_err!(f, GgufError::DuplicateKey(_));
    // Empty key twice.
    let f = Raw::new().kv(kv_u32("", 1)).kv(kv_u32("", 1)).build();
    assert_err!(f, GgufError::DuplicateKey(ref k) if k.is_empty());
}

#[test]
fn duplicate_tensor_names() {
    let f = Raw::new()
        .tensor(tinfo("w", &[8], tt::F32, 0))
        .tensor(tinfo("x", &[8], tt::F32, 32))
        .tensor(tinfo("w", &[8], tt::F32, 64))
        .data_len(96)
        .build();
    assert_err!(f, GgufError::DuplicateTensor(ref n) if n == "w");
}

const BAD_UTF8: [&[u8]; 6] = [
    b"\xff\xfe",
    b"abc\x80",
    b"\xc0\xaf",         // overlong '/'
    b"\xed\xa0\x80",     // UTF-16 surrogate
    b"\xe2\x82",         // truncated sequence
    b"\xf4\x90\x80\x80", // above U+10FFFF
];

#[test]
fn invalid_utf8_in_key() {
    for bad in BAD_UTF8 {
        let f = Raw::new().kv(kv_bytes(bad, vt::U32, B::new().u32(1))).build();
        // The key's bytes start right after the 24-byte header and its 8-byte length.
        assert_err!(f, GgufError::BadUtf8(32));
    }
}

#[test]
fn invalid_utf8_elsewhere() {
    for bad in BAD_UTF8 {
        // String value.
        let f = Raw::new().kv(kv("k", vt::STRING, B::new().bstr(bad))).build();
        assert_err!(f, GgufError::BadUtf8(at) if at == 24 + 8 + 1 + 4 + 8);
        // String array element.
        let f = Raw::new().kv(kv("k", vt::ARRAY, B::new().arr(vt::STRING, 2).str("ok").bstr(bad))).build();
        assert_err!(f, GgufError::BadUtf8(_));
        // Tensor name.
        let f = Raw::new().tensor(tinfo_bytes(bad, 1, &[4], tt::F32, 0)).data_len(16).build();
        assert_err!(f, GgufError::BadUtf8(32));
    }
}

#[test]
fn array_nesting_limit() {
    // n levels of single-element arrays around one u8.
    let nested = |levels: usize| {
        let mut b = B::new();
        for i in 0..levels {
            b = b.arr(if i + 1 == levels { vt::U8 } else { vt::ARRAY }, 1);
        }
        Raw::new().kv(kv("k", vt::ARRAY, b.u8(5))).build()
    };
    assert!(parse(nested(4)).is_ok());
    assert_err!(nested(5), GgufError::AbsurdCount { what: "array nesting depth", .. });
    // Very deep nesting must not recurse without bound (stack overflow).
    assert_err!(nested(100_000), GgufError::AbsurdCount { what: "array nesting depth", .. });
}

#[test]
fn odd_but_harmless_inputs() {
    // Bool bytes other than 0/1 are read leniently as true.
    let g = parse(Raw::new().kv(kv("b", vt::BOOL, B::new().u8(7))).build()).unwrap();
    assert_eq!(g.get("b").unwrap().as_bool(), Some(true));
    // Tensor count 0 with tensor entries present: the entries are just bytes.
    let f = Raw::new().n_tensors(0).tensor(tinfo("t", &[4], tt::F32, 0)).data_len(16).build();
    assert!(parse(f).unwrap().tensors.is_empty());
    // NaN survives as NaN.
    let g = parse(Raw::new().kv(kv("f", vt::F32, B::new().f32(f32::NAN))).build()).unwrap();
    assert!(g.get_f64("f").unwrap().is_nan());
}

#[test]
fn absurd_counts_are_rejected_without_allocating_for_them() {
    // Every kind of absurd count above, at four sizes: each parse fails with a
    // typed error, and `parse_err` bounds its largest allocation by the input
    // size, so no count is believed before the bytes behind it are there.
    for n in [u64::MAX, 1 << 40, 1 << 32, 1 << 20] {
        for f in [
            Raw::new().n_kv(n).build(),
            Raw::new().n_tensors(n).build(),
            Raw::new().kv(kv("a", vt::ARRAY, B::new().arr(vt::U8, n))).build(),
            Raw::new().kv(kv("a", vt::STRING, B::new().u64(n))).build(),
            Raw::new().kv(B::new().u64(n).0).build(),
        ] {
            parse_err(f);
        }
    }
}
