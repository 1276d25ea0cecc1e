//! Dequantization of rows read straight from the real Qwen GGUF (through sparrow-gguf's
//! memory map) equals the `gguf` Python package's output, recorded in
//! `crates/sparrow-quant/tests/fixtures/qwen_real.bin` by that crate's generator script.
//! This ties the committed extract to the real file: if the reader handed out the wrong
//! bytes, or the extract did not come from this file, the test fails.
//!
//! Bit-exactness does not depend on the SIMD level: every level's kernel table dequantizes
//! with the same scalar `dequantize_row` of the format (sparrow-quant's `kernels.rs` and
//! `x86/mod.rs`), a few `f32` operations per element that Rust never fuses into an FMA, and
//! no sum whose order could differ.

mod common;

use sparrow_gguf::{GgmlType, GgufFile};
use sparrow_quant::QMatrix;

struct Record {
    name: String,
    ty: GgmlType,
    cols: usize,
    rows: Vec<usize>,
    raw: Vec<u8>,
    want: Vec<f32>,
}

fn records() -> Vec<Record> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../sparrow-quant/tests/fixtures/qwen_real.bin"
    );
    let bytes = std::fs::read(path).unwrap();
    let mut at = 0usize;
    let mut take = |n: usize| {
        let s = bytes[at..at + n].to_vec();
        at += n;
        s
    };
    assert_eq!(take(4), b"SQRL");
    let u32_of = |b: Vec<u8>| u32::from_le_bytes(b.try_into().unwrap());
    assert_eq!(u32_of(take(4)), 1);
    let n = u32_of(take(4));
    let mut out = Vec::new();
    for _ in 0..n {
        let len = u32_of(take(4)) as usize;
        let name = String::from_utf8(take(len)).unwrap();
        let ty = GgmlType::from_id(u32_of(take(4))).unwrap();
        let cols = u32_of(take(4)) as usize;
        let n_rows = u32_of(take(4)) as usize;
        let rows: Vec<usize> = (0..n_rows).map(|_| u32_of(take(4)) as usize).collect();
        let raw = take(n_rows * ty.bytes_for(cols as u64).unwrap());
        let want = take(n_rows * cols * 4)
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        out.push(Record {
            name,
            ty,
            cols,
            rows,
            raw,
            want,
        });
    }
    out
}

#[test]
fn rows_from_the_mapped_file_dequantize_like_gguf_py() {
    let file = GgufFile::open(common::qwen_path()).unwrap();
    let recs = records();
    assert!(recs.len() >= 5);
    let mut types = Vec::new();
    for r in &recs {
        let info = file.require_tensor(&r.name).unwrap();
        assert_eq!(info.ty, r.ty, "{}", r.name);
        assert_eq!(info.row_len() as usize, r.cols, "{}", r.name);
        let m = QMatrix::new(
            info.ty,
            file.tensor_data(info),
            info.n_rows() as usize,
            r.cols,
        )
        .unwrap();
        let mut got = vec![0f32; r.cols];
        let rb = m.row_bytes();
        for (i, &row) in r.rows.iter().enumerate() {
            assert_eq!(
                m.row(row),
                &r.raw[i * rb..(i + 1) * rb],
                "{} row {row}: bytes",
                r.name
            );
            m.dequantize_row(row, &mut got).unwrap();
            let want = &r.want[i * r.cols..(i + 1) * r.cols];
            for (j, (a, b)) in got.iter().zip(want).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{} row {row} col {j}: {a} vs {b}",
                    r.name
                );
            }
        }
        types.push(r.ty);
    }
    for ty in [
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::F32,
    ] {
        assert!(types.contains(&ty), "no real rows of {ty}");
    }
}
