// LAMB (You et al. 2019, arXiv:1904.00962, Algorithm 2), as docs/formulas.md:
//   g' = g*grad_scale (+ wd*w unless adam_w_mode)
//   m = b1*m + b3*g';  v = b2*v + (1-b2)*g'^2
//   u = (m/bc1) / (sqrt(v/bc2) + eps) (+ wd*w in adam_w_mode)
//   w = w - lr*ratio*u,   ratio from ||w|| and ||u|| (needs a norm pass first)
#pragma once

#include "common.h"
#include "plan.h"

#include <math.h>

#include <tuple>

namespace bigbatch::kernels {

struct LambStep {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float beta3 = 0.1f;              ///< grad_averaging ? 1 - beta1 : 1
  float one_minus_beta2 = 0.001f;  ///< 1 - beta2, rounded once
  float inv_bias_correction1 = 1;  ///< 1 / (1 - beta1^t), or 1 without bias correction
  float inv_bias_correction2 = 1;  ///< 1 / (1 - beta2^t), or 1
  float eps = 1e-6f;
  float l2_decay = 0;              ///< wd without adam_w_mode, else 0 (enters the moments)
  float decoupled_decay = 0;       ///< wd in adam_w_mode, else 0 (added to the update)
  float grad_scale = 1;            ///< global clipping: 1 / max(1, G / max_grad_norm)
};

struct LambNorms {
  double w_sq = 0;  ///< ||w||^2
  double g_sq = 0;  ///< ||g||^2 of the raw gradient (finite iff g is)
  double u_sq = 0;  ///< ||u||^2 of the update the step would apply
};

/// The coefficients of a tensor's step number t (1-based), rounded to fp32
/// once from double: beta3 = grad_averaging ? 1 - b1 : 1; the bias
/// corrections as reciprocals 1 / (1 - b^t), or 1 without bias correction;
/// grad_scale from global clipping.
BIGBATCH_HD inline LambStep lamb_step(double beta1, double beta2, bool grad_averaging,
                                      bool bias_correction, double eps, double weight_decay,
                                      bool adam_w_mode, std::int64_t t, double grad_scale) {
  LambStep s;
  s.beta1 = static_cast<float>(beta1);
  s.beta2 = static_cast<float>(beta2);
  s.beta3 = static_cast<float>(grad_averaging ? 1 - beta1 : 1.0);
  s.one_minus_beta2 = static_cast<float>(1 - beta2);
  s.inv_bias_correction1 = static_cast<float>(bias_correction ? 1 / (1 - pow(beta1, static_cast<double>(t))) : 1.0);
  s.inv_bias_correction2 = static_cast<float>(bias_correction ? 1 / (1 - pow(beta2, static_cast<double>(t))) : 1.0);
  s.eps = static_cast<float>(eps);
  // Both decays as factors, one of them 0, rather than a branch on
  // adam_w_mode per element: x + 0*w is x for finite w, and the loop stays
  // straight-line code the CPU vectorizes.
  s.l2_decay = static_cast<float>(adam_w_mode ? 0.0 : weight_decay);
  s.decoupled_decay = static_cast<float>(adam_w_mode ? weight_decay : 0.0);
  s.grad_scale = static_cast<float>(grad_scale);
  return s;
}

/// The update direction u of docs/formulas.md from the moments already updated:
///   u = (m / bc1) / (sqrt(v / bc2) + eps)  (+ wd*w in adam_w_mode)
/// with the bias corrections multiplied as reciprocals rounded once: one
/// division and one square root per element instead of three and one (the
/// divider is what bounds a LAMB step on the CPU), at most an ulp or two from
/// the reference path's divisions.
BIGBATCH_HD inline float lamb_direction(float m, float v, float w, const LambStep& s) {
  const float u = (m * s.inv_bias_correction1) /          // mh / (sqrt(vh) + eps)
                  (sqrtf(v * s.inv_bias_correction2) + s.eps);
  return u + s.decoupled_decay * w;                       // decoupled decay (adam_w_mode)
}

struct LambElement {
  float m;
  float v;
  float u;
};

/// One element of a LAMB step: the new moments and the update direction.
/// Every pass that needs u calls this (or lamb_direction on stored moments),
/// so the update a norm pass measured is bit for bit the one applied.
BIGBATCH_HD inline LambElement lamb_element(float g, float w, float m, float v, const LambStep& s) {
  g = g * s.grad_scale;                                   // global-norm clipping
  g = g + s.l2_decay * w;                                 // L2 decay enters the moments
  m = s.beta1 * m + s.beta3 * g;                          // m = b1*m + b3*g
  v = s.beta2 * v + s.one_minus_beta2 * (g * g);          // v = b2*v + (1-b2)*g^2
  return {m, v, lamb_direction(m, v, w, s)};
}

/// Whether a LAMB group scales its update by the trust ratio (docs/formulas.md):
/// adapt, and a weight decay or always_adapt (NVLAMB).
BIGBATCH_HD inline bool lamb_uses_ratio(bool adapt, double weight_decay, bool always_adapt) {
  return adapt && (weight_decay != 0 || always_adapt);
}

/// The trust ratio of docs/formulas.md from ||w|| and ||u|| (in double):
/// ||w|| / ||u|| where `use_ratio` (adapt, and wd != 0 or always_adapt), 1 where
/// either norm is 0; clamped to [min_trust, max_trust], and to <= 1 with trust_clip.
BIGBATCH_HD inline double lamb_trust_ratio(double w_norm, double u_norm, bool use_ratio,
                                           double min_trust, double max_trust, bool trust_clip) {
  if (!use_ratio) return 1.0;
  double ratio = (w_norm == 0 || u_norm == 0) ? 1.0 : w_norm / u_norm;
  ratio = ratio < min_trust ? min_trust : (ratio > max_trust ? max_trust : ratio);
  return trust_clip && ratio > 1.0 ? 1.0 : ratio;
}

// ------------------------------------------------------------ the plan ----

/// One parameter group's options as the LAMB plan takes them (docs/formulas.md).
/// Doubles, so that every runner rounds the per-tensor coefficients as the
/// reference path does.
struct LambGroup {
  double lr = 0;
  double beta1 = 0;
  double beta2 = 0;
  double eps = 0;
  double weight_decay = 0;
  double max_grad_norm = 0;  ///< 0: no global clipping
  double min_trust = 0;
  double max_trust = 0;
  bool bias_correction = false;
  bool grad_averaging = false;
  bool adam_w_mode = false;
  bool always_adapt = false;
  bool trust_clip = false;
  bool adapt = false;
  bool skip_nonfinite = false;
};

/// Every member, by a structured binding: a member added to LambGroup and not
/// here is a compile error, not an option change the engine misses.
inline auto fields(const LambGroup& o) {
  const auto& [lr, beta1, beta2, eps, weight_decay, max_grad_norm, min_trust, max_trust, bias_correction,
               grad_averaging, adam_w_mode, always_adapt, trust_clip, adapt, skip_nonfinite] = o;
  return std::tie(lr, beta1, beta2, eps, weight_decay, max_grad_norm, min_trust, max_trust, bias_correction,
                  grad_averaging, adam_w_mode, always_adapt, trust_clip, adapt, skip_nonfinite);
}

/// The coefficients of step `t` of a tensor in group `o`.
BIGBATCH_HD inline LambStep lamb_step_of(const LambGroup& o, std::int64_t t, double grad_scale) {
  return lamb_step(o.beta1, o.beta2, o.grad_averaging, o.bias_correction, o.eps, o.weight_decay,
                   o.adam_w_mode, t, grad_scale);
}

/// After the gradient norms: the skip decision, G over all tensors of all
/// groups, and each group's clipping factor 1 / max(1, G / max_grad_norm).
struct LambClipFinalize {
  BIGBATCH_HD_TEMPLATE
  template <typename Block>
  BIGBATCH_HD void operator()(const Table<LambGroup>& table, const Block& block) const {
    decide_skip(table, 0, block);
    double sq = 0;
    for (int t = block.first(); t < table.num_tensors; t += block.stride()) sq += block.read(table.sums + 2 * t);
    const double global_norm = sqrt(block.sum(sq));
    for (int g = block.first(); g < table.num_groups; g += block.stride()) {
      const double max_norm = table.groups[g].max_grad_norm;
      table.group_coef[g] = static_cast<float>(max_norm > 0 ? 1.0 / fmax(1.0, global_norm / max_norm) : 1.0);
    }
  }
};

/// Pass 2: the new moments stored; sums ||w||^2 and ||u||^2 (reads w g m v, writes m v).
struct LambMomentsPass {
  static constexpr PassArrays kArrays{kParam | kGrad | kM | kV, kM | kV};
  static constexpr bool kReduce = true;
  bool check_skip;
  bool clip;

