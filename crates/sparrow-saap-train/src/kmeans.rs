//! K-means of one head's de-roped keys: the partition Saap reads buckets of.
//!
//! Lloyd's algorithm with a random initialisation from distinct keys, as the paper's
//! Appendix A (10 iterations, the Faiss IVF default). The assignment step, which is all
//! the cost (`points × C × head_dim`), is one matrix product per block of points (candle's
//! gemm), scored exactly as the engine assigns keys ([`sparrow::saap::HeadModel::assign`]):
//! `argmax_c centroid_c · x + bias_c`, with bias `-‖c‖²/2` (nearest centroid) for standard
//! k-means, or unit centroids and bias 0 (most similar direction) for spherical k-means.

use candle_core::{Device, Tensor};
use rand::Rng;

/// How a head's keys are clustered.
#[derive(Clone, Debug, PartialEq)]
pub struct KMeansSettings {
    /// Buckets `C`.
    pub clusters: usize,
    /// Lloyd iterations.
    pub iterations: usize,
    /// Unit centroids compared by inner product instead of nearest centroid.
    pub spherical: bool,
    /// Keys clustered at most per centroid: more are subsampled uniformly (Faiss's
    /// `max_points_per_centroid`; k-means' centroids stop moving long before).
    pub points_per_centroid: usize,
}

/// A trained partition.
#[derive(Clone, Debug, PartialEq)]
pub struct Partition {
    /// `C × d`.
    pub centroids: Vec<f32>,
    /// `C`: what the engine adds to `centroid · key` before the argmax.
    pub bias: Vec<f32>,
    /// Keys clustered (after subsampling).
    pub points: usize,
    /// Empty clusters re-seeded over all iterations.
    pub reseeded: usize,
}

/// Points scored against all centroids per matrix product (bounds the score block).
const BLOCK_VALUES: usize = 1 << 22;

/// The bias that makes `argmax_c centroid_c · x + bias_c` the k-means assignment:
/// `-‖c‖²/2` (standard), 0 (spherical, unit centroids).
pub fn bias_of(centroids: &[f32], d: usize, spherical: bool) -> Vec<f32> {
    centroids
        .chunks_exact(d)
        .map(|c| {
            if spherical {
                0.0
            } else {
                (-0.5 * c.iter().map(|&x| x as f64 * x as f64).sum::<f64>()) as f32
            }
        })
        .collect()
}

/// The bucket of each point (`n × d`): `argmax_c centroid_c · x + bias_c`, blockwise
/// through a matrix product.
pub fn assign(
    points: &[f32],
    d: usize,
    centroids: &[f32],
    bias: &[f32],
) -> candle_core::Result<Vec<u32>> {
    let c = bias.len();
    let dev = Device::Cpu;
    let ct = Tensor::from_slice(centroids, (c, d), &dev)?.t()?;
    let bt = Tensor::from_slice(bias, (1, c), &dev)?;
    let rows = (BLOCK_VALUES / c.max(1)).max(1);
    let mut out = Vec::with_capacity(points.len() / d.max(1));
    for block in points.chunks(rows * d) {
        let m = block.len() / d;
        let scores = Tensor::from_slice(block, (m, d), &dev)?
            .matmul(&ct)?
            .broadcast_add(&bt)?;
        out.extend(scores.argmax(1)?.to_vec1::<u32>()?);
    }
    Ok(out)
}

/// Scale `v` to unit length (left alone when zero).
fn normalise(v: &mut [f32]) {
    let n = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    if n > 0.0 {
        v.iter_mut().for_each(|x| *x = (*x as f64 / n) as f32);
    }
}

/// One Lloyd iteration: assign every point to its centroid, then move each centroid to the
/// mean of its points (normalised when spherical); an empty cluster is re-seeded from a
/// random point. Returns the assignment used and the clusters re-seeded.
pub fn lloyd_iteration(
    points: &[f32],
    d: usize,
    centroids: &mut [f32],
    spherical: bool,
    rng: &mut impl Rng,
) -> candle_core::Result<(Vec<u32>, usize)> {
    let c = centroids.len() / d;
    let n = points.len() / d;
    let bias = bias_of(centroids, d, spherical);
    let assignment = assign(points, d, centroids, &bias)?;
    let mut sums = vec![0f64; c * d];
    let mut counts = vec![0usize; c];
    for (x, &a) in points.chunks_exact(d).zip(&assignment) {
        counts[a as usize] += 1;
        for (s, &v) in sums[a as usize * d..][..d].iter_mut().zip(x) {
            *s += v as f64;
        }
    }
    let mut reseeded = 0;
    for (k, cent) in centroids.chunks_exact_mut(d).enumerate() {
        if counts[k] == 0 {
            let p = rng.random_range(0..n);
            cent.copy_from_slice(&points[p * d..][..d]);
            reseeded += 1;
        } else {
            for (x, s) in cent.iter_mut().zip(&sums[k * d..][..d]) {
                *x = (s / counts[k] as f64) as f32;
            }
        }
        if spherical {
            normalise(cent);
        }
    }
    Ok((assignment, reseeded))
}

