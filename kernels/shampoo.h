// The elementwise parts of Shampoo with grafting (Gupta et al. 2018; the
// design of Shi et al. 2023, arXiv:2309.06497), as docs/formulas.md. The
// factor products, inverse roots and the preconditioning of each block are
// batched matrix products in ATen (optimizers/shampoo.cpp), between the two
// passes:
//   graft pass:  m = b1*m + (1-b1)*g                (the filtered gradient; b1 = 0: m = g)
//                v = vb*v + vw*g^2                  (the graft's: Adam/RMSprop vb = b, vw = 1-b;
//                                                    AdaGrad vb = vw = 1)
//                D = c1*m / (sqrt(c2*v) + eps)      (SGD grafting or none: D = c1*m)
//                c1 = 1/(1-b1^t) with bias correction, c2 = 1/(1-b^t) for Adam's
//   ... S: each block's m preconditioned by its factors' inverse roots and
//       scaled to the norm of D's block (before the start step: S = D) ...
//   apply pass:  d = S + wd*w                        (decoupled weight decay; 0 when coupled)
//                u = mu*u + (1-dampening)*d          (the momentum buffer)
//                w = w - lr*(a*d + b*u)              (Nesterov a = 1-dampening, b = mu; heavy
//                                                     ball a = 0, b = 1; no momentum a = 1, b = 0)
// The graft pass binds D as the slot's parameter (fp32, written) and the
// fp32 gradient as its gradient; where there is no filtered state (b1 = 0)
// the gradient buffer is also its m, and where the graft keeps no statistic
// v is a scratch buffer. The apply pass binds S as the slot's m and the
// momentum buffer as its v (S itself where there is no momentum: written
// after it is read, never read again).
#pragma once

#include "common.h"
#include "plan.h"

#include <tuple>

namespace bigbatch::kernels {

/// One group of the graft pass: a parameter group's grafting at one step.
struct ShampooGraftGroup {
  double beta1 = 0.9;          ///< the filtered gradient's rate (0: m = g)
  double v_decay = 0.999;      ///< vb above
  double v_weight = 0.001;     ///< vw above
  double m_scale = 1;          ///< c1
  double v_scale = 1;          ///< c2
  double eps = 1e-8;
  bool divide = true;          ///< false: D = c1*m (SGD grafting, or none)
  bool skip_nonfinite = false;  ///< unused: Shampoo decides the skip before its passes
};

inline auto fields(const ShampooGraftGroup& o) {
  const auto& [beta1, v_decay, v_weight, m_scale, v_scale, eps, divide, skip_nonfinite] = o;
  return std::tie(beta1, v_decay, v_weight, m_scale, v_scale, eps, divide, skip_nonfinite);
}

struct ShampooGraftStep {
  float b1 = 0.9f, one_minus_b1 = 0.1f;
  float vb = 0.999f, vw = 0.001f;
  float c1 = 1, c2 = 1, eps = 1e-8f;
  bool divide = true;
};

BIGBATCH_HD inline ShampooGraftStep shampoo_graft_step(const ShampooGraftGroup& o) {
  ShampooGraftStep s;
  s.b1 = static_cast<float>(o.beta1);
  s.one_minus_b1 = static_cast<float>(1 - o.beta1);
  s.vb = static_cast<float>(o.v_decay);
  s.vw = static_cast<float>(o.v_weight);
  s.c1 = static_cast<float>(o.m_scale);
  s.c2 = static_cast<float>(o.v_scale);
  s.eps = static_cast<float>(o.eps);
  s.divide = o.divide;
  return s;
}

/// Reads g, m and v; writes m, v and D (the slot's parameter, fp32).
struct ShampooGraftPass {
  static constexpr PassArrays kArrays{kGrad | kM | kV, kParam | kM | kV};
  static constexpr bool kReduce = false;
  static constexpr bool check_skip = false;

  struct Op {
    ShampooGraftStep s;
    BIGBATCH_HD void operator()(float& d, float& g, float& m, float& v, float (&)[2]) const {
      m = s.b1 * m + s.one_minus_b1 * g;  // m = b1*m + (1-b1)*g
      v = s.vb * v + s.vw * g * g;        // v = vb*v + vw*g^2
      d = s.divide ? s.c1 * m / (sqrtf(s.c2 * v) + s.eps) : s.c1 * m;
    }
  };
  BIGBATCH_HD Op element_op(const Table<ShampooGraftGroup>& table, int, const Slot& s) const {
    return {shampoo_graft_step(table.groups[s.group])};
  }
};

/// The filtered gradient and the graft's direction: 20 bytes per fp32
/// element (g read, D written, m and v read and written).
struct ShampooGraftPlan {
  using Group = ShampooGraftGroup;
  struct Config {};
  static Config configure(const Group*, int) { return {}; }

  template <typename Runner>
  static void run(Runner& runner, const Config&) {
    runner.pass(ShampooGraftPass{});
  }
};

/// One group of the apply pass.
struct ShampooApplyGroup {
  double lr = 0.01;
  double weight_decay = 0;  ///< decoupled only (coupled decay is in g)
  double momentum = 0;
  double dampening = 0;
  bool nesterov = false;
  bool skip_nonfinite = false;  ///< unused, as above
};

inline auto fields(const ShampooApplyGroup& o) {
  const auto& [lr, weight_decay, momentum, dampening, nesterov, skip_nonfinite] = o;
  return std::tie(lr, weight_decay, momentum, dampening, nesterov, skip_nonfinite);
}

struct ShampooApplyStep {
  float lr = 0.01f, wd = 0, mu = 0, one_minus_dampening = 1;
  float a = 1, b = 0;  ///< u = a*d + b*buffer
};

BIGBATCH_HD inline ShampooApplyStep shampoo_apply_step(const ShampooApplyGroup& o) {
  ShampooApplyStep s;
  s.lr = static_cast<float>(o.lr);
  s.wd = static_cast<float>(o.weight_decay);
  s.mu = static_cast<float>(o.momentum);
  s.one_minus_dampening = static_cast<float>(1 - o.dampening);
  if (o.momentum == 0) {
    s.a = 1;
    s.b = 0;
  } else if (o.nesterov) {
    s.a = s.one_minus_dampening;
    s.b = s.mu;
  } else {
    s.a = 0;
    s.b = 1;
  }
  return s;
}

/// Reads w, S (the slot's m) and the momentum buffer (its v); writes w and
/// the buffer.
struct ShampooApplyPass {
  static constexpr PassArrays kArrays{kParam | kM | kV, kParam | kV};
  static constexpr bool kReduce = false;
  static constexpr bool check_skip = false;

  struct Op {
    ShampooApplyStep s;
    BIGBATCH_HD void operator()(float& w, float&, float& direction, float& u, float (&)[2]) const {
      const float d = direction + s.wd * w;          // d = S + wd*w
      u = s.mu * u + s.one_minus_dampening * d;      // u = mu*u + (1-dampening)*d
      w = w - s.lr * (s.a * d + s.b * u);            // w = w - lr*(a*d + b*u)
    }
  };
  BIGBATCH_HD Op element_op(const Table<ShampooApplyGroup>& table, int, const Slot& s) const {
    return {shampoo_apply_step(table.groups[s.group])};
  }
};

/// The update: 16 bytes per fp32 element (w and the buffer read and
/// written, S read).
struct ShampooApplyPlan {
  using Group = ShampooApplyGroup;
  struct Config {};
  static Config configure(const Group*, int) { return {}; }

  template <typename Runner>
  static void run(Runner& runner, const Config&) {
    runner.pass(ShampooApplyPass{});
  }
};

}  // namespace bigbatch::kernels
