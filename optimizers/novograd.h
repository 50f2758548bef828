// NovoGrad: layer-wise second moments (Ginsburg et al. 2019, arXiv:1905.11286;
// timm's NvNovoGrad). docs/formulas.md, per tensor, with one scalar v:
//   n = ||g||^2
//   v = n at the tensor's first step, else b2*v + (1-b2)*n
//   d = g / (sqrt(v) + eps) + wd*w;   grad_averaging: d = (1-b1)*d
//   m = b1*m + d                      (m starts at 0)
//   w = w - lr*m
// As a chain of steps: layer-normalized gradient -> add decayed weights -> momentum -> scale by -lr.
// NovoGrad has no trust ratio: `adapt` is accepted for uniform group handling
// (layerwise_param_groups) and changes nothing.
#pragma once

#include "../kernels/novograd.h"
#include "layerwise_optimizer.h"

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <tuple>
#include <vector>

namespace bigbatch::optim {

struct NovoGradOptions : public torch::optim::OptimizerCloneableOptions<NovoGradOptions> {
  NovoGradOptions(double lr = 1e-3);  // NOLINT(google-explicit-constructor): as LibTorch
  TORCH_ARG(double, lr) = 1e-3;
  typedef std::tuple<double, double> betas_t;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.95, 0.98);
  TORCH_ARG(double, eps) = 1e-8;
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(bool, grad_averaging) = false;
  /// No effect (NovoGrad has no trust ratio); kept so all four share group helpers.
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
  friend bool operator==(const NovoGradOptions& lhs, const NovoGradOptions& rhs);
  ~NovoGradOptions() override = default;

 private:
  /// Every option above as (archive key, reference), in order (novograd.cpp): a
  /// structured binding, so an option added above and not there does not compile.
  template <typename Self>
  static auto fields(Self& self);
};

struct NovoGradParamState : public torch::optim::OptimizerCloneableParamState<NovoGradParamState> {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(torch::Tensor, exp_avg);     ///< m, fp32, shaped like the parameter
  TORCH_ARG(torch::Tensor, exp_avg_sq);  ///< v, a 0-dim fp32 tensor (one per parameter tensor)
  TORCH_ARG(torch::Tensor, master);  ///< fp32 copy of a 16-bit parameter (master_weights)

 public:
  /// Zeroed fp32 state for `param`, made on its first step.
  static NovoGradParamState fresh(const at::Tensor& param);
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
  friend bool operator==(const NovoGradParamState& lhs, const NovoGradParamState& rhs);
  ~NovoGradParamState() override = default;

 private:
  /// Every state field above as (archive key, reference), in order (novograd.cpp): a
  /// structured binding, so a state field added above and not there does not compile.
  template <typename Self>
  static auto fields(Self& self);
};

/// One group's options as the fused plan (novograd.h in kernels/) takes them: every
/// option the step reads (fused and master_weights choose the path instead).
kernels::NovoGradGroup kernel_group(const NovoGradOptions& options);

/// NovoGrad as a drop-in torch::optim::Optimizer.
class NovoGrad : public LayerwiseOptimizer<NovoGradOptions, NovoGradParamState> {
 public:
  /// One NovoGrad step (novograd.cpp): the fused plan (kernels::NovoGradPlan) on the CPU or CUDA
  /// runner, or the reference path in ATen ops (options().fused(false)).
  torch::Tensor step(LossClosure closure = nullptr) override;

  explicit NovoGrad(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                    NovoGradOptions defaults = {});
  explicit NovoGrad(std::vector<torch::Tensor> params, NovoGradOptions defaults = {});

 protected:
  void step_reference(const std::vector<Group>& groups) override;
};

}  // namespace bigbatch::optim
