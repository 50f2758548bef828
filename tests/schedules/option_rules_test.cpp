// The option rules against their closed forms (docs/formulas.md "Scaling
// rules beyond the rate"): the SDE rule, beta2 by half-life, the AdamW
// timescale, and their refusals.
#include "../../schedules/option_rules.h"

#include "error_of.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>

namespace {

using namespace bigbatch::schedules;
using nlohmann::json;

using bigbatch::testing_support::error_of;

json adam_keys() { return json{{"betas", {0.9, 0.999}}, {"eps", 1e-8}, {"weight_decay", 0.1}, {"amsgrad", false}}; }

ScheduleSpec at_256(Scaling scaling) {
  ScheduleSpec s;
  s.base_lr = 1e-3;
  s.base_batch = 256;
  s.scaling = scaling;
  return s;
}

// Malladi et al. 2022: batch x k, rate x sqrt(k), 1 - beta x k, eps / sqrt(k).
TEST(OptionRules, SdeScalesBetasEpsAndTheRate) {
  const ScheduleSpec s = at_256(Scaling::kSde);
  EXPECT_DOUBLE_EQ(scale_lr(1e-3, s.scaling, 1024, 256), 2e-3);
  const json four = ruled_options(s, 1024, 1e-3, "adamw", adam_keys());
  EXPECT_NEAR(four["betas"][0].get<double>(), 0.6, 1e-15);
  EXPECT_NEAR(four["betas"][1].get<double>(), 0.996, 1e-15);
  EXPECT_NEAR(four["eps"].get<double>(), 5e-9, 1e-24);
  EXPECT_EQ(four["weight_decay"], 0.1);  // no rule sets it
  EXPECT_EQ(four["amsgrad"], false);
  const json quarter = ruled_options(s, 64, 1e-3, "adamw", adam_keys());
  EXPECT_NEAR(quarter["betas"][0].get<double>(), 0.975, 1e-15);
  EXPECT_NEAR(quarter["betas"][1].get<double>(), 0.99975, 1e-15);
  EXPECT_NEAR(quarter["eps"].get<double>(), 2e-8, 1e-23);
  EXPECT_EQ(ruled_options(s, 256, 1e-3, "adamw", adam_keys()), adam_keys());  // k = 1
  const std::string e = error_of([&] { ruled_options(s, 4096, 1e-3, "adamw", adam_keys()); });
  EXPECT_NE(e.find("schedule.scaling: at batch 4096 beta1 = "), std::string::npos) << e;
  EXPECT_NE(e.find("not in [0, 1); the rule holds while k (1 - beta) < 1"), std::string::npos) << e;
  EXPECT_EQ(error_of([&] { ruled_options(s, 512, 1e-3, "lion", json{{"betas", {0.9, 0.99}}}); }),
            "schedule.scaling: sets the optimizer's eps, and lion has none");
  EXPECT_EQ(error_of([&] { ruled_options(s, 512, 1e-3, "sgd", json{{"momentum", 0.9}}); }),
            "schedule.scaling: sets the optimizer's betas, and sgd has none");
}

// Marek et al. 2025: beta2 with a half-life of h examples, 2^(-B / h), so
// that beta2^(h / B) = 1/2 at every batch size.
TEST(OptionRules, Beta2HalfLifeInExamples) {
  ScheduleSpec s = at_256(Scaling::kNone);
  s.beta2_half_life = 20000;
  for (const std::int64_t b : {32, 256, 2048}) {
    const json k = ruled_options(s, b, 1e-3, "adamw", adam_keys());
    const double beta2 = k["betas"][1].get<double>();
    EXPECT_NEAR(std::pow(beta2, 20000.0 / static_cast<double>(b)), 0.5, 1e-12) << b;
    EXPECT_EQ(k["betas"][0], 0.9);
    EXPECT_EQ(k["eps"], 1e-8);
  }
  EXPECT_DOUBLE_EQ(ruled_options(s, 20000, 1e-3, "adamw", adam_keys())["betas"][1].get<double>(), 0.5);
}

// Wang and Aitchison 2024: tau = B / (eta * lambda) examples held fixed,
// eta the peak rate at B (here linearly scaled: 2e-3 at 512).
TEST(OptionRules, WeightDecayFromTheAdamWTimescale) {
  ScheduleSpec s = at_256(Scaling::kLinear);
  s.weight_decay_timescale = 1e6;
  EXPECT_NEAR(ruled_options(s, 512, 1e-3, "adamw", adam_keys())["weight_decay"].get<double>(), 512 / (2e-3 * 1e6),
              1e-15);
  // Under linear scaling the decay is the same at every batch: B / (lr0 B/B0 tau) = B0 / (lr0 tau).
  EXPECT_NEAR(ruled_options(s, 4096, 1e-3, "adamw", adam_keys())["weight_decay"].get<double>(), 256 / (1e-3 * 1e6),
              1e-15);
  s.scaling = Scaling::kSqrt;  // and grows as sqrt(k) under square-root scaling
  EXPECT_NEAR(ruled_options(s, 1024, 1e-3, "adamw", adam_keys())["weight_decay"].get<double>(),
              1024 / (2e-3 * 1e6), 1e-15);
  EXPECT_EQ(error_of([&] { ruled_options(s, 1024, 1e-3, "muon_like", json{{"betas", {0.9, 0.9}}}); }),
            "schedule.weight_decay_timescale: sets the optimizer's weight_decay, and muon_like has none");
}

TEST(OptionRules, KeysAndRefusals) {
  ScheduleSpec none;
  EXPECT_FALSE(has_option_rules(none));
  EXPECT_EQ(ruled_options(none, 4096, 1e-3, "adamw", adam_keys()), adam_keys());
  const json j = json::parse(R"({"base_lr": 0.1, "base_batch": 256, "scaling": "sde", "unit": "steps",
    "warmup": {"length": 0}, "decay": {"type": "constant"}, "regime_adaptation": false,
    "weight_decay_timescale": 50000.0})");
  const ScheduleSpec spec = schedule_from_json(j);
  EXPECT_TRUE(has_option_rules(spec));
  EXPECT_EQ(to_json(spec), j);
  const auto parse = [](const char* text) {
    return error_of([&] { schedule_from_json(json::parse(text)); });
  };
  EXPECT_EQ(parse(R"({"base_lr": 0.1, "beta2_half_life": 0})"),
            "schedule.beta2_half_life: must be > 0 (examples), got 0");
  EXPECT_EQ(parse(R"({"base_lr": 0.1, "weight_decay_timescale": -5})"),
            "schedule.weight_decay_timescale: must be > 0 (examples), got -5");
  EXPECT_EQ(parse(R"({"base_lr": 0.1, "scaling": "sde", "beta2_half_life": 1000})"),
            "schedule.beta2_half_life: sets beta2, which scaling \"sde\" sets too; give one of them");
}

}  // namespace
