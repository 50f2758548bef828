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

/// Steps to target over seeds (docs/formulas.md "Seeds"): +infinity stands for
/// a seed that did not reach. The median, the mean of the two middle values
/// for an even count, is finite exactly when more than half of the seeds
/// reached. Needs at least one value (none may be NaN).
double median_steps(std::vector<double> steps);

/// A central interval; `high` may be +infinity (resamples that did not reach).
struct Interval {
  double low, high;
};

/// The percentile bootstrap of median_steps over seeds: the seeds drawn with
/// replacement `resamples` times (generator seeded by `seed`), the order
/// statistics of the medians at (1 -+ level) / 2.
Interval bootstrap_median(const std::vector<double>& steps, int resamples = 2000, double level = 0.9,
                          std::uint64_t seed = 0);

/// The same for the ratio median(b) / median(a) of two independent sets of
/// seeds, each drawn with replacement; +infinity where b's draw did not reach,
/// 0 where only a's did not (both not reached: +infinity).
Interval bootstrap_median_ratio(const std::vector<double>& a, const std::vector<double>& b, int resamples = 2000,
                                double level = 0.9, std::uint64_t seed = 0);

/// The fit's range when batch sizes have several seeds: each resample draws
/// each batch size's seeds with replacement, takes their medians and refits
/// S(B) to those that are finite; a resample with fewer than 3 distinct batch
/// sizes left is dropped (`resamples` of the result counts the fits kept).
/// Needs at least 3 distinct batch sizes whose medians are finite.
CriticalBatchRange bootstrap_critical_batch_seeds(
    const std::vector<std::pair<double, std::vector<double>>>& batch_seed_steps, int resamples = 2000,
    double level = 0.9, std::uint64_t seed = 0);

}  // namespace bigbatch::noise
