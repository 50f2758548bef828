// The momentum update shared by LARS and LARC (docs/formulas.md). Both are
//   d = g + wd*w;  v = momentum*v + scale*d;  w = w - step_size*(nesterov ? momentum*v + scale*d : v)
// LARS: scale = lr*ratio, step_size = 1 (the rate sits inside the buffer).
// LARC: scale = min(local/lr, 1) or local, step_size = lr (PyTorch's SGD form).
#pragma once

#include "common.h"
#include "plan.h"

#include <tuple>

namespace bigbatch::kernels {

struct MomentumStep {
  float scale = 1;         ///< multiplies d before it enters the buffer
  float step_size = 1;     ///< multiplies the buffer when it leaves it
  float momentum = 0.9f;
  float weight_decay = 0;
  bool nesterov = false;
};

struct MomentumElement {
  float v;
  float w;
};

/// One element of the momentum update.
BIGBATCH_HD inline MomentumElement momentum_element(float g, float w, float v, const MomentumStep& s) {
  const float d = g + s.weight_decay * w;                 // d = g + wd*w
  v = s.momentum * v + s.scale * d;                       // v = mu*v + scale*d
  // plain: w -= step*v;  nesterov: w -= step*(mu*v + scale*d)
  const float look = s.nesterov ? s.momentum * v + s.scale * d : v;
  return {v, w - s.step_size * look};
}

/// LARS's trust ratio (double): tc*||w|| / (||g|| + wd*||w|| + eps) where
/// `adapt`, 1 where ||w|| or ||g|| is 0 (docs/formulas.md). LARS scales by lr*ratio.
BIGBATCH_HD inline double lars_trust_ratio(double w_norm, double g_norm, bool adapt, double tc,
                                           double wd, double eps) {
  if (!adapt || w_norm == 0 || g_norm == 0) return 1.0;
  return tc * w_norm / (g_norm + wd * w_norm + eps);
}

/// LARC's scale (double): the local rate tc*||w|| / (||g|| + wd*||w|| + eps),
/// with clip min(local / lr, 1); 1 where `adapt` is false or a norm is 0.
BIGBATCH_HD inline double larc_scale(double w_norm, double g_norm, bool adapt, bool clip,
                                     double lr, double tc, double wd, double eps) {
  if (!adapt || w_norm == 0 || g_norm == 0) return 1.0;
  const double local = tc * w_norm / (g_norm + wd * w_norm + eps);
  if (!clip) return local;
  return 1.0 < local / lr ? 1.0 : local / lr;  // std::min(local / lr, 1)
}

// ----------------------------------------------------------- the plans ----

/// One parameter group's options as the LARS plan takes them (docs/formulas.md).
struct LarsGroup {
  double lr = 0;
  double momentum = 0;
  double weight_decay = 0;
  double trust_coefficient = 0;
  double eps = 0;
  bool nesterov = false;
  bool adapt = false;
  bool skip_nonfinite = false;
};

/// LARC's: LARS's and clip.
struct LarcGroup {
  double lr = 0;
  double momentum = 0;
  double weight_decay = 0;
  double trust_coefficient = 0;
  double eps = 0;
  bool nesterov = false;
  bool adapt = false;
  bool clip = false;
  bool skip_nonfinite = false;
};

/// Every member, by a structured binding: a member added to the struct and not
/// here is a compile error, not an option change the engine misses.
inline auto fields(const LarsGroup& o) {
  const auto& [lr, momentum, weight_decay, trust_coefficient, eps, nesterov, adapt, skip_nonfinite] = o;
  return std::tie(lr, momentum, weight_decay, trust_coefficient, eps, nesterov, adapt, skip_nonfinite);
}
inline auto fields(const LarcGroup& o) {
  const auto& [lr, momentum, weight_decay, trust_coefficient, eps, nesterov, adapt, clip, skip_nonfinite] = o;
  return std::tie(lr, momentum, weight_decay, trust_coefficient, eps, nesterov, adapt, clip, skip_nonfinite);
}

/// The trust ratio of a tensor: LARS's ratio, LARC's clipped local rate over lr.
BIGBATCH_HD inline double momentum_ratio(const LarsGroup& o, double w_norm, double g_norm) {
  return lars_trust_ratio(w_norm, g_norm, o.adapt, o.trust_coefficient, o.weight_decay, o.eps);
}
BIGBATCH_HD inline double momentum_ratio(const LarcGroup& o, double w_norm, double g_norm) {
  return larc_scale(w_norm, g_norm, o.adapt, o.clip, o.lr, o.trust_coefficient, o.weight_decay, o.eps);
}

/// What enters the buffer per unit of d: LARS lr*ratio (the rate inside the
/// buffer), LARC the ratio itself.
BIGBATCH_HD inline double momentum_scale(const LarsGroup& o, double ratio) { return o.lr * ratio; }
BIGBATCH_HD inline double momentum_scale(const LarcGroup&, double ratio) { return ratio; }

/// What multiplies the buffer when it leaves it: LARS 1, LARC lr.
BIGBATCH_HD inline float momentum_step_size(const LarsGroup&) { return 1.0f; }
BIGBATCH_HD inline float momentum_step_size(const LarcGroup& o) { return static_cast<float>(o.lr); }

/// After the norms: the skip decision, each tensor's trust ratio and scale.
template <typename Group>
struct MomentumScaleFinalize {
  BIGBATCH_HD_TEMPLATE
  template <typename Block>
  BIGBATCH_HD void operator()(const Table<Group>& table, const Block& block) const {
    const bool skip = decide_skip(table, 0, block);
    for (int t = block.first(); t < table.num_tensors; t += block.stride()) {
      const Group& o = table.groups[table.slots[t].group];
      const double g_norm = sqrt(block.read(table.sums + 2 * t));
      const double w_norm = sqrt(block.read(table.sums + 2 * t + 1));
      const double ratio = momentum_ratio(o, w_norm, g_norm);
      table.coef[t] = static_cast<float>(momentum_scale(o, ratio));
      table.ratio[t] = recorded_ratio(ratio, o.adapt, skip);
    }
  }
};

/// The update: reads w g v, writes v w.
template <typename Group>
struct MomentumApplyPass {
  static constexpr PassArrays kArrays{kParam | kGrad | kM, kParam | kM};
  static constexpr bool kReduce = false;
  bool check_skip;

