// The one dispatch point of the optimizers' fused step: LayerwiseOptimizer's
// step on the multi-tensor engine (kernels/engine.h), its CPU runner for CPU
// tensors and, with BIGBATCH_CUDA, its CUDA runner for CUDA tensors on the
// current stream. For the tests it is also built against the SIMT executor
// (BIGBATCH_SIMT): there CPU tensors stand in for device memory and go to
// the CUDA runner, whose device code then runs on the CPU.
#include <bigbatch/optimizers/layerwise_optimizer.h>

#include <bigbatch/kernels/engine.h>
#include <bigbatch/optimizers/engine_hooks.h>

#if defined(BIGBATCH_WITH_CUDA) && defined(BIGBATCH_SIMT)
#include <bigbatch/kernels/simt/cuda.h>
#elif defined(BIGBATCH_WITH_CUDA)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <exception>
#include <optional>

namespace bigbatch::optim {

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

}  // namespace

/// The engine an optimizer has bound, where, and the states behind its slots.
class EngineBinding {
 public:
  virtual ~EngineBinding() = default;
  at::Device device{at::kCPU};
  bool cuda = false;
  std::vector<torch::optim::OptimizerParamState*> states;  // in slot order
};

namespace {

template <typename Plan>
class PlanBinding final : public EngineBinding {
 public:
  explicit PlanBinding(bool on_cuda) {
    cuda = on_cuda;
#if defined(BIGBATCH_WITH_CUDA)
    if (on_cuda) {
      step = kernels::cuda::make_step<Plan>();
      return;
    }
#endif
    step = kernels::make_cpu_step<Plan>();
  }
  std::unique_ptr<kernels::MultiTensorStep<Plan>> step;
};

template <typename Options>
using BindingOf = PlanBinding<typename PlanOf<Options>::type>;

/// The engine of an optimizer's binding, of its own plan.
template <typename Options>
kernels::MultiTensorStep<typename PlanOf<Options>::type>& engine_step(const EngineBinding& binding) {
  return *static_cast<const BindingOf<Options>&>(binding).step;
}

}  // namespace

template <typename Options, typename ParamState>
bool LayerwiseOptimizer<Options, ParamState>::step_engine(const std::vector<Group>& groups) {
  std::optional<at::Device> device;
  for (const auto& group : groups) {
    for (const auto& pg : group.params) {
      if (!group.options->fused() || !pg.param.is_contiguous() || runner_for(pg.param.device()) == Runner::kNone ||
          (device.has_value() && *device != pg.param.device())) {
        // This step takes the reference path, which reads the step counts
        // from the states: the engine's go back there first.
        release_engine();
        return false;
      }
      device = pg.param.device();
    }
  }
  if (!device.has_value()) {  // no gradients: nothing to do
    skip_nonfinite(groups, std::vector<bool>(groups.size(), true));
    return true;
  }
  const bool cuda = runner_for(*device) == Runner::kCuda;
  if (engine_ && engine_->cuda != cuda) release_engine();  // the other runner from now on
  const DeviceGuard guard(*device);

  using Group = typename PlanOf<Options>::type::Group;
  std::vector<Group> options;
  std::vector<kernels::TensorSlot> slots;
  std::vector<torch::optim::OptimizerParamState*> states;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const Options& o = *groups[i].options;
    options.push_back(kernel_group(o));
    for (const auto& pg : groups[i].params) {
      ParamState& st = state_of(pg.param);
      kernels::TensorSlot slot;
      slot.param = pg.param.data_ptr();
      slot.grad = pg.grad.data_ptr();
      slot.numel = pg.param.numel();
      slot.group = static_cast<std::int32_t>(i);
      slot.dtype = kernel_dtype(pg.param);
      if (uses_master(o, pg.param)) slot.master = fp32_weights(o, pg.param).template data_ptr<float>();
      bind_state(st, slot);
      slots.push_back(slot);
      states.push_back(&st);
    }
  }
  // Closes the norm pass without a host-side decision (the engine decides):
  // states made above stay even if the engine skips this step; they are zero.
  skip_nonfinite(groups, std::vector<bool>(groups.size(), true));

  const cudaStream_t stream = current_stream(*device);
  rethrow_as_torch_error(name_, [&] {
    if (engine_ && !engine_step<Options>(*engine_).same_tensors(slots)) {
      // Other tensors: the old binding's step counts go back to its states first,
      // and the new binding starts from the states. Reading them back cannot be
      // captured, and neither can the rebuild: say so before trying.
      engine_step<Options>(*engine_).check_rebuild_allowed(stream);
      sync_engine_state();
      for (std::size_t k = 0; k < slots.size(); ++k) bind_state(static_cast<ParamState&>(*states[k]), slots[k]);
    }
    if (!engine_) engine_ = std::make_shared<BindingOf<Options>>(cuda);
    engine_->device = *device;
    engine_->states = std::move(states);
    auto& step = engine_step<Options>(*engine_);
    step.bind(slots, options, stream);
    step.run(stream);
  });
  return true;
}

template <typename Options, typename ParamState>
void LayerwiseOptimizer<Options, ParamState>::sync_engine_state() const {
  if (!engine_ || engine_->states.empty()) return;
  const DeviceGuard guard(engine_->device);
  std::vector<std::int64_t> steps;
  rethrow_as_torch_error(name_, [&] { steps = engine_step<Options>(*engine_).steps(); });
  for (std::size_t k = 0; k < steps.size() && k < engine_->states.size(); ++k) {
    set_step(static_cast<ParamState&>(*engine_->states[k]), steps[k]);
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
void LayerwiseOptimizer<Options, ParamState>::release_engine() {
  if (!engine_) return;
  sync_engine_state();
  skipped_steps_ += engine_skipped_steps();
  engine_.reset();  // the next fused step rebuilds from the states
}

#define BIGBATCH_INSTANTIATE_ENGINE_STEP(Options, ParamState)                                      \
  template bool LayerwiseOptimizer<Options, ParamState>::step_engine(const std::vector<Group>&);    \
  template void LayerwiseOptimizer<Options, ParamState>::release_engine();                         \
  template void LayerwiseOptimizer<Options, ParamState>::sync_engine_state() const;                \
  template std::int64_t LayerwiseOptimizer<Options, ParamState>::engine_skipped_steps() const;
BIGBATCH_INSTANTIATE_ENGINE_STEP(LARSOptions, LARSParamState)
BIGBATCH_INSTANTIATE_ENGINE_STEP(LARCOptions, LARCParamState)
BIGBATCH_INSTANTIATE_ENGINE_STEP(LAMBOptions, LAMBParamState)
BIGBATCH_INSTANTIATE_ENGINE_STEP(NovoGradOptions, NovoGradParamState)

}  // namespace bigbatch::optim
