// The optimizers' runner entries (experiments/optim/): a user's own optimizer
// registered from outside the library is named by a config, resolved,
// refused with its own messages and trained by the runner; LARS's entry
// owns the momentum correction; every built-in's keys are its own.
#include "../../experiments/optim/entry.h"
#include "../../experiments/optim/optimizer.h"
#include "../../experiments/runconfig/config.h"
#include "../../experiments/train/trial.h"
#include "../../optimizers/kind.h"
#include "../../optimizers/lamb.h"
#include "../../optimizers/lars.h"
#include "../../optimizers/muon.h"
#include "../../optimizers/param_groups.h"

#include <gtest/gtest.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/rmsprop.h>

#include <cmath>
#include <stdexcept>

namespace {

using namespace bigbatch::experiments;
using nlohmann::json;

struct RmspropKeys {
  double alpha = 0.99;
  double eps = 1e-8;
  double weight_decay = 0;
};

// torch's RMSprop as a seventh optimizer, written as a user program would:
// its keys, their checks, and how it is built, over the usual two groups.
OptimizerEntry rmsprop_entry(const std::string& name) {
  return keyed_entry<RmspropKeys>(
      name,
      [](auto& io, auto& k) {
        io.field("alpha", k.alpha);
        io.check("alpha", k.alpha > 0 && k.alpha < 1, "must be in (0, 1), got " + bigbatch::config::num(k.alpha));
        eps_key(io, k.eps);
        weight_decay_key(io, k.weight_decay);
      },
      [](const RmspropKeys& k, double lr, torch::nn::Module& model) -> std::unique_ptr<torch::optim::Optimizer> {
        const auto o = torch::optim::RMSpropOptions(lr).alpha(k.alpha).eps(k.eps).weight_decay(k.weight_decay);
        return std::make_unique<torch::optim::RMSprop>(torch_groups(model, o), o);
      });
}

json sweep_config(const json& optimizer) {
  return {{"name", "t"},
          {"dataset", {{"name", "gaussian_mixture"}, {"train_size", 2048}, {"val_size", 512}, {"classes", 3},
                       {"dim", 5}, {"separation", 1}}},  // overlapping: never reached
          {"model", {{"type", "mlp"}, {"widths", {16}}}},
          {"optimizer", optimizer},
          {"target", {{"threshold", 0.001}, {"eval_every", 10}}},
          {"budget", {{"steps", 100}}},
          {"batch_sizes", {64}},
          {"search", {{"lr", {0.003}}}},
          {"seeds", {0}}};
}

std::string error_of(const json& j) {
  try {
    parse_sweep(j);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(OptimizerEntries, AUserOptimizerIsNamedByAConfigAndTrains) {
  register_optimizer(rmsprop_entry("rmsprop_user"));
  EXPECT_EQ(registered_optimizers().back(), "rmsprop_user");
  EXPECT_THROW(register_optimizer(rmsprop_entry("rmsprop_user")), std::invalid_argument);
  EXPECT_THROW(register_optimizer(rmsprop_entry("lamb")), std::invalid_argument);  // a built-in's name
  OptimizerEntry incomplete;
  incomplete.name = "incomplete";
  EXPECT_THROW(register_optimizer(incomplete), std::invalid_argument);

  // Its keys, every default written out; its own checks; nobody else's keys.
  const SweepConfig s = parse_sweep(sweep_config({{"name", "rmsprop_user"}, {"alpha", 0.9}}));
  EXPECT_EQ(s.base.optimizer.params, (json{{"alpha", 0.9}, {"eps", 1e-8}, {"weight_decay", 0.0}}));
  EXPECT_EQ(error_of(sweep_config({{"name", "rmsprop_user"}, {"alpha", 1.5}})),
            "optimizer.alpha: must be in (0, 1), got 1.5");
  EXPECT_EQ(error_of(sweep_config({{"name", "rmsprop_user"}, {"nesterov", true}})),
            "optimizer.nesterov: rmsprop_user has no such key (its keys: alpha, eps, weight_decay); a variant drops "
            "its base's with \"nesterov\": null");

  // The runner trains it: the optimizer is torch's RMSprop with the config's
  // alpha, and the training loss falls.
  const auto trials = expand(s);
  ASSERT_EQ(trials.size(), 1u);
  const WorkloadData data = load_dataset(trials[0].data);
  Trainer trainer(trials[0], data);
  const auto* rmsprop = dynamic_cast<const torch::optim::RMSprop*>(&trainer.optimizer());
  ASSERT_NE(rmsprop, nullptr);
  EXPECT_EQ(static_cast<const torch::optim::RMSpropOptions&>(rmsprop->param_groups()[0].options()).alpha(), 0.9);
  const TrialResult r = trainer.run().at(0);
  ASSERT_GE(r.rows.size(), 2u);
  EXPECT_GT(r.steps, 0);
  EXPECT_LT(r.rows.back().train_loss, 0.5 * r.rows.front().train_loss);
  EXPECT_TRUE(trainer.layer_scalars().empty());  // it logs no per-layer scalars
}

// LARS keeps the rate in its momentum buffer; with momentum_correction its
// entry gives the schedule a hook that rescales the buffer by the rate's
// factor. Without it, and for LARC, there is no hook.
TEST(OptimizerEntries, LarsOwnsItsMomentumCorrection) {
  torch::nn::Linear model(3, 2);
  const OptimizerSpec plain = resolve_optimizer("lars");
  const OptimizerSpec corrected = resolve_optimizer("lars", {{"momentum_correction", true}});
  auto optimizer = make_optimizer(corrected, 0.1, *model);
  EXPECT_FALSE(rate_change(plain, *optimizer));
  EXPECT_FALSE(rate_change(resolve_optimizer("larc"), *optimizer));
  const auto change = rate_change(corrected, *optimizer);
  ASSERT_TRUE(change);

  model->weight.mutable_grad() = torch::ones_like(model->weight);
  model->bias.mutable_grad() = torch::ones_like(model->bias);
  optimizer->step();
  auto& lars = dynamic_cast<bigbatch::optim::LARS&>(*optimizer);
  ASSERT_NE(lars.param_state(model->weight), nullptr);
  const at::Tensor before = lars.param_state(model->weight)->momentum_buffer().clone();
  ASSERT_GT(before.abs().sum().item<double>(), 0);
  change(0.25);
  EXPECT_TRUE(torch::allclose(lars.param_state(model->weight)->momentum_buffer(), 0.25 * before));
  EXPECT_EQ(error_of(sweep_config({{"name", "larc"}, {"momentum_correction", true}})),
            "optimizer.momentum_correction: larc has no such key (its keys: adapt, always_adapt, clip, eps, fused, "
            "master_weights, momentum, nesterov, skip_nonfinite, trust_coefficient, weight_decay); a variant drops "
            "its base's with \"momentum_correction\": null");
}

// Each built-in writes out exactly its own keys: what its optimizer reads.
TEST(OptimizerEntries, EachBuiltinHasItsOwnKeys) {
  const auto keys = [](const std::string& name) {
    std::vector<std::string> out;
    const OptimizerSpec spec = resolve_optimizer(name);
    for (const auto& item : spec.params.items()) out.push_back(item.key());
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(keys("sgd"), (V{"momentum", "nesterov", "weight_decay"}));
  EXPECT_EQ(keys("adam"), (V{"betas", "eps", "weight_decay"}));
  EXPECT_EQ(keys("adamw"), (V{"betas", "eps", "weight_decay"}));
  // The library's: every option of its C++ options but lr (the schedule's),
  // under the C++ name; LARS adds the runner's momentum correction.
  EXPECT_EQ(keys("lars"), (V{"adapt", "always_adapt", "eps", "fused", "master_weights", "momentum",
                             "momentum_correction", "nesterov", "skip_nonfinite", "trust_coefficient",
                             "weight_decay"}));
  EXPECT_EQ(keys("larc"), (V{"adapt", "always_adapt", "clip", "eps", "fused", "master_weights", "momentum",
                             "nesterov", "skip_nonfinite", "trust_coefficient", "weight_decay"}));
  EXPECT_EQ(keys("lamb"), (V{"adam_w_mode", "adapt", "always_adapt", "betas", "bias_correction", "eps", "fused",
                             "grad_averaging", "master_weights", "max_grad_norm", "max_trust", "min_trust",
                             "skip_nonfinite", "trust_clip", "weight_decay"}));
  EXPECT_EQ(keys("novograd"), (V{"adapt", "betas", "eps", "fused", "grad_averaging", "master_weights",
                                 "skip_nonfinite", "weight_decay"}));
  EXPECT_EQ(keys("lion"), (V{"adapt", "betas", "fused", "master_weights", "skip_nonfinite", "weight_decay"}));
  EXPECT_EQ(keys("muon"), (V{"adamw_betas", "adamw_eps", "adjust_lr", "eps", "fused", "master_weights", "momentum",
                             "nesterov", "ns_bfloat16", "ns_coefficients", "ns_steps", "orthogonalize",
                             "skip_nonfinite", "weight_decay"}));
  EXPECT_EQ(keys("adamwschedulefree"), (V{"adapt", "betas", "eps", "fused", "master_weights", "r", "skip_nonfinite",
                                          "warmup_steps", "weight_decay", "weight_lr_power"}));
  EXPECT_EQ(keys("sgdschedulefree"), (V{"adapt", "fused", "master_weights", "momentum", "r", "skip_nonfinite",
                                        "warmup_steps", "weight_decay", "weight_lr_power"}));
  EXPECT_EQ(keys("soap"), (V{"adapt", "betas", "correct_bias", "eps", "fused", "master_weights", "max_precond_dim",
                             "merge_dims", "normalize_grads", "precondition_1d", "precondition_frequency",
                             "shampoo_beta", "skip_nonfinite", "weight_decay"}));
  EXPECT_EQ(keys("shampoo"),
            (V{"adapt", "betas", "dampening", "epsilon", "fused", "grafting", "grafting_beta2", "grafting_epsilon",
               "inv_root_override", "master_weights", "max_preconditioner_dim", "momentum", "precondition_1d",
               "precondition_frequency", "skip_nonfinite", "start_preconditioning_step", "use_bias_correction",
               "use_decoupled_weight_decay", "use_merge_dims", "use_nesterov", "weight_decay"}));
  // The defaults are the optimizers' own, the runner's two choices aside
  // (SGD's momentum 0.9; Muon's match_rms_adamw scale).
  EXPECT_EQ(resolve_optimizer("adamw").params.at("weight_decay"), 0.01);
  EXPECT_EQ(resolve_optimizer("lamb").params.at("eps"), 1e-6);
  EXPECT_EQ(resolve_optimizer("larc").params.at("trust_coefficient"), 0.02);
  EXPECT_EQ(resolve_optimizer("sgd").params.at("momentum"), 0.9);
  EXPECT_EQ(resolve_optimizer("muon").params.at("adjust_lr"), "match_rms_adamw");
}

// Every option of every one of the library's optimizers is a config key:
// set to a value other than its default, it is the option of the optimizer
// the runner makes (group 0: the decayed weights, Muon's hidden matrices), as
// the optimizer itself reports it. A key the runner dropped or did not pass
// on fails here.
TEST(OptimizerEntries, EveryOptionOfTheLibrarysOptimizersReachesTheOptimizer) {
  // Another valid value of each option: halved (0 becomes 0.125, inf 1000),
  // flipped, one more; a string option's other value, named here.
  // Shampoo's start step: -1 or at least precondition_frequency (not 0).
  const json strings = {{"adjust_lr", "spectral_unclamped"}, {"grafting", "rmsprop"}};
  const auto other = [&](const std::string& key, const json& v) -> json {
    if (key == "start_preconditioning_step") return 5;
    if (v.is_boolean()) return !v.get<bool>();
    if (v.is_number_integer()) return v.get<std::int64_t>() + 1;
    if (v.is_number()) return v.get<double>() == 0 ? 0.125 : v.get<double>() * 0.5;
    if (v == "inf") return 1000.0;
    if (v.is_string()) return strings.at(key);
    json out = json::array();
    for (const auto& e : v) out.push_back(e.get<double>() * 0.5);
    return out;
  };
  int checked = 0;
  for (const auto& kind : bigbatch::optim::optimizer_kinds()) {
    std::string name = kind.name;
    for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const OptimizerSpec defaults = resolve_optimizer(name);
    for (const auto& [key, value] : kind.defaults.items()) {
      if (key == "lr") continue;  // the schedule's
      SCOPED_TRACE(name + "." + key);
      ASSERT_TRUE(defaults.params.contains(key)) << "not a config key";
      const json wanted = other(key, defaults.params.at(key));
      ASSERT_NE(wanted, defaults.params.at(key));
      const OptimizerSpec spec = resolve_optimizer(name, {{key, wanted}});
      EXPECT_EQ(spec.params.at(key), wanted);
      torch::nn::Sequential model(torch::nn::Linear(4, 6), torch::nn::Linear(6, 6), torch::nn::Linear(6, 3));
      const auto optimizer = make_optimizer(spec, 0.1, *model);
      const auto& made = dynamic_cast<const bigbatch::optim::LayerwiseOptimizerBase&>(*optimizer);
      const json options = kind.group_options(made, 0);
      EXPECT_EQ(options.at(key), wanted);
      EXPECT_EQ(options.at("lr"), 0.1);
      ++checked;
    }
  }
  // LARS, LARC, LAMB, NovoGrad, Lion, Muon, AdamWScheduleFree, SGDScheduleFree, SOAP, Shampoo: every
  // option but lr.
  EXPECT_EQ(checked, 10 + 11 + 15 + 8 + 6 + 14 + 10 + 9 + 14 + 21);
}

// A value an optimizer refuses is refused at its config key, in the
// optimizer's own words (its validate()), before anything is made.
TEST(OptimizerEntries, TheOptimizersOwnChecksNameTheKey) {
  EXPECT_EQ(error_of(sweep_config({{"name", "lamb"}, {"max_trust", 0.5}, {"min_trust", 1.0}})),
            "optimizer.max_trust: must be >= min_trust, got 0.5");
  EXPECT_EQ(error_of(sweep_config({{"name", "lars"}, {"nesterov", true}, {"momentum", 0.0}})),
            "optimizer.momentum: must be > 0 with nesterov, got 0");
  EXPECT_EQ(error_of(sweep_config({{"name", "lion"}, {"betas", {0.9, 1.0}}})),
            "optimizer.betas[1]: must be in [0, 1), got 1");
  EXPECT_EQ(error_of(sweep_config({{"name", "muon"}, {"ns_steps", 2.5}})),
            "optimizer.ns_steps: must be an integer, got 2.5");
  EXPECT_EQ(error_of(sweep_config({{"name", "lamb"}, {"trust_clip", "yes"}})),
            "optimizer.trust_clip: must be true or false, got \"yes\"");
}

// The derived entries make, from a config's defaults, exactly the optimizer
// the runner's own entries made before (written out here as they were): the
// same groups of the same parameters with equal options. So a sweep's table
// is unchanged by the derivation.
template <typename Options>
void expect_same_groups(const torch::optim::Optimizer& made, const std::vector<torch::optim::OptimizerParamGroup>& want) {
  ASSERT_EQ(made.param_groups().size(), want.size());
  for (std::size_t g = 0; g < want.size(); ++g) {
    SCOPED_TRACE("group " + std::to_string(g));
    const auto& a = made.param_groups()[g];
    ASSERT_EQ(a.params().size(), want[g].params().size());
    for (std::size_t i = 0; i < a.params().size(); ++i) EXPECT_TRUE(a.params()[i].is_same(want[g].params()[i]));
    EXPECT_TRUE(static_cast<const Options&>(a.options()) == static_cast<const Options&>(want[g].options()));
  }
}

TEST(OptimizerEntries, TheDerivedEntriesMakeWhatTheWrittenOnesMade) {
  namespace bo = bigbatch::optim;
  torch::nn::Sequential model(torch::nn::Linear(4, 6), torch::nn::Linear(6, 6), torch::nn::Linear(6, 3));
  const auto plain = plain_rule(*model);
  {
    const auto made = make_optimizer(resolve_optimizer("lamb", {{"weight_decay", 0.02}}), 0.1, *model);
    const auto o = bo::LAMBOptions(0.1).weight_decay(0.02);
    expect_same_groups<bo::LAMBOptions>(*made, bo::layerwise_param_groups(*model, o, plain));
  }
  {
    const auto made = make_optimizer(resolve_optimizer("lars", {{"momentum", 0.8}}), 0.1, *model);
    expect_same_groups<bo::LARSOptions>(*made, bo::layerwise_param_groups(*model, bo::LARSOptions(0.1).momentum(0.8), plain));
  }
  {
    const auto made = make_optimizer(resolve_optimizer("muon"), 0.1, *model);
    const auto o = bo::MuonOptions(0.1).adjust_lr("match_rms_adamw");
    expect_same_groups<bo::MuonOptions>(
        *made, bo::muon_param_groups(*model, o, bo::muon_adamw_rule(*model),
                                     [&](const std::string&, const at::Tensor& p) { return plain(p); }));
  }
}

}  // namespace
