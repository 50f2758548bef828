// Gradient noise injection (docs/formulas.md): additive annealed Gaussian noise
// (Neelakantan et al. 2015) and multiplicative per-sample loss weights
// (Hoffer, Hubara, Soudry 2017), each with its own seedable generator.
#pragma once

#include <ATen/ATen.h>
#include <torch/arg.h>

#include <cstdint>
#include <vector>

namespace bigbatch::noise {

/// Options of AnnealedGradientNoise. eta is a VARIANCE (0.01, 0.3 or 1.0 in
/// the paper), not a standard deviation.
struct AnnealedNoiseOptions {
  explicit AnnealedNoiseOptions(double eta);
  TORCH_ARG(double, eta);
  TORCH_ARG(double, gamma) = 0.55;
  TORCH_ARG(std::uint64_t, seed) = 0;
};

/// g += N(0, s_t^2), s_t^2 = eta / (1 + t)^gamma, on every defined gradient,
/// after backward and before the optimizer step. The noise of step t is a pure
/// function of (seed, t): a resumed run draws the same noise, and CPU and CUDA
/// gradients get the same values (drawn in fp32 on the CPU, then moved).
class AnnealedGradientNoise {
 public:
  explicit AnnealedGradientNoise(AnnealedNoiseOptions options);

  /// s_t^2 for step t (0-based).
  double variance(std::int64_t step) const;
  /// Adds the noise of step t to the gradients of `params` (in order).
  void apply(const std::vector<at::Tensor>& params, std::int64_t step) const;

  const AnnealedNoiseOptions& options() const { return options_; }

 private:
  AnnealedNoiseOptions options_;
};

/// Multiplicative noise: each sample's loss is weighted by z_n ~ N(1, sigma^2),
/// sigma^2 = M / M0 - 1, so the gradient of a batch M has the covariance of a
/// batch M0 without per-sample gradients. Use weighted_mean() in place of
/// loss.mean().
class MultiplicativeNoise {
 public:
  /// base_batch: M0, the small batch whose gradient noise is imitated.
  MultiplicativeNoise(std::int64_t base_batch, std::uint64_t seed = 0);

  /// M / M0 - 1 (M >= M0).
  double variance(std::int64_t batch) const;
  /// z ~ N(1, variance(batch)) of shape [batch], a pure function of (seed, step).
  at::Tensor weights(std::int64_t batch, std::int64_t step,
                     const at::TensorOptions& options = at::kFloat) const;
  /// mean_n(z_n * loss_n) for a per-sample loss of shape [M].
  at::Tensor weighted_mean(const at::Tensor& per_sample_loss, std::int64_t step) const;

  std::int64_t base_batch() const { return base_batch_; }

 private:
  std::int64_t base_batch_;
  std::uint64_t seed_;
};

}  // namespace bigbatch::noise
