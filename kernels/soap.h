// The elementwise part of SOAP (Vyas et al. 2024, arXiv:2409.11321): Adam's
// moments kept in the eigenbasis of Shampoo's factors, as docs/formulas.md.
// The rotations around it are batched matrix products in ATen
// (optimizers/soap.cpp):
//   ... G' = the gradient in the eigenbasis (fp32 buffer) ...
//   Adam pass:   m = b1*m + (1-b1)*G'
//                v = b2*v + (1-b2)*G'^2
//                N = m / (sqrt(v) + eps)        (written over G', in place)
//   ... U = N rotated back; optionally U / rms(U) ...
//   apply pass:  Muon's (muon.h): w = w*(1 - lr*wd) - s*(1 - lr*wd)*U,
//                s = lr * sqrt(1 - b2^t) / (1 - b1^t)
// The Adam pass binds the rotated buffer as both the slot's parameter (fp32,
// written) and its gradient (read): an element is read before it is written.
#pragma once

#include "common.h"
#include "plan.h"

#include <tuple>

namespace bigbatch::kernels {

/// One group of the Adam pass.
struct SoapAdamGroup {
  double beta1 = 0.95;
  double beta2 = 0.95;
  double eps = 1e-8;
  bool skip_nonfinite = false;  ///< unused: SOAP decides the skip before its passes
};

inline auto fields(const SoapAdamGroup& o) {
  const auto& [beta1, beta2, eps, skip_nonfinite] = o;
  return std::tie(beta1, beta2, eps, skip_nonfinite);
}

struct SoapAdamStep {
  float b1 = 0.95f, one_minus_b1 = 0.05f;
  float b2 = 0.95f, one_minus_b2 = 0.05f;
  float eps = 1e-8f;
};

BIGBATCH_HD inline SoapAdamStep soap_adam_step(const SoapAdamGroup& o) {
  SoapAdamStep s;
  s.b1 = static_cast<float>(o.beta1);
  s.one_minus_b1 = static_cast<float>(1 - o.beta1);
  s.b2 = static_cast<float>(o.beta2);
  s.one_minus_b2 = static_cast<float>(1 - o.beta2);
  s.eps = static_cast<float>(o.eps);
  return s;
}

/// Reads G' (the slot's gradient), m and v; writes m, v and N (the slot's
/// parameter: the same fp32 buffer as G').
struct SoapAdamPass {
  static constexpr PassArrays kArrays{kGrad | kM | kV, kParam | kM | kV};
  static constexpr bool kReduce = false;
  static constexpr bool check_skip = false;

  struct Op {
    SoapAdamStep s;
    BIGBATCH_HD void operator()(float& n, float& g, float& m, float& v, float (&)[2]) const {
      m = s.b1 * m + s.one_minus_b1 * g;      // m = b1*m + (1-b1)*G'
      v = s.b2 * v + s.one_minus_b2 * g * g;  // v = b2*v + (1-b2)*G'^2
      n = m / (sqrtf(v) + s.eps);             // N = m / (sqrt(v) + eps)
    }
  };
  BIGBATCH_HD Op element_op(const Table<SoapAdamGroup>& table, int, const Slot& s) const {
    return {soap_adam_step(table.groups[s.group])};
  }
};

/// Adam in the eigenbasis: 20 bytes per fp32 element (G' read, N written, m
/// and v read and written).
struct SoapAdamPlan {
  using Group = SoapAdamGroup;
  struct Config {};
  static Config configure(const Group*, int) { return {}; }

  template <typename Runner>
  static void run(Runner& runner, const Config&) {
    runner.pass(SoapAdamPass{});
  }
};

}  // namespace bigbatch::kernels
