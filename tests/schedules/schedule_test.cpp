// Schedules against hand-computed rates and batch sizes (docs/formulas.md: scaling,
// warmup, decays, batch-size increase, regime adaptation) and their JSON form.
#include "../../schedules/schedule.h"

#include "error_of.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>

namespace {

using namespace bigbatch::schedules;

using bigbatch::testing_support::error_of;

ScheduleSpec goyal_like() {
  ScheduleSpec s;
  s.base_lr = 0.1;
  s.base_batch = 50;
  s.scaling = Scaling::kLinear;
  s.unit = Unit::kEpochs;
  s.warmup.length = 2;  // epochs
  s.decay.type = DecayType::kStep;
  s.decay.milestones = {3, 5};  // epochs after warmup
  s.decay.gamma = 0.1;
  return s;
}

// At each of `steps`, lr / B^power of `spec` at batch `batch` (a batch
// increase) equals that of the plain step decay it replaces: the noise scale
// lr / B (Smith et al., power 1) or the Adam-type lr / sqrt(B) (Seesaw, 1/2).
void expect_decays_path(const ScheduleSpec& spec, std::int64_t batch, std::initializer_list<std::int64_t> steps,
                        double power) {
  ScheduleSpec decay = spec;
  decay.batch_increase.reset();
  const Schedule s(spec, batch);
  const Schedule d(decay, batch);
  for (const std::int64_t t : steps) {
    EXPECT_NEAR(s.lr(t) / std::pow(static_cast<double>(s.batch_size(t)), power),
                d.lr(t) / std::pow(static_cast<double>(d.batch_size(t)), power), 1e-15)
        << "step " << t;
  }
}

TEST(Scaling, LinearSqrtNone) {
  EXPECT_DOUBLE_EQ(scale_lr(0.1, Scaling::kLinear, 1024, 256), 0.4);
  EXPECT_DOUBLE_EQ(scale_lr(0.1, Scaling::kSqrt, 1024, 256), 0.2);
  EXPECT_DOUBLE_EQ(scale_lr(0.1, Scaling::kNone, 1024, 256), 0.1);
  EXPECT_DOUBLE_EQ(scale_lr(0.1, Scaling::kLinear, 64, 256), 0.025);
}

TEST(Schedule, WarmupFromUnscaledRateThenStepDecayInEpochs) {
  // B = 100 of N = 1000: 10 steps an epoch; peak 0.1 * 100/50 = 0.2.
  const Schedule s(goyal_like(), 100, 1000);
  EXPECT_EQ(s.warmup_steps(), 20);
  EXPECT_DOUBLE_EQ(s.peak_lr(), 0.2);
  EXPECT_DOUBLE_EQ(s.lr(0), 0.1);    // lr_start defaults to lr0
  EXPECT_DOUBLE_EQ(s.lr(10), 0.15);  // halfway
  EXPECT_DOUBLE_EQ(s.lr(20), 0.2);   // decay's step 0
  EXPECT_DOUBLE_EQ(s.lr(49), 0.2);   // milestone 3 epochs after warmup = step 50
  EXPECT_NEAR(s.lr(50), 0.02, 1e-15);
  EXPECT_NEAR(s.lr(69), 0.02, 1e-15);
  EXPECT_NEAR(s.lr(70), 0.002, 1e-15);
  EXPECT_EQ(s.batch_size(1000), 100);
  EXPECT_EQ(s.steps(9), 90);
}

TEST(Schedule, WarmupFromZero) {
  ScheduleSpec spec = goyal_like();
  spec.warmup.start_lr = 0.0;
  const Schedule s(spec, 100, 1000);
  EXPECT_DOUBLE_EQ(s.lr(0), 0.0);
  EXPECT_DOUBLE_EQ(s.lr(5), 0.05);
  EXPECT_DOUBLE_EQ(s.lr(20), 0.2);
}

TEST(Schedule, PolynomialCosineLinearExponential) {
  ScheduleSpec spec;
  spec.base_lr = 0.2;
  spec.decay.end_lr = 0.001;
  spec.decay.length = 100;
  spec.decay.type = DecayType::kPolynomial;
  spec.decay.power = 2;
  const Schedule poly(spec, 256);
  EXPECT_DOUBLE_EQ(poly.lr(0), 0.2);
  EXPECT_DOUBLE_EQ(poly.lr(50), 0.001 + 0.199 * 0.25);
  EXPECT_DOUBLE_EQ(poly.lr(100), 0.001);
  EXPECT_DOUBLE_EQ(poly.lr(150), 0.001);
  spec.decay.type = DecayType::kCosine;
  const Schedule cosine(spec, 256);
  EXPECT_DOUBLE_EQ(cosine.lr(50), (0.2 + 0.001) / 2);
  EXPECT_NEAR(cosine.lr(25), 0.001 + 0.199 * (1 + std::sqrt(0.5)) / 2, 1e-15);
  EXPECT_DOUBLE_EQ(cosine.lr(100), 0.001);
  spec.decay.type = DecayType::kLinear;
  const Schedule linear(spec, 256);
  EXPECT_DOUBLE_EQ(linear.lr(75), 0.001 + 0.199 * 0.25);

  ScheduleSpec ex;
  ex.base_lr = 0.4;
  ex.unit = Unit::kEpochs;
  ex.decay.type = DecayType::kExponential;
  ex.decay.gamma = 0.5;  // per epoch; 10 steps an epoch below
  const Schedule expo(ex, 100, 1000);
  EXPECT_DOUBLE_EQ(expo.lr(10), 0.2);
  EXPECT_DOUBLE_EQ(expo.lr(20), 0.1);
  EXPECT_NEAR(expo.lr(5), 0.4 * std::sqrt(0.5), 1e-15);
}

TEST(Schedule, ConstantIsThePeak) {
  ScheduleSpec spec;
  spec.base_lr = 0.1;
  spec.scaling = Scaling::kSqrt;
  spec.base_batch = 100;
  const Schedule s(spec, 400);
  EXPECT_DOUBLE_EQ(s.lr(0), 0.2);
  EXPECT_DOUBLE_EQ(s.lr(123456), 0.2);
}

TEST(Schedule, BatchIncreaseReplacesDecaysUntilMaxBatch) {
  ScheduleSpec spec;
  spec.base_lr = 0.1;
  spec.decay.type = DecayType::kStep;
  spec.decay.milestones = {2, 4, 6};
  spec.decay.gamma = 0.2;                  // factor 1/0.2 = 5
  spec.batch_increase = BatchIncreaseSpec{250, std::nullopt};
  const Schedule s(spec, 10);
  EXPECT_EQ(s.batch_size(1), 10);
  EXPECT_EQ(s.batch_size(2), 50);
  EXPECT_EQ(s.batch_size(4), 250);
  EXPECT_EQ(s.batch_size(6), 250);  // 1250 > 250: the rate decays instead
  EXPECT_DOUBLE_EQ(s.lr(5), 0.1);
  EXPECT_NEAR(s.lr(6), 0.02, 1e-15);
  // The noise scale lr * N / B falls by the decay factor at each milestone,
  // as it would under the plain step decay.
  expect_decays_path(spec, 10, {0, 2, 4, 6}, 1.0);
}

// Warmup-stable-decay (Hu et al. 2024; Hägele et al. 2024): the peak through
// warmup's end plus `stable`, then each cooldown shape by its closed form.
TEST(Schedule, WarmupStableDecayCooldownShapes) {
  ScheduleSpec spec;
  spec.base_lr = 0.4;
  spec.warmup.length = 10;
  spec.decay.type = DecayType::kWsd;
  spec.decay.stable = 60;
  spec.decay.cooldown = 40;
  spec.decay.end_lr = 0.004;
  const double span = 0.4 - 0.004;
  spec.decay.shape = CooldownShape::kOneMinusSqrt;
  const Schedule sqrt_shape(spec, 256);
  EXPECT_DOUBLE_EQ(sqrt_shape.lr(5), 0.4);  // warmup from lr0 = the peak (no scaling)
  EXPECT_DOUBLE_EQ(sqrt_shape.lr(10), 0.4);
  EXPECT_DOUBLE_EQ(sqrt_shape.lr(69), 0.4);   // the last stable step
  EXPECT_DOUBLE_EQ(sqrt_shape.lr(70), 0.4);   // cooldown's u = 0
  EXPECT_DOUBLE_EQ(sqrt_shape.lr(80), 0.004 + span * 0.5);  // u = 1/4: 1 - sqrt(1/4)
  EXPECT_NEAR(sqrt_shape.lr(100), 0.004 + span * (1 - std::sqrt(0.75)), 1e-15);
  EXPECT_DOUBLE_EQ(sqrt_shape.lr(110), 0.004);
  EXPECT_DOUBLE_EQ(sqrt_shape.lr(500), 0.004);
  spec.decay.shape = CooldownShape::kLinear;
  const Schedule linear(spec, 256);
  EXPECT_DOUBLE_EQ(linear.lr(80), 0.004 + span * 0.75);
  EXPECT_DOUBLE_EQ(linear.lr(100), 0.004 + span * 0.25);
  spec.decay.shape = CooldownShape::kCosine;
  const Schedule cosine(spec, 256);
  EXPECT_DOUBLE_EQ(cosine.lr(90), (0.4 + 0.004) / 2);
  EXPECT_NEAR(cosine.lr(80), 0.004 + span * (1 + std::sqrt(0.5)) / 2, 1e-15);
  // In epochs, scaled: 1000 examples an epoch at batch 100 is 10 steps; the
  // peak 0.4 * 100/50.
  ScheduleSpec epochs = spec;
  epochs.unit = Unit::kEpochs;
  epochs.base_batch = 50;
  epochs.scaling = Scaling::kLinear;
  epochs.warmup.length = 1;
  epochs.decay.stable = 2;
  epochs.decay.cooldown = 2;
  epochs.decay.shape = CooldownShape::kLinear;
  const Schedule e(epochs, 100, 1000);
  EXPECT_DOUBLE_EQ(e.lr(29), 0.8);
  EXPECT_DOUBLE_EQ(e.lr(40), 0.004 + (0.8 - 0.004) * 0.5);
  EXPECT_DOUBLE_EQ(e.lr(50), 0.004);
}

// Seesaw (arXiv 2510.14717): at each milestone the batch doubles and the
// rate falls by sqrt(2) where the step decay would halve it, which keeps
// lr / sqrt(B) the decayed schedule's; past max_batch the rate decays.
TEST(Schedule, SeesawTradesEachHalvingForDoubleBatchAndRootTwo) {
  ScheduleSpec spec;
  spec.base_lr = 0.1;
  spec.decay.type = DecayType::kStep;
  spec.decay.milestones = {10, 20, 30};
  spec.decay.gamma = 0.5;
  BatchIncreaseSpec seesaw;
  seesaw.max_batch = 128;
  seesaw.seesaw = true;
  spec.batch_increase = seesaw;
  const Schedule s(spec, 32);
  EXPECT_EQ(s.batch_size(9), 32);
  EXPECT_EQ(s.batch_size(10), 64);
  EXPECT_EQ(s.batch_size(20), 128);
  EXPECT_EQ(s.batch_size(30), 128);
  EXPECT_DOUBLE_EQ(s.lr(9), 0.1);
  EXPECT_NEAR(s.lr(10), 0.1 / std::sqrt(2.0), 1e-15);
  EXPECT_NEAR(s.lr(20), 0.05, 1e-15);
  EXPECT_NEAR(s.lr(30), 0.025, 1e-15);  // 256 > 128: the plain halving
  expect_decays_path(spec, 32, {0, 10, 20}, 0.5);
  // An explicit lr_factor wins over seesaw's default.
  spec.batch_increase->lr_factor = 0.9;
  EXPECT_NEAR(Schedule(spec, 32).lr(10), 0.09, 1e-15);
}

TEST(Schedule, BatchIncreaseInEpochsCountsExamplesAtEachBatch) {
  ScheduleSpec spec;
  spec.base_lr = 0.1;
  spec.unit = Unit::kEpochs;
  spec.decay.type = DecayType::kStep;
  spec.decay.milestones = {1, 2};
  spec.batch_increase = BatchIncreaseSpec{400, 2.0};
  const Schedule s(spec, 100, 1000);
  EXPECT_EQ(s.batch_size(9), 100);
  EXPECT_EQ(s.batch_size(10), 200);  // epoch 1: 10 steps of 100
  EXPECT_EQ(s.batch_size(14), 200);
  EXPECT_EQ(s.batch_size(15), 400);  // epoch 2: 5 more steps of 200
  EXPECT_EQ(s.examples_seen(15), 2000);
  EXPECT_EQ(s.examples_seen(17), 2800);
  EXPECT_EQ(s.steps(3), 18);  // 1000 more examples at 400: 2.5 -> 3 steps
  EXPECT_DOUBLE_EQ(s.lr(100), 0.1);  // both milestones grew the batch
}

// Merrill et al.'s batch-size warmup, by hand: stage 1 is ceil(100/32) = 4
// steps (128 examples), stage 2 ceil((300-128)/64) = 3 steps (to 320), then
// the run's batch of 128; the rate follows sqrt scaling at each batch.
TEST(Schedule, BatchWarmupStagesByExamplesWithTheRateScaled) {
  ScheduleSpec spec;
  spec.base_lr = 0.1;
  spec.base_batch = 32;
  spec.scaling = Scaling::kSqrt;
  spec.batch_warmup = {{32, 100}, {64, 300}};
  const Schedule s(spec, 128, 1000);
  EXPECT_EQ(s.batch_size(0), 32);
  EXPECT_EQ(s.batch_size(3), 32);
  EXPECT_EQ(s.batch_size(4), 64);
  EXPECT_EQ(s.batch_size(6), 64);
  EXPECT_EQ(s.batch_size(7), 128);
  EXPECT_EQ(s.examples_seen(4), 128);
  EXPECT_EQ(s.examples_seen(7), 320);
  EXPECT_EQ(s.examples_seen(9), 576);
  EXPECT_DOUBLE_EQ(s.lr(3), 0.1);
  EXPECT_DOUBLE_EQ(s.lr(4), 0.1 * std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(s.lr(7), 0.2);
  EXPECT_DOUBLE_EQ(s.peak_lr(), 0.2);
  EXPECT_EQ(s.steps(1, Unit::kEpochs), 13);  // 680 more examples at 128: 5.3 -> 6 steps after step 7
  EXPECT_EQ(s.steps(20), 20);
  // A warmup of the rate rises to each step's scaled rate.
  spec.warmup.length = 8;
  spec.warmup.start_lr = 0.0;
  EXPECT_DOUBLE_EQ(Schedule(spec, 128).lr(4), 0.1 * std::sqrt(2.0) * 4 / 8);
}

TEST(Schedule, RegimeAdaptationStretchesMilestonesAndBudget) {
  ScheduleSpec spec;
  spec.base_lr = 0.1;
  spec.base_batch = 128;
  spec.decay.type = DecayType::kStep;
  spec.decay.milestones = {10};
  spec.regime_adaptation = true;
  const Schedule s(spec, 512);  // ceil(512/128) = 4
  EXPECT_EQ(s.regime_factor(), 4);
  EXPECT_DOUBLE_EQ(s.lr(39), 0.1);
  EXPECT_NEAR(s.lr(40), 0.01, 1e-15);
  EXPECT_EQ(s.steps(100), 400);
  EXPECT_EQ(Schedule(spec, 300).regime_factor(), 3);  // ceil(300/128)
  spec.regime_adaptation = false;
  EXPECT_EQ(Schedule(spec, 512).steps(100), 100);
}

TEST(Schedule, JsonRoundTrip) {
  const nlohmann::json j = nlohmann::json::parse(R"({
    "base_lr": 0.1, "base_batch": 256, "scaling": "sqrt", "unit": "epochs",
    "warmup": {"length": 5, "start_lr": 0.0},
    "decay": {"type": "step", "milestones": [30, 60, 80], "gamma": 0.1},
    "batch_increase": {"max_batch": 4096, "factor": 5},
    "regime_adaptation": true})");
  const ScheduleSpec spec = schedule_from_json(j);
  const nlohmann::json warm = nlohmann::json::parse(R"({
    "base_lr": 0.1, "base_batch": 32, "scaling": "sqrt", "unit": "steps", "warmup": {"length": 0},
    "decay": {"type": "constant"}, "batch_warmup": [{"batch": 32, "until_examples": 1000},
    {"batch": 64, "until_examples": 5000}], "regime_adaptation": false})");
  EXPECT_EQ(to_json(schedule_from_json(warm)), warm);
  EXPECT_EQ(schedule_from_json(warm).batch_warmup[1].until_examples, 5000);
  EXPECT_EQ(spec.scaling, Scaling::kSqrt);
  EXPECT_EQ(spec.unit, Unit::kEpochs);
  ASSERT_TRUE(spec.warmup.start_lr.has_value());
  EXPECT_EQ(*spec.warmup.start_lr, 0.0);
  EXPECT_EQ(spec.decay.milestones, (std::vector<double>{30, 60, 80}));
  ASSERT_TRUE(spec.batch_increase.has_value());
  EXPECT_EQ(spec.batch_increase->max_batch, 4096);
  EXPECT_TRUE(spec.regime_adaptation);
  EXPECT_EQ(to_json(spec), j);
  EXPECT_EQ(to_json(schedule_from_json(to_json(spec))), j);
  const nlohmann::json wsd = nlohmann::json::parse(R"({
    "base_lr": 0.1, "base_batch": 256, "scaling": "none", "unit": "steps", "warmup": {"length": 0},
    "decay": {"type": "wsd", "stable": 80, "cooldown": 20, "shape": "cosine", "end_lr": 0.0},
    "batch_increase": null, "regime_adaptation": false})");
  nlohmann::json wsd_out = wsd;
  wsd_out.erase("batch_increase");
  EXPECT_EQ(to_json(schedule_from_json(wsd)), wsd_out);
  const nlohmann::json seesaw = nlohmann::json::parse(R"({
    "base_lr": 0.1, "base_batch": 256, "scaling": "none", "unit": "steps", "warmup": {"length": 0},
    "decay": {"type": "step", "milestones": [10], "gamma": 0.5},
    "batch_increase": {"max_batch": 1024, "lr_factor": 0.8, "seesaw": true}, "regime_adaptation": false})");
  EXPECT_EQ(to_json(schedule_from_json(seesaw)), seesaw);
  for (const char* type : {"constant", "exponential", "polynomial", "cosine", "linear"}) {
    nlohmann::json k = {{"base_lr", 0.5}, {"decay", {{"type", type}, {"length", 10}}}};
    if (std::string(type) == "constant" || std::string(type) == "exponential") k["decay"].erase("length");
    const ScheduleSpec s = schedule_from_json(k);
    EXPECT_EQ(to_string(s.decay.type), type);
    EXPECT_EQ(to_json(schedule_from_json(to_json(s))), to_json(s)) << type;
  }
}

