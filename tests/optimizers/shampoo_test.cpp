// Shampoo (optimizers/shampoo.h): both paths against the float64
// re-derivation in reference64.h (its own Jacobi eigenvectors) over 25 steps
// at precondition frequency 1 and 10, with blocks, merged dimensions and 1-D
// parameters, two sets of options between them covering the factors' sum and
// moving average, Adam and AdaGrad grafting, coupled and decoupled decay,
// Nesterov and heavy-ball momentum; fused against reference for every
// grafting (CPU runner and, _CUDA, the CUDA runner); parameters at different
// steps; before the start step the update is AdamW's (LibTorch's own); at
// the first preconditioned step each block moves by its graft's norm; a
// state of the wrong size; the grafting norm it reports; a sharding that cuts
// a tensor refused. PyPI's pytorch-optimizer is the cross-check of
// tests/python/test_optim.py.
#include "engine_device.h"
#include "golden_check.h"
#include "reference64.h"

#include "../../bigbatch.h"

#include <gtest/gtest.h>

#include <torch/optim/adamw.h>

#include <cmath>
#include <string>
#include <vector>

namespace {

using namespace bigbatch::optim;
using ref64::Vec;

using golden::to_vec;
using ref64::distance;

// Group 0: whole matrices (square, wide, tall) and a 1-D tensor (one factor,
// root 2); group 1 (max_preconditioner_dim 6): a 4-D tensor merged to 6 x 6,
// a 5 x 7 matrix cut into 5 x 6 and 5 x 1 blocks, a 1-D tensor of 9 cut into
// 6 and 3.
struct Tensor {
  std::vector<std::int64_t> sizes;
  std::size_t rows;  // as ref64::Shampoo sees it
  int group;
};
const std::vector<Tensor> kTensors = {{{6, 6}, 6, 0},       {{6, 7}, 6, 0}, {{7, 6}, 7, 0}, {{8}, 1, 0},
                                      {{2, 3, 2, 3}, 6, 1}, {{5, 7}, 5, 1}, {{9}, 1, 1}};

struct ShampooSetup {
  bool fused;
  std::int64_t frequency;
  int variant;  // 0: moving-average factors, Adam grafting, Nesterov, decoupled decay; 1: summed factors,
                // no filtered gradient, AdaGrad grafting, heavy ball with dampening, coupled decay, root 2
};

ShampooOptions options_of(const ShampooSetup& s) {
  ShampooOptions o(0.01);
  o.precondition_frequency(s.frequency).fused(s.fused);
  if (s.variant == 0) {
    o.betas({0.9, 0.99}).epsilon(1e-5).momentum(0.5).use_nesterov(true).weight_decay(0.01);
  } else {
    o.betas({0.0, 1.0}).epsilon(1e-5).momentum(0.9).dampening(0.1).weight_decay(0.01);
    o.use_decoupled_weight_decay(false).grafting("adagrad").grafting_epsilon(1e-6).inv_root_override(2);
  }
  return o;
}

ref64::Shampoo ref_of(const ShampooSetup& s, int group) {
  ref64::Shampoo r;
  r.lr = 0.01;
  r.frequency = s.frequency;
  r.wd = 0.01;
  if (s.variant == 0) {
    r.b1 = 0.9;
    r.b2 = 0.99;
    r.eps = 1e-5;
    r.momentum = 0.5;
    r.nesterov = true;
  } else {
    r.b1 = 0;
    r.b2 = 1;
    r.eps = 1e-5;
    r.momentum = 0.9;
    r.dampening = 0.1;
    r.decoupled = false;
    r.grafting = "adagrad";
    r.graft_eps = 1e-6;
    r.root_override = 2;
  }
  if (group == 1) r.max_dim = 6;
  return r;
}

struct ShampooRun {
  std::vector<at::Tensor> params;
  std::vector<Vec> ref, start;
  std::unique_ptr<Shampoo> opt;
};

ShampooRun run(const ShampooSetup& s, int steps, at::Device device = at::kCPU, const ShampooOptions* over = nullptr) {
  torch::manual_seed(11);
  ShampooRun r;
  std::vector<at::Tensor> groups[2];
  for (const auto& t : kTensors) {
    r.params.push_back(at::randn(t.sizes).to(device).requires_grad_(true));
    r.ref.push_back(to_vec(r.params.back()));
    groups[t.group].push_back(r.params.back());
  }
  r.start = r.ref;
  const ShampooOptions o = over != nullptr ? *over : options_of(s);
  std::vector<torch::optim::OptimizerParamGroup> param_groups;
  // Group 0 unmerged (merged, a matrix of at most 1024 numbers is a vector).
  param_groups.emplace_back(groups[0], std::make_unique<ShampooOptions>(ShampooOptions(o).use_merge_dims(false)));
  param_groups.emplace_back(groups[1], std::make_unique<ShampooOptions>(ShampooOptions(o).max_preconditioner_dim(6)));
  r.opt = std::make_unique<Shampoo>(std::move(param_groups), o);
  std::vector<ref64::Shampoo::TensorState> state(kTensors.size());
  for (int step = 0; step < steps; ++step) {
    for (std::size_t k = 0; k < kTensors.size(); ++k) {
      r.params[k].mutable_grad() = (0.1 * at::randn(kTensors[k].sizes)).to(device);
      if (over == nullptr) {
        ref_of(s, kTensors[k].group)
            .step(r.ref[k], to_vec(r.params[k].grad()), state[k], kTensors[k].rows, kTensors[k].sizes.size() == 1);
      }
    }
    r.opt->step();
  }
  return r;
}

class ShampooGolden : public ::testing::TestWithParam<std::tuple<bool, std::int64_t, int>> {
 protected:
  ShampooSetup setup() const { return {std::get<0>(GetParam()), std::get<1>(GetParam()), std::get<2>(GetParam())}; }
};

// Within 2e-4 of the distance moved (measured: 4.3e-5 at most, on an Intel
// Xeon): fp32 rounding through the factors' sums and their eigenvectors (the
// inverse root is unique, unlike an eigenbasis, so the solvers' choices of
// sign and order do not show) and the graft's division by sqrt(v). epsilon is
// 1e-5, well above fp32's error in an eigenvalue (about 1e-7 of the largest):
// a factor short of full rank (a 1-D parameter's, for its first n steps) has
// eigenvalues that are rounding noise, each weighted (noise + eps)^(-1/r),
// and a new gradient's component along them dominates the direction; with
// eps near that noise, fp32 and float64 (or any two solvers) part there.
TEST_P(ShampooGolden, FollowsTheFloat64Derivation) {
  const ShampooSetup s = setup();
  const ShampooRun r = run(s, 25);
  for (std::size_t k = 0; k < kTensors.size(); ++k) {
    const double moved = distance(r.ref[k], r.start[k]);
    ASSERT_GT(moved, 1e-2) << "tensor " << k << " never moved";
    EXPECT_LT(distance(to_vec(r.params[k]), r.ref[k]), 2e-4 * moved)
        << "tensor " << k << (s.fused ? " fused" : " reference") << " frequency " << s.frequency << " variant "
        << s.variant;
  }
}

INSTANTIATE_TEST_SUITE_P(PathsFrequenciesVariants, ShampooGolden,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(1, 10), ::testing::Values(0, 1)));

