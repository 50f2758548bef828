// SOAP's Adam pass on the CUDA runner (cuda/runner.cuh): its plan (soap.h)
// instantiated for the device. Compiled by nvcc into bigbatch_kernels_cuda,
// and by g++ against the SIMT executor into bigbatch_kernels_simt
// (kernels/simt/CMakeLists.txt).
#include "cuda/runner.cuh"
#include "soap.h"

namespace bigbatch::kernels::cuda {
template std::unique_ptr<MultiTensorStep<SoapAdamPlan>> make_step<SoapAdamPlan>();
}  // namespace bigbatch::kernels::cuda
