// fp32 tensors and their state in host memory, as slots of the multi-tensor
// step (kernels/engine.h): the CPU runner's tests, and the CUDA runner's on
// the SIMT executor, whose device memory is host memory.
#pragma once

#include "../../kernels/engine.h"
#include "../../kernels/lamb.h"
#include "../../kernels/momentum.h"
#include "../../kernels/novograd.h"

#include <math.h>

#include <cstdint>
#include <vector>

namespace bigbatch::test {

struct HostTensors {
  std::vector<std::vector<float>> w, g, m, v;

  /// Weights w0 and gradients g0 everywhere, zero state.
  HostTensors(const std::vector<std::int64_t>& sizes, float w0, float g0) {
    for (const std::int64_t n : sizes) {
      w.emplace_back(n, w0);
      g.emplace_back(n, g0);
      m.emplace_back(n, 0.0f);
      v.emplace_back(n, 0.0f);
    }
  }

  /// One slot per tensor, group 0, fp32, step 0.
  std::vector<kernels::TensorSlot> slots() {
    std::vector<kernels::TensorSlot> out;
    for (std::size_t k = 0; k < w.size(); ++k) {
      kernels::TensorSlot s;
      s.param = w[k].data();
      s.grad = g[k].data();
      s.m = m[k].data();
      s.v = v[k].data();
      s.numel = static_cast<std::int64_t>(w[k].size());
      out.push_back(s);
    }
    return out;
  }
};

/// LAMB's options for the engine's tests: lr 0.01, AdamW-style decay 0.01,
/// bias correction, adaptation, unbounded trust; the non-finite skip and
/// global clipping (max_grad_norm > 0) as asked.
inline kernels::LambGroup lamb_group(bool skip, double max_grad_norm) {
  kernels::LambGroup o;
  o.lr = 0.01;
  o.beta1 = 0.9;
  o.beta2 = 0.999;
  o.eps = 1e-6;
  o.weight_decay = 0.01;
  o.max_grad_norm = max_grad_norm;
  o.max_trust = INFINITY;
  o.bias_correction = o.grad_averaging = o.adam_w_mode = o.adapt = true;
  o.skip_nonfinite = skip;
  return o;
}

}  // namespace bigbatch::test
