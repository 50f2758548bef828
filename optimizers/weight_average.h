// Weight averaging for evaluation (docs/formulas.md "Weight averaging"): a
// copy of the parameters averaged over the run, evaluated beside the weights
// training goes on from. Two kinds:
//   EMA    a_1 = w_1;  a_t = a_{t-1} + (1 - d_t) (w_t - a_{t-1})   after each step t
//          (torch.lerp's rounding: torch.optim.swa_utils' EMA averaging bit
//          for bit), with d_t a decay per step, or 2^(-B_t / h) for a
//          half-life h in examples (B_t the step's batch)
//   LAWA   the mean of the last k snapshots, taken every `every` steps
//          (latest weight averaging, Sanyal et al. 2023, arXiv 2306.03241)
// The averaged weights are never trained: training goes on from w.
#pragma once

#include "tensor_swap.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <deque>
#include <vector>

namespace bigbatch::optim {

enum class AverageType { kNone, kEma, kLawa };

struct AverageOptions {
  AverageType type = AverageType::kNone;
  double decay = 0;          ///< EMA: d per step, in [0, 1); unused when half_life > 0
  double half_life = 0;      ///< EMA: h in examples (> 0), or 0 for a fixed decay
  std::int64_t k = 0;        ///< LAWA: snapshots averaged (>= 1)
  std::int64_t every = 0;    ///< LAWA: steps between snapshots (>= 1)

  /// Throws c10::Error naming the first invalid option and its value.
  void validate() const;
  /// EMA's d for a step of `batch` examples.
  double decay_for(std::int64_t batch) const;
};

class WeightAverage {
 public:
  /// Averages `params` (held, not copied: their values at each update()).
  WeightAverage(const AverageOptions& options, std::vector<at::Tensor> params);

  /// After optimizer step `step` (counted from 1) of `batch` examples.
  void update(std::int64_t step, std::int64_t batch);
  /// Whether there is an average yet (EMA: after the first update; LAWA:
  /// after the first snapshot).
  bool ready() const;
  /// The averaged tensors, one per parameter (requires ready()).
  std::vector<at::Tensor> averaged() const;

  /// Puts the averaged values into the parameters until the guard goes, then
  /// the trained ones back (bit for bit).
  class Swap {
   public:
    explicit Swap(const WeightAverage& average) : swap_(average.params_, average.averaged()) {}

   private:
    TensorSwap swap_;
  };

  /// What a checkpoint saves: [updates (int64), then the EMA's tensors or
  /// LAWA's snapshots oldest first, each parameter in order].
  std::vector<at::Tensor> state() const;
  /// Restores state(); checks the count and every tensor's shape and dtype.
  void load_state(const std::vector<at::Tensor>& state);

  const AverageOptions& options() const { return options_; }

 private:
  AverageOptions options_;
  std::vector<at::Tensor> params_;
  std::int64_t updates_ = 0;
  std::vector<at::Tensor> ema_;
  std::deque<std::vector<at::Tensor>> snapshots_;  // LAWA: the last k, oldest first
};

}  // namespace bigbatch::optim
