// The trust ratios an optimizer reports for its last step
// (LayerwiseOptimizerBase::trust_ratios) against a float64 re-derivation from
// the weights, gradients and moments before each step (docs/formulas.md):
// LARS tc*||w|| / (||g|| + wd*||w|| + eps), LARC's clipped local rate over lr,
// LAMB ||w|| / ||u|| with u from its bias-corrected moments. On the fused
// path (the ratios its finalizers computed), the reference path, and the
// CUDA runner (_CUDA: a GPU, or the SIMT executor in simt_optimizers_tests).
// A group that does not adapt reports none, nor does NovoGrad, a step not yet
// taken, or a step skipped for a non-finite gradient.
#include "engine_device.h"

#include "../../bigbatch.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace bigbatch::optim;

double norm64(const at::Tensor& t) {
  const at::Tensor d = t.detach().to(at::kDouble).cpu().contiguous();
  double s = 0;
  for (std::int64_t i = 0; i < d.numel(); ++i) s += d.data_ptr<double>()[i] * d.data_ptr<double>()[i];
  return std::sqrt(s);
}

// Three weights (an odd size, one larger than a kernel chunk) and a bias that
// layerwise_param_groups puts in the group that does not adapt.
std::vector<at::Tensor> parameters(const c10::Device& device) {
  at::manual_seed(3);
  std::vector<at::Tensor> out;
  for (const auto& shape : std::vector<std::vector<std::int64_t>>{{7, 5}, {130, 140}, {3, 1}, {9}}) {
    out.push_back(at::randn(shape).to(device).requires_grad_(true));
  }
  return out;
}

// Each step's expected ratios, from the tensors before it: weight k's ratio,
// or NaN where its group does not adapt.
using Expected = std::function<std::vector<double>(const std::vector<at::Tensor>& w,
                                                   const std::vector<at::Tensor>& g, int step)>;

template <typename Opt, typename Options>
void expect_reported_ratios(const Options& options, const Expected& expected, const c10::Device& device,
                            const std::string& what) {
  SCOPED_TRACE(what);
  std::vector<at::Tensor> params = parameters(device);
  torch::nn::Module holder;
  for (std::size_t k = 0; k < params.size(); ++k) holder.register_parameter("p" + std::to_string(k), params[k]);
  Opt opt(layerwise_param_groups(holder, options), options);
  EXPECT_TRUE(opt.trust_ratios().empty()) << "before the first step";
  for (int step = 1; step <= 3; ++step) {
    std::vector<at::Tensor> w, g;
    for (auto& p : params) {
      p.mutable_grad() = at::randn_like(p) * (0.1 * step);
      w.push_back(p.detach().clone());
      g.push_back(p.grad().clone());
    }
    opt.step();
    const std::vector<double> want = expected(w, g, step);
    const std::vector<TrustRatio> got = opt.trust_ratios();
    std::size_t next = 0;
    for (std::size_t k = 0; k < params.size(); ++k) {
      if (std::isnan(want[k])) continue;
      ASSERT_LT(next, got.size()) << "step " << step << ": no ratio for parameter " << k;
      EXPECT_TRUE(got[next].param.is_same(params[k])) << "step " << step << ", parameter " << k;
      EXPECT_NEAR(got[next].ratio, want[k], 1e-5 * std::abs(want[k])) << "step " << step << ", parameter " << k;
      ++next;
    }
    EXPECT_EQ(got.size(), next) << "step " << step << ": ratios for parameters whose group does not adapt";
  }
  // A non-finite gradient: the step changes nothing and reports no ratio.
  for (auto& p : params) p.mutable_grad() = at::randn_like(p);
  params[1].mutable_grad()[0][0] = std::numeric_limits<float>::quiet_NaN();
  opt.step();
  EXPECT_EQ(opt.skipped_steps(), 1);
  EXPECT_TRUE(opt.trust_ratios().empty()) << "after a skipped step";
}

constexpr double kWd = 1e-3;

Expected lars_expected(double tc, double eps) {
  return [=](const std::vector<at::Tensor>& w, const std::vector<at::Tensor>& g, int) {
    std::vector<double> out;
    for (std::size_t k = 0; k < w.size(); ++k) {
      const double wn = norm64(w[k]), gn = norm64(g[k]);
      out.push_back(w[k].dim() < 2 ? NAN : tc * wn / (gn + kWd * wn + eps));
    }
    return out;
  };
}

