// The training loop (trial.h), once for a single trial and for a batched
// group of lanes, following docs/formulas.md "Steps to result":
// steps-to-target is the first evaluation step at which the validation
// metric reaches the target. The model side is a LaneModel (lane_model.h);
// the checkpoint is in checkpoint.cpp.
#include "trial.h"

#include "batched.h"
#include "lane.h"
#include "lane_model.h"
#include "models.h"
#include "optimizer_registry.h"
#include "../optimizers/layerwise_optimizer.h"

#include <c10/util/Exception.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

namespace bigbatch::experiments {

namespace {

// "cpu", or "cuda": device LOCAL_RANK (modulo the devices) under a process group.
at::Device trial_device(DeviceType type, const distributed::ProcessGroup* group) {
  if (type == DeviceType::kCpu) return at::Device(at::kCPU);
  const auto devices = static_cast<int>(torch::cuda::device_count());
  TORCH_CHECK(devices > 0, "device \"cuda\": no CUDA device is visible (or this LibTorch has no CUDA)");
  const int local = group != nullptr ? group->local_rank() : 0;
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(local % devices));
}

// The unbatched model of a trial, seeded by its seed.
torch::nn::Sequential initial_model(const TrialConfig& t, const Dataset& data) {
  std::lock_guard<std::mutex> lock(model_init_mutex());
  at::manual_seed(t.seed);
  return make_model(t.model, data.example_shape(), data.classes > 0 ? data.classes : 1);
}

// The data order of a run: every rank and every lane of a trial's seed
// draws the same batches.
std::uint64_t sampler_seed(const TrialConfig& t) { return t.seed * 7919 + 1; }

}  // namespace

std::mutex& model_init_mutex() {
  static std::mutex m;
  return m;
}

std::string to_string(TrialStatus status) { return config::enum_name(kTrialStatuses, status); }

Trainer::Trainer(const TrialConfig& config, const Dataset& data, distributed::ProcessGroup* group)
    : data_(data),
      group_(group),
      device_(trial_device(config.device, group)),
      sampler_(data.train_size(), sampler_seed(config)) {
  model_ = single_model(initial_model(config, data), data, device_, group);
  add_lanes({config});
}

Trainer::Trainer(const std::vector<TrialConfig>& lanes, const Dataset& data)
    : data_(data),
      group_(nullptr),
      device_(trial_device(lanes.at(0).device, nullptr)),
      sampler_(data.train_size(), sampler_seed(lanes.at(0))) {
  for (const auto& t : lanes) {
    TORCH_CHECK(batchable_together(lanes[0], t), "batched trials: ", t.name, " cannot join ", lanes[0].name,
                "'s group", batch_refusal(t).empty() ? "" : ": " + batch_refusal(t));
  }
  model_ = stacked_model(initial_model(lanes[0], data), static_cast<std::int64_t>(lanes.size()), data, device_);
  add_lanes(lanes);
}

Trainer::~Trainer() = default;

void Trainer::add_lanes(const std::vector<TrialConfig>& configs) {
  for (std::size_t i = 0; i < configs.size(); ++i) {
    auto lane = std::make_unique<Lane>(configs[i]);
    const TrialConfig& c = lane->config;
    torch::nn::Module& module = model_->lane(i);
    lane->params = module.parameters();
    lane->optimizer = make_optimizer(c.optimizer, c.schedule.base_lr, module);
    schedules::Schedule schedule(c.schedule, c.batch_size, data_.train_size());
    const std::int64_t budget = schedule.steps(c.budget.length, c.budget.unit);
    TORCH_CHECK(i == 0 || budget == budget_, "batched trials: the lanes' budgets differ");
    budget_ = budget;
    lane->adapter.emplace(*lane->optimizer, std::move(schedule), rate_change(c.optimizer, *lane->optimizer));
    if (c.noise.type == NoiseType::kAnnealed) {
      lane->annealed.emplace(noise::AnnealedNoiseOptions(c.noise.eta).gamma(c.noise.gamma).seed(c.seed));
    } else if (c.noise.type == NoiseType::kMultiplicative) {
      lane->multiplicative.emplace(c.noise.base_batch, c.seed);
    }
    lane->result.budget = budget_;
    lane->result.peak_lr = lane->adapter->schedule().peak_lr();
    lanes_.push_back(std::move(lane));
  }
}

