// WeightAverage (docs/formulas.md "Weight averaging"): EMA against a float64
// re-derivation of a_t = d a_{t-1} + (1 - d) w_t from a_1 = w_1, with a
// fixed decay and with a half-life in examples over a ramped batch; LAWA
// against the mean of the last k snapshots worked by hand; the swap that
// puts the trained weights back bit for bit; a state that continues exactly;
// and bad options named. (torch.optim.swa_utils' EMA bit for bit is the
// Python lane's test_average.py.)
#include "../../optimizers/weight_average.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace {

using bigbatch::optim::AverageOptions;
using bigbatch::optim::AverageType;
using bigbatch::optim::WeightAverage;

// A run of `steps` pseudo-steps: w_t = w_{t-1} + noise, in place, as an
// optimizer moves parameters.
struct Trajectory {
  std::vector<at::Tensor> params{at::randn({3, 4}, at::kFloat), at::randn({5}, at::kFloat)};
  std::vector<std::vector<at::Tensor>> history;  // the values after each step, float64
  void step(int t) {
    for (auto& p : params) p.add_(at::full(p.sizes(), std::sin(0.7 * t), at::kFloat) + 0.1 * at::randn(p.sizes()));
    std::vector<at::Tensor> now;
    for (const auto& p : params) now.push_back(p.to(at::kDouble));
    history.push_back(now);
  }
};

AverageOptions ema(double decay, double half_life = 0) {
  AverageOptions o;
  o.type = AverageType::kEma;
  o.decay = decay;
  o.half_life = half_life;
  return o;
}

void expect_close(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = (got[i].to(at::kDouble) - want[i]).abs().max().item<double>();
    EXPECT_LT(err, 1e-5 * (1 + want[i].abs().max().item<double>())) << what << ", tensor " << i;
  }
}

TEST(WeightAverage, EmaFollowsItsRecurrenceFromACopyOfTheFirstStep) {
  at::manual_seed(1);
  Trajectory run;
  WeightAverage average(ema(0.8), run.params);
  EXPECT_FALSE(average.ready());
  std::vector<at::Tensor> want;
  for (int t = 1; t <= 12; ++t) {
    run.step(t);
    average.update(t, 32);
    if (t == 1) {
      want = run.history[0];
    } else {
      for (std::size_t i = 0; i < want.size(); ++i) want[i] = 0.8 * want[i] + 0.2 * run.history.back()[i];
    }
  }
  ASSERT_TRUE(average.ready());
  expect_close(average.averaged(), want, "decay 0.8");
  // The average lags the last weights: not the weights themselves.
  EXPECT_GT((average.averaged()[0] - run.params[0]).abs().max().item<double>(), 1e-2);
}

// d_t = 2^(-B_t / h): with the batch doubled halfway, each later step
// forgets twice as much; h examples halve an old weight's share whatever
// the batch.
TEST(WeightAverage, EmaByHalfLifeInExamplesFollowsTheBatch) {
  at::manual_seed(2);
  Trajectory run;
  const AverageOptions o = ema(0, 256);
  WeightAverage average(o, run.params);
  EXPECT_DOUBLE_EQ(o.decay_for(64), std::pow(2.0, -0.25));
  EXPECT_DOUBLE_EQ(o.decay_for(256), 0.5);
  std::vector<at::Tensor> want;
  for (int t = 1; t <= 10; ++t) {
    const std::int64_t batch = t <= 5 ? 32 : 64;
    run.step(t);
    average.update(t, batch);
    if (t == 1) {
      want = run.history[0];
      continue;
    }
    const double d = std::pow(0.5, static_cast<double>(batch) / 256.0);
    for (std::size_t i = 0; i < want.size(); ++i) want[i] = d * want[i] + (1 - d) * run.history.back()[i];
  }
  expect_close(average.averaged(), want, "half-life 256");
}

TEST(WeightAverage, LawaIsTheMeanOfTheLastKSnapshots) {
  at::manual_seed(3);
  Trajectory run;
  AverageOptions o;
  o.type = AverageType::kLawa;
  o.k = 3;
  o.every = 2;
  WeightAverage average(o, run.params);
  run.step(1);
  average.update(1, 8);
  EXPECT_FALSE(average.ready()) << "no snapshot before step 2";
  for (int t = 2; t <= 11; ++t) {
    run.step(t);
    average.update(t, 8);
  }
  // Snapshots at steps 2, 4, ..., 10; the last three: 6, 8, 10 (history index t - 1).
  std::vector<at::Tensor> want;
  for (std::size_t i = 0; i < run.params.size(); ++i) {
    want.push_back((run.history[5][i] + run.history[7][i] + run.history[9][i]) / 3);
  }
  expect_close(average.averaged(), want, "LAWA k 3 every 2");
}

TEST(WeightAverage, TheSwapPutsTheTrainedWeightsBackBitForBit) {
  at::manual_seed(4);
  Trajectory run;
  WeightAverage average(ema(0.5), run.params);
  for (int t = 1; t <= 4; ++t) {
    run.step(t);
    average.update(t, 1);
  }
  std::vector<at::Tensor> trained;
  for (const auto& p : run.params) trained.push_back(p.clone());
  {
    WeightAverage::Swap swap(average);
    for (std::size_t i = 0; i < trained.size(); ++i) {
      EXPECT_TRUE(at::equal(run.params[i], average.averaged()[i]));
      EXPECT_FALSE(at::equal(run.params[i], trained[i]));
    }
  }
  for (std::size_t i = 0; i < trained.size(); ++i) EXPECT_TRUE(at::equal(run.params[i], trained[i]));
}

// A state saved midway and loaded into a new average over the same
// parameters continues exactly: EMA, and LAWA with a full window.
TEST(WeightAverage, AStateContinuesExactlyAndAWrongOneIsRefused) {
  AverageOptions lawa;
  lawa.type = AverageType::kLawa;
  lawa.k = 2;
  lawa.every = 1;
  for (const AverageOptions& o : {ema(0.9), lawa}) {
    at::manual_seed(5);
    Trajectory run;
    WeightAverage whole(o, run.params), second(o, run.params);
    for (int t = 1; t <= 8; ++t) {
      run.step(t);
      whole.update(t, 4);
      if (t == 5) second.load_state(whole.state());
      if (t > 5) second.update(t, 4);
    }
    for (std::size_t i = 0; i < run.params.size(); ++i) {
      EXPECT_TRUE(at::equal(whole.averaged()[i], second.averaged()[i]));
    }
    std::vector<at::Tensor> bad = whole.state();
    bad.back() = at::zeros({7});
    EXPECT_THROW(second.load_state(bad), c10::Error);
    bad.pop_back();
    EXPECT_THROW(second.load_state(bad), c10::Error);
  }
}

TEST(WeightAverage, BadOptionsAreNamed) {
  const auto message = [](const AverageOptions& o) {
    try {
      o.validate();
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string();
  };
  EXPECT_NE(message(ema(1.0)).find("decay: 1"), std::string::npos) << message(ema(1.0));
  EXPECT_NE(message(ema(0, -3)).find("half_life: -3"), std::string::npos);
  AverageOptions lawa;
  lawa.type = AverageType::kLawa;
  lawa.k = 0;
  lawa.every = 1;
  EXPECT_NE(message(lawa).find("k: 0"), std::string::npos);
  lawa.k = 2;
  lawa.every = 0;
  EXPECT_NE(message(lawa).find("every: 0"), std::string::npos);
  EXPECT_THROW(WeightAverage(AverageOptions{}, {}), c10::Error);
}

}  // namespace
