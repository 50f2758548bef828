// Lion (lion.h): options, state, the reference path of its step in plain
// ATen ops, and its options as its fused plan takes them (kernels/lion.h).
#include "lion.h"

#include "internal.h"
#include "layerwise_optimizer_impl.h"

#include <tuple>

namespace bigbatch::optim {

// What the fused step needs of the state (layerwise_optimizer_impl.h); declared
// before anything here instantiates LayerwiseOptimizer.
template <>
struct FusedTraits<LionOptions> {
  using Plan = kernels::LionPlan;
  using Optimizer = Lion;
  static void bind(LionParamState& st, kernels::TensorSlot& slot) {
    slot.m = st.exp_avg().data_ptr<float>();
    slot.step = st.step();
  }
  static void set_step(LionParamState& st, std::int64_t step) { st.step(step); }
};

LionOptions::LionOptions(double lr) : lr_(lr) {}

// Every field once, in declaration order; serialize and == go through it.
template <typename Self>
auto LionOptions::fields(Self& self) {
  using internal::field;
  auto& [lr, betas, weight_decay, adapt, skip_nonfinite, fused, master_weights] = self;
  return std::make_tuple(field("lr", lr),
                         field("betas", betas),
                         field("weight_decay", weight_decay),
                         field("adapt", adapt),
                         field("skip_nonfinite", skip_nonfinite),
                         field("fused", fused),
                         field("master_weights", master_weights));
}
BIGBATCH_DEFINE_FIELD_IO(LionOptions)

template <typename Self>
auto LionParamState::fields(Self& self) {
  using internal::field;
  auto& [step, exp_avg, master] = self;
  return std::make_tuple(field("step", step), field("exp_avg", exp_avg), field("master", master));
}
BIGBATCH_DEFINE_FIELD_IO(LionParamState)
BIGBATCH_DEFINE_STATE_ACCESS(LionParamState)

void LionOptions::validate() const {
  using namespace internal;
  check_nonnegative("Lion", "lr", lr());
  check_betas("Lion", betas());
  check_nonnegative("Lion", "weight_decay", weight_decay());
}

LionParamState LionParamState::fresh(const at::Tensor& param) {
  LionParamState s;
  s.exp_avg(fp32_zeros_like(param));
  return s;
}

Lion::Lion(std::vector<torch::optim::OptimizerParamGroup> param_groups, LionOptions defaults)
    : LayerwiseOptimizer(std::move(param_groups), defaults, "Lion") {}

Lion::Lion(std::vector<torch::Tensor> params, LionOptions defaults)
    : Lion({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

// The formulas of lion.h in ATen ops, one tensor at a time, after the
// non-finite check over every group.
void Lion::step_reference(const std::vector<Group>& groups) {
  if (skip_nonfinite(groups, internal::finite_gradients(groups))) return;
  for (const Group& group : groups) {
    const LionOptions& o = *group.options;
    const auto [b1, b2] = o.betas();
    for (const auto& pg : group.params) {
      auto& st = state_of(pg.param);
      st.step(st.step() + 1);
      at::Tensor w = fp32_weights(o, pg.param);  // the parameter itself when it is fp32
      const at::Tensor g = pg.grad.to(at::kFloat);
      auto& m = st.exp_avg();
      const at::Tensor c = m * b1 + g * (1 - b1);  // the interpolation whose sign is the update
      w.mul_(1 - o.lr() * o.weight_decay());        // decoupled decay
      w.sub_(c.sign() * o.lr());
      m.mul_(b2).add_(g * (1 - b2));                // the momentum kept
      if (!w.is_same(pg.param)) pg.param.copy_(w);
    }
  }
}

// ------------------------------------------------ the options as the plan's ----

kernels::LionGroup kernel_group(const LionOptions& o) {
  kernels::LionGroup g;
  g.lr = o.lr();
  std::tie(g.beta1, g.beta2) = o.betas();
  g.weight_decay = o.weight_decay();
  g.skip_nonfinite = o.skip_nonfinite();
  return g;
}

// ---------------------------------------------------------------- the step ----

template class LayerwiseOptimizer<LionOptions, LionParamState>;

torch::Tensor Lion::step(LossClosure closure) { return LayerwiseOptimizer::step(std::move(closure)); }

}  // namespace bigbatch::optim
