// First steps worked out by hand from docs/formulas.md on w = [3, 4] (||w|| = 5)
// and g = [0.6, 0.8] (||g|| = 1), so every norm is a round number.
#include "../../bigbatch.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace {

using namespace bigbatch::optim;

struct Pair {
  at::Tensor w = at::tensor({3.0f, 4.0f}).requires_grad_(true);
  void grad(float a, float b) { w.mutable_grad() = at::tensor({a, b}); }
  float at(int i) const { return w[i].item<float>(); }
};

class FirstStep : public ::testing::TestWithParam<bool> {};  // fused or reference

TEST_P(FirstStep, LARSPutsTheRateInsideTheBuffer) {
  Pair p;
  LARS opt({p.w}, LARSOptions(0.1).fused(GetParam()));
  p.grad(0.6f, 0.8f);
  opt.step();
  // ratio = 1e-3 * 5 / 1 = 5e-3;  v = 0.1 * 5e-3 * g = [3e-4, 4e-4];  w = w - v
  EXPECT_NEAR(p.at(0), 3 - 3e-4, 1e-6);
  EXPECT_NEAR(p.at(1), 4 - 4e-4, 1e-6);
  // Second step, same gradient: v = 0.9*v + 5e-4*g (ratio unchanged to 1e-4 relative).
  p.grad(0.6f, 0.8f);
  opt.step();
  const double ratio2 = 1e-3 * std::hypot(3 - 3e-4, 4 - 4e-4);
  EXPECT_NEAR(p.at(0), 3 - 3e-4 - (0.9 * 3e-4 + 0.1 * ratio2 * 0.6), 1e-6);
}

TEST_P(FirstStep, LARCClipsTheLocalRateAtTheGlobalRate) {
  // local = 0.02 * 5 / (1 + 1e-8) ~= 0.1
  {
    Pair p;  // lr = 1: scale = min(0.1 / 1, 1) = 0.1, w = w - 1 * 0.1 * g
    LARC opt({p.w}, LARCOptions(1.0).fused(GetParam()));
    p.grad(0.6f, 0.8f);
    opt.step();
    EXPECT_NEAR(p.at(0), 3 - 0.06, 1e-6);
    EXPECT_NEAR(p.at(1), 4 - 0.08, 1e-6);
  }
  {
    Pair p;  // lr = 0.05: scale = min(0.1 / 0.05, 1) = 1, w = w - 0.05 * g
    LARC opt({p.w}, LARCOptions(0.05).fused(GetParam()));
    p.grad(0.6f, 0.8f);
    opt.step();
    EXPECT_NEAR(p.at(0), 3 - 0.03, 1e-6);
  }
  {
    Pair p;  // scale mode, lr = 0.05: w = w - 0.05 * 0.1 * g
    LARC opt({p.w}, LARCOptions(0.05).clip(false).fused(GetParam()));
    p.grad(0.6f, 0.8f);
    opt.step();
    EXPECT_NEAR(p.at(0), 3 - 0.003, 1e-6);
  }
}

TEST_P(FirstStep, LAMBNormalizesTheAdamStepToTheWeightNorm) {
  Pair p;
  LAMB opt({p.w}, LAMBOptions(0.01).eps(0).fused(GetParam()));
  p.grad(0.6f, 0.8f);
  opt.step();
  // Bias-corrected first step: mh = g, vh = g^2, so mh / sqrt(vh) = [1, 1];
  // u = [1, 1] + 0.01 * w = [1.03, 1.04];  ratio = 5 / ||u||.
  const double ratio = 5 / std::sqrt(1.03 * 1.03 + 1.04 * 1.04);
  EXPECT_NEAR(p.at(0), 3 - 0.01 * ratio * 1.03, 1e-6);
  EXPECT_NEAR(p.at(1), 4 - 0.01 * ratio * 1.04, 1e-6);
}

TEST_P(FirstStep, LAMBClipsByTheNormOfAllGradients) {
  Pair a;
  Pair b;
  LAMB opt({a.w, b.w}, LAMBOptions(0.01).bias_correction(false).max_grad_norm(1.0)
                           .fused(GetParam()));
  a.grad(0.6f, 0.8f);
  b.grad(0.0f, 0.0f);
  opt.step();
  // G = 1, not clipped. (eps = 1e-6 is below the tolerance.) Without bias correction m = 0.1 g, v = 0.001 g^2,
  // m / sqrt(v) = 0.1 / sqrt(0.001) * sign(g) = sqrt(10) * [1, 1].
  const double s = std::sqrt(10.0);
  const double ratio = 5 / std::hypot(s + 0.03, s + 0.04);
  EXPECT_NEAR(a.at(0), 3 - 0.01 * ratio * (s + 0.03), 1e-5);
  // b had a zero gradient: u = wd * w, ratio = ||w|| / ||0.01 w|| = 100, w = w - 0.01 * w.
  EXPECT_NEAR(b.at(0), 3 * 0.99, 1e-5);
  // A gradient 4x larger is clipped back to norm 1: the same step as g above.
  Pair c;
  LAMB clipped({c.w}, LAMBOptions(0.01).bias_correction(false).max_grad_norm(1.0)
                          .fused(GetParam()));
  c.grad(2.4f, 3.2f);
  clipped.step();
  EXPECT_NEAR(c.at(0), a.at(0), 1e-6);
}

