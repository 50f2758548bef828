// Lion on the CUDA runner (cuda/runner.cuh): its plan (lion.h: the
// passes, finalizer and per-element math) instantiated for the device.
// Compiled by nvcc into bigbatch_kernels_cuda, and by g++ against the SIMT
// executor into bigbatch_kernels_simt (kernels/simt/CMakeLists.txt).
#include "cuda/runner.cuh"
#include "lion.h"

namespace bigbatch::kernels::cuda {
template std::unique_ptr<MultiTensorStep<LionPlan>> make_step<LionPlan>();
}  // namespace bigbatch::kernels::cuda
