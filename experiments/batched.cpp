// Batched trials (batched.h): the stacked model, the lanes' optimizers over
// views of their slices, and the lockstep training loop, which follows
// Trainer::run step for step.
#include <bigbatch/experiments/batched.h>

#include <bigbatch/experiments/models.h>
#include <bigbatch/experiments/optimizer_registry.h>
#include <bigbatch/normalization/ghost_batch_norm.h>
#include <bigbatch/optimizers/lars.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/linear.h>

#include <chrono>
#include <cmath>
#include <algorithm>
#include <limits>
#include <map>

namespace bigbatch::experiments {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

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
  if (t.model.type != ModelType::kLinear && t.model.type != ModelType::kMlp) {
    return "model " + schedules::enum_name(kModelTypes, t.model.type) + " (batched: linear, mlp)";
  }
  if (t.noise.type != NoiseType::kNone) return "gradient noise";
  if (t.checkpoint_every > 0) return "checkpoints";
  return "";
}

bool batchable_together(const TrialConfig& a, const TrialConfig& b) {
  return batch_refusal(a).empty() && batch_refusal(b).empty() && group_key(a) == group_key(b);
}

// ------------------------------------------------------------ stacked model --
// Activations are [K, B, F] once lane-specific (the input [B, ...] is shared).
// A linear layer's weight is [K, out, in] and bias [K, out]; on the shared
// input all K products are one GEMM. A norm layer is the unbatched module
// over K * F features, which normalizes each lane's channels on their own.

class StackedModel : public torch::nn::Module {
 public:
  // The unbatched model's parameter names of one stacked tensor, and how lane
  // k's slice is cut from it: along dim 0 (select) or in K runs of `run`.
  struct Slot {
    std::string name;
    at::Tensor stacked;
    std::int64_t run = 0;  // 0: select(0, k); else narrow(0, k * run, run)
    at::Tensor slice(const at::Tensor& t, std::int64_t k) const {
      return run == 0 ? t.select(0, k) : t.narrow(0, k * run, run);
    }
  };

  StackedModel(torch::nn::Sequential& unbatched, std::int64_t lanes) : lanes_(lanes) {
    at::NoGradGuard no_grad;
    for (std::size_t i = 0; i < unbatched->size(); ++i) {
      const std::string index = std::to_string(i);
      const auto& module = unbatched->ptr(i);
      Layer layer;
      if (module->as<torch::nn::Flatten>() != nullptr) {
        layer.kind = Layer::kFlatten;
      } else if (module->as<torch::nn::ReLU>() != nullptr) {
        layer.kind = Layer::kRelu;
      } else if (auto* linear = module->as<torch::nn::Linear>()) {
        layer.kind = Layer::kLinear;
        layer.weight = register_parameter(index + "_weight", linear->weight.unsqueeze(0).repeat({lanes, 1, 1}));
        layer.bias = register_parameter(index + "_bias", linear->bias.unsqueeze(0).repeat({lanes, 1}));
        slots_.push_back({index + ".weight", layer.weight, 0});
        slots_.push_back({index + ".bias", layer.bias, 0});
      } else if (auto* bn = module->as<torch::nn::BatchNorm1d>()) {
        layer.kind = Layer::kNorm;
        const std::int64_t f = bn->options.num_features();
        auto stacked = torch::nn::BatchNorm1d(torch::nn::BatchNorm1dOptions(bn->options).num_features(lanes * f));
        tile(stacked->weight, bn->weight, lanes);
        tile(stacked->bias, bn->bias, lanes);
        tile(stacked->running_mean, bn->running_mean, lanes);
        tile(stacked->running_var, bn->running_var, lanes);
        layer.norm = register_module(index + "_norm", stacked);
        layer.forward = [stacked](const at::Tensor& x) mutable { return stacked->forward(x); };
        slots_.push_back({index + ".weight", stacked->weight, f});
        slots_.push_back({index + ".bias", stacked->bias, f});
      } else if (auto* ghost = module->as<nn::GhostBatchNorm1d>()) {
        layer.kind = Layer::kNorm;
        nn::GhostBatchNormOptions o = ghost->options;
        const std::int64_t f = o.num_features();
        auto stacked = nn::GhostBatchNorm1d(o.num_features(lanes * f));
        const auto own = ghost->named_parameters(false);
        const auto own_buffers = ghost->named_buffers(false);
        for (auto& item : stacked->named_parameters(false)) tile(item.value(), own[item.key()], lanes);
        for (auto& item : stacked->named_buffers(false)) tile(item.value(), own_buffers[item.key()], lanes);
        layer.norm = register_module(index + "_norm", stacked);
        layer.forward = [stacked](const at::Tensor& x) mutable { return stacked->forward(x); };
        for (auto& item : stacked->named_parameters(false)) slots_.push_back({index + "." + item.key(), item.value(), f});
      } else {
        TORCH_CHECK(false, "batched trials: no stacked form of layer ", index, " (", module->name(), ")");
      }
      layers_.push_back(std::move(layer));
    }
  }

