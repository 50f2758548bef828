// Delayed gradients (distributed/delayed.h) against a closed-form
// re-derivation: least squares, whose gradient 2/n X^T (X w - y) is written
// out here in float64, stepped with the gradient of tau steps before.
#include "../../distributed/delayed.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace {

namespace bd = bigbatch::distributed;
constexpr std::int64_t kSteps = 12, kRows = 8;

struct Data {
  at::Tensor x, y;  // [kSteps * kRows, 3], [kSteps * kRows, 1]
};

Data data() {
  auto gen = at::detail::createCPUGenerator(9);
  return {at::randn({kSteps * kRows, 3}, gen, at::kDouble), at::randn({kSteps * kRows, 1}, gen, at::kDouble)};
}

// The toolkit's way: a Linear layer (no bias) and torch's SGD, each step's
// gradient inside a Stale of that step's staleness.
at::Tensor trained(const bd::DelaySpec& spec, double lr, std::vector<std::int64_t>* taus = nullptr) {
  at::manual_seed(1);
  torch::nn::Linear net(torch::nn::LinearOptions(3, 1).bias(false));
  net->to(at::kDouble);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(lr));
  bd::DelayedGradients delays(spec, net->parameters());
  const Data d = data();
  for (std::int64_t t = 0; t < kSteps; ++t) {
    opt.zero_grad();
    const std::int64_t tau = delays.staleness(t);
    if (taus) taus->push_back(tau);
    {
      bd::DelayedGradients::Stale stale(delays, tau);
      const at::Tensor x = d.x.slice(0, t * kRows, (t + 1) * kRows), y = d.y.slice(0, t * kRows, (t + 1) * kRows);
      torch::nn::functional::mse_loss(net->forward(x), y).backward();
    }
    delays.record(tau);
    opt.param_groups()[0].options().set_lr(lr * delays.rate_factor(tau));
    opt.step();
  }
  return net->weight.detach().reshape({-1}).clone();
}

// The same run written out: w_{t+1} = w_t - lr_t 2/n X_t^T (X_t w_{t - tau_t} - y_t).
at::Tensor closed_form(const std::vector<std::int64_t>& taus, double lr, bool aware) {
  at::manual_seed(1);
  torch::nn::Linear net(torch::nn::LinearOptions(3, 1).bias(false));
  std::vector<at::Tensor> w{net->weight.detach().to(at::kDouble).reshape({3, 1}).clone()};
  const Data d = data();
  for (std::int64_t t = 0; t < kSteps; ++t) {
    const at::Tensor x = d.x.slice(0, t * kRows, (t + 1) * kRows), y = d.y.slice(0, t * kRows, (t + 1) * kRows);
    const at::Tensor& stale = w[static_cast<std::size_t>(t - taus[t])];
    const at::Tensor grad = 2.0 / kRows * at::matmul(x.t(), at::matmul(x, stale) - y);
    const double rate = aware && taus[t] >= 1 ? lr / static_cast<double>(taus[t]) : lr;
    w.push_back(w.back() - rate * grad);
  }
  return w.back().reshape({-1});
}

TEST(DelayedGradients, FixedStalenessIsTheDelayedRecurrence) {
  for (const std::int64_t tau : {0, 1, 3}) {
    bd::DelaySpec spec;
    spec.tau = tau;
    std::vector<std::int64_t> taus;
    const at::Tensor got = trained(spec, 0.05, &taus);
    for (std::int64_t t = 0; t < kSteps; ++t) EXPECT_EQ(taus[t], std::min(t, tau)) << t;
    const at::Tensor want = closed_form(taus, 0.05, false);
    EXPECT_LT((got - want).abs().max().item<double>(), 1e-14) << "tau " << tau;
  }
  // And the delay is seen: tau 3 is another trajectory than tau 0.
  bd::DelaySpec zero, three;
  three.tau = 3;
  EXPECT_GT((trained(zero, 0.05) - trained(three, 0.05)).abs().max().item<double>(), 1e-3);
}

TEST(DelayedGradients, UniformDrawsAreSeededAndStalenessAwareDividesTheRate) {
  bd::DelaySpec spec;
  spec.tau = 4;
  spec.draw = bd::StalenessDraw::kUniform;
  spec.staleness_aware = true;
  spec.seed = 7;
  std::vector<std::int64_t> taus;
  const at::Tensor got = trained(spec, 0.05, &taus);
  EXPECT_LT((got - closed_form(taus, 0.05, true)).abs().max().item<double>(), 1e-14);
  std::vector<std::int64_t> again;
  trained(spec, 0.05, &again);
  EXPECT_EQ(taus, again);  // the same seed, the same draws
  // Over many steps the draws cover 0..tau evenly (each 1/5 of 5000: a
  // binomial's sd is 28), the same for the same seed, other for another.
  at::manual_seed(0);
  const at::Tensor p = at::zeros({2});
  bd::DelayedGradients a(spec, {p});
  spec.seed = 8;
  bd::DelayedGradients b(spec, {p});
  std::vector<std::int64_t> counts(5, 0);
  std::int64_t same = 0;
  for (std::int64_t t = 4; t < 5004; ++t) {
    const std::int64_t k = a.staleness(t);
    ASSERT_GE(k, 0);
    ASSERT_LE(k, 4);
    ++counts[static_cast<std::size_t>(k)];
    same += k == b.staleness(t);
  }
  for (const std::int64_t c : counts) EXPECT_NEAR(static_cast<double>(c), 1000.0, 150.0);
  EXPECT_LT(same, 1300) << "another seed should draw otherwise (1/5 agree by chance)";
  EXPECT_DOUBLE_EQ(a.rate_factor(0), 1.0);
  EXPECT_DOUBLE_EQ(a.rate_factor(4), 0.25);
}

TEST(DelayedGradients, RefusesWhatItCannotGive) {
  bd::DelaySpec spec;
  spec.tau = -1;
  const at::Tensor p = at::zeros({2});
  try {
    bd::DelayedGradients d(spec, {p});
    ADD_FAILURE() << "tau -1 accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("tau must be >= 0 (steps), got -1"), std::string::npos);
  }
  spec.tau = 2;
  bd::DelayedGradients d(spec, {p});
  try {
    bd::DelayedGradients::Stale stale(d, 1);  // nothing recorded yet
    ADD_FAILURE() << "a stale view with nothing kept";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("no parameters of 1 steps ago (0 kept)"), std::string::npos);
  }
}

}  // namespace
