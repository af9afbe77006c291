//! Writer -> reader round trips: every metadata value type, several tensor
//! types, v2 files, custom alignments, the mmap path, and agreement between the
//! writer and a hand-built image.

#[macro_use]
mod common;

use common::*;
use tandem_gguf::{GgmlType, Gguf, GgufError, GgufWriter, TensorData, Value, ValueType, DEFAULT_ALIGNMENT};

/// Compare a parsed file against the sample metadata (plus `extra`) and tensors.
fn check_sample(g: &Gguf, extra: &[(&str, Value)]) {
    let mut want = sample_metadata();
    for (k, v) in extra {
        match want.iter_mut().find(|(wk, _)| wk == k) {
            Some(slot) => slot.1 = v.clone(),
            None => want.push((k.to_string(), v.clone())),
        }
    }
    // Same keys, same order, same values (including array element types).
    assert_eq!(g.metadata.len(), want.len());
    for ((gk, gv), (wk, wv)) in g.metadata.iter().zip(&want) {
        assert_eq!(gk, wk);
        assert_eq!(gv, wv, "value of {gk}");
        assert_eq!(gv.value_type(), wv.value_type());
        assert_eq!(g.get(wk), Some(wv), "lookup of {wk}");
    }

    let want_t = sample_tensors();
    assert_eq!(g.tensors.len(), want_t.len());
    let mut prev_end = 0;
    for (t, w) in g.tensors.iter().zip(&want_t) {
        assert_eq!(t.name, w.name);
        assert_eq!(t.dims, w.dims);
        assert_eq!(t.ty, w.ty);
        assert_eq!(t.size, w.data.len() as u64);
        assert_eq!(t.n_elements(), w.dims.iter().product::<u64>());
        assert_eq!(t.ne0(), w.dims[0]);
        assert_eq!(t.n_rows(), w.dims[1..].iter().product::<u64>());
        assert_eq!(t.offset % g.alignment, 0, "{} misaligned", t.name);
        assert!(t.offset >= prev_end, "tensors overlap");
        prev_end = t.offset + t.size;
        assert_eq!(g.tensor_data(t), &w.data[..], "data of {}", t.name);
        let (ti, d) = g.tensor(&w.name).unwrap();
        assert_eq!(ti.name, w.name);
        assert_eq!(d, &w.data[..]);
        assert_eq!(g.tensor_info(&w.name).unwrap().offset, t.offset);
    }
    // The writer puts the last tensor's last byte at the end of the file.
    assert_eq!(g.data_offset() + prev_end, g.file_size());
    check_tensor_bounds(g);
}

#[test]
fn roundtrip_every_value_type_and_tensor_type() {
    let bytes = sample_file();
    let g = parse(bytes.clone()).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.alignment, DEFAULT_ALIGNMENT);
    assert_eq!(g.file_size(), bytes.len() as u64);
    assert_eq!(g.bytes(), &bytes[..]);
    check_sample(&g, &[]);
}

