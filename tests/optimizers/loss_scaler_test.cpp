// LossScaler: the dynamic loss scale against a sequence worked by hand, the
// exactness of scaling by a power of two, and skipped steps that change
// nothing (docs/formulas.md "Mixed precision and loss scaling").
#include "../../optimizers/lamb.h"
#include "../../optimizers/loss_scaler.h"

#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace {

using bigbatch::optim::LossScaler;
using bigbatch::optim::LossScalerOptions;

// The optimizer's whole state as the bytes LibTorch saves.
std::string state_bytes(const torch::optim::Optimizer& optimizer) {
  std::ostringstream out;
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  archive.save_to(out);
  return out.str();
}

// Init 8, growth 2 after 3 finite steps in a row, backoff 0.5; the steps'
// gradients finite (F) or not (X): F F X F F F F X X F F F. By hand:
//   F: run 1, S 8      F: run 2, S 8     X: S 4, skipped 1
//   F F F: run 3 -> S 8, run 0           F: run 1, S 8
//   X: S 4, skipped 2  X: S 2, skipped 3 F F F: run 3 -> S 4
// Each step's gradient is S * g for g = 0.25 (a finite step) or inf; SGD
// with rate 1 moves the parameter by exactly -0.25 on a finite step (the
// unscale divides by a power of two) and not at all on a skipped one.
TEST(LossScaler, FollowsTheSequenceWorkedByHand) {
  LossScaler scaler(LossScalerOptions().init_scale(8).growth_interval(3));
  at::Tensor p = at::zeros({3});
  p.set_requires_grad(true);
  torch::optim::SGD sgd({p}, torch::optim::SGDOptions(1.0));
  const std::vector<bool> finite{true, true, false, true, true, true, true, false, false, true, true, true};
  const std::vector<double> scales{8, 8, 4, 4, 4, 8, 8, 4, 2, 2, 2, 4};
  const std::vector<std::int64_t> skipped{0, 0, 1, 1, 1, 1, 1, 2, 3, 3, 3, 3};
  double expected_p = 0;
  for (std::size_t k = 0; k < finite.size(); ++k) {
    const double g = finite[k] ? 0.25 : std::numeric_limits<double>::infinity();
    p.mutable_grad() = at::full({3}, scaler.scale() * g);
    EXPECT_EQ(scaler.step(sgd, {p}), finite[k]) << "step " << k;
    if (finite[k]) expected_p -= 0.25;
    EXPECT_EQ(scaler.scale(), scales[k]) << "step " << k;
    EXPECT_EQ(scaler.skipped_steps(), skipped[k]) << "step " << k;
    EXPECT_TRUE(at::equal(p.detach(), at::full({3}, expected_p))) << "step " << k << ": " << p;
  }
  EXPECT_EQ(expected_p, -0.25 * 9);
}

// Scaling the loss by a power of two scales every gradient by it exactly
// (each op of the backward multiplies or adds values that all carry the same
// factor), so backward of S * loss and the unscale give the plain backward's
// gradient bit for bit: an MLP with ReLU and cross-entropy, in fp32.
TEST(LossScaler, ScaledBackwardThenUnscaleIsThePlainGradientBitForBit) {
  torch::manual_seed(3);
  torch::nn::Sequential model(torch::nn::Linear(20, 32), torch::nn::ReLU(), torch::nn::Linear(32, 5));
  const at::Tensor x = at::randn({16, 20}), y = at::randint(0, 5, {16});
  const auto loss = [&] { return torch::nn::functional::cross_entropy(model->forward(x), y); };
  loss().backward();
  std::vector<at::Tensor> plain;
  for (const auto& p : model->parameters()) plain.push_back(p.grad().clone());
  for (auto& p : model->parameters()) p.mutable_grad().zero_();

  LossScaler scaler;  // 2^16
  scaler.scale(loss()).backward();
  bool differs = false;
  for (std::size_t k = 0; k < plain.size(); ++k) differs = differs || !at::equal(model->parameters()[k].grad(), plain[k]);
  EXPECT_TRUE(differs) << "the scaled gradients should be 2^16 times the plain ones";
  EXPECT_TRUE(scaler.unscale(model->parameters()));
  for (std::size_t k = 0; k < plain.size(); ++k) {
    EXPECT_TRUE(at::equal(model->parameters()[k].grad(), plain[k])) << "parameter " << k;
  }
}

// A step with an inf or NaN gradient anywhere changes no parameter and no
// byte of the optimizer's state: bigbatch's LAMB and LibTorch's Adam, each
// after two real steps (so that there is state to keep).
TEST(LossScaler, ASkippedStepChangesNoParameterAndNoState) {
  for (const double bad : {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    torch::manual_seed(5);
    std::vector<at::Tensor> params{at::randn({4, 3}).requires_grad_(), at::randn({3}).requires_grad_()};
    bigbatch::optim::LAMB lamb(params, bigbatch::optim::LAMBOptions(0.01));
    std::vector<at::Tensor> adam_params{params[0].detach().clone().requires_grad_(),
                                        params[1].detach().clone().requires_grad_()};
    torch::optim::Adam adam(adam_params, torch::optim::AdamOptions(0.01));
    LossScaler scaler;
    for (auto* set : {&params, &adam_params}) {
      torch::optim::Optimizer& optimizer = set == &params ? static_cast<torch::optim::Optimizer&>(lamb) : adam;
      for (int step = 0; step < 2; ++step) {
        for (auto& p : *set) p.mutable_grad() = at::randn(p.sizes()) * scaler.scale();
        ASSERT_TRUE(scaler.step(optimizer, *set));
      }
      std::vector<at::Tensor> before;
      for (const auto& p : *set) before.push_back(p.detach().clone());
      const std::string state = state_bytes(optimizer);
      const double scale = scaler.scale();
      for (auto& p : *set) p.mutable_grad() = at::randn(p.sizes()) * scaler.scale();
      (*set)[1].mutable_grad()[2] = bad;  // one element of one gradient
      EXPECT_FALSE(scaler.step(optimizer, *set));
      for (std::size_t k = 0; k < before.size(); ++k) EXPECT_TRUE(at::equal((*set)[k].detach(), before[k])) << k;
      EXPECT_EQ(state_bytes(optimizer), state);
      EXPECT_EQ(scaler.scale(), scale / 2);
    }
    EXPECT_EQ(scaler.skipped_steps(), 2);
  }
}

TEST(LossScaler, BadOptionsAreRefusedByName) {
  const auto message = [](const LossScalerOptions& o) {
    try {
      LossScaler s(o);
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message(LossScalerOptions().init_scale(3)).find("Invalid init_scale: 3"), std::string::npos);
  EXPECT_NE(message(LossScalerOptions().growth_factor(1)).find("Invalid growth_factor: 1"), std::string::npos);
  EXPECT_NE(message(LossScalerOptions().backoff_factor(0.3)).find("Invalid backoff_factor: 0.3"), std::string::npos);
  EXPECT_NE(message(LossScalerOptions().growth_interval(0)).find("Invalid growth_interval: 0"), std::string::npos);
  LossScaler s;
  EXPECT_THROW(s.restore({3.0, 0, 0}), c10::Error);
  s.restore({1024, 5, 2});
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.growth_run(), 5);
  EXPECT_EQ(s.skipped_steps(), 2);
}

}  // namespace
