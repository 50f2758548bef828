// LARC (larc.h): options, state, and the step with its fused CPU path
// (kernels/momentum.h) and its reference path in plain ATen ops.
#include <bigbatch/optimizers/larc.h>

#include <bigbatch/optimizers/cuda_hooks.h>
#include <bigbatch/optimizers/internal.h>

namespace bigbatch::optim {

#define LARC_OPTION_FIELDS(X)                                                                  \
  X(double, lr) X(double, momentum) X(double, weight_decay) X(double, trust_coefficient)       \
  X(double, eps) X(bool, clip) X(bool, nesterov) X(bool, adapt) X(bool, skip_nonfinite)        \
  X(bool, fused) X(bool, master_weights)
#define LARC_STATE_FIELDS(X) X(torch::Tensor, momentum_buffer) X(torch::Tensor, master)

LARCOptions::LARCOptions(double lr) : lr_(lr) {}
BIGBATCH_DEFINE_FIELD_IO(LARCOptions, LARC_OPTION_FIELDS)
BIGBATCH_DEFINE_FIELD_IO(LARCParamState, LARC_STATE_FIELDS)

void LARCOptions::validate() const {
  using namespace internal;
  // clip divides by lr: a zero rate is meaningless there.
  check_option(clip() ? lr() > 0 : lr() >= 0, "LARC", "lr", lr(), clip() ? "> 0 with clip" : ">= 0");
  check_nonnegative("LARC", "momentum", momentum());
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

torch::Tensor LARC::step(LossClosure closure) {
  return norm_pass_then_update(closure, /*with_weight=*/true, [this](const LARCOptions& o,
                                                                   const ParamGrad& pg,
                                                                   const TensorNorms& n,
                                                                   bool fused) {
    const double wd = o.weight_decay();
    const double scale = kernels::larc_scale(n.w_norm, n.g_norm, o.adapt(), o.clip(), o.lr(),
                                             o.trust_coefficient(), wd, o.eps());
    auto& v = state_of(pg.param).momentum_buffer();
    if (fused) {
      // scale = the clipped local rate, step_size = lr: the rate outside the buffer.
      momentum_update_fused(pg, v, {static_cast<float>(scale), static_cast<float>(o.lr()),
                                    static_cast<float>(o.momentum()), static_cast<float>(wd), o.nesterov()});
      return;
    }
    // Reference: the formulas of larc.h in ATen ops.
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

// ------------------------------------------------------------- CUDA hooks ----

kernels::cuda::Algorithm cuda_algorithm(const LARCOptions*) { return kernels::cuda::Algorithm::kLarc; }

kernels::cuda::GroupOptions cuda_group_options(const LARCOptions& o) {
  kernels::cuda::GroupOptions g = momentum_group_options(o);
  if (o.clip()) g.flags |= kernels::cuda::kClip;
  return g;
}

}  // namespace bigbatch::optim
