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

/// One update pass over a tensor: reads w, g, v; writes v, w (28 bytes/param in fp32).
void momentum_update_cpu(void* w, const void* g, float* v, DType dtype, std::int64_t n,
                         const MomentumStep& step);

}  // namespace bigbatch::kernels
