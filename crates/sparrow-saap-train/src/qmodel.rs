//! The Q-model: a small MLP mapping a de-roped query to a distribution over the buckets,
//! trained to match where the query's attention mass lies (the paper's Eq. 1).
//!
//! `Linear(d→hidden) → BatchNorm1d → ReLU → Linear(hidden→C) → log_softmax`, optionally
//! over a fixed prior (the query's similarity to the centroids scaled by `1/√d`, the
//! `kmeans` router's logits: the MLP, starting at zero, learns a correction to it), loss
//! `KL(target ‖ prediction) = Σ target·(log target − log pred)` averaged over the batch,
//! Adam (candle-nn's `AdamW` with no weight decay) on shuffled mini-batches, learning rate
//! decayed along a half cosine to a tenth (few steps need a large rate early and a small
//! one to settle).
//!
//! Batch normalisation runs in training mode (batch statistics) while fitting and in
//! evaluation mode (running statistics) afterwards. The running statistics are recomputed
//! over the whole training set with the final weights (not a moving average over the last
//! batches of a still-moving model), then folded into the first layer for export, since
//! the engine's [`sparrow::saap::HeadModel`] has no normalisation:
//! `s = γ/√(var+ε)`, `w1' = s·w1`, `b1' = s·(b1 − mean) + β`.

use candle_core::{DType, Device, Tensor, Var, D};
use candle_nn::{AdamW, BatchNorm, Linear, Module, ModuleT, Optimizer, ParamsAdamW};
use rand::seq::SliceRandom;
use rand::Rng;

/// How the Q-model is fitted.
#[derive(Clone, Debug, PartialEq)]
pub struct QModelSettings {
    /// Hidden width.
    pub hidden: usize,
    /// Optimisation steps and examples per step.
    pub steps: usize,
    pub batch: usize,
    /// Adam's peak learning rate (decayed to a tenth along a half cosine).
    pub learning_rate: f64,
    /// The centroids (`C × d`) whose scaled similarities to the query the logits start
    /// from; `None`: the paper's plain MLP.
    pub prior: Option<Vec<f32>>,
}

/// Batch normalisation's ε and running-statistics momentum (PyTorch's defaults).
const BN_EPS: f64 = 1e-5;
const BN_MOMENTUM: f64 = 0.1;
/// The learning rate ends at this fraction of its peak.
const FINAL_LR: f64 = 0.1;

/// The MLP's parameters and its batch normalisation.
pub struct QModel {
    pub w1: Var,
    pub b1: Var,
    pub gamma: Var,
    pub beta: Var,
    pub w2: Var,
    pub b2: Var,
    bn: BatchNorm,
    /// `centroidsᵀ / √d` (`d × C`), added to the logits; not trained.
    prior: Option<Tensor>,
}

/// Uniform in `±1/√fan_in` (PyTorch's `Linear` initialisation), from `rng`.
fn uniform(
    shape: (usize, usize),
    fan_in: usize,
    dtype: DType,
    rng: &mut impl Rng,
) -> candle_core::Result<Var> {
    let bound = 1.0 / (fan_in as f64).sqrt();
    let v: Vec<f64> = (0..shape.0 * shape.1)
        .map(|_| rng.random_range(-bound..bound))
        .collect();
    let t = Tensor::from_vec(v, shape, &Device::Cpu)?.to_dtype(dtype)?;
    let t = if shape.0 == 1 { t.flatten_all()? } else { t };
    Var::from_tensor(&t)
}

