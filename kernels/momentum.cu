// LARS and LARC on the CUDA runner (cuda/runner.cuh): their plans (momentum.h: the
// passes, finalizers and per-element math) instantiated for the device.
// Compiled by nvcc into bigbatch_kernels_cuda, and by g++ against the SIMT
// executor into bigbatch_kernels_simt (kernels/simt/CMakeLists.txt).
#include "cuda/runner.cuh"
#include "momentum.h"

namespace bigbatch::kernels::cuda {
template std::unique_ptr<MultiTensorStep<LarsPlan>> make_step<LarsPlan>();
template std::unique_ptr<MultiTensorStep<LarcPlan>> make_step<LarcPlan>();
}  // namespace bigbatch::kernels::cuda
