// Batched trials (batched.h): who may share a group, and the stacked model
// that trains a group's lanes as one (the LaneModel of lane_model.h): its
// layers with a lane dimension, each lane's parameters as views of its
// slices under the unbatched model's names, the gradients of the active
// lanes from one backward pass, and the evaluation of every lane at once.
#include "batched.h"

#include "lane_model.h"
#include "../optim/optimizer.h"
#include "../../compat/torch_compat.h"
#include "../workload/models.h"
#include "../../noise/noise_scale.h"
#include "../../normalization/ghost_batch_norm.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/pooling.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

namespace bigbatch::experiments {
namespace {

// A config's identity without what a group's lanes may differ in.
nlohmann::json group_key(const TrialConfig& t) {
  nlohmann::json j = identity(to_json(t));
  j.erase("name");
  j["schedule"].erase("base_lr");
  j["optimizer"].erase("momentum");
  return j;
}

}  // namespace

std::string batch_refusal(const TrialConfig& t) {
  if (t.noise.type != NoiseType::kNone) return "gradient noise";
  if (t.checkpoint_every > 0) return "checkpoints";
  if (!t.distributed.synchronous()) return "distributed.sync (a lane's synchronizations are its own)";
  // Each lane would move to its own point to evaluate and recompute its
  // BatchNorm statistics there: the stacked model evaluates all at once.
  if (optimizer_entry(t.optimizer.name).evaluation_point) return "an evaluation point of its own (Schedule-Free)";
  // Each lane's average would be evaluated with BatchNorm statistics
  // recomputed there, which the stacked model does not do.
  if (t.average.on()) return "weight averaging";
  if (!t.horizons.empty()) return "horizons (branched from a checkpoint of one trial)";
  // One loss scale per lane would need each lane's loss scaled apart before
  // the one backward; bf16 needs no scale and batches.
  if (t.precision == Precision::kFp16) return "fp16's loss scale";
  return "";
}

bool batchable_together(const TrialConfig& a, const TrialConfig& b) {
  return batch_refusal(a).empty() && batch_refusal(b).empty() && group_key(a) == group_key(b);
}

// ------------------------------------------------------------ stacked model --
// The activations of K lanes take one of three layouts:
//   shared    the input [B, ...], before any lane-specific layer;
//   channels  [B, K * C, H, W], image layers: lane k's channels are k's run;
//   lanes     [K, B, F], after a flatten of lane-specific features.
// A linear layer's weight is [K, out, in] (bias [K, out]): on the shared
// input all K products are one GEMM, on lanes a batched one. A convolution's
// weight is [K * out, in, kh, kw]: on the shared input one convolution with
// K * out filters, on channels a grouped one (K groups). A norm layer is the
// unbatched module over K * C channels, which normalizes each lane's own;
// pooling and ReLU are per channel already. A residual block stacks its body
// and shortcut. Parameters keep the unbatched model's names in the slots.

namespace {

enum class Layout { kShared, kChannels, kLanes };

struct Slot {
  std::string name;  // the unbatched parameter's name ("3.body.0.weight")
  at::Tensor stacked;
  std::int64_t run = 0;  // lane k's slice: select(0, k) when 0, else narrow(0, k * run, run)
  at::Tensor slice(const at::Tensor& t, std::int64_t k) const {
    return run == 0 ? t.select(0, k) : t.narrow(0, k * run, run);
  }
};

void tile(at::Tensor into, const at::Tensor& from, std::int64_t lanes) {
  if (!into.defined() || !from.defined()) return;
  into.copy_(from.dim() == 0 ? from : from.repeat({lanes}));  // (a 0-dim buffer: a count)
}

// A norm layer of type Holder over `features` channels, as the same layer over
// lanes x features (parameters and buffers still to be tiled); false when
// `module` is not a Holder.
template <typename Holder>
bool stack_norm(const std::shared_ptr<torch::nn::Module>& module, std::int64_t lanes, std::int64_t& features,
                std::shared_ptr<torch::nn::Module>& stacked, std::function<at::Tensor(const at::Tensor&)>& forward) {
  const auto* norm = module->as<Holder>();
  if (norm == nullptr) return false;
  auto options = norm->options;
  features = options.num_features();
  Holder m(options.num_features(lanes * features));
  forward = [m](const at::Tensor& x) mutable { return m->forward(x); };
  stacked = m.ptr();
  return true;
}

// One Sequential of the unbatched model, stacked (recursively for blocks).
// The constructor is one branch per layer kind the stacking knows (about 70
// lines): kept in one function so that the kinds read as one list, beside
// forward's switch over the same kinds.
class StackedSequence : public torch::nn::Module {
 public:
  StackedSequence(const torch::nn::Sequential& unbatched, std::int64_t lanes, const std::string& prefix,
                  std::vector<Slot>& slots)
      : lanes_(lanes) {
    at::NoGradGuard no_grad;
    for (std::size_t i = 0; i < unbatched->size(); ++i) {
      const std::string name = prefix + std::to_string(i);
      const std::string key = std::to_string(i);  // the registered names may not hold dots
      const auto& module = unbatched->ptr(i);
      Layer layer;
      if (module->as<torch::nn::Flatten>() != nullptr) {
        layer.kind = Layer::kFlatten;
      } else if (module->as<torch::nn::ReLU>() != nullptr) {
        layer.kind = Layer::kRelu;
      } else if (module->as<torch::nn::MaxPool2d>() != nullptr || module->as<torch::nn::AdaptiveAvgPool2d>() != nullptr) {
        layer.kind = Layer::kPerChannel;
        layer.forward = [module](const at::Tensor& x) {
          if (auto* m = module->as<torch::nn::MaxPool2d>()) return m->forward(x);
          return module->as<torch::nn::AdaptiveAvgPool2d>()->forward(x);
        };
      } else if (auto* linear = module->as<torch::nn::Linear>()) {
        layer.kind = Layer::kLinear;
        layer.weight = register_parameter(key + "_weight", linear->weight.unsqueeze(0).repeat({lanes, 1, 1}));
        layer.bias = register_parameter(key + "_bias", linear->bias.unsqueeze(0).repeat({lanes, 1}));
        slots.push_back({name + ".weight", layer.weight, 0});
        slots.push_back({name + ".bias", layer.bias, 0});
      } else if (auto* conv = module->as<torch::nn::Conv2d>()) {
        layer.kind = Layer::kConv;
        const auto& o = conv->options;
        const std::int64_t out = o.out_channels();
        const auto padding = compat::explicit_padding<2>(o.padding());
        TORCH_CHECK(o.groups() == 1 && padding, "batched trials: a grouped or \"same\"-padded convolution at ",
                    name);
        layer.stride = c10::IntArrayRef(o.stride()).vec();
        layer.padding = *padding;
        layer.dilation = c10::IntArrayRef(o.dilation()).vec();
        layer.weight = register_parameter(key + "_weight", conv->weight.repeat({lanes, 1, 1, 1}));
        slots.push_back({name + ".weight", layer.weight, out});
        if (conv->bias.defined()) {
          layer.bias = register_parameter(key + "_bias", conv->bias.repeat({lanes}));
          slots.push_back({name + ".bias", layer.bias, out});
        }
      } else if (auto* block = module->as<ResidualBlock>()) {
        layer.kind = Layer::kResidual;
        layer.body = register_module(key + "_body", std::make_shared<StackedSequence>(block->body(), lanes,
                                                                                      name + ".body.", slots));
        if (block->shortcut()) {
          layer.shortcut = register_module(
              key + "_shortcut",
              std::make_shared<StackedSequence>(block->shortcut(), lanes, name + ".shortcut.", slots));
        }
      } else {
        layer.kind = Layer::kNorm;
        std::shared_ptr<torch::nn::Module> stacked;
        std::int64_t f = 0;
        const bool known = stack_norm<torch::nn::BatchNorm1d>(module, lanes, f, stacked, layer.forward) ||
                           stack_norm<torch::nn::BatchNorm2d>(module, lanes, f, stacked, layer.forward) ||
                           stack_norm<nn::GhostBatchNorm1d>(module, lanes, f, stacked, layer.forward) ||
                           stack_norm<nn::GhostBatchNorm2d>(module, lanes, f, stacked, layer.forward);
        TORCH_CHECK(known, "batched trials: no stacked form of layer ", name, " (", module->name(), ")");
        const auto own = module->named_parameters(false);
        const auto own_buffers = module->named_buffers(false);
        for (auto& item : stacked->named_parameters(false)) {
          tile(item.value(), own[item.key()], lanes);
          slots.push_back({name + "." + item.key(), item.value(), f});
        }
        for (auto& item : stacked->named_buffers(false)) tile(item.value(), own_buffers[item.key()], lanes);
        layer.module = register_module(key + "_norm", stacked);
      }
      layers_.push_back(std::move(layer));
    }
  }

