// Delayed gradients (delayed.h).
#include "delayed.h"

#include "../kernels/compress.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <utility>

namespace bigbatch::distributed {

namespace kc = kernels::compress;

void check_spec(const DelaySpec& s) {
  TORCH_CHECK(s.tau >= 0, "delayed gradients: tau must be >= 0 (steps), got ", s.tau);
}

DelayedGradients::DelayedGradients(DelaySpec spec, std::vector<at::Tensor> params)
    : spec_(spec), params_(std::move(params)), histogram_(static_cast<std::size_t>(std::max<std::int64_t>(spec.tau, 0)) + 1, 0) {
  check_spec(spec_);
}

std::int64_t DelayedGradients::staleness(std::int64_t step) const {
  std::int64_t tau = spec_.tau;
  if (spec_.draw == StalenessDraw::kUniform && tau > 0) {
    // SplitMix64 (kernels/compress.h's finalizer after its increment) of the seed, then of the step.
    constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ull;
    const std::uint64_t r = kc::mix64((kc::mix64(spec_.seed + kGolden) ^ static_cast<std::uint64_t>(step)) + kGolden);
    tau = static_cast<std::int64_t>(r % static_cast<std::uint64_t>(spec_.tau + 1));
  }
  return std::min(tau, step);
}

double DelayedGradients::rate_factor(std::int64_t tau) const {
  return spec_.staleness_aware && tau >= 1 ? 1.0 / static_cast<double>(tau) : 1.0;
}

DelayedGradients::Stale::Stale(DelayedGradients& delays, std::int64_t tau) {
  if (tau == 0) return;
  TORCH_CHECK(tau >= 1 && tau <= static_cast<std::int64_t>(delays.past_.size()),
              "delayed gradients: no parameters of ", tau, " steps ago (", delays.past_.size(), " kept)");
  swap_.emplace(delays.params_, delays.past_[static_cast<std::size_t>(tau - 1)]);
}

void DelayedGradients::record(std::int64_t tau) {
  TORCH_CHECK(tau >= 0 && tau <= spec_.tau, "delayed gradients: staleness ", tau, " outside 0..", spec_.tau);
  ++histogram_[static_cast<std::size_t>(tau)];
  if (spec_.tau == 0) return;
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> now;
  if (static_cast<std::int64_t>(past_.size()) == spec_.tau) {  // reuse the oldest version's memory
    now = std::move(past_.back());
    past_.pop_back();
    for (std::size_t i = 0; i < params_.size(); ++i) now[i].copy_(params_[i].detach());
  } else {
    for (const auto& p : params_) now.push_back(p.detach().clone());
  }
  past_.push_front(std::move(now));
}

}  // namespace bigbatch::distributed
