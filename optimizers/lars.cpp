// LARS (lars.h): options, state, the reference path of its step in plain
// ATen ops, and its options as its fused plan takes them (kernels/momentum.h).
#include "lars.h"

#include "internal.h"
#include "layerwise_optimizer_impl.h"

#include <cmath>

namespace bigbatch::optim {

// What the fused step needs of the state (layerwise_optimizer_impl.h); declared
// before anything here instantiates LayerwiseOptimizer.
template <>
struct FusedTraits<LARSOptions> : BufferState<LARSParamState> {
  using Plan = kernels::LarsPlan;
  using Optimizer = LARS;
};

LARSOptions::LARSOptions(double lr) : lr_(lr) {}

// Every field once, in declaration order; serialize and == go through it.
template <typename Self>
auto LARSOptions::fields(Self& self) {
  using internal::field;
  auto& [lr, momentum, weight_decay, trust_coefficient, eps, nesterov, adapt, always_adapt, skip_nonfinite,
         fused, master_weights] = self;
  return std::make_tuple(field("lr", lr),
                         field("momentum", momentum),
                         field("weight_decay", weight_decay),
                         field("trust_coefficient", trust_coefficient),
                         field("eps", eps),
                         field("nesterov", nesterov),
                         field("adapt", adapt),
                         field("always_adapt", always_adapt),
                         field("skip_nonfinite", skip_nonfinite),
                         field("fused", fused),
                         field("master_weights", master_weights));
}
BIGBATCH_DEFINE_FIELD_IO(LARSOptions)

template <typename Self>
auto LARSParamState::fields(Self& self) {
  using internal::field;
  auto& [momentum_buffer, master] = self;
  return std::make_tuple(field("momentum_buffer", momentum_buffer),
                         field("master", master));
}
BIGBATCH_DEFINE_FIELD_IO(LARSParamState)
BIGBATCH_DEFINE_STATE_ACCESS(LARSParamState)

void LARSOptions::validate() const {
  using namespace internal;
  check_nonnegative("LARS", "lr", lr());
  check_option(momentum() >= 0 && momentum() < 1, "LARS", "momentum", momentum(), "in [0, 1)");
  check_nonnegative("LARS", "weight_decay", weight_decay());
  check_option(trust_coefficient() > 0, "LARS", "trust_coefficient", trust_coefficient(), "> 0");
  check_nonnegative("LARS", "eps", eps());
  check_option(!nesterov() || momentum() > 0, "LARS", "momentum", momentum(),
               "> 0 with nesterov");
}

LARSParamState LARSParamState::fresh(const at::Tensor& param) {
  LARSParamState s;
  s.momentum_buffer(fp32_zeros_like(param));
  return s;
}

LARS::LARS(std::vector<torch::optim::OptimizerParamGroup> param_groups, LARSOptions defaults)
    : LayerwiseOptimizer(std::move(param_groups), defaults, "LARS") {}

LARS::LARS(std::vector<torch::Tensor> params, LARSOptions defaults)
    : LARS({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

void LARS::rescale_momentum(double factor) {
  TORCH_CHECK(std::isfinite(factor) && factor >= 0, "LARS::rescale_momentum: factor must be finite and >= 0, got ",
              factor);
  for (auto& group : param_groups()) {
    for (const auto& p : group.params()) {
      LARSParamState* s = find_state(p);  // nullptr: no step taken yet
      if (s != nullptr && s->momentum_buffer().defined()) s->momentum_buffer().mul_(factor);
    }
  }
}

// The formulas of lars.h in ATen ops, one tensor at a time.
void LARS::step_reference(const std::vector<Group>& groups) {
  reference_norms_then_update(groups, /*with_weight=*/true, [this](const LARSOptions& o, const ParamGrad& pg,
                                                                  const TensorNorms& n) {
    const double wd = o.weight_decay();
    const double ratio =
        kernels::lars_trust_ratio(n.w_norm, n.g_norm, internal::adapts(o), o.trust_coefficient(), wd, o.eps());
    if (internal::adapts(o)) note_trust_ratio(pg.param, ratio);
    auto& v = state_of(pg.param).momentum_buffer();
    at::Tensor w = fp32_weights(o, pg.param);  // the parameter itself when it is fp32
    const at::Tensor d = pg.grad.to(at::kFloat) + wd * w;
    v.mul_(o.momentum()).add_(d * (o.lr() * ratio));
    if (o.nesterov()) {
      w.sub_(v * o.momentum() + d * (o.lr() * ratio));
    } else {
      w.sub_(v);
    }
    if (!w.is_same(pg.param)) pg.param.copy_(w);
  });
}

// ------------------------------------------------ the options as the plan's ----

kernels::LarsGroup kernel_group(const LARSOptions& o) {
  kernels::LarsGroup g;
  g.lr = o.lr();
  g.momentum = o.momentum();
  g.weight_decay = o.weight_decay();
  g.trust_coefficient = o.trust_coefficient();
  g.eps = o.eps();
  g.nesterov = o.nesterov();
  g.adapt = internal::adapts(o);
  g.skip_nonfinite = o.skip_nonfinite();
  return g;
}

// ---------------------------------------------------------------- the step ----

template class LayerwiseOptimizer<LARSOptions, LARSParamState>;

torch::Tensor LARS::step(LossClosure closure) { return LayerwiseOptimizer::step(std::move(closure)); }

}  // namespace bigbatch::optim
