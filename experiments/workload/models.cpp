// Models (models.h). The simple CNN is conv5x5(32)-maxpool2-conv5x5(64)-
// maxpool2-fc(1024)-fc(10), ReLU, same padding (narrow 16/32/512, wide
// 64/128/2048), as docs/formulas.md "Steps to result" fixes it.
#include "models.h"

#include "torchscript.h"
#include "../../config/fields.h"
#include "../../normalization/ghost_batch_norm.h"

#include <c10/util/Exception.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

#include <mutex>
#include <numeric>

namespace bigbatch::experiments {
namespace {

using torch::nn::Sequential;

std::int64_t product(const std::vector<std::int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), std::int64_t{1}, std::multiplies<>());
}

void check_norm(const ModelSpec& s) {
  TORCH_CHECK(s.ghost_batch_size > 0, "model.ghost_batch_size: must be > 0, got ", s.ghost_batch_size);
}

void add_norm1d(Sequential& net, const ModelSpec& s, std::int64_t features) {
  if (s.norm == Norm::kBatch) net->push_back(torch::nn::BatchNorm1d(features));
  if (s.norm == Norm::kGhost) net->push_back(nn::GhostBatchNorm1d(nn::GhostBatchNormOptions(features, s.ghost_batch_size)));
}

void add_norm2d(Sequential& net, const ModelSpec& s, std::int64_t channels) {
  if (s.norm == Norm::kBatch) net->push_back(torch::nn::BatchNorm2d(channels));
  if (s.norm == Norm::kGhost) net->push_back(nn::GhostBatchNorm2d(nn::GhostBatchNormOptions(channels, s.ghost_batch_size)));
}

torch::nn::Conv2d conv(std::int64_t in, std::int64_t out, std::int64_t k, std::int64_t stride, bool bias) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, k).stride(stride).padding(k / 2).bias(bias));
}

}  // namespace

ResidualBlockImpl::ResidualBlockImpl(const ModelSpec& spec, std::int64_t in, std::int64_t out, std::int64_t stride)
    : spec_(spec), in_(in), out_(out), stride_(stride) {
  reset();
}

void ResidualBlockImpl::reset() {
  const bool norm = spec_.norm != Norm::kNone;
  body_ = Sequential();
  body_->push_back(conv(in_, out_, 3, stride_, !norm));
  add_norm2d(body_, spec_, out_);
  body_->push_back(torch::nn::ReLU());
  body_->push_back(conv(out_, out_, 3, 1, !norm));
  add_norm2d(body_, spec_, out_);
  register_module("body", body_);
  if (in_ != out_ || stride_ != 1) {
    shortcut_ = Sequential();
    shortcut_->push_back(conv(in_, out_, 1, stride_, !norm));
    add_norm2d(shortcut_, spec_, out_);
    register_module("shortcut", shortcut_);
  }
}

at::Tensor ResidualBlockImpl::forward(const at::Tensor& x) {
  const at::Tensor skip = shortcut_ ? shortcut_->forward(x) : x;
  return at::relu(body_->forward(x) + skip);
}

