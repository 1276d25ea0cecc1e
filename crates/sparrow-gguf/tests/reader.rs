//! sparrow-gguf against files we build (every value type, both versions, hostile variants)
//! and against the real Qwen2.5 GGUF as read by the `gguf` Python package.

use sparrow_gguf::{GgmlType, GgufError, GgufFile, GgufWriter, Value};

fn sample() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.meta("general.architecture", Value::String("llama".into()))
        .meta("u8", Value::U8(200))
        .meta("i8", Value::I8(-5))
        .meta("u16", Value::U16(60000))
        .meta("i16", Value::I16(-30000))
        .meta("u32", Value::U32(4_000_000_000))
        .meta("i32", Value::I32(-2_000_000_000))
        .meta("f32", Value::F32(1.5))
        .meta("bool", Value::Bool(true))
        .meta("u64", Value::U64(u64::MAX))
        .meta("i64", Value::I64(i64::MIN))
        .meta("f64", Value::F64(-2.25))
        .meta("unicode", Value::String("héllo ✓ 你好".into()))
        .meta(
            "strs",
            Value::Array(vec![Value::String("a".into()), Value::String("".into())]),
        )
        .meta("ints", Value::Array(vec![Value::I32(1), Value::I32(-7)]))
        .meta(
            "nested",
            Value::Array(vec![Value::Array(vec![Value::U8(1)]), Value::Array(vec![])]),
        );
    w.tensor_f32("a", &[4, 2], &[0., 1., 2., 3., 4., 5., 6., 7.]);
    w.tensor_f32("b", &[3], &[9., 8., 7.]);
    w.tensor("q", &[32, 2], GgmlType::Q8_0, vec![7u8; 68]);
    w
}

#[test]
fn round_trips_every_value_type_in_both_versions() {
    for version in [2, 3] {
        let f = GgufFile::from_bytes(sample().to_bytes(version)).unwrap();
        assert_eq!(f.version(), version);
        let m = f.metadata();
        assert_eq!(m.get_str("general.architecture").unwrap(), "llama");
        assert_eq!(m.get("u8"), Some(&Value::U8(200)));
        assert_eq!(m.get("i8"), Some(&Value::I8(-5)));
        assert_eq!(m.get("u16"), Some(&Value::U16(60000)));
        assert_eq!(m.get("i16"), Some(&Value::I16(-30000)));
        assert_eq!(m.get_u32("u32").unwrap(), 4_000_000_000);
        assert_eq!(m.get_i64("i32").unwrap(), -2_000_000_000);
        assert_eq!(m.get_f32("f32").unwrap(), 1.5);
        assert!(m.get_bool("bool").unwrap());
        assert_eq!(m.get_u64("u64").unwrap(), u64::MAX);
        assert_eq!(m.get_i64("i64").unwrap(), i64::MIN);
        assert_eq!(m.get("f64"), Some(&Value::F64(-2.25)));
        assert_eq!(m.get_str("unicode").unwrap(), "héllo ✓ 你好");
        assert_eq!(m.get_str_array("strs").unwrap(), vec!["a", ""]);
        assert_eq!(m.get_i32_array("ints").unwrap(), vec![1, -7]);
        assert_eq!(m.get_array("nested").unwrap().len(), 2);

        let a = f.require_tensor("a").unwrap();
        assert_eq!(a.dims, vec![4, 2]);
        assert_eq!(a.n_rows(), 2);
        assert_eq!(a.offset % f.alignment(), 0);
        let floats: Vec<f32> = f
            .tensor_data(a)
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(floats, vec![0., 1., 2., 3., 4., 5., 6., 7.]);
        let b = f.require_tensor("b").unwrap();
        assert_eq!(f.tensor_data(b).len(), 12);
        let q = f.require_tensor("q").unwrap();
        assert_eq!((q.ty, q.size), (GgmlType::Q8_0, 68));
        assert!(f.tensor_data(q).iter().all(|&x| x == 7));
    }
}

#[test]
fn typed_accessors_name_the_key() {
    let f = GgufFile::from_bytes(sample().to_bytes(3)).unwrap();
    let m = f.metadata();
    let e = m.get_str("u8").unwrap_err().to_string();
    assert!(e.contains("'u8'") && e.contains("string"), "{e}");
    let e = m.get_u32("missing.key").unwrap_err().to_string();
    assert!(e.contains("missing.key"), "{e}");
    let e = m.get_u32("i8").unwrap_err().to_string();
    assert!(e.contains("-5") && e.contains("u32"), "{e}");
    assert!(matches!(
        f.require_tensor("nope"),
        Err(GgufError::MissingTensor(_))
    ));
}

