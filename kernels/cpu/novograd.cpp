// Fused CPU kernel: NovoGrad's element pass (kernels/novograd.h), reading
// w, g, m and writing m, w.
#include <bigbatch/kernels/novograd.h>
#include <bigbatch/kernels/cpu/loops.h>

namespace bigbatch::kernels {

void novograd_update_cpu(void* w_, const void* g_, float* m, DType dtype, std::int64_t n,
                         const NovoGradStep& step) {
  cpu::dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* w = static_cast<T*>(w_);
    const T* g = static_cast<const T*>(g_);
    cpu::parallel_elements(n, [&](std::int64_t begin, std::int64_t end) {
      // A local copy: through the closure's reference the compiler cannot prove
      // that the stores to m leave the step's floats alone (no vectorizing).
      const NovoGradStep s = step;
#pragma omp simd
      for (std::int64_t i = begin; i < end; ++i) {
        const NovoGradElement e = novograd_element(cpu::load(g, i), cpu::load(w, i), m[i], s);
        m[i] = e.m;
        cpu::store(w, i, e.w);
      }
    });
  });
}

}  // namespace bigbatch::kernels
