// NovoGrad (novograd.h): options, state, the reference path of its step in
// plain ATen ops, and its options as its fused plan takes them (kernels/novograd.h).
#include "novograd.h"

#include "internal.h"
#include "layerwise_optimizer_impl.h"

#include <cmath>
#include <tuple>

namespace bigbatch::optim {

// What the fused step needs of the state (layerwise_optimizer_impl.h); declared
// before anything here instantiates LayerwiseOptimizer.
template <>
struct FusedTraits<NovoGradOptions> : MomentState<NovoGradParamState> {
  using Plan = kernels::NovoGradPlan;
  using Optimizer = NovoGrad;
};

NovoGradOptions::NovoGradOptions(double lr) : lr_(lr) {}

// Every field once, in declaration order; serialize and == go through it.
template <typename Self>
auto NovoGradOptions::fields(Self& self) {
  using internal::field;
  auto& [lr, betas, eps, weight_decay, grad_averaging, adapt, skip_nonfinite, fused, master_weights] = self;
  return std::make_tuple(field("lr", lr),
                         field("betas", betas),
                         field("eps", eps),
                         field("weight_decay", weight_decay),
                         field("grad_averaging", grad_averaging),
                         field("adapt", adapt),
                         field("skip_nonfinite", skip_nonfinite),
                         field("fused", fused),
                         field("master_weights", master_weights));
}
BIGBATCH_DEFINE_FIELD_IO(NovoGradOptions)

template <typename Self>
auto NovoGradParamState::fields(Self& self) {
  using internal::field;
  auto& [step, exp_avg, exp_avg_sq, master] = self;
  return std::make_tuple(field("step", step),
                         field("exp_avg", exp_avg),
                         field("exp_avg_sq", exp_avg_sq, internal::per_tensor),
                         field("master", master));
}
BIGBATCH_DEFINE_FIELD_IO(NovoGradParamState)
BIGBATCH_DEFINE_STATE_ACCESS(NovoGradParamState)

void NovoGradOptions::validate() const {
  using namespace internal;
  check_nonnegative("NovoGrad", "lr", lr());
  check_betas("NovoGrad", betas());
  check_nonnegative("NovoGrad", "eps", eps());
  check_nonnegative("NovoGrad", "weight_decay", weight_decay());
}

NovoGradParamState NovoGradParamState::fresh(const at::Tensor& param) {
  NovoGradParamState s;
  s.exp_avg(fp32_zeros_like(param));
  s.exp_avg_sq(at::zeros({}, param.options().dtype(at::kFloat)));
  return s;
}

NovoGrad::NovoGrad(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                   NovoGradOptions defaults)
    : LayerwiseOptimizer(std::move(param_groups), defaults, "NovoGrad") {}

NovoGrad::NovoGrad(std::vector<torch::Tensor> params, NovoGradOptions defaults)
    : NovoGrad({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

// The formulas of novograd.h in ATen ops, one tensor at a time.
void NovoGrad::step_reference(const std::vector<Group>& groups) {
  reference_norms_then_update(groups, /*with_weight=*/false, [this](const NovoGradOptions& o, const ParamGrad& pg,
                                                                   const TensorNorms& n) {
    const auto [b1, b2] = o.betas();
    auto& st = state_of(pg.param);
    st.step(st.step() + 1);
    // The layer's second moment, a scalar: v = n at the first step, else b2*v + (1-b2)*n.
    const double sq = n.g_norm * n.g_norm;
    auto& v = st.exp_avg_sq();
    if (st.step() == 1) {
      v.fill_(sq);
    } else {
      v.mul_(b2).add_(sq * (1 - b2));
    }
    at::Tensor w = fp32_weights(o, pg.param);  // the parameter itself when it is fp32
    at::Tensor d = pg.grad.to(at::kFloat) / (v.sqrt() + o.eps()) + o.weight_decay() * w;
    if (o.grad_averaging()) d = d * (1 - b1);
    auto& m = st.exp_avg();
    m.mul_(b1).add_(d);
    w.sub_(m * o.lr());
    if (!w.is_same(pg.param)) pg.param.copy_(w);
  });
}

// ------------------------------------------------ the options as the plan's ----

kernels::NovoGradGroup kernel_group(const NovoGradOptions& o) {
  kernels::NovoGradGroup g;
  g.lr = o.lr();
  std::tie(g.beta1, g.beta2) = o.betas();
  g.eps = o.eps();
  g.weight_decay = o.weight_decay();
  g.grad_averaging = o.grad_averaging();
  g.skip_nonfinite = o.skip_nonfinite();
  return g;
}

// ---------------------------------------------------------------- the step ----

template class LayerwiseOptimizer<NovoGradOptions, NovoGradParamState>;

torch::Tensor NovoGrad::step(LossClosure closure) { return LayerwiseOptimizer::step(std::move(closure)); }

}  // namespace bigbatch::optim
