// Shampoo's graft and apply passes on the CPU runner (cpu/runner.h): their
// plans (shampoo.h) instantiated for the host.
#include "cpu/runner.h"
#include "shampoo.h"

namespace bigbatch::kernels {
template std::unique_ptr<MultiTensorStep<ShampooGraftPlan>> make_cpu_step<ShampooGraftPlan>();
template std::unique_ptr<MultiTensorStep<ShampooApplyPlan>> make_cpu_step<ShampooApplyPlan>();
}  // namespace bigbatch::kernels
