// The CPU runner of the multi-tensor step (kernels/engine.h), below the
// optimizers: bytes per step against the hand count of docs/cuda.md, one LARS
// step against a float64 re-derivation, finiteness decided in double, the
// same bits for any thread count, and moved gradients and options taken up
// without a rebuild. The optimizer tests cover the four plans end to end.
#include "host_tensors.h"

#include "../../kernels/cpu/isa.h"
#include "../../kernels/engine.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using namespace bigbatch::kernels;

// fp32 tensors in host memory with pseudo-random weights in [-1, 1) and
// gradients in [-0.1, 0.1), zero state.
struct Tensors : bigbatch::test::HostTensors {
  explicit Tensors(const std::vector<std::int64_t>& sizes, std::uint32_t seed = 1) : HostTensors(sizes, 0, 0) {
    std::uint32_t x = seed;
    auto next = [&x] {  // xorshift: values in [-1, 1)
      x ^= x << 13;
      x ^= x >> 17;
      x ^= x << 5;
      return static_cast<float>(x % 2000000) / 1e6f - 1.0f;
    };
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      for (std::int64_t i = 0; i < sizes[k]; ++i) {
        w[k][i] = next();
        g[k][i] = 0.1f * next();
      }
    }
  }
};

LarsGroup lars_group(double lr, double wd) {
  LarsGroup o;
  o.lr = lr;
  o.momentum = 0.9;
  o.weight_decay = wd;
  o.trust_coefficient = 0.02;
  o.eps = 1e-9;
  o.adapt = true;
  o.skip_nonfinite = true;
  return o;
}

using bigbatch::test::lamb_group;

TEST(CpuEngine, BytesPerStepAsDocumented) {
  const auto f32 = DType::kFloat32;
  const auto bf16 = DType::kBFloat16;
  // LAMB: g (4) | w g m v read, m v written (24) | w m v read, w written (16).
  EXPECT_EQ(step_bytes_per_element<LambPlan>({lamb_group(true, 0)}, f32, false), 44);
  EXPECT_EQ(step_bytes_per_element<LambPlan>({lamb_group(false, 1)}, f32, false), 44);
  EXPECT_EQ(step_bytes_per_element<LambPlan>({lamb_group(false, 0)}, f32, false), 40);
  // LARS/LARC: w g (8) | w g v read, v w written (20). NovoGrad: g (4) | w g m, m w (20).
  EXPECT_EQ(step_bytes_per_element<LarsPlan>({lars_group(0.1, 0)}, f32, false), 28);
  EXPECT_EQ(step_bytes_per_element<LarcPlan>({LarcGroup{}}, f32, false), 28);
  EXPECT_EQ(step_bytes_per_element<NovoGradPlan>({NovoGradGroup{}}, f32, false), 24);
  // bf16 LAMB: g (2) | w g (2+2) m v (8) read, m v (8) | w (2) m v (8) read, w (2) written.
  EXPECT_EQ(step_bytes_per_element<LambPlan>({lamb_group(true, 0)}, bf16, false), 2 + 20 + 12);
  // With an fp32 master: the w read is 4 bytes, the w write 4 + 2.
  EXPECT_EQ(step_bytes_per_element<LambPlan>({lamb_group(true, 0)}, bf16, true), 2 + 22 + 18);
  EXPECT_EQ(step_bytes_per_element<LarsPlan>({lars_group(0.1, 0)}, bf16, true), (4 + 2) + (4 + 2 + 4 + 4 + 6));
}

TEST(CpuEngine, OneLarsStepMatchesAFloat64Derivation) {
  const std::vector<std::int64_t> sizes = {40000, 3, 16384};
  Tensors t(sizes);
  const Tensors start = t;
  auto step = make_cpu_step<LarsPlan>();
  const LarsGroup o = lars_group(0.5, 1e-3);
  step->bind(t.slots(), {o}, nullptr);
  step->run(nullptr);
  EXPECT_EQ(step->bytes_per_step(), 28 * (40000 + 3 + 16384));
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    double w2 = 0;
    double g2 = 0;
    for (std::int64_t i = 0; i < sizes[k]; ++i) {
      w2 += static_cast<double>(start.w[k][i]) * start.w[k][i];
      g2 += static_cast<double>(start.g[k][i]) * start.g[k][i];
    }
    // ratio = tc*||w|| / (||g|| + wd*||w|| + eps); v = lr*ratio*(g + wd*w); w -= v.
    const double ratio = o.trust_coefficient * std::sqrt(w2) / (std::sqrt(g2) + o.weight_decay * std::sqrt(w2) + o.eps);
    for (std::int64_t i = 0; i < sizes[k]; i += 97) {
      const double d = start.g[k][i] + o.weight_decay * start.w[k][i];
      const double v = o.lr * ratio * d;
      EXPECT_NEAR(t.m[k][i], v, 1e-6 * std::abs(v) + 1e-12) << "tensor " << k << ", element " << i;
      EXPECT_NEAR(t.w[k][i], start.w[k][i] - v, 1e-6) << "tensor " << k << ", element " << i;
    }
  }
}

TEST(CpuEngine, FiniteExactlyWhenTheGradientIs) {
  Tensors t({50000});
  auto step = make_cpu_step<LarsPlan>();
  std::fill(t.g[0].begin(), t.g[0].end(), 3e38f);  // the squares overflow fp32, not double
  step->bind(t.slots(), {lars_group(0.1, 0)}, nullptr);
  step->run(nullptr);
  EXPECT_EQ(step->skipped_steps(), 0);
  for (const float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    const std::vector<float> before = t.w[0];
    t.g[0][40000] = bad;
    step->bind(t.slots(), {lars_group(0.1, 0)}, nullptr);
    step->run(nullptr);
    EXPECT_EQ(std::memcmp(before.data(), t.w[0].data(), before.size() * sizeof(float)), 0)
        << "a skipped step changed the weights (gradient " << bad << ")";
  }
  EXPECT_EQ(step->skipped_steps(), 2);
}

