// Batched trials: K trials that differ only in their rate and momentum, at
// the same batch size and seed, see the same batches; they train as one
// stacked model whose layers carry a leading trial ("lane") dimension, so one
// matrix product serves all K (the model side: stacked_model in
// lane_model.h; the loop is the Trainer's, trial.h). The loss is the sum of
// the active lanes' mean losses, so no lane's gradient sees another's.
#pragma once

#include "../runconfig/config.h"
#include "../workload/workload.h"

#include <string>

namespace bigbatch::experiments {

/// Why `trial` cannot be trained in a batched group ("" when it can): no
/// gradient noise, no checkpoints, not fp16, not data-parallel (the caller's business).
/// With device cuda the group trains on cuda:0. The model has its own say:
/// stack_refusal.
std::string batch_refusal(const TrialConfig& trial);

/// Why `model` cannot be stacked ("" when it can): it is not a
/// torch::nn::Sequential, or holds a layer with no stacked form here
/// (linear, conv2d, batch and ghost batch norm, ReLU, pooling, flatten and
/// the built-in ResNet block have one). Every built-in model stacks.
std::string stack_refusal(const Model& model);

/// Whether trials a and b can share a group: both batchable, and equal but
/// for their names, rates and momenta.
bool batchable_together(const TrialConfig& a, const TrialConfig& b);

}  // namespace bigbatch::experiments
