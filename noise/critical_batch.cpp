// fit_critical_batch (critical_batch.h): S = a + b / B is linear in (a, b);
// weighting each residual by 1/S fits relative error, so that the long steps
// of small batches do not drown the short ones of large batches.
#include "critical_batch.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <limits>
#include <algorithm>
#include <random>
#include <set>

namespace bigbatch::noise {

namespace {

// The order statistic at quantile q of v (reordered).
double quantile(std::vector<double>& v, double q) {
  const auto at = static_cast<std::size_t>(std::floor(q * static_cast<double>(v.size() - 1) + 0.5));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(at), v.end());
  return v[at];
}

void check_bootstrap(const char* what, int resamples, double level) {
  TORCH_CHECK(resamples >= 10, what, ": resamples must be >= 10, got ", resamples);
  TORCH_CHECK(level > 0 && level < 1, what, ": level must be in (0, 1), got ", level);
}

}  // namespace

CriticalBatchFit fit_critical_batch(const std::vector<std::pair<double, double>>& batch_steps) {
  std::set<double> distinct;
  for (const auto& [b, s] : batch_steps) {
    TORCH_CHECK(std::isfinite(b) && b > 0, "fit_critical_batch: batch sizes must be > 0, got ", b);
    TORCH_CHECK(std::isfinite(s) && s > 0, "fit_critical_batch: steps must be > 0, got ", s, " at batch ", b);
    distinct.insert(b);
  }
  TORCH_CHECK(distinct.size() >= 2, "fit_critical_batch: needs at least 2 distinct batch sizes, got ",
              distinct.size());
  // Minimize sum (1 - a * p_i - b * q_i)^2 with p = 1/S, q = 1/(B S).
  double pp = 0, pq = 0, qq = 0, p1 = 0, q1 = 0;
  for (const auto& [b, s] : batch_steps) {
    const double p = 1 / s;
    const double q = 1 / (b * s);
    pp += p * p; pq += p * q; qq += q * q; p1 += p; q1 += q;
  }
  const double det = pp * qq - pq * pq;
  double a = (p1 * qq - q1 * pq) / det;
  double e = (q1 * pp - p1 * pq) / det;
  if (!(det > 0) || a < 0 || e < 0) {
    // The constrained optimum lies on an edge: the better of a = 0 and e = 0.
    const double e_only = q1 / qq;  // a = 0
    const double a_only = p1 / pp;  // e = 0
    double loss_e = 0, loss_a = 0;
    for (const auto& [b, s] : batch_steps) {
      loss_e += std::pow(1 - e_only / (b * s), 2);
      loss_a += std::pow(1 - a_only / s, 2);
    }
    a = loss_e <= loss_a ? 0 : a_only;
    e = loss_e <= loss_a ? e_only : 0;
  }
  CriticalBatchFit fit{};
  fit.s_min = a;
  fit.e_min = e;
  fit.b_crit = a > 0 ? e / a : std::numeric_limits<double>::infinity();
  fit.points = batch_steps.size();
  double sq = 0;
  for (const auto& [b, s] : batch_steps) sq += std::pow((a + e / b - s) / s, 2);
  fit.rms_relative_error = std::sqrt(sq / static_cast<double>(batch_steps.size()));
  return fit;
}

CriticalBatchRange bootstrap_critical_batch(const std::vector<std::pair<double, double>>& batch_steps, int resamples,
                                            double level, std::uint64_t seed) {
  std::set<double> distinct;
  for (const auto& point : batch_steps) distinct.insert(point.first);
  TORCH_CHECK(distinct.size() >= 3, "bootstrap_critical_batch: needs at least 3 distinct batch sizes, got ",
              distinct.size());
  check_bootstrap("bootstrap_critical_batch", resamples, level);
  const CriticalBatchFit fit = fit_critical_batch(batch_steps);
  const std::size_t n = batch_steps.size();
  std::vector<double> fitted, residuals;
  double mean = 0;
  for (const auto& [b, s] : batch_steps) {
    fitted.push_back(fit.s_min + fit.e_min / b);
    residuals.push_back(std::log(s / fitted.back()));
    mean += residuals.back() / static_cast<double>(n);
  }
  const double widen = std::sqrt(static_cast<double>(n) / static_cast<double>(n - 2));
  for (double& r : residuals) r = (r - mean) * widen;
  std::mt19937_64 generator(seed);
  std::vector<double> b_crit, s_min;
  std::vector<std::pair<double, double>> drawn(batch_steps);
  for (int k = 0; k < resamples; ++k) {
    for (std::size_t i = 0; i < n; ++i) drawn[i].second = fitted[i] * std::exp(residuals[generator() % n]);
    const CriticalBatchFit f = fit_critical_batch(drawn);
    b_crit.push_back(f.b_crit);
    s_min.push_back(f.s_min);
  }
  const double lo = (1 - level) / 2, hi = (1 + level) / 2;
  return {quantile(b_crit, lo), quantile(b_crit, hi), quantile(s_min, lo), quantile(s_min, hi), level, resamples};
}

