// Schedule-Free AdamW and SGD (Defazio et al. 2024, "The Road Less
// Scheduled", arXiv:2405.15682), in the form that keeps two sequences: the
// parameter holds y (where gradients are taken), the state holds z (the
// base sequence), and x (the average that is evaluated) is implied by
// y = (1-b1)*z + b1*x. As docs/formulas.md, per tensor at its step k = 1, 2, ...:
//   lr_k   = lr * min(1, k / warmup_steps)           the warmup
//   lr_max = max(lr_max, lr_k)
//   w_k    = k^r * lr_max^weight_lr_power;  W += w_k;  c = w_k / W   (0 while W is 0)
// and per element, u the direction:
//   AdamW: v = b2*v + (1-b2)*g^2;  u = g / (sqrt(v / (1 - b2^k)) + eps) + wd*y
//   SGD:   u = g + wd*y
//   y = lerp(y, z, c) + lr_k*(b1*(1-c) - 1)*u
//   z = z - lr_k*u
// which is x = (1-c)*x + c*z after z's step, and y = (1-b1)*z + b1*x,
// written without x. The weight sum W and lr_max are numbers the engine
// carries per tensor (Table::carry), so that a step the device skips (non-
// finite gradients) leaves them as they were.
#pragma once

#include "common.h"
#include "plan.h"

#include <math.h>

#include <cstdint>
#include <tuple>

namespace bigbatch::kernels {

/// One parameter group's options as the Schedule-Free plan takes them.
struct ScheduleFreeGroup {
  double lr = 0;
  double beta1 = 0;  ///< SGD's momentum: the interpolation between z and x that y is
  double beta2 = 0;  ///< AdamW only
  double eps = 0;    ///< AdamW only
  double weight_decay = 0;
  std::int64_t warmup_steps = 0;
  double r = 0;
  double weight_lr_power = 0;
  bool adaptive = false;  ///< AdamW (true) or SGD (false)
  bool skip_nonfinite = false;
};

/// Every member, by a structured binding (a member left out does not compile).
inline auto fields(const ScheduleFreeGroup& o) {
  const auto& [lr, beta1, beta2, eps, weight_decay, warmup_steps, r, weight_lr_power, adaptive, skip_nonfinite] = o;
  return std::tie(lr, beta1, beta2, eps, weight_decay, warmup_steps, r, weight_lr_power, adaptive, skip_nonfinite);
}

/// The rate of step k (1-based) after the linear warmup.
BIGBATCH_HD inline double schedule_free_rate(const ScheduleFreeGroup& o, std::int64_t k) {
  return k <= o.warmup_steps ? o.lr * (static_cast<double>(k) / static_cast<double>(o.warmup_steps)) : o.lr;
}

/// The averaging weight of step k given the largest rate so far.
BIGBATCH_HD inline double schedule_free_weight(const ScheduleFreeGroup& o, std::int64_t k, double lr_max) {
  return pow(static_cast<double>(k), o.r) * pow(lr_max, o.weight_lr_power);
}

/// Where a tensor's carried numbers are (Table::carry).
constexpr int kWeightSum = 0;  ///< W, the sum of the averaging weights so far
constexpr int kLrMax = 1;      ///< the largest scheduled rate so far

struct ScheduleFreeStep {
  float beta2 = 0.999f;
  float one_minus_beta2 = 0.001f;  ///< 1 - b2, rounded once
  float bias_correction2 = 1;      ///< 1 - b2^k
  float eps = 1e-8f;
  float decay = 0;                 ///< wd
  float c = 1;                     ///< the averaging weight's share c = w_k / W
  float y_step = -1;               ///< lr_k*(b1*(1-c) - 1)
  float lr = 0;                    ///< lr_k
};

/// The coefficients of step k (taken: the step count and carried numbers
/// already include it), from double rounded to fp32 once.
BIGBATCH_HD inline ScheduleFreeStep schedule_free_step_of(const ScheduleFreeGroup& o, std::int64_t k,
                                                          const double* carry) {
  const double lr = schedule_free_rate(o, k);
  const double weight = schedule_free_weight(o, k, carry[kLrMax]);
  const double c = carry[kWeightSum] > 0 ? weight / carry[kWeightSum] : 0.0;
  ScheduleFreeStep s;
  s.beta2 = static_cast<float>(o.beta2);
  s.one_minus_beta2 = static_cast<float>(1 - o.beta2);
  s.bias_correction2 = static_cast<float>(1 - pow(o.beta2, static_cast<double>(k)));
  s.eps = static_cast<float>(o.eps);
  s.decay = static_cast<float>(o.weight_decay);
  s.c = static_cast<float>(c);
  s.y_step = static_cast<float>(lr * (o.beta1 * (1 - c) - 1));
  s.lr = static_cast<float>(lr);
  return s;
}

/// lerp(a, b, t) rounded as ATen's: a + t*(b-a) for |t| < 0.5, else b - (b-a)*(1-t).
BIGBATCH_HD inline float lerp_as_aten(float a, float b, float t) {
  const float d = b - a;
  const float low = a + t * d;
  const float high = b - d * (1.0f - t);
  return fabsf(t) < 0.5f ? low : high;
}

struct ScheduleFreeElement {
  float y;
  float z;
  float v;
};

/// One element of the step (kAdaptive: AdamW, else SGD).
template <bool kAdaptive>
BIGBATCH_HD inline ScheduleFreeElement schedule_free_element(float g, float y, float z, float v,
                                                             const ScheduleFreeStep& s) {
  float u = g;
  if (kAdaptive) {
    v = v * s.beta2 + s.one_minus_beta2 * (g * g);   // v = b2*v + (1-b2)*g^2
    u = g / (sqrtf(v / s.bias_correction2) + s.eps);  // g / (sqrt(v/bc2) + eps)
  }
  u = u + s.decay * y;                                // decay at y
  y = lerp_as_aten(y, z, s.c);                        // toward z by c
  y = y + s.y_step * u;
  z = z - s.lr * u;
  return {y, z, v};
}

// ------------------------------------------------------------ the plan ----

/// Before the update: the skip decision (when asked for), then for each
/// tensor that steps, its count, largest rate and weight sum.
struct ScheduleFreeFinalize {
  bool check_skip;

