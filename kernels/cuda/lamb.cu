// LAMB on CUDA: the CUDA runner (engine.cuh) instantiated for LambPlan, whose
// passes and finalizers are in kernels/lamb.h with the per-element math.
#include <bigbatch/kernels/cuda/engine.cuh>
#include <bigbatch/kernels/lamb.h>

namespace bigbatch::kernels::cuda {
template std::unique_ptr<MultiTensorStep<LambPlan>> make_step<LambPlan>();
}  // namespace bigbatch::kernels::cuda
