// The optimizers a sweep config can name: one entry each, with its spelling
// and the function that builds it from an OptimizerSpec. The config parser
// takes the names from here, so a new optimizer is one enum value and one
// entry (docs/architecture.md has the checklist).
#pragma once

#include "config.h"
#include "../../schedules/lr_adapter.h"

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

namespace bigbatch::experiments {

struct OptimizerEntry {
  OptimizerName value;
  const char* name;  ///< the config's spelling
  /// The optimizer over `model`'s parameters at rate `lr`; options the spec
  /// leaves unset keep the optimizer's own defaults.
  std::unique_ptr<torch::optim::Optimizer> (*make)(const OptimizerSpec& spec, double lr,
                                                   torch::nn::Module& model);
};

/// Every optimizer, in the order error messages list them.
const std::vector<OptimizerEntry>& optimizer_registry();

/// The optimizer a spec names, over two parameter groups: the plain
/// parameters (0 or 1 dimensions, and the tables of torch::nn::Embedding
/// modules) get no weight decay, and no trust ratio from the layer-wise
/// optimizers; the rest get the spec's options.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerSpec& spec, double lr,
                                                        torch::nn::Module& model);

/// What the schedule's LRAdapter calls when the rate changes, for
/// `optimizer` made from `spec`: LARS's momentum correction where the spec
/// asks for it (Goyal et al. 2017), else nothing.
schedules::LRAdapter::RateChange rate_change(const OptimizerSpec& spec, torch::optim::Optimizer& optimizer);

}  // namespace bigbatch::experiments