#[test]
fn custom_alignment_is_honoured() {
    let mut w = sample();
    w.meta("general.alignment", Value::U32(64));
    let f = GgufFile::from_bytes(w.to_bytes(3)).unwrap();
    assert_eq!(f.alignment(), 64);
    for t in f.tensors() {
        assert_eq!((t.offset - f.data_offset()) % 64, 0);
    }
    let mut w = sample();
    w.meta("general.alignment", Value::U32(48));
    let err = GgufFile::from_bytes(w.to_bytes(3)).err().unwrap();
    assert!(matches!(err, GgufError::BadAlignment(48)), "{err}");
}

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    let bytes = sample().to_bytes(3);
    for len in 0..bytes.len() {
        let r = GgufFile::from_bytes(bytes[..len].to_vec());
        assert!(r.is_err(), "a file cut at {len} bytes was accepted");
    }
    let err = GgufFile::from_bytes(bytes[..bytes.len() - 1].to_vec())
        .err()
        .unwrap();
    assert!(
        matches!(err, GgufError::TensorOutOfBounds { ref tensor, .. } if tensor == "q"),
        "{err}"
    );
}

/// Byte offset of the tensor-table entry field of the tensor named `name`: we find the name
/// in the image and step over it.
fn after_name(bytes: &[u8], name: &str) -> usize {
    let mut pat = (name.len() as u64).to_le_bytes().to_vec();
    pat.extend_from_slice(name.as_bytes());
    let at = bytes
        .windows(pat.len())
        .rposition(|w| w == pat.as_slice())
        .expect("name in image");
    at + pat.len()
}

#[test]
fn hostile_tensor_entries_are_refused() {
    let base = sample().to_bytes(3);
    // Tensor "b": n_dims (u32) then dims (one u64) then type (u32) then offset (u64).
    let p = after_name(&base, "b");

    let mut bytes = base.clone();
    bytes[p + 12..p + 16].copy_from_slice(&77u32.to_le_bytes());
    let e = GgufFile::from_bytes(bytes).err().unwrap();
    assert!(
        matches!(e, GgufError::UnknownTensorType { id: 77, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("'b'"));

    let mut bytes = base.clone();
    bytes[p + 16..p + 24].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let e = GgufFile::from_bytes(bytes).err().unwrap();
    assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "{e}");

    let mut bytes = base.clone();
    bytes[p + 16..p + 24].copy_from_slice(&u64::MAX.to_le_bytes());
    let e = GgufFile::from_bytes(bytes).err().unwrap();
    assert!(
        matches!(
            e,
            GgufError::MisalignedTensor { .. } | GgufError::TensorOutOfBounds { .. }
        ),
        "{e}"
    );

    let mut bytes = base.clone();
    bytes[p + 16..p + 24].copy_from_slice(&(u64::MAX - 31).to_le_bytes());
    let e = GgufFile::from_bytes(bytes).err().unwrap();
    assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "{e}");

    let mut bytes = base.clone();
    bytes[p + 16..p + 24].copy_from_slice(&3u64.to_le_bytes());
    let e = GgufFile::from_bytes(bytes).err().unwrap();
    assert!(matches!(e, GgufError::MisalignedTensor { .. }), "{e}");

    let mut bytes = base.clone();
    bytes[p + 4..p + 12].copy_from_slice(&u64::MAX.to_le_bytes());
    let e = GgufFile::from_bytes(bytes).err().unwrap();
    assert!(
        matches!(
            e,
            GgufError::ShapeOverflow { .. } | GgufError::TensorOutOfBounds { .. }
        ),
        "{e}"
    );

    let mut bytes = base.clone();
    bytes[p..p + 4].copy_from_slice(&9u32.to_le_bytes());
    let e = GgufFile::from_bytes(bytes).err().unwrap();
    assert!(matches!(e, GgufError::TooManyDims { n_dims: 9, .. }), "{e}");
}

#[test]
fn shape_product_overflow_is_refused() {
    let mut w = GgufWriter::new();
    w.tensor("big", &[1 << 32, 1 << 32, 1 << 4], GgmlType::F32, vec![]);
    let e = GgufFile::from_bytes(w.to_bytes(3)).err().unwrap();
    assert!(
        matches!(e, GgufError::ShapeOverflow { ref tensor, .. } if tensor == "big"),
        "{e}"
    );
    // A product that fits u64 but whose byte size does not.
    let mut w = GgufWriter::new();
    w.tensor("big", &[1 << 62, 2], GgmlType::F32, vec![]);
    let e = GgufFile::from_bytes(w.to_bytes(3)).err().unwrap();
    assert!(matches!(e, GgufError::ShapeOverflow { .. }), "{e}");
    // Rows that are not whole blocks.
    let mut w = GgufWriter::new();
    w.tensor("odd", &[33], GgmlType::Q8_0, vec![0; 34]);
    let e = GgufFile::from_bytes(w.to_bytes(3)).err().unwrap();
    assert!(matches!(e, GgufError::PartialBlock { .. }), "{e}");
}