  struct Op {
    LambStep s;
    BIGBATCH_HD void operator()(float& w, float& g, float& m, float& v, float (&sq)[2]) const {
      const LambElement e = lamb_element(g, w, m, v, s);
      m = e.m;
      v = e.v;
      sq[0] = w;    // ||w||^2
      sq[1] = e.u;  // ||u||^2
    }
  };
  BIGBATCH_HD Op element_op(const Table<LambGroup>& table, int t, const Slot& s) const {
    return {lamb_step_of(table.groups[s.group], table.steps[t] + 1, clip ? table.group_coef[s.group] : 1.0f)};
  }
};

/// After pass 2: each tensor's step count, trust ratio and lr * ratio.
struct LambRatioFinalize {
  bool check_skip;

  BIGBATCH_HD_TEMPLATE
  template <typename Block>
  BIGBATCH_HD void operator()(const Table<LambGroup>& table, const Block& block) const {
    const bool skip = check_skip && table.scalars->skip != 0;
    for (int t = block.first(); t < table.num_tensors; t += block.stride()) {
      const LambGroup& o = table.groups[table.slots[t].group];
      if (!skip) table.steps[t] += 1;
      const bool use_ratio = lamb_uses_ratio(o.adapt, o.weight_decay, o.always_adapt);
      const double ratio = lamb_trust_ratio(sqrt(block.read(table.sums + 2 * t)),
                                            sqrt(block.read(table.sums + 2 * t + 1)), use_ratio, o.min_trust,
                                            o.max_trust, o.trust_clip);
      table.coef[t] = static_cast<float>(o.lr * ratio);
      table.ratio[t] = recorded_ratio(ratio, use_ratio, skip);
    }
  }
};

/// Pass 3: w -= lr*ratio*u from the stored moments (reads w m v, writes w).
struct LambApplyPass {
  static constexpr PassArrays kArrays{kParam | kM | kV, kParam};
  static constexpr bool kReduce = false;
  bool check_skip;