#[test]
fn typed_getters() {
    let g = parse(sample_file()).unwrap();
    assert_eq!(g.get_u64("t.u8").unwrap(), 0xFE);
    assert_eq!(g.get_u64("t.u16").unwrap(), 0xBEEF);
    assert_eq!(g.get_u64("t.u32").unwrap(), 0xDEAD_BEEF);
    assert_eq!(g.get_u64("t.u64").unwrap(), u64::MAX);
    assert_eq!(g.get_f64("t.f64").unwrap(), std::f64::consts::PI);
    assert_eq!(g.get_f64("t.f32").unwrap(), -1.5e-3f32 as f64);
    assert_eq!(g.get_f64("t.i8").unwrap(), -7.0);
    assert_eq!(g.get_str("t.string").unwrap(), "héllo wörld ✓ 🦀");
    assert_eq!(g.get_str("t.string.empty").unwrap(), "");
    assert_eq!(g.get_array("t.arr.string").unwrap().len(), 3);
    assert!(g.get_array("t.arr.empty.u32").unwrap().is_empty());
    assert_eq!(g.get("t.bool.true").unwrap().as_bool(), Some(true));
    assert_eq!(g.get("t.i64").unwrap().as_i64(), Some(i64::MIN + 1));
    assert_eq!(g.get_array("t.arr.nested").unwrap()[0].as_array().unwrap().len(), 2);

    // Wrong type / missing key / missing tensor are typed errors too.
    assert!(matches!(g.get_u64("t.i8"), Err(GgufError::WrongType { .. })), "negative i8 is not a u64");
    assert!(matches!(g.get_u64("t.string"), Err(GgufError::WrongType { found: "string", .. })));
    assert!(matches!(g.get_str("t.u32"), Err(GgufError::WrongType { expected: "string", .. })));
    assert!(matches!(g.get_f64("t.arr.u8"), Err(GgufError::WrongType { .. })));
    assert!(matches!(g.get_array("t.f64"), Err(GgufError::WrongType { .. })));
    assert!(matches!(g.get_u64("nope"), Err(GgufError::MissingKey(k)) if k == "nope"));
    assert!(matches!(g.get_str("nope"), Err(GgufError::MissingKey(_))));
    assert!(g.get("nope").is_none());
    assert!(g.tensor_info("nope").is_none());
    assert!(matches!(g.tensor("nope"), Err(GgufError::MissingTensor(n)) if n == "nope"));
}

#[test]
fn roundtrip_through_a_file_with_mmap() {
    let path = temp_path("mmap");
    sample_writer(&[]).write_to(&path).unwrap();
    let on_disk = std::fs::read(&path).unwrap();
    assert_eq!(on_disk, sample_file(), "write_to and to_bytes disagree");
    let g = Gguf::open(&path).unwrap();
    assert_eq!(g.version, 3);
    check_sample(&g, &[]);
    drop(g);
    std::fs::remove_file(&path).unwrap();
    // write_to's temporary file did not linger.
    assert!(!path.with_extension("gguf.tmp").exists());
}

#[test]
fn version_2_reads_the_same() {
    let mut bytes = sample_file();
    assert_eq!(&bytes[4..8], &3u32.to_le_bytes());
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    let g = parse(bytes).unwrap();
    assert_eq!(g.version, 2);
    check_sample(&g, &[]);
}

#[test]
fn custom_alignments() {
    let cases = [Value::U32(64), Value::U64(128), Value::U8(16), Value::U16(256), Value::I32(8), Value::U32(1), Value::U32(65536)];
    for a in cases {
        let want = a.as_u64().unwrap();
        let extra = [("general.alignment", a.clone())];
        let bytes = sample_writer(&extra).to_bytes().unwrap();
        let g = parse(bytes).unwrap_or_else(|e| panic!("alignment {a:?}: {e}"));
        assert_eq!(g.alignment, want);
        assert_eq!(g.data_offset() % want, 0);
        check_sample(&g, &extra);
    }
    // With alignment 64 the data section and every tensor land on 64-byte boundaries,
    // which is stricter than the default: the offsets must differ from the default file.
    let g64 = parse(sample_writer(&[("general.alignment", Value::U32(64))]).to_bytes().unwrap()).unwrap();
    let g32 = parse(sample_file()).unwrap();
    let offs = |g: &Gguf| g.tensors.iter().map(|t| t.offset).collect::<Vec<_>>();
    assert_ne!(offs(&g64), offs(&g32));
    assert!(offs(&g64).iter().all(|o| o % 64 == 0));
}

#[test]
fn alignment_1_allows_any_offset() {
    // Hand-built: alignment 1, tensors packed back to back at odd offsets.
    let bytes = Raw::new()
        .align(1)
        .kv(kv_u32("general.alignment", 1))
        .tensor(tinfo("a", &[3], tt::F16, 0)) // 6 bytes
        .tensor(tinfo("b", &[1], tt::F32, 6)) // 4 bytes at offset 6
        .tensor(tinfo("c", &[1], tt::F16, 10)) // 2 bytes at 10
        .data((0u8..12).collect())
        .build();
    let g = parse(bytes).unwrap();
    assert_eq!(g.alignment, 1);
    assert_eq!(g.tensor("b").unwrap().1, &[6, 7, 8, 9]);
    assert_eq!(g.tensor("c").unwrap().1, &[10, 11]);
    check_tensor_bounds(&g);
}

