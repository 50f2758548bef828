// What LARS, LARC, LAMB and NovoGrad share as torch::optim::Optimizer
// subclasses: per-group options that survive construction, lazily created
// fp32 state, the non-finite-gradient skip of FORMULAS.md, and save/load.
#pragma once

#include <bigbatch/compat/torch_compat.h>
#include <bigbatch/kernels/common.h>
#include <bigbatch/kernels/momentum.h>

#include <ATen/core/grad_mode.h>

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace bigbatch::optim {

/// A parameter that has a gradient in this step.
struct ParamGrad {
  at::Tensor param;
  at::Tensor grad;
};

/// Storage type tag of a parameter for the raw-pointer kernels.
kernels::DType kernel_dtype(const at::Tensor& t);

/// What the norm pass of LARS, LARC and NovoGrad learns about one tensor.
struct TensorNorms {
  double w_norm = 0;    ///< ||w|| (0 when not asked for)
  double g_norm = 0;    ///< ||g||
  bool finite = true;   ///< every element of g is finite
};

/// Runs a step's loss closure, if any, with gradients enabled (steps run
/// under NoGradGuard), and returns its loss or an undefined tensor.
at::Tensor run_closure(const std::function<at::Tensor()>& closure);

/// Zeroed fp32 state shaped like `param`, on its device.
at::Tensor fp32_zeros_like(const at::Tensor& param);

/// The fused LARS/LARC update of one tensor (kernels/momentum.h) on its fp32
/// momentum buffer `v`.
void momentum_update_fused(const ParamGrad& pg, at::Tensor& v, const kernels::MomentumStep& step);

/// Norm pass of one tensor, by the fused kernel (reading w and g once; in
/// double) or by ATen (the reference path, in fp32).
TensorNorms tensor_norms(const ParamGrad& pg, bool fused, bool with_weight);

/// Base class of the four optimizers. `Options` is an
/// OptimizerCloneableOptions with lr, skip_nonfinite, fused and validate();
/// `ParamState` is an OptimizerCloneableParamState with a static
/// `ParamState fresh(const at::Tensor& param)` that makes zeroed fp32 state.
template <typename Options, typename ParamState>
class LayerwiseOptimizer : public torch::optim::Optimizer {
 public:
  /// Adds a group of parameters. The group keeps its own options (validated
  /// here); LibTorch 2.x's own add_param_group would replace options of a
  /// type it does not know by a copy of the defaults, so this one restores them.
  void add_param_group(const torch::optim::OptimizerParamGroup& group);

  /// Steps that changed nothing because a gradient was inf or NaN
  /// (options skip_nonfinite).
  std::int64_t skipped_steps() const noexcept { return skipped_steps_; }

  /// The state of `param`, or nullptr before its first step.
  const ParamState* param_state(const at::Tensor& param) const;

  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 protected:
  LayerwiseOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups,
                     const Options& defaults, const char* name);

  /// One group's options and its parameters that have gradients.
  struct Group {
    const Options* options;
    std::vector<ParamGrad> params;
  };

  /// Starts a step: every group with the parameters that have a gradient.
  /// Checks that gradients are dense and of a supported dtype, naming the
  /// optimizer, group and parameter where they are not.
  std::vector<Group> gather();

  /// The state of `param`, created zeroed on its first step. States created
  /// between gather() and skip_nonfinite() are dropped if the step is skipped.
  ParamState& state_of(const at::Tensor& param);

  /// Ends the norm pass: `finite[i]` says whether group i's gradients are all
  /// finite. Returns true (the step must change nothing) when a group that
  /// asks for skip_nonfinite has a non-finite gradient; then the states
  /// created in this step are dropped and the skipped-step counter grows.
  bool skip_nonfinite(const std::vector<Group>& groups, const std::vector<bool>& finite);

  /// The step of LARS, LARC and NovoGrad: a norm pass over every tensor
  /// (||g||, and ||w|| if with_weight), the non-finite check, then
  /// update(options, param_grad, norms, fused) for each tensor.
  template <typename Update>
  torch::Tensor norm_pass_then_update(const LossClosure& closure, bool with_weight,
                                      const Update& update) {
    at::NoGradGuard no_grad;
    const torch::Tensor loss = run_closure(closure);
    const auto groups = gather();
    std::vector<bool> finite(groups.size(), true);
    std::vector<std::vector<TensorNorms>> norms(groups.size());
    for (std::size_t i = 0; i < groups.size(); ++i) {
      for (const auto& pg : groups[i].params) {
        norms[i].push_back(tensor_norms(pg, runs_fused(groups[i]), with_weight));
        finite[i] = finite[i] && norms[i].back().finite;
      }
    }
    if (skip_nonfinite(groups, finite)) return loss;
    for (std::size_t i = 0; i < groups.size(); ++i) {
      const bool fused = runs_fused(groups[i]);
      for (std::size_t j = 0; j < groups[i].params.size(); ++j) {
        update(*groups[i].options, groups[i].params[j], norms[i][j], fused);
      }
    }
    return loss;
  }

  /// Whether the fused CPU kernels run this group: options fused(true) and
  /// every parameter on the CPU. (CUDA tensors take the reference ATen path
  /// until the CUDA kernels dispatch here.)
  static bool runs_fused(const Group& group);

 private:
  const char* name_;
  std::int64_t skipped_steps_ = 0;
  bool in_norm_pass_ = false;  // between gather() and skip_nonfinite()
  std::vector<compat::OptimizerStateKey> created_in_norm_pass_;
};

}  // namespace bigbatch::optim
