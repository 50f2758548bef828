// SOAP (optimizers/soap.h): both paths against the float64 re-derivation in
// reference64.h (its own Jacobi eigenvectors and Gram-Schmidt QR) over 25
// steps at precondition frequency 1 and 10, with two-sided and one-sided
// factors, merged dimensions and 1-D parameters; fused against reference
// (CPU runner and, _CUDA, the CUDA runner); parameters at different steps;
// the first step; a state of the wrong size; the eigenvalue range it
// reports; a sharding that cuts a tensor refused. PyPI's pytorch-optimizer
// is the cross-check of tests/python/test_optim.py.
#include "engine_device.h"
#include "golden_check.h"
#include "reference64.h"

#include "../../bigbatch.h"

#include <ATen/ops/linalg_eigvalsh.h>
#include <gtest/gtest.h>

#include <torch/serialize.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace bigbatch::optim;
using ref64::Vec;

using golden::to_vec;
using ref64::distance;

// The tensors: in group 0 (every dimension preconditioned) a square matrix,
// a wide and a tall one (one null direction in a factor at the first step:
// its eigenvector is unique up to sign) and a 1-D tensor (Adam); in group 1
// (max_precond_dim 6, merge_dims) a 4-D tensor merged to 6 x 6 and a 5 x 7
// matrix preconditioned on its rows only. Shapes whose first-step factors
// have a null space of 2 or more dimensions are left out: any basis of it is
// an eigenbasis, and the steps after depend on which one a solver returns.
struct Tensor {
  std::vector<std::int64_t> sizes;
  std::size_t rows;  // as ref64::Soap sees it
  int group;
};
const std::vector<Tensor> kTensors = {
    {{6, 6}, 6, 0}, {{6, 7}, 6, 0}, {{7, 6}, 7, 0}, {{8}, 1, 0}, {{2, 3, 2, 3}, 6, 1}, {{5, 7}, 5, 1}};

struct SoapSetup {
  bool fused;
  std::int64_t frequency;
  int variant;  // 0: decay and bias correction; 1: normalize_grads, no bias correction, own shampoo_beta
};

SOAPOptions options_of(const SoapSetup& s) {
  SOAPOptions o(0.01);
  o.precondition_frequency(s.frequency).fused(s.fused);
  if (s.variant == 0) {
    o.weight_decay(0.1);
  } else {
    o.normalize_grads(true).correct_bias(false).shampoo_beta(0.8).betas({0.9, 0.99}).eps(1e-6).weight_decay(0);
  }
  return o;
}

ref64::Soap ref_of(const SoapSetup& s, int group) {
  ref64::Soap r;
  r.lr = 0.01;
  r.frequency = s.frequency;
  if (s.variant == 0) {
    r.wd = 0.1;
  } else {
    r.normalize = true;
    r.correct_bias = false;
    r.shampoo_beta = 0.8;
    r.b1 = 0.9;
    r.b2 = 0.99;
    r.eps = 1e-6;
    r.wd = 0;
  }
  if (group == 1) r.max_dim = 6;
  return r;
}

struct SoapRun {
  std::vector<at::Tensor> params;
  std::vector<Vec> ref, start;
  std::unique_ptr<SOAP> opt;
};

SoapRun run(const SoapSetup& s, int steps, at::Device device = at::kCPU) {
  torch::manual_seed(11);
  SoapRun r;
  std::vector<at::Tensor> groups[2];
  for (const auto& t : kTensors) {
    r.params.push_back(at::randn(t.sizes).to(device).requires_grad_(true));
    r.ref.push_back(to_vec(r.params.back()));
    groups[t.group].push_back(r.params.back());
  }
  r.start = r.ref;
  const SOAPOptions o = options_of(s);
  std::vector<torch::optim::OptimizerParamGroup> param_groups;
  param_groups.emplace_back(groups[0], std::make_unique<SOAPOptions>(o));
  param_groups.emplace_back(groups[1], std::make_unique<SOAPOptions>(SOAPOptions(o).max_precond_dim(6).merge_dims(true)));
  r.opt = std::make_unique<SOAP>(std::move(param_groups), o);
  std::vector<ref64::Soap::TensorState> state(kTensors.size());
  for (int step = 0; step < steps; ++step) {
    for (std::size_t k = 0; k < kTensors.size(); ++k) {
      r.params[k].mutable_grad() = (0.1 * at::randn(kTensors[k].sizes)).to(device);
      ref_of(s, kTensors[k].group)
          .step(r.ref[k], to_vec(r.params[k].grad()), state[k], kTensors[k].rows, kTensors[k].sizes.size() == 1);
    }
    r.opt->step();
  }
  return r;
}

class SOAPGolden : public ::testing::TestWithParam<std::tuple<bool, std::int64_t, int>> {
 protected:
  SoapSetup setup() const { return {std::get<0>(GetParam()), std::get<1>(GetParam()), std::get<2>(GetParam())}; }
};

