//! Loading with the weights copied into RAM (Q5_0 repacked into sparrow's layout, the rest
//! as stored) computes what reading them from the file mapping does: the same integer sums.
//! With AVX2 (and scalar) kernels the f32 steps are in the same order too, so prefill and
//! decode logits are bit-equal (both models make the same forward calls in the same split,
//! and at these levels the two layouts' kernels perform the same f32 steps — the property
//! this test pins down); AVX-512's ggml-layout Q5_0 kernel sums in a different order than
//! the packed one, so there the logits must agree to rounding: within
//! `common::ORDER_TOL`, the measured cost of a change of summation order, teacher-forced
//! (the continuation is fixed tokens).

mod common;

use sparrow::{KvType, LoadOptions, Logits, Model, RowGroups};
use sparrow_quant::SimdLevel;

fn logits_of(model: &Model, prompt: &[u32], steps: usize) -> Vec<Vec<f32>> {
    let mut st = model.new_state(256, KvType::F16).unwrap();
    let mut all = vec![model
        .forward(&mut st, prompt, Logits::Last)
        .unwrap()
        .to_vec()];
    for i in 0..steps {
        let t = (1000 + 37 * i) as u32;
        all.push(model.forward(&mut st, &[t], Logits::Last).unwrap().to_vec());
    }
    all
}

#[test]
fn repacked_weights_give_the_mapped_weights_logits() {
    let mapped = Model::load_with(
        common::qwen_path(),
        LoadOptions {
            repack: false,
            ..Default::default()
        },
    )
    .unwrap();
    let repacked = Model::load_with(
        common::qwen_path(),
        LoadOptions {
            repack: true,
            lean: Some(false),
            ..Default::default()
        },
    )
    .unwrap();
    // 20 tokens: the batched prefill takes the panel path (16+) on AVX2 machines
    let prompt: Vec<u32> = (0..20).map(|i| 100 + 911 * i).collect();
    for (short, long) in [(&prompt[..3], 4), (&prompt[..], 4)] {
        let a = logits_of(&mapped, short, long);
        let b = logits_of(&repacked, short, long);
        if !matches!(SimdLevel::active(), SimdLevel::Avx512 | SimdLevel::Amx) {
            for (step, (x, y)) in a.iter().zip(&b).enumerate() {
                let differ = x
                    .iter()
                    .zip(y)
                    .filter(|(p, q)| p.to_bits() != q.to_bits())
                    .count();
                assert_eq!(
                    differ,
                    0,
                    "prompt {} step {step}: {differ} logits differ",
                    short.len()
                );
            }
        } else {
            // Another summation order of the same integer sums: within the tolerance of a
            // change of SIMD level or batch split (tests/common.rs), near-ties only.
            common::assert_close(
                &format!("prompt {}: repacked vs mapped", short.len()),
                &a,
                &b,
                common::ORDER_TOL,
            );
        }
    }
}