  struct Op {
    LambStep s;
    float lr_ratio;
    BIGBATCH_HD void operator()(float& w, float&, float& m, float& v, float (&)[2]) const {
      w = w - lr_ratio * lamb_direction(m, v, w, s);  // w = w - lr*ratio*u
    }
  };
  BIGBATCH_HD Op element_op(const Table<LambGroup>& table, int t, const Slot& s) const {
    return {lamb_step_of(table.groups[s.group], table.steps[t], 1.0f), table.coef[t]};
  }
};

/// LAMB's step: [||g||^2 -> skip decision and global clipping] -> moments,
/// ||w||, ||u|| -> trust ratios -> w -= lr*ratio*u. 44 bytes per fp32
/// parameter with the first pass (skip_nonfinite or clipping), else 40.
struct LambPlan {
  using Group = LambGroup;

  struct Config {
    bool check_skip = false;  ///< some group has skip_nonfinite
    bool clip = false;        ///< some group has max_grad_norm > 0
  };
  static Config configure(const Group* groups, int n) {
    Config c;
    c.check_skip = any_skip_nonfinite(groups, n);
    for (int i = 0; i < n; ++i) c.clip = c.clip || groups[i].max_grad_norm > 0;
    return c;
  }

  template <typename Runner>
  static void run(Runner& runner, const Config& c) {
    if (c.check_skip || c.clip) {
      runner.pass(SquaresPass<false>{});
      runner.finalize(LambClipFinalize{});
    }
    runner.pass(LambMomentsPass{c.check_skip, c.clip});
    runner.finalize(LambRatioFinalize{c.check_skip});
    runner.pass(LambApplyPass{c.check_skip});
  }
};

}  // namespace bigbatch::kernels
