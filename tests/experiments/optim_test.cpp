// The optimizers' runner entries (experiments/optim/): a user's own optimizer
// registered from outside the library is named by a config, resolved,
// refused with its own messages and trained by the runner; LARS's entry
// owns the momentum correction; every built-in's keys are its own.
#include "../../experiments/optim/entry.h"
#include "../../experiments/optim/optimizer.h"
#include "../../experiments/runconfig/config.h"
#include "../../experiments/train/trial.h"
#include "../../optimizers/lars.h"

#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/rmsprop.h>

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
            "optimizer.momentum_correction: larc has no such key (its keys: eps, momentum, nesterov, "
            "trust_coefficient, weight_decay); a variant drops its base's with \"momentum_correction\": null");
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
  EXPECT_EQ(keys("lars"), (V{"eps", "momentum", "momentum_correction", "nesterov", "trust_coefficient", "weight_decay"}));
  EXPECT_EQ(keys("larc"), (V{"eps", "momentum", "nesterov", "trust_coefficient", "weight_decay"}));
  EXPECT_EQ(keys("lamb"), (V{"betas", "eps", "max_grad_norm", "weight_decay"}));
  EXPECT_EQ(keys("novograd"), (V{"betas", "eps", "weight_decay"}));
  EXPECT_EQ(keys("lion"), (V{"betas", "weight_decay"}));
  EXPECT_EQ(keys("muon"), (V{"adjust_lr", "betas", "eps", "momentum", "nesterov", "weight_decay"}));
  // The defaults are the optimizers' own, the runner's two choices aside
  // (SGD's momentum 0.9; Muon's match_rms_adamw scale).
  EXPECT_EQ(resolve_optimizer("adamw").params.at("weight_decay"), 0.01);
  EXPECT_EQ(resolve_optimizer("lamb").params.at("eps"), 1e-6);
  EXPECT_EQ(resolve_optimizer("larc").params.at("trust_coefficient"), 0.02);
  EXPECT_EQ(resolve_optimizer("sgd").params.at("momentum"), 0.9);
  EXPECT_EQ(resolve_optimizer("muon").params.at("adjust_lr"), "match_rms_adamw");
}

}  // namespace
