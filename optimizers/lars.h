// LARS: layer-wise adaptive rate scaling (You, Gitman, Ginsburg 2017,
// arXiv:1708.03888). docs/formulas.md, per tensor:
//   ratio = adapts ? tc*||w|| / (||g|| + wd*||w|| + eps) : 1  (1 where ||w|| or ||g|| is 0)
//           adapts = adapt and (always_adapt or wd != 0)       (always_adapt false: timm's rule)
//   d = g + wd*w
//   v = momentum*v + lr*ratio*d                               (v starts at 0)
//   w = w - v          nesterov: w = w - (momentum*v + lr*ratio*d)
// The learning rate sits inside the momentum buffer, as in the paper and optax.
// As a chain of steps: add decayed weights -> trust ratio -> scale by lr -> momentum.
#pragma once

#include "../kernels/momentum.h"
#include "layerwise_optimizer.h"

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <vector>

namespace bigbatch::optim {

struct LARSOptions : public torch::optim::OptimizerCloneableOptions<LARSOptions> {
  LARSOptions(double lr);  // NOLINT(google-explicit-constructor): as LibTorch
  TORCH_ARG(double, lr);
  TORCH_ARG(double, momentum) = 0.9;
  TORCH_ARG(double, weight_decay) = 0;
  /// tc, the trust coefficient (eta in the paper).
  TORCH_ARG(double, trust_coefficient) = 1e-3;
  TORCH_ARG(double, eps) = 0;
  TORCH_ARG(bool, nesterov) = false;
  /// false: no trust ratio for this group (biases, normalization parameters).
  TORCH_ARG(bool, adapt) = true;
  /// With adapt: true, the trust ratio in every group; false, only in groups
  /// whose weight_decay is not 0 (timm's LARS and LARC, where false is the
  /// default: a port from timm sets always_adapt(false) to keep its behaviour).
  TORCH_ARG(bool, always_adapt) = true;
  /// A step with inf/NaN gradients changes nothing and is counted in skipped_steps().
  TORCH_ARG(bool, skip_nonfinite) = true;
  /// true: the fused kernels (CPU, or CUDA in builds with BIGBATCH_CUDA);
  /// false: the reference path in plain ATen ops.
  TORCH_ARG(bool, fused) = true;
  /// Keep an fp32 copy of bf16/fp16 parameters in the state: the step updates
  /// the copy and rounds it into the parameter (no effect on fp32 parameters).
  TORCH_ARG(bool, master_weights) = false;

 public:
  /// Throws c10::Error naming the first invalid option and its value.
  void validate() const;
  double get_lr() const override { return lr(); }
  void set_lr(const double new_lr) override { lr(new_lr); }
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  friend bool operator==(const LARSOptions& lhs, const LARSOptions& rhs);
  ~LARSOptions() override = default;

 private:
  /// Every option above as (archive key, reference), in order (lars.cpp): a
  /// structured binding, so an option added above and not there does not compile.
  template <typename Self>
  static auto fields(Self& self);
};

struct LARSParamState : public torch::optim::OptimizerCloneableParamState<LARSParamState> {
  TORCH_ARG(torch::Tensor, momentum_buffer);  ///< v, fp32 (holds the learning rate)
  TORCH_ARG(torch::Tensor, master);  ///< fp32 copy of a 16-bit parameter (master_weights)

 public:
  /// Zeroed fp32 state for `param`, made on its first step.
  static LARSParamState fresh(const at::Tensor& param);
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  /// Bytes of its tensors (the moments, buffers and master copy it holds).
  std::int64_t tensor_bytes() const;
  /// Its fields by name (step, moments, master copy), as moved between
  /// optimizers that cut the tensor differently (distributed/sharded.h).
  NamedState named() const;
  void set_named(const NamedState& values);
  /// Its fields as declared (names, and which are counts or per-tensor numbers).
  static std::vector<StateField> declared();
  friend bool operator==(const LARSParamState& lhs, const LARSParamState& rhs);
  ~LARSParamState() override = default;

 private:
  /// Every state field above as (archive key, reference), in order (lars.cpp): a
  /// structured binding, so a state field added above and not there does not compile.
  template <typename Self>
  static auto fields(Self& self);
};

/// One group's options as the fused plan (momentum.h in kernels/) takes them: every
/// option the step reads (fused and master_weights choose the path instead).
kernels::LarsGroup kernel_group(const LARSOptions& options);

/// LARS as a drop-in torch::optim::Optimizer.
class LARS : public LayerwiseOptimizer<LARSOptions, LARSParamState> {
 public:
  /// One LARS step (lars.cpp): the fused plan (kernels::LarsPlan) on the CPU or CUDA
  /// runner, or the reference path in ATen ops (options().fused(false)).
  torch::Tensor step(LossClosure closure = nullptr) override;

  explicit LARS(std::vector<torch::optim::OptimizerParamGroup> param_groups, LARSOptions defaults);
  explicit LARS(std::vector<torch::Tensor> params, LARSOptions defaults);

  /// Multiplies every momentum buffer by `factor` (finite, >= 0). LARS's
  /// buffer holds the learning rate, so when the rate changes from lr_a to
  /// lr_b the buffer is rescaled by lr_b / lr_a to keep the step it carries
  /// consistent: the momentum correction of Goyal et al. 2017
  /// (docs/formulas.md "Warmup"). Hand it to schedules::LRAdapter as
  /// `[&lars](double f) { lars.rescale_momentum(f); }`. Tensors without state
  /// (no step yet) have nothing to rescale.
  void rescale_momentum(double factor);

 protected:
  void step_reference(const std::vector<Group>& groups) override;
};

}  // namespace bigbatch::optim
