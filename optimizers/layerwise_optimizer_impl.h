// The members of LayerwiseOptimizer (layerwise_optimizer.h), for the .cpp of
// each optimizer, which specializes FusedTraits for its options and then
// instantiates the class (one line: template class LayerwiseOptimizer<...>).
// Nothing here names an algorithm. The fused step is the one dispatch point
// of the optimizers: the multi-tensor engine (kernels/engine.h), its CPU
// runner for CPU tensors and, with BIGBATCH_CUDA, its CUDA runner for CUDA
// tensors on the current stream. For the tests the optimizers are also built
// against the SIMT executor (BIGBATCH_SIMT): there CPU tensors stand in for
// device memory and go to the CUDA runner, whose device code then runs on
// the CPU. Internal to optimizers/.
#pragma once

#include "layerwise_optimizer.h"

#include "internal.h"
#include "../kernels/engine.h"

#if defined(BIGBATCH_WITH_CUDA) && defined(BIGBATCH_SIMT)
#include "../kernels/simt/cuda.h"
#elif defined(BIGBATCH_WITH_CUDA)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <cmath>
#include <exception>
#include <optional>
#include <type_traits>

namespace bigbatch::optim {

/// What the fused step needs of an optimizer beyond its public header,
/// specialized in the optimizer's .cpp before it instantiates the class:
///   using Plan = kernels::XPlan;                            its plan (kernels/x.h)
///   using Optimizer = X;                                    the class (make_like builds one)
///   static void bind(XParamState&, kernels::TensorSlot&);   where its state is
///   static void set_step(XParamState&, std::int64_t);       the step count the engine kept
/// (the last two from BufferState or MomentState below, where they fit).
/// The options reach the plan through kernel_group(const XOptions&),
/// declared beside the options.
template <typename Options>
struct FusedTraits;

/// The two ways an optimizer's state reaches the engine, for a FusedTraits to
/// derive from: a momentum buffer and no step count (LARS, LARC), or two
/// moments and a step count (LAMB; NovoGrad's second moment is one float).
template <typename State>
struct BufferState {
  static void bind(State& st, kernels::TensorSlot& slot) { slot.m = st.momentum_buffer().template data_ptr<float>(); }
  static void set_step(State&, std::int64_t) {}
};
/// Whether an optimizer's FusedTraits carry numbers for its plan
/// (kernels::TensorSlot::carry): `set_carry(State&, const double*)`.
template <typename Traits, typename = void>
struct CarriesNumbers : std::false_type {};
template <typename Traits>
struct CarriesNumbers<Traits, std::void_t<decltype(&Traits::set_carry)>> : std::true_type {};

template <typename State>
struct MomentState {
  static void bind(State& st, kernels::TensorSlot& slot) {
    slot.m = st.exp_avg().template data_ptr<float>();
    slot.v = st.exp_avg_sq().template data_ptr<float>();
    slot.step = st.step();
  }
  static void set_step(State& st, std::int64_t step) { st.step(step); }
};

template <typename Options, typename ParamState>
LayerwiseOptimizer<Options, ParamState>::LayerwiseOptimizer(
    std::vector<torch::optim::OptimizerParamGroup> groups, const Options& defaults,
    const char* name)
    : LayerwiseOptimizerBase(std::vector<torch::optim::OptimizerParamGroup>{},
                             std::make_unique<Options>(defaults)),
      name_(name) {
  defaults.validate();
  for (const auto& group : groups) add_param_group(group);
}

template <typename Options, typename ParamState>
void LayerwiseOptimizer<Options, ParamState>::add_param_group(
    const torch::optim::OptimizerParamGroup& group) {
  if (group.has_options()) {
    const auto* own = dynamic_cast<const Options*>(&group.options());
    TORCH_CHECK(own != nullptr, name_, ": the options of parameter group ", param_groups_.size(),
                " are not ", name_, "Options");
    own->validate();
  }
  for (const auto& p : group.params()) {
    TORCH_CHECK(p.is_floating_point(), name_, ": parameter group ", param_groups_.size(),
                " holds a tensor of dtype ", p.scalar_type(), "; only floating point tensors can be optimized");
  }
  torch::optim::Optimizer::add_param_group(group);
  if (group.has_options()) param_groups_.back().set_options(group.options().clone());
}

template <typename Options, typename ParamState>
std::int64_t LayerwiseOptimizer<Options, ParamState>::skipped_steps() const {
  return skipped_steps_ + engine_skipped_steps();
}

template <typename Options, typename ParamState>
std::unique_ptr<LayerwiseOptimizerBase> LayerwiseOptimizer<Options, ParamState>::make_like(
    std::vector<torch::optim::OptimizerParamGroup> groups) const {
  using Optimizer = typename FusedTraits<Options>::Optimizer;
  return std::make_unique<Optimizer>(std::move(groups), static_cast<const Options&>(defaults()));
}

template <typename Options, typename ParamState>
std::optional<NamedState> LayerwiseOptimizer<Options, ParamState>::named_state(const at::Tensor& param) const {
  const ParamState* state = param_state(param);
  if (state == nullptr) return std::nullopt;
  return state->named();
}

template <typename Options, typename ParamState>
void LayerwiseOptimizer<Options, ParamState>::set_named_state(const at::Tensor& param,
                                                              const std::optional<NamedState>& state) {
  release_engine();  // it holds the states' tensors, and the step counts of every state
  auto key = compat::optimizer_state_key(param);
  if (!state.has_value()) {
    state_.erase(key);
    return;
  }
  auto made = std::make_unique<ParamState>();
  made->set_named(*state);
  state_[key] = std::move(made);
}

template <typename Options, typename ParamState>
void LayerwiseOptimizer<Options, ParamState>::set_skipped_steps(std::int64_t count) {
  release_engine();  // its counter goes to skipped_steps_, which this replaces
  skipped_steps_ = count;
}

template <typename Options, typename ParamState>
std::int64_t LayerwiseOptimizer<Options, ParamState>::state_bytes() const {
  std::int64_t bytes = 0;
  for (const auto& entry : state_) bytes += static_cast<const ParamState&>(*entry.second).tensor_bytes();
  return bytes;
}

template <typename Options, typename ParamState>
const ParamState* LayerwiseOptimizer<Options, ParamState>::param_state(
    const at::Tensor& param) const {
  sync_engine_state();
  return find_state(param);
}

template <typename Options, typename ParamState>
ParamState* LayerwiseOptimizer<Options, ParamState>::find_state(const at::Tensor& param) const {
  const auto it = state_.find(compat::optimizer_state_key(param));
  return it == state_.end() ? nullptr : static_cast<ParamState*>(it->second.get());
}

template <typename Options, typename ParamState>
auto LayerwiseOptimizer<Options, ParamState>::gather() -> std::vector<Group> {
  created_in_norm_pass_.clear();
  in_norm_pass_ = true;
  std::vector<Group> groups;
  groups.reserve(param_groups_.size());
  for (std::size_t i = 0; i < param_groups_.size(); ++i) {
    Group group{&static_cast<const Options&>(param_groups_[i].options()), {}};
    const auto& params = param_groups_[i].params();
    for (std::size_t j = 0; j < params.size(); ++j) {
      const auto& p = params[j];
      const auto& g = p.grad();
      if (!g.defined()) continue;  // no gradient: no update, no state
      TORCH_CHECK(!g.is_sparse(), name_, " does not support sparse gradients (group ", i,
                  ", parameter ", j, ")");
      TORCH_CHECK(g.scalar_type() == p.scalar_type() && g.device() == p.device(), name_,
                  ": the gradient of group ", i, ", parameter ", j, " is ", g.scalar_type(), " on ",
                  g.device(), " but the parameter is ", p.scalar_type(), " on ", p.device());
      kernel_dtype(p);  // rejects unsupported dtypes with a clear message
      // In the parameter's layout where that is dense (channels_last too:
      // the engine walks memory), else contiguous.
      const bool dense = !p.is_contiguous() && p.is_non_overlapping_and_dense();
      group.params.push_back({p, !dense                        ? g.contiguous()
                                 : g.strides() == p.strides() ? g
                                                              : at::empty_like(p).copy_(g)});
    }
    groups.push_back(std::move(group));
  }
  return groups;
}

template <typename Options, typename ParamState>
ParamState& LayerwiseOptimizer<Options, ParamState>::state_of(const at::Tensor& param) {
  auto key = compat::optimizer_state_key(param);
  auto it = state_.find(key);
  if (it == state_.end()) {
    it = state_.emplace(key, std::make_unique<ParamState>(ParamState::fresh(param))).first;
    if (in_norm_pass_) created_in_norm_pass_.push_back(std::move(key));
  }
  return static_cast<ParamState&>(*it->second);
}

template <typename Options, typename ParamState>
bool LayerwiseOptimizer<Options, ParamState>::skip_nonfinite(const std::vector<Group>& groups,
                                                             const std::vector<bool>& finite) {
  bool skip = false;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    skip = skip || (groups[i].options->skip_nonfinite() && !finite[i]);
  }
  if (skip) {
    for (const auto& key : created_in_norm_pass_) state_.erase(key);
    ++skipped_steps_;
  }
  created_in_norm_pass_.clear();
  in_norm_pass_ = false;
  return skip;
}

