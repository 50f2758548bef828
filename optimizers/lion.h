// Lion: the sign of an interpolated momentum (Chen et al. 2023, arXiv:2302.06675,
// Algorithm 2). docs/formulas.md, per element:
//   c = b1*m + (1-b1)*g
//   w = w*(1 - lr*wd) - lr*sign(c)       (decoupled weight decay, as AdamW's)
//   m = b2*m + (1-b2)*g                  (m starts at 0)
// Every coordinate moves by exactly lr (or 0), so Lion's rate is typically
// 3-10x below AdamW's and its weight decay 3-10x above (the paper's section 5).
// Without skip_nonfinite an inf or NaN gradient leaves w finite (the sign of
// inf is 1, of NaN 0, as ATen's sign) but makes m non-finite for good.
// No trust ratio: `adapt` is accepted for uniform group handling
// (layerwise_param_groups) and changes nothing.
#pragma once

#include "../kernels/lion.h"
#include "layerwise_optimizer.h"

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <tuple>
#include <vector>

namespace bigbatch::optim {

struct LionOptions : public torch::optim::OptimizerCloneableOptions<LionOptions> {
  LionOptions(double lr = 1e-4);  // NOLINT(google-explicit-constructor): as LibTorch
  TORCH_ARG(double, lr) = 1e-4;
  typedef std::tuple<double, double> betas_t;
  /// (b1, b2): b1 interpolates the update's sign, b2 the momentum kept.
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.99);
  TORCH_ARG(double, weight_decay) = 0;
  /// No effect (Lion has no trust ratio); kept so all optimizers share group helpers.
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
  friend bool operator==(const LionOptions& lhs, const LionOptions& rhs);
  ~LionOptions() override = default;

 private:
  /// Every option above as (archive key, reference), in order (lion.cpp): a
  /// structured binding, so an option added above and not there does not compile.
  template <typename Self>
  static auto fields(Self& self);
};

struct LionParamState : public torch::optim::OptimizerCloneableParamState<LionParamState> {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(torch::Tensor, exp_avg);  ///< m, fp32, shaped like the parameter
  TORCH_ARG(torch::Tensor, master);   ///< fp32 copy of a 16-bit parameter (master_weights)

 public:
  /// Zeroed fp32 state for `param`, made on its first step.
  static LionParamState fresh(const at::Tensor& param);
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
  friend bool operator==(const LionParamState& lhs, const LionParamState& rhs);
  ~LionParamState() override = default;

 private:
  /// Every state field above as (archive key, reference), in order (lion.cpp): a
  /// structured binding, so a state field added above and not there does not compile.
  template <typename Self>
  static auto fields(Self& self);
};

/// One group's options as the fused plan (lion.h in kernels/) takes them: every
/// option the step reads (fused and master_weights choose the path instead).
kernels::LionGroup kernel_group(const LionOptions& options);

/// Lion as a drop-in torch::optim::Optimizer.
class Lion : public LayerwiseOptimizer<LionOptions, LionParamState> {
 public:
  /// One Lion step (lion.cpp): the fused plan (kernels::LionPlan) on the CPU or CUDA
  /// runner, or the reference path in ATen ops (options().fused(false)).
  torch::Tensor step(LossClosure closure = nullptr) override;

  explicit Lion(std::vector<torch::optim::OptimizerParamGroup> param_groups, LionOptions defaults = {});
  explicit Lion(std::vector<torch::Tensor> params, LionOptions defaults = {});

 protected:
  void step_reference(const std::vector<Group>& groups) override;
};

}  // namespace bigbatch::optim
