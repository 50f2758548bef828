// Weight averaging (weight_average.h): EMA as torch.optim.swa_utils runs it
// (the first update copies, each later one a foreach lerp by 1 - d), and
// LAWA's mean of the last k snapshots.
#include "weight_average.h"

#include "../compat/torch_compat.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <utility>

namespace bigbatch::optim {

void AverageOptions::validate() const {
  if (type == AverageType::kEma) {
    TORCH_CHECK(half_life >= 0 && std::isfinite(half_life), "Invalid average option half_life: ", half_life,
                " (must be > 0 examples, or 0 for a fixed decay)");
    TORCH_CHECK(half_life > 0 || (decay >= 0 && decay < 1), "Invalid average option decay: ", decay,
                " (must be in [0, 1))");
  }
  if (type == AverageType::kLawa) {
    TORCH_CHECK(k >= 1, "Invalid average option k: ", k, " (must be >= 1 snapshots)");
    TORCH_CHECK(every >= 1, "Invalid average option every: ", every, " (must be >= 1 steps)");
  }
}

double AverageOptions::decay_for(std::int64_t batch) const {
  // pow, as Python's 2.0 ** x: the same libm call, the same bits.
  return half_life > 0 ? std::pow(2.0, -static_cast<double>(batch) / half_life) : decay;
}

WeightAverage::WeightAverage(const AverageOptions& options, std::vector<at::Tensor> params)
    : options_(options), params_(std::move(params)) {
  options_.validate();
  TORCH_CHECK(options_.type != AverageType::kNone, "WeightAverage: no average type given");
}

void WeightAverage::update(std::int64_t step, std::int64_t batch) {
  at::NoGradGuard no_grad;
  if (options_.type == AverageType::kEma) {
    if (updates_ == 0) {
      ema_.clear();
      for (const auto& p : params_) ema_.push_back(p.detach().clone());
    } else {
      std::vector<at::Tensor> current;
      for (const auto& p : params_) current.push_back(p.detach());
      compat::foreach_lerp_(ema_, current, at::Scalar(1.0 - options_.decay_for(batch)));
    }
    ++updates_;
    return;
  }
  if (step % options_.every != 0) return;
  std::vector<at::Tensor> snapshot;
  for (const auto& p : params_) snapshot.push_back(p.detach().clone());
  snapshots_.push_back(std::move(snapshot));
  if (static_cast<std::int64_t>(snapshots_.size()) > options_.k) snapshots_.pop_front();
  ++updates_;
}

bool WeightAverage::ready() const { return options_.type == AverageType::kEma ? !ema_.empty() : !snapshots_.empty(); }

std::vector<at::Tensor> WeightAverage::averaged() const {
  TORCH_CHECK(ready(), "WeightAverage: nothing averaged yet");
  if (options_.type == AverageType::kEma) return ema_;
  // Summed oldest first, then divided by their count.
  std::vector<at::Tensor> out;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    at::Tensor sum = snapshots_.front()[i].clone();
    for (std::size_t s = 1; s < snapshots_.size(); ++s) sum.add_(snapshots_[s][i]);
    out.push_back(sum.div_(static_cast<double>(snapshots_.size())));
  }
  return out;
}

std::vector<at::Tensor> WeightAverage::state() const {
  std::vector<at::Tensor> out{at::scalar_tensor(updates_, at::kLong)};
  if (options_.type == AverageType::kEma) {
    out.insert(out.end(), ema_.begin(), ema_.end());
  } else {
    for (const auto& snapshot : snapshots_) out.insert(out.end(), snapshot.begin(), snapshot.end());
  }
  return out;
}

void WeightAverage::load_state(const std::vector<at::Tensor>& state) {
  TORCH_CHECK(!state.empty() && state[0].numel() == 1, "WeightAverage: a state starts with its count of updates");
  const std::int64_t updates = state[0].item<std::int64_t>();
  const std::size_t n = params_.size(), tensors = state.size() - 1;
  const std::size_t sets = n == 0 ? 0 : tensors / n;
  const bool ema = options_.type == AverageType::kEma;
  TORCH_CHECK(tensors == sets * n && (ema ? sets == (updates > 0 ? 1u : 0u)
                                          : sets <= static_cast<std::size_t>(options_.k) &&
                                                sets == static_cast<std::size_t>(std::min<std::int64_t>(updates, options_.k))),
              "WeightAverage: a state of ", tensors, " tensors after ", updates, " updates does not fit ", n,
              " parameters (", ema ? "EMA" : "LAWA", ")");
  for (std::size_t t = 0; t < tensors; ++t) {
    const at::Tensor& p = params_[t % n];
    TORCH_CHECK(state[t + 1].sizes() == p.sizes() && state[t + 1].scalar_type() == p.scalar_type(),
                "WeightAverage: state tensor ", t, " is ", state[t + 1].sizes(), " ", state[t + 1].scalar_type(),
                ", its parameter ", p.sizes(), " ", p.scalar_type());
  }
  ema_.clear();
  snapshots_.clear();
  for (std::size_t s = 0; s < sets; ++s) {
    std::vector<at::Tensor> set;
    for (std::size_t i = 0; i < n; ++i) set.push_back(state[1 + s * n + i].to(params_[i].device()).clone());
    if (ema) {
      ema_ = std::move(set);
    } else {
      snapshots_.push_back(std::move(set));
    }
  }
  updates_ = updates;
}

}  // namespace bigbatch::optim