template <typename Options, typename ParamState>
torch::Tensor LayerwiseOptimizer<Options, ParamState>::step(LossClosure closure) {
  TORCH_CHECK(training_, name_, ": step() in evaluation mode; call train() first (the parameters are at the "
              "point to evaluate)");
  at::NoGradGuard no_grad;
  const torch::Tensor loss = run_closure(closure);
  const auto groups = gather();
  engine_ran_ = false;
  noted_ratios_.clear();
  if (!step_engine(groups)) {
    TORCH_CHECK(sharding_ == nullptr, name_, ": a sharded step runs on the fused engine only; every group must "
                "be fused(true) and every parameter dense on one device the engine runs on");
    step_reference(groups);
  }
  return loss;
}

template <typename Options, typename ParamState>
bool LayerwiseOptimizer<Options, ParamState>::reference_norms(const std::vector<Group>& groups, bool with_weight,
                                                              std::vector<std::vector<TensorNorms>>& norms) {
  std::vector<bool> finite(groups.size(), true);
  norms.assign(groups.size(), {});
  for (std::size_t i = 0; i < groups.size(); ++i) {
    for (const auto& pg : groups[i].params) {
      TensorNorms n;
      n.g_norm = internal::norm_of(pg.grad);
      n.w_norm = with_weight ? internal::norm_of(fp32_weights(*groups[i].options, pg.param)) : 0.0;
      n.finite = internal::all_finite(pg.grad);
      finite[i] = finite[i] && n.finite;
      norms[i].push_back(n);
    }
  }
  return !skip_nonfinite(groups, finite);
}

