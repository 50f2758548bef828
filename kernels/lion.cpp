// Lion on the CPU runner (cpu/runner.h): its plan (lion.h: the
// passes, finalizer and per-element math) instantiated for the host.
#include "cpu/runner.h"
#include "lion.h"

namespace bigbatch::kernels {
template std::unique_ptr<MultiTensorStep<LionPlan>> make_cpu_step<LionPlan>();
}  // namespace bigbatch::kernels
