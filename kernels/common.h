// Types shared by the fused optimizer kernels (CPU now, CUDA later): kernels
// see raw pointers, an element count and a dtype tag, never a LibTorch tensor.
#pragma once

#include <cstdint>

// The per-element math in kernels/*.h is shared by the CPU loops and the CUDA
// kernels: one definition, compiled for both.
#if defined(__CUDACC__)
#define BIGBATCH_HD __host__ __device__
#else
#define BIGBATCH_HD
#endif

namespace bigbatch::kernels {

/// Storage type of parameters and gradients. State and arithmetic are fp32.
enum class DType : std::uint8_t { kFloat32, kBFloat16, kFloat16 };

/// Sums of squares of up to two arrays, accumulated in double.
/// Double accumulation makes "the sum is finite" equivalent to "every
/// element is finite": (3.4e38)^2 * 2^40 elements still fits in a double.
struct SumSquares {
  double x = 0;
  double y = 0;
};

/// Sum of x[i]^2 and, if y is not null, of y[i]^2 over n elements.
/// Deterministic: the same bits whatever the number of threads.
SumSquares sum_squares_cpu(const void* x, const void* y, DType dtype, std::int64_t n);

}  // namespace bigbatch::kernels
