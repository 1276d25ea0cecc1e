//! Loading a directory of training records and checking that they belong together (and
//! to the model being trained for): a mixed set would train one index on vectors from
//! different spaces and fail silently.

use crate::TrainError;
use sparrow::saap::ContextRecord;
use sparrow::ModelConfig;
use std::path::Path;

/// Every `*.saapc` in `dir`, sorted by file name, checked to be from one model with one
/// shape.
pub fn load_records(dir: &Path) -> Result<Vec<ContextRecord>, TrainError> {
    let io = |source| TrainError::Io {
        path: dir.display().to_string(),
        source,
    };
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        if path.extension().is_some_and(|e| e == "saapc") && path.is_file() {
            paths.push(path);
        }
    }
    paths.sort();
    if paths.is_empty() {
        return Err(TrainError::NoRecords(dir.display().to_string()));
    }
    let mut records = Vec::with_capacity(paths.len());
    for path in &paths {
        let record = ContextRecord::load(path).map_err(|source| TrainError::Record {
            path: path.display().to_string(),
            source,
        })?;
        if let Some(first) = records.first() {
            if let Some(what) = mismatch(first, &record) {
                return Err(TrainError::Mixed {
                    first: paths[0].display().to_string(),
                    other: path.display().to_string(),
                    what,
                });
            }
        }
        records.push(record);
    }
    Ok(records)
}

/// What differs between two records that must not (model, shapes, RoPE).
fn mismatch(a: &ContextRecord, b: &ContextRecord) -> Option<String> {
    let (x, y) = (&a.meta, &b.meta);
    if a.fingerprint != b.fingerprint {
        return Some("they were recorded from different models (fingerprints differ)".into());
    }
    let shape = |m: &sparrow::saap::RecordMeta| (m.n_layer, m.n_head, m.n_head_kv, m.head_dim);
    if shape(x) != shape(y) {
        return Some(format!(
            "shapes differ (layers, heads, KV heads, head size): {:?} vs {:?}",
            shape(x),
            shape(y)
        ));
    }
    if x.rope != y.rope {
        return Some(format!("RoPE differs: {:?} vs {:?}", x.rope, y.rope));
    }
    None
}

/// Check `records` against each other and against `model`: same model (fingerprint),
/// same shapes, RoPE the model's, finite values, at least one query past the sink.
pub fn check_records(records: &[ContextRecord], model: &ModelConfig) -> Result<(), TrainError> {
    let Some(first) = records.first() else {
        return Err(TrainError::NoRecords("(no records given)".into()));
    };
    let name = |r: &ContextRecord, i: usize| format!("record {i} ({})", r.meta.source);
    for (i, r) in records.iter().enumerate() {
        if r.fingerprint != model.fingerprint {
            return Err(TrainError::OtherModel { record: name(r, i) });
        }
        if let Some(what) = mismatch(first, r) {
            return Err(TrainError::Mixed {
                first: name(first, 0),
                other: name(r, i),
                what,
            });
        }
        let m = &r.meta;
        let have = (m.n_layer, m.n_head, m.n_head_kv, m.head_dim);
        let want = (model.n_layer, model.n_head, model.n_head_kv, model.head_dim);
        if have != want || m.n_head_kv == 0 || !m.n_head.is_multiple_of(m.n_head_kv) {
            return Err(TrainError::Shape {
                record: name(r, i),
                what: format!("(layers, heads, KV heads, head size) {have:?}, the model {want:?}"),
            });
        }
        if m.rope != sparrow::saap::RopeParams::of(model) {
            return Err(TrainError::Shape {
                record: name(r, i),
                what: format!(
                    "RoPE {:?}, the model's {:?}",
                    m.rope,
                    sparrow::saap::RopeParams::of(model)
                ),
            });
        }
        for (layer, (k, q)) in r.keys.iter().zip(&r.queries).enumerate() {
            if !k.iter().chain(q).all(|v| v.is_finite()) {
                return Err(TrainError::NotFinite {
                    record: name(r, i),
                    layer,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::targets::tests::random_record;

    /// A directory's records load sorted by name; an empty directory, a mixed set and a
    /// corrupt file are refused with what is wrong.
    #[test]
    fn loads_sorted_and_refuses_mixed_sets() {
        let dir = std::env::temp_dir().join(format!("saap-train-records-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let e = load_records(&dir).unwrap_err();
        assert!(matches!(e, TrainError::NoRecords(_)), "{e}");
        let a = random_record((1, 2, 1, 4), 10, vec![3, 6], 1.0, 1);
        let b = random_record((1, 2, 1, 4), 12, vec![5], 1.0, 2);
        b.save(&dir.join("b.saapc")).unwrap();
        a.save(&dir.join("a.saapc")).unwrap();
        std::fs::write(dir.join("notes.txt"), "ignored").unwrap();
        let got = load_records(&dir).unwrap();
        assert_eq!(got, vec![a.clone(), b]);
        let mut other = random_record((1, 2, 1, 4), 10, vec![3], 1.0, 3);
        other.fingerprint[0] ^= 1;
        other.save(&dir.join("c.saapc")).unwrap();
        let e = load_records(&dir).unwrap_err();
        assert!(matches!(e, TrainError::Mixed { .. }), "{e}");
        random_record((1, 4, 1, 4), 10, vec![3], 1.0, 3)
            .save(&dir.join("c.saapc"))
            .unwrap();
        let e = load_records(&dir).unwrap_err();
        assert!(e.to_string().contains("shapes differ"), "{e}");
        let mut bytes = a.encode();
        bytes[60] ^= 1;
        std::fs::write(dir.join("c.saapc"), bytes).unwrap();
        let e = load_records(&dir).unwrap_err();
        assert!(matches!(e, TrainError::Record { .. }), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