  at::Tensor forward(at::Tensor x, Layout& layout) {
    for (auto& layer : layers_) {
      switch (layer.kind) {
        case Layer::kFlatten:
          if (layout == Layout::kChannels) {  // [B, K*C, H, W] -> [K, B, C*H*W]
            x = x.reshape({x.size(0), lanes_, -1}).transpose(0, 1);
            layout = Layout::kLanes;
          } else {
            x = x.flatten(layout == Layout::kShared ? 1 : 2);
          }
          break;
        case Layer::kRelu:
          x = x.relu();
          break;
        case Layer::kPerChannel:
          TORCH_CHECK(layout != Layout::kLanes, "batched trials: pooling after a flatten");
          x = layer.forward(x);
          break;
        case Layer::kLinear: {
          const std::int64_t out = layer.weight.size(1), in = layer.weight.size(2);
          if (layout == Layout::kShared) {  // one GEMM: [B, in] x [in, K * out]
            const std::int64_t b = x.size(0);
            x = x.mm(layer.weight.view({lanes_ * out, in}).t()).view({b, lanes_, out}).transpose(0, 1) +
                layer.bias.unsqueeze(1);
            layout = Layout::kLanes;
          } else {
            TORCH_CHECK(layout == Layout::kLanes, "batched trials: a linear layer on image features");
            x = at::baddbmm(layer.bias.unsqueeze(1), x, layer.weight.transpose(1, 2));
          }
          break;
        }
        case Layer::kConv: {
          TORCH_CHECK(layout != Layout::kLanes, "batched trials: a convolution after a flatten");
          x = at::conv2d(x, layer.weight, layer.bias, layer.stride, layer.padding, layer.dilation,
                         layout == Layout::kShared ? 1 : lanes_);
          layout = Layout::kChannels;
          break;
        }
        case Layer::kNorm:
          if (layout == Layout::kLanes) {  // [K, B, F] -> [B, K*F] and back
            const std::int64_t b = x.size(1), f = x.size(2);
            x = layer.forward(x.transpose(0, 1).reshape({b, lanes_ * f})).view({b, lanes_, f}).transpose(0, 1);
          } else {
            TORCH_CHECK(layout == Layout::kChannels, "batched trials: a norm layer before any lane's own layer");
            x = layer.forward(x);
          }
          break;
        case Layer::kResidual: {
          if (layout == Layout::kShared) {  // every lane's copy of the input, as channels
            x = x.repeat({1, lanes_, 1, 1});
            layout = Layout::kChannels;
          }
          Layout body_layout = layout, skip_layout = layout;
          const at::Tensor body = layer.body->forward(x, body_layout);
          const at::Tensor skip = layer.shortcut ? layer.shortcut->forward(x, skip_layout) : x;
          x = at::relu(body + skip);
          break;
        }
      }
    }
    return x;
  }