#[test]
fn hostile_headers_are_refused() {
    let base = sample().to_bytes(3);
    let mut bytes = base.clone();
    bytes[0] = b'X';
    assert!(matches!(
        GgufFile::from_bytes(bytes),
        Err(GgufError::BadMagic { .. })
    ));
    for v in [1u32, 4, 0x0300_0000] {
        let mut bytes = base.clone();
        bytes[4..8].copy_from_slice(&v.to_le_bytes());
        let e = GgufFile::from_bytes(bytes).err().unwrap();
        assert!(
            matches!(e, GgufError::UnsupportedVersion(x) if x == v),
            "{e}"
        );
    }
    // Absurd tensor and metadata counts must not allocate or loop for ages.
    let mut bytes = base.clone();
    bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(GgufFile::from_bytes(bytes).is_err());
    let mut bytes = base.clone();
    bytes[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(GgufFile::from_bytes(bytes).is_err());
}

#[test]
fn hostile_metadata_is_refused() {
    // An array claiming 2^60 elements.
    let mut w = GgufWriter::new();
    w.meta("arr", Value::Array(vec![Value::U32(1)]));
    let mut bytes = w.to_bytes(3);
    let p = after_name(&bytes, "arr") + 4 + 4; // value type, element type
    bytes[p..p + 8].copy_from_slice(&(1u64 << 60).to_le_bytes());
    let e = GgufFile::from_bytes(bytes).err().unwrap();
    assert!(matches!(e, GgufError::ArrayTooLong { .. }), "{e}");

    // Unknown value type.
    let mut bytes = w.to_bytes(3);
    let p = after_name(&bytes, "arr");
    bytes[p..p + 4].copy_from_slice(&99u32.to_le_bytes());
    let e = GgufFile::from_bytes(bytes).err().unwrap();
    assert!(
        matches!(e, GgufError::UnknownValueType { ty: 99, .. }),
        "{e}"
    );

    // A string that is not UTF-8.
    let mut w = GgufWriter::new();
    w.meta("s", Value::String("abc".into()));
    let mut bytes = w.to_bytes(3);
    let at = bytes.windows(3).position(|x| x == b"abc").unwrap();
    bytes[at + 1] = 0xff;
    let e = GgufFile::from_bytes(bytes).err().unwrap();
    assert!(matches!(e, GgufError::InvalidUtf8 { .. }), "{e}");

    // Duplicate keys and tensors.
    let mut w = GgufWriter::new();
    w.meta("k", Value::U8(1)).meta("k", Value::U8(2));
    assert!(matches!(
        GgufFile::from_bytes(w.to_bytes(3)),
        Err(GgufError::DuplicateKey { .. })
    ));
    let mut w = GgufWriter::new();
    w.tensor_f32("t", &[1], &[1.0])
        .tensor_f32("t", &[1], &[1.0]);
    assert!(matches!(
        GgufFile::from_bytes(w.to_bytes(3)),
        Err(GgufError::DuplicateTensor(_))
    ));

    // Arrays nested without end.
    let mut v = Value::U8(0);
    for _ in 0..20 {
        v = Value::Array(vec![v]);
    }
    let mut w = GgufWriter::new();
    w.meta("deep", v);
    assert!(matches!(
        GgufFile::from_bytes(w.to_bytes(3)),
        Err(GgufError::TooDeep { .. })
    ));
}

#[test]
fn random_corruption_never_panics() {
    let base = sample().to_bytes(3);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..3000 {
        let mut bytes = base.clone();
        for _ in 0..1 + next() % 4 {
            let i = (next() as usize) % bytes.len();
            bytes[i] = next() as u8;
        }
        if let Ok(f) = GgufFile::from_bytes(bytes) {
            for t in f.tensors() {
                assert_eq!(f.tensor_data(t).len() as u64, t.size);
            }
        }
    }
}

/// `--no-mmap` reads the same image into the process's memory; both kinds can be locked
/// (`--mlock`); releasing pages of the read copy is a no-op (it must not zero them); an
/// empty file is an error either way.
#[test]
fn read_and_mapped_images_agree() {
    let dir = std::env::temp_dir().join(format!("sparrow-gguf-open-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sample.gguf");
    std::fs::write(&path, sample().to_bytes(3)).unwrap();
    let mapped = GgufFile::open_with(&path, true).unwrap();
    let read = GgufFile::open_with(&path, false).unwrap();
    assert!(mapped.is_mapped() && !read.is_mapped());
    assert_eq!(mapped.bytes(), read.bytes());
    let a = read.tensor("a").unwrap();
    let before = read.tensor_data(a).to_vec();
    read.release(0..read.bytes().len());
    assert_eq!(read.tensor_data(a), &before[..]);
    // Locking a few KiB is within any RLIMIT_MEMLOCK.
    mapped.lock().unwrap();
    read.lock().unwrap();
    let empty = dir.join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    for mmap in [true, false] {
        assert!(GgufFile::open_with(&empty, mmap).is_err(), "mmap {mmap}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Taking a string array out of the metadata moves its strings and removes the key; a
/// wrong type or a missing key is an error that leaves the metadata as it was.
#[test]
fn string_arrays_can_be_taken_out() {
    let mut f = GgufFile::from_bytes(sample().to_bytes(3)).unwrap();
    let md = f.metadata_mut();
    assert_eq!(
        md.take_str_array("strs").unwrap(),
        vec!["a".to_string(), String::new()]
    );
    assert!(!md.contains("strs"));
    assert!(md.take_str_array("strs").is_err());
    let e = md.take_str_array("ints").unwrap_err();
    assert!(e.to_string().contains("ints"), "{e}");
    assert!(md.contains("ints"));
    assert!(md.take_str_array("u8").is_err() && md.contains("u8"));
    assert_eq!(md.take("u8"), Some(Value::U8(200)));
    assert_eq!(md.take("u8"), None);
}

#[test]
fn missing_file_names_the_path() {
    let e = GgufFile::open("/definitely/not/here.gguf").err().unwrap();
    assert!(e.to_string().contains("/definitely/not/here.gguf"), "{e}");
}

fn models_dir() -> std::path::PathBuf {
    if let Ok(d) = std::env::var("SPARROW_MODELS") {
        return d.into();
    }
    let home = std::env::var("HOME").expect("HOME");
    std::path::Path::new(&home).join(".cache/sparrow/models")
}

#[test]
fn real_qwen_file_matches_the_gguf_python_package() {
    let path = models_dir().join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    assert!(
        path.exists(),
        "{} is missing: run `python3 scripts/fetch_models.py qwen`",
        path.display()
    );
    let f = GgufFile::open(&path).unwrap();
    let reference: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/qwen_table.json")).unwrap();
    let tensors = reference["tensors"].as_array().unwrap();
    assert_eq!(f.tensors().len(), tensors.len());
    for (ours, theirs) in f.tensors().iter().zip(tensors) {
        assert_eq!(ours.name, theirs["name"].as_str().unwrap());
        let dims: Vec<u64> = theirs["dims"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        assert_eq!(ours.dims, dims, "{}", ours.name);
        assert_eq!(ours.ty.id() as u64, theirs["type"].as_u64().unwrap());
        assert_eq!(
            ours.offset,
            theirs["offset"].as_u64().unwrap(),
            "{}",
            ours.name
        );
        assert_eq!(
            ours.size,
            theirs["n_bytes"].as_u64().unwrap(),
            "{}",
            ours.name
        );
    }
    for (key, value) in reference["metadata"].as_object().unwrap() {
        let ours = f.metadata().get(key).unwrap_or_else(|| panic!("{key}"));
        match value {
            serde_json::Value::String(s) => assert_eq!(ours.as_str(), Some(s.as_str()), "{key}"),
            serde_json::Value::Bool(b) => assert_eq!(ours, &Value::Bool(*b), "{key}"),
            serde_json::Value::Number(n) if n.is_f64() => {
                assert_eq!(ours.as_float().unwrap(), n.as_f64().unwrap(), "{key}")
            }
            serde_json::Value::Number(n) => {
                assert_eq!(
                    ours.as_integer().unwrap(),
                    n.as_i64().unwrap() as i128,
                    "{key}"
                )
            }
            serde_json::Value::Object(o) => assert_eq!(
                ours.as_array().unwrap().len() as u64,
                o["array_len"].as_u64().unwrap(),
                "{key}"
            ),
            other => panic!("unexpected fixture value {other} for {key}"),
        }
    }
}
