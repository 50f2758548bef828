// Schedule-Free AdamW and SGD on the CUDA runner (cuda/runner.cuh): their
// plans (schedule_free.h) instantiated for the device. Compiled by nvcc into
// bigbatch_kernels_cuda, and by g++ against the SIMT executor into
// bigbatch_kernels_simt (kernels/simt/CMakeLists.txt).
#include "cuda/runner.cuh"
#include "schedule_free.h"

namespace bigbatch::kernels::cuda {
template std::unique_ptr<MultiTensorStep<ScheduleFreeAdamWPlan>> make_step<ScheduleFreeAdamWPlan>();
template std::unique_ptr<MultiTensorStep<ScheduleFreeSGDPlan>> make_step<ScheduleFreeSGDPlan>();
}  // namespace bigbatch::kernels::cuda