 private:
  struct Layer {
    enum Kind { kFlatten, kRelu, kPerChannel, kLinear, kConv, kNorm, kResidual } kind = kFlatten;
    at::Tensor weight, bias;
    std::vector<std::int64_t> stride, padding, dilation;  // a convolution's
    std::shared_ptr<torch::nn::Module> module;
    std::shared_ptr<StackedSequence> body, shortcut;
    std::function<at::Tensor(const at::Tensor&)> forward;
  };
  std::int64_t lanes_;
  std::vector<Layer> layers_;
};

class StackedModel : public torch::nn::Module {
 public:
  StackedModel(const torch::nn::Sequential& unbatched, std::int64_t lanes) : lanes_(lanes) {
    net_ = register_module("net", std::make_shared<StackedSequence>(unbatched, lanes, "", slots_));
  }

  // [B, ...] -> [K, B, outputs].
  at::Tensor forward(const at::Tensor& input) {
    Layout layout = Layout::kShared;
    at::Tensor x = net_->forward(input, layout);
    if (layout == Layout::kShared) x = x.unsqueeze(0).expand({lanes_, x.size(0), x.size(1)});  // (no lane layer)
    TORCH_CHECK(layout != Layout::kChannels, "batched trials: the model ends in image features");
    return x;
  }

