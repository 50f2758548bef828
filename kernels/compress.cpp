// The CPU loops of gradient compression (compress.h): one word or element per
// iteration, spread over OpenMP threads; each iteration writes its own output,
// so the result does not depend on the threads.
#include "compress.h"

namespace bigbatch::kernels::compress::cpu {

namespace {
// Below this many iterations a loop runs on the calling thread.
constexpr std::int64_t kParallelFrom = 1 << 14;
}  // namespace

// The sign loops gather and scatter bits lane by lane, which x86-64's
// baseline (SSE2) cannot vectorize and AVX2 can: on x86-64 they are compiled
// for both and the loader picks (GCC's target_clones), 5x faster with AVX2.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define BIGBATCH_AVX2_CLONE __attribute__((target_clones("avx2", "default")))
#else
#define BIGBATCH_AVX2_CLONE
#endif

BIGBATCH_AVX2_CLONE void sign_pack(float* x, std::int64_t n, float scale, bool feedback, std::uint32_t* words) {
  const std::int64_t w = words_for(n, kSignPerWord);
#pragma omp parallel for schedule(static) if (w >= kParallelFrom / kSignPerWord)
  for (std::int64_t i = 0; i < w; ++i) words[i] = sign_word(x, n, i, scale, feedback);
}

BIGBATCH_AVX2_CLONE void sign_unpack_add(const std::uint32_t* words, std::int64_t n, float scale, float* out) {
  const std::int64_t w = words_for(n, kSignPerWord);
#pragma omp parallel for schedule(static) if (w >= kParallelFrom / kSignPerWord)
  for (std::int64_t i = 0; i < w; ++i) sign_unpack_word(words, n, i, scale, out);
}

void ternary_pack(const float* x, std::int64_t n, float scale, std::uint64_t seed, std::uint32_t* words) {
  const std::int64_t w = words_for(n, kTernaryPerWord);
#pragma omp parallel for schedule(static) if (w >= kParallelFrom / kTernaryPerWord)
  for (std::int64_t i = 0; i < w; ++i) words[i] = ternary_word(x, n, i, scale, seed);
}

void ternary_unpack_add(const std::uint32_t* words, std::int64_t n, float scale, float* out) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelFrom)
  for (std::int64_t i = 0; i < n; ++i) out[i] += ternary_value(words, i, scale);
}

void qsgd_pack(const float* x, std::int64_t n, const float* norms, std::int64_t chunk, int levels,
               std::uint64_t seed, std::int8_t* levels_out) {
#pragma omp parallel for schedule(static) if (n >= kParallelFrom)
  for (std::int64_t i = 0; i < n; ++i) levels_out[i] = qsgd_level(x[i], i, norms[i / chunk], levels, seed);
}

void qsgd_unpack_add(const std::int8_t* levels, std::int64_t n, const float* norms, std::int64_t chunk, float scale,
                     float* out) {
#pragma omp parallel for schedule(static) if (n >= kParallelFrom)
  for (std::int64_t i = 0; i < n; ++i) out[i] += static_cast<float>(levels[i]) * (norms[i / chunk] * scale);
}

void sparse_pack(float* x, const std::int32_t* index, std::int64_t k, bool clear, float* values) {
#pragma omp parallel for schedule(static) if (k >= kParallelFrom)
  for (std::int64_t j = 0; j < k; ++j) {
    values[j] = x[index[j]];
    if (clear) x[index[j]] = 0.0f;
  }
}

void sparse_unpack_add(const std::int32_t* index, const float* values, std::int64_t k, float scale, float* out) {
#pragma omp parallel for schedule(static) if (k >= kParallelFrom)
  for (std::int64_t j = 0; j < k; ++j) out[index[j]] += scale * values[j];
}

}  // namespace bigbatch::kernels::compress::cpu
