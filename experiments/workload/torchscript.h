// Models saved by torch.jit.script / torch.jit.trace in Python, trained by
// the runner without compiling anything: "model": {"type": "torchscript",
// "path": "net.pt"}. The file's parameters are the initial weights (every
// seed starts from them; the seed still sets the data order and noise).
#pragma once

#include "workload.h"

#include <string>

namespace torch::jit {
struct Module;
}  // namespace torch::jit

namespace bigbatch::experiments {

/// A TorchScript module as a trial's Model: its parameters and buffers,
/// the same tensors, registered under their own names ("fc1.weight") in a
/// torch::nn::Module tree that mirrors the script module's, so optimizers
/// (layerwise_param_groups: weights vs biases and norms by shape), data
/// parallel, checkpoints and trust ratios see them; train()/eval() and
/// forward() reach the script module.
Model script_model(const torch::jit::Module& module);

/// Loads `path` (torch::jit::load) as a Model. ConfigError "model.path: ..."
/// naming the file when it is missing, not a TorchScript module, has no
/// forward method, or has no parameters to train.
Model load_script_model(const std::string& path);

/// The "torchscript" registration: {"path": string}, the file checked when
/// the config is read.
ModelRegistration torchscript_model();

}  // namespace bigbatch::experiments