torch::nn::Module& Trainer::module(std::size_t lane) { return model_->lane(lane); }
torch::optim::Optimizer& Trainer::optimizer(std::size_t lane) { return *lanes_.at(lane)->optimizer; }

torch::nn::Sequential& Trainer::model() {
  torch::nn::Sequential* sequential = model_->sequential();
  TORCH_CHECK(sequential != nullptr, "Trainer::model(): a batched group has no unbatched model (use module(lane))");
  return *sequential;
}

void Trainer::check_one_lane(const char* what) const {
  TORCH_CHECK(lanes_.size() == 1 && model_->sequential() != nullptr, what,
              ": a single trial's only, not a batched group's");
}

double Trainer::b_simple(std::size_t lane) const {
  const Lane& l = *lanes_.at(lane);
  return l.gns.updates() > 0 ? l.gns.b_simple() : kNaN;
}

bool Trainer::any_active() const {
  return std::any_of(lanes_.begin(), lanes_.end(), [](const auto& l) { return l->active; });
}

std::vector<double> Trainer::train_step() {
  Lane& first = *lanes_.front();  // what the lanes share: the batch size, the data order, the noise weights
  StepBatch b;
  b.size = first.adapter->schedule().batch_size(step_);
  std::vector<bool> active;
  for (auto& lane : lanes_) {
    active.push_back(lane->active);
    if (!lane->active) continue;
    lane->adapter->apply(step_);
    lane->last_lr = lane->optimizer->param_groups().front().options().get_lr();
  }
  b.index = sampler_.next(b.size);
  if (first.multiplicative) b.weights = first.multiplicative->weights(b.size, step_);
  const std::vector<LaneGradient> gradients = model_->gradients(b, active, first.config.gns.micro_batches);
  std::vector<double> losses(lanes_.size(), kNaN);
  for (std::size_t i = 0; i < lanes_.size(); ++i) {
    Lane& lane = *lanes_[i];
    if (!lane.active) continue;
    if (const auto& n = gradients[i].noise) lane.gns.update(n->small_sq, n->small_batch, n->big_sq, n->big_batch);
    if (lane.annealed) lane.annealed->apply(lane.params, step_);  // the same noise on every rank
    lane.optimizer->step();
    lane.loss = losses[i] = gradients[i].loss;
  }
  ++step_;
  examples_ += b.size;
  return losses;
}

std::vector<std::pair<double, double>> Trainer::evaluate() { return model_->evaluate(); }

void Trainer::leave(std::size_t i, TrialStatus status, double seconds, const Hooks& hooks) {
  Lane& lane = *lanes_[i];
  lane.active = false;
  TrialResult& r = lane.result;
  r.status = status;
  r.steps = step_;
  r.rows = lane.rows;
  r.best_metric = lane.best_metric;
  r.wall_time = seconds;
  if (hooks.finished) hooks.finished(i, r);
}

