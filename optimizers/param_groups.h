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
///   group 0: the parameters `plain` says no to, with `options`;
///   group 1: those it says yes to, with `options` but weight_decay(0)
///            and adapt(false).
/// Empty groups are left out. Works with any of the four options types.
template <typename Options, typename Plain>
std::vector<torch::optim::OptimizerParamGroup> layerwise_param_groups(
    const torch::nn::Module& module, const Options& options, const Plain& plain) {
  std::vector<torch::Tensor> weights;
  std::vector<torch::Tensor> others;
  for (const auto& p : module.parameters(/*recurse=*/true)) {
    if (!p.requires_grad()) continue;
    (plain(p) ? others : weights).push_back(p);
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!weights.empty()) {
    groups.emplace_back(weights, std::make_unique<Options>(options));
  }
  if (!others.empty()) {
    auto no_decay = std::make_unique<Options>(options);
    no_decay->weight_decay(0).adapt(false);
    groups.emplace_back(others, std::move(no_decay));
  }
  return groups;
}

/// The usual split: parameters of 0 or 1 dimension (biases, normalization
/// scales and shifts) are plain.
///   LAMB opt(layerwise_param_groups(model, LAMBOptions(1e-3)), LAMBOptions(1e-3));
template <typename Options>
std::vector<torch::optim::OptimizerParamGroup> layerwise_param_groups(
    const torch::nn::Module& module, const Options& options) {
  return layerwise_param_groups(module, options, [](const torch::Tensor& p) { return p.dim() < 2; });
}

}  // namespace bigbatch::optim