/// K-means of `points` (`n × d`, `n ≥ C`): subsample to `points_per_centroid × C`, pick
/// `C` distinct points as the initial centroids, run the Lloyd iterations.
pub fn kmeans(
    points: &[f32],
    d: usize,
    settings: &KMeansSettings,
    rng: &mut impl Rng,
) -> candle_core::Result<Partition> {
    let n = points.len() / d;
    let c = settings.clusters;
    assert!(n >= c && c > 0, "k-means needs at least C points");
    let cap = settings.points_per_centroid.saturating_mul(c).max(c);
    let sample: Vec<f32>;
    let points = if n > cap {
        let mut idx = rand::seq::index::sample(rng, n, cap).into_vec();
        // Ascending: the same points in the same order whatever order sampling drew them.
        idx.sort_unstable();
        sample = idx
            .iter()
            .flat_map(|&i| &points[i * d..][..d])
            .copied()
            .collect();
        &sample[..]
    } else {
        points
    };
    let n = points.len() / d;
    let mut centroids: Vec<f32> = rand::seq::index::sample(rng, n, c)
        .iter()
        .flat_map(|i| &points[i * d..][..d])
        .copied()
        .collect();
    if settings.spherical {
        centroids.chunks_exact_mut(d).for_each(normalise);
    }
    let mut reseeded = 0;
    for _ in 0..settings.iterations {
        reseeded += lloyd_iteration(points, d, &mut centroids, settings.spherical, rng)?.1;
    }
    let bias = bias_of(&centroids, d, settings.spherical);
    Ok(Partition {
        centroids,
        bias,
        points: n,
        reseeded,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    /// How close centroid `c` is to point `x` in f64: their inner product (spherical), or
    /// minus their squared distance.
    fn closeness(c: &[f32], x: &[f32], spherical: bool) -> f64 {
        if spherical {
            dot64(c, x)
        } else {
            -c.iter()
                .zip(x)
                .map(|(&a, &b)| (a as f64 - b as f64).powi(2))
                .sum::<f64>()
        }
    }

    fn dot64(a: &[f32], b: &[f32]) -> f64 {
        a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
    }

    /// Points scattered around `centers` (`k × d`): `per` each, noise `±noise`.
    fn blobs(centers: &[f32], d: usize, per: usize, noise: f32, rng: &mut ChaCha8Rng) -> Vec<f32> {
        let mut out = Vec::new();
        for _ in 0..per {
            for c in centers.chunks_exact(d) {
                out.extend(c.iter().map(|&x| x + rng.random_range(-noise..noise)));
            }
        }
        out
    }

    /// One Lloyd iteration from a given initialisation equals an f64 reference written
    /// here: assignments (nearest centroid, or most similar unit centroid) and the new
    /// centroids (means, normalised when spherical).
    #[test]
    fn one_iteration_matches_f64_reference() {
        let d = 5;
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let centers: Vec<f32> = (0..4 * d).map(|_| rng.random_range(-3.0..3.0)).collect();
        let points = blobs(&centers, d, 12, 1.0, &mut rng);
        let n = points.len() / d;
        for spherical in [false, true] {
            let mut init: Vec<f32> = [0, 7, 13, 22]
                .iter()
                .flat_map(|&i| points[i * d..][..d].to_vec())
                .collect();
            if spherical {
                init.chunks_exact_mut(d).for_each(normalise);
            }
            let want_assign: Vec<u32> = points
                .chunks_exact(d)
                .map(|x| {
                    let score = |k: usize| closeness(&init[k * d..][..d], x, spherical);
                    (0..4)
                        .max_by(|&a, &b| score(a).total_cmp(&score(b)))
                        .unwrap() as u32
                })
                .collect();
            let mut want = vec![0f64; 4 * d];
            let mut count = [0usize; 4];
            for (x, &a) in points.chunks_exact(d).zip(&want_assign) {
                count[a as usize] += 1;
                for i in 0..d {
                    want[a as usize * d + i] += x[i] as f64;
                }
            }
            for k in 0..4 {
                assert!(count[k] > 0, "reference cluster {k} empty");
                let row = &mut want[k * d..][..d];
                row.iter_mut().for_each(|v| *v /= count[k] as f64);
                if spherical {
                    let norm = row.iter().map(|v| v * v).sum::<f64>().sqrt();
                    row.iter_mut().for_each(|v| *v /= norm);
                }
            }
            let mut got = init.clone();
            let (assignment, reseeded) =
                lloyd_iteration(&points, d, &mut got, spherical, &mut rng).unwrap();
            assert_eq!(assignment, want_assign, "spherical {spherical}");
            assert_eq!(reseeded, 0);
            for (a, b) in got.iter().zip(&want) {
                assert!((*a as f64 - b).abs() < 1e-5, "{a} vs {b}");
            }
            assert_eq!(assignment.len(), n);
        }
    }

    /// Two well-separated blobs are found from any random start (both initial centroids
    /// in one blob included: the other blob pulls the nearer one over).
    #[test]
    fn finds_separated_blobs() {
        let d = 8;
        let k = 2;
        for seed in 0..10 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let centers: Vec<f32> = (0..k * d).map(|_| rng.random_range(-20.0..20.0)).collect();
            let points = blobs(&centers, d, 50, 0.5, &mut rng);
            let s = KMeansSettings {
                clusters: k,
                iterations: 10,
                spherical: false,
                points_per_centroid: 256,
            };
            let part = kmeans(&points, d, &s, &mut rng).unwrap();
            let a = assign(&points, d, &part.centroids, &part.bias).unwrap();
            // Points of blob b are at indices i with i % k == b.
            assert!(
                a.iter().enumerate().all(|(i, &c)| c == a[i % k]),
                "seed {seed}"
            );
            assert_ne!(a[0], a[1], "seed {seed}");
            for b in 0..k {
                let cent = &part.centroids[a[b] as usize * d..][..d];
                for i in 0..d {
                    assert!((cent[i] - centers[b * d + i]).abs() < 0.3, "seed {seed}");
                }
            }
        }
    }

    /// A cluster left empty (here: a duplicate initial centroid, which loses every tie) is
    /// re-seeded from one of the points.
    #[test]
    fn reseeds_empty_clusters() {
        let d = 3;
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let points: Vec<f32> = (0..40 * d).map(|_| rng.random_range(-1.0..1.0)).collect();
        let mut cents: Vec<f32> = [&points[..d], &points[..d], &points[d..2 * d]].concat();
        let (a, reseeded) = lloyd_iteration(&points, d, &mut cents, false, &mut rng).unwrap();
        assert_eq!(reseeded, 1);
        assert!(!a.contains(&1));
        let new = &cents[d..2 * d];
        assert!(points.chunks_exact(d).any(|p| p == new));
    }

    /// Spherical centroids are unit vectors with bias 0; standard ones carry `-‖c‖²/2`, so
    /// the engine's assignment of any point is its nearest centroid (f64 reference).
    #[test]
    fn biases_make_the_engine_assign_like_kmeans() {
        let d = 6;
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let points: Vec<f32> = (0..300 * d).map(|_| rng.random_range(-2.0..2.0)).collect();
        for spherical in [false, true] {
            let s = KMeansSettings {
                clusters: 10,
                iterations: 5,
                spherical,
                points_per_centroid: 256,
            };
            let part = kmeans(&points, d, &s, &mut rng).unwrap();
            let head = sparrow::saap::HeadModel {
                centroids: part.centroids.clone(),
                centroid_bias: part.bias.clone(),
                w1: vec![0.0; d],
                b1: vec![0.0],
                w2: vec![0.0; 10],
                b2: vec![0.0; 10],
                prior_scale: 0.0,
            };
            for (k, c) in part.centroids.chunks_exact(d).enumerate() {
                let norm2 = dot64(c, c);
                if spherical {
                    assert!((norm2 - 1.0).abs() < 1e-5);
                    assert_eq!(part.bias[k], 0.0);
                } else {
                    assert!((part.bias[k] as f64 + norm2 / 2.0).abs() < 1e-5);
                }
            }
            let batch = assign(&points, d, &part.centroids, &part.bias).unwrap();
            for (x, &b) in points.chunks_exact(d).zip(&batch) {
                let score = |k: usize| closeness(&part.centroids[k * d..][..d], x, spherical);
                let mut order: Vec<usize> = (0..10).collect();
                order.sort_by(|&a, &b| score(b).total_cmp(&score(a)));
                if score(order[0]) - score(order[1]) < 1e-4 {
                    continue; // a near tie: f32 may pick either
                }
                let mut got = Vec::new();
                head.assign(
                    sparrow::saap::Level::active(),
                    x,
                    &mut sparrow::saap::Scratch::default(),
                    &mut got,
                );
                assert_eq!(got[0] as usize, order[0]);
                assert_eq!(b as usize, order[0]);
            }
        }
    }

    /// More keys than `points_per_centroid × C` are subsampled.
    #[test]
    fn subsamples_many_points() {
        let d = 3;
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let points: Vec<f32> = (0..1000 * d).map(|_| rng.random_range(-1.0..1.0)).collect();
        let s = KMeansSettings {
            clusters: 4,
            iterations: 2,
            spherical: false,
            points_per_centroid: 16,
        };
        assert_eq!(kmeans(&points, d, &s, &mut rng).unwrap().points, 64);
    }
}
