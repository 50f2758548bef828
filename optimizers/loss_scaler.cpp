// Dynamic loss scaling (loss_scaler.h).
#include "loss_scaler.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <cmath>

namespace bigbatch::optim {

namespace {

bool power_of_two(double x) {
  int exponent = 0;
  return std::isfinite(x) && x > 0 && std::frexp(x, &exponent) == 0.5;
}

}  // namespace

void LossScalerOptions::validate() const {
  TORCH_CHECK(power_of_two(init_scale()), "Invalid init_scale: ", init_scale(),
              " (a power of two, so that scaling rounds nothing)");
  TORCH_CHECK(power_of_two(growth_factor()) && growth_factor() > 1, "Invalid growth_factor: ", growth_factor(),
              " (a power of two > 1)");
  TORCH_CHECK(power_of_two(backoff_factor()) && backoff_factor() < 1, "Invalid backoff_factor: ", backoff_factor(),
              " (a power of two < 1)");
  TORCH_CHECK(growth_interval() >= 1, "Invalid growth_interval: ", growth_interval(), " (>= 1)");
}

LossScaler::LossScaler(const LossScalerOptions& options) : options_(options), scale_(options.init_scale()) {
  options_.validate();
}

at::Tensor LossScaler::scale(const at::Tensor& loss) const { return loss * scale_; }

bool LossScaler::unscale(const std::vector<at::Tensor>& params) const {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> sums;
  for (const auto& p : params) {
    if (!p.grad().defined()) continue;
    at::Tensor g = p.mutable_grad();
    g.mul_(1.0 / scale_);
    // A gradient's sum in double is finite iff every element is (fp32's
    // largest value times any tensor's size stays far inside double's range).
    sums.push_back(g.sum(at::kDouble));
  }
  return sums.empty() || at::isfinite(at::stack(sums)).all().item<bool>();
}

void LossScaler::update(bool finite) {
  if (!finite) {
    scale_ *= options_.backoff_factor();
    run_ = 0;
    ++skipped_;
    return;
  }
  if (++run_ == options_.growth_interval()) {
    scale_ *= options_.growth_factor();
    run_ = 0;
  }
}

bool LossScaler::step(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& params) {
  const bool finite = unscale(params);
  if (finite) optimizer.step();
  update(finite);
  return finite;
}

void LossScaler::restore(const State& state) {
  TORCH_CHECK(power_of_two(state.scale) && state.run >= 0 && state.run < options_.growth_interval() &&
                  state.skipped >= 0,
              "LossScaler::restore: not a scaler's state (scale ", state.scale, ", run ", state.run, ", skipped ",
              state.skipped, ")");
  scale_ = state.scale;
  run_ = state.run;
  skipped_ = state.skipped;
}

}  // namespace bigbatch::optim
