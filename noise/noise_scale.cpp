// The gradient noise scale (noise_scale.h): docs/formulas.md "Gradient noise scale and critical batch".
#include "noise_scale.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <limits>

namespace bigbatch::noise {
double grad_sq_norm(const std::vector<at::Tensor>& params) {
  double sum = 0;
  for (const auto& p : params) {
    if (p.grad().defined()) sum += p.grad().to(at::kDouble).square().sum().item<double>();
  }
  return sum;
}

NoiseScaleSample noise_scale_sample(double small_sq_norm, std::int64_t small_batch, double big_sq_norm,
                                    std::int64_t big_batch) {
  TORCH_CHECK(small_batch > 0 && big_batch > small_batch,
              "noise_scale_sample: need 0 < small_batch < big_batch, got ", small_batch, " and ", big_batch);
  const auto bs = static_cast<double>(small_batch);
  const auto bb = static_cast<double>(big_batch);
  return {(bb * big_sq_norm - bs * small_sq_norm) / (bb - bs),
          (small_sq_norm - big_sq_norm) / (1 / bs - 1 / bb)};
}

GradientNoiseScale::GradientNoiseScale(double beta) : beta_(beta) {
  TORCH_CHECK(beta >= 0 && beta < 1, "GradientNoiseScale: beta must be in [0, 1), got ", beta);
}

void GradientNoiseScale::update(double small_sq_norm, std::int64_t small_batch, double big_sq_norm,
                                std::int64_t big_batch) {
  TORCH_CHECK(std::isfinite(small_sq_norm) && std::isfinite(big_sq_norm),
              "GradientNoiseScale: non-finite gradient norm (small ", small_sq_norm, ", big ", big_sq_norm, ")");
  const NoiseScaleSample s = noise_scale_sample(small_sq_norm, small_batch, big_sq_norm, big_batch);
  grad_sq_ = beta_ * grad_sq_ + (1 - beta_) * s.grad_sq;
  trace_ = beta_ * trace_ + (1 - beta_) * s.trace;
  correction_ *= beta_;
  ++updates_;
}

double GradientNoiseScale::grad_sq() const {
  return updates_ == 0 ? std::numeric_limits<double>::quiet_NaN() : grad_sq_ / (1 - correction_);
}

double GradientNoiseScale::trace() const {
  return updates_ == 0 ? std::numeric_limits<double>::quiet_NaN() : trace_ / (1 - correction_);
}

double GradientNoiseScale::b_simple() const {
  return updates_ == 0 ? std::numeric_limits<double>::quiet_NaN() : trace_ / grad_sq_;
}

void GradientSum::add(const std::vector<at::Tensor>& params) {
  at::NoGradGuard no_grad;
  sum_.resize(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& g = params[i].grad();
    if (!g.defined()) continue;
    if (!sum_[i].defined()) {
      sum_[i] = g.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
    } else {
      sum_[i].add_(g);
    }
  }
}

void GradientSum::set_mean(const std::vector<at::Tensor>& params, std::int64_t count) {
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < params.size() && i < sum_.size(); ++i) {
    if (sum_[i].defined()) params[i].grad().copy_(sum_[i].div_(static_cast<double>(count)));
  }
}

MicroBatchStep micro_batch_step(const std::vector<at::Tensor>& params, std::int64_t batch,
                                std::int64_t micro_batches,
                                const std::function<at::Tensor(std::int64_t, std::int64_t)>& loss_of_rows) {
  TORCH_CHECK(micro_batches >= 2, "micro_batch_step: micro_batches must be >= 2, got ", micro_batches);
  TORCH_CHECK(batch > 0 && batch % micro_batches == 0, "micro_batch_step: batch ", batch,
              " is not divisible into ", micro_batches, " equal micro-batches");
  const std::int64_t size = batch / micro_batches;
  GradientSum sum;
  MicroBatchStep out{0, 0, size, 0, batch};
  for (std::int64_t k = 0; k < micro_batches; ++k) {
    for (const auto& p : params) {
      if (p.grad().defined()) p.grad().zero_();
    }
    const at::Tensor loss = loss_of_rows(k * size, (k + 1) * size);
    TORCH_CHECK(loss.numel() == 1, "micro_batch_step: loss_of_rows must return a scalar, got shape ",
                loss.sizes());
    loss.backward();
    out.loss += loss.item<double>() / static_cast<double>(micro_batches);
    out.small_sq_norm += grad_sq_norm(params) / static_cast<double>(micro_batches);
    sum.add(params);
  }
  sum.set_mean(params, micro_batches);
  out.big_sq_norm = grad_sq_norm(params);
  return out;
}

}  // namespace bigbatch::noise
