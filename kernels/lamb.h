// LAMB (You et al. 2019, arXiv:1904.00962, Algorithm 2), as FORMULAS.md:
//   g' = g*grad_scale (+ wd*w unless adam_w_mode)
//   m = b1*m + b3*g';  v = b2*v + (1-b2)*g'^2
//   u = (m/bc1) / (sqrt(v/bc2) + eps) (+ wd*w in adam_w_mode)
//   w = w - lr*ratio*u,   ratio from ||w|| and ||u|| (needs a norm pass first)
#pragma once

#include <bigbatch/kernels/common.h>

#include <math.h>

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

/// The coefficients of a tensor's step number t (1-based), rounded to fp32
/// once from double: beta3 = grad_averaging ? 1 - b1 : 1; bias corrections
/// 1 - b^t, or 1 without bias correction; grad_scale from global clipping.
BIGBATCH_HD inline LambStep lamb_step(double beta1, double beta2, bool grad_averaging,
                                      bool bias_correction, double eps, double weight_decay,
                                      bool adam_w_mode, std::int64_t t, double grad_scale) {
  LambStep s;
  s.beta1 = static_cast<float>(beta1);
  s.beta2 = static_cast<float>(beta2);
  s.beta3 = static_cast<float>(grad_averaging ? 1 - beta1 : 1.0);
  s.one_minus_beta2 = static_cast<float>(1 - beta2);
  s.bias_correction1 = static_cast<float>(bias_correction ? 1 - pow(beta1, static_cast<double>(t)) : 1.0);
  s.bias_correction2 = static_cast<float>(bias_correction ? 1 - pow(beta2, static_cast<double>(t)) : 1.0);
  s.eps = static_cast<float>(eps);
  s.weight_decay = static_cast<float>(weight_decay);
  s.grad_scale = static_cast<float>(grad_scale);
  s.adam_w_mode = adam_w_mode;
  return s;
}

/// The update direction u of FORMULAS.md from the moments already updated:
///   u = (m / bc1) / (sqrt(v / bc2) + eps)  (+ wd*w in adam_w_mode)
BIGBATCH_HD inline float lamb_direction(float m, float v, float w, const LambStep& s) {
  float u = (m / s.bias_correction1) /                    // mh / (sqrt(vh) + eps)
            (sqrtf(v / s.bias_correction2) + s.eps);
  if (s.adam_w_mode) u = u + s.weight_decay * w;          // decoupled decay
  return u;
}

struct LambElement {
  float m;
  float v;
  float u;
};

/// One element of a LAMB step: the new moments and the update direction.
/// Every pass that needs u calls this (or lamb_direction on stored moments),
/// so the update a norm pass measured is bit for bit the one applied.
BIGBATCH_HD inline LambElement lamb_element(float g, float w, float m, float v, const LambStep& s) {
  g = g * s.grad_scale;                                   // global-norm clipping
  if (!s.adam_w_mode) g = g + s.weight_decay * w;         // L2 decay enters the moments
  m = s.beta1 * m + s.beta3 * g;                          // m = b1*m + b3*g
  v = s.beta2 * v + s.one_minus_beta2 * (g * g);          // v = b2*v + (1-b2)*g^2
  return {m, v, lamb_direction(m, v, w, s)};
}

/// The trust ratio of FORMULAS.md from ||w|| and ||u|| (in double):
/// ||w|| / ||u|| where `use_ratio` (adapt, and wd != 0 or always_adapt), 1 where
/// either norm is 0; clamped to [min_trust, max_trust], and to <= 1 with trust_clip.
BIGBATCH_HD inline double lamb_trust_ratio(double w_norm, double u_norm, bool use_ratio,
                                           double min_trust, double max_trust, bool trust_clip) {
  if (!use_ratio) return 1.0;
  double ratio = (w_norm == 0 || u_norm == 0) ? 1.0 : w_norm / u_norm;
  ratio = ratio < min_trust ? min_trust : (ratio > max_trust ? max_trust : ratio);
  return trust_clip && ratio > 1.0 ? 1.0 : ratio;
}

/// Norm pass: reads w, g, m, v and writes nothing, so a step can still be
/// abandoned (non-finite gradients) after it. m and v may be null (fresh state = 0).
LambNorms lamb_norms_cpu(const void* w, const void* g, const float* m, const float* v,
                         DType dtype, std::int64_t n, const LambStep& step);

/// Update pass: recomputes m, v, u exactly as the norm pass did, stores m and v,
/// and applies w -= lr_ratio * u. Reads w, g, m, v; writes m, v, w.
void lamb_update_cpu(void* w, const void* g, float* m, float* v, DType dtype, std::int64_t n,
                     const LambStep& step, float lr_ratio);

}  // namespace bigbatch::kernels