#[test]
fn hand_built_image_matches_writer_output() {
    // The same small file, once through GgufWriter and once through the raw
    // builder the malformed-input tests use: byte-identical.
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()));
    w.set("n", Value::U32(7));
    w.set("arr", Value::Array(ValueType::String, vec![Value::String("ab".into()), Value::String("c".into())]));
    let q = pattern(9, 34 * 2);
    let f = pattern(10, 4 * 3);
    w.add_tensor(TensorData { name: "q".into(), dims: vec![32, 2], ty: GgmlType::Q8_0, data: q.clone() }).unwrap();
    w.add_tensor(TensorData { name: "f".into(), dims: vec![3, 1], ty: GgmlType::F32, data: f.clone() }).unwrap();
    let from_writer = w.to_bytes().unwrap();

    let mut data = q.clone();
    data.resize(96, 0); // next tensor offset: 68 rounded up to 96
    data.extend_from_slice(&f);
    let by_hand = Raw::new()
        .kv(kv("general.architecture", vt::STRING, B::new().str("llama")))
        .kv(kv_u32("n", 7))
        .kv(kv("arr", vt::ARRAY, B::new().arr(vt::STRING, 2).str("ab").str("c")))
        .tensor(tinfo("q", &[32, 2], tt::Q8_0, 0))
        .tensor(tinfo("f", &[3, 1], tt::F32, 96))
        .data(data)
        .build();
    assert_eq!(from_writer, by_hand);
    let g = parse(by_hand).unwrap();
    assert_eq!(g.tensor("q").unwrap().1, &q[..]);
    assert_eq!(g.tensor("f").unwrap().1, &f[..]);
}

