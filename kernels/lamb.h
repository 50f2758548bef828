// LAMB (You et al. 2019, arXiv:1904.00962, Algorithm 2), as FORMULAS.md:
//   g' = g*grad_scale (+ wd*w unless adam_w_mode)
//   m = b1*m + b3*g';  v = b2*v + (1-b2)*g'^2
//   u = (m/bc1) / (sqrt(v/bc2) + eps) (+ wd*w in adam_w_mode)
//   w = w - lr*ratio*u,   ratio from ||w|| and ||u|| (needs a norm pass first)
#pragma once

#include <bigbatch/kernels/common.h>

namespace bigbatch::kernels {

struct LambStep {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float beta3 = 0.1f;              ///< grad_averaging ? 1 - beta1 : 1
  float one_minus_beta2 = 0.001f;  ///< 1 - beta2, rounded once
  float bias_correction1 = 1;      ///< 1 - beta1^t, or 1 without bias correction
  float bias_correction2 = 1;      ///< 1 - beta2^t, or 1
  float eps = 1e-6f;
  float weight_decay = 0;
  float grad_scale = 1;            ///< global clipping: 1 / max(1, G / max_grad_norm)
  bool adam_w_mode = true;
};

struct LambNorms {
  double w_sq = 0;  ///< ||w||^2
  double g_sq = 0;  ///< ||g||^2 of the raw gradient (finite iff g is)
  double u_sq = 0;  ///< ||u||^2 of the update the step would apply
};

/// Norm pass: reads w, g, m, v and writes nothing, so a step can still be
/// abandoned (non-finite gradients) after it. m and v may be null (fresh state = 0).
LambNorms lamb_norms_cpu(const void* w, const void* g, const float* m, const float* v,
                         DType dtype, std::int64_t n, const LambStep& step);

/// Update pass: recomputes m, v, u exactly as the norm pass did, stores m and v,
/// and applies w -= lr_ratio * u. Reads w, g, m, v; writes m, v, w.
void lamb_update_cpu(void* w, const void* g, float* m, float* v, DType dtype, std::int64_t n,
                     const LambStep& step, float lr_ratio);

}  // namespace bigbatch::kernels