namespace {


Sequential mlp(const ModelSpec& s, std::int64_t inputs, std::int64_t outputs) {
  check_norm(s);
  Sequential net;
  net->push_back(torch::nn::Flatten());
  std::int64_t in = inputs;
  for (const std::int64_t w : s.widths) {
    TORCH_CHECK(w > 0, "model.widths: every width must be > 0, got ", w);
    net->push_back(torch::nn::Linear(in, w));
    add_norm1d(net, s, w);
    net->push_back(torch::nn::ReLU());
    in = w;
  }
  net->push_back(torch::nn::Linear(in, outputs));
  return net;
}

Sequential simple_cnn(const ModelSpec& s, const std::vector<std::int64_t>& shape, std::int64_t outputs) {
  TORCH_CHECK(shape.size() == 3, "model.type: simple_cnn needs image inputs (C, H, W)");
  std::int64_t c1 = 32, c2 = 64, fc = 1024;
  if (s.variant == CnnVariant::kNarrow) {
    c1 = 16, c2 = 32, fc = 512;
  } else if (s.variant == CnnVariant::kWide) {
    c1 = 64, c2 = 128, fc = 2048;
  }
  Sequential net;
  net->push_back(conv(shape[0], c1, 5, 1, true));
  net->push_back(torch::nn::ReLU());
  net->push_back(torch::nn::MaxPool2d(2));
  net->push_back(conv(c1, c2, 5, 1, true));
  net->push_back(torch::nn::ReLU());
  net->push_back(torch::nn::MaxPool2d(2));
  net->push_back(torch::nn::Flatten());
  net->push_back(torch::nn::Linear(c2 * (shape[1] / 4) * (shape[2] / 4), fc));
  net->push_back(torch::nn::ReLU());
  net->push_back(torch::nn::Linear(fc, outputs));
  return net;
}

// Stages of residual blocks after the stem: stage k has blocks[k] blocks of
// width * 2^k channels, its first strided 2 (but the first stage's), then
// global average pooling and fc.
Sequential residual_stages(Sequential net, const ModelSpec& s, const std::vector<std::int64_t>& blocks,
                           std::int64_t outputs) {
  std::int64_t in = s.width;
  for (std::size_t k = 0; k < blocks.size(); ++k) {
    const std::int64_t out = s.width << k;
    for (std::int64_t b = 0; b < blocks[k]; ++b) {
      net->push_back(ResidualBlock(s, in, out, b == 0 && k > 0 ? 2 : 1));
      in = out;
    }
  }
  net->push_back(torch::nn::AdaptiveAvgPool2d(1));
  net->push_back(torch::nn::Flatten());
  net->push_back(torch::nn::Linear(in, outputs));
  return net;
}

// He et al. 2016's CIFAR ResNets (section 4.2): a conv3x3 stem, three stages
// of n blocks (w, 2w, 4w channels on 32, 16, 8 pixels), 6n + 2 weight layers:
// ResNet-8 (n = 1, Shallue et al.'s), -20 (3), -56 (9). The shortcut where
// the shape changes is a strided 1x1 conv and norm (their option B) rather
// than option A's zero padding.
Sequential resnet(const ModelSpec& s, const std::vector<std::int64_t>& shape, std::int64_t outputs) {
  TORCH_CHECK(shape.size() == 3, "model.type: resnet needs image inputs (C, H, W)");
  TORCH_CHECK(s.width > 0, "model.width: must be > 0, got ", s.width);
  TORCH_CHECK(s.depth >= 8 && (s.depth - 2) % 6 == 0, "model.depth: must be 6n + 2 with n >= 1, got ", s.depth);
  check_norm(s);
  Sequential net;
  net->push_back(conv(shape[0], s.width, 3, 1, s.norm == Norm::kNone));
  add_norm2d(net, s, s.width);
  net->push_back(torch::nn::ReLU());
  const std::int64_t n = (s.depth - 2) / 6;
  return residual_stages(net, s, {n, n, n}, outputs);
}

// ResNet-18 (He et al. 2016's ImageNet layout: four stages of two blocks,
// w to 8w channels). Inputs up to 64 pixels a side get a conv3x3 stride-1
// stem and no max pooling, as AlgoPerf's CIFAR-10 workload has it; larger
// ones the ImageNet stem, conv7x7 stride 2 and a 3x3 stride-2 max pool.
Sequential resnet18(const ModelSpec& s, const std::vector<std::int64_t>& shape, std::int64_t outputs) {
  TORCH_CHECK(shape.size() == 3, "model.type: resnet18 needs image inputs (C, H, W)");
  TORCH_CHECK(s.width > 0, "model.width: must be > 0, got ", s.width);
  check_norm(s);
  const bool small = shape[1] <= 64 && shape[2] <= 64;
  Sequential net;
  net->push_back(small ? conv(shape[0], s.width, 3, 1, s.norm == Norm::kNone)
                       : conv(shape[0], s.width, 7, 2, s.norm == Norm::kNone));
  add_norm2d(net, s, s.width);
  net->push_back(torch::nn::ReLU());
  if (!small) net->push_back(torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(3).stride(2).padding(1)));
  return residual_stages(net, s, {2, 2, 2, 2}, outputs);
}

}  // namespace

