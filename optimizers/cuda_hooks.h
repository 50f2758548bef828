// What the CUDA dispatch (cuda_dispatch.cpp) needs of each optimizer: its
// algorithm, its options as the kernels take them, and where its state is.
// Internal to optimizers/; defined next to each optimizer, torch-only code.
#pragma once

#include <bigbatch/kernels/multi_tensor.h>
#include <bigbatch/optimizers/lamb.h>
#include <bigbatch/optimizers/larc.h>
#include <bigbatch/optimizers/lars.h>
#include <bigbatch/optimizers/novograd.h>

#include <cstdint>

namespace bigbatch::optim {

// The overloads are picked by the options or state type (the pointer argument is only a tag).
kernels::cuda::Algorithm cuda_algorithm(const LARSOptions*);
kernels::cuda::Algorithm cuda_algorithm(const LARCOptions*);
kernels::cuda::Algorithm cuda_algorithm(const LAMBOptions*);
kernels::cuda::Algorithm cuda_algorithm(const NovoGradOptions*);

kernels::cuda::GroupOptions cuda_group_options(const LARSOptions& o);
kernels::cuda::GroupOptions cuda_group_options(const LARCOptions& o);
kernels::cuda::GroupOptions cuda_group_options(const LAMBOptions& o);
kernels::cuda::GroupOptions cuda_group_options(const NovoGradOptions& o);

/// Fills slot.m, slot.v and slot.step from the state.
void cuda_bind_state(LARSParamState& st, kernels::cuda::TensorSlot& slot);
void cuda_bind_state(LARCParamState& st, kernels::cuda::TensorSlot& slot);
void cuda_bind_state(LAMBParamState& st, kernels::cuda::TensorSlot& slot);
void cuda_bind_state(NovoGradParamState& st, kernels::cuda::TensorSlot& slot);

/// Stores the step count the device kept (LARS and LARC count no steps).
inline void cuda_set_step(LARSParamState&, std::int64_t) {}
inline void cuda_set_step(LARCParamState&, std::int64_t) {}
inline void cuda_set_step(LAMBParamState& st, std::int64_t step) { st.step(step); }
inline void cuda_set_step(NovoGradParamState& st, std::int64_t step) { st.step(step); }

}  // namespace bigbatch::optim