template <typename Options, typename ParamState>
void LayerwiseOptimizer<Options, ParamState>::save(torch::serialize::OutputArchive& archive) const {
  sync_engine_state();
  torch::optim::serialize<ParamState, Options>(archive, *this);
  archive.write("bigbatch/skipped_steps", at::scalar_tensor(skipped_steps(), at::kLong));
  archive.write("bigbatch/kind", c10::IValue(std::string(name_)));
  archive.write("bigbatch/training", c10::IValue(training_));
}

template <typename Options, typename ParamState>
void LayerwiseOptimizer<Options, ParamState>::load(torch::serialize::InputArchive& archive) {
  c10::IValue kind;  // archives written before it was saved have none
  TORCH_CHECK(!archive.try_read("bigbatch/kind", kind) || kind.toStringRef() == name_, name_,
              ": the archive holds ", kind.toStringRef(), "'s state, another optimizer's");
  skipped_steps_ = skipped_steps();  // kept if the archive has no count
  torch::optim::serialize<ParamState, Options>(archive, *this);
  engine_.reset();  // the loaded states replace what the engine held; the next step rebuilds
  engine_ran_ = false;
  at::Tensor skipped;
  if (archive.try_read("bigbatch/skipped_steps", skipped)) skipped_steps_ = skipped.item<std::int64_t>();
  c10::IValue training;  // the parameters saved with it are at that mode's point
  if (archive.try_read("bigbatch/training", training)) training_ = training.toBool();
}

