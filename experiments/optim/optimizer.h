// The optimizers a config can name ("optimizer": {"name": NAME, ...keys}),
// each an entry that owns everything the runner needs of it: its keys with
// their defaults and checks, how it is built over a model's parameter groups,
// what it does when the schedule changes the rate, and the per-layer scalars
// it logs. torch's built-ins live one file each beside this one (sgd.cpp,
// adam.cpp); the library's optimizers (optimizers/kind.h) get entries derived
// from their own description (kind_entry, entry.h), which lars.cpp and
// muon.cpp add to; a user program adds its own with register_optimizer(), as
// it adds datasets and models (workload.h). The runner's generic code names no optimizer: it
// keeps a trial's optimizer as a name and its resolved keys (OptimizerSpec)
// and asks the entry. docs/architecture.md has the checklist for a new one.
#pragma once

#include "../../schedules/lr_adapter.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace bigbatch::experiments {

/// A trial's optimizer: the registered name and its keys as resolved by the
/// entry (every default written out): what sweep.json and config.json record.
struct OptimizerSpec {
  std::string name;
  nlohmann::json params = nlohmann::json::object();
  /// The "momentum" key, when the optimizer has one (the search sets it).
  std::optional<double> momentum() const;
};

/// One of the optimizer's scalars in the last step for one parameter:
/// logged as "<tag>/<the parameter's name>" (TensorBoard).
struct LayerScalar {
  std::string tag;  ///< "trust_ratio", "muon_update_rms"
  at::Tensor param;
  double value = 0;
};

struct OptimizerEntry {
  std::string name;  ///< the config's spelling
  /// Checks the config's keys (the "optimizer" object without "name") and
  /// returns them with every default written out. Errors are ConfigError
  /// "optimizer.<key>: <problem>" (config::JsonReader(keys, "optimizer")).
  /// The keys of resolve({}) are the optimizer's keys: a config giving any
  /// other is refused, naming them.
  std::function<nlohmann::json(const nlohmann::json& keys)> resolve;
  /// The optimizer over `model`'s parameters at rate `lr`, from resolved keys.
  std::function<std::unique_ptr<torch::optim::Optimizer>(const nlohmann::json& keys, double lr,
                                                         torch::nn::Module& model)>
      make;
  /// Optional: what the schedule's LRAdapter calls when the rate changes
  /// (LARS's momentum correction); empty or returning {}: nothing.
  std::function<schedules::LRAdapter::RateChange(const nlohmann::json& keys, torch::optim::Optimizer& optimizer)>
      rate_change;
  /// Optional: the per-layer scalars of the last step (trust ratios, Muon's
  /// update RMS), for TensorBoard; empty: none.
  std::function<std::vector<LayerScalar>(const torch::optim::Optimizer& optimizer)> scalars;
  /// Optional: a resolved "optimizer" object (without "name") of a folder
  /// written while the entry spelled its keys otherwise, as the entry spells
  /// them today (normalized_optimizer calls it first); empty: as it is.
  std::function<nlohmann::json(nlohmann::json resolved)> upgrade;
  /// Whether `distributed.shard` may shard it across data-parallel ranks: it
  /// makes a bigbatch layer-wise optimizer (optim::LayerwiseOptimizerBase)
  /// that distributed::ShardedOptimizer takes (docs/distributed.md).
  bool shards = false;
  /// Whether its optimizer moves the parameters to a point to evaluate
  /// (optim::LayerwiseOptimizerBase::has_evaluation_point: Schedule-Free):
  /// the trainer evaluates there, BatchNorm statistics recomputed.
  bool evaluation_point = false;
};

/// Adds an optimizer a config can name (thread-safe). A name already taken,
/// a built-in's included, is an error (std::invalid_argument), as is an entry
/// without resolve or make. Register before parsing a config or calling cli_main.
void register_optimizer(OptimizerEntry entry);
/// The registered names: the built-ins in the order error messages list
/// them (torch's sgd, adam, adamw; then the library's in optimizer_kinds()'
/// order: lars, larc, lamb, novograd, lion, muon, adamwschedulefree,
/// sgdschedulefree), then the registered ones.
std::vector<std::string> registered_optimizers();
/// The entry of `name`; ConfigError "optimizer.name: unknown value ..."
/// listing the registered ones when there is none.
const OptimizerEntry& optimizer_entry(const std::string& name);

/// `keys` (the "optimizer" object without "name") resolved by `name`'s entry.
/// A key the optimizer does not have is refused naming its keys (and how a
/// variant drops a key of its base's optimizer).
OptimizerSpec resolve_optimizer(const std::string& name, const nlohmann::json& keys = nlohmann::json::object());

/// The optimizer a spec names, over the model's parameter groups (optim/
/// entry.h: the plain parameters get no weight decay and no trust ratio).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerSpec& spec, double lr,
                                                        torch::nn::Module& model);

/// What the schedule's LRAdapter calls when the rate changes, for
/// `optimizer` made from `spec` (the entry's rate_change; else nothing).
schedules::LRAdapter::RateChange rate_change(const OptimizerSpec& spec, torch::optim::Optimizer& optimizer);

/// The per-layer scalars of `optimizer`, made from `spec`, in its last step.
std::vector<LayerScalar> layer_scalars(const OptimizerSpec& spec, const torch::optim::Optimizer& optimizer);

/// A resolved "optimizer" object as a resolved config of today would hold
/// it, from one a folder wrote before each optimizer owned its keys (every
/// optimizer then wrote momentum, nesterov and momentum_correction, which
/// those it did not concern ignored): the keys its optimizer does not have
/// dropped, its defaults written out. Anything it cannot resolve is left as
/// it is (and then differs). What identity() compares.
nlohmann::json normalized_optimizer(const nlohmann::json& resolved);

}  // namespace bigbatch::experiments
