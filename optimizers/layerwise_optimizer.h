// What LARS, LARC, LAMB and NovoGrad share as torch::optim::Optimizer
// subclasses: per-group options that survive construction, lazily created
// fp32 state, the non-finite-gradient skip of docs/formulas.md, save/load, the
// trust ratios of the last step, and the step itself: gather the gradients,
// then the fused engine (kernels/engine.h, CPU or CUDA runner) or the
// reference path in plain ATen ops. The members are defined in
// layerwise_optimizer_impl.h, which each optimizer's .cpp instantiates; no
// file here names an algorithm but its own.
#pragma once

#include "../compat/torch_compat.h"
#include "../kernels/common.h"

#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

typedef struct CUstream_st* cudaStream_t;  // as cuda_runtime_api.h declares it

namespace bigbatch::optim {

class EngineBinding;  // the bound multi-tensor step (optimizers/layerwise_optimizer_impl.h)

/// A parameter that has a gradient in this step.
struct ParamGrad {
  at::Tensor param;
  at::Tensor grad;
};

/// Storage type tag of a parameter for the raw-pointer kernels.
kernels::DType kernel_dtype(const at::Tensor& t);

/// What the reference path's norm pass learns about one tensor.
struct TensorNorms {
  double w_norm = 0;    ///< ||w|| (0 when not asked for)
  double g_norm = 0;    ///< ||g||
  bool finite = true;   ///< every element of g is finite
};

/// Runs a step's loss closure, if any, with gradients enabled (steps run
/// under NoGradGuard), and returns its loss or an undefined tensor.
at::Tensor run_closure(const std::function<at::Tensor()>& closure);

/// Zeroed fp32 state shaped like `param`, on its device, in its layout (the
/// fused engine walks a parameter and its states in memory order).
at::Tensor fp32_zeros_like(const at::Tensor& param);
/// The same, contiguous: for the optimizers that read a state as matrices
/// (Muon, SOAP, Shampoo), whatever the parameter's layout.
at::Tensor fp32_contiguous_zeros_like(const at::Tensor& param);

/// A parameter and the trust ratio its update was scaled by.
struct TrustRatio {
  at::Tensor param;
  double ratio = 0;
};

/// One parameter's optimizer state as (field, value) pairs in its state
/// type's order ("step", "exp_avg", ..., "master"; an undefined tensor left
/// out): how distributed/sharded.h moves state between optimizers that hold a
/// tensor cut differently. Tensors shaped like the parameter are its
/// elementwise fields; the rest (step counts, NovoGrad's 0-dim layer moment)
/// are per tensor.
using NamedState = std::vector<std::pair<std::string, c10::IValue>>;

/// One field of an optimizer's per-parameter state, as its state type
/// declares it (the field list in its .cpp): a count (the step), a tensor
/// shaped like the parameter, or a tensor of one number per parameter tensor
/// (NovoGrad's layer moment), or a number carried in double (Schedule-Free's
/// weight sum), or a tensor of a shape of its own that the optimizer derives
/// from the parameter's and its options (SOAP's packed Kronecker factors;
/// only optimizers that shard whole tensors have one). What the Python
/// package checks a state against.
struct StateField {
  enum class Shape { kCount, kLikeParam, kPerTensor, kNumber, kOwn };
  std::string name;
  Shape shape = Shape::kLikeParam;
};

/// An option value an optimizer's options refuse (their validate(), or a
/// value of the wrong type): which optimizer, which option ("betas[1]"), the
/// value as text and what the option must be. The message reads "Invalid
/// LAMB option eps: -1 (must be >= 0)"; the runner reports the parts at the
/// config key, Python as a ValueError.
class OptionError : public c10::ValueError {
 public:
  OptionError(std::string optimizer, std::string option, std::string value, std::string requirement);
  std::string optimizer;
  std::string option;
  std::string value;
  std::string requirement;
};

/// A number an optimizer reports per parameter for its last step: "trust_ratio"
/// (TrustRatio's), "muon_update_rms" (Muon's UpdateRms).
struct ParamScalar {
  std::string tag;
  at::Tensor param;
  double value = 0;
};

/// Where a parameter an optimizer holds lies in a whole tensor cut across
/// data-parallel ranks at chunk boundaries (kernels/engine.h's ShardSpec).
struct ParamShard {
  std::int64_t tensor_chunks = 0;  ///< chunks of the whole tensor
  std::int64_t first_chunk = 0;    ///< its chunk where this parameter starts
};

/// The sharding of an optimizer's parameters (distributed/sharded.h builds
/// it): where each lies in its whole tensor, and the all-reduce that adds the
/// ranks' chunk sums (host memory and a null stream for CPU tensors, device
/// memory on `stream` for CUDA tensors).
struct OptimizerSharding {
  std::unordered_map<const void*, ParamShard> shards;  ///< by the parameter's TensorImpl
  std::function<void(double* data, std::int64_t count, cudaStream_t stream)> allreduce_sum;
};

/// What the four optimizers offer beyond torch::optim::Optimizer, for code
/// that holds any of them (or any optimizer: dynamic_cast to this).
class LayerwiseOptimizerBase : public torch::optim::Optimizer {
 public:
  /// Steps that changed nothing because a gradient was inf or NaN
  /// (options skip_nonfinite). After fused CUDA steps this reads the device's
  /// counter (waiting for the stream).
  virtual std::int64_t skipped_steps() const = 0;

