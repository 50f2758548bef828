// Ghost batch normalization (Hoffer, Hubara, Soudry 2017; docs/formulas.md): in
// training the batch is normalized in chunks of ghost_batch_size, each with its
// own statistics; the running statistics are updated once per chunk, in order.
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>

namespace bigbatch::nn {

/// Options of GhostBatchNorm1d/2d; the BatchNorm options plus the ghost size.
struct GhostBatchNormOptions {
  GhostBatchNormOptions(std::int64_t num_features, std::int64_t ghost_batch_size);
  TORCH_ARG(std::int64_t, num_features);
  /// G: chunks of G examples along dim 0 (the last may be smaller).
  TORCH_ARG(std::int64_t, ghost_batch_size);
  TORCH_ARG(double, eps) = 1e-5;
  /// Running statistics: r = (1 - momentum) * r + momentum * chunk statistic.
  TORCH_ARG(double, momentum) = 0.1;
  TORCH_ARG(bool, affine) = true;
  TORCH_ARG(bool, track_running_stats) = true;
};

/// The shared implementation; D = 1 takes (N, C) or (N, C, L), D = 2 (N, C, H, W).
template <std::size_t D, typename Derived>
class GhostBatchNormImplBase : public torch::nn::Cloneable<Derived> {
 public:
  explicit GhostBatchNormImplBase(GhostBatchNormOptions options);

  /// Training: per-chunk batch statistics (biased variance for normalizing,
  /// unbiased for the running variance, as BatchNorm). Evaluation: running
  /// statistics (batch statistics per chunk without track_running_stats).
  at::Tensor forward(const at::Tensor& input);

  void reset() override;
  void reset_running_stats();
  void pretty_print(std::ostream& stream) const override;

  GhostBatchNormOptions options;
  at::Tensor weight;               ///< gamma, [C] (affine)
  at::Tensor bias;                 ///< beta, [C] (affine)
  at::Tensor running_mean;         ///< [C] (track_running_stats)
  at::Tensor running_var;          ///< [C] (track_running_stats)
  at::Tensor num_batches_tracked;  ///< chunks seen in training (track_running_stats)
};

class GhostBatchNorm1dImpl : public GhostBatchNormImplBase<1, GhostBatchNorm1dImpl> {
 public:
  using GhostBatchNormImplBase::GhostBatchNormImplBase;
};
TORCH_MODULE(GhostBatchNorm1d);

class GhostBatchNorm2dImpl : public GhostBatchNormImplBase<2, GhostBatchNorm2dImpl> {
 public:
  using GhostBatchNormImplBase::GhostBatchNormImplBase;
};
TORCH_MODULE(GhostBatchNorm2d);

}  // namespace bigbatch::nn
