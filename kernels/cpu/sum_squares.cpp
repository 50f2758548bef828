// Fused CPU kernel: sums of squares of one or two arrays (the norm pass of
// LARS, LARC and NovoGrad, and LAMB's global gradient norm).
#include <bigbatch/kernels/common.h>
#include <bigbatch/kernels/cpu/loops.h>

namespace bigbatch::kernels {

SumSquares sum_squares_cpu(const void* x, const void* y, DType dtype, std::int64_t n) {
  SumSquares out;
  cpu::dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* a = static_cast<const T*>(x);
    const T* b = static_cast<const T*>(y);
    const auto sums = cpu::reduce_chunks<2>(n, [&](std::int64_t begin, std::int64_t end) {
      double sa = 0;
      double sb = 0;
      if (b == nullptr) {
#pragma omp simd reduction(+ : sa)
        for (std::int64_t i = begin; i < end; ++i) {
          const double xa = cpu::load(a, i);
          sa += xa * xa;
        }
      } else {
#pragma omp simd reduction(+ : sa, sb)
        for (std::int64_t i = begin; i < end; ++i) {
          const double xa = cpu::load(a, i);
          const double xb = cpu::load(b, i);
          sa += xa * xa;
          sb += xb * xb;
        }
      }
      return std::array<double, 2>{sa, sb};
    });
    out.x = sums[0];
    out.y = sums[1];
  });
  return out;
}

}  // namespace bigbatch::kernels
