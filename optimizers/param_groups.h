// The two parameter groups of large-batch training (You et al. 2017/2019,
// Goyal et al. 2017): weights with weight decay and the trust ratio, and
// biases and other 1-D parameters (normalization scales and shifts) without either.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

namespace bigbatch::optim {

/// Splits the trainable parameters of `module` into
///   group 0: parameters of 2 or more dimensions, with `options`;
///   group 1: parameters of 0 or 1 dimension, with `options` but
///            weight_decay(0) and adapt(false).
/// Empty groups are left out. Works with any of the four options types:
///   LAMB opt(layerwise_param_groups(model, LAMBOptions(1e-3)), LAMBOptions(1e-3));
template <typename Options>
std::vector<torch::optim::OptimizerParamGroup> layerwise_param_groups(
    const torch::nn::Module& module, const Options& options) {
  std::vector<torch::Tensor> weights;
  std::vector<torch::Tensor> others;
  for (const auto& p : module.parameters(/*recurse=*/true)) {
    if (!p.requires_grad()) continue;
    (p.dim() >= 2 ? weights : others).push_back(p);
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!weights.empty()) {
    groups.emplace_back(weights, std::make_unique<Options>(options));
  }
  if (!others.empty()) {
    auto plain = std::make_unique<Options>(options);
    plain->weight_decay(0).adapt(false);
    groups.emplace_back(others, std::move(plain));
  }
  return groups;
}

}  // namespace bigbatch::optim