void Trainer::evaluate_lanes(const Hooks& hooks, const std::function<double()>& seconds) {
  const auto metrics = evaluate();
  for (std::size_t i = 0; i < lanes_.size(); ++i) {
    Lane& lane = *lanes_[i];
    if (!lane.active) continue;
    const auto [val_loss, val_error] = metrics[i];
    EvalRow row;
    row.step = step_;
    row.examples = examples_;
    row.epoch = static_cast<double>(examples_) / static_cast<double>(data_.train_size());
    row.train_loss = lane.loss_sum / static_cast<double>(lane.losses);
    row.val_loss = val_loss;
    row.val_error = val_error;
    row.lr = lane.last_lr;
    row.batch_size = lane.adapter->schedule().batch_size(step_ - 1);
    row.wall_time = seconds();
    row.gns = b_simple(i);
    lane.rows.push_back(row);
    if (hooks.on_eval) hooks.on_eval(i, row);
    lane.loss_sum = 0;
    lane.losses = 0;
    if (!std::isfinite(val_loss)) {
      leave(i, TrialStatus::kDiverged, seconds(), hooks);
      continue;
    }
    const TargetSpec& target = lane.config.target;
    const double metric = target.metric == Metric::kValError ? val_error : val_loss;
    lane.best_metric = std::min(lane.best_metric, metric);
    if (metric <= target.threshold) {
      lane.result.steps_to_target = step_;
      lane.result.examples_to_target = examples_;
      leave(i, TrialStatus::kReached, seconds(), hooks);
    }
  }
}

std::vector<TrialResult> Trainer::run(const Hooks& hooks) {
  const auto start = std::chrono::steady_clock::now();
  const double before = elapsed_;
  const std::function<double()> seconds = [&] {
    return before + std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const std::int64_t every = lanes_.front()->config.target.eval_every;  // the lanes share it
  const std::int64_t checkpoint_every = lanes_.front()->config.checkpoint_every;
  double last_report = 0;
  while (step_ < budget_ && any_active()) {
    const std::int64_t next_eval = std::min(budget_, (step_ / every + 1) * every);
    for (std::size_t i = 0; i < lanes_.size(); ++i) {
      if (lanes_[i]->active && hooks.prune && hooks.prune(i, next_eval)) {
        leave(i, TrialStatus::kPruned, seconds(), hooks);
      }
    }
    if (!any_active()) break;
    train_step();
    for (std::size_t i = 0; i < lanes_.size(); ++i) {
      Lane& lane = *lanes_[i];
      if (!lane.active) continue;
      if (!std::isfinite(lane.loss)) {
        leave(i, TrialStatus::kDiverged, seconds(), hooks);
        continue;
      }
      lane.loss_sum += lane.loss;
      ++lane.losses;
    }
    const auto reporting = std::find_if(lanes_.begin(), lanes_.end(), [](const auto& l) { return l->active; });
    if (hooks.progress && reporting != lanes_.end() && (seconds() - last_report > 0.5 || step_ == budget_)) {
      last_report = seconds();
      hooks.progress({step_, budget_, (*reporting)->loss, static_cast<double>(step_) / std::max(1e-9, last_report)});
    }
    if (step_ % every != 0 && step_ != budget_) continue;
    if (!any_active()) break;
    evaluate_lanes(hooks, seconds);
    if (hooks.on_checkpoint && checkpoint_every > 0 && step_ % checkpoint_every == 0 && step_ < budget_ &&
        any_active()) {
      elapsed_ = seconds();
      hooks.on_checkpoint(checkpoint());
    }
  }
  elapsed_ = seconds();
  for (std::size_t i = 0; i < lanes_.size(); ++i) {
    if (lanes_[i]->active) leave(i, TrialStatus::kNotReached, elapsed_, hooks);
  }
  std::vector<TrialResult> out;
  for (const auto& lane : lanes_) out.push_back(lane->result);
  return out;
}

std::vector<std::pair<std::string, double>> Trainer::trust_ratios(std::size_t lane) const {
  const auto* layerwise = dynamic_cast<const optim::LayerwiseOptimizerBase*>(lanes_.at(lane)->optimizer.get());
  if (layerwise == nullptr) return {};  // SGD, Adam, AdamW
  std::map<const void*, std::string> names;
  for (const auto& item : model_->lane(lane).named_parameters()) names[item.value().unsafeGetTensorImpl()] = item.key();
  std::vector<std::pair<std::string, double>> out;
  for (const auto& r : layerwise->trust_ratios()) out.emplace_back(names.at(r.param.unsafeGetTensorImpl()), r.ratio);
  return out;
}

}  // namespace bigbatch::experiments