// The fused step equals the reference step, for every grafting, up to the
// order of the batched products' sums and the batched eigensolver's (measured:
// 1.05e-5 of the distance moved at most, on an Intel Xeon).
void expect_fused_equals_reference(at::Device device) {
  for (const char* grafting : {"adam", "rmsprop", "adagrad", "sgd", "none"}) {
    ShampooOptions o = options_of({true, 4, 0});
    o.start_preconditioning_step(6);  // the roots at 6, 8, 12
    o.grafting(grafting);
    // Without grafting nothing bounds the step's size: the 1-D tensor's
    // factor (6 gradients of 8 numbers at the start step) is short of full
    // rank, and its noise eigenvalues, weighted (noise + eps)^(-1/2), would
    // set the direction's size; an eps far above that noise (formulas.md,
    // Shampoo) makes it the design's, on any eigensolver (LibTorch 1.13's too).
    if (std::string(grafting) == "none") o.lr(1e-3).epsilon(1e-3);
    const ShampooRun fused = run({}, 12, device, &o);
    o.fused(false);
    const ShampooRun ref = run({}, 12, at::kCPU, &o);
    for (std::size_t k = 0; k < kTensors.size(); ++k) {
      const double moved = distance(to_vec(ref.params[k]), ref.start[k]);
      ASSERT_GT(moved, 1e-3) << grafting << " tensor " << k;
      EXPECT_LT(distance(to_vec(fused.params[k]), to_vec(ref.params[k])), 5e-5 * moved)
          << grafting << " tensor " << k;
    }
  }
}

