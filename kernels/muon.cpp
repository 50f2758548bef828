// Muon's elementwise passes on the CPU runner (cpu/runner.h): its two plans
// (muon.h) instantiated for the host.
#include "cpu/runner.h"
#include "muon.h"

namespace bigbatch::kernels {
template std::unique_ptr<MultiTensorStep<MuonMomentumPlan>> make_cpu_step<MuonMomentumPlan>();
template std::unique_ptr<MultiTensorStep<MuonApplyPlan>> make_cpu_step<MuonApplyPlan>();
}  // namespace bigbatch::kernels
