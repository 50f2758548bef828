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
#include <tuple>

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

/// What the options of LARS and LARC share: lr, momentum, weight decay, eps,
/// trust coefficient, adapt, nesterov, skip_nonfinite (LARC adds clip).
template <typename Options>
kernels::cuda::GroupOptions momentum_group_options(const Options& o) {
  kernels::cuda::GroupOptions g;
  g.lr = o.lr();
  g.momentum = o.momentum();
  g.eps = o.eps();
  g.weight_decay = o.weight_decay();
  g.trust_coefficient = o.trust_coefficient();
  g.flags = (o.adapt() ? kernels::cuda::kAdapt : 0u) | (o.nesterov() ? kernels::cuda::kNesterov : 0u) |
            (o.skip_nonfinite() ? kernels::cuda::kSkipNonfinite : 0u);
  return g;
}

/// What the options of LAMB and NovoGrad share: lr, betas, eps, weight decay,
/// grad_averaging, skip_nonfinite (LAMB adds its trust-ratio options).
template <typename Options>
kernels::cuda::GroupOptions moment_group_options(const Options& o) {
  kernels::cuda::GroupOptions g;
  g.lr = o.lr();
  std::tie(g.beta1, g.beta2) = o.betas();
  g.eps = o.eps();
  g.weight_decay = o.weight_decay();
  g.flags = (o.grad_averaging() ? kernels::cuda::kGradAveraging : 0u) |
            (o.skip_nonfinite() ? kernels::cuda::kSkipNonfinite : 0u);
  return g;
}

/// Fills slot.m, slot.v and slot.step from the state: LARS and LARC keep a
/// momentum buffer; LAMB and NovoGrad two moments (NovoGrad's second is one
/// float per tensor) and a step count.
template <typename ParamState>
void bind_buffer_state(ParamState& st, kernels::cuda::TensorSlot& slot) {
  slot.m = st.momentum_buffer().template data_ptr<float>();
}
template <typename ParamState>
void bind_moment_state(ParamState& st, kernels::cuda::TensorSlot& slot) {
  slot.m = st.exp_avg().template data_ptr<float>();
  slot.v = st.exp_avg_sq().template data_ptr<float>();
  slot.step = st.step();
}
inline void cuda_bind_state(LARSParamState& st, kernels::cuda::TensorSlot& slot) { bind_buffer_state(st, slot); }
inline void cuda_bind_state(LARCParamState& st, kernels::cuda::TensorSlot& slot) { bind_buffer_state(st, slot); }
inline void cuda_bind_state(LAMBParamState& st, kernels::cuda::TensorSlot& slot) { bind_moment_state(st, slot); }
inline void cuda_bind_state(NovoGradParamState& st, kernels::cuda::TensorSlot& slot) { bind_moment_state(st, slot); }

/// Stores the step count the device kept (LARS and LARC count no steps).
inline void cuda_set_step(LARSParamState&, std::int64_t) {}
inline void cuda_set_step(LARCParamState&, std::int64_t) {}
inline void cuda_set_step(LAMBParamState& st, std::int64_t step) { st.step(step); }
inline void cuda_set_step(NovoGradParamState& st, std::int64_t step) { st.step(step); }

}  // namespace bigbatch::optim
