// What the engine dispatch (engine_dispatch.cpp) needs of each optimizer: its
// plan (kernels/engine.h), its options as the plan takes them, and where its
// state is. Internal to optimizers/; defined next to each optimizer.
#pragma once

#include <bigbatch/kernels/engine.h>
#include <bigbatch/optimizers/lamb.h>
#include <bigbatch/optimizers/larc.h>
#include <bigbatch/optimizers/lars.h>
#include <bigbatch/optimizers/novograd.h>

#include <cstdint>

namespace bigbatch::optim {

/// The plan of each optimizer's fused step.
template <typename Options>
struct PlanOf;
template <>
struct PlanOf<LARSOptions> { using type = kernels::LarsPlan; };
template <>
struct PlanOf<LARCOptions> { using type = kernels::LarcPlan; };
template <>
struct PlanOf<LAMBOptions> { using type = kernels::LambPlan; };
template <>
struct PlanOf<NovoGradOptions> { using type = kernels::NovoGradPlan; };

/// A group's options as its plan takes them (every option the step reads;
/// fused and master_weights choose the path and are not among them).
kernels::LarsGroup kernel_group(const LARSOptions& o);
kernels::LarcGroup kernel_group(const LARCOptions& o);
kernels::LambGroup kernel_group(const LAMBOptions& o);
kernels::NovoGradGroup kernel_group(const NovoGradOptions& o);

/// Fills slot.m, slot.v and slot.step from the state: LARS and LARC keep a
/// momentum buffer; LAMB and NovoGrad two moments (NovoGrad's second is one
/// float per tensor) and a step count.
template <typename ParamState>
void bind_buffer_state(ParamState& st, kernels::TensorSlot& slot) {
  slot.m = st.momentum_buffer().template data_ptr<float>();
}
template <typename ParamState>
void bind_moment_state(ParamState& st, kernels::TensorSlot& slot) {
  slot.m = st.exp_avg().template data_ptr<float>();
  slot.v = st.exp_avg_sq().template data_ptr<float>();
  slot.step = st.step();
}
inline void bind_state(LARSParamState& st, kernels::TensorSlot& slot) { bind_buffer_state(st, slot); }
inline void bind_state(LARCParamState& st, kernels::TensorSlot& slot) { bind_buffer_state(st, slot); }
inline void bind_state(LAMBParamState& st, kernels::TensorSlot& slot) { bind_moment_state(st, slot); }
inline void bind_state(NovoGradParamState& st, kernels::TensorSlot& slot) { bind_moment_state(st, slot); }

/// Stores the step count the engine kept (LARS and LARC count no steps).
inline void set_step(LARSParamState&, std::int64_t) {}
inline void set_step(LARCParamState&, std::int64_t) {}
inline void set_step(LAMBParamState& st, std::int64_t step) { st.step(step); }
inline void set_step(NovoGradParamState& st, std::int64_t step) { st.step(step); }

}  // namespace bigbatch::optim
