// Models of the experiment runner: linear, MLP (optionally with BatchNorm or
// GhostBatchNorm), the simple CNN of Shallue et al. 2018 (base/narrow/wide),
// and a small ResNet (8 layers) with BatchNorm or GhostBatchNorm.
#pragma once

#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <string>
#include <vector>

namespace bigbatch::experiments {

/// "model" in a sweep config.
struct ModelSpec {
  std::string type = "mlp";             ///< linear, mlp, simple_cnn, resnet
  std::vector<std::int64_t> widths{256, 256};  ///< mlp hidden widths
  std::string norm = "none";            ///< mlp, resnet: none, batch, ghost
  std::int64_t ghost_batch_size = 32;   ///< norm = ghost
  std::string variant = "base";         ///< simple_cnn: base, narrow, wide
  std::int64_t width = 16;              ///< resnet: channels of the first stage
};

/// Builds the model for inputs of `example_shape` and `outputs` outputs
/// (classes, or 1 for regression). Parameters are initialized from LibTorch's
/// global generator: seed it first.
torch::nn::Sequential make_model(const ModelSpec& spec, const std::vector<std::int64_t>& example_shape,
                                 std::int64_t outputs);

}  // namespace bigbatch::experiments
