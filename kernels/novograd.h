// NovoGrad (Ginsburg et al. 2019, arXiv:1905.11286), as FORMULAS.md. The
// per-tensor second moment v is a scalar the host updates from ||g||^2; the
// element pass is
//   d = (g / denom + wd*w) * grad_factor;  m = b1*m + d;  w = w - lr*m
// with denom = sqrt(v) + eps and grad_factor = grad_averaging ? 1 - b1 : 1.
#pragma once

#include <bigbatch/kernels/common.h>

namespace bigbatch::kernels {

struct NovoGradStep {
  float beta1 = 0.95f;
  float denom = 1;
  float weight_decay = 0;
  float grad_factor = 1;
  float lr = 1e-3f;
};

struct NovoGradElement {
  float m;
  float w;
};

/// One element of NovoGrad's step.
BIGBATCH_HD inline NovoGradElement novograd_element(float g, float w, float m, const NovoGradStep& s) {
  const float d = (g / s.denom + s.weight_decay * w) * s.grad_factor;  // d = (g/denom + wd*w)*f
  m = s.beta1 * m + d;                                                // m = b1*m + d
  return {m, w - s.lr * m};                                           // w = w - lr*m
}

/// One update pass: reads w, g, m; writes m, w (20 bytes/param in fp32).
void novograd_update_cpu(void* w, const void* g, float* m, DType dtype, std::int64_t n,
                         const NovoGradStep& step);

}  // namespace bigbatch::kernels
