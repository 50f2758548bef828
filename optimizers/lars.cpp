// LARS (lars.h): options, state, and the step with its fused CPU path
// (kernels/momentum.h) and its reference path in plain ATen ops.
#include <bigbatch/optimizers/lars.h>

#include <bigbatch/optimizers/cuda_hooks.h>
#include <bigbatch/optimizers/internal.h>

namespace bigbatch::optim {

#define LARS_OPTION_FIELDS(X)                                                                  \
  X(double, lr) X(double, momentum) X(double, weight_decay) X(double, trust_coefficient)       \
  X(double, eps) X(bool, nesterov) X(bool, adapt) X(bool, skip_nonfinite) X(bool, fused)        \
  X(bool, master_weights)
#define LARS_STATE_FIELDS(X) X(torch::Tensor, momentum_buffer) X(torch::Tensor, master)

LARSOptions::LARSOptions(double lr) : lr_(lr) {}
BIGBATCH_DEFINE_FIELD_IO(LARSOptions, LARS_OPTION_FIELDS)
BIGBATCH_DEFINE_FIELD_IO(LARSParamState, LARS_STATE_FIELDS)

void LARSOptions::validate() const {
  using namespace internal;
  check_nonnegative("LARS", "lr", lr());
  check_nonnegative("LARS", "momentum", momentum());
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

torch::Tensor LARS::step(LossClosure closure) {
  return norm_pass_then_update(closure, /*with_weight=*/true, [this](const LARSOptions& o,
                                                                   const ParamGrad& pg,
                                                                   const TensorNorms& n,
                                                                   bool fused) {
    const double wd = o.weight_decay();
    const double ratio = kernels::lars_trust_ratio(n.w_norm, n.g_norm, o.adapt(),
                                                   o.trust_coefficient(), wd, o.eps());
    auto& v = state_of(pg.param).momentum_buffer();
    if (fused) {
      // scale = lr*ratio, step_size = 1: the rate sits inside the buffer.
      momentum_update_fused(pg, v, {static_cast<float>(o.lr() * ratio), 1.0f,
                                    static_cast<float>(o.momentum()), static_cast<float>(wd), o.nesterov()});
      return;
    }
    // Reference: the formulas of lars.h in ATen ops.
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

// ------------------------------------------------------------- CUDA hooks ----

kernels::cuda::Algorithm cuda_algorithm(const LARSOptions*) { return kernels::cuda::Algorithm::kLars; }

kernels::cuda::GroupOptions cuda_group_options(const LARSOptions& o) {
  return momentum_group_options(o);
}

}  // namespace bigbatch::optim
