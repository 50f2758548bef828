// Plumbing shared by the CPU kernels: dtype dispatch, chunked parallel loops and
// the deterministic reduction. Kernel files contain only their math.
#pragma once

#include <bigbatch/kernels/common.h>

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

namespace bigbatch::kernels::cpu {

/// Elements per chunk: the unit of parallel work and of the reduction order.
constexpr std::int64_t kChunk = 1 << 14;

/// Calls f(T{}) with T the storage type of dtype.
template <typename F>
void dispatch(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32: f(float{}); return;
    case DType::kBFloat16: f(c10::BFloat16{}); return;
    case DType::kFloat16: f(c10::Half{}); return;
  }
  TORCH_INTERNAL_ASSERT(false, "unknown kernels::DType ", static_cast<int>(dtype));
}

template <typename T>
inline float load(const T* p, std::int64_t i) { return static_cast<float>(p[i]); }
template <typename T>
inline void store(T* p, std::int64_t i, float x) { p[i] = static_cast<T>(x); }

/// Runs body(begin, end) over [0, n) in parallel, in pieces of whole chunks.
template <typename F>
void parallel_elements(std::int64_t n, const F& body) {
  if (n <= kChunk) {
    if (n > 0) body(0, n);
    return;
  }
  at::parallel_for(0, n, kChunk, body);
}

/// Sums K doubles that partial(begin, end) returns for each chunk of [0, n),
/// adding the chunks in index order: the same bits for any thread count.
template <std::size_t K, typename F>
std::array<double, K> reduce_chunks(std::int64_t n, const F& partial) {
  std::array<double, K> total{};
  if (n <= 0) return total;
  if (n <= kChunk) return partial(0, n);
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<std::array<double, K>> parts(static_cast<std::size_t>(chunks));
  at::parallel_for(0, chunks, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t c = begin; c < end; ++c) {
      parts[c] = partial(c * kChunk, std::min(n, (c + 1) * kChunk));
    }
  });
  for (const auto& part : parts) {
    for (std::size_t k = 0; k < K; ++k) total[k] += part[k];
  }
  return total;
}

}  // namespace bigbatch::kernels::cpu
