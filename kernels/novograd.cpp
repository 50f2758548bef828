// NovoGrad on the CPU runner (cpu/runner.h): its plan (novograd.h: the
// passes, finalizers and per-element math) instantiated for the host.
#include "cpu/runner.h"
#include "novograd.h"

namespace bigbatch::kernels {
template std::unique_ptr<MultiTensorStep<NovoGradPlan>> make_cpu_step<NovoGradPlan>();
}  // namespace bigbatch::kernels
