//! Matrices stored in row groups (`sparrow_quant::row_groups`) against the same matrices in
//! ggml's layout, through the public products: what the engine relies on when it regroups
//! Q4_K, Q6_K and Q5_0 weights at load.

mod common;

use common::{random_row, ref_dot, Rng};
use sparrow_quant::row_groups::{group_rows, is_groupable};
use sparrow_quant::{
    matmul, matmul_at_level, matmul_f32, matmul_multi, matmul_rowwise, matvec, matvec_f32,
    matvec_multi, GgmlType, Kernels, QMatrix, QuantError, SimdLevel,
};

const TYPES: [GgmlType; 3] = [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q5_0];

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

/// A `rows × cols` matrix of `ty` with random quants, and the same bytes in row groups.
fn pair(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> (Vec<u8>, Vec<u8>) {
    let data = random_row(rng, ty, rows * cols);
    let mut grouped = vec![0u8; data.len()];
    group_rows(ty, &data, data.len() / rows, &mut grouped).unwrap();
    (data, grouped)
}

fn pool(n: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build()
        .unwrap()
}

/// Every token of a batch gets the bits the one-token product gives it, at any batch size
/// and thread count (what makes a speculative check exact), and, where the active level has
/// row-group kernels, the bits of the same matrix in ggml's layout.
#[test]
fn grouped_products_give_every_token_the_one_token_bits() {
    let mut rng = Rng::new(7);
    let level_has_groups = |ty| Kernels::get(ty).is_some_and(|k| k.dot_q8_groups.is_some());
    for ty in TYPES {
        // several parallel tasks of whole groups, and a row count not a multiple of 32
        let (rows, cols) = (208, 768);
        let (data, grouped) = pair(&mut rng, ty, rows, cols);
        let plain = QMatrix::new(ty, &data, rows, cols).unwrap();
        let m = QMatrix::new_grouped(ty, &grouped, rows, cols).unwrap();
        assert!(m.is_grouped());
        let xs = rng.vec(70 * cols);
        let one: Vec<Vec<f32>> = xs
            .chunks_exact(cols)
            .map(|x| {
                let mut o = vec![f32::NAN; rows];
                matvec(&m, x, &mut o).unwrap();
                o
            })
            .collect();
        for (t, x) in xs.chunks_exact(cols).enumerate().take(5) {
            // The row kernel whose numerics the group kernels reproduce: for the k-quants
            // the active level's (block totals), for Q5_0 the scalar one.
            let mut o = vec![f32::NAN; rows];
            match ty {
                GgmlType::Q5_0 => matmul_at_level(SimdLevel::Scalar, &plain, x, &mut o).unwrap(),
                _ => matvec(&plain, x, &mut o).unwrap(),
            }
            if level_has_groups(ty) {
                assert_eq!(
                    bits(&one[t]),
                    bits(&o),
                    "{ty}: token {t}, grouped vs ggml layout"
                );
            }
            // Any level: both within f32 rounding of the f64 dot of the dequantized matrix.
            let k = Kernels::scalar(ty).unwrap();
            for (r, &got) in one[t].iter().enumerate() {
                let mut w = vec![0f32; cols];
                (k.dequantize)(plain.row(r), &mut w);
                let (want, abs) = ref_dot(&w, x);
                let tol = 1e-2 * abs + 1e-3;
                assert!(
                    (got as f64 - want).abs() <= tol,
                    "{ty} row {r}: {got} vs {want}"
                );
            }
        }
        for p in [pool(1), pool(3)] {
            for n in [1, 2, 3, 5, 8, 13, 20, 70] {
                let mut out = vec![f32::NAN; n * rows];
                p.install(|| matmul(&m, &xs[..n * cols], &mut out)).unwrap();
                let mut rowwise = vec![f32::NAN; n * rows];
                p.install(|| matmul_rowwise(&m, &xs[..n * cols], &mut rowwise))
                    .unwrap();
                for t in 0..n {
                    let got = &out[t * rows..][..rows];
                    assert_eq!(bits(got), bits(&one[t]), "{ty}: {n} tokens, token {t}");
                    assert_eq!(
                        bits(&rowwise[t * rows..][..rows]),
                        bits(&one[t]),
                        "{ty}: rowwise"
                    );
                }
            }
        }
        // The portable kernels at the scalar level: the same numerics, so the same bits.
        let mut scalar = vec![f32::NAN; 3 * rows];
        matmul_at_level(SimdLevel::Scalar, &m, &xs[..3 * cols], &mut scalar).unwrap();
        if level_has_groups(ty) {
            assert_eq!(
                bits(&scalar[..rows]),
                bits(&one[0]),
                "{ty}: portable group kernel"
            );
        }
    }
}

/// Several batched products of the same rows in one pass (`matmul_multi`, a layer's q/k/v
/// or gate/up in a speculative check): each output has the bits of that product alone — for
/// matrices in row groups on either activation type side by side (Q4_K and Q6_K on Q8_K,
/// Q5_0 on Q8_0, each quantized once), for a matrix not in groups among them, through the
/// panels from their threshold unless rowwise, at one and three threads.
#[test]
fn one_pass_over_several_batched_products_gives_each_its_own_bits() {
    let mut rng = Rng::new(11);
    let cols = 512;
    let shapes = [
        (GgmlType::Q4_K, 48),
        (GgmlType::Q5_0, 32),
        (GgmlType::Q6_K, 80),
    ];
    let stored: Vec<(GgmlType, usize, Vec<u8>, Vec<u8>)> = shapes
        .iter()
        .map(|&(ty, rows)| {
            let (d, g) = pair(&mut rng, ty, rows, cols);
            (ty, rows, d, g)
        })
        .collect();
    let grouped: Vec<QMatrix<'_>> = stored
        .iter()
        .map(|(ty, rows, _, g)| QMatrix::new_grouped(*ty, g, *rows, cols).unwrap())
        .collect();
    let q8 = random_row(&mut rng, GgmlType::Q8_0, 24 * cols);
    let mut mixed = grouped.clone();
    mixed.push(QMatrix::new(GgmlType::Q8_0, &q8, 24, cols).unwrap());
    let xs = rng.vec(300 * cols);
    for p in [pool(1), pool(3)] {
        for ms in [&grouped, &mixed] {
            for n in [2, 3, 5, 9, 300] {
                for rowwise in [true, false] {
                    let x = &xs[..n * cols];
                    let mut outs: Vec<Vec<f32>> =
                        ms.iter().map(|m| vec![f32::NAN; n * m.rows()]).collect();
                    let mut views: Vec<&mut [f32]> =
                        outs.iter_mut().map(|o| o.as_mut_slice()).collect();
                    p.install(|| matmul_multi(ms, x, &mut views, rowwise))
                        .unwrap();
                    for (m, got) in ms.iter().zip(&outs) {
                        let mut want = vec![f32::NAN; n * m.rows()];
                        let alone = if rowwise { matmul_rowwise } else { matmul };
                        p.install(|| alone(m, x, &mut want)).unwrap();
                        assert_eq!(
                            bits(got),
                            bits(&want),
                            "{}: {n} tokens, rowwise {rowwise}",
                            m.ty()
                        );
                    }
                }
            }
        }
    }
    // A mismatch is an error naming what, never a panic.
    let mut short = [0f32; 5];
    let err = matmul_multi(&grouped[..1], &xs[..2 * cols], &mut [&mut short[..]], true);
    assert!(
        matches!(err, Err(QuantError::LenMismatch { .. })),
        "{err:?}"
    );
    let err = matmul_multi(&grouped[..2], &xs[..2 * cols], &mut [&mut short[..]], true);
    assert!(
        matches!(err, Err(QuantError::LenMismatch { .. })),
        "{err:?}"
    );
}

/// A grouped matrix among others in one pass, f32 activations, rows read back, and the
/// refusals: each as the ggml layout gives it.
#[test]
fn grouped_matrices_work_everywhere_a_matrix_does() {
    let mut rng = Rng::new(8);
    let (rows, cols) = (32, 512);
    let (d4, g4) = pair(&mut rng, GgmlType::Q4_K, rows, cols);
    let (d6, g6) = pair(&mut rng, GgmlType::Q6_K, rows, cols);
    let (d5, g5) = pair(&mut rng, GgmlType::Q5_0, rows, cols);
    let q8 = random_row(&mut rng, GgmlType::Q8_0, 40 * cols);
    let m4 = QMatrix::new_grouped(GgmlType::Q4_K, &g4, rows, cols).unwrap();
    let m6 = QMatrix::new_grouped(GgmlType::Q6_K, &g6, rows, cols).unwrap();
    let p4 = QMatrix::new(GgmlType::Q4_K, &d4, rows, cols).unwrap();
    let p6 = QMatrix::new(GgmlType::Q6_K, &d6, rows, cols).unwrap();
    let m5 = QMatrix::new_grouped(GgmlType::Q5_0, &g5, rows, cols).unwrap();
    let p5 = QMatrix::new(GgmlType::Q5_0, &d5, rows, cols).unwrap();
    let m8 = QMatrix::new(GgmlType::Q8_0, &q8, 40, cols).unwrap();
    let x = rng.vec(cols);

    // One pass over several matrices equals each alone.
    let (mut a, mut b, mut c) = (vec![0f32; rows], vec![0f32; 40], vec![0f32; rows]);
    let mut e = vec![0f32; rows];
    matvec_multi(&[m4, m8, m6, m5], &x, &mut [&mut a, &mut b, &mut c, &mut e]).unwrap();
    for (m, got) in [(&m4, &a), (&m8, &b), (&m6, &c), (&m5, &e)] {
        let mut alone = vec![0f32; m.rows()];
        matvec(m, &x, &mut alone).unwrap();
        assert_eq!(bits(got), bits(&alone), "{}", m.ty());
    }

    for (g, p) in [(&m4, &p4), (&m6, &p6), (&m5, &p5)] {
        // f32 activations: the same bits as the ggml layout (same kernel, same row).
        let (mut gf, mut pf) = (vec![0f32; rows], vec![0f32; rows]);
        matvec_f32(g, &x, &mut gf).unwrap();
        matvec_f32(p, &x, &mut pf).unwrap();
        assert_eq!(bits(&gf), bits(&pf), "{} matvec_f32", g.ty());
        let xs = rng.vec(3 * cols);
        let (mut gm, mut pm) = (vec![0f32; 3 * rows], vec![0f32; 3 * rows]);
        matmul_f32(g, &xs, &mut gm).unwrap();
        matmul_f32(p, &xs, &mut pm).unwrap();
        assert_eq!(bits(&gm), bits(&pm), "{} matmul_f32", g.ty());
        // Rows read back whole.
        for r in [0, 1, 15, 16, rows - 1] {
            let (mut gr, mut pr) = (vec![0f32; cols], vec![0f32; cols]);
            g.dequantize_row(r, &mut gr).unwrap();
            p.dequantize_row(r, &mut pr).unwrap();
            assert_eq!(bits(&gr), bits(&pr), "{} row {r}", g.ty());
        }
        assert_eq!(
            g.dequantize_row(rows, &mut vec![0f32; cols]),
            Err(QuantError::RowOutOfRange { row: rows, rows })
        );
        assert_eq!(g.try_row(0), Err(QuantError::RowsInGroups));
        let mut short = vec![0f32; rows - 1];
        assert!(
            matvec(g, &x, &mut short).is_err(),
            "a short output is refused"
        );
    }

    // Only Q4_K, Q6_K and Q5_0, in whole groups of 16 rows.
    assert!(!is_groupable(GgmlType::Q4_K, 24));
    assert!(QMatrix::new_grouped(GgmlType::Q4_K, &g4[..16 * 288], 16, cols).is_ok());
    assert_eq!(
        QMatrix::new_grouped(GgmlType::Q8_0, &q8[..32 * 544], 32, cols).err(),
        Some(QuantError::Unsupported(GgmlType::Q8_0))
    );
    assert_eq!(
        QMatrix::new_grouped(GgmlType::Q4_K, &g4[..8 * 288], 8, cols).err(),
        Some(QuantError::Unsupported(GgmlType::Q4_K))
    );
}

/// A long batch of a Q5_0 matrix in row groups runs through the panels, decoded straight
/// from the groups: the bits of the same batch on ggml's rows, at every level (at those
/// without group kernels the panels read a grouped matrix all the same).
#[test]
fn grouped_q5_0_batches_take_the_panels_from_the_groups() {
    let mut rng = Rng::new(9);
    // a last panel of one group (rows not a multiple of the 32-row panel)
    // (the AVX-512 level's panels take a Q5_0 matrix in groups from 256 tokens)
    let (rows, cols, n) = (208, 320, 260);
    let (data, grouped) = pair(&mut rng, GgmlType::Q5_0, rows, cols);
    let plain = QMatrix::new(GgmlType::Q5_0, &data, rows, cols).unwrap();
    let m = QMatrix::new_grouped(GgmlType::Q5_0, &grouped, rows, cols).unwrap();
    let xs = rng.vec(n * cols);
    for level in [SimdLevel::active(), SimdLevel::Scalar] {
        let (mut got, mut want) = (vec![f32::NAN; n * rows], vec![f32::NAN; n * rows]);
        matmul_at_level(level, &m, &xs, &mut got).unwrap();
        matmul_at_level(level, &plain, &xs, &mut want).unwrap();
        let differ = got
            .iter()
            .zip(&want)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(
            differ,
            0,
            "{level:?}: {differ} of {} outputs differ",
            got.len()
        );
    }
}
