// Asynchronous SGD's staleness, simulated and reproducible: the update of
// step t applies the gradient taken at the parameters of tau_t steps before,
// as a worker's gradient reaches a parameter server after tau_t other
// updates (Dean et al. 2012's Downpour SGD, the delayed-gradient model of
// Lian et al. 2015, arXiv 1506.08272). tau_t is fixed, or drawn uniformly
// from [0, tau] by (seed, t); with `staleness_aware` the step's rate is
// divided by tau_t (Zhang, Gupta, Lian and Liu 2016, arXiv 1511.05950). The
// math is in docs/formulas.md ("Delayed gradients"); how to use it, in
// docs/distributed.md.
#pragma once

#include "../optimizers/tensor_swap.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace bigbatch::distributed {

/// How each step's staleness is chosen: always tau, or uniform over 0..tau.
enum class StalenessDraw { kFixed, kUniform };

struct StalenessDrawName {
  StalenessDraw value;
  const char* name;
};
inline constexpr StalenessDrawName kStalenessDrawNames[] = {{StalenessDraw::kFixed, "fixed"},
                                                            {StalenessDraw::kUniform, "uniform"}};

struct DelaySpec {
  std::int64_t tau = 0;  ///< the staleness (fixed), or its largest value (uniform); >= 0
  StalenessDraw draw = StalenessDraw::kFixed;
  /// Divide the step's rate by its staleness (a stale-0 step keeps it).
  bool staleness_aware = false;
  std::uint64_t seed = 0;  ///< the uniform draws' seed (bigbatch's trials use the trial's)
};

/// Checks tau >= 0; throws c10::Error naming the field and its value.
void check_spec(const DelaySpec& spec);

/// The parameters of the last tau steps of one run, and each step's
/// staleness. Per step t (0-based): tau_t = staleness(t); compute the
/// gradient inside a Stale(delays, tau_t); record() the parameters about to
/// be stepped; scale the rate by rate_factor(tau_t); step.
class DelayedGradients {
 public:
  DelayedGradients(DelaySpec spec, std::vector<at::Tensor> params);

  /// Step t's staleness: tau (fixed) or a draw from (seed, t) uniform over
  /// 0..tau, at most t (the run's first steps have no older parameters: every
  /// worker starts from the first ones).
  std::int64_t staleness(std::int64_t step) const;
  /// 1, or 1 / tau with staleness_aware and tau >= 1.
  double rate_factor(std::int64_t tau) const;

  /// While it lives, the parameters hold those of `tau` steps ago (tau at
  /// most the steps recorded, and at most spec().tau); the current ones come
  /// back bit for bit when it ends. tau = 0 touches nothing.
  class Stale {
   public:
    Stale(DelayedGradients& delays, std::int64_t tau);

   private:
    std::optional<optim::TensorSwap> swap_;  ///< none for tau = 0
  };

  /// Before the step: keeps the parameters it is about to change (the
  /// newest of the tau versions kept) and counts the step's staleness.
  void record(std::int64_t tau);

  /// How many steps had each staleness 0..tau so far.
  const std::vector<std::int64_t>& histogram() const { return histogram_; }
  const DelaySpec& spec() const { return spec_; }

 private:
  DelaySpec spec_;
  std::vector<at::Tensor> params_;
  std::deque<std::vector<at::Tensor>> past_;  ///< front: one step ago
  std::vector<std::int64_t> histogram_;
};

}  // namespace bigbatch::distributed
