// LARC: layer-wise rate with clipping on an SGD-momentum base (apex's LARC;
// docs/formulas.md), per tensor:
//   local = tc*||w|| / (||g|| + wd*||w|| + eps)
//   scale = clip ? min(local/lr, 1) : local     (1 where ||w|| or ||g|| is 0, or where it does not
//               adapt: adapt false, or always_adapt false and wd = 0, timm's rule)
//   d = (g + wd*w) * scale
//   v = momentum*v + d                          (v starts at 0, so v = d at the first step)
//   w = w - lr*v       nesterov: w = w - lr*(d + momentum*v)
// With clip the effective rate of a layer is min(lr, local); clip=false is the
// "scale" mode of timm's Lars and torchlars, with PyTorch's lr-outside-momentum form.
// As a chain of steps: add decayed weights -> clipped trust scale -> momentum -> scale by lr.
#pragma once

#include "../kernels/momentum.h"
#include "layerwise_optimizer.h"

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <vector>

namespace bigbatch::optim {

struct LARCOptions : public torch::optim::OptimizerCloneableOptions<LARCOptions> {
  LARCOptions(double lr);  // NOLINT(google-explicit-constructor): as LibTorch
  TORCH_ARG(double, lr);
  TORCH_ARG(double, momentum) = 0.9;
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(double, trust_coefficient) = 0.02;
  TORCH_ARG(double, eps) = 1e-8;
  /// true: effective rate min(lr, local) ("clip"); false: lr*local ("scale").
  TORCH_ARG(bool, clip) = true;
  TORCH_ARG(bool, nesterov) = false;
  /// false: no layer-wise scale for this group (biases, normalization parameters).
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
  friend bool operator==(const LARCOptions& lhs, const LARCOptions& rhs);
  ~LARCOptions() override = default;

 private:
  /// Every option above as (archive key, reference), in order (larc.cpp): a
  /// structured binding, so an option added above and not there does not compile.
  template <typename Self>
  static auto fields(Self& self);
};

struct LARCParamState : public torch::optim::OptimizerCloneableParamState<LARCParamState> {
  TORCH_ARG(torch::Tensor, momentum_buffer);  ///< v, fp32
  TORCH_ARG(torch::Tensor, master);  ///< fp32 copy of a 16-bit parameter (master_weights)

 public:
  /// Zeroed fp32 state for `param`, made on its first step.
  static LARCParamState fresh(const at::Tensor& param);
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
  friend bool operator==(const LARCParamState& lhs, const LARCParamState& rhs);
  ~LARCParamState() override = default;

 private:
  /// Every state field above as (archive key, reference), in order (larc.cpp): a
  /// structured binding, so a state field added above and not there does not compile.
  template <typename Self>
  static auto fields(Self& self);
};

/// One group's options as the fused plan (momentum.h in kernels/) takes them: every
/// option the step reads (fused and master_weights choose the path instead).
kernels::LarcGroup kernel_group(const LARCOptions& options);

/// LARC as a drop-in torch::optim::Optimizer.
class LARC : public LayerwiseOptimizer<LARCOptions, LARCParamState> {
 public:
  /// One LARC step (larc.cpp): the fused plan (kernels::LarcPlan) on the CPU or CUDA
  /// runner, or the reference path in ATen ops (options().fused(false)).
  torch::Tensor step(LossClosure closure = nullptr) override;

  explicit LARC(std::vector<torch::optim::OptimizerParamGroup> param_groups, LARCOptions defaults);
  explicit LARC(std::vector<torch::Tensor> params, LARCOptions defaults);

 protected:
  void step_reference(const std::vector<Group>& groups) override;
};

}  // namespace bigbatch::optim
