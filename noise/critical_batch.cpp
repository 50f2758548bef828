// fit_critical_batch (critical_batch.h): S = a + b / B is linear in (a, b);
// weighting each residual by 1/S fits relative error, so that the long steps
// of small batches do not drown the short ones of large batches.
#include <bigbatch/noise/critical_batch.h>

#include <c10/util/Exception.h>

#include <cmath>
#include <limits>
#include <set>

namespace bigbatch::noise {

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

}  // namespace bigbatch::noise