// ------------------------------------------------------------ fused step ----

namespace {

// Which runner takes tensors on `device`: the CUDA runner, the CPU runner, or none (reference path).
enum class Runner { kCpu, kCuda, kNone };

#if defined(BIGBATCH_WITH_CUDA) && defined(BIGBATCH_SIMT)
// The executor's device memory is host memory: CPU tensors, one device, the default stream.
Runner runner_for(const at::Device& device) { return device.is_cpu() ? Runner::kCuda : Runner::kNone; }
struct DeviceGuard {
  explicit DeviceGuard(at::Device) {}
};
cudaStream_t current_stream(at::Device) { return nullptr; }
#elif defined(BIGBATCH_WITH_CUDA)
Runner runner_for(const at::Device& device) {
  return device.is_cpu() ? Runner::kCpu : device.is_cuda() ? Runner::kCuda : Runner::kNone;
}
// Sets the current CUDA device for CUDA tensors; nothing for CPU tensors.
struct DeviceGuard {
  explicit DeviceGuard(at::Device device) {
    if (device.is_cuda()) guard.emplace(device);
  }
  std::optional<c10::cuda::CUDAGuard> guard;
};
cudaStream_t current_stream(at::Device device) {
  return device.is_cuda() ? c10::cuda::getCurrentCUDAStream(device.index()).stream() : nullptr;
}
#else
Runner runner_for(const at::Device& device) { return device.is_cpu() ? Runner::kCpu : Runner::kNone; }
struct DeviceGuard {
  explicit DeviceGuard(at::Device) {}
};
cudaStream_t current_stream(at::Device) { return nullptr; }
#endif

// The layouts a fused step takes: the elementwise engine any dense,
// non-overlapping one (channels_last included: it walks memory, and the
// gradient and states share the parameter's strides); the whole-tensor steps
// (Muon's matrices, SOAP's and Shampoo's preconditioners) contiguous ones,
// whose memory order is the matrices' order.
enum class Layouts { kDense, kContiguous };

// Why the parameters of `groups` cannot take a fused step, or nothing when
// they can: every group asks for it, every parameter is in a layout it
// takes, on a device a runner takes, all on one device, which `device` then
// holds (empty where nothing steps). An empty reason: a group asked for the
// reference path (fused(false)), which needs no warning.
template <typename Group>
std::optional<std::string> why_not_fused(const std::vector<Group>& groups, Layouts layouts,
                                         std::optional<at::Device>& device) {
  device.reset();
  for (const auto& group : groups) {
    if (!group.params.empty() && !group.options->fused()) return std::string();
  }
  for (const auto& group : groups) {
    for (const auto& pg : group.params) {
      const at::Tensor& p = pg.param;
      if (layouts == Layouts::kContiguous ? !p.is_contiguous() : !p.is_non_overlapping_and_dense()) {
        return c10::str("a parameter (sizes ", p.sizes(), ", strides ", p.strides(), ") is not ",
                        layouts == Layouts::kContiguous ? "contiguous, which this optimizer's fused step needs"
                                                        : "dense and non-overlapping");
      }
      if (runner_for(p.device()) == Runner::kNone) {
        return c10::str("a parameter is on ", p.device(), ", which this build has no fused runner for",
                        p.is_cuda() ? " (built without BIGBATCH_CUDA)" : "");
      }
      if (device.has_value() && *device != p.device()) {
        return c10::str("the parameters are on two devices, ", *device, " and ", p.device());
      }
      device = p.device();
    }
  }
  return std::nullopt;
}

// Errors of the torch-free kernel library as LibTorch errors, naming the optimizer.
template <typename F>
void rethrow_as_torch_error(const char* name, F&& f) {
  try {
    f();
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, name, ": ", e.what());
  }
}

