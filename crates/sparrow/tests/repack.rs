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

use sparrow::{KvType, LoadOptions, Logits, Model};
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
    let mapped = Model::load_with(common::qwen_path(), LoadOptions { repack: false }).unwrap();
    let repacked = Model::load_with(common::qwen_path(), LoadOptions { repack: true }).unwrap();
    // 20 tokens: the batched prefill takes the panel path (16+) on AVX2 machines
    let prompt: Vec<u32> = (0..20).map(|i| 100 + 911 * i).collect();
    for (short, long) in [(&prompt[..3], 4), (&prompt[..], 4)] {
        let a = logits_of(&mapped, short, long);
        let b = logits_of(&repacked, short, long);
        if SimdLevel::active() != SimdLevel::Avx512 {
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
