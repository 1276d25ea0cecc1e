//! `matvec` / `matmul` (threaded) against row-by-row `dot_q8` (and the `_f32` variants
//! against row-by-row `dot`), and the error cases of every public entry point.

mod common;

use common::{random_row, Rng, SUPPORTED};
use sparrow_quant::{
    dequantize, dot, dot_q8, matmul, matmul_f32, matvec, matvec_f32, GgmlType, QMatrix, QuantError,
};

fn pool(n: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build()
        .unwrap()
}

/// Row-by-row reference: `dot_q8` per output (what `matvec`/`matmul` compute).
fn reference(m: &QMatrix<'_>, xs: &[f32]) -> Vec<f32> {
    reference_with(m, xs, dot_q8)
}

/// A row dot: `dot` or `dot_q8`.
type RowDot = fn(GgmlType, &[u8], &[f32]) -> Result<f32, QuantError>;

/// Row-by-row reference with `f` per output.
fn reference_with(m: &QMatrix<'_>, xs: &[f32], f: RowDot) -> Vec<f32> {
    let n_tokens = xs.len() / m.cols();
    let mut out = vec![0f32; n_tokens * m.rows()];
    for t in 0..n_tokens {
        for r in 0..m.rows() {
            out[t * m.rows() + r] = f(m.ty(), m.row(r), &xs[t * m.cols()..][..m.cols()]).unwrap();
        }
    }
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn matvec_and_matmul_equal_rowwise_dot_for_every_type() {
    let mut rng = Rng::new(11);
    let pools = [pool(1), pool(3)];
    for &ty in SUPPORTED {
        let cols = ty.block_elems().max(32) * 2;
        // enough rows that several 32 KiB tasks exist for every type
        let rows = (3 * 32 * 1024 / ty.bytes_for(cols as u64).unwrap()).clamp(5, 700);
        let data = random_row(&mut rng, ty, rows * cols);
        let m = QMatrix::new(ty, &data, rows, cols).unwrap();
        let n_tokens = 3;
        let xs = rng.vec(n_tokens * cols);
        let want = reference(&m, &xs);
        let want_f32 = reference_with(&m, &xs, dot);
        for p in &pools {
            let mut out = vec![f32::NAN; rows];
            p.install(|| matvec(&m, &xs[..cols], &mut out)).unwrap();
            assert_eq!(bits(&out), bits(&want[..rows]), "{ty} matvec");

            let mut out = vec![f32::NAN; n_tokens * rows];
            p.install(|| matmul(&m, &xs, &mut out)).unwrap();
            assert_eq!(bits(&out), bits(&want), "{ty} matmul");

            let mut out = vec![f32::NAN; rows];
            p.install(|| matvec_f32(&m, &xs[..cols], &mut out)).unwrap();
            assert_eq!(bits(&out), bits(&want_f32[..rows]), "{ty} matvec_f32");

            let mut out = vec![f32::NAN; n_tokens * rows];
            p.install(|| matmul_f32(&m, &xs, &mut out)).unwrap();
            assert_eq!(bits(&out), bits(&want_f32), "{ty} matmul_f32");
        }
    }
}

#[test]
fn large_matvec_splits_across_threads_and_stays_exact() {
    // 896 x 4864 Q4_K: the shape of a Qwen 0.5B ffn_down, ~2.4 MiB of weights.
    let mut rng = Rng::new(12);
    let (rows, cols) = (896, 4864);
    let data = random_row(&mut rng, GgmlType::Q4_K, rows * cols);
    let m = QMatrix::new(GgmlType::Q4_K, &data, rows, cols).unwrap();
    let x = rng.vec(cols);
    let want = reference(&m, &x);
    let mut out = vec![0f32; rows];
    pool(2).install(|| matvec(&m, &x, &mut out)).unwrap();
    assert_eq!(bits(&out), bits(&want));
}

#[test]
fn small_and_degenerate_shapes() {
    let mut rng = Rng::new(13);
    let data = random_row(&mut rng, GgmlType::Q8_0, 32);
    let m = QMatrix::new(GgmlType::Q8_0, &data, 1, 32).unwrap();
    let x = rng.vec(32);
    let mut out = [0f32; 1];
    matvec(&m, &x, &mut out).unwrap();
    assert_eq!(out[0], dot_q8(GgmlType::Q8_0, &data, &x).unwrap());

    // zero rows / zero tokens are no-ops, not errors
    let empty = QMatrix::new(GgmlType::Q4_K, &[], 0, 256).unwrap();
    matvec(&empty, &[0.0; 256], &mut []).unwrap();
    matmul(&empty, &[0.0; 512], &mut []).unwrap();
    matmul(&m, &[], &mut []).unwrap();
    dequantize(GgmlType::Q4_K, &[], &mut []).unwrap();
    assert_eq!(dot(GgmlType::Q4_K, &[], &[]).unwrap(), 0.0);
}

#[test]
fn unsupported_types_are_named() {
    for ty in [
        GgmlType::IQ2_XXS,
        GgmlType::IQ4_NL,
        GgmlType::TQ1_0,
        GgmlType::MXFP4,
        GgmlType::I8,
        GgmlType::Q8_1,
    ] {
        let bytes = vec![0u8; ty.block_bytes()];
        let mut out = vec![0f32; ty.block_elems()];
        assert_eq!(
            dequantize(ty, &bytes, &mut out),
            Err(QuantError::Unsupported(ty))
        );
        assert_eq!(dot(ty, &bytes, &out), Err(QuantError::Unsupported(ty)));
        // a view of an unsupported tensor is fine (rows can be read); products are not
        let m = QMatrix::new(ty, &bytes, 1, ty.block_elems()).unwrap();
        assert_eq!(m.row(0).len(), ty.block_bytes());
        let mut o = [0f32; 1];
        assert_eq!(matvec(&m, &out, &mut o), Err(QuantError::Unsupported(ty)));
        assert_eq!(matmul(&m, &out, &mut o), Err(QuantError::Unsupported(ty)));
        let e = dot(ty, &bytes, &out).unwrap_err().to_string();
        assert!(e.contains(ty.name()), "{e}");
        assert!(!ty.has_kernels());
    }
}

#[test]
fn shape_errors_name_the_sizes() {
    let q = GgmlType::Q4_K;
    let block = vec![0u8; 144];

    // partial block
    let e = dequantize(q, &block[..100], &mut [0.0; 256]).unwrap_err();
    assert_eq!(
        e,
        QuantError::PartialBlock {
            ty: q,
            len: 100,
            block_bytes: 144
        }
    );
    assert!(e.to_string().contains("100") && e.to_string().contains("144"));
    assert!(matches!(
        dot(q, &block[..143], &[0.0; 256]),
        Err(QuantError::PartialBlock { len: 143, .. })
    ));

    // output / x length mismatch
    let e = dequantize(q, &block, &mut [0.0; 255]).unwrap_err();
    assert_eq!(
        e,
        QuantError::LenMismatch {
            what: "out",
            expected: 256,
            actual: 255
        }
    );
    let e = dot(q, &block, &[0.0; 512]).unwrap_err();
    assert_eq!(e.to_string(), "x has length 512, expected 256");

    // matrix construction
    assert_eq!(
        QMatrix::new(q, &block, 1, 100).unwrap_err(),
        QuantError::ColsNotBlockMultiple {
            ty: q,
            cols: 100,
            block_elems: 256
        }
    );
    assert_eq!(
        QMatrix::new(q, &block, 2, 256).unwrap_err(),
        QuantError::LenMismatch {
            what: "matrix data",
            expected: 288,
            actual: 144
        }
    );
    assert_eq!(
        QMatrix::new(q, &block, usize::MAX, 256).unwrap_err(),
        QuantError::SizeOverflow {
            rows: usize::MAX,
            cols: 256
        }
    );
    assert!(matches!(
        QMatrix::new(GgmlType::F32, &[], 1, usize::MAX),
        Err(QuantError::SizeOverflow { .. })
    ));

    // row access and products
    let m = QMatrix::new(q, &block, 1, 256).unwrap();
    assert_eq!(
        m.try_row(1).unwrap_err(),
        QuantError::RowOutOfRange { row: 1, rows: 1 }
    );
    assert_eq!(
        m.dequantize_row(3, &mut [0.0; 256]).unwrap_err(),
        QuantError::RowOutOfRange { row: 3, rows: 1 }
    );
    assert!(matches!(
        m.dequantize_row(0, &mut [0.0; 10]),
        Err(QuantError::LenMismatch {
            what: "out",
            expected: 256,
            actual: 10
        })
    ));
    assert!(matches!(
        matvec(&m, &[0.0; 255], &mut [0.0; 1]),
        Err(QuantError::LenMismatch {
            what: "x",
            expected: 256,
            actual: 255
        })
    ));
    assert!(matches!(
        matvec(&m, &[0.0; 256], &mut [0.0; 2]),
        Err(QuantError::LenMismatch {
            what: "out",
            expected: 1,
            actual: 2
        })
    ));
    assert!(matches!(
        matmul(&m, &[0.0; 300], &mut [0.0; 1]),
        Err(QuantError::LenMismatch { actual: 300, .. })
    ));
    assert!(matches!(
        matmul(&m, &[0.0; 512], &mut [0.0; 1]),
        Err(QuantError::LenMismatch {
            what: "out",
            expected: 2,
            actual: 1
        })
    ));
}

#[test]
#[should_panic(expected = "row 5 out of range for a matrix of 1 rows")]
fn row_panics_like_indexing() {
    let block = [0u8; 34];
    let m = QMatrix::new(GgmlType::Q8_0, &block, 1, 32).unwrap();
    let _ = m.row(5);
}

#[test]
fn supported_list_is_complete() {
    let with_kernels: Vec<_> = GgmlType::all().filter(|t| t.has_kernels()).collect();
    assert_eq!(with_kernels.len(), SUPPORTED.len());
    for t in SUPPORTED {
        assert!(with_kernels.contains(t));
    }
}

/// `matvec_multi` over matrices of different types (two activation kinds, a packed one,
/// a float one) sharing one input equals `matvec` of each, bit for bit, on 1 and 2
/// threads; mismatched outputs are refused with the lengths named.
#[test]
fn matvec_multi_equals_separate_matvecs() {
    use sparrow_quant::matvec_multi;
    use sparrow_quant::packed::pack_rows;
    let mut rng = Rng::new(31);
    let cols = 512;
    let shapes = [
        (GgmlType::Q5_0, 300),
        (GgmlType::Q8_0, 7),
        (GgmlType::Q4_K, 90),
        (GgmlType::F16, 5),
    ];
    let data: Vec<Vec<u8>> = shapes
        .iter()
        .map(|&(ty, rows)| {
            (0..rows)
                .flat_map(|_| random_row(&mut rng, ty, cols))
                .collect()
        })
        .collect();
    let mut packed = data[0].clone();
    pack_rows(GgmlType::Q5_0, &data[0], data[0].len() / 300, &mut packed).unwrap();
    let mut ms: Vec<QMatrix<'_>> = shapes
        .iter()
        .zip(&data)
        .map(|(&(ty, rows), d)| QMatrix::new(ty, d, rows, cols).unwrap())
        .collect();
    ms.push(QMatrix::new_packed(GgmlType::Q5_0, &packed, 300, cols).unwrap());
    let x = rng.vec(cols);
    for threads in [1, 2] {
        pool(threads).install(|| {
            let mut outs: Vec<Vec<f32>> = ms.iter().map(|m| vec![f32::NAN; m.rows()]).collect();
            let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
            matvec_multi(&ms, &x, &mut refs).unwrap();
            for (m, got) in ms.iter().zip(&outs) {
                let mut want = vec![0f32; m.rows()];
                matvec(m, &x, &mut want).unwrap();
                assert_eq!(bits(got), bits(&want), "{} threads {threads}", m.ty());
            }
            // the packed matrix computes what the ggml-layout one does (same integer sums)
            let d = outs[0]
                .iter()
                .zip(&outs[4])
                .map(|(a, b)| (a - b).abs() / a.abs().max(1.0))
                .fold(0f32, f32::max);
            assert!(d < 1e-5, "packed vs ggml layout: {d}");
        });
    }
    let mut short = vec![0f32; 6];
    let mut ok = vec![0f32; 300];
    let e = matvec_multi(&ms[..2], &x, &mut [&mut ok, &mut short]).unwrap_err();
    assert!(
        e.to_string().contains('7') && e.to_string().contains('6'),
        "{e}"
    );
    let e = matvec_multi(&ms[..2], &x, &mut [&mut ok]).unwrap_err();
    assert!(e.to_string().contains("outputs"), "{e}");
    let e = matvec_multi(&ms[..1], &x[..256], &mut [&mut ok]).unwrap_err();
    assert!(e.to_string().contains("256"), "{e}");
}