// Within 1e-4 of the distance moved (measured: 7e-6 at most, on an Intel
// Xeon): fp32 rounding, through eigenvectors of factors whose eigenvalues lie
// close (an eigenvector's error grows as the gap shrinks) and Adam's division
// by sqrt(v).
TEST_P(SOAPGolden, FollowsTheFloat64Derivation) {
  const SoapSetup s = setup();
  const SoapRun r = run(s, 25);
  for (std::size_t k = 0; k < kTensors.size(); ++k) {
    const double moved = distance(r.ref[k], r.start[k]);
    ASSERT_GT(moved, 1e-2) << "tensor " << k << " never moved";
    EXPECT_LT(distance(to_vec(r.params[k]), r.ref[k]), 1e-4 * moved)
        << "tensor " << k << (s.fused ? " fused" : " reference") << " frequency " << s.frequency << " variant "
        << s.variant;
  }
}

INSTANTIATE_TEST_SUITE_P(PathsFrequenciesVariants, SOAPGolden,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(1, 10), ::testing::Values(0, 1)));

// The fused step equals the reference step up to the order of the batched
// products' sums (measured: 6e-6 of the distance moved, on an Intel Xeon).
// Gradients here are random in every direction: where a gradient is exactly
// zero along some direction (the weights after a LayerNorm, whose outputs are
// orthogonal to the all-ones vector), its rotated value is rounding noise, of
// the size of eps next to a v of the same noise, and SOAP moves the weights
// along that direction by up to lr a step either way, differently on each
// path. The authors' code does the same; Adam in the plain basis, whose
// gradient is exactly 0 there, does not.
void expect_fused_equals_reference(at::Device device) {
  for (const std::int64_t frequency : {1, 10}) {
    const SoapRun fused = run({true, frequency, 0}, 25, device);
    const SoapRun ref = run({false, frequency, 0}, 25);
    for (std::size_t k = 0; k < kTensors.size(); ++k) {
      const double moved = distance(ref.ref[k], ref.start[k]);
      EXPECT_LT(distance(to_vec(fused.params[k]), to_vec(ref.params[k])), 3e-5 * moved)
          << "tensor " << k << " frequency " << frequency;
    }
  }
}

TEST(SOAP, FusedEqualsReference) { expect_fused_equals_reference(at::kCPU); }

TEST(SOAP, FusedEqualsReference_CUDA) {
  if (!engine_available()) GTEST_SKIP() << "no CUDA device";
  expect_fused_equals_reference(engine_device());
}

// Parameters at different step counts batch apart (each its own bias
// correction and refresh schedule): the second matrix gets its first
// gradient two steps after the first.
TEST(SOAP, ParametersAtDifferentStepsStepAsAlone) {
  std::vector<Vec> result[2];
  for (const bool fused : {true, false}) {
    torch::manual_seed(3);
    auto a = at::randn({6, 6}).requires_grad_(true);
    auto b = at::randn({6, 6}).requires_grad_(true);
    SOAP opt({a, b}, SOAPOptions(0.01).precondition_frequency(2).fused(fused));
    for (int step = 0; step < 9; ++step) {
      a.mutable_grad() = 0.1 * at::randn({6, 6});
      b.mutable_grad() = step >= 2 ? 0.1 * at::randn({6, 6}) : at::Tensor();
      opt.step();
    }
    EXPECT_EQ(opt.param_state(a)->step(), 8);
    EXPECT_EQ(opt.param_state(b)->step(), 6);
    result[fused ? 0 : 1] = {to_vec(a), to_vec(b)};
  }
  for (int k = 0; k < 2; ++k) EXPECT_LT(distance(result[0][k], result[1][k]), 1e-5) << "tensor " << k;
}

