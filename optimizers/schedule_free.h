// Schedule-Free AdamW and SGD (Defazio et al. 2024, "The Road Less Scheduled",
// arXiv:2405.15682): no learning-rate schedule after the warmup; the
// parameters hold y, where gradients are taken, the state holds z, and the
// point to evaluate is the average x = (y - (1-b1)*z) / b1. docs/formulas.md
// has the step; kernels/schedule_free.h the per-element math.
//
// train() and eval() move the parameters between y and x, as the authors'
// optimizers do (their `.train()` / `.eval()`): call eval() before
// evaluating or saving the model for use, train() before the next step (a
// step in eval mode throws). BatchNorm statistics gathered while training
// describe y, not x: recompute them at x before evaluating (the runner does).
// train() after eval() restores y exactly: from the master copy
// (master_weights), else from a copy of y that eval() keeps until then (one
// copy of those parameters while evaluating), so that evaluations do not
// change the training run. A checkpoint loaded in eval mode has no such
// copy: train() then moves back by the inverse interpolation, exact up to
// rounding (as the authors' optimizers always do).
#pragma once

#include "../kernels/schedule_free.h"
#include "layerwise_optimizer.h"

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <tuple>
#include <unordered_map>
#include <vector>

namespace bigbatch::optim {

struct AdamWScheduleFreeOptions : public torch::optim::OptimizerCloneableOptions<AdamWScheduleFreeOptions> {
  AdamWScheduleFreeOptions(double lr = 0.0025);  // NOLINT(google-explicit-constructor): as LibTorch
  TORCH_ARG(double, lr) = 0.0025;
  typedef std::tuple<double, double> betas_t;
  /// (b1, b2): b1 places y between z and x (0 < b1 < 1), b2 averages g^2.
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  TORCH_ARG(double, eps) = 1e-8;
  /// Decoupled weight decay, taken at y.
  TORCH_ARG(double, weight_decay) = 0;
  /// Steps of linear warmup of the rate (0: none).
  TORCH_ARG(int64_t, warmup_steps) = 0;
  /// The averaging weight's power of the step count (k^r).
  TORCH_ARG(double, r) = 0;
  /// The averaging weight's power of the largest rate so far (lr_max^p).
  TORCH_ARG(double, weight_lr_power) = 2;
  /// No effect (no trust ratio); kept so all optimizers share group helpers.
  TORCH_ARG(bool, adapt) = true;
  /// A step with inf/NaN gradients changes nothing and is counted in skipped_steps().
  TORCH_ARG(bool, skip_nonfinite) = true;
  /// true: the fused kernels; false: the reference path in plain ATen ops.
  TORCH_ARG(bool, fused) = true;
  /// Keep an fp32 copy of bf16/fp16 parameters (y) in the state.
  TORCH_ARG(bool, master_weights) = false;

 public:
  void validate() const;
  double get_lr() const override { return lr(); }
  void set_lr(const double new_lr) override { lr(new_lr); }
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  friend bool operator==(const AdamWScheduleFreeOptions& lhs, const AdamWScheduleFreeOptions& rhs);
  ~AdamWScheduleFreeOptions() override = default;

 private:
  template <typename Self>
  static auto fields(Self& self);
};

struct SGDScheduleFreeOptions : public torch::optim::OptimizerCloneableOptions<SGDScheduleFreeOptions> {
  SGDScheduleFreeOptions(double lr = 1.0);  // NOLINT(google-explicit-constructor): as LibTorch
  TORCH_ARG(double, lr) = 1.0;
  /// b1: places y between z and x (0 < momentum < 1).
  TORCH_ARG(double, momentum) = 0.9;
  /// Weight decay taken at y, added to the gradient.
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(int64_t, warmup_steps) = 0;
  TORCH_ARG(double, r) = 0;
  TORCH_ARG(double, weight_lr_power) = 2;
  TORCH_ARG(bool, adapt) = true;
  TORCH_ARG(bool, skip_nonfinite) = true;
  TORCH_ARG(bool, fused) = true;
  TORCH_ARG(bool, master_weights) = false;

 public:
  void validate() const;
  double get_lr() const override { return lr(); }
  void set_lr(const double new_lr) override { lr(new_lr); }
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  friend bool operator==(const SGDScheduleFreeOptions& lhs, const SGDScheduleFreeOptions& rhs);
  ~SGDScheduleFreeOptions() override = default;

