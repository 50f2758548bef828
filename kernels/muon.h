// The elementwise parts of Muon (Jordan et al. 2024; Liu et al. 2025,
// arXiv:2502.16982), as docs/formulas.md; the Newton-Schulz iteration between
// them is batched matrix products in ATen (optimizers/muon.cpp):
//   momentum pass:  m = mu*m + (1-mu)*g
//                   U = mu*m + (1-mu)*g (Nesterov), else U = m
//   ... O = NS(U), the orthogonalized direction ...
//   apply pass:     w = w*(1 - lr*wd) - scale*O      scale = lr * the shape's rule
// U and O live in one fp32 buffer per matrix (the slot's v, then its m), laid
// out by the optimizer as one batch per matrix shape.
#pragma once

#include "common.h"
#include "plan.h"

#include <tuple>

namespace bigbatch::kernels {

/// One group of the momentum pass.
struct MuonMomentumGroup {
  double momentum = 0;
  bool nesterov = false;
  bool skip_nonfinite = false;  ///< unused: Muon decides the skip before its passes
};

inline auto fields(const MuonMomentumGroup& o) {
  const auto& [momentum, nesterov, skip_nonfinite] = o;
  return std::tie(momentum, nesterov, skip_nonfinite);
}

struct MuonMomentumStep {
  float mu = 0.95f;
  float one_minus_mu = 0.05f;  ///< 1 - mu, rounded once
  float u_mu = 0.95f;          ///< Nesterov: mu, else 1
  float u_g = 0.05f;           ///< Nesterov: 1 - mu, else 0 (1*m + 0*g is m for finite g)
};

BIGBATCH_HD inline MuonMomentumStep muon_momentum_step(const MuonMomentumGroup& o) {
  MuonMomentumStep s;
  s.mu = static_cast<float>(o.momentum);
  s.one_minus_mu = static_cast<float>(1 - o.momentum);
  s.u_mu = o.nesterov ? s.mu : 1.0f;
  s.u_g = o.nesterov ? s.one_minus_mu : 0.0f;
  return s;
}

/// Reads g m, writes m and U (the slot's v).
struct MuonMomentumPass {
  static constexpr PassArrays kArrays{kGrad | kM, kM | kV};
  static constexpr bool kReduce = false;
  static constexpr bool check_skip = false;

  struct Op {
    MuonMomentumStep s;
    BIGBATCH_HD void operator()(float&, float& g, float& m, float& u, float (&)[2]) const {
      m = s.mu * m + s.one_minus_mu * g;  // m = mu*m + (1-mu)*g
      u = s.u_mu * m + s.u_g * g;         // U = mu*m + (1-mu)*g, or m
    }
  };
  BIGBATCH_HD Op element_op(const Table<MuonMomentumGroup>& table, int, const Slot& s) const {
    return {muon_momentum_step(table.groups[s.group])};
  }
};

/// Muon's momentum and the direction the iteration orthogonalizes: 12 bytes
/// per fp32 matrix element.
struct MuonMomentumPlan {
  using Group = MuonMomentumGroup;
  struct Config {};
  static Config configure(const Group*, int) { return {}; }

  template <typename Runner>
  static void run(Runner& runner, const Config&) {
    runner.pass(MuonMomentumPass{});
  }
};

/// One group of the apply pass: a parameter group's decay and one matrix
/// shape's scaled rate.
struct MuonApplyGroup {
  double decay = 1;  ///< 1 - lr*wd (the unadjusted rate, as PyTorch's Muon)
  double scale = 0;  ///< lr * sqrt(max(1, rows/cols)), or 0.2*lr*sqrt(max(rows, cols)), ...
  bool skip_nonfinite = false;  ///< unused, as above
};

inline auto fields(const MuonApplyGroup& o) {
  const auto& [decay, scale, skip_nonfinite] = o;
  return std::tie(decay, scale, skip_nonfinite);
}

/// Reads w and O (the slot's m), writes w.
struct MuonApplyPass {
  static constexpr PassArrays kArrays{kParam | kM, kParam};
  static constexpr bool kReduce = false;
  static constexpr bool check_skip = false;

  struct Op {
    float decay;
    float scale;
    BIGBATCH_HD void operator()(float& w, float&, float& o, float&, float (&)[2]) const {
      w = w * decay;      // decoupled decay
      w = w - scale * o;  // w = w - scale*O
    }
  };
  BIGBATCH_HD Op element_op(const Table<MuonApplyGroup>& table, int, const Slot& s) const {
    const MuonApplyGroup& o = table.groups[s.group];
    return {static_cast<float>(o.decay), static_cast<float>(o.scale)};
  }
};

/// The update from the orthogonalized direction: 12 bytes per fp32 element.
struct MuonApplyPlan {
  using Group = MuonApplyGroup;
  struct Config {};
  static Config configure(const Group*, int) { return {}; }

  template <typename Runner>
  static void run(Runner& runner, const Config&) {
    runner.pass(MuonApplyPass{});
  }
};

}  // namespace bigbatch::kernels
