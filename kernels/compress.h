// The pack and unpack loops of gradient compression (distributed/compression.h):
// the per-element math of each code, written once for the CPU loops
// (compress.cpp) and the CUDA kernels (compress.cu), on raw pointers.
//
// Codes (docs/formulas.md, "Gradient compression"):
// - sign: 1 bit per element, set where x >= 0, 32 to a word (element i in
//   bit i % 32 of word i / 32); decoded as +scale or -scale. Packing also
//   leaves the error x - scale * sign(x) in x (error feedback).
// - ternary (TernGrad): 2 bits per element, 16 to a word; 1 is +scale, 2 is
//   -scale, 0 is 0. Element i is nonzero with probability |x_i| / scale.
// - qsgd: one signed byte per element, the level l in [-s, s]; decoded as
//   l * norm / s, with the norm of the element's chunk (QSGD's buckets of d
//   elements). |x_i| / norm * s is rounded down or up at random, up with
//   probability its fractional part.
// - sparse: values gathered at int32 indices (and cleared there: what was
//   sent leaves the error memory), scattered back with a scale.
//
// The random draws come from a counter-based generator: draw i of a stream
// is a hash of (seed, i), so the CPU and the device give the same code for
// the same seed, whatever the threads or the launch shape.
#pragma once

#include "common.h"

#include <math.h>

#include <cstdint>