impl QModel {
    /// A freshly initialised model for `d`-dimensional queries, `hidden` units and
    /// `clusters` buckets, in `dtype` (f32 to train; f64 for gradient checks). With a
    /// `prior` (centroids, `clusters × d`) the second layer starts at zero, so the model
    /// starts as the centroid router.
    pub fn new(
        d: usize,
        hidden: usize,
        clusters: usize,
        prior: Option<&[f32]>,
        dtype: DType,
        rng: &mut impl Rng,
    ) -> candle_core::Result<QModel> {
        let dev = Device::Cpu;
        let w1 = uniform((hidden, d), d, dtype, rng)?;
        let b1 = uniform((1, hidden), d, dtype, rng)?;
        let (w2, b2) = match prior {
            None => (
                uniform((clusters, hidden), hidden, dtype, rng)?,
                uniform((1, clusters), hidden, dtype, rng)?,
            ),
            Some(_) => (
                Var::zeros((clusters, hidden), dtype, &dev)?,
                Var::zeros(clusters, dtype, &dev)?,
            ),
        };
        let prior = match prior {
            None => None,
            Some(c) => {
                let scale = sparrow::saap::prior_scale(d) as f64;
                let t = Tensor::from_slice(c, (clusters, d), &dev)?.to_dtype(dtype)?;
                Some((t.t()?.contiguous()? * scale)?)
            }
        };
        let gamma = Var::ones(hidden, dtype, &dev)?;
        let beta = Var::zeros(hidden, dtype, &dev)?;
        let bn = BatchNorm::new_with_momentum(
            hidden,
            Tensor::zeros(hidden, dtype, &dev)?,
            Tensor::ones(hidden, dtype, &dev)?,
            gamma.as_tensor().clone(),
            beta.as_tensor().clone(),
            BN_EPS,
            BN_MOMENTUM,
        )?;
        Ok(QModel {
            w1,
            b1,
            gamma,
            beta,
            w2,
            b2,
            bn,
            prior,
        })
    }

    /// The trained parameters (not the running statistics).
    pub fn vars(&self) -> Vec<Var> {
        vec![
            self.w1.clone(),
            self.b1.clone(),
            self.gamma.clone(),
            self.beta.clone(),
            self.w2.clone(),
            self.b2.clone(),
        ]
    }

    /// The first layer's output, before normalisation.
    fn pre_norm(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        Linear::new(
            self.w1.as_tensor().clone(),
            Some(self.b1.as_tensor().clone()),
        )
        .forward(x)
    }

    /// Log-probabilities over the buckets of each row of `x` (`rows × d`); batch
    /// statistics when `train` (and the running ones updated), running ones otherwise.
    pub fn forward_t(&self, x: &Tensor, train: bool) -> candle_core::Result<Tensor> {
        let h = self.bn.forward_t(&self.pre_norm(x)?, train)?.relu()?;
        let mut logits = Linear::new(
            self.w2.as_tensor().clone(),
            Some(self.b2.as_tensor().clone()),
        )
        .forward(&h)?;
        if let Some(p) = &self.prior {
            logits = (logits + x.matmul(p)?)?;
        }
        candle_nn::ops::log_softmax(&logits, D::Minus1)
    }

    /// Running mean and variance of the normalisation.
    pub fn running_stats(&self) -> (&Tensor, &Tensor) {
        (self.bn.running_mean(), self.bn.running_var())
    }

    /// Replace the running statistics by the exact mean and (unbiased) variance of the
    /// first layer's output over `x`.
    pub fn calibrate(&mut self, x: &Tensor) -> candle_core::Result<()> {
        let h = self.pre_norm(x)?.detach();
        let n = h.dim(0)?;
        let mean = h.mean(0)?;
        let var = (h.broadcast_sub(&mean)?.sqr()?.sum(0)? / (n.max(2) - 1) as f64)?;
        self.set_running_stats(mean, var)
    }

    /// Set the running statistics (tests set arbitrary ones).
    pub fn set_running_stats(&mut self, mean: Tensor, var: Tensor) -> candle_core::Result<()> {
        self.bn = BatchNorm::new_with_momentum(
            self.b1.dim(0)?,
            mean,
            var,
            self.gamma.as_tensor().clone(),
            self.beta.as_tensor().clone(),
            BN_EPS,
            BN_MOMENTUM,
        )?;
        Ok(())
    }