TEST(Shampoo, FusedEqualsReference) { expect_fused_equals_reference(at::kCPU); }

TEST(Shampoo, FusedEqualsReference_CUDA) {
  if (!engine_available()) GTEST_SKIP() << "no CUDA device";
  expect_fused_equals_reference(engine_device());
}

// Parameters at different step counts batch apart (each its own bias
// corrections and refresh schedule).
TEST(Shampoo, ParametersAtDifferentStepsStepAsAlone) {
  std::vector<Vec> result[2];
  for (const bool fused : {true, false}) {
    torch::manual_seed(3);
    auto a = at::randn({6, 6}).requires_grad_(true);
    auto b = at::randn({6, 6}).requires_grad_(true);
    Shampoo opt({a, b}, ShampooOptions(0.01).betas({0.9, 0.99}).epsilon(1e-5).precondition_frequency(2).fused(fused));
    for (int step = 0; step < 9; ++step) {
      a.mutable_grad() = 0.1 * at::randn({6, 6});
      b.mutable_grad() = step >= 3 ? 0.1 * at::randn({6, 6}) : at::Tensor();
      opt.step();
    }
    EXPECT_EQ(opt.param_state(a)->step(), 9);
    EXPECT_EQ(opt.param_state(b)->step(), 6);
    result[fused ? 0 : 1] = {to_vec(a), to_vec(b)};
  }
  // Fused against reference, as above (measured: 1.04e-5, of about 0.5 moved).
  for (int k = 0; k < 2; ++k) EXPECT_LT(distance(result[0][k], result[1][k]), 5e-5) << "tensor " << k;
}

// Before the start step the direction is the graft's, and Adam grafting with
// decoupled decay (d = D + wd*W, W -= lr*d) is AdamW: LibTorch's, step for
// step, until Shampoo's preconditioner takes over.
TEST(Shampoo, BeforeTheStartStepAdamGraftingIsAdamW) {
  for (const bool fused : {true, false}) {
    torch::manual_seed(5);
    auto w = at::randn({5, 4}).requires_grad_(true);
    auto peer = w.detach().clone().requires_grad_(true);
    Shampoo opt({w}, ShampooOptions(0.01).betas({0.9, 1.0}).weight_decay(0.1).precondition_frequency(6)
                         .grafting_epsilon(1e-8).fused(fused));
    torch::optim::AdamW adamw({peer}, torch::optim::AdamWOptions(0.01).betas({0.9, 0.999}).eps(1e-8).weight_decay(0.1));
    for (int step = 1; step <= 6; ++step) {
      const at::Tensor g = at::randn({5, 4});
      w.mutable_grad() = g.clone();
      peer.mutable_grad() = g.clone();
      opt.step();
      adamw.step();
      const double apart = (w - peer).abs().max().item<double>();
      if (step < 6) {
        EXPECT_LT(apart, 1e-6) << "step " << step << (fused ? " fused" : " reference");
      } else {
        EXPECT_GT(apart, 1e-4) << "step 6 (preconditioned) is still AdamW's";
      }
    }
  }
}