  // [B, ...] -> [K, B, outputs].
  at::Tensor forward(at::Tensor x) {
    bool shared = true;
    for (auto& layer : layers_) {
      switch (layer.kind) {
        case Layer::kFlatten:
          x = x.flatten(shared ? 1 : 2);
          break;
        case Layer::kRelu:
          x = x.relu();
          break;
        case Layer::kLinear: {
          const std::int64_t out = layer.weight.size(1), in = layer.weight.size(2);
          if (shared) {  // one GEMM: [B, in] x [in, K * out]
            const std::int64_t b = x.size(0);
            x = x.mm(layer.weight.view({lanes_ * out, in}).t()).view({b, lanes_, out}).transpose(0, 1) +
                layer.bias.unsqueeze(1);
            shared = false;
          } else {
            x = at::baddbmm(layer.bias.unsqueeze(1), x, layer.weight.transpose(1, 2));
          }
          break;
        }
        case Layer::kNorm: {
          TORCH_CHECK(!shared, "batched trials: a norm layer before the first linear layer");
          const std::int64_t b = x.size(1), f = x.size(2);
          x = layer.forward(x.transpose(0, 1).reshape({b, lanes_ * f})).view({b, lanes_, f}).transpose(0, 1);
          break;
        }
      }
    }
    if (shared) x = x.unsqueeze(0).expand({lanes_, x.size(0), x.size(1)});  // (a model of no linear layer)
    return x;
  }

  const std::vector<Slot>& slots() const { return slots_; }
  std::int64_t lanes() const { return lanes_; }

 private:
  struct Layer {
    enum Kind { kFlatten, kRelu, kLinear, kNorm } kind = kFlatten;
    at::Tensor weight, bias;
    std::shared_ptr<torch::nn::Module> norm;
    std::function<at::Tensor(const at::Tensor&)> forward;
  };
  static void tile(at::Tensor& into, const at::Tensor& from, std::int64_t lanes) {
    if (!into.defined() || !from.defined()) return;
    into.copy_(from.dim() == 0 ? from : from.repeat({lanes}));  // (a 0-dim buffer: a count)
  }

  std::int64_t lanes_;
  std::vector<Layer> layers_;
  std::vector<Slot> slots_;
};

// ------------------------------------------------------------------- lanes --

struct GroupTrainer::Lane {
  TrialConfig config;
  std::shared_ptr<torch::nn::Module> module;  // views of the lane's slices, under the unbatched names
  std::vector<std::pair<at::Tensor, const StackedModel::Slot*>> views;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::optional<schedules::LRAdapter> adapter;
  noise::GradientNoiseScale gns;
  bool active = true;
  double last_lr = 0, loss = 0, loss_sum = 0, best_metric = std::numeric_limits<double>::infinity();
  std::int64_t loss_count = 0;
  TrialResult result;

  explicit Lane(const TrialConfig& c) : config(c), gns(c.gns.beta) {}
};

