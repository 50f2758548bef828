// The CUDA kernels of gradient compression (kernels/compress.cu) on the SIMT
// executor against the CPU loops (kernels/compress.cpp): the same codes and
// the same decoded values, bit for bit, for a length that fills no word, block
// or launch evenly.
#include "../../kernels/cuda/compress.cuh"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

namespace {

namespace kc = bigbatch::kernels::compress;
constexpr std::int64_t kN = 10007;

std::vector<float> random_floats(std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  std::vector<float> x(kN);
  for (auto& v : x) v = normal(gen);
  x[5] = 0.0f;  // sign(0) is +
  return x;
}

TEST(SimtCompress, SignPackAndUnpackMatchTheCpuLoops) {
  std::vector<float> host = random_floats(1), device = host;
  std::vector<std::uint32_t> host_words(kc::words_for(kN, kc::kSignPerWord)), device_words(host_words.size());
  kc::cpu::sign_pack(host.data(), kN, 0.8f, true, host_words.data());
  kc::cuda::sign_pack(device.data(), kN, 0.8f, true, device_words.data(), nullptr);
  EXPECT_EQ(host_words, device_words);
  EXPECT_EQ(host, device) << "the error left behind";
  std::vector<float> host_out(kN, 1.0f), device_out(kN, 1.0f);
  kc::cpu::sign_unpack_add(host_words.data(), kN, 0.25f, host_out.data());
  kc::cuda::sign_unpack_add(device_words.data(), kN, 0.25f, device_out.data(), nullptr);
  EXPECT_EQ(host_out, device_out);
  EXPECT_EQ(host_out[5], 1.25f);
}

TEST(SimtCompress, TernaryAndQsgdDrawTheSameCodes) {
  const std::vector<float> x = random_floats(2);
  std::vector<std::uint32_t> host_words(kc::words_for(kN, kc::kTernaryPerWord)), device_words(host_words.size());
  kc::cpu::ternary_pack(x.data(), kN, 4.0f, 17, host_words.data());
  kc::cuda::ternary_pack(x.data(), kN, 4.0f, 17, device_words.data(), nullptr);
  EXPECT_EQ(host_words, device_words);
  std::vector<float> host_out(kN, 0.0f), device_out(kN, 0.0f);
  kc::cpu::ternary_unpack_add(host_words.data(), kN, 2.0f, host_out.data());
  kc::cuda::ternary_unpack_add(device_words.data(), kN, 2.0f, device_out.data(), nullptr);
  EXPECT_EQ(host_out, device_out);

  // Chunks of 512 with norms 20, 21, ...: the last chunk is short.
  std::vector<float> norms((kN + 511) / 512);
  for (std::size_t c = 0; c < norms.size(); ++c) norms[c] = 20.0f + static_cast<float>(c);
  std::vector<std::int8_t> host_levels(kN), device_levels(kN);
  kc::cpu::qsgd_pack(x.data(), kN, norms.data(), 512, 127, 23, host_levels.data());
  kc::cuda::qsgd_pack(x.data(), kN, norms.data(), 512, 127, 23, device_levels.data(), nullptr);
  EXPECT_EQ(host_levels, device_levels);
  kc::cpu::qsgd_unpack_add(host_levels.data(), kN, norms.data(), 512, 0.5f, host_out.data());
  kc::cuda::qsgd_unpack_add(device_levels.data(), kN, norms.data(), 512, 0.5f, device_out.data(), nullptr);
  EXPECT_EQ(host_out, device_out);
}

TEST(SimtCompress, SparsePackClearsAndUnpackScatters) {
  std::vector<float> host = random_floats(3), device = host;
  std::vector<std::int32_t> index;
  for (std::int32_t i = kN - 1; i >= 0; i -= 7) index.push_back(i);  // distinct, descending
  const auto k = static_cast<std::int64_t>(index.size());
  std::vector<float> host_values(k), device_values(k);
  kc::cpu::sparse_pack(host.data(), index.data(), k, true, host_values.data());
  kc::cuda::sparse_pack(device.data(), index.data(), k, true, device_values.data(), nullptr);
  EXPECT_EQ(host_values, device_values);
  EXPECT_EQ(host, device);
  EXPECT_EQ(host[kN - 1], 0.0f);
  std::vector<float> host_out(kN, 0.5f), device_out(kN, 0.5f);
  kc::cpu::sparse_unpack_add(index.data(), host_values.data(), k, 0.5f, host_out.data());
  kc::cuda::sparse_unpack_add(index.data(), device_values.data(), k, 0.5f, device_out.data(), nullptr);
  EXPECT_EQ(host_out, device_out);
}

}  // namespace
