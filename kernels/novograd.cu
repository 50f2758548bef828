// NovoGrad on the CUDA runner (cuda/runner.cuh): its plan (novograd.h: the
// passes, finalizers and per-element math) instantiated for the device.
// Compiled by nvcc into bigbatch_kernels_cuda, and by g++ against the SIMT
// executor into bigbatch_kernels_simt (kernels/simt/CMakeLists.txt).
#include "cuda/runner.cuh"
#include "novograd.h"

namespace bigbatch::kernels::cuda {
template std::unique_ptr<MultiTensorStep<NovoGradPlan>> make_step<NovoGradPlan>();
}  // namespace bigbatch::kernels::cuda
