// LRAdapter: scheduled rates reach every param group of LibTorch's and
// bigbatch's optimizers with their ratios kept; momentum correction for LARS.
#include "../../compat/torch_compat.h"
#include "../../optimizers/lamb.h"
#include "../../optimizers/lars.h"
#include "../../schedules/lr_adapter.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <limits>
#include <vector>

namespace {

using namespace bigbatch;
using schedules::DecayType;
using schedules::LRAdapter;
using schedules::Schedule;
using schedules::ScheduleSpec;

ScheduleSpec step_decay() {
  ScheduleSpec s;
  s.base_lr = 0.1;
  s.warmup.length = 4;
  s.warmup.start_lr = 0.0;
  s.decay.type = DecayType::kStep;
  s.decay.milestones = {3};
  s.decay.gamma = 0.5;
  return s;
}

std::vector<torch::optim::OptimizerParamGroup> two_groups(std::unique_ptr<torch::optim::OptimizerOptions> second) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{at::ones({3}).requires_grad_(true)});
  groups.emplace_back(std::vector<at::Tensor>{at::ones({2}).requires_grad_(true)}, std::move(second));
  return groups;
}

TEST(LRAdapter, SetsEveryGroupKeepingItsRatio_SGD) {
  torch::optim::SGD sgd(two_groups(std::make_unique<torch::optim::SGDOptions>(0.01)),
                        torch::optim::SGDOptions(0.1).momentum(0.9));
  LRAdapter adapter(sgd, Schedule(step_decay(), 32));
  EXPECT_DOUBLE_EQ(adapter.group_ratios()[1], 0.1);
  // Hand-computed: warmup 0 -> 0.1 over 4 steps, then 0.1, halved from step 7.
  const double expected[] = {0.0, 0.025, 0.05, 0.075, 0.1, 0.1, 0.1, 0.05, 0.05};
  for (std::int64_t t = 0; t < 9; ++t) {
    EXPECT_DOUBLE_EQ(adapter.apply(t), expected[t]);
    EXPECT_DOUBLE_EQ(sgd.param_groups()[0].options().get_lr(), expected[t]) << t;
    EXPECT_NEAR(sgd.param_groups()[1].options().get_lr(), expected[t] * 0.1, 1e-17) << t;
  }
}

TEST(LRAdapter, DrivesBigbatchOptimizersAndIsAFunctionOfTheStep) {
  optim::LAMB lamb(two_groups(std::make_unique<optim::LAMBOptions>(optim::LAMBOptions(2e-3))),
                   optim::LAMBOptions(1e-3));
  LRAdapter a(lamb, Schedule(step_decay(), 32));
  for (std::int64_t t = 0; t < 6; ++t) a.apply(t);
  const double lr5 = lamb.param_groups()[1].options().get_lr();
  // A restarted run: a fresh adapter at step 5 sets the same rates.
  optim::LAMB again(two_groups(std::make_unique<optim::LAMBOptions>(optim::LAMBOptions(2e-3))),
                    optim::LAMBOptions(1e-3));
  LRAdapter b(again, Schedule(step_decay(), 32));
  b.apply(5);
  EXPECT_DOUBLE_EQ(again.param_groups()[1].options().get_lr(), lr5);
  EXPECT_DOUBLE_EQ(lr5, 0.1 * 2);
}

TEST(LRAdapter, MomentumCorrectionScalesLarsBuffersByTheRateRatio) {
  const auto w = at::full({4}, 1.0).requires_grad_(true);
  optim::LARS lars({w}, optim::LARSOptions(0.1).momentum(0.9));
  LRAdapter adapter(lars, Schedule(step_decay(), 32), [&lars](double f) { lars.rescale_momentum(f); });
  for (std::int64_t t = 0; t < 7; ++t) {
    adapter.apply(t);
    w.mutable_grad() = at::full({4}, 0.5);
    lars.step();
  }
  const auto key = compat::optimizer_state_key(w);
  auto& buffer = static_cast<optim::LARSParamState&>(*lars.state().at(key)).momentum_buffer();
  const at::Tensor before = buffer.clone();
  adapter.apply(7);  // 0.1 -> 0.05
  EXPECT_TRUE(at::allclose(buffer, before * 0.5, 0, 0));
  adapter.apply(7);  // the same step again: no second correction
  EXPECT_TRUE(at::allclose(buffer, before * 0.5, 0, 0));
  adapter.apply(8);  // 0.05 -> 0.05
  EXPECT_TRUE(at::allclose(buffer, before * 0.5, 0, 0));
}

TEST(LRAdapter, TheCorrectionHookGetsTheRatioOfEachRateChange) {
  const auto w = at::ones({2}).requires_grad_(true);
  torch::optim::SGD sgd({w}, torch::optim::SGDOptions(0.1).momentum(0.9));
  std::vector<double> factors;
  LRAdapter hooked(sgd, Schedule(step_decay(), 32), [&factors](double f) { factors.push_back(f); });
  for (std::int64_t t = 0; t < 9; ++t) hooked.apply(t);
  // Warmup 0, 0.025, 0.05, 0.075, then 0.1 and, from step 7, 0.05: no call
  // out of 0 (nothing to rescale), none while the rate stays.
  const std::vector<double> expected = {0.05 / 0.025, 0.075 / 0.05, 0.1 / 0.075, 0.5};
  ASSERT_EQ(factors.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) EXPECT_DOUBLE_EQ(factors[i], expected[i]) << i;
}

TEST(LARS, RescaleMomentumRejectsANegativeOrNonFiniteFactor) {
  const auto w = at::ones({2}).requires_grad_(true);
  optim::LARS lars({w}, optim::LARSOptions(0.1).momentum(0.9));
  for (const double bad : {-0.5, std::nan(""), std::numeric_limits<double>::infinity()}) {
    try {
      lars.rescale_momentum(bad);
      FAIL() << "no error for " << bad;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what_without_backtrace()).find("factor"), std::string::npos);
    }
  }
  lars.rescale_momentum(0.5);  // no state yet: nothing to rescale, no error
}

}  // namespace