#[test]
fn data_section_starts_at_next_alignment_boundary() {
    // Header length 24 + key entry; pick a key so the header ends mid-block.
    let raw = Raw::new()
        .kv(kv_u32("k", 1)) // 8 + 1 + 4 + 4 = 17 bytes -> header 41 bytes
        .tensor(tinfo("t", &[2], tt::F32, 0)) // +8+1+4+8+4+8 = 33 -> 74 bytes
        .data(vec![1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(raw.header().len(), 74);
    let g = parse(raw.build()).unwrap();
    assert_eq!(g.data_offset(), 96);
    assert_eq!(g.tensor("t").unwrap().1, &[1, 2, 3, 4, 5, 6, 7, 8]);
}

#[test]
fn header_ending_exactly_on_boundary_needs_no_padding() {
    // 24 header + kv (8 + klen + 4 + 4) + tensor info "tttt" (8+4+4+8+4+8 = 36) = 96  =>  klen = 20
    let key = "k".repeat(20);
    let raw = Raw::new().kv(kv_u32(&key, 1)).tensor(tinfo("tttt", &[1], tt::F32, 0)).data(vec![9, 9, 9, 9]);
    assert_eq!(raw.header().len(), 96);
    let g = parse(raw.build()).unwrap();
    assert_eq!(g.data_offset(), 96);
    assert_eq!(g.file_size(), 100);
}

#[test]
fn trailing_bytes_after_the_last_tensor_are_allowed() {
    let mut bytes = sample_file();
    bytes.extend_from_slice(&[0xEE; 1000]);
    let g = parse(bytes).unwrap();
    check_sample_tensors_only(&g);
}

fn check_sample_tensors_only(g: &Gguf) {
    for w in sample_tensors() {
        assert_eq!(g.tensor(&w.name).unwrap().1, &w.data[..]);
    }
    check_tensor_bounds(g);
}

#[test]
fn no_tensors_and_no_metadata() {
    let g = parse(Raw::new().build()).unwrap();
    assert!(g.metadata.is_empty() && g.tensors.is_empty());
    // The bare 24-byte header (no padding at all) is a valid empty file too.
    let g = parse(Raw::new().header()).unwrap();
    assert_eq!(g.file_size(), 24);
    let g = parse(GgufWriter::new().to_bytes().unwrap()).unwrap();
    assert!(g.tensors.is_empty());
}

#[test]
fn writer_rejects_bad_input_with_typed_errors() {
    let mut w = GgufWriter::new();
    let td = |dims: &[u64], ty, n| TensorData { name: "x".into(), dims: dims.to_vec(), ty, data: vec![0; n] };
    for bad in [
        td(&[], GgmlType::F32, 0),
        td(&[1, 1, 1, 1, 1], GgmlType::F32, 4),
        td(&[0, 4], GgmlType::F32, 0),
        td(&[33], GgmlType::Q8_0, 34),
        td(&[4], GgmlType::F32, 15),
        td(&[4], GgmlType::F32, 17),
    ] {
        assert!(matches!(w.add_tensor(bad), Err(GgufError::Write(_))));
    }
    w.add_tensor(td(&[4], GgmlType::F32, 16)).unwrap();
    assert!(matches!(w.add_tensor(td(&[4], GgmlType::F32, 16)), Err(GgufError::Write(_))), "duplicate name");

    let mut w = GgufWriter::new();
    w.set("mixed", Value::Array(ValueType::U8, vec![Value::U8(1), Value::I8(1)]));
    assert!(matches!(w.to_bytes(), Err(GgufError::Write(_))));

    // set() replaces rather than duplicating a key.
    let mut w = GgufWriter::new();
    w.set("a", Value::U8(1)).set("a", Value::U8(2));
    let g = parse(w.to_bytes().unwrap()).unwrap();
    assert_eq!(g.metadata, vec![("a".to_string(), Value::U8(2))]);
}

#[test]
fn writer_never_produces_a_file_the_reader_rejects_over_alignment() {
    // Whatever general.alignment is set to, the writer either refuses or
    // produces a file the reader accepts with the same alignment.
    let cases = [
        Value::U32(0),
        Value::U32(3),
        Value::U32(48),
        Value::U32(1 << 17),
        Value::U64(1 << 40),
        Value::I32(-32),
        Value::F32(32.0),
        Value::String("32".into()),
        Value::Bool(true),
        Value::Array(ValueType::U32, vec![Value::U32(32)]),
        Value::U32(32),
        Value::U16(2),
    ];
    for a in cases {
        let w = sample_writer(&[("general.alignment", a.clone())]);
        match w.to_bytes() {
            Err(e) => assert!(
                matches!(e, GgufError::BadAlignment(_) | GgufError::WrongType { .. } | GgufError::Write(_)),
                "alignment {a:?}: unexpected writer error {e:?}"
            ),
            Ok(bytes) => {
                let g = parse(bytes).unwrap_or_else(|e| panic!("writer accepted alignment {a:?} but reader says {e}"));
                assert_eq!(Some(g.alignment), a.as_u64());
            }
        }
    }
}

/// `rewrite` with no edit gives a file that reads back as the original; an
/// edit changes exactly what it touched; a broken edit is an error, not a
/// panic.
#[test]
fn rewrite_keeps_what_it_does_not_touch() {
    let bytes = sample_file();
    let same = tandem_gguf::rewrite(&bytes, |_, _| {}).unwrap();
    check_sample(&parse(same).unwrap(), &[]);

    let first = sample_tensors()[0].name.clone();
    let edited = tandem_gguf::rewrite(&bytes, |meta, tensors| {
        meta.push(("test.added".into(), Value::U32(7)));
        tensors.retain(|t| t.name != first);
    })
    .unwrap();
    let g = parse(edited).unwrap();
    assert_eq!(g.get("test.added"), Some(&Value::U32(7)));
    assert_eq!(g.metadata.len(), sample_metadata().len() + 1);
    assert!(g.tensor_info(&first).is_none());
    assert_eq!(g.tensors.len(), sample_tensors().len() - 1);

    let broken = tandem_gguf::rewrite(&bytes, |_, tensors| tensors[0].data.pop().map(drop).unwrap_or(()));
    assert!(matches!(broken, Err(GgufError::Write(_))), "{broken:?}");
    assert!(tandem_gguf::rewrite(&bytes[..bytes.len() / 2], |_, _| {}).is_err());
}
