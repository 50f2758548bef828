// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms",
// arXiv:2302.06675, Algorithm 2), as docs/formulas.md:
//   c = b1*m + (1-b1)*g                  the interpolation the update takes the sign of
//   w = w*(1 - lr*wd) - lr*sign(c)       decoupled weight decay, then the signed step
//   m = b2*m + (1-b2)*g                  the second interpolation, the state kept
// Every element's step has the same size lr: no moments to divide by, no norm.
#pragma once

#include "common.h"
#include "plan.h"

#include <tuple>

namespace bigbatch::kernels {

struct LionStep {
  float beta1 = 0.9f;
  float one_minus_beta1 = 0.1f;  ///< 1 - b1, rounded once
  float beta2 = 0.99f;
  float one_minus_beta2 = 0.01f;  ///< 1 - b2, rounded once
  float decay = 1;               ///< 1 - lr*wd, rounded once
  float lr = 1e-4f;
};

struct LionElement {
  float w;
  float m;
};

/// sign(x) as ATen's sign: 1, -1, or 0 for zero and for NaN (a NaN reaches
/// here only without skip_nonfinite; then m becomes NaN and w only decays).
/// Written as the difference of two comparisons, not as nested conditionals:
/// GCC if-converts neither form of those, and a branch in the loop kept the
/// whole update pass scalar (8x slower than a copy of its bytes).
BIGBATCH_HD inline float sign_of(float x) { return static_cast<float>(x > 0.0f) - static_cast<float>(x < 0.0f); }

/// One element of Lion's step, each product rounded as the reference path's ops.
BIGBATCH_HD inline LionElement lion_element(float g, float w, float m, const LionStep& s) {
  const float c = s.beta1 * m + s.one_minus_beta1 * g;  // c = b1*m + (1-b1)*g
  w = w * s.decay;                                      // w = w*(1 - lr*wd)
  w = w - s.lr * sign_of(c);                            // w = w - lr*sign(c)
  m = s.beta2 * m + s.one_minus_beta2 * g;              // m = b2*m + (1-b2)*g
  return {w, m};
}

// ------------------------------------------------------------ the plan ----

/// One parameter group's options as the Lion plan takes them (docs/formulas.md).
struct LionGroup {
  double lr = 0;
  double beta1 = 0;
  double beta2 = 0;
  double weight_decay = 0;
  bool skip_nonfinite = false;
};

/// Every member, by a structured binding (a member left out does not compile).
inline auto fields(const LionGroup& o) {
  const auto& [lr, beta1, beta2, weight_decay, skip_nonfinite] = o;
  return std::tie(lr, beta1, beta2, weight_decay, skip_nonfinite);
}

/// The coefficients of a group's step, rounded to fp32 once from double.
BIGBATCH_HD inline LionStep lion_step_of(const LionGroup& o) {
  LionStep s;
  s.beta1 = static_cast<float>(o.beta1);
  s.one_minus_beta1 = static_cast<float>(1 - o.beta1);
  s.beta2 = static_cast<float>(o.beta2);
  s.one_minus_beta2 = static_cast<float>(1 - o.beta2);
  s.decay = static_cast<float>(1 - o.lr * o.weight_decay);
  s.lr = static_cast<float>(o.lr);
  return s;
}

/// Before the update: the skip decision (when asked for, from the gradient
/// norms of the first pass), each tensor's step count; no trust ratio.
struct LionFinalize {
  bool check_skip;

  BIGBATCH_HD_TEMPLATE
  template <typename Block>
  BIGBATCH_HD void operator()(const Table<LionGroup>& table, const Block& block) const {
    const bool skip = check_skip && decide_skip(table, 0, block);
    for (int t = block.first(); t < table.num_tensors; t += block.stride()) {
      if (!skip) table.steps[t] += 1;
      table.ratio[t] = recorded_ratio(0, /*adapted=*/false, skip);  // Lion has no trust ratio
    }
  }
};

/// The update: reads w g m, writes w m.
struct LionApplyPass {
  static constexpr PassArrays kArrays{kParam | kGrad | kM, kParam | kM};
  static constexpr bool kReduce = false;
  bool check_skip;

  struct Op {
    LionStep s;
    BIGBATCH_HD void operator()(float& w, float& g, float& m, float&, float (&)[2]) const {
      const LionElement e = lion_element(g, w, m, s);
      w = e.w;
      m = e.m;
    }
  };
  BIGBATCH_HD Op element_op(const Table<LionGroup>& table, int, const Slot& s) const {
    return {lion_step_of(table.groups[s.group])};
  }
};

/// Lion's step: [||g||^2 -> skip decision] -> w, m. 20 bytes per fp32
/// parameter, 24 with the first pass (skip_nonfinite).
struct LionPlan {
  using Group = LionGroup;

  struct Config {
    bool check_skip = false;  ///< some group has skip_nonfinite
  };
  static Config configure(const Group* groups, int n) { return {any_skip_nonfinite(groups, n)}; }

  template <typename Runner>
  static void run(Runner& runner, const Config& c) {
    if (c.check_skip) runner.pass(SquaresPass<false>{});
    runner.finalize(LionFinalize{c.check_skip});
    runner.pass(LionApplyPass{c.check_skip});
  }
};

}  // namespace bigbatch::kernels
