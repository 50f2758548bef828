// Fused CPU kernels for LAMB (kernels/lamb.h): a norm pass that writes nothing
// and an update pass; both take their per-element math from lamb_element().
#include <bigbatch/kernels/lamb.h>
#include <bigbatch/kernels/cpu/loops.h>

#include <cmath>

namespace bigbatch::kernels {
namespace {

struct LambElement {
  float m;
  float v;
  float u;
};

// The per-element math of FORMULAS.md, shared by both passes so that the
// update the norm pass measured is bit for bit the update that is applied.
inline LambElement lamb_element(float g, float w, float m, float v, const LambStep& s) {
  g = g * s.grad_scale;                                   // global-norm clipping
  if (!s.adam_w_mode) g = g + s.weight_decay * w;         // L2 decay enters the moments
  m = s.beta1 * m + s.beta3 * g;                          // m = b1*m + b3*g
  v = s.beta2 * v + s.one_minus_beta2 * (g * g);          // v = b2*v + (1-b2)*g^2
  float u = (m / s.bias_correction1) /                    // mh / (sqrt(vh) + eps)
            (std::sqrt(v / s.bias_correction2) + s.eps);
  if (s.adam_w_mode) u = u + s.weight_decay * w;          // decoupled decay
  return {m, v, u};
}

}  // namespace

LambNorms lamb_norms_cpu(const void* w_, const void* g_, const float* m, const float* v,
                         DType dtype, std::int64_t n, const LambStep& s) {
  LambNorms out;
  cpu::dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* w = static_cast<const T*>(w_);
    const T* g = static_cast<const T*>(g_);
    const auto sums = cpu::reduce_chunks<3>(n, [&](std::int64_t begin, std::int64_t end) {
      double sw = 0;
      double sg = 0;
      double su = 0;
      const bool fresh = m == nullptr;
#pragma omp simd reduction(+ : sw, sg, su)
      for (std::int64_t i = begin; i < end; ++i) {
        const float wi = cpu::load(w, i);
        const float gi = cpu::load(g, i);
        const LambElement e =
            lamb_element(gi, wi, fresh ? 0.0f : m[i], fresh ? 0.0f : v[i], s);
        sw += static_cast<double>(wi) * wi;
        sg += static_cast<double>(gi) * gi;
        su += static_cast<double>(e.u) * e.u;
      }
      return std::array<double, 3>{sw, sg, su};
    });
    out.w_sq = sums[0];
    out.g_sq = sums[1];
    out.u_sq = sums[2];
  });
  return out;
}

void lamb_update_cpu(void* w_, const void* g_, float* m, float* v, DType dtype, std::int64_t n,
                     const LambStep& s, float lr_ratio) {
  cpu::dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* w = static_cast<T*>(w_);
    const T* g = static_cast<const T*>(g_);
    cpu::parallel_elements(n, [&](std::int64_t begin, std::int64_t end) {
#pragma omp simd
      for (std::int64_t i = begin; i < end; ++i) {
        const float wi = cpu::load(w, i);
        const LambElement e = lamb_element(cpu::load(g, i), wi, m[i], v[i], s);
        m[i] = e.m;
        v[i] = e.v;
        cpu::store(w, i, wi - lr_ratio * e.u);             // w = w - lr*ratio*u
      }
    });
  });
}

}  // namespace bigbatch::kernels
