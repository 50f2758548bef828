// Schedule-Free AdamW and SGD (schedule_free.h): options, state, the
// reference path of the step in plain ATen ops, the moves between the
// training point y and the evaluation point x, and the options as the fused
// plan takes them (kernels/schedule_free.h).
#include "schedule_free.h"

#include "internal.h"
#include "layerwise_optimizer_impl.h"

#include <algorithm>
#include <cmath>
#include <tuple>

namespace bigbatch::optim {

/// Where each state's numbers go in the engine (kernels::TensorSlot::carry).
template <typename State>
struct CarriedState {
  static void bind_carry(State& st, kernels::TensorSlot& slot) {
    slot.step = st.step();
    slot.carry[kernels::kWeightSum] = st.weight_sum();
    slot.carry[kernels::kLrMax] = st.lr_max();
  }
  static void set_step(State& st, std::int64_t step) { st.step(step); }
  static void set_carry(State& st, const double* carry) {
    st.weight_sum(carry[kernels::kWeightSum]);
    st.lr_max(carry[kernels::kLrMax]);
  }
};

namespace {

/// b1: where y lies between z (0) and x (1).
double interpolation(const AdamWScheduleFreeOptions& o) { return std::get<0>(o.betas()); }
double interpolation(const SGDScheduleFreeOptions& o) { return o.momentum(); }

void check_common(const char* name, double lr, double weight_decay, std::int64_t warmup_steps, double r,
                  double weight_lr_power) {
  using namespace internal;
  check_nonnegative(name, "lr", lr);
  check_nonnegative(name, "weight_decay", weight_decay);
  check_option(warmup_steps >= 0, name, "warmup_steps", warmup_steps, ">= 0");
  check_option(std::isfinite(r), name, "r", r, "finite");
  check_nonnegative(name, "weight_lr_power", weight_lr_power);
}

}  // namespace

template <>
struct FusedTraits<AdamWScheduleFreeOptions> : CarriedState<AdamWScheduleFreeParamState> {
  using Plan = kernels::ScheduleFreeAdamWPlan;
  using Optimizer = AdamWScheduleFree;
  static void bind(AdamWScheduleFreeParamState& st, kernels::TensorSlot& slot) {
    slot.m = st.z().data_ptr<float>();
    slot.v = st.exp_avg_sq().data_ptr<float>();
    bind_carry(st, slot);
  }
};

template <>
struct FusedTraits<SGDScheduleFreeOptions> : CarriedState<SGDScheduleFreeParamState> {
  using Plan = kernels::ScheduleFreeSGDPlan;
  using Optimizer = SGDScheduleFree;
  static void bind(SGDScheduleFreeParamState& st, kernels::TensorSlot& slot) {
    slot.m = st.z().data_ptr<float>();
    bind_carry(st, slot);
  }
};

// ------------------------------------------------------------ options ----

AdamWScheduleFreeOptions::AdamWScheduleFreeOptions(double lr) : lr_(lr) {}

template <typename Self>
auto AdamWScheduleFreeOptions::fields(Self& self) {
  using internal::field;
  auto& [lr, betas, eps, weight_decay, warmup_steps, r, weight_lr_power, adapt, skip_nonfinite, fused,
         master_weights] = self;
  return std::make_tuple(field("lr", lr), field("betas", betas), field("eps", eps),
                         field("weight_decay", weight_decay), field("warmup_steps", warmup_steps), field("r", r),
                         field("weight_lr_power", weight_lr_power), field("adapt", adapt),
                         field("skip_nonfinite", skip_nonfinite), field("fused", fused),
                         field("master_weights", master_weights));
}
BIGBATCH_DEFINE_FIELD_IO(AdamWScheduleFreeOptions)

void AdamWScheduleFreeOptions::validate() const {
  using namespace internal;
  const auto [b1, b2] = betas();
  check_option(b1 > 0 && b1 < 1, "AdamWScheduleFree", "betas[0]", b1, "in (0, 1)");
  check_option(b2 >= 0 && b2 < 1, "AdamWScheduleFree", "betas[1]", b2, "in [0, 1)");
  check_nonnegative("AdamWScheduleFree", "eps", eps());
  check_common("AdamWScheduleFree", lr(), weight_decay(), warmup_steps(), r(), weight_lr_power());
}

SGDScheduleFreeOptions::SGDScheduleFreeOptions(double lr) : lr_(lr) {}

template <typename Self>
auto SGDScheduleFreeOptions::fields(Self& self) {
  using internal::field;
  auto& [lr, momentum, weight_decay, warmup_steps, r, weight_lr_power, adapt, skip_nonfinite, fused,
         master_weights] = self;
  return std::make_tuple(field("lr", lr), field("momentum", momentum), field("weight_decay", weight_decay),
                         field("warmup_steps", warmup_steps), field("r", r),
                         field("weight_lr_power", weight_lr_power), field("adapt", adapt),
                         field("skip_nonfinite", skip_nonfinite), field("fused", fused),
                         field("master_weights", master_weights));
}
BIGBATCH_DEFINE_FIELD_IO(SGDScheduleFreeOptions)

void SGDScheduleFreeOptions::validate() const {
  internal::check_option(momentum() > 0 && momentum() < 1, "SGDScheduleFree", "momentum", momentum(), "in (0, 1)");
  check_common("SGDScheduleFree", lr(), weight_decay(), warmup_steps(), r(), weight_lr_power());
}

namespace {

/// The options both kinds have, as the plan takes them; b1 from interpolation().
template <typename Options>
kernels::ScheduleFreeGroup common_group(const Options& o) {
  kernels::ScheduleFreeGroup g;
  g.lr = o.lr();
  g.beta1 = interpolation(o);
  g.weight_decay = o.weight_decay();
  g.warmup_steps = o.warmup_steps();
  g.r = o.r();
  g.weight_lr_power = o.weight_lr_power();
  g.skip_nonfinite = o.skip_nonfinite();
  return g;
}

}  // namespace

kernels::ScheduleFreeGroup kernel_group(const AdamWScheduleFreeOptions& o) {
  kernels::ScheduleFreeGroup g = common_group(o);
  g.beta2 = std::get<1>(o.betas());
  g.eps = o.eps();
  g.adaptive = true;
  return g;
}

kernels::ScheduleFreeGroup kernel_group(const SGDScheduleFreeOptions& o) {
  kernels::ScheduleFreeGroup g = common_group(o);
  g.adaptive = false;
  return g;
}

// -------------------------------------------------------------- state ----

template <typename Self>
auto AdamWScheduleFreeParamState::fields(Self& self) {
  using internal::field;
  auto& [step, z, exp_avg_sq, weight_sum, lr_max, master] = self;
  return std::make_tuple(field("step", step), field("z", z), field("exp_avg_sq", exp_avg_sq),
                         field("weight_sum", weight_sum), field("lr_max", lr_max), field("master", master));
}
BIGBATCH_DEFINE_FIELD_IO(AdamWScheduleFreeParamState)
BIGBATCH_DEFINE_STATE_ACCESS(AdamWScheduleFreeParamState)

AdamWScheduleFreeParamState AdamWScheduleFreeParamState::fresh(const at::Tensor& param) {
  AdamWScheduleFreeParamState s;
  s.z(param.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true).contiguous());
  s.exp_avg_sq(fp32_zeros_like(param));
  return s;
}

