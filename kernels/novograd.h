// NovoGrad (Ginsburg et al. 2019, arXiv:1905.11286), as docs/formulas.md. The
// per-tensor second moment v is a scalar the host updates from ||g||^2; the
// element pass is
//   d = (g / denom + wd*w) * grad_factor;  m = b1*m + d;  w = w - lr*m
// with denom = sqrt(v) + eps and grad_factor = grad_averaging ? 1 - b1 : 1.
#pragma once

#include "common.h"
#include "plan.h"

#include <math.h>

#include <tuple>

namespace bigbatch::kernels {

struct NovoGradStep {
  float beta1 = 0.95f;
  float denom = 1;
  float weight_decay = 0;
  float grad_factor = 1;
  float lr = 1e-3f;
};

struct NovoGradElement {
  float m;
  float w;
};

/// One element of NovoGrad's step.
BIGBATCH_HD inline NovoGradElement novograd_element(float g, float w, float m, const NovoGradStep& s) {
  const float d = (g / s.denom + s.weight_decay * w) * s.grad_factor;  // d = (g/denom + wd*w)*f
  m = s.beta1 * m + d;                                                // m = b1*m + d
  return {m, w - s.lr * m};                                           // w = w - lr*m
}

// ------------------------------------------------------------ the plan ----

/// One parameter group's options as the NovoGrad plan takes them (docs/formulas.md).
struct NovoGradGroup {
  double lr = 0;
  double beta1 = 0;
  double beta2 = 0;
  double eps = 0;
  double weight_decay = 0;
  bool grad_averaging = false;
  bool skip_nonfinite = false;
};

/// Every member, by a structured binding (a member left out does not compile).
inline auto fields(const NovoGradGroup& o) {
  const auto& [lr, beta1, beta2, eps, weight_decay, grad_averaging, skip_nonfinite] = o;
  return std::tie(lr, beta1, beta2, eps, weight_decay, grad_averaging, skip_nonfinite);
}

/// v*b2 + x in fp32 with both roundings, as the reference path's mul_ then add_
/// (nvcc would contract it into one FMA; g++ does not without FMA instructions
/// enabled, which no build here enables).
BIGBATCH_HD inline float scaled_add_rn(float v, float b2, float x) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(__fmul_rn(v, b2), x);
#else
  return v * b2 + x;
#endif
}

/// After the norms: the skip decision; then, unless skipped, each tensor's
/// step count and v = n at its first step, else b2*v + (1-b2)*n (fp32, as the
/// reference path rounds it); the update's denominator sqrt(v) + eps; no
/// trust ratio.
struct NovoGradMomentFinalize {
  BIGBATCH_HD_TEMPLATE
  template <typename Block>
  BIGBATCH_HD void operator()(const Table<NovoGradGroup>& table, const Block& block) const {
    const bool skip = decide_skip(table, 0, block);
    for (int t = block.first(); t < table.num_tensors; t += block.stride()) {
      const Slot& s = table.slots[t];
      const NovoGradGroup& o = table.groups[s.group];
      float v = *s.v;
      if (!skip) {
        table.steps[t] += 1;
        const double g_norm = sqrt(block.read(table.sums + 2 * t));
        const double n = g_norm * g_norm;  // ||g||^2 as the reference path forms it
        if (table.steps[t] == 1) {
          v = static_cast<float>(n);
        } else {
          v = scaled_add_rn(v, static_cast<float>(o.beta2), static_cast<float>(n * (1 - o.beta2)));
        }
        *s.v = v;
      }
      table.coef[t] = sqrtf(v) + static_cast<float>(o.eps);
      table.ratio[t] = recorded_ratio(0, /*adapted=*/false, skip);  // NovoGrad has no trust ratio
    }
  }
};

/// The update: reads w g m, writes m w.
struct NovoGradApplyPass {
  static constexpr PassArrays kArrays{kParam | kGrad | kM, kParam | kM};
  static constexpr bool kReduce = false;
  bool check_skip;

  struct Op {
    NovoGradStep s;
    BIGBATCH_HD void operator()(float& w, float& g, float& m, float&, float (&)[2]) const {
      const NovoGradElement e = novograd_element(g, w, m, s);
      m = e.m;
      w = e.w;
    }
  };
  BIGBATCH_HD Op element_op(const Table<NovoGradGroup>& table, int t, const Slot& s) const {
    const NovoGradGroup& o = table.groups[s.group];
    NovoGradStep step;
    step.beta1 = static_cast<float>(o.beta1);
    step.denom = table.coef[t];
    step.weight_decay = static_cast<float>(o.weight_decay);
    step.grad_factor = static_cast<float>(o.grad_averaging ? 1 - o.beta1 : 1.0);
    step.lr = static_cast<float>(o.lr);
    return {step};
  }
};

/// NovoGrad's step: ||g||^2 -> the layer's scalar second moment -> d, m, w.
/// 24 bytes per fp32 parameter.
struct NovoGradPlan {
  using Group = NovoGradGroup;

  struct Config {
    bool check_skip = false;  ///< some group has skip_nonfinite
  };
  static Config configure(const Group* groups, int n) { return {any_skip_nonfinite(groups, n)}; }

  template <typename Runner>
  static void run(Runner& runner, const Config& c) {
    runner.pass(SquaresPass<false>{});
    runner.finalize(NovoGradMomentFinalize{});
    runner.pass(NovoGradApplyPass{c.check_skip});
  }
};

}  // namespace bigbatch::kernels
