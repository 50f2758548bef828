// The single CUDA dispatch point of the optimizers: LayerwiseOptimizer's step
// on bigbatch's multi-tensor CUDA kernels (kernels/multi_tensor.h), fed with
// data pointers and the current stream from LibTorch. Built with BIGBATCH_CUDA,
// and, for the tests, against the SIMT executor (BIGBATCH_SIMT): there CPU
// tensors stand in for device memory and the device code runs on the CPU.
#include <bigbatch/optimizers/layerwise_optimizer.h>

#include <bigbatch/kernels/multi_tensor.h>
#include <bigbatch/optimizers/cuda_hooks.h>

#if defined(BIGBATCH_SIMT)
#include <bigbatch/kernels/simt/cuda.h>
#else
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <exception>
#include <optional>

namespace bigbatch::optim {

namespace {

#if defined(BIGBATCH_SIMT)
// The executor's device memory is host memory: CPU tensors, one device, the default stream.
bool on_device(const at::Tensor& t) { return t.device().is_cpu(); }
struct DeviceGuard {
  explicit DeviceGuard(at::Device) {}
};
cudaStream_t current_stream(at::Device) { return nullptr; }
#else
bool on_device(const at::Tensor& t) { return t.is_cuda(); }
using DeviceGuard = c10::cuda::CUDAGuard;
cudaStream_t current_stream(at::Device device) {
  return c10::cuda::getCurrentCUDAStream(device.index()).stream();
}
#endif

}  // namespace

/// The multi-tensor step an optimizer has bound, and the states behind its slots.
class CudaStep {
 public:
  explicit CudaStep(kernels::cuda::Algorithm algorithm) : engine(algorithm) {}

  cudaStream_t stream() const { return current_stream(device); }

  kernels::cuda::MultiTensorStep engine;
  at::Device device{at::kCUDA, 0};
  std::vector<torch::optim::OptimizerParamState*> states;  // in slot order
};

namespace {

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

template <typename Options, typename ParamState>
bool LayerwiseOptimizer<Options, ParamState>::step_cuda(const std::vector<Group>& groups) {
  std::optional<at::Device> device;
  for (const auto& group : groups) {
    for (const auto& pg : group.params) {
      if (!group.options->fused() || !on_device(pg.param) || !pg.param.is_contiguous() ||
          (device.has_value() && *device != pg.param.device())) {
        // This step takes the CPU or reference path, which reads the step
        // counts from the states: the device's go back there first.
        release_cuda();
        return false;
      }
      device = pg.param.device();
    }
  }
  if (!device.has_value()) return false;  // no gradients: nothing to do on either path
  const DeviceGuard guard(*device);

  std::vector<kernels::cuda::GroupOptions> options;
  std::vector<kernels::cuda::TensorSlot> slots;
  std::vector<torch::optim::OptimizerParamState*> states;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const Options& o = *groups[i].options;
    options.push_back(cuda_group_options(o));
    for (const auto& pg : groups[i].params) {
      ParamState& st = state_of(pg.param);
      kernels::cuda::TensorSlot slot;
      slot.param = pg.param.data_ptr();
      slot.grad = pg.grad.data_ptr();
      slot.numel = pg.param.numel();
      slot.group = static_cast<std::int32_t>(i);
      slot.dtype = kernel_dtype(pg.param);
      if (uses_master(o, pg.param)) {
        const at::Tensor master = fp32_weights(o, pg.param);
        slot.master = master.data_ptr<float>();
      }
      cuda_bind_state(st, slot);
      slots.push_back(slot);
      states.push_back(&st);
    }
  }
  // Closes the norm pass without a host-side decision (the device decides):
  // states made above stay even if the device skips this step; they are zero.
  skip_nonfinite(groups, std::vector<bool>(groups.size(), true));

  rethrow_as_torch_error(name_, [&] {
    if (cuda_ && !cuda_->engine.same_tensors(slots)) {
      // Other tensors: the old binding's step counts go back to its states first,
      // and the new binding starts from the states. Reading them back cannot be
      // captured, and neither can the rebuild: say so before trying.
      cuda_->engine.check_rebuild_allowed(current_stream(*device));
      sync_cuda_state();
      for (std::size_t k = 0; k < slots.size(); ++k) cuda_bind_state(static_cast<ParamState&>(*states[k]), slots[k]);
    }
    if (!cuda_) cuda_ = std::make_shared<CudaStep>(cuda_algorithm(static_cast<const Options*>(nullptr)));
    cuda_->device = *device;
    cuda_->states = std::move(states);
    const cudaStream_t stream = cuda_->stream();
    cuda_->engine.bind(slots, options, stream);
    cuda_->engine.run(stream);
  });
  return true;
}

template <typename Options, typename ParamState>
void LayerwiseOptimizer<Options, ParamState>::sync_cuda_state() const {
  if (!cuda_ || cuda_->states.empty()) return;
  const DeviceGuard guard(cuda_->device);
  std::vector<std::int64_t> steps;
  rethrow_as_torch_error(name_, [&] { steps = cuda_->engine.steps(); });
  for (std::size_t k = 0; k < steps.size() && k < cuda_->states.size(); ++k) {
    cuda_set_step(static_cast<ParamState&>(*cuda_->states[k]), steps[k]);
  }
}

template <typename Options, typename ParamState>
std::int64_t LayerwiseOptimizer<Options, ParamState>::cuda_skipped_steps() const {
  if (!cuda_) return 0;
  const DeviceGuard guard(cuda_->device);
  std::int64_t skipped = 0;
  rethrow_as_torch_error(name_, [&] { skipped = cuda_->engine.skipped_steps(); });
  return skipped;
}

template <typename Options, typename ParamState>
void LayerwiseOptimizer<Options, ParamState>::release_cuda() {
  if (!cuda_) return;
  sync_cuda_state();
  skipped_steps_ += cuda_skipped_steps();
  cuda_.reset();  // the next CUDA step rebuilds from the states
}

#define BIGBATCH_INSTANTIATE_CUDA_STEP(Options, ParamState)                                        \
  template bool LayerwiseOptimizer<Options, ParamState>::step_cuda(const std::vector<Group>&);      \
  template void LayerwiseOptimizer<Options, ParamState>::release_cuda();                           \
  template void LayerwiseOptimizer<Options, ParamState>::sync_cuda_state() const;                  \
  template std::int64_t LayerwiseOptimizer<Options, ParamState>::cuda_skipped_steps() const;
BIGBATCH_INSTANTIATE_CUDA_STEP(LARSOptions, LARSParamState)
BIGBATCH_INSTANTIATE_CUDA_STEP(LARCOptions, LARCParamState)
BIGBATCH_INSTANTIATE_CUDA_STEP(LAMBOptions, LAMBParamState)
BIGBATCH_INSTANTIATE_CUDA_STEP(NovoGradOptions, NovoGradParamState)

}  // namespace bigbatch::optim
