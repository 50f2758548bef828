// Fused CPU kernels for LAMB (kernels/lamb.h): a norm pass that writes nothing
// and an update pass; both take their per-element math from lamb_element().
#include <bigbatch/kernels/lamb.h>
#include <bigbatch/kernels/cpu/loops.h>

#include <algorithm>
#include <cmath>

namespace bigbatch::kernels {
namespace {

// Squares are summed in fp32 within blocks of kNormBlock elements (a few
// additions per SIMD lane, all terms positive: ~1e-7 relative) and the blocks
// in double, so the loop runs at the full fp32 SIMD width.
constexpr std::int64_t kNormBlock = 64;

// Sums of w^2, g^2 and u^2 over [b, e); kFresh: the first step, m = v = 0.
// The step arrives by value: nothing here can alias it.
template <bool kFresh, typename T>
std::array<float, 3> norm_block(const T* w, const T* g, const float* m, const float* v,
                                std::int64_t b, std::int64_t e, LambStep s) {
  float sw = 0;
  float sg = 0;
  float su = 0;
#pragma omp simd reduction(+ : sw, sg, su)
  for (std::int64_t i = b; i < e; ++i) {
    const float wi = cpu::load(w, i);
    const float gi = cpu::load(g, i);
    const LambElement el = lamb_element(gi, wi, kFresh ? 0.0f : m[i], kFresh ? 0.0f : v[i], s);
    sw += wi * wi;
    sg += gi * gi;
    su += el.u * el.u;
  }
  return {sw, sg, su};
}

}  // namespace

LambNorms lamb_norms_cpu(const void* w_, const void* g_, const float* m, const float* v,
                         DType dtype, std::int64_t n, const LambStep& step) {
  LambNorms out;
  cpu::dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* w = static_cast<const T*>(w_);
    const T* g = static_cast<const T*>(g_);
    const auto sums = cpu::reduce_chunks<3>(n, [&](std::int64_t begin, std::int64_t end) {
      std::array<double, 3> total{};
      for (std::int64_t b = begin; b < end; b += kNormBlock) {
        const std::int64_t e = std::min(end, b + kNormBlock);
        const auto block = m == nullptr ? norm_block<true>(w, g, m, v, b, e, step)
                                        : norm_block<false>(w, g, m, v, b, e, step);
        for (std::size_t k = 0; k < 3; ++k) total[k] += block[k];
      }
      return total;
    });
    out.w_sq = sums[0];
    out.g_sq = sums[1];
    out.u_sq = sums[2];
  });
  return out;
}

void lamb_update_cpu(void* w_, const void* g_, float* m, float* v, DType dtype, std::int64_t n,
                     const LambStep& step, float lr_ratio) {
  cpu::dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* w = static_cast<T*>(w_);
    const T* g = static_cast<const T*>(g_);
    cpu::parallel_elements(n, [&](std::int64_t begin, std::int64_t end) {
      // Local copies: through the closure's references the compiler cannot prove
      // that the stores to m and v leave these floats alone (no vectorizing).
      const LambStep s = step;
      const float ratio = lr_ratio;
#pragma omp simd
      for (std::int64_t i = begin; i < end; ++i) {
        const float wi = cpu::load(w, i);
        const LambElement e = lamb_element(cpu::load(g, i), wi, m[i], v[i], s);
        m[i] = e.m;
        v[i] = e.v;
        cpu::store(w, i, wi - ratio * e.u);             // w = w - lr*ratio*u
      }
    });
  });
}

}  // namespace bigbatch::kernels
