// LAMB (lamb.h): options, state, the reference path of its step in plain
// ATen ops, and its options as its fused plan takes them (kernels/lamb.h).
#include "lamb.h"

#include "../kernels/common.h"
#include "internal.h"
#include "layerwise_optimizer_impl.h"

#include <algorithm>
#include <cmath>
#include <tuple>

namespace bigbatch::optim {

// What the fused step needs of the state (layerwise_optimizer_impl.h); declared
// before anything here instantiates LayerwiseOptimizer.
template <>
struct FusedTraits<LAMBOptions> : MomentState<LAMBParamState> {
  using Plan = kernels::LambPlan;
  using Optimizer = LAMB;
};

LAMBOptions::LAMBOptions(double lr) : lr_(lr) {}

// Every field once, in declaration order; serialize and == go through it.
template <typename Self>
auto LAMBOptions::fields(Self& self) {
  using internal::field;
  auto& [lr, betas, eps, weight_decay, bias_correction, grad_averaging, adam_w_mode, max_grad_norm,
         always_adapt, trust_clip, min_trust, max_trust, adapt, skip_nonfinite, fused, master_weights] = self;
  return std::make_tuple(field("lr", lr),
                         field("betas", betas),
                         field("eps", eps),
                         field("weight_decay", weight_decay),
                         field("bias_correction", bias_correction),
                         field("grad_averaging", grad_averaging),
                         field("adam_w_mode", adam_w_mode),
                         field("max_grad_norm", max_grad_norm),
                         field("always_adapt", always_adapt),
                         field("trust_clip", trust_clip),
                         field("min_trust", min_trust),
                         field("max_trust", max_trust),
                         field("adapt", adapt),
                         field("skip_nonfinite", skip_nonfinite),
                         field("fused", fused),
                         field("master_weights", master_weights));
}
BIGBATCH_DEFINE_FIELD_IO(LAMBOptions)

template <typename Self>
auto LAMBParamState::fields(Self& self) {
  using internal::field;
  auto& [step, exp_avg, exp_avg_sq, master] = self;
  return std::make_tuple(field("step", step),
                         field("exp_avg", exp_avg),
                         field("exp_avg_sq", exp_avg_sq),
                         field("master", master));
}
BIGBATCH_DEFINE_FIELD_IO(LAMBParamState)
BIGBATCH_DEFINE_STATE_ACCESS(LAMBParamState)

void LAMBOptions::validate() const {
  using namespace internal;
  check_nonnegative("LAMB", "lr", lr());
  check_betas("LAMB", betas());
  check_nonnegative("LAMB", "eps", eps());
  check_nonnegative("LAMB", "weight_decay", weight_decay());
  check_nonnegative("LAMB", "max_grad_norm", max_grad_norm());
  check_nonnegative("LAMB", "min_trust", min_trust());
  check_option(max_trust() >= min_trust(), "LAMB", "max_trust", max_trust(), ">= min_trust");
}

LAMBParamState LAMBParamState::fresh(const at::Tensor& param) {
  LAMBParamState s;
  s.exp_avg(fp32_zeros_like(param));
  s.exp_avg_sq(fp32_zeros_like(param));
  return s;
}

namespace {

// 1 / max(1, G / max_grad_norm): the factor global-norm clipping applies.
double clip_scale(const LAMBOptions& o, double global_norm) {
  return o.max_grad_norm() > 0 ? 1.0 / std::max(1.0, global_norm / o.max_grad_norm()) : 1.0;
}

bool uses_ratio(const LAMBOptions& o) {
  return kernels::lamb_uses_ratio(o.adapt(), o.weight_decay(), o.always_adapt());
}

double trust_ratio(const LAMBOptions& o, double w_norm, double u_norm) {
  return kernels::lamb_trust_ratio(w_norm, u_norm, uses_ratio(o), o.min_trust(), o.max_trust(), o.trust_clip());
}

}  // namespace

LAMB::LAMB(std::vector<torch::optim::OptimizerParamGroup> param_groups, LAMBOptions defaults)
    : LayerwiseOptimizer(std::move(param_groups), defaults, "LAMB") {}

LAMB::LAMB(std::vector<torch::Tensor> params, LAMBOptions defaults)
    : LAMB({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

// The formulas of lamb.h in ATen ops: G and the non-finite check over every
// group first, then each tensor.
void LAMB::step_reference(const std::vector<Group>& groups) {
  const bool clipping = std::any_of(groups.begin(), groups.end(),
                                    [](const Group& g) { return g.options->max_grad_norm() > 0; });
  std::vector<bool> finite(groups.size(), true);
  double sum = 0;  // G^2, the squared L2 norm of every gradient of every group (when some group clips)
  for (std::size_t i = 0; i < groups.size(); ++i) {
    for (const auto& pg : groups[i].params) {
      finite[i] = finite[i] && internal::all_finite(pg.grad);
      if (clipping) sum += std::pow(internal::norm_of(pg.grad), 2);
    }
  }
  if (skip_nonfinite(groups, finite)) return;
  for (const Group& group : groups) step_reference(group, clip_scale(*group.options, std::sqrt(sum)));
}

// One group of the reference step, one tensor at a time.
void LAMB::step_reference(const Group& group, double grad_scale) {
  const LAMBOptions& o = *group.options;
  const auto [b1, b2] = o.betas();
  const double wd = o.weight_decay();
  for (const auto& pg : group.params) {
    auto& st = state_of(pg.param);
    st.step(st.step() + 1);
    const auto t = static_cast<double>(st.step());
    at::Tensor w = fp32_weights(o, pg.param);  // the parameter itself when it is fp32
    at::Tensor g = pg.grad.to(at::kFloat) * grad_scale;
    if (!o.adam_w_mode()) g = g + wd * w;
    auto& m = st.exp_avg();
    auto& v = st.exp_avg_sq();
    m.mul_(b1).add_(g * (o.grad_averaging() ? 1 - b1 : 1.0));
    v.mul_(b2).add_(g * g * (1 - b2));
    const at::Tensor m_hat = o.bias_correction() ? m / (1 - std::pow(b1, t)) : m;
    const at::Tensor v_hat = o.bias_correction() ? v / (1 - std::pow(b2, t)) : v;
    at::Tensor u = m_hat / (v_hat.sqrt() + o.eps());
    if (o.adam_w_mode()) u = u + wd * w;
    const double ratio = trust_ratio(o, internal::norm_of(w), internal::norm_of(u));
    if (uses_ratio(o)) note_trust_ratio(pg.param, ratio);
    w.sub_(u * (o.lr() * ratio));
    if (!w.is_same(pg.param)) pg.param.copy_(w);
  }
}

// ------------------------------------------------ the options as the plan's ----

kernels::LambGroup kernel_group(const LAMBOptions& o) {
  kernels::LambGroup g;
  g.lr = o.lr();
  std::tie(g.beta1, g.beta2) = o.betas();
  g.eps = o.eps();
  g.weight_decay = o.weight_decay();
  g.max_grad_norm = o.max_grad_norm();
  g.min_trust = o.min_trust();
  g.max_trust = o.max_trust();
  g.bias_correction = o.bias_correction();
  g.grad_averaging = o.grad_averaging();
  g.adam_w_mode = o.adam_w_mode();
  g.always_adapt = o.always_adapt();
  g.trust_clip = o.trust_clip();
  g.adapt = o.adapt();
  g.skip_nonfinite = o.skip_nonfinite();
  return g;
}

// ---------------------------------------------------------------- the step ----

template class LayerwiseOptimizer<LAMBOptions, LAMBParamState>;

torch::Tensor LAMB::step(LossClosure closure) { return LayerwiseOptimizer::step(std::move(closure)); }

}  // namespace bigbatch::optim
