// Sweep configs: strict parsing with messages naming the key, the expansion
// into trials, the quasi-random search, variants, and safe names.
#include "../../experiments/runconfig/config.h"
#include "../../experiments/train/trial.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
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
  EXPECT_EQ(s.base.optimizer.name, "lamb");
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

// The schedule's option rules set each trial's optimizer keys at its batch
// (and search rate), which its config then holds; what they cannot set is
// refused when the config is read.
TEST(SweepConfig, OptionRulesSetEachTrialsKeys) {
  json j = minimal();
  j["optimizer"] = {{"name", "adamw"}, {"betas", {0.9, 0.99}}, {"eps", 1e-8}, {"weight_decay", 0.1}};
  j["schedule"] = {{"base_batch", 32}, {"scaling", "sde"}, {"weight_decay_timescale", 1000}};
  j["seeds"] = {0};
  const auto trials = expand(parse_sweep(j));
  ASSERT_EQ(trials.size(), 4u);
  EXPECT_EQ(trials[0].optimizer.params["betas"], json({0.9, 0.99}));  // batch 32 = base_batch: k = 1
  EXPECT_DOUBLE_EQ(trials[0].optimizer.params["weight_decay"].get<double>(), 32 / (0.1 * 1000));
  const json& four = trials[2].optimizer.params;  // batch 128, rate 0.1: k = 4, peak 0.2
  EXPECT_NEAR(four["betas"][0].get<double>(), 0.6, 1e-15);
  EXPECT_NEAR(four["betas"][1].get<double>(), 0.96, 1e-15);
  EXPECT_NEAR(four["eps"].get<double>(), 5e-9, 1e-24);
  EXPECT_DOUBLE_EQ(four["weight_decay"].get<double>(), 128 / (0.2 * 1000));
  EXPECT_DOUBLE_EQ(trials[3].optimizer.params["weight_decay"].get<double>(), 128 / (0.6 * 1000));  // rate 0.3
  j["batch_sizes"] = {32, 512};  // k = 16: 1 - 16 * 0.1 < 0
  EXPECT_NE(error_of(j).find("schedule.scaling: at batch 512 beta1 = "), std::string::npos) << error_of(j);
  j["batch_sizes"] = {32};
  j["optimizer"] = {{"name", "sgd"}};
  EXPECT_EQ(error_of(j), "schedule.scaling: sets the optimizer's betas, and sgd has none");
}