/// For the optimizers that step whole tensors (Muon, SOAP): whether each
/// group's gradients are all finite, checked in the groups that ask for
/// skip_nonfinite (true elsewhere), before anything changes: each gradient's
/// sum in double is finite iff all its elements are; one read of the
/// gradients and one wait for the device. Sharded, the ranks hold other
/// tensors: each group's count of non-finite gradients is added over the
/// ranks (every rank calls this, with or without gradients of its own).
template <typename Group>
std::vector<bool> finite_whole_tensors(const std::vector<Group>& groups,
                                       const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                                       const OptimizerSharding* sharding) {
  std::vector<bool> finite(groups.size(), true);
  std::vector<at::Tensor> sums;
  std::vector<std::size_t> owner;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    if (!groups[i].options->skip_nonfinite()) continue;
    for (const auto& pg : groups[i].params) {
      sums.push_back(pg.grad.sum(at::kDouble));
      owner.push_back(i);
    }
  }
  if (sharding != nullptr) {
    at::Device device(at::kCPU);  // the parameters', where the all-reduce takes its data
    for (const auto& g : param_groups) {
      if (!g.params().empty()) device = g.params()[0].device();
    }
    const at::TensorOptions on = at::TensorOptions().dtype(at::kDouble).device(device);
    at::Tensor counts = at::zeros({static_cast<std::int64_t>(groups.size())}, on);
    if (!sums.empty()) {
      const at::Tensor bad = at::logical_not(at::isfinite(at::stack(sums))).to(at::kDouble);
      counts.index_add_(0, at::tensor(std::vector<std::int64_t>(owner.begin(), owner.end()), at::kLong).to(on.device()), bad);
    }
    sharding->allreduce_sum(counts.data_ptr<double>(), counts.numel(), current_stream(counts.device()));
    const at::Tensor host = counts.cpu();
    for (std::size_t i = 0; i < groups.size(); ++i) finite[i] = host.data_ptr<double>()[i] == 0;
  } else if (!sums.empty()) {
    const at::Tensor ok = at::isfinite(at::stack(sums)).cpu();
    const auto* flags = ok.data_ptr<bool>();
    for (std::size_t k = 0; k < owner.size(); ++k) finite[owner[k]] = finite[owner[k]] && flags[k];
  }
  return finite;
}

/// Refuses a sharding that cuts one of the parameters of `param_groups`
/// across ranks (for optimizers with shards_whole_tensors()).
inline void check_whole_tensors(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                                const OptimizerSharding& sharding, const char* name, const char* why) {
  for (std::size_t i = 0; i < param_groups.size(); ++i) {
    const auto& params = param_groups[i].params();
    for (std::size_t j = 0; j < params.size(); ++j) {
      const auto it = sharding.shards.find(params[j].unsafeGetTensorImpl());
      if (it == sharding.shards.end() || params[j].numel() == 0) continue;
      const std::int64_t chunks = kernels::chunks_of(params[j].numel());
      TORCH_CHECK(it->second.first_chunk == 0 && it->second.tensor_chunks == chunks, name, ": parameter ", j,
                  " of group ", i, " is a piece of a tensor cut across ranks (from chunk ", it->second.first_chunk,
                  " of ", it->second.tensor_chunks, "); a sharded ", name, " takes whole ", why,
                  " (shards_whole_tensors)");
    }
  }
}

}  // namespace

/// Copies each of `st`'s tensors shaped like `param` but laid out otherwise
/// (made for the parameter before it changed layout, or loaded from a run
/// in another layout) into the parameter's layout, which the engine needs:
/// it walks the parameter, its gradient and its states in memory order.
/// Returns whether it copied any.
template <typename ParamState>
bool conform_layout(ParamState& st, const at::Tensor& param) {
  NamedState named = st.named();
  bool changed = false;
  for (auto& entry : named) {
    if (!entry.second.isTensor()) continue;
    const at::Tensor t = entry.second.toTensor();
    if (!t.defined() || t.sizes() != param.sizes() || t.strides() == param.strides()) continue;
    entry.second = at::empty_like(param, t.options()).copy_(t);
    changed = true;
  }
  if (changed) st.set_named(named);
  return changed;
}

/// The engine an optimizer has bound, where, and the states behind its slots.
class EngineBinding {
 public:
  virtual ~EngineBinding() = default;
  at::Device device{at::kCPU};
  bool cuda = false;
  std::vector<torch::optim::OptimizerParamState*> states;  // in slot order
  std::vector<at::Tensor> params;                           // in slot order
};

