//! The fused dequant-dot against dequantize-then-dot computed in f64, for every supported
//! type, on random blocks.
//!
//! Tolerance: |dot - ref| <= 1e-5 * sum_i |w_i x_i|. The bound is relative to the sum of
//! magnitudes rather than to |ref| because with random signs the true dot can be near zero
//! (cancellation), where no f32 summation can promise a relative error; sum |w_i x_i| is the
//! scale at which f32 rounding errors are made. f32 summation of a 256-element block in eight
//! lanes has a worst-case error of about 32 * 2^-24 ~ 2e-6 of that scale, and block sums are
//! carried in f64, so 1e-5 leaves margin without hiding a wrong weight (a single wrong
//! quant in a 4096-element row moves the dot by ~1e-4 of sum |w x|).

mod common;

use common::{random_row, ref_dot, Rng, SUPPORTED};
use sparrow_quant::{dequantize, dot, Kernels, SimdLevel};

#[test]
fn fused_dot_matches_f64_dequantize_then_dot() {
    let mut rng = Rng::new(7);
    for &ty in SUPPORTED {
        let mut worst = 0f64;
        let be = ty.block_elems().max(32);
        for n_blocks in [1usize, 3, 17] {
            for _ in 0..8 {
                let n = be * n_blocks;
                let row = random_row(&mut rng, ty, n);
                let x = rng.vec(n);
                let mut w = vec![0f32; n];
                dequantize(ty, &row, &mut w).unwrap();
                let (exact, abs) = ref_dot(&w, &x);
                let got = dot(ty, &row, &x).unwrap() as f64;
                worst = worst.max((got - exact).abs() / abs);
                assert!(
                    (got - exact).abs() <= 1e-5 * abs,
                    "{ty}, {n} elements: fused dot {got:e}, f64 reference {exact:e}, \
                     sum|wx| {abs:e}, error {:e} of sum|wx|",
                    (got - exact).abs() / abs
                );
            }
        }
        eprintln!("{ty}: worst |dot - ref| / sum|wx| = {worst:.2e}");
    }
}

#[test]
fn dispatch_picks_a_supported_level_with_kernels_for_every_type() {
    let active = SimdLevel::active();
    assert!(active.is_supported());
    eprintln!(
        "active level: {}, supported: {:?}",
        active.name(),
        SimdLevel::supported()
    );
    for &ty in SUPPORTED {
        let (a, b) = (Kernels::get(ty).unwrap(), Kernels::scalar(ty).unwrap());
        assert_eq!((a.ty, a.level), (ty, active));
        assert_eq!((b.ty, b.level), (ty, SimdLevel::Scalar));
        for level in SimdLevel::supported() {
            let k = Kernels::for_level(ty, level).unwrap();
            assert_eq!((k.ty, k.level), (ty, level));
            // int8 kernels exist exactly for the quantized formats, at every level
            assert_eq!(k.dot_q8.is_some(), b.dot_q8.is_some());
        }
        assert!(ty.has_kernels());
    }
}