 private:
  template <typename Self>
  static auto fields(Self& self);
};

struct AdamWScheduleFreeParamState : public torch::optim::OptimizerCloneableParamState<AdamWScheduleFreeParamState> {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(torch::Tensor, z);           ///< the base sequence, fp32, shaped like the parameter
  TORCH_ARG(torch::Tensor, exp_avg_sq);  ///< v, fp32, shaped like the parameter
  TORCH_ARG(double, weight_sum) = 0;     ///< the sum of the averaging weights so far
  TORCH_ARG(double, lr_max) = 0;         ///< the largest scheduled rate so far
  TORCH_ARG(torch::Tensor, master);      ///< fp32 copy of y for a 16-bit parameter (master_weights)

 public:
  /// z = the parameter, v = 0 (made on its first step).
  static AdamWScheduleFreeParamState fresh(const at::Tensor& param);
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  std::int64_t tensor_bytes() const;
  NamedState named() const;
  void set_named(const NamedState& values);
  static std::vector<StateField> declared();
  friend bool operator==(const AdamWScheduleFreeParamState& lhs, const AdamWScheduleFreeParamState& rhs);
  ~AdamWScheduleFreeParamState() override = default;

 private:
  template <typename Self>
  static auto fields(Self& self);
};

struct SGDScheduleFreeParamState : public torch::optim::OptimizerCloneableParamState<SGDScheduleFreeParamState> {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(torch::Tensor, z);
  TORCH_ARG(double, weight_sum) = 0;
  TORCH_ARG(double, lr_max) = 0;
  TORCH_ARG(torch::Tensor, master);

 public:
  static SGDScheduleFreeParamState fresh(const at::Tensor& param);
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  std::int64_t tensor_bytes() const;
  NamedState named() const;
  void set_named(const NamedState& values);
  static std::vector<StateField> declared();
  friend bool operator==(const SGDScheduleFreeParamState& lhs, const SGDScheduleFreeParamState& rhs);
  ~SGDScheduleFreeParamState() override = default;

 private:
  template <typename Self>
  static auto fields(Self& self);
};

/// One group's options as the fused plan (schedule_free.h in kernels/) takes them.
kernels::ScheduleFreeGroup kernel_group(const AdamWScheduleFreeOptions& options);
kernels::ScheduleFreeGroup kernel_group(const SGDScheduleFreeOptions& options);

/// What the two share: the reference step and the moves between y and x.
template <typename Options, typename ParamState>
class ScheduleFreeOptimizer : public LayerwiseOptimizer<Options, ParamState> {
 public:
  void train(bool on = true) override;
  /// The mode alone (parameters restored at its point): any copy of y that
  /// eval() kept is stale then, and dropped.
  void set_training_mode(bool on) override {
    saved_y_.clear();
    this->training_ = on;
  }
  bool has_evaluation_point() const override { return true; }

 protected:
  using Base = LayerwiseOptimizer<Options, ParamState>;
  using typename Base::Group;
  using Base::Base;
  void step_reference(const std::vector<Group>& groups) override;

 private:
  /// y of each parameter without a master copy, kept by eval() for train()
  /// (by the parameter's TensorImpl).
  std::unordered_map<const void*, at::Tensor> saved_y_;
};

/// Schedule-Free AdamW as a drop-in torch::optim::Optimizer.
class AdamWScheduleFree : public ScheduleFreeOptimizer<AdamWScheduleFreeOptions, AdamWScheduleFreeParamState> {
 public:
  explicit AdamWScheduleFree(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                             AdamWScheduleFreeOptions defaults = {});
  explicit AdamWScheduleFree(std::vector<torch::Tensor> params, AdamWScheduleFreeOptions defaults = {});
  torch::Tensor step(LossClosure closure = nullptr) override;
};

/// Schedule-Free SGD as a drop-in torch::optim::Optimizer.
class SGDScheduleFree : public ScheduleFreeOptimizer<SGDScheduleFreeOptions, SGDScheduleFreeParamState> {
 public:
  explicit SGDScheduleFree(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                           SGDScheduleFreeOptions defaults = {});
  explicit SGDScheduleFree(std::vector<torch::Tensor> params, SGDScheduleFreeOptions defaults = {});
  torch::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace bigbatch::optim
