// LARC (larc.h): options, state, the reference path of its step in plain
// ATen ops, and its options as its fused plan takes them (kernels/momentum.h).
#include "larc.h"

#include "internal.h"
#include "layerwise_optimizer_impl.h"

namespace bigbatch::optim {

// What the fused step needs of the state (layerwise_optimizer_impl.h); declared
// before anything here instantiates LayerwiseOptimizer.
template <>
struct FusedTraits<LARCOptions> : BufferState<LARCParamState> {
  using Plan = kernels::LarcPlan;
  using Optimizer = LARC;
};

LARCOptions::LARCOptions(double lr) : lr_(lr) {}

// Every field once, in declaration order; serialize and == go through it.
template <typename Self>
auto LARCOptions::fields(Self& self) {
  using internal::field;
  auto& [lr, momentum, weight_decay, trust_coefficient, eps, clip, nesterov, adapt, always_adapt,
         skip_nonfinite, fused, master_weights] = self;
  return std::make_tuple(field("lr", lr),
                         field("momentum", momentum),
                         field("weight_decay", weight_decay),
                         field("trust_coefficient", trust_coefficient),
                         field("eps", eps),
                         field("clip", clip),
                         field("nesterov", nesterov),
                         field("adapt", adapt),
                         field("always_adapt", always_adapt),
                         field("skip_nonfinite", skip_nonfinite),
                         field("fused", fused),
                         field("master_weights", master_weights));
}
BIGBATCH_DEFINE_FIELD_IO(LARCOptions)

template <typename Self>
auto LARCParamState::fields(Self& self) {
  using internal::field;
  auto& [momentum_buffer, master] = self;
  return std::make_tuple(field("momentum_buffer", momentum_buffer),
                         field("master", master));
}
BIGBATCH_DEFINE_FIELD_IO(LARCParamState)
BIGBATCH_DEFINE_STATE_ACCESS(LARCParamState)

void LARCOptions::validate() const {
  using namespace internal;
  // clip divides by lr: a zero rate is meaningless there.
  check_option(clip() ? lr() > 0 : lr() >= 0, "LARC", "lr", lr(), clip() ? "> 0 with clip" : ">= 0");
  check_option(momentum() >= 0 && momentum() < 1, "LARC", "momentum", momentum(), "in [0, 1)");
  check_nonnegative("LARC", "weight_decay", weight_decay());
  check_option(trust_coefficient() > 0, "LARC", "trust_coefficient", trust_coefficient(), "> 0");
  check_nonnegative("LARC", "eps", eps());
  check_option(!nesterov() || momentum() > 0, "LARC", "momentum", momentum(),
               "> 0 with nesterov");
}

LARCParamState LARCParamState::fresh(const at::Tensor& param) {
  LARCParamState s;
  s.momentum_buffer(fp32_zeros_like(param));
  return s;
}

LARC::LARC(std::vector<torch::optim::OptimizerParamGroup> param_groups, LARCOptions defaults)
    : LayerwiseOptimizer(std::move(param_groups), defaults, "LARC") {}

LARC::LARC(std::vector<torch::Tensor> params, LARCOptions defaults)
    : LARC({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

// The formulas of larc.h in ATen ops, one tensor at a time.
void LARC::step_reference(const std::vector<Group>& groups) {
  reference_norms_then_update(groups, /*with_weight=*/true, [this](const LARCOptions& o, const ParamGrad& pg,
                                                                  const TensorNorms& n) {
    const double wd = o.weight_decay();
    const double scale = kernels::larc_scale(n.w_norm, n.g_norm, internal::adapts(o), o.clip(), o.lr(),
                                             o.trust_coefficient(), wd, o.eps());
    if (internal::adapts(o)) note_trust_ratio(pg.param, scale);
    auto& v = state_of(pg.param).momentum_buffer();
    at::Tensor w = fp32_weights(o, pg.param);  // the parameter itself when it is fp32
    const at::Tensor d = (pg.grad.to(at::kFloat) + wd * w) * scale;
    v.mul_(o.momentum()).add_(d);
    if (o.nesterov()) {
      w.sub_((d + v * o.momentum()) * o.lr());
    } else {
      w.sub_(v * o.lr());
    }
    if (!w.is_same(pg.param)) pg.param.copy_(w);
  });
}

// ------------------------------------------------ the options as the plan's ----

kernels::LarcGroup kernel_group(const LARCOptions& o) {
  kernels::LarcGroup g;
  g.lr = o.lr();
  g.momentum = o.momentum();
  g.weight_decay = o.weight_decay();
  g.trust_coefficient = o.trust_coefficient();
  g.eps = o.eps();
  g.nesterov = o.nesterov();
  g.adapt = internal::adapts(o);
  g.clip = o.clip();
  g.skip_nonfinite = o.skip_nonfinite();
  return g;
}

// ---------------------------------------------------------------- the step ----

template class LayerwiseOptimizer<LARCOptions, LARCParamState>;

torch::Tensor LARC::step(LossClosure closure) { return LayerwiseOptimizer::step(std::move(closure)); }

}  // namespace bigbatch::optim
