// The CUDA kernels of gradient compression (kernels/compress.h's codes), one
// launch each on `stream`, over device pointers; the same arguments and the
// same results, bit for bit, as the CPU loops in compress::cpu. Compiled by
// nvcc into bigbatch_kernels_cuda and by g++ against the SIMT executor.
#pragma once

#include "multi_tensor.cuh"
#include "../compress.h"

namespace bigbatch::kernels::compress::cuda {

void sign_pack(float* x, std::int64_t n, float scale, bool feedback, std::uint32_t* words, cudaStream_t stream);
void sign_unpack_add(const std::uint32_t* words, std::int64_t n, float scale, float* out, cudaStream_t stream);
void ternary_pack(const float* x, std::int64_t n, float scale, std::uint64_t seed, std::uint32_t* words,
                  cudaStream_t stream);
void ternary_unpack_add(const std::uint32_t* words, std::int64_t n, float scale, float* out, cudaStream_t stream);
void qsgd_pack(const float* x, std::int64_t n, const float* norms, std::int64_t chunk, int levels,
               std::uint64_t seed, std::int8_t* levels_out, cudaStream_t stream);
void qsgd_unpack_add(const std::int8_t* levels, std::int64_t n, const float* norms, std::int64_t chunk, float scale,
                     float* out, cudaStream_t stream);
void sparse_pack(float* x, const std::int32_t* index, std::int64_t k, bool clear, float* values, cudaStream_t stream);
void sparse_unpack_add(const std::int32_t* index, const float* values, std::int64_t k, float scale, float* out,
                       cudaStream_t stream);

}  // namespace bigbatch::kernels::compress::cuda
