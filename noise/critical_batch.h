// The steps/examples trade-off S(B) = S_min (1 + B_crit / B) fitted to a sweep's
// (batch size, steps to target) pairs (McCandlish et al. 2018; docs/formulas.md).
#pragma once

#include <cstddef>
#include <cstdint>
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

/// A central `level` range of B_crit and S_min from a residual bootstrap of
/// the fit: the points' log residuals log(S / S_fit), centred and widened by
/// sqrt(n / (n - 2)) for the two fitted parameters, are drawn with
/// replacement onto the fitted curve and the curve refitted, `resamples`
/// times (a fixed generator seeded by `seed`: the same points give the same
/// range). b_crit_high is +infinity when enough refits show no plateau.
/// Needs at least 3 distinct batch sizes (2 points fit exactly: no residual).
struct CriticalBatchRange {
  double b_crit_low, b_crit_high;
  double s_min_low, s_min_high;
  double level;
  int resamples;
};
CriticalBatchRange bootstrap_critical_batch(const std::vector<std::pair<double, double>>& batch_steps,
                                            int resamples = 2000, double level = 0.9, std::uint64_t seed = 0);

}  // namespace bigbatch::noise