// The first step builds L_d = (1 - sb) G_(d) G_(d)^T and its eigenvectors,
// largest eigenvalue first, and leaves the parameter where it was.
TEST(SOAP, TheFirstStepBuildsTheFactorsAndDoesNotMove) {
  for (const bool fused : {true, false}) {
    torch::manual_seed(4);
    auto w = at::randn({4, 5}).requires_grad_(true);
    const at::Tensor before = w.detach().clone();
    SOAP opt({w}, SOAPOptions().shampoo_beta(0.9).fused(fused));
    const at::Tensor g = at::randn({4, 5});
    w.mutable_grad() = g;
    opt.step();
    EXPECT_TRUE(at::equal(w, before));
    const SOAPParamState* st = opt.param_state(w);
    ASSERT_NE(st, nullptr);
    EXPECT_EQ(st->step(), 0);
    ASSERT_EQ(st->factors().numel(), 16 + 25);
    const at::Tensor gd = g.to(at::kDouble);
    const at::Tensor left = st->factors().narrow(0, 0, 16).view({4, 4}).to(at::kDouble);
    const at::Tensor right = st->factors().narrow(0, 16, 25).view({5, 5}).to(at::kDouble);
    EXPECT_TRUE(at::allclose(left, 0.1 * gd.mm(gd.t()), 1e-5, 1e-6));
    EXPECT_TRUE(at::allclose(right, 0.1 * gd.t().mm(gd), 1e-5, 1e-6));
    const at::Tensor q = st->eigenbases().narrow(0, 0, 16).view({4, 4}).to(at::kDouble);
    EXPECT_TRUE(at::allclose(q.t().mm(q), at::eye(4, at::kDouble), 1e-5, 1e-5));
    const at::Tensor d = q.t().mm(left).mm(q);
    const at::Tensor eig = d.diagonal();
    EXPECT_TRUE(at::allclose(d, at::diag(eig), 1e-5, 1e-5)) << "Q^T L Q is not diagonal";
    for (int i = 0; i + 1 < 4; ++i) EXPECT_GE(eig[i].item<double>(), eig[i + 1].item<double>() - 1e-6);
  }
}

TEST(SOAP, AStateOfTheWrongSizeIsRefusedByName) {
  auto w = at::randn({4, 5}).requires_grad_(true);
  SOAP opt({w}, SOAPOptions());
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
    EXPECT_NE(std::string(e.what()).find("SOAP: the state of a parameter of shape [4, 5] in group 0 holds factors "
                                         "of 16 numbers"),
              std::string::npos)
        << e.what_without_backtrace();
  }
}

// The range it reports is the spread of the factors' eigenvalues: after 30
// steps refreshing each step, the bases track the eigenvectors and the
// estimates diag(Q^T L Q) their eigenvalues.
TEST(SOAP, TheEigenvalueRangeIsTheFactorsSpread) {
  torch::manual_seed(6);
  auto w = at::randn({6, 6}).requires_grad_(true);
  auto bias = at::randn({6}).requires_grad_(true);
  SOAP opt({w, bias}, SOAPOptions(0.01).precondition_frequency(1));
  for (int step = 0; step < 30; ++step) {
    w.mutable_grad() = 0.1 * at::randn({6, 6}) * at::linspace(0.2, 2.0, 6).unsqueeze(1);
    bias.mutable_grad() = 0.1 * at::randn({6});
    opt.step();
  }
  const auto ranges = opt.eigenvalue_ranges();
  ASSERT_EQ(ranges.size(), 1u);  // the 1-D tensor has no factor
  EXPECT_TRUE(ranges[0].param.is_same(w));
  const SOAPParamState* st = opt.param_state(w);
  double largest = 0, smallest = INFINITY;
  for (int d = 0; d < 2; ++d) {
    const at::Tensor eig = at::linalg_eigvalsh(st->factors().narrow(0, 36 * d, 36).view({6, 6}).to(at::kDouble));
    largest = std::max(largest, eig.max().item<double>());
    smallest = std::min(smallest, eig.min().item<double>());
  }
  EXPECT_NEAR(ranges[0].ratio, largest / smallest, 0.05 * largest / smallest);
  EXPECT_GT(ranges[0].ratio, 10);  // the rows' scales span 10x: their variances 100x
  const auto scalars = opt.scalars();
  ASSERT_EQ(scalars.size(), 1u);
  EXPECT_EQ(scalars[0].tag, "soap_eigenvalue_range");
  // Loaded into another optimizer, which kept no estimates: made from the state.
  std::stringstream bytes;
  torch::save(opt, bytes);
  SOAP loaded({w, bias}, SOAPOptions(0.01).precondition_frequency(1));
  torch::load(loaded, bytes);
  const auto again = loaded.eigenvalue_ranges();
  ASSERT_EQ(again.size(), 1u);
  EXPECT_NEAR(again[0].ratio, largest / smallest, 0.05 * largest / smallest);
}

TEST(SOAP, AShardingThatCutsATensorIsRefused) {
  auto w = at::randn({200, 100}).requires_grad_(true);  // 2 chunks
  SOAP opt({w}, SOAPOptions());
  auto sharding = std::make_shared<OptimizerSharding>();
  sharding->shards[w.unsafeGetTensorImpl()] = ParamShard{4, 2};
  sharding->allreduce_sum = [](double*, std::int64_t, cudaStream_t) {};
  try {
    opt.shard(sharding);
    FAIL() << "took a piece of a tensor";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("SOAP: parameter 0 of group 0 is a piece of a tensor cut across ranks"),
              std::string::npos)
        << e.what_without_backtrace();
  }
  sharding->shards[w.unsafeGetTensorImpl()] = ParamShard{2, 0};  // whole
  opt.shard(sharding);
  EXPECT_TRUE(opt.shards_whole_tensors());
}

}  // namespace