namespace {

/// A plan's engine on the CUDA runner or the CPU runner: the one place the
/// fused steps choose between them (Muon's two plans come here too).
template <typename Plan>
std::unique_ptr<kernels::MultiTensorStep<Plan>> make_engine_step(bool on_cuda) {
#if defined(BIGBATCH_WITH_CUDA)
  if (on_cuda) return kernels::cuda::make_step<Plan>();
#endif
  (void)on_cuda;
  return kernels::make_cpu_step<Plan>();
}

template <typename Plan>
class PlanBinding final : public EngineBinding {
 public:
  explicit PlanBinding(bool on_cuda) : step(make_engine_step<Plan>(on_cuda)) { cuda = on_cuda; }
  std::unique_ptr<kernels::MultiTensorStep<Plan>> step;
};

template <typename Options>
using BindingOf = PlanBinding<typename FusedTraits<Options>::Plan>;

/// The engine of an optimizer's binding, of its own plan.
template <typename Options>
kernels::MultiTensorStep<typename FusedTraits<Options>::Plan>& engine_step(const EngineBinding& binding) {
  return *static_cast<const BindingOf<Options>&>(binding).step;
}

}  // namespace

template <typename Options, typename ParamState>
bool LayerwiseOptimizer<Options, ParamState>::step_engine(const std::vector<Group>& groups) {
  std::optional<at::Device> device;
  if (const auto why = why_not_fused(groups, Layouts::kDense, device)) {
    warn_reference_path(*why);
    // This step takes the reference path, which reads the step counts from
    // the states: the engine's go back there first.
    release_engine();
    return false;
  }
  if (!device.has_value()) {  // no gradients: nothing to do
    skip_nonfinite(groups, std::vector<bool>(groups.size(), true));
    return true;
  }
  const bool cuda = runner_for(*device) == Runner::kCuda;
  if (engine_ && engine_->cuda != cuda) release_engine();  // the other runner from now on
  const DeviceGuard guard(*device);

  using Traits = FusedTraits<Options>;
  using Group = typename Traits::Plan::Group;
  std::vector<Group> options;
  std::vector<kernels::TensorSlot> slots;
  std::vector<torch::optim::OptimizerParamState*> states;
  std::vector<at::Tensor> params;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const Options& o = *groups[i].options;
    options.push_back(kernel_group(o));  // declared beside the options
    for (const auto& pg : groups[i].params) {
      ParamState& st = state_of(pg.param);
      kernels::TensorSlot slot;
      slot.param = pg.param.data_ptr();
      slot.grad = pg.grad.data_ptr();
      slot.numel = pg.param.numel();
      slot.group = static_cast<std::int32_t>(i);
      slot.dtype = kernel_dtype(pg.param);
      if (uses_master(o, pg.param)) slot.master = fp32_weights(o, pg.param).template data_ptr<float>();
      Traits::bind(st, slot);
      slots.push_back(slot);
      states.push_back(&st);
      params.push_back(pg.param);
    }
  }
  // Closes the norm pass without a host-side decision (the engine decides):
  // states made above stay even if the engine skips this step; they are zero.
  skip_nonfinite(groups, std::vector<bool>(groups.size(), true));

  std::shared_ptr<kernels::ShardSpec> shard;
  if (sharding_ != nullptr) {
    shard = std::make_shared<kernels::ShardSpec>();
    for (const at::Tensor& p : params) {
      const auto it = sharding_->shards.find(p.unsafeGetTensorImpl());
      TORCH_CHECK(it != sharding_->shards.end(), name_, ": a sharded step met a parameter of shape ", p.sizes(),
                  " that its sharding does not place");
      shard->tensor_chunks.push_back(it->second.tensor_chunks);
      shard->first_chunk.push_back(it->second.first_chunk);
    }
    shard->allreduce_sum = sharding_->allreduce_sum;
  }
  const cudaStream_t stream = current_stream(*device);
  rethrow_as_torch_error(name_, [&] {
    const bool rebuild = !engine_ || !engine_step<Options>(*engine_).same_tensors(slots);
    if (engine_ && rebuild) {
      // Other tensors: the old binding's step counts go back to its states first,
      // and the new binding starts from the states. Reading them back cannot be
      // captured, and neither can the rebuild: say so before trying.
      engine_step<Options>(*engine_).check_rebuild_allowed(stream);
      sync_engine_state();
    }
    if (rebuild) {
      for (std::size_t k = 0; k < slots.size(); ++k) {
        auto& st = static_cast<ParamState&>(*states[k]);
        if (conform_layout(st, params[k]) && slots[k].master != nullptr) {
          slots[k].master = st.master().template data_ptr<float>();
        }
        Traits::bind(st, slots[k]);
      }
    }
    if (!engine_) engine_ = std::make_shared<BindingOf<Options>>(cuda);
    engine_->device = *device;
    engine_->states = std::move(states);
    engine_->params = std::move(params);
    auto& step = engine_step<Options>(*engine_);
    step.set_shard(shard);
    step.bind(slots, options, stream);
    step.run(stream);
    engine_ran_ = true;
  });
  return true;
}