template <typename Self>
auto SGDScheduleFreeParamState::fields(Self& self) {
  using internal::field;
  auto& [step, z, weight_sum, lr_max, master] = self;
  return std::make_tuple(field("step", step), field("z", z), field("weight_sum", weight_sum),
                         field("lr_max", lr_max), field("master", master));
}
BIGBATCH_DEFINE_FIELD_IO(SGDScheduleFreeParamState)
BIGBATCH_DEFINE_STATE_ACCESS(SGDScheduleFreeParamState)

SGDScheduleFreeParamState SGDScheduleFreeParamState::fresh(const at::Tensor& param) {
  SGDScheduleFreeParamState s;
  s.z(param.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true).contiguous());
  return s;
}

// ----------------------------------------------------------- the steps ----

// The formulas of kernels/schedule_free.h in ATen ops, one tensor at a time,
// after the non-finite check over every group. The per-tensor numbers are
// those the fused finalizer computes, in double; the element math rounds as
// the fused loop (products written out, ATen's lerp formula).
template <typename Options, typename ParamState>
void ScheduleFreeOptimizer<Options, ParamState>::step_reference(const std::vector<Group>& groups) {
  if (this->skip_nonfinite(groups, internal::finite_gradients(groups))) return;
  for (const Group& group : groups) {
    const Options& o = *group.options;
    const kernels::ScheduleFreeGroup kg = kernel_group(o);
    for (const auto& pg : group.params) {
      ParamState& st = this->state_of(pg.param);
      const std::int64_t k = st.step() + 1;
      const double lr = kernels::schedule_free_rate(kg, k);
      st.lr_max(std::max(lr, st.lr_max()));
      st.weight_sum(st.weight_sum() + kernels::schedule_free_weight(kg, k, st.lr_max()));
      st.step(k);
      const double carry[kernels::kCarried] = {st.weight_sum(), st.lr_max()};
      const kernels::ScheduleFreeStep s = kernels::schedule_free_step_of(kg, k, carry);

      at::Tensor y = this->fp32_weights(o, pg.param);
      const at::Tensor g = pg.grad.to(at::kFloat);
      at::Tensor& z = st.z();
      at::Tensor u = g;
      if constexpr (std::is_same_v<ParamState, AdamWScheduleFreeParamState>) {
        at::Tensor& v = st.exp_avg_sq();
        v.mul_(s.beta2).add_((g * g) * s.one_minus_beta2);
        u = g / ((v / s.bias_correction2).sqrt() + s.eps);
      }
      u = u + y * s.decay;
      const at::Tensor d = z - y;  // lerp(y, z, c) as ATen's formula, in two branches
      at::Tensor moved = std::fabs(s.c) < 0.5f ? y + d * s.c : z - d * (1.0f - s.c);
      y.copy_(moved + u * s.y_step);
      z.sub_(u * s.lr);
      if (!y.is_same(pg.param)) pg.param.copy_(y);
    }
  }
}