double median_steps(std::vector<double> steps) {
  TORCH_CHECK(!steps.empty(), "median_steps: needs at least one seed");
  for (const double s : steps) TORCH_CHECK(!std::isnan(s), "median_steps: a seed's steps are NaN");
  std::sort(steps.begin(), steps.end());
  const std::size_t n = steps.size();
  return n % 2 == 1 ? steps[n / 2] : (steps[n / 2 - 1] + steps[n / 2]) / 2;
}

namespace {

// One resample of `steps` (with replacement) from `generator`, its median.
double resampled_median(const std::vector<double>& steps, std::mt19937_64& generator, std::vector<double>& scratch) {
  scratch.resize(steps.size());
  for (double& x : scratch) x = steps[generator() % steps.size()];
  return median_steps(scratch);
}

Interval central(std::vector<double>& v, double level) {
  return {quantile(v, (1 - level) / 2), quantile(v, (1 + level) / 2)};
}

}  // namespace

Interval bootstrap_median(const std::vector<double>& steps, int resamples, double level, std::uint64_t seed) {
  TORCH_CHECK(!steps.empty(), "bootstrap_median: needs at least one seed");
  check_bootstrap("bootstrap_median", resamples, level);
  std::mt19937_64 generator(seed);
  std::vector<double> medians, scratch;
  for (int k = 0; k < resamples; ++k) medians.push_back(resampled_median(steps, generator, scratch));
  return central(medians, level);
}

Interval bootstrap_median_ratio(const std::vector<double>& a, const std::vector<double>& b, int resamples,
                                double level, std::uint64_t seed) {
  TORCH_CHECK(!a.empty() && !b.empty(), "bootstrap_median_ratio: needs at least one seed on each side");
  check_bootstrap("bootstrap_median_ratio", resamples, level);
  std::mt19937_64 generator(seed);
  std::vector<double> ratios, scratch;
  for (int k = 0; k < resamples; ++k) {
    const double ma = resampled_median(a, generator, scratch);
    const double mb = resampled_median(b, generator, scratch);
    ratios.push_back(std::isinf(mb) ? std::numeric_limits<double>::infinity() : mb / ma);
  }
  return central(ratios, level);
}

CriticalBatchRange bootstrap_critical_batch_seeds(
    const std::vector<std::pair<double, std::vector<double>>>& batch_seed_steps, int resamples, double level,
    std::uint64_t seed) {
  check_bootstrap("bootstrap_critical_batch_seeds", resamples, level);
  std::set<double> reached;
  for (const auto& [b, steps] : batch_seed_steps) {
    TORCH_CHECK(!steps.empty(), "bootstrap_critical_batch_seeds: batch ", b, " has no seeds");
    if (std::isfinite(median_steps(steps))) reached.insert(b);
  }
  TORCH_CHECK(reached.size() >= 3, "bootstrap_critical_batch_seeds: needs at least 3 distinct batch sizes that "
              "reached, got ", reached.size());
  std::mt19937_64 generator(seed);
  std::vector<double> b_crit, s_min, scratch;
  std::vector<std::pair<double, double>> drawn;
  for (int k = 0; k < resamples; ++k) {
    drawn.clear();
    std::set<double> distinct;
    for (const auto& [b, steps] : batch_seed_steps) {
      const double m = resampled_median(steps, generator, scratch);
      if (!std::isfinite(m)) continue;
      drawn.emplace_back(b, m);
      distinct.insert(b);
    }
    if (distinct.size() < 3) continue;
    const CriticalBatchFit f = fit_critical_batch(drawn);
    b_crit.push_back(f.b_crit);
    s_min.push_back(f.s_min);
  }
  TORCH_CHECK(!b_crit.empty(), "bootstrap_critical_batch_seeds: no resample kept 3 batch sizes that reached");
  const Interval b = central(b_crit, level), s = central(s_min, level);
  return {b.low, b.high, s.low, s.high, level, static_cast<int>(b_crit.size())};
}

}  // namespace bigbatch::noise