template <typename Options, typename ParamState>
bool LayerwiseOptimizer<Options, ParamState>::whole_tensor_fused(const std::vector<Group>& groups,
                                                                 std::optional<at::Device>& device) {
  if (const auto why = why_not_fused(groups, Layouts::kContiguous, device)) {
    warn_reference_path(*why);
    return false;
  }
  for (const auto& group : groups) {
    for (const auto& pg : group.params) {
      if (ParamState* st = find_state(pg.param)) conform_layout(*st, pg.param);
    }
  }
  return true;
}

template <typename Options, typename ParamState>
void LayerwiseOptimizer<Options, ParamState>::sync_engine_state() const {
  if (!engine_ || engine_->states.empty()) return;
  const DeviceGuard guard(engine_->device);
  using Traits = FusedTraits<Options>;
  std::vector<std::int64_t> steps;
  rethrow_as_torch_error(name_, [&] { steps = engine_step<Options>(*engine_).steps(); });
  for (std::size_t k = 0; k < steps.size() && k < engine_->states.size(); ++k) {
    Traits::set_step(static_cast<ParamState&>(*engine_->states[k]), steps[k]);
  }
  if constexpr (CarriesNumbers<Traits>::value) {
    std::vector<double> carried;
    rethrow_as_torch_error(name_, [&] { carried = engine_step<Options>(*engine_).carried(); });
    for (std::size_t k = 0; kernels::kCarried * (k + 1) <= carried.size() && k < engine_->states.size(); ++k) {
      Traits::set_carry(static_cast<ParamState&>(*engine_->states[k]), carried.data() + kernels::kCarried * k);
    }
  }
}

template <typename Options, typename ParamState>
std::int64_t LayerwiseOptimizer<Options, ParamState>::engine_skipped_steps() const {
  if (!engine_) return 0;
  const DeviceGuard guard(engine_->device);
  std::int64_t skipped = 0;
  rethrow_as_torch_error(name_, [&] { skipped = engine_step<Options>(*engine_).skipped_steps(); });
  return skipped;
}

template <typename Options, typename ParamState>
std::vector<TrustRatio> LayerwiseOptimizer<Options, ParamState>::trust_ratios() const {
  if (!engine_ran_) return noted_ratios_;
  std::vector<TrustRatio> out;
  const DeviceGuard guard(engine_->device);
  std::vector<double> ratios;
  rethrow_as_torch_error(name_, [&] { ratios = engine_step<Options>(*engine_).trust_ratios(); });
  for (std::size_t k = 0; k < ratios.size() && k < engine_->params.size(); ++k) {
    if (!std::isnan(ratios[k])) out.push_back({engine_->params[k], ratios[k]});
  }
  return out;
}

template <typename Options, typename ParamState>
void LayerwiseOptimizer<Options, ParamState>::release_engine() {
  if (!engine_) return;
  sync_engine_state();
  skipped_steps_ += engine_skipped_steps();
  engine_.reset();  // the next fused step rebuilds from the states
  engine_ran_ = false;
}

}  // namespace bigbatch::optim
