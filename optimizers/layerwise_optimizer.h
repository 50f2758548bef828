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

class CudaStep;  // the bound multi-tensor CUDA step (optimizers/cuda_dispatch.cpp)

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

/// Norm pass of one tensor: ||grad|| and, if `weight` is defined, ||weight||;
/// by the fused kernel (reading each once, in double) or by ATen (the reference path).
TensorNorms tensor_norms(const at::Tensor& grad, const at::Tensor& weight, bool fused);

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
  /// (options skip_nonfinite). After CUDA steps this reads the device's counter
  /// (waiting for the stream).
  std::int64_t skipped_steps() const;

  /// The state of `param`, or nullptr before its first step. After CUDA steps
  /// this first copies the step counts the device keeps into the states.
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

  /// Whether `param` is a 16-bit parameter whose group keeps an fp32 master copy.
  static bool uses_master(const Options& options, const at::Tensor& param) {
    return options.master_weights() && param.scalar_type() != at::kFloat;
  }

  /// The fp32 weights a reference step works on: the master copy (made from
  /// the parameter on first use) where uses_master, else the parameter itself
  /// when it is fp32, else an fp32 copy of it.
  at::Tensor fp32_weights(const Options& options, const at::Tensor& param) {
    if (!uses_master(options, param)) return param.to(at::kFloat);
    ParamState& st = state_of(param);
    if (!st.master().defined()) st.master(param.to(at::kFloat));
    return st.master();
  }

  /// The step of LARS, LARC and NovoGrad: a norm pass over every tensor
  /// (||g||, and ||w|| if with_weight), the non-finite check, then
  /// update(options, param_grad, norms, fused) for each tensor.
  template <typename Update>
  torch::Tensor norm_pass_then_update(const LossClosure& closure, bool with_weight,
                                      const Update& update) {
    at::NoGradGuard no_grad;
    const torch::Tensor loss = run_closure(closure);
    const auto groups = gather();
    if (step_cuda(groups)) return loss;
    std::vector<bool> finite(groups.size(), true);
    std::vector<std::vector<TensorNorms>> norms(groups.size());
    for (std::size_t i = 0; i < groups.size(); ++i) {
      const bool fused = runs_fused(groups[i]);
      for (const auto& pg : groups[i].params) {
        const at::Tensor weight = !with_weight ? at::Tensor()
                                  : fused      ? pg.param
                                               : fp32_weights(*groups[i].options, pg.param);
        norms[i].push_back(tensor_norms(pg.grad, weight, fused));
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
  /// every parameter a contiguous CPU tensor without a master copy. (Groups on
  /// CUDA run fused through step_cuda; where that does not apply, the reference path.)
  static bool runs_fused(const Group& group);

  /// The whole step on bigbatch's multi-tensor CUDA kernels (builds with
  /// BIGBATCH_CUDA): taken when every group is fused and every parameter with
  /// a gradient is a contiguous CUDA tensor on one device; the step is only
  /// enqueued on the current stream. Returns false, doing nothing, otherwise.
  /// On the device a skipped first step leaves its (zero) state in place.
  bool step_cuda(const std::vector<Group>& groups);

 private:
  /// Copies the step counts the device keeps into the bound states (waits for
  /// the stream); nothing before the first CUDA step.
  void sync_cuda_state() const;
  /// The device's skipped-step counter; 0 before the first CUDA step.
  std::int64_t cuda_skipped_steps() const;
  /// Ends the CUDA binding before a step on another path: its step counts go
  /// to the states and its skipped steps to the host counter (waits for the device).
  void release_cuda();

  const char* name_;
  std::shared_ptr<CudaStep> cuda_;
  std::int64_t skipped_steps_ = 0;
  bool in_norm_pass_ = false;  // between gather() and skip_nonfinite()
  std::vector<compat::OptimizerStateKey> created_in_norm_pass_;
};

}  // namespace bigbatch::optim