TEST(SweepConfig, QuasiRandomSearchIsLogUniformInRange) {
  json j = minimal();
  j["search"] = {{"lr_range", {{"min", 1e-3}, {"max", 1.0}, {"trials", 16}}},
                 {"momentum_range", {{"min", 0.5}, {"max", 0.99}}}};
  j["optimizer"] = {{"name", "sgd"}};  // an optimizer with momentum
  j["batch_sizes"] = {64};
  j["seeds"] = {0};
  const auto trials = expand(parse_sweep(j));
  ASSERT_EQ(trials.size(), 16u);
  std::set<double> rates;
  int below = 0;
  for (const auto& t : trials) {
    EXPECT_GE(t.schedule.base_lr, 1e-3);
    EXPECT_LE(t.schedule.base_lr, 1.0);
    EXPECT_GE(t.optimizer.momentum().value_or(-1), 0.5);
    EXPECT_LE(t.optimizer.momentum().value_or(2), 0.99);
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
  EXPECT_EQ(error_of(j), "optimizer.momentun: unknown key (lamb's keys: adam_w_mode, adapt, always_adapt, betas, "
                         "bias_correction, eps, fused, grad_averaging, master_weights, max_grad_norm, max_trust, "
                         "min_trust, skip_nonfinite, trust_clip, weight_decay)");
  j["optimizer"] = {{"name", "adamw"}, {"momentum", 0.9}};  // a key of other optimizers
  EXPECT_EQ(error_of(j), "optimizer.momentum: adamw has no such key (its keys: betas, eps, weight_decay); a variant "
                         "drops its base's with \"momentum\": null");
  j = minimal();
  j["search"]["momentum"] = {0.9, 0.99};  // LAMB has no momentum to search
  EXPECT_EQ(error_of(j), "search.momentum: lamb has no momentum to search");
  j["optimizer"] = {{"name", "larc"}};
  EXPECT_EQ(error_of(j), "(no error)");
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
  EXPECT_EQ(error_of(j), "model.type: unknown \"transformer\" (registered: gpt, linear, mlp, python, resnet, resnet18, "
                         "simple_cnn, torchscript)");
  j = minimal();
  j["dataset"] = {{"name", "imagenet"}};
  EXPECT_EQ(error_of(j), "dataset.name: unknown \"imagenet\" (registered: cifar10, cifar100, fashion_mnist, "
                         "gaussian_mixture, image_folder, linear_regression, python, text)");
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
  EXPECT_EQ(sweeps[1].sweep.base.optimizer.name, "lars");
  EXPECT_EQ(sweeps[0].sweep.base.optimizer.name, "lamb");
  j["variants"]["warm"]["optimizer"]["name"] = "adagrad";
  // The optimizer registry is where the names come from.
  EXPECT_EQ(error_of(j), "variants.warm: optimizer.name: unknown value \"adagrad\" "
                         "(one of: sgd, adam, adamw, lars, larc, lamb, novograd, lion, muon, adamwschedulefree, "
                         "sgdschedulefree, soap, shampoo)");
}

// Muon takes PyTorch's momentum 0.95 and Nesterov where the config leaves them
// out (and a variant that switches to it from SGD gets them too); the
// update-scale rule is Muon's alone; both round-trip through the resolved JSON.
TEST(SweepConfig, MuonDefaultsAndItsScaleRule) {
  json j = minimal();
  j["optimizer"] = {{"name", "muon"}};
  SweepConfig s = parse_sweep(j);
  EXPECT_EQ(s.base.optimizer.name, "muon");
  EXPECT_EQ(s.base.optimizer.momentum().value_or(-1), 0.95);
  EXPECT_TRUE(s.base.optimizer.params.at("nesterov").get<bool>());
  EXPECT_EQ(s.base.optimizer.params.at("adjust_lr"), "match_rms_adamw");  // the runner's default
  EXPECT_EQ(to_json(parse_sweep(to_json(s))), to_json(s));

  j["optimizer"] = {{"name", "muon"}, {"momentum", 0.9}, {"nesterov", false}, {"adjust_lr", "original"}};
  s = parse_sweep(j);
  EXPECT_EQ(s.base.optimizer.momentum().value_or(-1), 0.9);
  EXPECT_FALSE(s.base.optimizer.params.at("nesterov").get<bool>());
  EXPECT_EQ(s.base.optimizer.params.at("adjust_lr"), "original");
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
    if (o.name == "muon") {
      EXPECT_EQ(o.momentum().value_or(-1), 0.95);
      EXPECT_TRUE(o.params.at("nesterov").get<bool>());
    } else if (o.name == "sgd") {
      EXPECT_EQ(o.momentum().value_or(-1), 0.9) << named.folder;
      EXPECT_FALSE(o.params.at("nesterov").get<bool>()) << named.folder;
    } else {
      EXPECT_FALSE(o.momentum().has_value()) << named.folder;  // lion has none
      EXPECT_FALSE(o.params.contains("nesterov")) << named.folder;
    }
  }

  j = minimal();
  j["optimizer"] = {{"name", "muon"}, {"adjust_lr", "spectral"}};
  EXPECT_EQ(error_of(j), "optimizer.adjust_lr: must be \"original\", \"match_rms_adamw\" or "
                         "\"spectral_unclamped\", got \"spectral\"");
  j["optimizer"] = {{"name", "lamb"}, {"adjust_lr", "original"}};
  EXPECT_EQ(error_of(j), "optimizer.adjust_lr: lamb has no such key (its keys: adam_w_mode, adapt, always_adapt, "
                         "betas, bias_correction, eps, fused, grad_averaging, master_weights, max_grad_norm, "
                         "max_trust, min_trust, skip_nonfinite, trust_clip, weight_decay); a variant drops its "
                         "base's with \"adjust_lr\": null");
  j["optimizer"] = {{"name", "lion"}, {"betas", {0.9, 1.0}}};
  EXPECT_NE(error_of(j).find("optimizer.betas"), std::string::npos) << error_of(j);
  j["optimizer"] = {{"name", "muon"}, {"momentum", 1.0}};
  EXPECT_EQ(error_of(j), "optimizer.momentum: must be in [0, 1), got 1");
}