  BIGBATCH_HD_TEMPLATE
  template <typename Block>
  BIGBATCH_HD void operator()(const Table<ScheduleFreeGroup>& table, const Block& block) const {
    const bool skip = check_skip && decide_skip(table, 0, block);
    for (int t = block.first(); t < table.num_tensors; t += block.stride()) {
      table.ratio[t] = recorded_ratio(0, /*adapted=*/false, skip);  // no trust ratio
      if (skip) continue;
      const ScheduleFreeGroup& o = table.groups[table.slots[t].group];
      const std::int64_t k = table.steps[t] + 1;
      double* carry = table.carry + kCarried * t;
      const double lr = schedule_free_rate(o, k);
      const double lr_max = lr > carry[kLrMax] ? lr : carry[kLrMax];
      carry[kLrMax] = lr_max;
      carry[kWeightSum] += schedule_free_weight(o, k, lr_max);
      table.steps[t] = k;
    }
  }
};

/// The update: reads y g z (v), writes y z (v).
template <bool kAdaptive>
struct ScheduleFreeApplyPass {
  static constexpr PassArrays kArrays{kAdaptive ? (kParam | kGrad | kM | kV) : (kParam | kGrad | kM),
                                      kAdaptive ? (kParam | kM | kV) : (kParam | kM)};
  static constexpr bool kReduce = false;
  bool check_skip;

  struct Op {
    ScheduleFreeStep s;
    BIGBATCH_HD void operator()(float& w, float& g, float& m, float& v, float (&)[2]) const {
      const ScheduleFreeElement e = schedule_free_element<kAdaptive>(g, w, m, v, s);
      w = e.y;
      m = e.z;
      if (kAdaptive) v = e.v;
    }
  };
  BIGBATCH_HD Op element_op(const Table<ScheduleFreeGroup>& table, int t, const Slot& s) const {
    return {schedule_free_step_of(table.groups[s.group], table.steps[t], table.carry + kCarried * t)};
  }
};

/// Schedule-Free's step: [||g||^2 -> skip decision] -> y, z (, v). AdamW
/// moves 28 bytes per fp32 parameter (SGD 20), 4 more with the first pass.
/// Every group of one optimizer is AdamW or every one SGD (one plan each).
template <bool kAdaptive>
struct ScheduleFreePlan {
  using Group = ScheduleFreeGroup;

  struct Config {
    bool check_skip = false;  ///< some group has skip_nonfinite
  };
  static Config configure(const Group* groups, int n) { return {any_skip_nonfinite(groups, n)}; }

  template <typename Runner>
  static void run(Runner& runner, const Config& c) {
    if (c.check_skip) runner.pass(SquaresPass<false>{});
    runner.finalize(ScheduleFreeFinalize{c.check_skip});
    runner.pass(ScheduleFreeApplyPass<kAdaptive>{c.check_skip});
  }
};

using ScheduleFreeAdamWPlan = ScheduleFreePlan<true>;
using ScheduleFreeSGDPlan = ScheduleFreePlan<false>;

}  // namespace bigbatch::kernels