  const std::vector<Slot>& slots() const { return slots_; }
  std::int64_t lanes() const { return lanes_; }

 private:
  std::int64_t lanes_;
  std::vector<Slot> slots_;
  std::shared_ptr<StackedSequence> net_;
};

// ------------------------------------------------------------------- lanes --

namespace F = torch::nn::functional;

std::vector<double> to_vector(const at::Tensor& t) {
  const at::Tensor d = t.detach().to(at::kDouble).cpu().contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

// The stacked model of a group as the training loop's LaneModel.
class StackedLanes final : public LaneModel {
 public:
  StackedLanes(const torch::nn::Sequential& unbatched, std::int64_t k, const WorkloadData& data, const at::Device& device,
               Precision precision)
      : LaneModel(static_cast<std::size_t>(k)), data_(data), device_(device), precision_(precision) {
    model_ = std::make_unique<StackedModel>(unbatched, k);
    model_->to(device_);  // (parameters keep their handles: the slots stay valid)
    for (const auto& slot : model_->slots()) stacked_.push_back(slot.stacked);
    for (std::int64_t i = 0; i < k; ++i) add_lane(i);
  }

  torch::nn::Module& lane(std::size_t k) override { return *lanes_.at(k).module; }

  std::vector<LaneGradient> gradients(const StepBatch& b, const std::vector<bool>& active,
                                      std::int64_t micro_batches) override {
    const auto [x, y] = on_device(b.rows, device_);
    std::vector<std::int64_t> which;
    for (std::size_t i = 0; i < active.size(); ++i) {
      if (active[i]) which.push_back(static_cast<std::int64_t>(i));
    }
    const at::Tensor actives = at::tensor(which, at::kLong).to(device_);
    std::vector<LaneGradient> out(lanes());
    if (micro_batches >= 2) {  // noise::micro_batch_step, per lane
      const std::int64_t size = b.size / micro_batches;
      noise::GradientSum sum;
      std::vector<double> small(lanes(), 0.0);
      for (std::int64_t m = 0; m < micro_batches; ++m) {
        zero_grads();
        const at::Tensor l = losses(x.slice(0, m * size, (m + 1) * size), y.slice(0, m * size, (m + 1) * size));
        l.index_select(0, actives).sum().backward();
        const auto values = to_vector(l);
        const auto norms = sq_norms();
        for (std::size_t i = 0; i < lanes(); ++i) {
          out[i].loss += values[i] / static_cast<double>(micro_batches);
          small[i] += norms[i] / static_cast<double>(micro_batches);
        }
        sum.add(stacked_);
      }
      sum.set_mean(stacked_, micro_batches);
      const auto big = sq_norms();
      for (const auto i : which) {
        if (std::isfinite(small[i]) && std::isfinite(big[i])) out[i].noise = NoiseSample{small[i], big[i], size, b.size};
      }
    } else {
      zero_grads();
      const at::Tensor l = losses(x, y);
      l.index_select(0, actives).sum().backward();
      const auto values = to_vector(l);
      for (std::size_t i = 0; i < lanes(); ++i) out[i].loss = values[i];
    }
    for (const auto i : which) {  // each active lane's gradient: its slices of the stacked one
      for (auto& [view, slot] : lanes_[static_cast<std::size_t>(i)].views) {
        view.mutable_grad() = slot->slice(slot->stacked.grad(), i);
      }
    }
    return out;
  }

  std::vector<ValidationMetrics> evaluate() override {
    at::NoGradGuard no_grad;
    model_->eval();
    auto out = evaluate_split(data_, device_, static_cast<std::int64_t>(lanes()), [&](const at::Tensor& x) {
      return forward_in(precision_, device_, [&] { return model_->forward(x); });
    });
    model_->train();
    return out;
  }

 private:
  struct Lane {
    std::shared_ptr<torch::nn::Module> module;  // views of the lane's slices, under the unbatched names
    std::vector<std::pair<at::Tensor, const Slot*>> views;
  };

  // Lane i's module: a module per prefix of the names ("3", "3.body",
  // "3.body.0"), so that named_parameters() gives the unbatched names.
  void add_lane(std::int64_t i) {
    Lane lane;
    lane.module = std::make_shared<torch::nn::Module>("Lane");
    std::map<std::string, std::shared_ptr<torch::nn::Module>> modules{{"", lane.module}};
    for (const auto& slot : model_->slots()) {
      std::string path;
      std::size_t begin = 0;
      for (std::size_t dot = slot.name.find('.'); dot != std::string::npos; dot = slot.name.find('.', begin)) {
        const std::string part = slot.name.substr(begin, dot - begin);
        const std::string child = path.empty() ? part : path + "." + part;
        if (modules.count(child) == 0) {
          modules[child] = modules[path]->register_module(part, std::make_shared<torch::nn::Module>());
        }
        path = child;
        begin = dot + 1;
      }
      const std::string leaf = slot.name.substr(begin);
      modules[path]->register_parameter(leaf, slot.slice(slot.stacked.detach(), i), /*requires_grad=*/true);
      lane.views.emplace_back(modules[path]->named_parameters(false)[leaf], &slot);
    }
    lanes_.push_back(std::move(lane));
  }

  void zero_grads() {
    for (const auto& p : stacked_) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
  }

  // Each lane's mean loss over the rows of x: [K].
  at::Tensor losses(const at::Tensor& x, const at::Tensor& y) {
    const at::Tensor out = forward_in(precision_, device_, [&] { return model_->forward(x); });  // [K, B, outputs]
    const std::int64_t k = out.size(0), b = out.size(1);
    if (data_.loss) {  // the workload's own, per example of the K lanes' outputs
      const auto [outputs, targets] = lanes_as_batch(out, y);
      return data_.example_loss(outputs, targets).view({k, b}).mean(1);
    }
    if (data_.classes > 0) {
      return F::cross_entropy(out.reshape({k * b, out.size(2)}), y.repeat({k}),
                              F::CrossEntropyFuncOptions().reduction(torch::kNone))
          .view({k, b})
          .mean(1);
    }
    return (out - y.unsqueeze(0)).pow(2).sum(2).mean(1);
  }

  // Each lane's |G|^2 from the stacked gradients, in double as noise/ does.
  std::vector<double> sq_norms() const {
    at::Tensor sum = at::zeros({model_->lanes()}, at::TensorOptions(at::kDouble).device(device_));
    for (const auto& slot : model_->slots()) {
      const at::Tensor& g = slot.stacked.grad();
      if (!g.defined()) continue;
      sum += g.to(at::kDouble).square().reshape({model_->lanes(), -1}).sum(1);
    }
    return to_vector(sum);
  }

  const WorkloadData& data_;
  at::Device device_;
  Precision precision_;
  std::unique_ptr<StackedModel> model_;
  std::vector<at::Tensor> stacked_;  // the stacked model's parameters, as its slots list them
  std::vector<Lane> lanes_;
};

}  // namespace

std::unique_ptr<LaneModel> stacked_model(const torch::nn::Sequential& model, std::int64_t lanes, const WorkloadData& data,
                                         const at::Device& device, Precision precision) {
  return std::make_unique<StackedLanes>(model, lanes, data, device, precision);
}

std::string stack_refusal(const Model& model) {
  const torch::nn::Sequential seq = model.sequential();
  if (!seq) return "the model is not a torch::nn::Sequential";
  try {
    StackedModel stacked(seq, 1);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

}  // namespace bigbatch::experiments