GroupTrainer::GroupTrainer(const std::vector<TrialConfig>& trials, const Dataset& data)
    : data_(data), configs_(trials), device_(at::kCPU), sampler_(data.train_size(), trials.at(0).seed * 7919 + 1) {
  if (trials[0].device == DeviceType::kCuda) {
    TORCH_CHECK(torch::cuda::device_count() > 0, "device \"cuda\": no CUDA device is visible (or this LibTorch has no CUDA)");
    device_ = at::Device(at::kCUDA, 0);
  }
  for (const auto& t : trials) {
    TORCH_CHECK(batchable_together(trials[0], t), "batched trials: ", t.name, " cannot join ", trials[0].name,
                "'s group", batch_refusal(t).empty() ? "" : ": " + batch_refusal(t));
  }
  torch::nn::Sequential unbatched{nullptr};
  {
    std::lock_guard<std::mutex> lock(model_init_mutex());
    at::manual_seed(trials[0].seed);
    unbatched = make_model(trials[0].model, data.example_shape(), data.classes > 0 ? data.classes : 1);
  }
  const auto k = static_cast<std::int64_t>(trials.size());
  model_ = std::make_unique<StackedModel>(unbatched, k);
  model_->to(device_);  // (parameters keep their handles: the slots stay valid)
  for (std::int64_t i = 0; i < k; ++i) {
    auto lane = std::make_unique<Lane>(trials[static_cast<std::size_t>(i)]);
    lane->module = std::make_shared<torch::nn::Module>("Lane");
    std::map<std::string, std::shared_ptr<torch::nn::Module>> children;
    for (const auto& slot : model_->slots()) {
      const auto dot = slot.name.find('.');
      auto& child = children[slot.name.substr(0, dot)];
      if (!child) child = lane->module->register_module(slot.name.substr(0, dot), std::make_shared<torch::nn::Module>());
      at::Tensor view = slot.slice(slot.stacked.detach(), i);
      child->register_parameter(slot.name.substr(dot + 1), view, /*requires_grad=*/true);
      lane->views.emplace_back(child->named_parameters(false)[slot.name.substr(dot + 1)], &slot);
    }
    const TrialConfig& c = lane->config;
    lane->optimizer = make_optimizer(c.optimizer, c.schedule.base_lr, *lane->module);
    schedules::Schedule schedule(c.schedule, c.batch_size, data.train_size());
    const std::int64_t budget = schedule.steps(c.budget.length, c.budget.unit);
    TORCH_CHECK(i == 0 || budget == budget_, "batched trials: the lanes' budgets differ");
    budget_ = budget;
    schedules::LRAdapter::RateChange correction;
    if (c.optimizer.momentum_correction) {
      auto* lars = dynamic_cast<optim::LARS*>(lane->optimizer.get());
      TORCH_INTERNAL_ASSERT(lars != nullptr, "config validation allows momentum_correction for lars only");
      correction = [lars](double factor) { lars->rescale_momentum(factor); };
    }
    lane->adapter.emplace(*lane->optimizer, std::move(schedule), std::move(correction));
    lane->result.budget = budget_;
    lane->result.peak_lr = lane->adapter->schedule().peak_lr();
    lanes_.push_back(std::move(lane));
  }
}

GroupTrainer::~GroupTrainer() = default;

std::size_t GroupTrainer::lanes() const { return lanes_.size(); }
const torch::nn::Module& GroupTrainer::lane_module(std::size_t lane) const { return *lanes_.at(lane)->module; }
torch::optim::Optimizer& GroupTrainer::lane_optimizer(std::size_t lane) { return *lanes_.at(lane)->optimizer; }