  /// The trust ratio each parameter's update was scaled by in the last step,
  /// for the parameters of groups that adapt, in group order: LARS's and
  /// LAMB's ratio, LARC's clipped local rate over lr. The step's own values
  /// (fused: those the engine's finalizers computed; reference: those the
  /// reference path used), not a recomputation. Empty before the first step,
  /// after a skipped one, and for NovoGrad. After fused CUDA steps this reads
  /// the device's ratios (waiting for the stream).
  virtual std::vector<TrustRatio> trust_ratios() const = 0;

  /// From now on every parameter is a shard of a tensor cut across ranks,
  /// placed by `sharding`, and every rank steps the same parameters in the
  /// same order: the norms, trust ratios, clipping and skip decision of each
  /// step are those of the whole tensors (docs/distributed.md). Only the
  /// fused engine takes sharded steps; a step that would take the reference
  /// path throws. Null ends the sharding.
  virtual void shard(std::shared_ptr<const OptimizerSharding> sharding) = 0;

  /// Every number it reports per parameter for the last step: its trust
  /// ratios as "trust_ratio", and what an optimizer adds (Muon: each matrix's
  /// update RMS). What the runner logs to TensorBoard.
  virtual std::vector<ParamScalar> scalars() const;

  /// Its kind as checkpoints name it ("LAMB", "LARS", "Muon", ...): save()
  /// writes it, and a load() of another kind's state is refused.
  virtual const char* kind() const = 0;

  /// Whether a sharding must give it whole tensors rather than pieces cut at
  /// chunk boundaries (Muon: orthogonalization needs whole matrices);
  /// distributed/sharded.h then gives each tensor whole to one rank.
  virtual bool shards_whole_tensors() const { return false; }

  /// Bytes of the optimizer state this process holds: every parameter's
  /// moments, buffers and fp32 master copy (what sharding divides).
  virtual std::int64_t state_bytes() const = 0;

  /// A fresh optimizer of the same kind, with the same defaults, over
  /// `groups` (each group's own options, where it has them, win):
  /// distributed/sharded.h builds one over each rank's slices.
  virtual std::unique_ptr<LayerwiseOptimizerBase> make_like(
      std::vector<torch::optim::OptimizerParamGroup> groups) const = 0;

  /// The state of `param` (one of this optimizer's) by field, or nullopt
  /// before its first step. After fused CUDA steps this waits for the stream.
  virtual std::optional<NamedState> named_state(const at::Tensor& param) const = 0;
  /// Replaces the state of `param` by `state` as named_state() gives it (its
  /// tensors are taken, not copied); nullopt removes it. The next fused step
  /// rebinds the engine.
  virtual void set_named_state(const at::Tensor& param, const std::optional<NamedState>& state) = 0;
  /// Sets skipped_steps(), for state moved from another optimizer.
  virtual void set_skipped_steps(std::int64_t count) = 0;

  /// Puts the parameters at the point steps are taken from (on) or at the
  /// point to evaluate (off), as Schedule-Free's y and x; for an optimizer
  /// whose two points are one (has_evaluation_point() false) only the mode
  /// changes. A step in evaluation mode throws. save() records the mode.
  virtual void train(bool on = true) { training_ = on; }
  void eval() { train(false); }
  bool is_training() const { return training_; }
  /// Sets the mode without moving the parameters: for parameters restored
  /// at that mode's point (a checkpoint saved in it).
  virtual void set_training_mode(bool on) { training_ = on; }
  /// Whether the point to evaluate differs from the training point
  /// (Schedule-Free): then BatchNorm statistics gathered in training describe
  /// the wrong point and must be recomputed at the evaluation point.
  virtual bool has_evaluation_point() const { return false; }

 protected:
  using torch::optim::Optimizer::Optimizer;
  /// Warns, once per optimizer and reason, that a step asked for the fused
  /// path (fused(true)) takes the reference path, and why; nothing for an
  /// empty `why` (a group that asked for the reference path).
  void warn_reference_path(const std::string& why);
  bool training_ = true;

 private:
  std::set<std::string> warned_;  // the reasons warn_reference_path() has given
};

/// Base class of the four optimizers. `Options` is an
/// OptimizerCloneableOptions with lr, skip_nonfinite, fused and validate();
/// `ParamState` is an OptimizerCloneableParamState with a static
/// `ParamState fresh(const at::Tensor& param)` that makes zeroed fp32 state.
template <typename Options, typename ParamState>
class LayerwiseOptimizer : public LayerwiseOptimizerBase {
 public:
  using OptionsType = Options;
  using ParamStateType = ParamState;

