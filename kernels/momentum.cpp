// LARS and LARC on the CPU runner (cpu/runner.h): their plans (momentum.h: the
// passes, finalizers and per-element math) instantiated for the host.
#include "cpu/runner.h"
#include "momentum.h"

namespace bigbatch::kernels {
template std::unique_ptr<MultiTensorStep<LarsPlan>> make_cpu_step<LarsPlan>();
template std::unique_ptr<MultiTensorStep<LarcPlan>> make_cpu_step<LarcPlan>();
}  // namespace bigbatch::kernels
