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
#pragma omp simd
      for (std::int64_t i = begin; i < end; ++i) {
        const MomentumElement e = momentum_element(cpu::load(g, i), cpu::load(w, i), v[i], s);
        v[i] = e.v;
        cpu::store(w, i, e.w);
      }
    });
  });
}

}  // namespace bigbatch::kernels