TEST(CpuEngine, SameBitsForAnyThreadCount) {
  const std::vector<std::int64_t> sizes = {1 << 20, 5, 16385, 70000};
  auto three_steps = [&](int threads) {
    const int before = at::get_num_threads();
    at::set_num_threads(threads);
    Tensors t(sizes);
    auto step = make_cpu_step<LambPlan>();
    for (int s = 0; s < 3; ++s) {
      step->bind(t.slots(), {lamb_group(true, 1.0)}, nullptr);
      step->run(nullptr);
    }
    at::set_num_threads(before);
    return t;
  };
  const Tensors one = three_steps(1);
  const Tensors many = three_steps(std::max(2, at::get_num_threads()));
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    EXPECT_EQ(std::memcmp(one.w[k].data(), many.w[k].data(), sizes[k] * sizeof(float)), 0) << "tensor " << k;
    EXPECT_EQ(std::memcmp(one.v[k].data(), many.v[k].data(), sizes[k] * sizeof(float)), 0) << "tensor " << k;
  }
}

// The element loops' AVX2 and AVX-512 variants (kernels/cpu/isa.h) against
// the baseline loop: three LAMB steps and three LARS steps over tensors of
// several chunks and ragged ends, bit for bit, for each variant this CPU runs.
TEST(CpuEngine, EveryIsaGivesTheBaselinesBits) {
  using bigbatch::kernels::cpu::Isa;
  const std::vector<std::int64_t> sizes = {1 << 18, 5, 16385, 70001};
  const Isa before = cpu::cpu_isa();
  auto three_steps = [&](Isa isa, bool lamb) {
    cpu::set_cpu_isa(isa);
    Tensors t(sizes, 7);
    if (lamb) {
      auto step = make_cpu_step<LambPlan>();
      for (int s = 0; s < 3; ++s) {
        step->bind(t.slots(), {lamb_group(true, 1.0)}, nullptr);
        step->run(nullptr);
      }
    } else {
      auto step = make_cpu_step<LarsPlan>();
      for (int s = 0; s < 3; ++s) {
        step->bind(t.slots(), {lars_group(0.1, 1e-4)}, nullptr);
        step->run(nullptr);
      }
    }
    return t;
  };
  int variants = 0;
  for (const bool lamb : {true, false}) {
    const Tensors base = three_steps(Isa::kBaseline, lamb);
    const Tensors start(sizes, 7);  // the steps moved every tensor: the comparison below is not of copies
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      EXPECT_NE(std::memcmp(base.w[k].data(), start.w[k].data(), sizes[k] * sizeof(float)), 0) << "tensor " << k;
    }
    for (const Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
      if (!cpu::cpu_has(isa)) continue;
      ++variants;
      const Tensors wide = three_steps(isa, lamb);
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        EXPECT_EQ(std::memcmp(base.w[k].data(), wide.w[k].data(), sizes[k] * sizeof(float)), 0)
            << cpu::isa_name(isa) << (lamb ? " LAMB" : " LARS") << ", tensor " << k;
        EXPECT_EQ(std::memcmp(base.m[k].data(), wide.m[k].data(), sizes[k] * sizeof(float)), 0)
            << cpu::isa_name(isa) << (lamb ? " LAMB" : " LARS") << ", tensor " << k;
      }
    }
  }
  cpu::set_cpu_isa(before);
  if (variants == 0) GTEST_SKIP() << "this CPU has neither AVX2 nor AVX-512: only the baseline loop runs";
}

TEST(CpuEngine, AnIsaTheCpuLacksIsRefused) {
  using bigbatch::kernels::cpu::Isa;
  EXPECT_TRUE(cpu::cpu_has(Isa::kBaseline));
  if (!cpu::cpu_has(Isa::kAvx512)) {
    EXPECT_THROW(cpu::set_cpu_isa(Isa::kAvx512), c10::Error);
  }
}

TEST(CpuEngine, MovedGradientsAndNewOptionsNeedNoRebuild) {
  Tensors t({100, 7});
  std::vector<float> zeros(100, 0.0f);
  auto slots = t.slots();
  slots[0].grad = zeros.data();
  auto step = make_cpu_step<LarsPlan>();
  step->bind(slots, {lars_group(0.1, 0)}, nullptr);
  step->run(nullptr);
  const std::vector<float> after_zero = t.w[0];
  EXPECT_EQ(after_zero, Tensors({100, 7}).w[0]) << "a zero gradient without decay moves nothing";
  slots[0].grad = t.g[0].data();  // moved: the same tensors otherwise
  EXPECT_TRUE(step->same_tensors(slots));
  step->bind(slots, {lars_group(0.0, 0)}, nullptr);  // lr 0: nothing enters the buffer
  step->run(nullptr);
  EXPECT_EQ(t.w[0], after_zero);
  step->bind(slots, {lars_group(0.1, 0)}, nullptr);
  step->run(nullptr);
  EXPECT_NE(t.w[0], after_zero) << "the moved gradient was not used";
  EXPECT_EQ(step->steps(), (std::vector<std::int64_t>{0, 0})) << "LARS counts no steps";
}

TEST(CpuEngine, AGroupThatDoesNotExistIsRejected) {
  Tensors t({4});
  auto slots = t.slots();
  slots[0].group = 2;
  auto step = make_cpu_step<NovoGradPlan>();
  EXPECT_THROW(step->bind(slots, {NovoGradGroup{}}, nullptr), std::invalid_argument);
}

}  // namespace