// The resolved JSON (sweep.json, each trial's config.json) is what a resumed
// sweep compares against, so its form must not drift unnoticed: these files
// hold it for each shipped config and one that sets every field
// (tests/experiments/resolved/). Each also parses back to itself. Where the
// form changes on purpose, BIGBATCH_WRITE_RESOLVED=1 rewrites them (and the
// legacy test below says whether old folders still resume).
const char* const kResolvedConfigs[] = {"every_field", "quickstart", "shallue_fmnist_cnn", "goyal_warmup",
                                        "hoffer_gbn", "smith_batch_increase", "optimizers_large_batch", "gd_vs_sgd"};

std::string resolved_source(const std::string& name) {
  const std::string root = BIGBATCH_SOURCE_DIR;
  return name == "every_field" ? root + "/tests/experiments/resolved/every_field.json"
                               : root + "/experiments/configs/" + name + ".json";
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << path;
  return in ? json::parse(in) : json::object();
}

TEST(SweepConfig, ResolvedConfigsMatchTheRecordedOnes) {
  const std::string root = BIGBATCH_SOURCE_DIR;
  const bool write = std::getenv("BIGBATCH_WRITE_RESOLVED") != nullptr;
  for (const std::string name : kResolvedConfigs) {
    const std::string path = root + "/tests/experiments/resolved/" + name + ".expected.json";
    const auto sweeps = load_sweeps(resolved_source(name));
    if (write) {
      json out = json::object();
      for (const auto& s : sweeps) {
        const auto trials = expand(s.sweep);
        out[s.folder] = {{"sweep", to_json(s.sweep)}, {"first_trial", to_json(trials.front())},
                         {"last_trial", to_json(trials.back())}, {"trials", trials.size()}};
      }
      std::ofstream(path) << out.dump(2) << "\n";
    }
    const json expected = read_json(path);
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

// Folders written before each optimizer owned its keys (every optimizer
// then recorded the union's momentum, nesterov and momentum_correction, and
// no defaults of the optional keys): tests/experiments/resolved/legacy/ holds
// what that code wrote for the same configs. Their sweeps and trials are the
// same as today's in identity(), so a resumed sweep redoes nothing. One
// variant of every_field changed: it searched momentum for LAMB, which has
// none (now refused), and is now LARC's.
TEST(SweepConfig, FoldersWrittenBeforeOptimizerEntriesResume) {
  const std::string root = BIGBATCH_SOURCE_DIR;
  int compared = 0;
  for (const std::string name : kResolvedConfigs) {
    const json legacy = read_json(root + "/tests/experiments/resolved/legacy/" + name + ".expected.json");
    for (const auto& s : load_sweeps(resolved_source(name))) {
      if (s.folder == "every_field/resnet_multiplicative") continue;
      SCOPED_TRACE(name + ": " + s.folder);
      const json& old = legacy.at(s.folder);
      const auto trials = expand(s.sweep);
      EXPECT_EQ(identity_difference(old.at("sweep"), to_json(s.sweep)), std::nullopt);
      EXPECT_EQ(identity_difference(old.at("first_trial"), to_json(trials.front())), std::nullopt);
      EXPECT_EQ(identity_difference(old.at("last_trial"), to_json(trials.back())), std::nullopt);
      EXPECT_EQ(trials.size(), old.at("trials").get<std::size_t>());
      ++compared;
    }
  }
  EXPECT_EQ(compared, 18);
  // A key that changed still differs, and is named.
  json old = read_json(root + "/tests/experiments/resolved/legacy/every_field.expected.json").at("every_field/as_is");
  old["sweep"]["optimizer"]["trust_coefficient"] = 0.003;
  EXPECT_EQ(identity_difference(old.at("sweep"), to_json(load_sweeps(resolved_source("every_field")).front().sweep)),
            std::optional<std::string>("/optimizer/trust_coefficient"));
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
  EXPECT_EQ(registered_optimizers(),
            (std::vector<std::string>{"sgd", "adam", "adamw", "lars", "larc", "lamb", "novograd", "lion", "muon",
                                      "adamwschedulefree", "sgdschedulefree", "soap", "shampoo"}));
}

// distributed.shard: read, written back, left out when "none" (so that
// folders written before it keep their identity), and refused with the key
// and the reason where it cannot apply.
TEST(SweepConfig, ShardIsLeftOutWhenNoneAndRefusedWhereItCannotApply) {
  json j = minimal();
  j["distributed"] = {{"shard", "gradients"}};
  const SweepConfig s = parse_sweep(j);
  EXPECT_EQ(s.base.distributed.shard, bigbatch::distributed::ShardStage::kGradients);
  EXPECT_EQ(to_json(s)["distributed"]["shard"], "gradients");
  EXPECT_EQ(to_json(parse_sweep(to_json(s))), to_json(s));
  j["distributed"] = {{"shard", "none"}};
  EXPECT_FALSE(to_json(parse_sweep(j)).contains("distributed"));
  j["distributed"] = {{"shard", "optimizer"}};
  EXPECT_EQ(error_of(j), "distributed.shard: unknown value \"optimizer\" (one of: none, states, gradients)");
  j["distributed"] = {{"shard", "states"}};
  j["optimizer"] = {{"name", "sgd"}};
  EXPECT_EQ(error_of(j), "distributed: shard \"states\": sgd has no sharded form (lars, larc, lamb, novograd, lion, "
                         "muon, adamwschedulefree, sgdschedulefree, soap and shampoo have)");
  j["optimizer"] = {{"name", "lamb"}};
  j["distributed"] = {{"shard", "gradients"}, {"compression", {{"name", "fp16"}}}};
  EXPECT_EQ(error_of(j), "distributed.shard: \"gradients\" reduce-scatters the gradients itself and does not compose "
                         "with compression fp16; \"states\" takes the compressed exchange's average");
  j["distributed"] = {{"shard", "states"}, {"compression", {{"name", "fp16"}}}};
  EXPECT_EQ(parse_sweep(j).base.distributed.shard, bigbatch::distributed::ShardStage::kStates);
}

// "average": EMA by decay or half-life (exactly one), LAWA's k and every,
// target_on; written out only when on, each trial carrying it; refused
// where it cannot apply.
TEST(SweepConfig, AverageIsReadWrittenAndRefusedByName) {
  json j = minimal();
  EXPECT_FALSE(to_json(parse_sweep(j)).contains("average"));
  j["average"] = {{"type", "ema"}, {"half_life", 20000}, {"target_on", "averaged"}};
  const SweepConfig s = parse_sweep(j);
  EXPECT_EQ(s.base.average.options.type, bigbatch::optim::AverageType::kEma);
  EXPECT_EQ(s.base.average.options.half_life, 20000);
  EXPECT_EQ(s.base.average.target_on, TargetOn::kAveraged);
  EXPECT_EQ(to_json(s)["average"], json({{"type", "ema"}, {"half_life", 20000.0}, {"target_on", "averaged"}}));
  EXPECT_EQ(to_json(parse_sweep(to_json(s))), to_json(s));
  for (const auto& t : expand(s)) EXPECT_EQ(to_json(t)["average"], to_json(s)["average"]);
  j["average"] = {{"type", "lawa"}, {"k", 5}, {"every", 100}};
  EXPECT_EQ(to_json(parse_sweep(j))["average"], json({{"type", "lawa"}, {"k", 5}, {"every", 100}, {"target_on", "raw"}}));
  j["average"] = {{"type", "none"}};
  EXPECT_FALSE(to_json(parse_sweep(j)).contains("average"));

  j["average"] = {{"type", "ema"}, {"decay", 0.99}, {"half_life", 100}};
  EXPECT_EQ(error_of(j), "average.decay: give exactly one of average.decay, average.half_life");
  j["average"] = {{"type", "ema"}};
  EXPECT_EQ(error_of(j), "average.decay: give exactly one of average.decay, average.half_life");
  j["average"] = {{"type", "ema"}, {"decay", 1.0}};
  EXPECT_EQ(error_of(j), "average.decay: must be in [0, 1), got 1");
  j["average"] = {{"type", "ema"}, {"half_life", -5}};
  EXPECT_EQ(error_of(j), "average.half_life: must be > 0 (examples), got -5");
  j["average"] = {{"type", "lawa"}, {"k", 0}, {"every", 10}};
  EXPECT_EQ(error_of(j), "average.k: must be >= 1 (snapshots), got 0");
  j["average"] = {{"type", "lawa"}, {"k", 2}};
  EXPECT_NE(error_of(j).find("average.every"), std::string::npos) << error_of(j);
  j["average"] = {{"type", "swa"}};
  EXPECT_EQ(error_of(j), "average.type: unknown value \"swa\" (one of: none, ema, lawa)");
  j["average"] = {{"type", "ema"}, {"decay", 0.9}, {"target_on", "both"}};
  EXPECT_EQ(error_of(j), "average.target_on: unknown value \"both\" (one of: raw, averaged)");
  j["average"] = {{"type", "ema"}, {"decay", 0.9}};
  j["optimizer"] = {{"name", "adamwschedulefree"}};
  EXPECT_NE(error_of(j).find("average: adamwschedulefree is evaluated at an average of its own"), std::string::npos)
      << error_of(j);
}

// "horizons": a wsd decay's horizon keeps its cooldown's fraction of the run
// (budget 100, warmup 10, stable 70, cooldown 20: at horizon 50, cooldown
// 10 and stable 30), a cosine's length ends at the horizon; written out only
// when given; refused where a horizon cannot move the decay's end.
TEST(SweepConfig, HorizonsSetEachBranchsDecayAndAreRefusedByName) {
  json j = minimal();
  j["schedule"] = {{"warmup", {{"length", 10}}},
                   {"decay", {{"type", "wsd"}, {"stable", 70}, {"cooldown", 20}, {"shape", "1-sqrt"}}}};
  EXPECT_FALSE(to_json(parse_sweep(j)).contains("horizons"));
  j["horizons"] = {25, 50};
  const SweepConfig s = parse_sweep(j);
  EXPECT_EQ(to_json(s)["horizons"], json({25.0, 50.0}));
  EXPECT_EQ(to_json(parse_sweep(to_json(s))), to_json(s));
  const TrialConfig t = expand(s).front();
  const TrialConfig h = horizon_trial(t, 1);
  EXPECT_EQ(h.budget.length, 50);
  EXPECT_DOUBLE_EQ(h.schedule.decay.cooldown, 10);
  EXPECT_DOUBLE_EQ(h.schedule.decay.stable, 30);
  EXPECT_TRUE(h.horizons.empty());
  EXPECT_EQ(h.name, t.name + "/horizon_2");
  EXPECT_DOUBLE_EQ(horizon_trial(t, 0).schedule.decay.stable, 10);  // 25 - 10 - 5
  EXPECT_THROW(horizon_trial(t, 2), c10::Error);

  j["schedule"]["decay"] = {{"type", "cosine"}, {"length", 90}};
  EXPECT_DOUBLE_EQ(horizon_trial(expand(parse_sweep(j)).front(), 0).schedule.decay.length, 15);

  j["horizons"] = {50, 25};
  EXPECT_EQ(error_of(j), "horizons: must increase and stay between 0 and the budget (100), got 25");
  j["horizons"] = {50, 100};
  EXPECT_EQ(error_of(j), "horizons: must increase and stay between 0 and the budget (100), got 100");
  j["horizons"] = {10};
  EXPECT_EQ(error_of(j), "horizons: horizon 10 leaves no room for the warmup (10) and the decay");
  j["horizons"] = json::array();
  EXPECT_EQ(error_of(j), "horizons: must not be empty (leave it out for none)");
  j["horizons"] = {50};
  j["schedule"]["decay"] = {{"type", "cosine"}, {"length", 80}};
  EXPECT_EQ(error_of(j), "horizons: the warmup and decay must end at the budget (100), they end at 90");
  j["schedule"]["decay"] = {{"type", "step"}, {"milestones", {50}}};
  EXPECT_EQ(error_of(j), "horizons: need a schedule.decay that ends with the run (wsd, cosine, linear or polynomial), "
                         "got step");
  j["schedule"] = {{"unit", "epochs"}, {"decay", {{"type", "linear"}, {"length", 100}}}};
  EXPECT_EQ(error_of(j), "horizons: give schedule.unit and the budget in one unit (schedule epochs, budget steps)");
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
                           "muon_lion_lm", "muon_lion_resnet", "schedule_free_quickstart", "soap_quickstart",
                           "shampoo_quickstart", "frontier_lm", "frontier_resnet"}) {
    const auto sweeps = load_sweeps(std::string(BIGBATCH_SOURCE_DIR) + "/experiments/configs/" + name + ".json");
    EXPECT_FALSE(sweeps.empty()) << name;
    for (const auto& s : sweeps) EXPECT_FALSE(expand(s.sweep).empty()) << name;
  }
}

}  // namespace
