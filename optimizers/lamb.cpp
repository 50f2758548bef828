// LAMB (lamb.h): options, state, and the step with its fused CPU path
// (kernels/lamb.h) and its reference path in plain ATen ops.
#include <bigbatch/optimizers/lamb.h>

#include <bigbatch/kernels/common.h>
#include <bigbatch/optimizers/cuda_hooks.h>
#include <bigbatch/optimizers/internal.h>

#include <algorithm>
#include <cmath>
#include <tuple>

namespace bigbatch::optim {

#define LAMB_OPTION_FIELDS(X)                                                             \
  X(double, lr) X(betas_t, betas) X(double, eps) X(double, weight_decay)                  \
  X(bool, bias_correction) X(bool, grad_averaging) X(bool, adam_w_mode)                   \
  X(double, max_grad_norm) X(bool, always_adapt) X(bool, trust_clip) X(double, min_trust) \
  X(double, max_trust) X(bool, adapt) X(bool, skip_nonfinite) X(bool, fused) X(bool, master_weights)
#define LAMB_STATE_FIELDS(X) \
  X(int64_t, step) X(torch::Tensor, exp_avg) X(torch::Tensor, exp_avg_sq) X(torch::Tensor, master)

LAMBOptions::LAMBOptions(double lr) : lr_(lr) {}
BIGBATCH_DEFINE_FIELD_IO(LAMBOptions, LAMB_OPTION_FIELDS)
BIGBATCH_DEFINE_FIELD_IO(LAMBParamState, LAMB_STATE_FIELDS)

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

double trust_ratio(const LAMBOptions& o, double w_norm, double u_norm) {
  return kernels::lamb_trust_ratio(w_norm, u_norm, o.adapt() && (o.weight_decay() != 0 || o.always_adapt()),
                                   o.min_trust(), o.max_trust(), o.trust_clip());
}

// The per-tensor coefficients of step t, rounded to fp32 once.
kernels::LambStep kernel_step(const LAMBOptions& o, std::int64_t t, double grad_scale) {
  const auto [b1, b2] = o.betas();
  return kernels::lamb_step(b1, b2, o.grad_averaging(), o.bias_correction(), o.eps(),
                            o.weight_decay(), o.adam_w_mode(), t, grad_scale);
}

}  // namespace

LAMB::LAMB(std::vector<torch::optim::OptimizerParamGroup> param_groups, LAMBOptions defaults)
    : LayerwiseOptimizer(std::move(param_groups), defaults, "LAMB") {}

LAMB::LAMB(std::vector<torch::Tensor> params, LAMBOptions defaults)
    : LAMB({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

torch::Tensor LAMB::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  const torch::Tensor loss = run_closure(closure);
  const auto groups = gather();
  if (step_cuda(groups)) return loss;
  std::vector<bool> finite(groups.size(), true);

  // G, the L2 norm of every gradient of every group, when some group clips.
  double global_norm = 0;
  const bool clipping = std::any_of(groups.begin(), groups.end(),
                                    [](const Group& g) { return g.options->max_grad_norm() > 0; });
  if (clipping) {
    double sum = 0;
    for (std::size_t i = 0; i < groups.size(); ++i) {
      const bool fused = runs_fused(groups[i]);
      for (const auto& pg : groups[i].params) {
        const double sq = fused
            ? kernels::sum_squares_cpu(pg.grad.data_ptr(), nullptr, kernel_dtype(pg.grad),
                                       pg.grad.numel()).x
            : std::pow(internal::norm_of(pg.grad), 2);
        finite[i] = finite[i] && std::isfinite(sq);
        sum += sq;
      }
    }
    global_norm = std::sqrt(sum);
  }

  // Norm pass: ||w||, ||g||, ||u|| per tensor, writing nothing.
  std::vector<std::vector<kernels::LambNorms>> norms(groups.size());
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const LAMBOptions& o = *groups[i].options;
    const bool fused = runs_fused(groups[i]);
    for (const auto& pg : groups[i].params) {
      if (!fused) {
        finite[i] = finite[i] && internal::all_finite(pg.grad);
        continue;
      }
      auto& st = state_of(pg.param);
      const auto n = kernels::lamb_norms_cpu(
          pg.param.data_ptr(), pg.grad.data_ptr(), st.exp_avg().data_ptr<float>(),
          st.exp_avg_sq().data_ptr<float>(), kernel_dtype(pg.param), pg.param.numel(),
          kernel_step(o, st.step() + 1, clip_scale(o, global_norm)));
      finite[i] = finite[i] && std::isfinite(n.g_sq);
      norms[i].push_back(n);
    }
  }
  if (skip_nonfinite(groups, finite)) return loss;

  for (std::size_t i = 0; i < groups.size(); ++i) {
    const double grad_scale = clip_scale(*groups[i].options, global_norm);
    if (runs_fused(groups[i])) {
      step_fused(groups[i], grad_scale, norms[i]);
    } else {
      step_reference(groups[i], grad_scale);
    }
  }
  return loss;
}

void LAMB::step_fused(const Group& group, double grad_scale,
                      const std::vector<kernels::LambNorms>& norms) {
  const LAMBOptions& o = *group.options;
  for (std::size_t j = 0; j < group.params.size(); ++j) {
    const auto& pg = group.params[j];
    auto& st = state_of(pg.param);
    st.step(st.step() + 1);
    const double ratio = trust_ratio(o, std::sqrt(norms[j].w_sq), std::sqrt(norms[j].u_sq));
    kernels::lamb_update_cpu(pg.param.data_ptr(), pg.grad.data_ptr(), st.exp_avg().data_ptr<float>(),
                             st.exp_avg_sq().data_ptr<float>(), kernel_dtype(pg.param),
                             pg.param.numel(), kernel_step(o, st.step(), grad_scale),
                             static_cast<float>(o.lr() * ratio));
  }
}

// The specification in ATen ops, one tensor at a time.
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
    w.sub_(u * (o.lr() * ratio));
    if (!w.is_same(pg.param)) pg.param.copy_(w);
  }
}

// ------------------------------------------------------------- CUDA hooks ----

kernels::cuda::Algorithm cuda_algorithm(const LAMBOptions*) { return kernels::cuda::Algorithm::kLamb; }

kernels::cuda::GroupOptions cuda_group_options(const LAMBOptions& o) {
  kernels::cuda::GroupOptions g = moment_group_options(o);
  g.max_grad_norm = o.max_grad_norm();
  g.min_trust = o.min_trust();
  g.max_trust = o.max_trust();
  using namespace kernels::cuda;
  g.flags |= (o.adapt() ? kAdapt : 0u) | (o.bias_correction() ? kBiasCorrection : 0u) |
             (o.adam_w_mode() ? kAdamW : 0u) | (o.always_adapt() ? kAlwaysAdapt : 0u) |
             (o.trust_clip() ? kTrustClip : 0u);
  return g;
}

}  // namespace bigbatch::optim