TEST(Schedule, BadParametersNameTheParameter) {
  const auto parse = [](const char* text) {
    return error_of([&] { schedule_from_json(nlohmann::json::parse(text)); });
  };
  EXPECT_EQ(parse(R"({"base_lr": -0.1})"), "schedule.base_lr: must be >= 0, got -0.1");
  EXPECT_EQ(parse(R"({"base_lr": "fast"})"), "schedule.base_lr: expected a number, got string");
  EXPECT_EQ(parse(R"({"lr": 0.1})"), "schedule.base_lr: missing (a number is required)");
  EXPECT_EQ(parse(R"({"base_lr": 0.1, "decay": {"type": "step", "gama": 0.5}})"),
            "schedule.decay.gama: unknown key");
  EXPECT_EQ(parse(R"({"base_lr": 0.1, "scaling": "quadratic"})"),
            "schedule.scaling: unknown value \"quadratic\" (one of: none, linear, sqrt, sde)");
  EXPECT_EQ(parse(R"({"base_lr": 0.1, "decay": {"type": "step", "milestones": [30, 20]}})"),
            "schedule.decay.milestones: must be strictly increasing, got 30 then 20");
  EXPECT_EQ(parse(R"({"base_lr": 0.1, "warmup": {"start_lr": 0.01}})"),
            "schedule.warmup.start_lr: given (0.01) but schedule.warmup.length is 0, so there is "
            "no warmup to start");
  EXPECT_EQ(parse(R"({"base_lr": 0.1, "decay": {"type": "step", "milestones": [1]},
                      "batch_increase": {"max_batch": 1024, "factor": 0.5}})"),
            "schedule.batch_increase.factor: must be > 1, got 0.5");
  EXPECT_EQ(parse(R"({"base_lr": 0.1, "decay": {"type": "cosine"}})"),
            "schedule.decay.length: must be > 0 for a cosine decay, got 0");
  EXPECT_EQ(parse(R"({"base_lr": 0.1, "decay": {"type": "exponential", "gamma": 1.5}})"),
            "schedule.decay.gamma: must be in (0, 1], got 1.5");
  EXPECT_EQ(parse(R"({"base_lr": 0.1, "base_batch": 0})"), "schedule.base_batch: must be > 0, got 0");
  EXPECT_EQ(parse(R"({"base_lr": 0.1, "decay": {"type": "cosine", "length": 5},
                      "batch_increase": {"max_batch": 64}})"),
            "schedule.batch_increase: replaces the milestones of a step decay; decay type is cosine");
  EXPECT_EQ(parse(R"({"base_lr": 0.1, "batch_warmup": [{"batch": 32, "until_examples": 900},
                      {"batch": 64, "until_examples": 900}]})"),
            "schedule.batch_warmup[1].until_examples: must be > the previous stage's (900), got 900");
  EXPECT_EQ(parse(R"({"base_lr": 0.1, "batch_warmup": [{"batch": 0, "until_examples": 900}]})"),
            "schedule.batch_warmup[0].batch: must be > 0, got 0");
  EXPECT_EQ(parse(R"({"base_lr": 0.1, "batch_warmup": [{"batch": 8, "until": 900}]})"),
            "schedule.batch_warmup[0].until_examples: missing (an integer is required)");
  EXPECT_EQ(parse(R"({"base_lr": 0.1, "unit": "epochs", "batch_warmup": [{"batch": 8, "until_examples": 9}]})"),
            "schedule.batch_warmup: needs schedule.unit \"steps\" (got \"epochs\"): an epoch's steps would "
            "change with the batch");
  EXPECT_EQ(parse(R"({"base_lr": 0.1, "batch_warmup": {"batch": 8}})"),
            "schedule.batch_warmup: must be an array of {batch, until_examples}");
  EXPECT_EQ(parse(R"({"base_lr": 0.1, "decay": {"type": "wsd", "stable": 10}})"),
            "schedule.decay.cooldown: must be > 0 for a wsd decay, got 0");
  EXPECT_EQ(parse(R"({"base_lr": 0.1, "decay": {"type": "wsd", "stable": 10, "cooldown": 5, "length": 15}})"),
            "schedule.decay.length: a wsd decay is given by stable and cooldown, got length 15");
  EXPECT_EQ(parse(R"({"base_lr": 0.1, "decay": {"type": "wsd", "stable": -1, "cooldown": 5}})"),
            "schedule.decay.stable: must be >= 0, got -1");
  EXPECT_EQ(parse(R"({"base_lr": 0.1, "decay": {"type": "cosine", "length": 10, "cooldown": 5}})"),
            "schedule.decay.cooldown: only a wsd decay has a stable phase and a cooldown (decay type is cosine)");
  EXPECT_EQ(parse(R"({"base_lr": 0.1, "decay": {"type": "cosine", "length": 10, "shape": "1-sqrt"}})"),
            "schedule.decay.shape: only a wsd decay has a cooldown shape (decay type is cosine)");
  EXPECT_EQ(parse(R"({"base_lr": 0.1, "decay": {"type": "wsd", "cooldown": 5, "shape": "sqrt"}})"),
            "schedule.decay.shape: unknown value \"sqrt\" (one of: linear, 1-sqrt, cosine)");
  EXPECT_EQ(parse(R"({"base_lr": 0.1, "decay": {"type": "step", "milestones": [1]},
                      "batch_increase": {"max_batch": 1024, "lr_factor": 1.5}})"),
            "schedule.batch_increase.lr_factor: must be in (0, 1], got 1.5");
  ScheduleSpec epochs;
  epochs.unit = Unit::kEpochs;
  EXPECT_EQ(error_of([&] { Schedule(epochs, 32); }),
            "Schedule: the schedule counts in epochs, so examples_per_epoch must be > 0, got 0");
}

