// Gradient noise injection (gradient_noise.h): docs/formulas.md "Gradient noise".
#include "gradient_noise.h"

#include <ATen/core/grad_mode.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <cmath>

namespace bigbatch::noise {
namespace {

// SplitMix64 (Steele et al.): decorrelates the per-step seeds of one stream.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

at::Generator generator_for(std::uint64_t seed, std::int64_t step, std::uint64_t stream) {
  return at::detail::createCPUGenerator(mix(mix(seed ^ stream) + static_cast<std::uint64_t>(step)));
}

}  // namespace

AnnealedNoiseOptions::AnnealedNoiseOptions(double eta) : eta_(eta) {}

AnnealedGradientNoise::AnnealedGradientNoise(AnnealedNoiseOptions options) : options_(options) {
  TORCH_CHECK(std::isfinite(options_.eta()) && options_.eta() >= 0,
              "AnnealedGradientNoise: eta (a variance) must be >= 0, got ", options_.eta());
  TORCH_CHECK(std::isfinite(options_.gamma()) && options_.gamma() >= 0,
              "AnnealedGradientNoise: gamma must be >= 0, got ", options_.gamma());
}

double AnnealedGradientNoise::variance(std::int64_t step) const {
  TORCH_CHECK(step >= 0, "AnnealedGradientNoise: step must be >= 0, got ", step);
  return options_.eta() / std::pow(1.0 + static_cast<double>(step), options_.gamma());
}

void AnnealedGradientNoise::apply(const std::vector<at::Tensor>& params, std::int64_t step) const {
  const double stddev = std::sqrt(variance(step));
  if (stddev == 0) return;
  at::NoGradGuard no_grad;
  auto gen = generator_for(options_.seed(), step, /*stream=*/1);
  for (const auto& p : params) {
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    TORCH_CHECK(!g.is_sparse(), "AnnealedGradientNoise: sparse gradients are not supported");
    const at::Tensor noise = at::normal(0.0, stddev, g.sizes(), gen, at::kFloat);
    g.add_(noise.to(g.device(), g.scalar_type()));
  }
}

MultiplicativeNoise::MultiplicativeNoise(std::int64_t base_batch, std::uint64_t seed)
    : base_batch_(base_batch), seed_(seed) {
  TORCH_CHECK(base_batch > 0, "MultiplicativeNoise: base_batch must be > 0, got ", base_batch);
}

double MultiplicativeNoise::variance(std::int64_t batch) const {
  TORCH_CHECK(batch >= base_batch_, "MultiplicativeNoise: batch ", batch,
              " is smaller than base_batch ", base_batch_, " (sigma^2 = M/M0 - 1 would be negative)");
  return static_cast<double>(batch) / static_cast<double>(base_batch_) - 1.0;
}

at::Tensor MultiplicativeNoise::weights(std::int64_t batch, std::int64_t step,
                                        const at::TensorOptions& options) const {
  const double sigma = std::sqrt(variance(batch));
  auto gen = generator_for(seed_, step, /*stream=*/2);
  return at::normal(1.0, sigma, {batch}, gen, at::kFloat).to(options);
}

at::Tensor MultiplicativeNoise::weighted_mean(const at::Tensor& per_sample_loss, std::int64_t step) const {
  TORCH_CHECK(per_sample_loss.dim() == 1, "MultiplicativeNoise: expected a per-sample loss of shape [M], got ",
              per_sample_loss.sizes());
  const at::Tensor z = weights(per_sample_loss.size(0), step,
                                at::TensorOptions().dtype(per_sample_loss.scalar_type()).device(per_sample_loss.device()));
  return (per_sample_loss * z).mean();
}

}  // namespace bigbatch::noise
