// NovoGrad on CUDA: the CUDA runner (engine.cuh) instantiated for
// NovoGradPlan, whose passes and finalizers are in kernels/novograd.h.
#include <bigbatch/kernels/cuda/engine.cuh>
#include <bigbatch/kernels/novograd.h>

namespace bigbatch::kernels::cuda {
template std::unique_ptr<MultiTensorStep<NovoGradPlan>> make_step<NovoGradPlan>();
}  // namespace bigbatch::kernels::cuda