    /// `(w1, b1, w2, b2)` for [`sparrow::saap::HeadModel`]: the evaluation-mode
    /// normalisation folded into the first layer (in f64, rounded once).
    pub fn export(&self) -> candle_core::Result<[Vec<f32>; 4]> {
        let v = |t: &Tensor| -> candle_core::Result<Vec<f64>> {
            t.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()
        };
        let (w1, b1) = (v(self.w1.as_tensor())?, v(self.b1.as_tensor())?);
        let (gamma, beta) = (v(self.gamma.as_tensor())?, v(self.beta.as_tensor())?);
        let (mean, var) = (v(self.bn.running_mean())?, v(self.bn.running_var())?);
        let d = w1.len() / b1.len();
        let mut fw1 = Vec::with_capacity(w1.len());
        let mut fb1 = Vec::with_capacity(b1.len());
        for j in 0..b1.len() {
            let s = gamma[j] / (var[j] + BN_EPS).sqrt();
            fw1.extend(w1[j * d..][..d].iter().map(|&w| (s * w) as f32));
            fb1.push((s * (b1[j] - mean[j]) + beta[j]) as f32);
        }
        let f = |x: Vec<f64>| x.into_iter().map(|v| v as f32).collect();
        Ok([
            fw1,
            fb1,
            f(v(self.w2.as_tensor())?),
            f(v(self.b2.as_tensor())?),
        ])
    }
}

/// `mean_rows KL(target ‖ pred)`, with `log_pred` and `target` `rows × C` and `neg_entropy`
/// (`rows`) each target's `Σ t·log t` (0·log 0 = 0), a constant.
pub fn kl_loss(
    log_pred: &Tensor,
    target: &Tensor,
    neg_entropy: &Tensor,
) -> candle_core::Result<Tensor> {
    (neg_entropy - (target * log_pred)?.sum(D::Minus1)?)?.mean_all()
}

/// Training examples: de-roped queries and their per-bucket attention masses.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Examples {
    pub d: usize,
    pub clusters: usize,
    /// `n × d`.
    pub queries: Vec<f32>,
    /// `n × C`.
    pub targets: Vec<f32>,
}

impl Examples {
    /// An empty set for `d`-dimensional queries over `clusters` buckets.
    pub fn new(d: usize, clusters: usize) -> Examples {
        Examples {
            d,
            clusters,
            ..Examples::default()
        }
    }

    /// Examples held.
    pub fn len(&self) -> usize {
        self.queries.len() / self.d.max(1)
    }

    /// Whether none are held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Add one.
    pub fn push(&mut self, query: &[f32], target: &[f32]) {
        self.queries.extend_from_slice(query);
        self.targets.extend_from_slice(target);
    }

    /// `(queries, targets, Σ t·log t per row)` as tensors of `dtype`.
    fn tensors(&self, dtype: DType) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
        let dev = Device::Cpu;
        let n = self.len();
        let neg_entropy: Vec<f32> = self
            .targets
            .chunks_exact(self.clusters)
            .map(|t| {
                t.iter()
                    .filter(|&&x| x > 0.0)
                    .map(|&x| x as f64 * (x as f64).ln())
                    .sum::<f64>() as f32
            })
            .collect();
        Ok((
            Tensor::from_slice(&self.queries, (n, self.d), &dev)?.to_dtype(dtype)?,
            Tensor::from_slice(&self.targets, (n, self.clusters), &dev)?.to_dtype(dtype)?,
            Tensor::from_vec(neg_entropy, n, &dev)?.to_dtype(dtype)?,
        ))
    }
}

/// A fitted model and how well it fits.
pub struct Fit {
    pub model: QModel,
    /// Mean KL divergence (nats), evaluation mode, on the training and held-out examples.
    pub train_kl: f64,
    pub held_out_kl: Option<f64>,
}

/// Steps between loss reports.
fn report_every(steps: usize) -> usize {
    (steps / 10).max(1)
}

