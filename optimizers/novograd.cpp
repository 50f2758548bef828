// NovoGrad (novograd.h): options, state, and the step with its fused CPU path
// (kernels/novograd.h) and its reference path in plain ATen ops.
#include <bigbatch/optimizers/novograd.h>

#include <bigbatch/optimizers/cuda_hooks.h>
#include <bigbatch/optimizers/internal.h>

#include <cmath>
#include <tuple>

namespace bigbatch::optim {

#define NOVOGRAD_OPTION_FIELDS(X)                                                      \
  X(double, lr) X(betas_t, betas) X(double, eps) X(double, weight_decay)               \
  X(bool, grad_averaging) X(bool, adapt) X(bool, skip_nonfinite) X(bool, fused) X(bool, master_weights)
#define NOVOGRAD_STATE_FIELDS(X) \
  X(int64_t, step) X(torch::Tensor, exp_avg) X(torch::Tensor, exp_avg_sq) X(torch::Tensor, master)

NovoGradOptions::NovoGradOptions(double lr) : lr_(lr) {}
BIGBATCH_DEFINE_FIELD_IO(NovoGradOptions, NOVOGRAD_OPTION_FIELDS)
BIGBATCH_DEFINE_FIELD_IO(NovoGradParamState, NOVOGRAD_STATE_FIELDS)

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

torch::Tensor NovoGrad::step(LossClosure closure) {
  return norm_pass_then_update(closure, /*with_weight=*/false, [this](const NovoGradOptions& o,
                                                                    const ParamGrad& pg,
                                                                    const TensorNorms& n,
                                                                    bool fused) {
    const auto [b1, b2] = o.betas();
    const double wd = o.weight_decay();
    const double grad_factor = o.grad_averaging() ? 1 - b1 : 1.0;
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
    auto& m = st.exp_avg();
    if (fused) {
      kernels::NovoGradStep s;
      s.beta1 = static_cast<float>(b1);
      s.denom = std::sqrt(v.item<float>()) + static_cast<float>(o.eps());
      s.weight_decay = static_cast<float>(wd);
      s.grad_factor = static_cast<float>(grad_factor);
      s.lr = static_cast<float>(o.lr());
      kernels::novograd_update_cpu(pg.param.data_ptr(), pg.grad.data_ptr(), m.data_ptr<float>(),
                                   kernel_dtype(pg.param), pg.param.numel(), s);
      return;
    }
    // Reference: the formulas of novograd.h in ATen ops.
    at::Tensor w = fp32_weights(o, pg.param);  // the parameter itself when it is fp32
    at::Tensor d = pg.grad.to(at::kFloat) / (v.sqrt() + o.eps()) + wd * w;
    if (o.grad_averaging()) d = d * grad_factor;
    m.mul_(b1).add_(d);
    w.sub_(m * o.lr());
    if (!w.is_same(pg.param)) pg.param.copy_(w);
  });
}

// ------------------------------------------------------------- CUDA hooks ----

kernels::cuda::Algorithm cuda_algorithm(const NovoGradOptions*) { return kernels::cuda::Algorithm::kNovoGrad; }

kernels::cuda::GroupOptions cuda_group_options(const NovoGradOptions& o) {
  return moment_group_options(o);
}

}  // namespace bigbatch::optim
