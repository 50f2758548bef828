// Schedule-Free AdamW and SGD on the CPU runner (cpu/runner.h): their plans
// (schedule_free.h: the finalizer and per-element math) instantiated for the host.
#include "cpu/runner.h"
#include "schedule_free.h"

namespace bigbatch::kernels {
template std::unique_ptr<MultiTensorStep<ScheduleFreeAdamWPlan>> make_cpu_step<ScheduleFreeAdamWPlan>();
template std::unique_ptr<MultiTensorStep<ScheduleFreeSGDPlan>> make_cpu_step<ScheduleFreeSGDPlan>();
}  // namespace bigbatch::kernels
