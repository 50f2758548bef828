// The momentum update shared by LARS and LARC (FORMULAS.md). Both are
//   d = g + wd*w;  v = momentum*v + scale*d;  w = w - step_size*(nesterov ? momentum*v + scale*d : v)
// LARS: scale = lr*ratio, step_size = 1 (the rate sits inside the buffer).
// LARC: scale = min(local/lr, 1) or local, step_size = lr (PyTorch's SGD form).
#pragma once

#include <bigbatch/kernels/common.h>

namespace bigbatch::kernels {

struct MomentumStep {
  float scale = 1;         ///< multiplies d before it enters the buffer
  float step_size = 1;     ///< multiplies the buffer when it leaves it
  float momentum = 0.9f;
  float weight_decay = 0;
  bool nesterov = false;
};

struct MomentumElement {
  float v;
  float w;
};

/// One element of the momentum update.
BIGBATCH_HD inline MomentumElement momentum_element(float g, float w, float v, const MomentumStep& s) {
  const float d = g + s.weight_decay * w;                 // d = g + wd*w
  v = s.momentum * v + s.scale * d;                       // v = mu*v + scale*d
  // plain: w -= step*v;  nesterov: w -= step*(mu*v + scale*d)
  const float look = s.nesterov ? s.momentum * v + s.scale * d : v;
  return {v, w - s.step_size * look};
}

/// LARS's trust ratio (double): tc*||w|| / (||g|| + wd*||w|| + eps) where
/// `adapt`, 1 where ||w|| or ||g|| is 0 (FORMULAS.md). LARS scales by lr*ratio.
BIGBATCH_HD inline double lars_trust_ratio(double w_norm, double g_norm, bool adapt, double tc,
                                           double wd, double eps) {
  if (!adapt || w_norm == 0 || g_norm == 0) return 1.0;
  return tc * w_norm / (g_norm + wd * w_norm + eps);
}

/// LARC's scale (double): the local rate tc*||w|| / (||g|| + wd*||w|| + eps),
/// with clip min(local / lr, 1); 1 where `adapt` is false or a norm is 0.
BIGBATCH_HD inline double larc_scale(double w_norm, double g_norm, bool adapt, bool clip,
                                     double lr, double tc, double wd, double eps) {
  if (!adapt || w_norm == 0 || g_norm == 0) return 1.0;
  const double local = tc * w_norm / (g_norm + wd * w_norm + eps);
  if (!clip) return local;
  return 1.0 < local / lr ? 1.0 : local / lr;  // std::min(local / lr, 1)
}

/// One update pass over a tensor: reads w, g, v; writes v, w (28 bytes/param in fp32).
void momentum_update_cpu(void* w, const void* g, float* v, DType dtype, std::int64_t n,
                         const MomentumStep& step);

}  // namespace bigbatch::kernels