  struct Op {
    MomentumStep s;
    BIGBATCH_HD void operator()(float& w, float& g, float& v, float&, float (&)[2]) const {
      const MomentumElement e = momentum_element(g, w, v, s);
      v = e.v;
      w = e.w;
    }
  };
  BIGBATCH_HD Op element_op(const Table<Group>& table, int t, const Slot& s) const {
    const Group& o = table.groups[s.group];
    return {MomentumStep{table.coef[t], momentum_step_size(o), static_cast<float>(o.momentum),
                         static_cast<float>(o.weight_decay), o.nesterov}};
  }
};

/// The step of LARS (Group = LarsGroup) and LARC (LarcGroup): ||w||, ||g|| ->
/// per-tensor scale -> d = g + wd*w, v = mu*v + scale*d, w -= step*v.
/// 28 bytes per fp32 parameter.
template <typename Group_>
struct MomentumPlan {
  using Group = Group_;

  struct Config {
    bool check_skip = false;  ///< some group has skip_nonfinite
  };
  static Config configure(const Group* groups, int n) { return {any_skip_nonfinite(groups, n)}; }

  template <typename Runner>
  static void run(Runner& runner, const Config& c) {
    runner.pass(SquaresPass<true>{});
    runner.finalize(MomentumScaleFinalize<Group>{});
    runner.pass(MomentumApplyPass<Group>{c.check_skip});
  }
};

using LarsPlan = MomentumPlan<LarsGroup>;
using LarcPlan = MomentumPlan<LarcGroup>;

}  // namespace bigbatch::kernels
