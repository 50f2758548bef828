// Gradient noise injection: with fixed seeds the injected noise has the mean
// and variance of docs/formulas.md within 5 standard errors, and the expected
// gradient is unchanged.
#include "../../noise/gradient_noise.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <cmath>

namespace {

using bigbatch::noise::AnnealedGradientNoise;
using bigbatch::noise::AnnealedNoiseOptions;
using bigbatch::noise::MultiplicativeNoise;

TEST(AnnealedGradientNoise, VarianceIsEtaOverOnePlusTToTheGamma) {
  const AnnealedGradientNoise noise(AnnealedNoiseOptions(0.3).gamma(0.55));
  EXPECT_DOUBLE_EQ(noise.variance(0), 0.3);
  EXPECT_DOUBLE_EQ(noise.variance(9), 0.3 / std::pow(10.0, 0.55));
}

TEST(AnnealedGradientNoise, InjectedNoiseHasTheStatedMeanAndVariance) {
  const AnnealedGradientNoise noise(AnnealedNoiseOptions(1.0).seed(7));
  const std::int64_t n = 1 << 20;
  const double c = 0.25;  // the true gradient
  const auto p = at::zeros({n}).requires_grad_(true);
  p.mutable_grad() = at::full({n}, c);
  const std::int64_t step = 99;
  noise.apply({p}, step);
  const at::Tensor z = p.grad().to(at::kDouble) - c;
  const double var = 1.0 / std::pow(100.0, 0.55);  // eta / (1 + t)^gamma: eta is a variance
  // Standard errors: mean sqrt(var/n), variance var * sqrt(2/n) (Gaussian).
  EXPECT_NEAR(z.mean().item<double>(), 0, 5 * std::sqrt(var / n));
  EXPECT_NEAR(z.var().item<double>(), var, 5 * var * std::sqrt(2.0 / n));
  EXPECT_NEAR(p.grad().to(at::kDouble).mean().item<double>(), c, 5 * std::sqrt(var / n));
}

TEST(AnnealedGradientNoise, NoiseIsAFunctionOfSeedAndStep) {
  const auto grad_after = [](std::uint64_t seed, std::int64_t step) {
    const auto p = at::zeros({64}).requires_grad_(true);
    p.mutable_grad() = at::zeros({64});
    AnnealedGradientNoise(AnnealedNoiseOptions(0.01).seed(seed)).apply({p}, step);
    return p.grad().clone();
  };
  EXPECT_TRUE(at::equal(grad_after(1, 5), grad_after(1, 5)));
  EXPECT_FALSE(at::equal(grad_after(1, 5), grad_after(1, 6)));
  EXPECT_FALSE(at::equal(grad_after(1, 5), grad_after(2, 5)));
}

TEST(AnnealedGradientNoise, SkipsParametersWithoutGradientAndKeepsDtype) {
  const auto a = at::zeros({8}).requires_grad_(true);
  const auto b = at::zeros({8}, at::kBFloat16).requires_grad_(true);
  b.mutable_grad() = at::zeros({8}, at::kBFloat16);
  AnnealedGradientNoise(AnnealedNoiseOptions(0.3)).apply({a, b}, 0);
  EXPECT_FALSE(a.grad().defined());
  EXPECT_EQ(b.grad().scalar_type(), at::kBFloat16);
  EXPECT_GT(b.grad().abs().sum().item<double>(), 0);
}

TEST(AnnealedGradientNoise, BadOptions) {
  EXPECT_THROW(AnnealedGradientNoise(AnnealedNoiseOptions(-1)), c10::Error);
  EXPECT_THROW(AnnealedGradientNoise(AnnealedNoiseOptions(0.3).gamma(-0.5)), c10::Error);
}

TEST(MultiplicativeNoise, WeightsHaveMeanOneAndVarianceMOverM0MinusOne) {
  const MultiplicativeNoise noise(/*base_batch=*/256, /*seed=*/3);
  EXPECT_DOUBLE_EQ(noise.variance(1024), 3.0);
  EXPECT_DOUBLE_EQ(noise.variance(256), 0.0);
  std::vector<at::Tensor> draws;
  for (std::int64_t step = 0; step < 256; ++step) draws.push_back(noise.weights(1024, step));
  const at::Tensor z = at::cat(draws).to(at::kDouble);
  const double n = static_cast<double>(z.numel());
  EXPECT_NEAR(z.mean().item<double>(), 1.0, 5 * std::sqrt(3.0 / n));
  EXPECT_NEAR(z.var().item<double>(), 3.0, 5 * 3.0 * std::sqrt(2.0 / n));
  EXPECT_TRUE(at::equal(noise.weights(1024, 5), noise.weights(1024, 5)));
}

TEST(MultiplicativeNoise, ExpectedGradientIsUnchanged) {
  // Per-sample loss l_n = 0.5 (w x_n - y_n)^2 on a fixed batch: the gradient
  // of weighted_mean averaged over many steps approaches that of the mean.
  at::manual_seed(4);
  const std::int64_t m = 512;
  const at::Tensor x = at::randn({m});
  const at::Tensor y = 3 * x + at::randn({m});
  const MultiplicativeNoise noise(64, 11);
  const auto w = at::full({1}, 0.5).requires_grad_(true);
  const auto gradient = [&](bool noisy, std::int64_t step) {
    w.mutable_grad() = at::Tensor();
    const at::Tensor per_sample = 0.5 * (w * x - y).pow(2);
    (noisy ? noise.weighted_mean(per_sample, step) : per_sample.mean()).backward();
    return w.grad().item<double>();
  };
  const double exact = gradient(false, 0);
  const int steps = 2000;
  double sum = 0;
  double sq = 0;
  for (int s = 0; s < steps; ++s) {
    const double g = gradient(true, s);
    sum += g;
    sq += g * g;
  }
  const double mean = sum / steps;
  const double sd = std::sqrt(sq / steps - mean * mean);
  EXPECT_GT(sd, 0);
  EXPECT_NEAR(mean, exact, 5 * sd / std::sqrt(static_cast<double>(steps)));
}

TEST(MultiplicativeNoise, BatchSmallerThanBaseIsAnError) {
  const MultiplicativeNoise noise(256);
  try {
    noise.variance(128);
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_STREQ(e.what_without_backtrace(),
                 "MultiplicativeNoise: batch 128 is smaller than base_batch 256 (sigma^2 = M/M0 - 1 would be negative)");
  }
}

}  // namespace
