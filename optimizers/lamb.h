// LAMB: layer-wise adaptive moments for large batches (You et al. 2019,
// arXiv:1904.00962, v5 Algorithm 2; apex FusedLAMB). docs/formulas.md, per tensor:
//   if max_grad_norm > 0:  g = g / max(1, G / max_grad_norm)   (G over all groups)
//   if !adam_w_mode:       g = g + wd*w
//   m = b1*m + b3*g;  v = b2*v + (1-b2)*g^2      b3 = grad_averaging ? 1-b1 : 1
//   u = (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps) + (adam_w_mode ? wd*w : 0)
//   ratio = ||w|| / ||u|| if adapt and (wd != 0 or always_adapt), else 1;
//           clamped to [min_trust, max_trust], and to <= 1 with trust_clip
//   w = w - lr*ratio*u
// As a chain of steps: clip by global norm -> adam moments (bias-corrected)
// -> add decayed weights -> trust ratio -> scale by -lr.
// Variants: apex FusedLAMB = max_grad_norm(1.0); NVLAMB = always_adapt(true);
// timm "lambc" = trust_clip(true); DeepSpeed = min_trust(0.01).max_trust(10).
#pragma once

#include "layerwise_optimizer.h"
#include "../kernels/lamb.h"

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <limits>
#include <tuple>
#include <utility>
#include <vector>

namespace bigbatch::optim {

struct LAMBOptions : public torch::optim::OptimizerCloneableOptions<LAMBOptions> {
  LAMBOptions(double lr = 1e-3);  // NOLINT(google-explicit-constructor): as LibTorch
  TORCH_ARG(double, lr) = 1e-3;
  typedef std::tuple<double, double> betas_t;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  TORCH_ARG(double, eps) = 1e-6;
  TORCH_ARG(double, weight_decay) = 0.01;
  TORCH_ARG(bool, bias_correction) = true;
  TORCH_ARG(bool, grad_averaging) = true;
  /// true: decoupled decay added to the update (AdamW); false: L2 in the gradient.
  TORCH_ARG(bool, adam_w_mode) = true;
  /// Clip by the L2 norm of all gradients of all groups; 0 = no clipping.
  TORCH_ARG(double, max_grad_norm) = 0;
  /// Use the trust ratio even where weight_decay is 0 (NVLAMB).
  TORCH_ARG(bool, always_adapt) = false;
  /// Cap the trust ratio at 1 (timm's lambc).
  TORCH_ARG(bool, trust_clip) = false;
  TORCH_ARG(double, min_trust) = 0;
  TORCH_ARG(double, max_trust) = std::numeric_limits<double>::infinity();
  /// false: no trust ratio for this group (biases, normalization parameters).
  TORCH_ARG(bool, adapt) = true;
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
  friend bool operator==(const LAMBOptions& lhs, const LAMBOptions& rhs);
  ~LAMBOptions() override = default;

 private:
  /// Every option above as (archive key, reference), in order (lamb.cpp): a
  /// structured binding, so an option added above and not there does not compile.
  template <typename Self>
  static auto fields(Self& self);
};

struct LAMBParamState : public torch::optim::OptimizerCloneableParamState<LAMBParamState> {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(torch::Tensor, exp_avg);     ///< m, fp32
  TORCH_ARG(torch::Tensor, exp_avg_sq);  ///< v, fp32
  TORCH_ARG(torch::Tensor, master);  ///< fp32 copy of a 16-bit parameter (master_weights)

 public:
  /// Zeroed fp32 state for `param`, made on its first step.
  static LAMBParamState fresh(const at::Tensor& param);
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
  friend bool operator==(const LAMBParamState& lhs, const LAMBParamState& rhs);
  ~LAMBParamState() override = default;

 private:
  /// Every state field above as (archive key, reference), in order (lamb.cpp): a
  /// structured binding, so a state field added above and not there does not compile.
  template <typename Self>
  static auto fields(Self& self);
};

/// One group's options as the fused plan (lamb.h in kernels/) takes them: every
/// option the step reads (fused and master_weights choose the path instead).
kernels::LambGroup kernel_group(const LAMBOptions& options);

/// LAMB as a drop-in torch::optim::Optimizer.
class LAMB : public LayerwiseOptimizer<LAMBOptions, LAMBParamState> {
 public:
  /// One LAMB step (lamb.cpp): the fused plan (kernels::LambPlan) on the CPU or CUDA
  /// runner, or the reference path in ATen ops (options().fused(false)).
  torch::Tensor step(LossClosure closure = nullptr) override;

  explicit LAMB(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                LAMBOptions defaults = {});
  explicit LAMB(std::vector<torch::Tensor> params, LAMBOptions defaults = {});

 protected:
  void step_reference(const std::vector<Group>& groups) override;

 private:
  void step_reference(const Group& group, double grad_scale);
};

}  // namespace bigbatch::optim