namespace {

// Each lane's mean loss over the rows of x: [K].
at::Tensor lane_losses(StackedModel& model, const Dataset& data, const at::Tensor& x, const at::Tensor& y) {
  namespace F = torch::nn::functional;
  const at::Tensor out = model.forward(x);  // [K, B, outputs]
  const std::int64_t k = out.size(0), b = out.size(1);
  if (data.classes > 0) {
    return F::cross_entropy(out.reshape({k * b, out.size(2)}), y.repeat({k}),
                            F::CrossEntropyFuncOptions().reduction(torch::kNone))
        .view({k, b})
        .mean(1);
  }
  return (out - y.unsqueeze(0)).pow(2).sum(2).mean(1);
}

// Each lane's |G|^2 from the stacked gradients, in double as noise/ does.
std::vector<double> lane_sq_norms(const StackedModel& model, const at::Device& device) {
  at::Tensor sum = at::zeros({model.lanes()}, at::TensorOptions(at::kDouble).device(device));
  for (const auto& slot : model.slots()) {
    const at::Tensor& g = slot.stacked.grad();
    if (!g.defined()) continue;
    sum += g.to(at::kDouble).square().reshape({model.lanes(), -1}).sum(1);
  }
  sum = sum.cpu();
  return std::vector<double>(sum.data_ptr<double>(), sum.data_ptr<double>() + model.lanes());
}

std::vector<double> to_vector(const at::Tensor& t) {
  const at::Tensor d = t.detach().to(at::kDouble).cpu().contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

}  // namespace

void GroupTrainer::train_step() {
  const std::int64_t batch = lanes_[0]->adapter->schedule().batch_size(step_);
  std::vector<std::int64_t> active;
  for (std::size_t i = 0; i < lanes_.size(); ++i) {
    Lane& lane = *lanes_[i];
    if (!lane.active) continue;
    active.push_back(static_cast<std::int64_t>(i));
    lane.adapter->apply(step_);
    lane.last_lr = lane.optimizer->param_groups().front().options().get_lr();
  }
  const at::Tensor index = sampler_.next(batch);
  const at::Tensor x = data_.x_train.index_select(0, index).to(device_);
  const at::Tensor y = data_.y_train.index_select(0, index).to(device_);
  const at::Tensor which = at::tensor(active, at::kLong).to(device_);
  for (const auto& slot : model_->slots()) {
    if (slot.stacked.grad().defined()) slot.stacked.mutable_grad().zero_();
  }
  const std::int64_t micro = configs_[0].gns.micro_batches;
  std::vector<double> losses(lanes_.size(), 0.0);
  if (micro >= 2) {  // noise::micro_batch_step, per lane
    const std::int64_t size = batch / micro;
    std::vector<at::Tensor> sum(model_->slots().size());
    std::vector<double> small(lanes_.size(), 0.0);
    for (std::int64_t m = 0; m < micro; ++m) {
      for (const auto& slot : model_->slots()) {
        if (slot.stacked.grad().defined()) slot.stacked.mutable_grad().zero_();
      }
      const at::Tensor l = lane_losses(*model_, data_, x.slice(0, m * size, (m + 1) * size),
                                       y.slice(0, m * size, (m + 1) * size));
      l.index_select(0, which).sum().backward();
      const auto values = to_vector(l);
      const auto norms = lane_sq_norms(*model_, device_);
      for (std::size_t i = 0; i < lanes_.size(); ++i) {
        losses[i] += values[i] / static_cast<double>(micro);
        small[i] += norms[i] / static_cast<double>(micro);
      }
      at::NoGradGuard no_grad;
      for (std::size_t s = 0; s < sum.size(); ++s) {
        const at::Tensor& g = model_->slots()[s].stacked.grad();
        if (!g.defined()) continue;
        if (!sum[s].defined()) {
          sum[s] = g.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
        } else {
          sum[s].add_(g);
        }
      }
    }
    at::NoGradGuard no_grad;
    for (std::size_t s = 0; s < sum.size(); ++s) {
      if (sum[s].defined()) model_->slots()[s].stacked.mutable_grad().copy_(sum[s].div_(static_cast<double>(micro)));
    }
    const auto big = lane_sq_norms(*model_, device_);
    for (const auto i : active) {
      Lane& lane = *lanes_[static_cast<std::size_t>(i)];
      if (std::isfinite(small[i]) && std::isfinite(big[i])) lane.gns.update(small[i], size, big[i], batch);
    }
  } else {
    const at::Tensor l = lane_losses(*model_, data_, x, y);
    l.index_select(0, which).sum().backward();
    losses = to_vector(l);
  }
  for (const auto i : active) {
    Lane& lane = *lanes_[static_cast<std::size_t>(i)];
    for (auto& [view, slot] : lane.views) view.mutable_grad() = slot->slice(slot->stacked.grad(), i);
    lane.optimizer->step();
    lane.loss = losses[static_cast<std::size_t>(i)];
  }
  ++step_;
  examples_ += batch;
}

std::vector<std::pair<double, double>> GroupTrainer::evaluate() {
  at::NoGradGuard no_grad;
  model_->eval();
  const std::int64_t n = data_.x_val.size(0);
  const auto k = static_cast<std::int64_t>(lanes_.size());
  const auto options = at::TensorOptions(at::kDouble).device(device_);
  at::Tensor loss = at::zeros({k}, options), wrong = at::zeros({k}, options);
  for (std::int64_t begin = 0; begin < n; begin += 8192) {
    const std::int64_t end = std::min(n, begin + 8192);
    const at::Tensor x = data_.x_val.slice(0, begin, end).to(device_);
    const at::Tensor y = data_.y_val.slice(0, begin, end).to(device_);
    const at::Tensor out = model_->forward(x);  // [K, N, outputs]
    if (data_.classes > 0) {
      namespace F = torch::nn::functional;
      const std::int64_t rows = end - begin;
      loss += F::cross_entropy(out.reshape({k * rows, out.size(2)}), y.repeat({k}),
                               F::CrossEntropyFuncOptions().reduction(torch::kNone))
                  .view({k, rows})
                  .sum(1)
                  .to(at::kDouble);
      wrong += out.argmax(2).ne(y.unsqueeze(0)).sum(1).to(at::kDouble);
    } else {
      loss += (out - y.unsqueeze(0)).pow(2).sum({1, 2}).to(at::kDouble);
    }
  }
  model_->train();
  const auto count = static_cast<double>(n);
  std::vector<std::pair<double, double>> out;
  const auto l = to_vector(loss), w = to_vector(wrong);
  for (std::int64_t i = 0; i < k; ++i) out.emplace_back(l[i] / count, data_.classes > 0 ? w[i] / count : kNaN);
  return out;
}

std::vector<TrialResult> GroupTrainer::run(const Hooks& hooks) {
  const auto start = std::chrono::steady_clock::now();
  const auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  const std::int64_t every = configs_[0].target.eval_every;
  const bool use_error = configs_[0].target.metric == Metric::kValError;
  double last_report = 0;
  const auto leave = [&](std::size_t i, TrialStatus status) {
    Lane& lane = *lanes_[i];
    lane.active = false;
    lane.result.status = status;
    lane.result.steps = step_;
    lane.result.best_metric = lane.best_metric;
    lane.result.wall_time = seconds();
    if (hooks.finished) hooks.finished(i, lane.result);
  };
  const auto any_active = [&] {
    return std::any_of(lanes_.begin(), lanes_.end(), [](const auto& l) { return l->active; });
  };
  while (step_ < budget_ && any_active()) {
    const std::int64_t next_eval = std::min(budget_, (step_ / every + 1) * every);
    for (std::size_t i = 0; i < lanes_.size(); ++i) {
      if (lanes_[i]->active && hooks.prune && hooks.prune(i, next_eval)) leave(i, TrialStatus::kPruned);
    }
    if (!any_active()) break;
    train_step();
    for (std::size_t i = 0; i < lanes_.size(); ++i) {
      Lane& lane = *lanes_[i];
      if (!lane.active) continue;
      if (!std::isfinite(lane.loss)) {
        leave(i, TrialStatus::kDiverged);
        continue;
      }
      lane.loss_sum += lane.loss;
      ++lane.loss_count;
    }
    if (hooks.progress && (seconds() - last_report > 0.5 || step_ == budget_)) {
      last_report = seconds();
      for (const auto& lane : lanes_) {
        if (!lane->active) continue;
        hooks.progress({step_, budget_, lane->loss, static_cast<double>(step_) / std::max(1e-9, last_report)});
        break;
      }
    }
    if (step_ % every != 0 && step_ != budget_) continue;
    if (!any_active()) break;
    const auto results = evaluate();
    for (std::size_t i = 0; i < lanes_.size(); ++i) {
      Lane& lane = *lanes_[i];
      if (!lane.active) continue;
      const auto [val_loss, val_error] = results[i];
      EvalRow row;
      row.step = step_;
      row.examples = examples_;
      row.epoch = static_cast<double>(examples_) / static_cast<double>(data_.train_size());
      row.train_loss = lane.loss_sum / static_cast<double>(lane.loss_count);
      row.val_loss = val_loss;
      row.val_error = val_error;
      row.lr = lane.last_lr;
      row.batch_size = lane.adapter->schedule().batch_size(step_ - 1);
      row.wall_time = seconds();
      row.gns = lane.gns.updates() > 0 ? lane.gns.b_simple() : kNaN;
      lane.result.rows.push_back(row);
      if (hooks.on_eval) hooks.on_eval(i, row);
      lane.loss_sum = 0;
      lane.loss_count = 0;
      const double metric = use_error ? val_error : val_loss;
      if (!std::isfinite(val_loss)) {
        leave(i, TrialStatus::kDiverged);
        continue;
      }
      lane.best_metric = std::min(lane.best_metric, metric);
      if (metric <= lane.config.target.threshold) {
        lane.result.steps_to_target = step_;
        lane.result.examples_to_target = examples_;
        leave(i, TrialStatus::kReached);
      }
    }
  }
  for (std::size_t i = 0; i < lanes_.size(); ++i) {
    if (lanes_[i]->active) leave(i, TrialStatus::kNotReached);
  }
  std::vector<TrialResult> out;
  for (const auto& lane : lanes_) out.push_back(lane->result);
  return out;
}

}  // namespace bigbatch::experiments
