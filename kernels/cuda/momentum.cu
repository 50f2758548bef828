// LARS and LARC on CUDA: the CUDA runner (engine.cuh) instantiated for their
// plans, whose passes and finalizers are in kernels/momentum.h.
#include <bigbatch/kernels/cuda/engine.cuh>
#include <bigbatch/kernels/momentum.h>

namespace bigbatch::kernels::cuda {
template std::unique_ptr<MultiTensorStep<LarsPlan>> make_step<LarsPlan>();
template std::unique_ptr<MultiTensorStep<LarcPlan>> make_step<LarcPlan>();
}  // namespace bigbatch::kernels::cuda
