// Fused CPU kernel: the LARS/LARC momentum update (kernels/momentum.h), one
// pass that reads w, g, v and writes v, w.
#include <bigbatch/kernels/momentum.h>
#include <bigbatch/kernels/cpu/loops.h>

namespace bigbatch::kernels {

void momentum_update_cpu(void* w_, const void* g_, float* v, DType dtype, std::int64_t n,
                         const MomentumStep& step) {
  cpu::dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* w = static_cast<T*>(w_);
    const T* g = static_cast<const T*>(g_);
    cpu::parallel_elements(n, [&](std::int64_t begin, std::int64_t end) {
      // A local copy: through the closure's reference the compiler cannot prove
      // that the stores to v leave the step's floats alone (no vectorizing).
      const MomentumStep s = step;
      const float nesterov = s.nesterov ? 1.0f : 0.0f;
#pragma omp simd
      for (std::int64_t i = begin; i < end; ++i) {
        const float wi = cpu::load(w, i);
        const float d = cpu::load(g, i) + s.weight_decay * wi;  // d = g + wd*w
        const float vi = s.momentum * v[i] + s.scale * d;        // v = mu*v + scale*d
        v[i] = vi;
        // plain: w -= step*v;  nesterov: w -= step*(mu*v + scale*d)
        const float look = nesterov != 0.0f ? s.momentum * vi + s.scale * d : vi;
        cpu::store(w, i, wi - s.step_size * look);
      }
    });
  });
}

}  // namespace bigbatch::kernels
