// Muon's elementwise passes on the CUDA runner (cuda/runner.cuh): its two
// plans (muon.h) instantiated for the device. Compiled by nvcc into
// bigbatch_kernels_cuda, and by g++ against the SIMT executor into
// bigbatch_kernels_simt (kernels/simt/CMakeLists.txt).
#include "cuda/runner.cuh"
#include "muon.h"

namespace bigbatch::kernels::cuda {
template std::unique_ptr<MultiTensorStep<MuonMomentumPlan>> make_step<MuonMomentumPlan>();
template std::unique_ptr<MultiTensorStep<MuonApplyPlan>> make_step<MuonApplyPlan>();
}  // namespace bigbatch::kernels::cuda