/// The memory-lean mode keeps the weights in the file and runs a long batch as pieces of
/// `LEAN_BATCH` tokens: its logits equal, to the bit, those of the same weights fed the
/// same pieces one call at a time; a batch whose logits are wanted for every token runs
/// whole (its logits equal the whole batch's); `--no-mmap` (the file read into memory)
/// computes the same.
#[test]
fn lean_mode_splits_long_batches_and_reads_the_file() {
    use sparrow::model::LEAN_BATCH;
    let path = common::smollm_path();
    let lean = Model::load_with(
        &path,
        LoadOptions {
            lean: Some(true),
            ..Default::default()
        },
    )
    .unwrap();
    let mapped = Model::load_with(
        &path,
        LoadOptions {
            repack: false,
            lean: Some(false),
            ..Default::default()
        },
    )
    .unwrap();
    let read = Model::load_with(
        &path,
        LoadOptions {
            mmap: false,
            lean: Some(false),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(lean.is_lean() && !lean.is_repacked());
    assert!(!mapped.is_lean() && !mapped.is_repacked() && !read.is_repacked());
    let n = 2 * LEAN_BATCH + 22;
    let prompt: Vec<u32> = (0..n as u32).map(|i| 100 + (331 * i) % 49000).collect();
    let split = 2 * LEAN_BATCH;

    let mut a = lean.new_state(256, KvType::F16).unwrap();
    let got = lean
        .forward(&mut a, &prompt, Logits::Last)
        .unwrap()
        .to_vec();
    assert_eq!(a.n_past(), n);
    let mut b = mapped.new_state(256, KvType::F16).unwrap();
    for c in prompt[..split].chunks(LEAN_BATCH) {
        mapped.forward(&mut b, c, Logits::None).unwrap();
    }
    let want = mapped
        .forward(&mut b, &prompt[split..], Logits::Last)
        .unwrap()
        .to_vec();
    assert!(
        got == want,
        "lean pieces differ from the same pieces fed by hand"
    );
    let next = [4321u32];
    assert!(
        lean.forward(&mut a, &next, Logits::Last).unwrap()
            == mapped.forward(&mut b, &next, Logits::Last).unwrap()
    );

    let mut a = lean.new_state(256, KvType::F16).unwrap();
    let mut b = mapped.new_state(256, KvType::F16).unwrap();
    let mut c = read.new_state(256, KvType::F16).unwrap();
    let all = lean.forward(&mut a, &prompt, Logits::All).unwrap().to_vec();
    assert_eq!(all.len(), n * lean.config.vocab_size);
    assert!(all == mapped.forward(&mut b, &prompt, Logits::All).unwrap());
    assert!(all == read.forward(&mut c, &prompt, Logits::All).unwrap());
}

/// Row groups for every format (`RowGroups::Batched`, what speculative decoding and
/// batched serving load) give the logits of the default (`RowGroups::Decode`: Q5_0 in
/// groups, Q4_K and Q6_K in ggml's rows) to the bit — prefill, one-token decode and a pass
/// of decode steps (a speculative check) alike: both layouts of a k-quant sum in block
/// totals at the levels that have group kernels, and the choice changes nothing elsewhere.
/// With no row groups at all (`RowGroups::Off`) the Q5_0 products sum in another order:
/// the logits agree to f32 rounding.
#[test]
fn row_groups_give_the_rows_logits_to_the_bit() {
    let load = |row_groups| {
        Model::load_with(
            common::qwen_path(),
            LoadOptions {
                repack: true,
                lean: Some(false),
                row_groups,
                ..Default::default()
            },
        )
        .unwrap()
    };
    let (rows, groups) = (load(RowGroups::Decode), load(RowGroups::Batched));
    let off = load(RowGroups::Off);
    let level_has_groups =
        |ty| sparrow_quant::Kernels::get(ty).is_some_and(|k| k.dot_q8_groups.is_some());
    assert!(!off.has_row_groups());
    assert_eq!(
        rows.has_row_groups(),
        level_has_groups(sparrow_quant::GgmlType::Q5_0)
    );
    assert_eq!(
        groups.has_row_groups(),
        level_has_groups(sparrow_quant::GgmlType::Q4_K)
    );
    let prompt: Vec<u32> = (0..20).map(|i| 100 + 911 * i).collect();
    // Off against the default: the Q5_0 sums' order differs, and int8 activations carry a
    // last-bit difference into a quantization step now and then, so the logits differ by
    // the noise of any two summation orders on this model (~0.06 RMS, as between SIMD
    // levels), and every clear choice of next token is the same.
    for (p, q) in logits_of(&off, &prompt, 4)
        .iter()
        .zip(&logits_of(&rows, &prompt, 4))
    {
        let rms = (p
            .iter()
            .zip(q)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum::<f64>()
            / p.len() as f64)
            .sqrt();
        assert!(
            rms < 0.15,
            "no row groups vs Q5_0 in groups: {rms} RMS apart"
        );
        let best = |v: &[f32]| (0..v.len()).max_by(|&i, &j| v[i].total_cmp(&v[j])).unwrap();
        let (i, j) = (best(p), best(q));
        assert!(
            i == j || (p[i] - p[j]).abs() < 0.5,
            "next token {i} vs {j} at a margin of {}",
            p[i] - p[j]
        );
    }
    let a = logits_of(&rows, &prompt, 4);
    let b = logits_of(&groups, &prompt, 4);
    let steps = |m: &Model| {
        let mut st = m.new_state(256, KvType::F16).unwrap();
        m.forward(&mut st, &prompt[..7], Logits::Last).unwrap();
        m.forward_steps(&mut st, &prompt[7..13], Logits::All)
            .unwrap()
            .to_vec()
    };
    for (what, x, y) in [
        ("prefill and decode", a.concat(), b.concat()),
        ("decode steps", steps(&rows), steps(&groups)),
    ] {
        let differ = x
            .iter()
            .zip(&y)
            .filter(|(p, q)| p.to_bits() != q.to_bits())
            .count();
        assert_eq!(differ, 0, "{what}: {differ} logits differ");
    }
}
