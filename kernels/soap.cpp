// SOAP's Adam pass on the CPU runner (cpu/runner.h): its plan (soap.h)
// instantiated for the host.
#include "cpu/runner.h"
#include "soap.h"

namespace bigbatch::kernels {
template std::unique_ptr<MultiTensorStep<SoapAdamPlan>> make_cpu_step<SoapAdamPlan>();
}  // namespace bigbatch::kernels