// At a preconditioned step each block's update has its graft's norm: at the
// first step Adam's D = g/(|g| + eps), of norm sqrt(the block's numbers), so
// with lr 1 and nothing else each block moves by that.
TEST(Shampoo, EachBlockMovesByItsGraftsNorm) {
  for (const bool fused : {true, false}) {
    torch::manual_seed(8);
    auto w = at::randn({7, 5}).requires_grad_(true);
    const at::Tensor before = w.detach().clone();
    Shampoo opt({w}, ShampooOptions(1.0).max_preconditioner_dim(4).grafting_epsilon(1e-8).fused(fused));
    w.mutable_grad() = at::randn({7, 5});
    opt.step();
    const at::Tensor moved = (w.detach() - before);
    for (const auto& [r0, rows] : {std::pair<int, int>{0, 4}, {4, 3}}) {
      for (const auto& [c0, cols] : {std::pair<int, int>{0, 4}, {4, 1}}) {
        const double norm = moved.narrow(0, r0, rows).narrow(1, c0, cols).norm().item<double>();
        EXPECT_NEAR(norm, std::sqrt(rows * cols), 1e-4) << "block at " << r0 << ", " << c0;
      }
    }
    // What it reports: the graft's norm over the whole parameter, sqrt(35).
    const auto norms = opt.grafting_norms();
    ASSERT_EQ(norms.size(), 1u);
    EXPECT_NEAR(norms[0].norm, std::sqrt(35.0), 1e-4);
    const auto scalars = opt.scalars();
    ASSERT_EQ(scalars.size(), 1u);
    EXPECT_EQ(scalars[0].tag, "shampoo_grafting_norm");
    EXPECT_TRUE(scalars[0].param.is_same(w));
  }
}

// Summed factors (b2 = 1) and root 4 at frequency 1: after one step on a
// rank-one gradient g = a b^T the factors are L = |b|^2 aa^T and
// R = |a|^2 bb^T, and the direction L^(-1/4) g R^(-1/4) is a b^T / (|a||b|)
// up to eps: Shampoo's direction from its paper, grafting off.
TEST(Shampoo, AFirstStepOnARankOneGradientIsItsNormalizedDirection) {
  for (const bool fused : {true, false}) {
    auto w = at::zeros({3, 4}).requires_grad_(true);
    Shampoo opt({w}, ShampooOptions(1.0).betas({0.0, 1.0}).grafting("none").epsilon(1e-3).fused(fused));
    const at::Tensor a = at::tensor({1.0f, 2.0f, 2.0f}), b = at::tensor({0.0f, 3.0f, 0.0f, 4.0f});
    w.mutable_grad() = at::outer(a, b);
    opt.step();
    const at::Tensor expected = -at::outer(a, b) / (3.0 * 5.0);
    EXPECT_TRUE(at::allclose(w.detach(), expected, 1e-3, 1e-3)) << w << expected;
  }
}

TEST(Shampoo, AStateOfTheWrongSizeIsRefusedByName) {
  auto w = at::randn({4, 5}).requires_grad_(true);
  Shampoo opt({w}, ShampooOptions());
  w.mutable_grad() = at::randn({4, 5});
  opt.step();
  NamedState st = *opt.named_state(w);
  for (auto& [name, value] : st) {
    if (name == "factors") value = at::zeros({16});
  }
  opt.set_named_state(w, st);
  try {
    opt.step();
    FAIL() << "stepped with factors of the wrong size";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("Shampoo: the state of a parameter of shape [4, 5] in group 0 holds factors "
                                         "of 16 numbers"),
              std::string::npos)
        << e.what_without_backtrace();
  }
}

TEST(Shampoo, AShardingThatCutsATensorIsRefused) {
  auto w = at::randn({200, 100}).requires_grad_(true);  // 2 chunks
  Shampoo opt({w}, ShampooOptions());
  auto sharding = std::make_shared<OptimizerSharding>();
  sharding->shards[w.unsafeGetTensorImpl()] = ParamShard{4, 2};
  sharding->allreduce_sum = [](double*, std::int64_t, cudaStream_t) {};
  try {
    opt.shard(sharding);
    FAIL() << "took a piece of a tensor";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("Shampoo: parameter 0 of group 0 is a piece of a tensor cut across ranks"),
              std::string::npos)
        << e.what_without_backtrace();
  }
  sharding->shards[w.unsafeGetTensorImpl()] = ParamShard{2, 0};  // whole
  opt.shard(sharding);
  EXPECT_TRUE(opt.shards_whole_tensors());
}

}  // namespace
