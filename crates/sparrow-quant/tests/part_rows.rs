//! Products over part of a matrix's rows — a prefix ([`QMatrix::first_rows`]) and scattered
//! rows ([`matvec_rows`]) — give each row the bits the whole matrix's [`matvec`] gives it,
//! in every layout (ggml's, packed, row groups). What a draft model's logits over part of
//! its vocabulary rely on: its proposals are the ones the whole head would make whenever
//! the best token is inside the part.

mod common;

use common::{random_row, Rng};
use sparrow_quant::packed::{is_packable, pack_rows};
use sparrow_quant::row_groups::{group_rows, is_groupable};
use sparrow_quant::{matvec, matvec_rows, GgmlType, QMatrix, QuantError};

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

/// `data` (ggml layout) in each layout `ty` has: ("ggml" | "packed" | "groups", bytes).
fn layouts(ty: GgmlType, data: &[u8], rows: usize) -> Vec<(&'static str, Vec<u8>)> {
    let row_bytes = data.len() / rows;
    let mut out = vec![("ggml", data.to_vec())];
    if is_packable(ty) {
        let mut packed = vec![0u8; data.len()];
        pack_rows(ty, data, row_bytes, &mut packed).unwrap();
        out.push(("packed", packed));
    }
    if is_groupable(ty, rows) {
        let mut grouped = vec![0u8; data.len()];
        group_rows(ty, data, row_bytes, &mut grouped).unwrap();
        out.push(("groups", grouped));
    }
    out
}

fn view<'a>(layout: &str, ty: GgmlType, bytes: &'a [u8], rows: usize, cols: usize) -> QMatrix<'a> {
    match layout {
        "packed" => QMatrix::new_packed(ty, bytes, rows, cols),
        "groups" => QMatrix::new_grouped(ty, bytes, rows, cols),
        _ => QMatrix::new(ty, bytes, rows, cols),
    }
    .unwrap()
}

#[test]
fn part_of_the_rows_gives_each_row_the_whole_products_bits() {
    let mut rng = Rng::new(11);
    let (rows, cols) = (224, 512);
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::F16,
    ] {
        let data = random_row(&mut rng, ty, rows * cols);
        for (layout, bytes) in layouts(ty, &data, rows) {
            let m = view(layout, ty, &bytes, rows, cols);
            for x in [
                rng.vec(cols),
                rng.vec(cols).iter().map(|v| v * 40.0).collect(),
            ] {
                let mut whole = vec![f32::NAN; rows];
                matvec(&m, &x, &mut whole).unwrap();

                // A prefix: several parallel tasks' worth and one group's.
                for n in [16, 96, rows] {
                    let mut part = vec![f32::NAN; n];
                    matvec(&m.first_rows(n).unwrap(), &x, &mut part).unwrap();
                    assert_eq!(bits(&part), bits(&whole[..n]), "{ty} {layout}: first {n}");
                }

                // Scattered rows, unsorted, two of one group side by side, a repeat, the
                // last row.
                let picked: Vec<u32> = vec![200, 3, 17, 18, 221, 3, 64, 223, 0, 150];
                let mut got = vec![f32::NAN; picked.len()];
                matvec_rows(&m, &picked, &x, &mut got).unwrap();
                let want: Vec<f32> = picked.iter().map(|&r| whole[r as usize]).collect();
                assert_eq!(bits(&got), bits(&want), "{ty} {layout}: rows {picked:?}");
            }
        }
    }
}

#[test]
fn part_of_the_rows_refuses_what_it_cannot_view() {
    let mut rng = Rng::new(5);
    let (rows, cols) = (64, 256);
    let ty = GgmlType::Q4_K;
    let data = random_row(&mut rng, ty, rows * cols);
    let mut grouped = vec![0u8; data.len()];
    group_rows(ty, &data, data.len() / rows, &mut grouped).unwrap();
    let plain = QMatrix::new(ty, &data, rows, cols).unwrap();
    let m = QMatrix::new_grouped(ty, &grouped, rows, cols).unwrap();

    assert!(matches!(
        plain.first_rows(0),
        Err(QuantError::RowOutOfRange { row: 0, rows: 64 })
    ));
    assert!(matches!(
        plain.first_rows(65),
        Err(QuantError::RowOutOfRange { row: 65, rows: 64 })
    ));
    assert_eq!(plain.first_rows(20).unwrap().rows(), 20);
    // Row groups stay whole.
    assert!(matches!(m.first_rows(20), Err(QuantError::RowsInGroups)));
    assert_eq!(m.first_rows(32).unwrap().rows(), 32);

    let x = rng.vec(cols);
    let mut out = [0f32; 2];
    assert!(matches!(
        matvec_rows(&m, &[1, 64], &x, &mut out),
        Err(QuantError::RowOutOfRange { row: 64, rows: 64 })
    ));
    assert!(matches!(
        matvec_rows(&plain, &[1], &x, &mut out),
        Err(QuantError::LenMismatch { what: "out", .. })
    ));
    assert!(matches!(
        matvec_rows(&plain, &[1, 2], &x[1..], &mut out),
        Err(QuantError::LenMismatch { what: "x", .. })
    ));
}