Sequential make_model(const ModelSpec& spec, const std::vector<std::int64_t>& example_shape,
                      std::int64_t outputs) {
  switch (spec.type) {
    case ModelType::kLinear: {
      Sequential net;
      net->push_back(torch::nn::Flatten());
      net->push_back(torch::nn::Linear(product(example_shape), outputs));
      return net;
    }
    case ModelType::kMlp: return mlp(spec, product(example_shape), outputs);
    case ModelType::kSimpleCnn: return simple_cnn(spec, example_shape, outputs);
    case ModelType::kResnet: return resnet(spec, example_shape, outputs);
    case ModelType::kResnet18: return resnet18(spec, example_shape, outputs);
  }
  TORCH_INTERNAL_ASSERT(false, "model type ", static_cast<int>(spec.type), " has no builder");
}

namespace {

// A built-in model's keys: one list, read and written (config/fields.h).
template <typename Io, typename Spec>
void model_fields(Io& io, Spec& m) {
  io.choice("type", m.type, kModelTypes);
  if (m.type == ModelType::kMlp) {
    io.field("widths", m.widths);
    for (std::size_t i = 0; i < m.widths.size(); ++i) {
      io.check("widths[" + std::to_string(i) + "]", m.widths[i] > 0, "must be > 0, got " + std::to_string(m.widths[i]));
    }
  }
  const bool resnet = m.type == ModelType::kResnet || m.type == ModelType::kResnet18;
  if (m.type == ModelType::kMlp || resnet) {
    io.choice("norm", m.norm, kNorms, resnet ? Norm::kBatch : Norm::kNone);
    io.field("ghost_batch_size", m.ghost_batch_size);
    io.check("ghost_batch_size", m.ghost_batch_size > 1, "must be > 1, got " + std::to_string(m.ghost_batch_size));
  }
  if (m.type == ModelType::kSimpleCnn) io.choice("variant", m.variant, kCnnVariants);
  if (resnet) {
    if constexpr (Io::kReading) {
      if (m.type == ModelType::kResnet18 && !io.given("width", true)) m.width = 64;
    }
    io.field("width", m.width);
    io.check("width", m.width > 0, "must be > 0, got " + std::to_string(m.width));
  }
  if (m.type == ModelType::kResnet) {
    io.field("depth", m.depth);
    io.check("depth", m.depth >= 8 && (m.depth - 2) % 6 == 0,
             "must be 6n + 2 with n >= 1 (8, 20, 32, 44, 56, 110, ...), got " + std::to_string(m.depth));
  }
}

}  // namespace

WorkloadPart model_part(const ModelSpec& spec) {
  return as_part(config::write_fields(spec, [](auto& io, auto& m) { model_fields(io, m); }), "type");
}

ModelSpec model_spec(const WorkloadPart& part) {
  return config::read_fields<ModelSpec>(part_object(part, "type"), "model",
                                        [](auto& io, auto& m) { model_fields(io, m); });
}

std::mutex& model_init_mutex() {
  static std::mutex m;
  return m;
}
Model build_model(const WorkloadPart& part, const WorkloadData& data, std::uint64_t seed) {
  const ModelRegistration r = model_registration(part.name);
  ModelInput input;
  input.example_shape = data.example_shape();
  if (data.classes > 0) {
    input.outputs = data.classes;
  } else {
    const at::Tensor target = data.train->range(0, 1).target;
    input.outputs = target.numel();
  }
  std::lock_guard<std::mutex> lock(model_init_mutex());
  at::manual_seed(seed);
  return r.build(part.params, input);
}

std::vector<ModelRegistration> builtin_models() {
  std::vector<ModelRegistration> out;
  for (const auto& [type, text] : kModelTypes) {
    const std::string key = text;
    out.push_back({key, [key](const nlohmann::json& params) { return model_part(model_spec({key, params})).params; },
                   [key](const nlohmann::json& params, const ModelInput& input) -> Model {
                     return make_model(model_spec({key, params}), input.example_shape, input.outputs);
                   }});
  }
  out.push_back(torchscript_model());
  return out;
}

}  // namespace bigbatch::experiments