  /// One step: the gradients of every group, then the fused engine when
  /// every group is fused(true) and every parameter with a gradient is a
  /// contiguous tensor on one device the engine runs on (the CPU; a CUDA
  /// device in builds with BIGBATCH_CUDA, where the step is only enqueued on
  /// the current stream); else the reference path.
  torch::Tensor step(LossClosure closure = nullptr) override;

  /// Adds a group of parameters. The group keeps its own options (validated
  /// here); LibTorch 2.x's own add_param_group would replace options of a
  /// type it does not know by a copy of the defaults, so this one restores them.
  void add_param_group(const torch::optim::OptimizerParamGroup& group);

  std::int64_t skipped_steps() const override;
  std::vector<TrustRatio> trust_ratios() const override;
  void shard(std::shared_ptr<const OptimizerSharding> sharding) override { sharding_ = std::move(sharding); }
  std::int64_t state_bytes() const override;
  std::unique_ptr<LayerwiseOptimizerBase> make_like(
      std::vector<torch::optim::OptimizerParamGroup> groups) const override;
  std::optional<NamedState> named_state(const at::Tensor& param) const override;
  void set_named_state(const at::Tensor& param, const std::optional<NamedState>& state) override;
  void set_skipped_steps(std::int64_t count) override;
  const char* kind() const override { return name_; }

  /// The state of `param`, or nullptr before its first step. After fused steps
  /// this first copies the step counts the engine keeps into the states.
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

  /// The state of `param`, or nullptr before its first step; creates nothing
  /// and does not wait for the engine (param_state() does).
  ParamState* find_state(const at::Tensor& param) const;

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

  /// The step in plain ATen ops, one tensor at a time: the readable
  /// specification the fused engine is tested against. Runs between gather()
  /// and the end of the step; calls skip_nonfinite() itself.
  virtual void step_reference(const std::vector<Group>& groups) = 0;

  /// The reference step of LARS, LARC and NovoGrad: the norm pass (||g||
  /// and, with_weight, ||w|| of the fp32 weights, accumulated in double), the
  /// non-finite check, then update(options, param_grad, norms) for each tensor.
  template <typename Update>
  void reference_norms_then_update(const std::vector<Group>& groups, bool with_weight, const Update& update) {
    std::vector<std::vector<TensorNorms>> norms;
    if (!reference_norms(groups, with_weight, norms)) return;
    for (std::size_t i = 0; i < groups.size(); ++i) {
      for (std::size_t j = 0; j < groups[i].params.size(); ++j) {
        update(*groups[i].options, groups[i].params[j], norms[i][j]);
      }
    }
  }

  /// The reference path's norm pass and non-finite check (above). Returns
  /// false when the step must change nothing.
  bool reference_norms(const std::vector<Group>& groups, bool with_weight,
                       std::vector<std::vector<TensorNorms>>& norms);

  /// The reference path notes the trust ratio it scaled `param`'s update by
  /// (trust_ratios()); a parameter whose group does not adapt has none.
  void note_trust_ratio(const at::Tensor& param, double ratio) { noted_ratios_.push_back({param, ratio}); }

  /// The whole step on the engine, if it takes it (see step()); returns false,
  /// doing nothing, otherwise. A step the engine skips leaves the states it
  /// created in place (zero, at step 0: the next step cannot tell them apart).
  bool step_engine(const std::vector<Group>& groups);

  /// Whether the parameters of `groups` take a whole-tensor fused step
  /// (Muon's, SOAP's and Shampoo's own: contiguous parameters on one device a
  /// runner takes, which `device` then holds, empty where nothing steps);
  /// where not, warns once with the reason. Where they do, their states
  /// laid out otherwise (made while a parameter was channels_last, or loaded
  /// so), master copies included, are first copied into the parameters'
  /// layout, in which those steps read them.
  bool whole_tensor_fused(const std::vector<Group>& groups, std::optional<at::Device>& device);

 private:
  /// Copies the step counts the engine keeps into the bound states (waits for
  /// the stream on CUDA); nothing before the first fused step.
  void sync_engine_state() const;
  /// The engine's skipped-step counter; 0 before the first fused step.
  std::int64_t engine_skipped_steps() const;
  /// Ends the engine binding before a step on the reference path (or the other
  /// runner): its step counts go to the states and its skipped steps to the
  /// host counter (waits for the device).
  void release_engine();

  const char* name_;
  std::shared_ptr<const OptimizerSharding> sharding_;
  std::shared_ptr<EngineBinding> engine_;
  bool engine_ran_ = false;                   // the last step ran on the engine: its ratios are trust_ratios()
  std::vector<TrustRatio> noted_ratios_;      // the last reference step's
  std::int64_t skipped_steps_ = 0;
  bool in_norm_pass_ = false;  // between gather() and skip_nonfinite()
  std::vector<compat::OptimizerStateKey> created_in_norm_pass_;
};

}  // namespace bigbatch::optim