namespace bigbatch::kernels::compress {

/// SplitMix64's finalizer: a bijection on 64 bits that mixes every input bit
/// into every output bit.
BIGBATCH_HD inline std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// Draw i of stream `seed`: uniform on [0, 1) with 24 random bits (exact in fp32).
BIGBATCH_HD inline float uniform(std::uint64_t seed, std::int64_t i) {
  const std::uint64_t h = mix64(seed ^ mix64(static_cast<std::uint64_t>(i) + 0x9E3779B97F4A7C15ull));
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

/// Elements per packed word.
constexpr std::int64_t kSignPerWord = 32;
constexpr std::int64_t kTernaryPerWord = 16;

/// Words holding n elements of a code with `per_word` elements each.
BIGBATCH_HD inline std::int64_t words_for(std::int64_t n, std::int64_t per_word) {
  return (n + per_word - 1) / per_word;
}

/// Word w of the sign code of x[0, n); with feedback, x becomes x - scale * sign(x).
/// (A full word is a loop of fixed length that masks and selects rather than
/// shifts by a variable, so that the CPU loop vectorizes.)
BIGBATCH_HD inline std::uint32_t sign_word(float* x, std::int64_t n, std::int64_t w, float scale, bool feedback) {
  std::uint32_t word = 0;
  float* p = x + w * kSignPerWord;
  const std::int64_t left = n - w * kSignPerWord;
  if (left >= kSignPerWord) {
    for (int j = 0; j < 32; ++j) word |= p[j] >= 0.0f ? (1u << j) : 0u;
    if (feedback) {
      for (int j = 0; j < 32; ++j) p[j] -= p[j] >= 0.0f ? scale : -scale;
    }
    return word;
  }
  for (int j = 0; j < static_cast<int>(left); ++j) {
    const bool positive = p[j] >= 0.0f;
    word |= positive ? (1u << j) : 0u;
    if (feedback) p[j] -= positive ? scale : -scale;
  }
  return word;
}

/// Element i of a sign code.
BIGBATCH_HD inline float sign_value(const std::uint32_t* words, std::int64_t i, float scale) {
  return (words[i / kSignPerWord] & (1u << (i % kSignPerWord))) != 0u ? scale : -scale;
}

/// out[32w + j] += scale * sign_j for the elements of word w.
BIGBATCH_HD inline void sign_unpack_word(const std::uint32_t* words, std::int64_t n, std::int64_t w, float scale,
                                         float* out) {
  const std::uint32_t word = words[w];
  float* p = out + w * kSignPerWord;
  const std::int64_t left = n - w * kSignPerWord;
  if (left >= kSignPerWord) {
    for (int j = 0; j < 32; ++j) p[j] += (word & (1u << j)) != 0u ? scale : -scale;
    return;
  }
  for (int j = 0; j < static_cast<int>(left); ++j) p[j] += (word & (1u << j)) != 0u ? scale : -scale;
}

/// Word w of the ternary code of x[0, n) at `scale` (>= every |x_i|; 0: all zero).
BIGBATCH_HD inline std::uint32_t ternary_word(const float* x, std::int64_t n, std::int64_t w, float scale,
                                              std::uint64_t seed) {
  std::uint32_t word = 0;
  if (!(scale > 0.0f)) return word;
  const float inv = 1.0f / scale;
  const std::int64_t begin = w * kTernaryPerWord;
  const std::int64_t end = begin + kTernaryPerWord < n ? begin + kTernaryPerWord : n;
  for (std::int64_t i = begin; i < end; ++i) {
    const float p = fabsf(x[i]) * inv;
    if (uniform(seed, i) < p) word |= (x[i] >= 0.0f ? 1u : 2u) << (2 * (i - begin));
  }
  return word;
}

/// Element i of a ternary code.
BIGBATCH_HD inline float ternary_value(const std::uint32_t* words, std::int64_t i, float scale) {
  const std::uint32_t code = (words[i / kTernaryPerWord] >> (2 * (i % kTernaryPerWord))) & 3u;
  return code == 1u ? scale : code == 2u ? -scale : 0.0f;
}

/// The qsgd level of x_i for `levels` levels over `norm` (> 0; 0: level 0).
BIGBATCH_HD inline std::int8_t qsgd_level(float x, std::int64_t i, float norm, int levels, std::uint64_t seed) {
  if (!(norm > 0.0f)) return 0;
  const float a = fabsf(x) / norm * static_cast<float>(levels);
  float l = floorf(a);
  if (uniform(seed, i) < a - l) l += 1.0f;
  if (l > static_cast<float>(levels)) l = static_cast<float>(levels);
  const int level = static_cast<int>(l);
  return static_cast<std::int8_t>(x < 0.0f ? -level : level);
}

}  // namespace bigbatch::kernels::compress

namespace bigbatch::kernels::compress::cpu {

// The CPU loops (compress.cpp), over OpenMP threads. n elements; `words`
// holds words_for(n, per word) words.

/// words <- sign code of x; with feedback, x <- x - scale * sign(x).
void sign_pack(float* x, std::int64_t n, float scale, bool feedback, std::uint32_t* words);
/// out[i] += scale * sign_i.
void sign_unpack_add(const std::uint32_t* words, std::int64_t n, float scale, float* out);
/// words <- ternary code of x at scale.
void ternary_pack(const float* x, std::int64_t n, float scale, std::uint64_t seed, std::uint32_t* words);
/// out[i] += ternary_i * scale.
void ternary_unpack_add(const std::uint32_t* words, std::int64_t n, float scale, float* out);
/// levels_out <- qsgd levels of x, element i over norms[i / chunk].
void qsgd_pack(const float* x, std::int64_t n, const float* norms, std::int64_t chunk, int levels,
               std::uint64_t seed, std::int8_t* levels_out);
/// out[i] += level_i * (norms[i / chunk] * scale) (scale = 1 / levels, over the ranks).
void qsgd_unpack_add(const std::int8_t* levels, std::int64_t n, const float* norms, std::int64_t chunk, float scale,
                     float* out);
/// values[j] <- x[index[j]]; with clear, x[index[j]] <- 0. Indices distinct.
void sparse_pack(float* x, const std::int32_t* index, std::int64_t k, bool clear, float* values);
/// out[index[j]] += scale * values[j]. Indices distinct.
void sparse_unpack_add(const std::int32_t* index, const float* values, std::int64_t k, float scale, float* out);

}  // namespace bigbatch::kernels::compress::cpu
