// Shampoo's graft and apply passes on the CUDA runner (cuda/runner.cuh):
// their plans (shampoo.h) instantiated for the device. Compiled by nvcc into
// bigbatch_kernels_cuda, and by g++ against the SIMT executor into
// bigbatch_kernels_simt (kernels/simt/CMakeLists.txt).
#include "cuda/runner.cuh"
#include "shampoo.h"

namespace bigbatch::kernels::cuda {
template std::unique_ptr<MultiTensorStep<ShampooGraftPlan>> make_step<ShampooGraftPlan>();
template std::unique_ptr<MultiTensorStep<ShampooApplyPlan>> make_step<ShampooApplyPlan>();
}  // namespace bigbatch::kernels::cuda