TEST_P(FirstStep, NovoGradNormalizesByTheLayerGradientNorm) {
  Pair p;
  NovoGrad opt({p.w}, NovoGradOptions(0.1).eps(0).fused(GetParam()));
  p.grad(0.6f, 0.8f);
  opt.step();
  // v = ||g||^2 = 1;  d = g;  m = g;  w = w - 0.1 * g
  EXPECT_NEAR(p.at(0), 3 - 0.06, 1e-6);
  p.grad(0.0f, 2.0f);
  opt.step();
  // v = 0.98 * 1 + 0.02 * 4 = 1.06;  m = 0.95 * [0.6, 0.8] + [0, 2] / sqrt(1.06)
  const double m1 = 0.95 * 0.8 + 2 / std::sqrt(1.06);
  EXPECT_NEAR(p.at(1), 4 - 0.08 - 0.1 * m1, 1e-6);
}

TEST_P(FirstStep, LionStepsByTheSignOfTheInterpolation) {
  Pair p;
  Lion opt({p.w}, LionOptions(0.1).weight_decay(0.5).fused(GetParam()));
  p.grad(0.6f, 0.8f);
  opt.step();
  // c = 0.9 * 0 + 0.1 * g > 0, sign [1, 1];  w = w * (1 - 0.1 * 0.5) - 0.1;  m = 0.01 * g
  EXPECT_NEAR(p.at(0), 3 * 0.95 - 0.1, 1e-6);
  EXPECT_NEAR(p.at(1), 4 * 0.95 - 0.1, 1e-6);
  p.grad(-0.6f, 0.0f);
  opt.step();
  // c = 0.9 * [0.006, 0.008] + 0.1 * [-0.6, 0] = [-0.0546, 0.0072]: sign [-1, 1]
  EXPECT_NEAR(p.at(0), (3 * 0.95 - 0.1) * 0.95 + 0.1, 1e-6);
  EXPECT_NEAR(p.at(1), (4 * 0.95 - 0.1) * 0.95 - 0.1, 1e-6);
}

// A rank-1 matrix g = [0.6, 0.8] (and its transpose): the first momentum
// is a multiple of g, normalized to g itself (||g|| = 1, one singular value
// 1), and each Newton-Schulz step maps that singular value through
// p(s) = a s + b s^3 + c s^5 while keeping the singular vectors, so
// O = p(p(p(p(p(1))))) * g.
TEST_P(FirstStep, MuonOrthogonalizesARankOneMatrix) {
  double s = 1;
  for (int k = 0; k < 5; ++k) s = 3.4445 * s - 4.7750 * s * s * s + 2.0315 * s * s * s * s * s;
  for (const bool tall : {false, true}) {
    for (const char* rule : {"original", "match_rms_adamw"}) {
      const std::vector<std::int64_t> shape = tall ? std::vector<std::int64_t>{2, 1} : std::vector<std::int64_t>{1, 2};
      auto w = at::tensor({3.0f, 4.0f}).reshape(shape).requires_grad_(true);
      Muon opt({w}, MuonOptions(0.1).weight_decay(0.1).adjust_lr(rule).fused(GetParam()));
      w.mutable_grad() = at::tensor({0.6f, 0.8f}).reshape(shape);
      opt.step();
      // original: sqrt(max(1, rows/cols)) = 1 for [1, 2], sqrt(2) for [2, 1];
      // match_rms_adamw: 0.2 * sqrt(max(rows, cols)) = 0.2 * sqrt(2) for both.
      const double scale = std::string(rule) == "original" ? (tall ? std::sqrt(2.0) : 1.0) : 0.2 * std::sqrt(2.0);
      const auto flat = w.detach().reshape({2});
      EXPECT_NEAR(flat[0].item<float>(), 3 * 0.99 - 0.1 * scale * s * 0.6, 1e-6) << rule << (tall ? " tall" : " wide");
      EXPECT_NEAR(flat[1].item<float>(), 4 * 0.99 - 0.1 * scale * s * 0.8, 1e-6) << rule << (tall ? " tall" : " wide");
    }
  }
  EXPECT_NEAR(s, 0.6964, 1e-4);  // five steps take a singular value of 1 to 0.70 (the band is about 0.7-1.2)
}

INSTANTIATE_TEST_SUITE_P(Paths, FirstStep, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "fused" : "reference"; });

}  // namespace