// The move between y and x, per parameter with state (a parameter without
// one has y = x = z): x = lerp(y, z, 1 - 1/b1); back, y itself where it was
// kept (the master copy, or the copy eval() made), else lerp(x, z, 1 - b1).
template <typename Options, typename ParamState>
void ScheduleFreeOptimizer<Options, ParamState>::train(bool on) {
  if (on == this->training_) return;
  at::NoGradGuard no_grad;
  for (auto& group : this->param_groups_) {
    const auto& o = static_cast<const Options&>(group.options());
    const double b1 = interpolation(o);
    for (const auto& p : group.params()) {
      const ParamState* st = this->find_state(p);
      if (st == nullptr) continue;
      const at::Tensor& z = st->z();
      if (st->master().defined()) {  // the master copy keeps y
        p.copy_(on ? st->master() : st->master().lerp(z, 1 - 1 / b1));
        continue;
      }
      const auto saved = saved_y_.find(p.unsafeGetTensorImpl());
      if (on && saved != saved_y_.end()) {
        p.copy_(saved->second);
      } else {
        if (!on) saved_y_[p.unsafeGetTensorImpl()] = p.detach().clone();
        p.copy_(p.to(at::kFloat).lerp_(z, on ? 1 - b1 : 1 - 1 / b1));
      }
    }
  }
  if (on) saved_y_.clear();
  this->training_ = on;
}

template class LayerwiseOptimizer<AdamWScheduleFreeOptions, AdamWScheduleFreeParamState>;
template class LayerwiseOptimizer<SGDScheduleFreeOptions, SGDScheduleFreeParamState>;
template class ScheduleFreeOptimizer<AdamWScheduleFreeOptions, AdamWScheduleFreeParamState>;
template class ScheduleFreeOptimizer<SGDScheduleFreeOptions, SGDScheduleFreeParamState>;

AdamWScheduleFree::AdamWScheduleFree(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                                     AdamWScheduleFreeOptions defaults)
    : ScheduleFreeOptimizer(std::move(param_groups), defaults, "AdamWScheduleFree") {}

AdamWScheduleFree::AdamWScheduleFree(std::vector<torch::Tensor> params, AdamWScheduleFreeOptions defaults)
    : AdamWScheduleFree({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

torch::Tensor AdamWScheduleFree::step(LossClosure closure) { return ScheduleFreeOptimizer::step(std::move(closure)); }

SGDScheduleFree::SGDScheduleFree(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                                 SGDScheduleFreeOptions defaults)
    : ScheduleFreeOptimizer(std::move(param_groups), defaults, "SGDScheduleFree") {}

SGDScheduleFree::SGDScheduleFree(std::vector<torch::Tensor> params, SGDScheduleFreeOptions defaults)
    : SGDScheduleFree({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

torch::Tensor SGDScheduleFree::step(LossClosure closure) { return ScheduleFreeOptimizer::step(std::move(closure)); }

}  // namespace bigbatch::optim