/// Fit a Q-model to `train` (at least 2 examples); `report(step, mean loss since the last
/// report)` is called every tenth of the steps.
pub fn fit(
    train: &Examples,
    held_out: &Examples,
    s: &QModelSettings,
    rng: &mut impl Rng,
    report: &mut dyn FnMut(usize, f64),
) -> candle_core::Result<Fit> {
    let n = train.len();
    assert!(n >= 2, "batch normalisation needs at least 2 examples");
    let mut model = QModel::new(
        train.d,
        s.hidden,
        train.clusters,
        s.prior.as_deref(),
        DType::F32,
        rng,
    )?;
    let (x, t, ne) = train.tensors(DType::F32)?;
    let mut opt = AdamW::new(
        model.vars(),
        ParamsAdamW {
            lr: s.learning_rate,
            weight_decay: 0.0,
            ..ParamsAdamW::default()
        },
    )?;
    let batch = s.batch.clamp(2, n);
    let mut order: Vec<u32> = (0..n as u32).collect();
    let mut next = n; // exhausted: shuffle first
    let (mut sum, mut count) = (0.0, 0);
    for step in 0..s.steps {
        if next + batch > n {
            order.shuffle(rng);
            next = 0;
        }
        let ids = Tensor::from_slice(&order[next..next + batch], batch, &Device::Cpu)?;
        next += batch;
        let progress = step as f64 / s.steps.max(1) as f64;
        let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        opt.set_learning_rate(s.learning_rate * (FINAL_LR + (1.0 - FINAL_LR) * cosine));
        let log_pred = model.forward_t(&x.index_select(&ids, 0)?, true)?;
        let loss = kl_loss(
            &log_pred,
            &t.index_select(&ids, 0)?,
            &ne.index_select(&ids, 0)?,
        )?;
        opt.backward_step(&loss)?;
        sum += loss.to_scalar::<f32>()? as f64;
        count += 1;
        if (step + 1) % report_every(s.steps) == 0 || step + 1 == s.steps {
            report(step + 1, sum / count as f64);
            (sum, count) = (0.0, 0);
        }
    }
    model.calibrate(&x)?;
    let train_kl = mean_kl(&model, train)?;
    let held_out_kl = if held_out.is_empty() {
        None
    } else {
        Some(mean_kl(&model, held_out)?)
    };
    Ok(Fit {
        model,
        train_kl,
        held_out_kl,
    })
}

