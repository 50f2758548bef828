// LAMB on the CPU runner (cpu/runner.h): its plan (lamb.h: the
// passes, finalizers and per-element math) instantiated for the host.
#include "cpu/runner.h"
#include "lamb.h"

namespace bigbatch::kernels {
template std::unique_ptr<MultiTensorStep<LambPlan>> make_cpu_step<LambPlan>();
}  // namespace bigbatch::kernels
