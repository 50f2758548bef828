// Sweep configs: strict parsing with messages naming the key, the expansion
// into trials, the quasi-random search, variants, and safe names.
#include "../../experiments/runconfig/config.h"
#include "../../experiments/train/trial.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <set>

namespace {

using namespace bigbatch::experiments;
using nlohmann::json;

json minimal() {
  return json::parse(R"({
    "name": "t", "dataset": {"name": "gaussian_mixture"},
    "target": {"threshold": 0.2}, "budget": {"steps": 100},
    "batch_sizes": [32, 128], "search": {"lr": [0.1, 0.3]}, "seeds": [0, 1]})");
}

std::string error_of(const json& j) {
  try {
    parse_sweeps(j);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(SweepConfig, DefaultsAndExpansion) {
  const SweepConfig s = parse_sweep(minimal());
  EXPECT_EQ(s.base.model.name, "mlp");
  EXPECT_EQ(model_spec(s.base.model).type, ModelType::kMlp);
  EXPECT_EQ(s.base.optimizer.name, OptimizerName::kLamb);
  EXPECT_EQ(s.base.target.metric, Metric::kValError);
  EXPECT_EQ(s.base.target.eval_every, 50);
  const auto trials = expand(s);
  ASSERT_EQ(trials.size(), 2u * 2u * 2u);
  EXPECT_EQ(trials[0].name, "b32_p0_s0");
  EXPECT_EQ(trials[1].name, "b32_p0_s1");
  EXPECT_EQ(trials[2].name, "b32_p1_s0");
  EXPECT_DOUBLE_EQ(trials[2].schedule.base_lr, 0.3);
  EXPECT_EQ(trials[7].batch_size, 128);
  // The resolved JSON parses back to the same sweep.
  EXPECT_EQ(to_json(parse_sweep(to_json(s))), to_json(s));
  // runner.batch_trials unset is the device's default (on for CUDA, as
  // measured), left out of the resolved JSON; set, it is kept either way.
  EXPECT_FALSE(s.runner.batch_trials.has_value());
  EXPECT_FALSE(to_json(s)["runner"].contains("batch_trials"));
  for (const bool batch : {false, true}) {
    nlohmann::json j = minimal();
    j["runner"]["batch_trials"] = batch;
    const SweepConfig b = parse_sweep(j);
    EXPECT_EQ(b.runner.batch_trials, std::optional<bool>(batch));
    EXPECT_EQ(to_json(b)["runner"]["batch_trials"], batch);
  }
}

TEST(SweepConfig, QuasiRandomSearchIsLogUniformInRange) {
  json j = minimal();
  j["search"] = {{"lr_range", {{"min", 1e-3}, {"max", 1.0}, {"trials", 16}}},
                 {"momentum_range", {{"min", 0.5}, {"max", 0.99}}}};
  j["batch_sizes"] = {64};
  j["seeds"] = {0};
  const auto trials = expand(parse_sweep(j));
  ASSERT_EQ(trials.size(), 16u);
  std::set<double> rates;
  int below = 0;
  for (const auto& t : trials) {
    EXPECT_GE(t.schedule.base_lr, 1e-3);
    EXPECT_LE(t.schedule.base_lr, 1.0);
    EXPECT_GE(t.optimizer.momentum, 0.5);
    EXPECT_LE(t.optimizer.momentum, 0.99);
    rates.insert(t.schedule.base_lr);
    below += t.schedule.base_lr < std::sqrt(1e-3) ? 1 : 0;  // the log-midpoint
  }
  EXPECT_EQ(rates.size(), 16u);
  EXPECT_EQ(below, 8);  // Halton base 2: exactly half of 16 below the midpoint
  EXPECT_DOUBLE_EQ(trials[0].schedule.base_lr, std::sqrt(1e-3));  // first point: 1/2
}

TEST(SweepConfig, ErrorsNameTheKey) {
  json j = minimal();
  j["optimizer"] = {{"name", "lamb"}, {"momentun", 0.9}};
  EXPECT_EQ(error_of(j), "optimizer.momentun: unknown key");
  j = minimal();
  j["budget"] = {{"steps", "many"}};
  EXPECT_EQ(error_of(j), "budget.steps: expected an integer, got string");
  j = minimal();
  j["search"] = {{"lr", {0.1, -0.5}}};
  EXPECT_EQ(error_of(j), "search.lr[1]: must be > 0, got -0.5");
  j = minimal();
  j["batch_sizes"] = {32, 0};
  EXPECT_EQ(error_of(j), "batch_sizes[1]: must be > 0, got 0");
  j = minimal();
  j.erase("target");
  EXPECT_EQ(error_of(j), "target: missing (an object with metric, threshold, eval_every)");
  j = minimal();
  j["schedule"] = {{"base_lr", 0.1}};
  EXPECT_EQ(error_of(j), "schedule.base_lr: set by search.lr, not here");
  j = minimal();
  j["gns"] = {{"micro_batches", 3}};
  EXPECT_EQ(error_of(j), "batch_sizes[0]: 32 is not divisible by gns.micro_batches 3");
  j = minimal();
  j["model"] = {{"type", "transformer"}};
  EXPECT_EQ(error_of(j), "model.type: unknown \"transformer\" (registered: gpt, linear, mlp, resnet, resnet18, simple_cnn, "
                         "torchscript)");
  j = minimal();
  j["dataset"] = {{"name", "imagenet"}};
  EXPECT_EQ(error_of(j), "dataset.name: unknown \"imagenet\" (registered: cifar10, cifar100, fashion_mnist, "
                         "gaussian_mixture, image_folder, linear_regression, text)");
}

TEST(SweepConfig, NamesCannotLeaveTheOutputFolder) {
  for (const char* bad : {"..", ".", "../x", "/abs", "a/b", "a\\b", ""}) {
    json j = minimal();
    j["name"] = bad;
    EXPECT_NE(error_of(j).find("is not a valid name"), std::string::npos) << bad;
  }
  json j = minimal();
  j["name"] = "ok-name_1.2";
  EXPECT_EQ(error_of(j), "(no error)");
}

TEST(SweepConfig, VariantsPatchTheBase) {
  json j = minimal();
  j["variants"] = {{"plain", json::object()},
                   {"warm", {{"schedule", {{"warmup", {{"length", 10}}}}}, {"optimizer", {{"name", "lars"}}}}}};
  const auto sweeps = parse_sweeps(j);
  ASSERT_EQ(sweeps.size(), 2u);
  EXPECT_EQ(sweeps[0].folder, "t/plain");
  EXPECT_EQ(sweeps[0].sweep.base.sweep, "plain");
  EXPECT_EQ(sweeps[1].folder, "t/warm");
  EXPECT_EQ(sweeps[1].sweep.base.schedule.warmup.length, 10);
  EXPECT_EQ(sweeps[1].sweep.base.optimizer.name, OptimizerName::kLars);
  EXPECT_EQ(sweeps[0].sweep.base.optimizer.name, OptimizerName::kLamb);
  j["variants"]["warm"]["optimizer"]["name"] = "adagrad";
  // The optimizer registry is where the names come from.
  EXPECT_EQ(error_of(j), "variants.warm: optimizer.name: unknown value \"adagrad\" "
                         "(one of: sgd, adam, adamw, lars, larc, lamb, novograd, lion, muon)");
}

// Muon takes PyTorch's momentum 0.95 and Nesterov where the config leaves them
// out (and a variant that switches to it from SGD gets them too); the
// update-scale rule is Muon's alone; both round-trip through the resolved JSON.
TEST(SweepConfig, MuonDefaultsAndItsScaleRule) {
  json j = minimal();
  j["optimizer"] = {{"name", "muon"}};
  SweepConfig s = parse_sweep(j);
  EXPECT_EQ(s.base.optimizer.name, OptimizerName::kMuon);
  EXPECT_EQ(s.base.optimizer.momentum, 0.95);
  EXPECT_TRUE(s.base.optimizer.nesterov);
  EXPECT_FALSE(s.base.optimizer.adjust_lr.has_value());
  EXPECT_EQ(to_json(parse_sweep(to_json(s))), to_json(s));

  j["optimizer"] = {{"name", "muon"}, {"momentum", 0.9}, {"nesterov", false}, {"adjust_lr", "original"}};
  s = parse_sweep(j);
  EXPECT_EQ(s.base.optimizer.momentum, 0.9);
  EXPECT_FALSE(s.base.optimizer.nesterov);
  EXPECT_EQ(s.base.optimizer.adjust_lr, std::optional<std::string>("original"));
  EXPECT_EQ(to_json(s)["optimizer"]["adjust_lr"], "original");
  EXPECT_EQ(to_json(parse_sweep(to_json(s))), to_json(s));

  json v = minimal();
  v["optimizer"] = {{"name", "sgd"}};
  v["variants"] = {{"sgd", json::object()}, {"muon", {{"optimizer", {{"name", "muon"}}}}},
                   {"lion", {{"optimizer", {{"name", "lion"}, {"betas", {0.95, 0.98}}}}}}};
  const auto sweeps = parse_sweeps(v);
  ASSERT_EQ(sweeps.size(), 3u);
  for (const auto& named : sweeps) {
    const OptimizerSpec& o = named.sweep.base.optimizer;
    if (o.name == OptimizerName::kMuon) {
      EXPECT_EQ(o.momentum, 0.95);
      EXPECT_TRUE(o.nesterov);
    } else {
      EXPECT_EQ(o.momentum, 0.9) << named.folder;
      EXPECT_FALSE(o.nesterov) << named.folder;
    }
  }

  j = minimal();
  j["optimizer"] = {{"name", "muon"}, {"adjust_lr", "spectral"}};
  EXPECT_EQ(error_of(j), "optimizer.adjust_lr: must be \"original\", \"match_rms_adamw\" or "
                         "\"spectral_unclamped\", got \"spectral\"");
  j["optimizer"] = {{"name", "lamb"}, {"adjust_lr", "original"}};
  EXPECT_EQ(error_of(j), "optimizer.adjust_lr: only muon has an update-scale rule");
  j["optimizer"] = {{"name", "lion"}, {"betas", {0.9, 1.0}}};
  EXPECT_NE(error_of(j).find("optimizer.betas"), std::string::npos) << error_of(j);
  j["optimizer"] = {{"name", "muon"}, {"momentum", 1.0}};
  EXPECT_EQ(error_of(j), "optimizer.momentum: must be in [0, 1), got 1");
}

// The resolved JSON (sweep.json, each trial's config.json) is what a resumed
// sweep compares against, so its form must not drift: these files were
// written by the parser and writer before they shared one field list
// (tests/experiments/resolved/, one per shipped config and one that sets
// every field). Each also parses back to itself.
TEST(SweepConfig, ResolvedConfigsMatchTheRecordedOnes) {
  const std::string root = BIGBATCH_SOURCE_DIR;
  for (const std::string name : {"every_field", "quickstart", "shallue_fmnist_cnn", "goyal_warmup", "hoffer_gbn",
                                 "smith_batch_increase", "optimizers_large_batch", "gd_vs_sgd"}) {
    const std::string config = name == "every_field" ? root + "/tests/experiments/resolved/every_field.json"
                                                     : root + "/experiments/configs/" + name + ".json";
    std::ifstream in(root + "/tests/experiments/resolved/" + name + ".expected.json");
    ASSERT_TRUE(in) << name;
    const json expected = json::parse(in);
    const auto sweeps = load_sweeps(config);
    ASSERT_EQ(sweeps.size(), expected.size()) << name;
    for (const auto& s : sweeps) {
      SCOPED_TRACE(name + ": " + s.folder);
      const json& e = expected.at(s.folder);
      const auto trials = expand(s.sweep);
      EXPECT_EQ(to_json(s.sweep), e.at("sweep"));
      EXPECT_EQ(to_json(trials.front()), e.at("first_trial"));
      EXPECT_EQ(to_json(trials.back()), e.at("last_trial"));
      EXPECT_EQ(trials.size(), e.at("trials").get<std::size_t>());
      EXPECT_EQ(to_json(parse_sweep(to_json(s.sweep))), to_json(s.sweep));
    }
  }
}

TEST(SweepConfig, EveryEnumIsSpelledAsInTheConfig) {
  json j = minimal();
  j["device"] = "tpu";
  EXPECT_EQ(error_of(j), "device: unknown value \"tpu\" (one of: cpu, cuda)");
  j = minimal();
  j["noise"] = {{"type", "white"}};
  EXPECT_EQ(error_of(j), "noise.type: unknown value \"white\" (one of: none, annealed, multiplicative)");
  j = minimal();
  j["target"]["metric"] = "accuracy";
  EXPECT_EQ(error_of(j), "target.metric: unknown value \"accuracy\" (one of: val_error, val_loss)");
  EXPECT_EQ(to_string(TrialStatus::kNotReached), "not_reached");
  EXPECT_EQ(to_string(OptimizerName::kNovoGrad), "novograd");
}

// A folder written before "resnet" had a depth (its depth was 8) is the
// same sweep as one with "depth": 8; another depth is not.
TEST(SweepConfig, ResnetDepthEightMatchesFoldersFromBeforeDepth) {
  const json now = {{"name", "s"}, {"model", {{"type", "resnet"}, {"width", 16}, {"depth", 8}}}};
  json before = now;
  before["model"].erase("depth");
  EXPECT_EQ(identity_difference(before, now), std::nullopt);
  json deeper = now;
  deeper["model"]["depth"] = 20;
  EXPECT_EQ(identity_difference(before, deeper), std::optional<std::string>("/model/depth"));
}

TEST(SweepConfig, ShippedConfigsParse) {
  for (const char* name : {"quickstart", "shallue_fmnist_cnn", "goyal_warmup", "hoffer_gbn", "smith_batch_increase",
                           "optimizers_large_batch", "gd_vs_sgd", "shallue_cifar10_resnet8", "hoffer_cifar10_gbn",
                           "muon_lion_lm", "muon_lion_resnet"}) {
    const auto sweeps = load_sweeps(std::string(BIGBATCH_SOURCE_DIR) + "/experiments/configs/" + name + ".json");
    EXPECT_FALSE(sweeps.empty()) << name;
    for (const auto& s : sweeps) EXPECT_FALSE(expand(s.sweep).empty()) << name;
  }
}

}  // namespace