// Lengths past 2^53 steps are refused by name rather than cast (undefined
// behaviour: the schedule fuzz target found a milestone of 6.8e35 epochs), and
// a batch increase whose growth passes any int64 stops at max_batch.
TEST(Schedule, LengthsPastTwoToThe53StepsAreRefused) {
  ScheduleSpec s = goyal_like();
  s.decay.milestones = {3, 6.8e35};
  const std::string e = error_of([&] { Schedule(s, 50, 50000); });
  EXPECT_NE(e.find("more than 2^53"), std::string::npos) << e;
  ScheduleSpec budget = goyal_like();
  EXPECT_NE(error_of([&] { Schedule(budget, 50, 50000).steps(1e300); }).find("more than 2^53"), std::string::npos);
  EXPECT_EQ(Schedule(budget, 50, 50000).steps(1e6), 1000000000);  // 1e6 epochs of 1000 steps: still fine

  ScheduleSpec grow = goyal_like();
  grow.batch_increase = BatchIncreaseSpec{};
  grow.batch_increase->max_batch = std::numeric_limits<std::int64_t>::max();
  grow.batch_increase->factor = 1e300;
  const Schedule g(grow, 50, 50000);
  EXPECT_EQ(g.batch_size(1000000), 50);  // 50 * 1e300 is past max_batch: no batch event applies
}

}  // namespace
