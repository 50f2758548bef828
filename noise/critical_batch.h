// The steps/examples trade-off S(B) = S_min (1 + B_crit / B) fitted to a sweep's
// (batch size, steps to target) pairs (McCandlish et al. 2018; docs/formulas.md).
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace bigbatch::noise {

struct CriticalBatchFit {
  double s_min;   ///< steps at infinite batch
  double e_min;   ///< examples at batch -> 0 (= S_min * B_crit)
  double b_crit;  ///< E_min / S_min; +infinity when no plateau shows (S_min = 0)
  double rms_relative_error;  ///< sqrt(mean((S_fit - S) / S)^2) over the points
  std::size_t points;
};

/// Least squares in relative error of S = S_min + E_min / B over (B, S) pairs,
/// with S_min, E_min >= 0. Needs two distinct batch sizes and positive values.
CriticalBatchFit fit_critical_batch(const std::vector<std::pair<double, double>>& batch_steps);

}  // namespace bigbatch::noise