Expected larc_expected(double lr, double tc, double eps) {
  return [=](const std::vector<at::Tensor>& w, const std::vector<at::Tensor>& g, int) {
    std::vector<double> out;
    for (std::size_t k = 0; k < w.size(); ++k) {
      const double wn = norm64(w[k]), gn = norm64(g[k]);
      out.push_back(w[k].dim() < 2 ? NAN : std::min(tc * wn / (gn + kWd * wn + eps) / lr, 1.0));
    }
    return out;
  };
}

// LAMB: the moments in float64 beside the optimizer's, from zero.
Expected lamb_expected(double b1, double b2, double eps, double wd) {
  auto m = std::make_shared<std::vector<at::Tensor>>();
  auto v = std::make_shared<std::vector<at::Tensor>>();
  return [=](const std::vector<at::Tensor>& w, const std::vector<at::Tensor>& g, int step) {
    std::vector<double> out;
    for (std::size_t k = 0; k < w.size(); ++k) {
      const at::Tensor gk = g[k].to(at::kDouble).cpu(), wk = w[k].to(at::kDouble).cpu();
      if (m->size() <= k) {
        m->push_back(at::zeros_like(gk));
        v->push_back(at::zeros_like(gk));
      }
      (*m)[k] = b1 * (*m)[k] + (1 - b1) * gk;
      (*v)[k] = b2 * (*v)[k] + (1 - b2) * gk * gk;
      const at::Tensor u = ((*m)[k] / (1 - std::pow(b1, step))) / (((*v)[k] / (1 - std::pow(b2, step))).sqrt() + eps) +
                           wd * wk;
      out.push_back(w[k].dim() < 2 ? NAN : norm64(wk) / norm64(u));
    }
    return out;
  };
}

void all_three(bool fused, const c10::Device& device, const std::string& path) {
  expect_reported_ratios<LARS>(LARSOptions(0.5).weight_decay(kWd).eps(1e-9).fused(fused), lars_expected(1e-3, 1e-9),
                               device, "LARS " + path);
  expect_reported_ratios<LARC>(LARCOptions(0.5).weight_decay(kWd).fused(fused), larc_expected(0.5, 0.02, 1e-8),
                               device, "LARC " + path);
  expect_reported_ratios<LAMB>(LAMBOptions(1e-3).weight_decay(0.01).fused(fused),
                               lamb_expected(0.9, 0.999, 1e-6, 0.01), device, "LAMB " + path);
}

TEST(TrustRatios, AreTheRatiosTheStepUsed) {
  all_three(true, c10::Device(c10::kCPU), "fused");
  all_three(false, c10::Device(c10::kCPU), "reference");
}

TEST(TrustRatios, AreTheRatiosTheStepUsed_CUDA) {
  if (!engine_available()) GTEST_SKIP() << "no CUDA device";
  all_three(true, engine_device(), "CUDA runner");
}

TEST(TrustRatios, NoneForNovoGradOrAGroupThatDoesNotAdapt) {
  auto w = at::randn({4, 4}).requires_grad_(true);
  w.mutable_grad() = at::randn({4, 4});
  NovoGrad novograd({w}, NovoGradOptions(0.1));
  novograd.step();
  EXPECT_TRUE(novograd.trust_ratios().empty());
  for (const bool fused : {true, false}) {
    LAMB no_decay({w}, LAMBOptions(0.1).weight_decay(0).fused(fused));  // no decay, no always_adapt: ratio 1, unused
    no_decay.step();
    EXPECT_TRUE(no_decay.trust_ratios().empty()) << "fused " << fused;
    LAMB nvlamb({w}, LAMBOptions(0.1).weight_decay(0).always_adapt(true).fused(fused));
    nvlamb.step();
    EXPECT_EQ(nvlamb.trust_ratios().size(), 1u) << "fused " << fused;
    LARS not_adapted({w}, LARSOptions(0.1).adapt(false).fused(fused));
    not_adapted.step();
    EXPECT_TRUE(not_adapted.trust_ratios().empty()) << "fused " << fused;
  }
}

}  // namespace
