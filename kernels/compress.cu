// The CUDA kernels of gradient compression (cuda/compress.cuh): one thread
// per packed word or element, in a grid-stride loop; the per-element math is
// compress.h's, shared with the CPU loops.
#include "cuda/compress.cuh"

namespace bigbatch::kernels::compress::cuda {

using kernels::cuda::kThreads;
using kernels::cuda::launch_kernel;

namespace {

// Blocks for `count` iterations: enough to fill a GPU, at most 65535 x 256 threads.
dim3 grid_for(std::int64_t count) {
  const std::int64_t blocks = (count + kThreads - 1) / kThreads;
  return dim3(static_cast<unsigned>(blocks < 1 ? 1 : blocks > 65535 ? 65535 : blocks));
}

__device__ inline std::int64_t first_index() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline std::int64_t grid_stride() { return static_cast<std::int64_t>(gridDim.x) * blockDim.x; }

__global__ void sign_pack_kernel(float* x, std::int64_t n, float scale, bool feedback, std::uint32_t* words) {
  const std::int64_t w = words_for(n, kSignPerWord);
  for (std::int64_t i = first_index(); i < w; i += grid_stride()) words[i] = sign_word(x, n, i, scale, feedback);
}

__global__ void sign_unpack_kernel(const std::uint32_t* words, std::int64_t n, float scale, float* out) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) out[i] += sign_value(words, i, scale);
}

__global__ void ternary_pack_kernel(const float* x, std::int64_t n, float scale, std::uint64_t seed,
                                    std::uint32_t* words) {
  const std::int64_t w = words_for(n, kTernaryPerWord);
  for (std::int64_t i = first_index(); i < w; i += grid_stride()) words[i] = ternary_word(x, n, i, scale, seed);
}

__global__ void ternary_unpack_kernel(const std::uint32_t* words, std::int64_t n, float scale, float* out) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) out[i] += ternary_value(words, i, scale);
}

__global__ void qsgd_pack_kernel(const float* x, std::int64_t n, const float* norms, std::int64_t chunk, int levels,
                                 std::uint64_t seed, std::int8_t* levels_out) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    levels_out[i] = qsgd_level(x[i], i, norms[i / chunk], levels, seed);
  }
}

__global__ void qsgd_unpack_kernel(const std::int8_t* levels, std::int64_t n, const float* norms, std::int64_t chunk,
                                   float scale, float* out) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    out[i] += static_cast<float>(levels[i]) * (norms[i / chunk] * scale);
  }
}

__global__ void sparse_pack_kernel(float* x, const std::int32_t* index, std::int64_t k, bool clear, float* values) {
  for (std::int64_t j = first_index(); j < k; j += grid_stride()) {
    values[j] = x[index[j]];
    if (clear) x[index[j]] = 0.0f;
  }
}

__global__ void sparse_unpack_kernel(const std::int32_t* index, const float* values, std::int64_t k, float scale,
                                     float* out) {
  for (std::int64_t j = first_index(); j < k; j += grid_stride()) out[index[j]] += scale * values[j];
}

// Launches and checks the launch.
template <typename... Params, typename... Args>
void run(void (*kernel)(Params...), std::int64_t count, cudaStream_t stream, const Args&... args) {
  if (count <= 0) return;
  launch_kernel(kernel, grid_for(count), dim3(kThreads), stream, args...);
  BIGBATCH_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void sign_pack(float* x, std::int64_t n, float scale, bool feedback, std::uint32_t* words, cudaStream_t stream) {
  run(sign_pack_kernel, words_for(n, kSignPerWord), stream, x, n, scale, feedback, words);
}
void sign_unpack_add(const std::uint32_t* words, std::int64_t n, float scale, float* out, cudaStream_t stream) {
  run(sign_unpack_kernel, n, stream, words, n, scale, out);
}
void ternary_pack(const float* x, std::int64_t n, float scale, std::uint64_t seed, std::uint32_t* words,
                  cudaStream_t stream) {
  run(ternary_pack_kernel, words_for(n, kTernaryPerWord), stream, x, n, scale, seed, words);
}
void ternary_unpack_add(const std::uint32_t* words, std::int64_t n, float scale, float* out, cudaStream_t stream) {
  run(ternary_unpack_kernel, n, stream, words, n, scale, out);
}
void qsgd_pack(const float* x, std::int64_t n, const float* norms, std::int64_t chunk, int levels,
               std::uint64_t seed, std::int8_t* levels_out, cudaStream_t stream) {
  run(qsgd_pack_kernel, n, stream, x, n, norms, chunk, levels, seed, levels_out);
}
void qsgd_unpack_add(const std::int8_t* levels, std::int64_t n, const float* norms, std::int64_t chunk, float scale,
                     float* out, cudaStream_t stream) {
  run(qsgd_unpack_kernel, n, stream, levels, n, norms, chunk, scale, out);
}
void sparse_pack(float* x, const std::int32_t* index, std::int64_t k, bool clear, float* values, cudaStream_t stream) {
  run(sparse_pack_kernel, k, stream, x, index, k, clear, values);
}
void sparse_unpack_add(const std::int32_t* index, const float* values, std::int64_t k, float scale, float* out,
                       cudaStream_t stream) {
  run(sparse_unpack_kernel, k, stream, index, values, k, scale, out);
}

}  // namespace bigbatch::kernels::compress::cuda
