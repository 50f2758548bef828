// The CPU norm kernel: exact against a double loop, finite iff its input is,
// and the same bits whatever the number of threads (fixed chunk order).
#include <bigbatch/kernels/common.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace {

using bigbatch::kernels::DType;
using bigbatch::kernels::sum_squares_cpu;

TEST(SumSquares, MatchesADoubleLoopOnOddSizes) {
  for (const std::int64_t n : {0, 1, 3, 16383, 16384, 16385, 100001}) {
    const auto x = at::randn({n});
    const auto y = at::randn({n});
    double sx = 0;
    double sy = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      sx += static_cast<double>(x.data_ptr<float>()[i]) * x.data_ptr<float>()[i];
      sy += static_cast<double>(y.data_ptr<float>()[i]) * y.data_ptr<float>()[i];
    }
    const auto s = sum_squares_cpu(x.data_ptr(), y.data_ptr(), DType::kFloat32, n);
    EXPECT_NEAR(s.x, sx, 1e-12 * (1 + sx)) << "n = " << n;
    EXPECT_NEAR(s.y, sy, 1e-12 * (1 + sy)) << "n = " << n;
    EXPECT_EQ(sum_squares_cpu(x.data_ptr(), nullptr, DType::kFloat32, n).y, 0.0);
  }
}

TEST(SumSquares, Bf16AndFp16InputsAreWidenedExactly) {
  const auto x = at::randn({1001});
  for (const auto [type, tag] : {std::pair{at::kBFloat16, DType::kBFloat16}, std::pair{at::kHalf, DType::kFloat16}}) {
    const auto low = x.to(type);
    const double expected = low.to(at::kDouble).pow(2).sum().item<double>();
    EXPECT_NEAR(sum_squares_cpu(low.data_ptr(), nullptr, tag, 1001).x, expected, 1e-12 * expected);
  }
}

TEST(SumSquares, FiniteExactlyWhenTheInputIs) {
  auto x = at::full({50000}, 3e38f);  // squares overflow fp32, not double
  EXPECT_TRUE(std::isfinite(sum_squares_cpu(x.data_ptr(), nullptr, DType::kFloat32, x.numel()).x));
  x[40000] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(std::isfinite(sum_squares_cpu(x.data_ptr(), nullptr, DType::kFloat32, x.numel()).x));
  x[40000] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(sum_squares_cpu(x.data_ptr(), nullptr, DType::kFloat32, x.numel()).x));
}

TEST(SumSquares, SameBitsForAnyThreadCount) {
  const auto x = at::randn({1 << 20});
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const double one = sum_squares_cpu(x.data_ptr(), nullptr, DType::kFloat32, x.numel()).x;
  at::set_num_threads(std::max(2, threads));
  const double many = sum_squares_cpu(x.data_ptr(), nullptr, DType::kFloat32, x.numel()).x;
  at::set_num_threads(threads);
  EXPECT_EQ(one, many);
}

}  // namespace