/// Mean KL divergence of `model` (evaluation mode) on `examples`.
pub fn mean_kl(model: &QModel, examples: &Examples) -> candle_core::Result<f64> {
    let (x, t, ne) = examples.tensors(DType::F32)?;
    let loss = kl_loss(&model.forward_t(&x, false)?, &t, &ne)?;
    Ok(loss.to_scalar::<f32>()? as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn random(rows: usize, cols: usize, rng: &mut ChaCha8Rng) -> Vec<f32> {
        (0..rows * cols)
            .map(|_| rng.random_range(-1.5..1.5))
            .collect()
    }

    /// Random distributions (`rows × c`), some entries exactly 0.
    fn distributions(rows: usize, c: usize, rng: &mut ChaCha8Rng) -> Vec<f32> {
        let mut out = Vec::new();
        for _ in 0..rows {
            let mut r: Vec<f32> = (0..c)
                .map(|i| {
                    if i % 3 == 1 {
                        0.0
                    } else {
                        rng.random_range(0.0..1.0)
                    }
                })
                .collect();
            let z: f32 = r.iter().sum();
            r.iter_mut().for_each(|x| *x /= z);
            out.extend(r);
        }
        out
    }

    /// The autograd gradient of the KL loss (training-mode batch normalisation) with
    /// respect to every parameter equals central finite differences, in f64: the plain
    /// MLP and the MLP over the centroid prior.
    #[test]
    fn kl_gradient_matches_finite_differences() {
        kl_gradient_check(false);
        kl_gradient_check(true);
    }

    fn kl_gradient_check(with_prior: bool) {
        let (d, h, c, rows) = (3, 5, 4, 6);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let centroids = random(c, d, &mut rng);
        let prior = with_prior.then_some(centroids.as_slice());
        let model = QModel::new(d, h, c, prior, DType::F64, &mut rng).unwrap();
        // A non-zero second layer (the prior's starts at zero, where the first layer's
        // gradients vanish).
        let w2: Vec<f64> = (0..c * h).map(|_| rng.random_range(-1.0..1.0)).collect();
        model
            .w2
            .set(&Tensor::from_vec(w2, (c, h), &Device::Cpu).unwrap())
            .unwrap();
        // Non-trivial γ, β.
        model
            .gamma
            .set(&Tensor::new(&[0.5f64, 1.5, -0.7, 1.1, 0.9], &Device::Cpu).unwrap())
            .unwrap();
        model
            .beta
            .set(&Tensor::new(&[0.1f64, -0.3, 0.2, 0.0, 0.4], &Device::Cpu).unwrap())
            .unwrap();
        let mut ex = Examples::new(d, c);
        let (q, t) = (random(rows, d, &mut rng), distributions(rows, c, &mut rng));
        for i in 0..rows {
            ex.push(&q[i * d..][..d], &t[i * c..][..c]);
        }
        let (x, t, ne) = ex.tensors(DType::F64).unwrap();
        let loss_of = |m: &QModel| -> f64 {
            kl_loss(&m.forward_t(&x, true).unwrap(), &t, &ne)
                .unwrap()
                .to_scalar::<f64>()
                .unwrap()
        };
        let loss = kl_loss(&model.forward_t(&x, true).unwrap(), &t, &ne).unwrap();
        assert!(loss.to_scalar::<f64>().unwrap() > 0.0);
        let grads = loss.backward().unwrap();
        let eps = 1e-6;
        let mut checked = 0;
        for var in model.vars() {
            let g = grads.get(var.as_tensor()).expect("a gradient");
            let g: Vec<f64> = g.flatten_all().unwrap().to_vec1().unwrap();
            let shape = var.shape().clone();
            let base: Vec<f64> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
            for (i, &gi) in g.iter().enumerate() {
                let at = |delta: f64| {
                    let mut v = base.clone();
                    v[i] += delta;
                    var.set(&Tensor::from_vec(v, &shape, &Device::Cpu).unwrap())
                        .unwrap();
                    loss_of(&model)
                };
                let fd = (at(eps) - at(-eps)) / (2.0 * eps);
                at(0.0);
                assert!(
                    (fd - gi).abs() < 1e-6 * (1.0 + fd.abs()),
                    "param {:?}[{i}]: autograd {gi} vs finite differences {fd}",
                    shape
                );
                checked += 1;
            }
        }
        assert_eq!(checked, h * d + h + h + h + c * h + c);
    }

    /// The exported (normalisation folded) model's distribution is the candle model's
    /// evaluation-mode softmax, on random inputs and random running statistics: the plain
    /// MLP and the MLP over the centroid prior.
    #[test]
    fn folded_export_matches_eval_forward() {
        folded_export_check(false);
        folded_export_check(true);
    }

    fn folded_export_check(with_prior: bool) {
        let (d, h, c) = (6, 9, 5);
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let centroids = random(c, d, &mut rng);
        let prior = with_prior.then_some(centroids.as_slice());
        let mut model = QModel::new(d, h, c, prior, DType::F32, &mut rng).unwrap();
        let dev = Device::Cpu;
        model
            .w2
            .set(&Tensor::from_vec(random(c, h, &mut rng), (c, h), &dev).unwrap())
            .unwrap();
        model
            .gamma
            .set(&Tensor::from_vec(random(1, h, &mut rng), h, &dev).unwrap())
            .unwrap();
        model
            .beta
            .set(&Tensor::from_vec(random(1, h, &mut rng), h, &dev).unwrap())
            .unwrap();
        let var: Vec<f32> = (0..h).map(|_| rng.random_range(0.2..3.0)).collect();
        model
            .set_running_stats(
                Tensor::from_vec(random(1, h, &mut rng), h, &dev).unwrap(),
                Tensor::from_vec(var, h, &dev).unwrap(),
            )
            .unwrap();
        let [w1, b1, w2, b2] = model.export().unwrap();
        let head = sparrow::saap::HeadModel {
            centroids,
            centroid_bias: vec![0.0; c],
            w1,
            b1,
            w2,
            b2,
            prior_scale: if with_prior {
                sparrow::saap::prior_scale(d)
            } else {
                0.0
            },
        };
        let rows = 7;
        let q = random(rows, d, &mut rng);
        let want: Vec<Vec<f32>> = model
            .forward_t(&Tensor::from_slice(&q, (rows, d), &dev).unwrap(), false)
            .unwrap()
            .exp()
            .unwrap()
            .to_vec2()
            .unwrap();
        for (r, w) in want.iter().enumerate() {
            let mut mass = vec![0f32; c];
            head.add_mass(
                sparrow::saap::Router::Qmodel,
                head.weights(),
                sparrow::saap::Level::active(),
                &q[r * d..][..d],
                &mut sparrow::saap::Scratch::default(),
                &mut mass,
            );
            for (a, b) in mass.iter().zip(w) {
                assert!((a - b).abs() < 1e-5, "row {r}: {a} vs {b}");
            }
        }
        // And it is not the training-mode forward (the modes differ on this data).
        let train: Vec<Vec<f32>> = model
            .forward_t(&Tensor::from_slice(&q, (rows, d), &dev).unwrap(), true)
            .unwrap()
            .exp()
            .unwrap()
            .to_vec2()
            .unwrap();
        let diff: f32 = train
            .iter()
            .flatten()
            .zip(want.iter().flatten())
            .map(|(a, b)| (a - b).abs())
            .sum();
        assert!(diff > 1e-3);
    }

    /// Over the centroid prior an untrained model is the centroid router: the softmax of
    /// the query's inner products with the centroids over `√d`, against f64.
    #[test]
    fn untrained_over_the_prior_is_the_centroid_router() {
        let (d, h, c, rows) = (5, 4, 6, 3);
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let centroids = random(c, d, &mut rng);
        let model = QModel::new(d, h, c, Some(&centroids), DType::F32, &mut rng).unwrap();
        let q = random(rows, d, &mut rng);
        let x = Tensor::from_slice(&q, (rows, d), &Device::Cpu).unwrap();
        let got: Vec<Vec<f32>> = model
            .forward_t(&x, false)
            .unwrap()
            .exp()
            .unwrap()
            .to_vec2()
            .unwrap();
        for (r, row) in got.iter().enumerate() {
            let logits: Vec<f64> = (0..c)
                .map(|k| {
                    (0..d)
                        .map(|i| centroids[k * d + i] as f64 * q[r * d + i] as f64)
                        .sum::<f64>()
                        / (d as f64).sqrt()
                })
                .collect();
            let z: f64 = logits.iter().map(|l| l.exp()).sum();
            for (a, l) in row.iter().zip(&logits) {
                assert!((*a as f64 - l.exp() / z).abs() < 1e-5, "row {r}: {a}");
            }
        }
    }

    /// Fitting lowers the loss on a learnable mapping and calibrates the running
    /// statistics to the training set.
    #[test]
    fn fit_learns_and_calibrates() {
        let (d, c) = (4, 4);
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut ex = Examples::new(d, c);
        for _ in 0..400 {
            let q = random(1, d, &mut rng);
            // Mass on the bucket of the largest coordinate.
            let k = (0..d).max_by(|&a, &b| q[a].total_cmp(&q[b])).unwrap();
            let mut t = vec![0.02f32; c];
            t[k] = 0.94;
            ex.push(&q, &t);
        }
        let s = QModelSettings {
            hidden: 16,
            steps: 300,
            batch: 64,
            learning_rate: 1e-2,
            prior: None,
        };
        let mut losses = Vec::new();
        let fit = fit(&ex, &Examples::new(d, c), &s, &mut rng, &mut |_, l| {
            losses.push(l)
        })
        .unwrap();
        assert_eq!(losses.len(), 10);
        assert!(losses[9] < losses[0] * 0.5, "{losses:?}");
        // From about 1.09 nats for the uniform start.
        assert!(fit.train_kl < 0.3, "{}", fit.train_kl);
        let (x, _, _) = ex.tensors(DType::F32).unwrap();
        let h: Vec<Vec<f32>> = fit.model.pre_norm(&x).unwrap().to_vec2().unwrap();
        let mean: Vec<f32> = fit.model.running_stats().0.to_vec1().unwrap();
        for j in 0..16 {
            let m = h.iter().map(|r| r[j] as f64).sum::<f64>() / 400.0;
            assert!((m - mean[j] as f64).abs() < 1e-4);
        }
    }
}
