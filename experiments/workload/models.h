// The built-in models, registered as any user's (workload.h): linear, MLP
// (optionally with BatchNorm or GhostBatchNorm), the simple CNN of Shallue
// et al. 2018 (base/narrow/wide), He et al.'s CIFAR ResNets of depth 6n + 2
// (ResNet-8, -20, -56, ...) and ResNet-18, with BatchNorm or GhostBatchNorm.
#pragma once

#include "workload.h"
#include "../../config/json_reader.h"

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <mutex>
#include <vector>

namespace bigbatch::experiments {

enum class ModelType { kLinear, kMlp, kSimpleCnn, kResnet, kResnet18 };
enum class Norm { kNone, kBatch, kGhost };
enum class CnnVariant { kBase, kNarrow, kWide };

/// How configs spell them, in the order error messages list them.
inline constexpr config::EnumName<ModelType> kModelTypes[] = {
    {ModelType::kLinear, "linear"}, {ModelType::kMlp, "mlp"}, {ModelType::kSimpleCnn, "simple_cnn"},
    {ModelType::kResnet, "resnet"}, {ModelType::kResnet18, "resnet18"}};
inline constexpr config::EnumName<Norm> kNorms[] = {
    {Norm::kNone, "none"}, {Norm::kBatch, "batch"}, {Norm::kGhost, "ghost"}};
inline constexpr config::EnumName<CnnVariant> kCnnVariants[] = {
    {CnnVariant::kBase, "base"}, {CnnVariant::kNarrow, "narrow"}, {CnnVariant::kWide, "wide"}};

/// A built-in model's parameters ("model" in a sweep config).
struct ModelSpec {
  ModelType type = ModelType::kMlp;
  std::vector<std::int64_t> widths{256, 256};  ///< mlp hidden widths
  Norm norm = Norm::kNone;                     ///< mlp, resnet
  std::int64_t ghost_batch_size = 32;          ///< norm = ghost
  CnnVariant variant = CnnVariant::kBase;      ///< simple_cnn
  std::int64_t width = 16;                     ///< resnet: channels of the first stage (resnet18: 64)
  std::int64_t depth = 8;                      ///< resnet: 6n + 2 weight layers, n blocks a stage
};

/// The small ResNet's block: relu(x + F(x)), F = conv-norm-relu-conv-norm,
/// with a strided 1x1 projection (conv-norm) as the shortcut when the shape
/// changes. Public for the batched trials, which stack its two parts.
class ResidualBlockImpl : public torch::nn::Cloneable<ResidualBlockImpl> {
 public:
  ResidualBlockImpl(const ModelSpec& spec, std::int64_t in, std::int64_t out, std::int64_t stride);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);
  const torch::nn::Sequential& body() const { return body_; }
  /// Null when the shortcut is the identity.
  const torch::nn::Sequential& shortcut() const { return shortcut_; }

 private:
  ModelSpec spec_;
  std::int64_t in_, out_, stride_;
  torch::nn::Sequential body_{nullptr};
  torch::nn::Sequential shortcut_{nullptr};
};
TORCH_MODULE(ResidualBlock);

/// Builds the model for inputs of `example_shape` and `outputs` outputs
/// (classes, or 1 for regression). Parameters are initialized from LibTorch's
/// global generator: seed it first.
torch::nn::Sequential make_model(const ModelSpec& spec, const std::vector<std::int64_t>& example_shape,
                                 std::int64_t outputs);

/// A built-in model's spec as a config's part (every key written out), and
/// back (ConfigError naming "model.<key>"), for a program that builds
/// configs in C++ (the tests do).
WorkloadPart model_part(const ModelSpec& spec);
ModelSpec model_spec(const WorkloadPart& part);

/// The lock under which a model is built after seeding LibTorch's global
/// generator: trials side by side (--jobs) each seed and build under it, so
/// that each model's initialization is its seed's alone.
std::mutex& model_init_mutex();

/// The model a config's "model" names (through its registration), for
/// `data`: LibTorch's global generator seeded with `seed` first, under
/// model_init_mutex(), so parallel trials stay reproducible.
Model build_model(const WorkloadPart& part, const WorkloadData& data, std::uint64_t seed);

/// The built-in models, registered under their config types: the four above
/// and "torchscript" (torchscript.h).
std::vector<ModelRegistration> builtin_models();

}  // namespace bigbatch::experiments
