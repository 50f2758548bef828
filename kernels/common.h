// Types shared by the fused optimizer kernels, CPU and CUDA: kernels see raw
// pointers, an element count and a dtype tag, never a LibTorch tensor.
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

}  // namespace bigbatch::kernels
