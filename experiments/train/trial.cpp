// The training loop (trial.h), once for a single trial and for a batched
// group of lanes, following docs/formulas.md "Steps to result":
// steps-to-target is the first evaluation step at which the validation
// metric reaches the target; and a single trial's model side (the stacked
// one of a group is batched.cpp's). The checkpoint is in checkpoint.cpp.
#include "trial.h"

#include "batched.h"
#include "lane.h"
#include "lane_model.h"
#include "loader.h"
#include "../workload/models.h"
#include "../optim/optimizer.h"
#include "../../compat/autocast.h"
#include "../../noise/noise_scale.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/batchnorm.h>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace bigbatch::experiments {

// ------------------------------------------------------- one trial's model --
// The LaneModel of a single trial (lane_model.h): the step's gradient in one
// of three ways (the whole batch; micro-batches whose norms give the noise
// scale; data-parallel over a process group, where the ranks' norms give it),
// and the evaluation (under a process group, rank 0's, broadcast so that
// every rank stops at the same step). The stacked model of a batched group
// is batched.cpp's.

namespace {

namespace F = torch::nn::functional;

/// BatchNormOptions' momentum: c10::optional in LibTorch 1.13, std::optional since.
using NormMomentum = std::remove_reference_t<decltype(std::declval<torch::nn::BatchNormOptions&>().momentum())>;

/// A BatchNorm layer's running statistics and its momentum option.
struct NormStatistics {
  at::Tensor* mean;
  at::Tensor* var;
  at::Tensor* count;
  NormMomentum* momentum;
};

/// The BatchNorm layers (1d, 2d, 3d) of `module`, in module order.
std::vector<NormStatistics> batch_norms(torch::nn::Module& module) {
  std::vector<NormStatistics> out;
  const auto take = [&](auto* bn) {
    if (bn != nullptr && bn->options.track_running_stats()) {
      out.push_back({&bn->running_mean, &bn->running_var, &bn->num_batches_tracked, &bn->options.momentum()});
    }
    return bn != nullptr;
  };
  for (const auto& m : module.modules(/*include_self=*/true)) {
    take(dynamic_cast<torch::nn::BatchNorm1dImpl*>(m.get())) || take(dynamic_cast<torch::nn::BatchNorm2dImpl*>(m.get())) ||
        take(dynamic_cast<torch::nn::BatchNorm3dImpl*>(m.get()));
  }
  return out;
}

/// Rows per forward pass when BatchNorm statistics are recomputed.
constexpr std::int64_t kNormRows = 256;

class SingleModel final : public LaneModel {
 public:
  SingleModel(Model model, const WorkloadData& data, const at::Device& device, distributed::ProcessGroup* group,
              const distributed::CompressionSpec& compression, Precision precision)
      : LaneModel(1), model_(std::move(model)), sequential_(model_.sequential()), data_(data), device_(device),
        group_(group), precision_(precision) {
    model_.module().to(device_);
    if (group_) distributed::broadcast_module(*group_, model_.module());
    if (group_ && group_->size() > 1) exchange_.emplace(compression);
    params_ = model_.module().parameters();
  }

  distributed::GradientExchange* exchange() override { return reduce_ ? nullptr : exchange_ ? &*exchange_ : nullptr; }
  void local_steps() override {
    local_ = true;
    exchange_.reset();
  }
  void reduce_gradients_with(std::function<distributed::GradientNorms()> reduce) override {
    reduce_ = std::move(reduce);
  }

  torch::nn::Module& lane(std::size_t) override { return model_.module(); }
  torch::nn::Sequential* sequential() override { return sequential_ ? &sequential_ : nullptr; }
  bool single() const override { return true; }

  std::vector<LaneGradient> gradients(const StepBatch& b, const std::vector<bool>&,
                                      std::int64_t micro_batches) override {
    // Every rank drew the same global batch; b.rows and b.weights are its share.
    const std::int64_t local = b.rows.input.size(0);
    const auto [x, y] = on_device(b.rows, device_);
    const at::Tensor weights = b.weights.defined() ? b.weights.to(device_) : at::Tensor();
    // Zeroed in place, as LibTorch 1.13's Optimizer::zero_grad does (2.x's sets
    // them to none: the same sums).
    for (const auto& p : params_) {
      if (p.grad().defined()) {
        p.mutable_grad().detach_();
        p.mutable_grad().zero_();
      }
    }
    // A world of one (a group asked for on one process, as `--backend nccl`
    // gives) has one batch size for both norms: its noise scale comes from
    // micro-batches, as without a group; its collectives would change nothing.
    if (group_ && group_->size() > 1 && !local_) return {data_parallel(x, y, weights, local, b.size, b.loss_scale)};
    // Local steps (a rank's own share) and a single process.
    if (micro_batches >= 2) return {in_micro_batches(x, y, weights, local, micro_batches, b.loss_scale)};
    const at::Tensor l = loss(x, y, weights);
    scaled(l, b.loss_scale).backward();
    return {{l.item<double>(), std::nullopt}};
  }

  std::vector<ValidationMetrics> evaluate() override {
    if (group_) {  // rank 0 measures, every rank gets its numbers: one stopping decision
      std::vector<at::Tensor> result{at::zeros({2 + static_cast<std::int64_t>(data_.metrics.size())}, at::kDouble)};
      if (group_->rank() == 0) {
        const ValidationMetrics m = evaluate_here();
        result[0][0] = m.loss;
        result[0][1] = m.error;
        for (std::size_t i = 0; i < m.extra.size(); ++i) result[0][2 + static_cast<std::int64_t>(i)] = m.extra[i];
      }
      group_->broadcast(result, 0);
      const at::Tensor r = result[0];
      ValidationMetrics m{r[0].item<double>(), r[1].item<double>(), {}};
      for (std::int64_t i = 2; i < r.numel(); ++i) m.extra.push_back(r[i].item<double>());
      return {m};
    }
    return {evaluate_here()};
  }

 private:
  // The mean (or weighted mean) loss of the model on rows x, y (its forward
  // in the trial's precision, the loss in fp32).
  at::Tensor loss(const at::Tensor& x, const at::Tensor& y, const at::Tensor& weights) {
    const at::Tensor out = forward_in(precision_, device_, [&] { return model_.forward(x); });
    const at::Tensor per_sample = data_.example_loss(out, y);
    return weights.defined() ? (per_sample * weights).mean() : per_sample.mean();
  }

  // What backward starts from: the loss times the loss scale (fp16), or the loss.
  static at::Tensor scaled(const at::Tensor& loss, double scale) { return scale == 1 ? loss : loss * scale; }

  // The averaged gradient over the ranks; each rank's own gradient norm and
  // the averaged one are the two batch sizes of the noise scale. A loss
  // scale scales every gradient, and with it both norms by its square.
  LaneGradient data_parallel(const at::Tensor& x, const at::Tensor& y, const at::Tensor& weights,
                             std::int64_t local, std::int64_t global, double scale) {
    const at::Tensor l = loss(x, y, weights);
    if (!reduce_ && exchange_->spec().overlap) exchange_->begin(*group_, params_);  // all-reduces start during backward
    scaled(l, scale).backward();
    const auto norms = reduce_ ? reduce_() : exchange_->exchange(*group_, params_);
    std::vector<at::Tensor> mean{l.detach().reshape({1}).to(at::kDouble)};
    group_->allreduce_sum(mean);
    LaneGradient g{mean[0].item<double>() / static_cast<double>(group_->size()), std::nullopt};
    // A compressed exchange gives an estimate of the average, whose norm is
    // not the big batch's: no noise-scale sample from it.
    if ((reduce_ || exchange_->last_was_average()) && std::isfinite(norms.local_sq) && std::isfinite(norms.global_sq)) {
      g.noise = NoiseSample{norms.local_sq / (scale * scale), norms.global_sq / (scale * scale), local, global};
    }
    return g;
  }

  // One process: the batch in micro-batches, whose gradient norms and their
  // sum's give the noise scale.
  LaneGradient in_micro_batches(const at::Tensor& x, const at::Tensor& y, const at::Tensor& weights,
                                std::int64_t batch, std::int64_t micro_batches, double scale) {
    const auto m = noise::micro_batch_step(params_, batch, micro_batches, [&](std::int64_t begin, std::int64_t end) {
      return scaled(loss(x.slice(0, begin, end), y.slice(0, begin, end),
                         weights.defined() ? weights.slice(0, begin, end) : at::Tensor()),
                    scale);
    });
    LaneGradient g{m.loss / scale, std::nullopt};
    if (std::isfinite(m.small_sq_norm) && std::isfinite(m.big_sq_norm)) {
      g.noise = NoiseSample{m.small_sq_norm / (scale * scale), m.big_sq_norm / (scale * scale), m.small_batch,
                            m.big_batch};
    }
    return g;
  }

  void recompute_norm_statistics(std::int64_t rows) override {
    replaced_.clear();
    for (const NormStatistics& n : batch_norms(model_.module())) {
      replaced_.push_back({n, n.mean->clone(), n.var->clone(), n.count->clone(), *n.momentum});
    }
    if (replaced_.empty()) return;
    at::NoGradGuard no_grad;
    for (const Replaced& r : replaced_) {
      r.layer.mean->zero_();
      r.layer.var->fill_(1);
      r.layer.count->zero_();
      *r.layer.momentum = NormMomentum();  // none: the plain average over the batches below
    }
    const std::int64_t end = std::min(rows, data_.train_size());
    for (std::int64_t begin = 0; begin < end; begin += kNormRows) {
      const Batch b = data_.train->range(begin, std::min(end, begin + kNormRows));
      const at::Tensor x = b.input.to(device_);
      forward_in(precision_, device_, [&] { return model_.forward(x); });
    }
  }

  void restore_norm_statistics() override {
    at::NoGradGuard no_grad;
    for (const Replaced& r : replaced_) {
      r.layer.mean->copy_(r.mean);
      r.layer.var->copy_(r.var);
      r.layer.count->copy_(r.count);
      *r.layer.momentum = r.momentum;
    }
    replaced_.clear();
  }

  ValidationMetrics evaluate_here() {
    at::NoGradGuard no_grad;
    model_.module().eval();
    const auto out = evaluate_split(data_, device_, 0, [&](const at::Tensor& x) {
      return forward_in(precision_, device_, [&] { return model_.forward(x); });
    });
    model_.module().train();
    return out.at(0);
  }

  Model model_;
  torch::nn::Sequential sequential_;  // the model when it is one (Trainer::model())
  const WorkloadData& data_;
  at::Device device_;
  distributed::ProcessGroup* group_;
  std::optional<distributed::GradientExchange> exchange_;  ///< world > 1
  std::function<distributed::GradientNorms()> reduce_;     ///< replaces exchange_ when set
  bool local_ = false;                                     ///< local_steps(): no exchange
  std::vector<at::Tensor> params_;
  Precision precision_;
  /// What recompute_norm_statistics replaced, layer by layer, until restore_norm_statistics.
  struct Replaced {
    NormStatistics layer;
    at::Tensor mean, var, count;
    NormMomentum momentum;
  };
  std::vector<Replaced> replaced_;
};

}  // namespace

std::unique_ptr<LaneModel> single_model(Model model, const WorkloadData& data, const at::Device& device,
                                        distributed::ProcessGroup* group,
                                        const distributed::CompressionSpec& compression, Precision precision) {
  return std::make_unique<SingleModel>(std::move(model), data, device, group, compression, precision);
}

at::Tensor forward_in(Precision precision, const at::Device& device, const std::function<at::Tensor()>& forward) {
  if (precision == Precision::kFp32) return forward();
  at::Tensor out;
  {
    const compat::AutocastGuard autocast(device.type(), precision == Precision::kBf16 ? at::kBFloat16 : at::kHalf);
    out = forward();
  }
  return out.is_floating_point() && out.scalar_type() != at::kFloat ? out.to(at::kFloat) : out;
}

std::vector<ValidationMetrics> evaluate_split(const WorkloadData& data, const at::Device& device, std::int64_t lanes,
                                        const std::function<at::Tensor(const at::Tensor&)>& forward) {
  const std::int64_t n = data.validation->size();
  const std::int64_t k = std::max<std::int64_t>(lanes, 1);
  const auto options = at::TensorOptions(at::kDouble).device(device);
  const std::size_t extras = data.metrics.size();
  at::Tensor loss = at::zeros({k}, options), wrong = at::zeros({k}, options);
  std::vector<at::Tensor> extra(extras);
  for (auto& e : extra) e = at::zeros({k}, options);
  // Per example [K * rows] -> each lane's sum [K].
  const auto lane_sums = [&](const at::Tensor& values, std::int64_t rows) {
    return values.reshape({k, rows}).sum(1).to(at::kDouble);
  };
  for (std::int64_t begin = 0; begin < n; begin += kEvalChunk) {
    const std::int64_t end = std::min(n, begin + kEvalChunk), rows = end - begin;
    const Batch chunk = data.validation->range(begin, end);
    const at::Tensor x = chunk.input.to(device), y = chunk.target.to(device);
    at::Tensor out = forward(x);
    at::Tensor target = y;
    if (lanes > 0) std::tie(out, target) = lanes_as_batch(out, y);
    if (data.loss || lanes > 0 || (data.classes > 0 && out.dim() > 2)) {
      loss += lane_sums(data.example_loss(out, target), rows);
    } else if (data.classes > 0) {  // (the summed reductions of one model, as before: the same bits)
      loss += F::cross_entropy(out, y, F::CrossEntropyFuncOptions().reduction(torch::kSum)).to(at::kDouble);
    } else {
      loss += (out - y).pow(2).sum().to(at::kDouble);
    }
    if (data.classes > 0) wrong += lane_sums(data.example_error(out, target), rows);
    for (std::size_t m = 0; m < extras; ++m) extra[m] += lane_sums(data.metrics[m].second(out, target), rows);
  }
  const auto count = static_cast<double>(n);
  const at::Tensor l = loss.cpu(), w = wrong.cpu();
  std::vector<ValidationMetrics> result(static_cast<std::size_t>(k));
  for (std::int64_t i = 0; i < k; ++i) {
    ValidationMetrics& m = result[static_cast<std::size_t>(i)];
    m.loss = l[i].item<double>() / count;
    m.error = data.classes > 0 ? w[i].item<double>() / count : kNaN;
    for (const auto& e : extra) m.extra.push_back(e[i].item<double>() / count);
  }
  return result;
}


// ------------------------------------------------------------ the loop --

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
Model initial_model(const TrialConfig& t, const WorkloadData& data) { return build_model(t.model, data, t.seed); }

// The data order of a run: every rank and every lane of a trial's seed
// draws the same batches.
std::uint64_t sampler_seed(const TrialConfig& t) { return t.seed * 7919 + 1; }

}  // namespace

Trainer::Lane::Lane(const TrialConfig& c) : config(c), gns(c.gns.beta) {}

int loader_threads(const LoaderSpec& spec, const WorkloadData& data) {
  return spec.threads >= 0 ? static_cast<int>(spec.threads) : (data.train && data.train->costly() ? 1 : 0);
}

std::string to_string(TrialStatus status) { return config::enum_name(kTrialStatuses, status); }

Trainer::Trainer(const TrialConfig& config, const WorkloadData& data, distributed::ProcessGroup* group)
    : data_(data),
      group_(group),
      device_(trial_device(config.device, group)),
      sampler_(data.train_size(), sampler_seed(config)) {
  distributed::CompressionSpec compression = config.distributed.compression;
  compression.seed = config.seed;
  model_ = single_model(initial_model(config, data), data, device_, group, compression, config.precision);
  add_lanes({config});
}

Trainer::Trainer(const std::vector<TrialConfig>& lanes, const WorkloadData& data)
    : data_(data),
      group_(nullptr),
      device_(trial_device(lanes.at(0).device, nullptr)),
      sampler_(data.train_size(), sampler_seed(lanes.at(0))) {
  for (const auto& t : lanes) {
    TORCH_CHECK(batchable_together(lanes[0], t), "batched trials: ", t.name, " cannot join ", lanes[0].name,
                "'s group", batch_refusal(t).empty() ? "" : ": " + batch_refusal(t));
  }
  const Model model = initial_model(lanes[0], data);
  const std::string refusal = stack_refusal(model);
  TORCH_CHECK(refusal.empty(), "batched trials: ", refusal);
  model_ = stacked_model(model.sequential(), static_cast<std::int64_t>(lanes.size()), data, device_,
                         lanes[0].precision);
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
    torch::optim::Optimizer* stepped = lane->optimizer.get();  // what the schedule's rate change sees
    if (group_ != nullptr && group_->size() > 1 && c.distributed.shard != distributed::ShardStage::kNone) {
      shard_lane(*lane);
      stepped = &lane->sharded->wrapped();
    }
    if (c.distributed.delayed()) {
      distributed::DelaySpec delay = c.distributed.delay;
      delay.seed = c.seed;
      lane->delayed = std::make_unique<distributed::DelayedGradients>(delay, lane->params);
    } else if (!c.distributed.synchronous()) {  // (the model's weights are rank 0's by now)
      distributed::LocalSgdSpec sync = c.distributed.sync;
      sync.compression = c.distributed.compression;
      sync.compression.seed = c.seed;
      lane->local = std::make_unique<distributed::LocalSgd>(sync, lane->params, model_->lane(i).buffers());
      model_->local_steps();
    }
    schedules::Schedule schedule(c.schedule, c.batch_size, data_.train_size());
    const std::int64_t budget = schedule.steps(c.budget.length, c.budget.unit);
    TORCH_CHECK(i == 0 || budget == budget_, "batched trials: the lanes' budgets differ");
    budget_ = budget;
    lane->adapter.emplace(*lane->optimizer, std::move(schedule), rate_change(c.optimizer, *stepped));
    if (c.noise.type == NoiseType::kAnnealed) {
      lane->annealed.emplace(noise::AnnealedNoiseOptions(c.noise.eta).gamma(c.noise.gamma).seed(c.seed));
    } else if (c.noise.type == NoiseType::kMultiplicative) {
      lane->multiplicative.emplace(c.noise.base_batch, c.seed);
    }
    if (c.precision == Precision::kFp16) lane->scaler.emplace();
    if (c.average.on()) lane->average.emplace(c.average.options, lane->params);
    lane->result.budget = budget_;
    lane->result.peak_lr = lane->adapter->schedule().peak_lr();
    lanes_.push_back(std::move(lane));
  }
}

void Trainer::shard_lane(Lane& lane) {
  const auto* like = dynamic_cast<const optim::LayerwiseOptimizerBase*>(lane.optimizer.get());
  TORCH_CHECK(like != nullptr, "distributed.shard: ", lane.config.optimizer.name,
              "'s entry says it shards but made no bigbatch layer-wise optimizer");
  auto sharded = std::make_unique<distributed::ShardedOptimizer>(*group_, *like, lane.config.distributed.shard);
  lane.sharded = sharded.get();
  lane.optimizer = std::move(sharded);
  if (lane.config.distributed.shard == distributed::ShardStage::kGradients) {
    distributed::ShardedOptimizer* s = lane.sharded;
    model_->reduce_gradients_with([s] { return s->reduce_gradients(); });
  }
}

torch::nn::Module& Trainer::module(std::size_t lane) { return model_->lane(lane); }
torch::optim::Optimizer& Trainer::optimizer(std::size_t lane) { return *lanes_.at(lane)->optimizer; }

torch::nn::Sequential& Trainer::model() {
  torch::nn::Sequential* sequential = model_->sequential();
  TORCH_CHECK(sequential != nullptr, "Trainer::model(): a batched group, or a model that is not a torch::nn::Sequential "
                                   "(use module(lane))");
  return *sequential;
}

void Trainer::check_one_lane(const char* what) const {
  TORCH_CHECK(lanes_.size() == 1 && model_->single(), what,
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
  const auto start = std::chrono::steady_clock::now();
  b.rows = fetch(b);
  if (first.multiplicative) b.weights = share(first.multiplicative->weights(b.size, step_));
  if (first.scaler) b.loss_scale = first.scaler->scale();  // (fp16 trials are never batched: one lane)
  // Delayed gradients (never batched: one lane): this step's gradient at the
  // parameters of tau steps ago (data-parallel: every rank's, exchanged as
  // usual; the ranks hold the same past and draw the same tau), applied to today's.
  const std::int64_t tau = first.delayed ? first.delayed->staleness(step_) : 0;
  std::optional<distributed::DelayedGradients::Stale> stale;
  if (first.delayed) stale.emplace(*first.delayed, tau);
  const std::vector<LaneGradient> gradients = model_->gradients(b, active, first.config.gns.micro_batches);
  stale.reset();
  std::vector<double> losses(lanes_.size(), kNaN);
  for (std::size_t i = 0; i < lanes_.size(); ++i) {
    Lane& lane = *lanes_[i];
    if (!lane.active) continue;
    if (const auto& n = gradients[i].noise) lane.gns.update(n->small_sq, n->small_batch, n->big_sq, n->big_batch);
    // fp16: the gradients unscaled, and the step skipped (no parameter or
    // state changes) when one is inf or NaN; the same on every rank, whose
    // gradients the exchange made equal.
    const bool finite = !lane.scaler || lane.scaler->unscale(lane.params);
    if (lane.delayed) {
      lane.delayed->record(tau);
      const double factor = lane.delayed->rate_factor(tau);  // staleness_aware: the rate over tau
      for (auto& g : lane.optimizer->param_groups()) g.options().set_lr(g.options().get_lr() * factor);
    }
    if (finite) {
      if (lane.annealed) lane.annealed->apply(lane.params, step_);  // the same noise on every rank
      lane.optimizer->step();
    }
    if (lane.scaler) lane.scaler->update(finite);
    if (lane.average) lane.average->update(step_ + 1, b.size);
    lane.loss = losses[i] = lane.local ? synchronize(lane, gradients[i].loss) : gradients[i].loss;
  }
  ++step_;
  examples_ += b.size;
  step_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return losses;
}

double Trainer::synchronize(Lane& lane, double loss) {
  const std::int64_t t = step_ + 1;  // the steps taken with this one
  bool synced = lane.local->after_step(group_, t);
  if (t == budget_) synced = lane.local->finish(group_, t) || synced;  // the run ends on one model
  if (!std::isfinite(loss)) lane.local_nonfinite = true;
  if (!synced && t % lane.config.target.eval_every != 0 && t != budget_) {
    return std::isfinite(loss) ? loss : lane.loss;
  }
  bool any = lane.local_nonfinite;
  if (group_ != nullptr && group_->size() > 1) {
    std::vector<at::Tensor> flag{at::tensor({any ? 1.0 : 0.0}, at::kDouble)};
    group_->allreduce_sum(flag);
    any = flag[0].item<double>() > 0;
  }
  lane.local_nonfinite = false;
  return any ? kNaN : loss;
}

double Trainer::data_wait_fraction() const {
  return loader_ && step_seconds_ > 0 ? (loader_->waited() - wait_base_) / step_seconds_ : kNaN;
}

at::Tensor Trainer::share(const at::Tensor& rows) const {
  if (group_ == nullptr) return rows;
  const std::int64_t world = group_->size(), size = rows.size(0);
  TORCH_CHECK(size % world == 0, "batch size ", size, " is not divisible by the world size ", world);
  const std::int64_t local = size / world, begin = group_->rank() * local;
  return rows.slice(0, begin, begin + local);
}

Batch Trainer::fetch(StepBatch& b) {
  if (!loader_) {
    const LoaderSpec& spec = lanes_.front()->config.loader;
    const int threads = loader_threads(spec, data_);
    loader_ = std::make_unique<BatchLoader>(*data_.train, threads, device_.is_cuda());
    prefetch_ = threads > 0 ? spec.prefetch : 0;
  }
  // ahead_, a copy of the sampler, asks for this step's batch and up to
  // prefetch_ after it; the sampler itself draws only the batches taken
  // (what a checkpoint records).
  const schedules::Schedule& schedule = lanes_.front()->adapter->schedule();
  if (!ahead_) {
    ahead_ = sampler_.clone();
    ahead_step_ = step_;
  }
  b.index = sampler_.next(b.size);
  while (ahead_step_ <= step_ + prefetch_ && ahead_step_ < std::max(budget_, step_ + 1)) {
    const at::Tensor next = ahead_->next(schedule.batch_size(ahead_step_));
    loader_->request(share(next), Draw{sampler_seed(lanes_.front()->config), ahead_->epoch()});
    ++ahead_step_;
  }
  return loader_->take(share(b.index));
}

std::vector<ValidationMetrics> Trainer::evaluate() { return model_->evaluate(); }

std::vector<std::string> Trainer::metric_names() const {
  std::vector<std::string> out;
  for (const auto& m : data_.metrics) out.push_back(m.first);
  return out;
}

namespace {

// summary.json's "exchange": what rank 0 sent in `steps` steps, `syncs`
// synchronizations (every step of synchronous data parallelism; local SGD's
// and DiLoCo's rounds), and until the target; `dense` is what one step's
// fp32 all-reduce of every gradient sends.
nlohmann::json exchange_report(const distributed::Compression compression, const distributed::ExchangeStats& t,
                               std::int64_t steps, std::int64_t syncs, double dense,
                               const std::optional<double>& bytes_to_target,
                               const std::optional<std::int64_t>& syncs_to_target) {
  const double per_step = t.bytes_sent / std::max<double>(1, static_cast<double>(steps));
  nlohmann::json j = {{"compression", distributed::compression_name(compression)},
                      {"steps", steps},
                      {"syncs", syncs},
                      {"bytes_sent", t.bytes_sent},
                      {"bytes_received", t.bytes_received},
                      {"bytes_sent_per_step", per_step},
                      {"dense_bytes_per_step", dense},
                      {"compression_ratio", per_step > 0 ? dense / per_step : 1.0},
                      {"compress_seconds", t.compress_seconds},
                      {"comm_seconds", t.communicate_seconds},
                      {"bytes_to_target", nullptr},
                      {"syncs_to_target", nullptr}};
  if (bytes_to_target) j["bytes_to_target"] = *bytes_to_target;
  if (syncs_to_target) j["syncs_to_target"] = *syncs_to_target;
  return j;
}

// The peak resident memory of this process so far, in bytes (Linux reports KiB).
double peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) * 1024.0;
}

// A sharded optimizer's measures on every rank (an all-gather: every rank
// calls it at the same evaluation) and what a step exchanges.
nlohmann::json shard_report(distributed::ProcessGroup& group, const distributed::ShardedOptimizer& sharded) {
  const at::Tensor mine = at::tensor({static_cast<double>(sharded.state_bytes()),
                                      static_cast<double>(sharded.gradient_bytes()), peak_rss_bytes()},
                                     at::kDouble);
  nlohmann::json state = nlohmann::json::array(), grads = nlohmann::json::array(), rss = nlohmann::json::array();
  for (const at::Tensor& rank : group.allgather(mine)) {
    state.push_back(rank[0].item<double>());
    grads.push_back(rank[1].item<double>());
    rss.push_back(rank[2].item<double>());
  }
  const distributed::ExchangeBytes bytes = sharded.exchange_bytes();
  return {{"stage", distributed::shard_stage_name(sharded.stage())},
          {"ranks", group.size()},
          {"state_bytes", state},
          {"gradient_bytes", grads},
          {"peak_rss_bytes", rss},
          {"step_bytes", {{"all_reduce", bytes.all_reduce},
                          {"reduce_scatter", bytes.reduce_scatter},
                          {"all_gather", bytes.all_gather}}}};
}

// The layer scalars of a sharded optimizer's wrapped optimizer, each of its
// whole parameter, from every rank (a collective, as shard_report): a rank's
// scalars are of the tensors it holds. A tensor cut across ranks reports on
// each the same value (the whole tensor's ratio); the lowest rank's is kept.
std::vector<LayerScalar> shard_scalars(distributed::ProcessGroup& group, const OptimizerSpec& spec,
                                       const distributed::ShardedOptimizer& sharded) {
  std::ostringstream mine;
  mine << std::hexfloat;  // exact, as the unsharded scalars are
  for (const LayerScalar& s : layer_scalars(spec, sharded.wrapped())) {
    if (const auto t = sharded.tensor_of(s.param)) mine << s.tag << '\t' << *t << '\t' << s.value << '\n';
  }
  std::map<std::pair<std::string, std::size_t>, double> all;
  for (int r = 0; r < group.size(); ++r) {
    std::istringstream lines(distributed::broadcast_bytes(group, mine.str(), r));
    std::string tag, index, value;
    while (std::getline(lines, tag, '\t') && std::getline(lines, index, '\t') && std::getline(lines, value)) {
      all.emplace(std::make_pair(tag, static_cast<std::size_t>(std::stoull(index))), std::strtod(value.c_str(), nullptr));
    }
  }
  std::vector<LayerScalar> out;
  for (const auto& [key, value] : all) out.push_back({key.first, sharded.params().at(key.second), value});
  return out;
}

// The largest of a JSON array of numbers.
double largest(const nlohmann::json& values) {
  double most = kNaN;
  for (const auto& v : values) most = std::isnan(most) ? v.get<double>() : std::max(most, v.get<double>());
  return most;
}

}  // namespace

void Trainer::leave(std::size_t i, TrialStatus status, double seconds, const Hooks& hooks) {
  Lane& lane = *lanes_[i];
  lane.active = false;
  TrialResult& r = lane.result;
  r.status = status;
  r.steps = step_;
  r.rows = lane.rows;
  r.best_metric = lane.best_metric;
  r.wall_time = seconds;
  if (loader_) r.loader_threads = loader_->threads();
  r.data_wait_fraction = data_wait_fraction();
  if (data_.report) r.data_report = data_.report();
  if (const distributed::GradientExchange* exchange = model_->exchange()) {
    const distributed::ExchangeStats& t = exchange->totals();
    r.exchange = exchange_report(exchange->spec().method, t, t.steps, t.steps, t.dense_bytes / std::max<double>(1, t.steps),
                                 lane.bytes_to_target, lane.syncs_to_target);
    r.exchange["sync"] = distributed::sync_type_name(distributed::SyncType::kEveryStep);
  }
  if (lane.delayed) {
    const distributed::DelayedGradients& d = *lane.delayed;
    const std::vector<std::int64_t>& h = d.histogram();
    double sum = 0, n = 0;
    for (std::size_t k = 0; k < h.size(); ++k) {
      sum += static_cast<double>(k) * static_cast<double>(h[k]);
      n += static_cast<double>(h[k]);
    }
    r.staleness = {{"tau", d.spec().tau},
                   {"draw", config::enum_name(distributed::kStalenessDrawNames, d.spec().draw)},
                   {"staleness_aware", d.spec().staleness_aware},
                   {"steps", step_},
                   {"histogram", h},
                   {"mean", n > 0 ? sum / n : 0.0}};
  }
  if (lane.local) {
    const distributed::LocalSgd& sync = *lane.local;
    const distributed::SyncStats& s = sync.totals();
    distributed::ExchangeStats t;
    t.steps = s.rounds;
    t.bytes_sent = s.bytes_sent;
    t.bytes_received = s.bytes_received;
    t.compress_seconds = s.compress_seconds;
    t.communicate_seconds = s.communicate_seconds;
    // A step of synchronous fp32 data parallelism: every parameter's gradient all-reduced.
    const double w = group_ != nullptr ? group_->size() : 1;
    double dense = 0;
    for (const auto& p : lane.params) dense += static_cast<double>(p.numel()) * 4 * 2 * (w - 1) / w;
    r.exchange = exchange_report(sync.spec().compression.method, t, step_, s.rounds, dense, lane.bytes_to_target,
                                 lane.syncs_to_target);
    const distributed::LocalSgdSpec& spec = sync.spec();
    r.exchange["sync"] = distributed::sync_type_name(spec.type);
    r.exchange["every"] = spec.every;
    r.exchange["fragments"] = spec.fragments;
    r.exchange["outer"] = {{"lr", spec.outer.lr}, {"momentum", spec.outer.momentum}, {"nesterov", spec.outer.nesterov}};
    r.exchange["fragment_syncs"] = s.fragment_syncs;
    r.exchange["peak_sync_bytes"] = s.peak_round_bytes;
    r.exchange["dense_sync_bytes"] = s.dense_bytes;
  }
  if (lane.sharded != nullptr) r.shard = lane.shard_report;
  if (hooks.finished) hooks.finished(i, r);
}

void Trainer::evaluate_lanes(const Hooks& hooks, const std::function<double()>& seconds) {
  // An optimizer with a point to evaluate (Schedule-Free's x) is evaluated
  // there, with BatchNorm statistics recomputed at it (they were gathered at
  // the training point), then put back: the next step starts where it was.
  std::vector<optim::LayerwiseOptimizerBase*> moved;
  for (auto& lane : lanes_) {
    auto* o = dynamic_cast<optim::LayerwiseOptimizerBase*>(lane->optimizer.get());
    if (o != nullptr && o->has_evaluation_point()) {
      o->eval();
      moved.push_back(o);
    }
  }
  if (!moved.empty()) model_->recompute_norm_statistics(kNormStatisticsRows);
  // Local SGD, DiLoCo: the global model (each fragment as last synchronized,
  // the same on every rank), not this rank's own between synchronizations.
  std::optional<distributed::LocalSgd::Global> global;
  if (lanes_.size() == 1 && lanes_.front()->local) global.emplace(*lanes_.front()->local);
  const auto metrics = evaluate();
  global.reset();
  if (!moved.empty()) {
    model_->restore_norm_statistics();
    for (auto* o : moved) o->train();
  }
  // The averaged weights (weight_average.h) in a second pass, with BatchNorm
  // statistics recomputed at them as at Schedule-Free's x; the trained
  // weights go back bit for bit when the swaps end.
  std::vector<ValidationMetrics> averaged;
  std::vector<bool> has_average(lanes_.size(), false);
  {
    std::vector<std::unique_ptr<optim::WeightAverage::Swap>> swaps;
    for (std::size_t i = 0; i < lanes_.size(); ++i) {
      const Lane& lane = *lanes_[i];
      if (!lane.active || !lane.average || !lane.average->ready()) continue;
      swaps.push_back(std::make_unique<optim::WeightAverage::Swap>(*lane.average));
      has_average[i] = true;
    }
    if (!swaps.empty()) {
      model_->recompute_norm_statistics(kNormStatisticsRows);
      averaged = evaluate();
      model_->restore_norm_statistics();
    }
  }
  for (auto& lane : lanes_) {  // every rank evaluates together: the place for a collective
    if (lane->sharded != nullptr) {
      lane->shard_report = shard_report(*group_, *lane->sharded);
      lane->shard_scalars = shard_scalars(*group_, lane->config.optimizer, *lane->sharded);
    }
  }
  for (std::size_t i = 0; i < lanes_.size(); ++i) {
    Lane& lane = *lanes_[i];
    if (!lane.active) continue;
    const double val_loss = metrics[i].loss, val_error = metrics[i].error;
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
    if (const distributed::GradientExchange* exchange = model_->exchange()) {
      const distributed::ExchangeStats& t = exchange->totals();
      row.bytes_sent = t.bytes_sent;
      row.bytes_received = t.bytes_received;
      row.compress_seconds = t.compress_seconds;
      row.comm_seconds = t.communicate_seconds;
      row.syncs = static_cast<double>(t.steps);
    }
    if (lane.local) {
      const distributed::SyncStats& t = lane.local->totals();
      row.bytes_sent = t.bytes_sent;
      row.bytes_received = t.bytes_received;
      row.compress_seconds = t.compress_seconds;
      row.comm_seconds = t.communicate_seconds;
      row.syncs = static_cast<double>(t.rounds);
      row.outer_norm = t.last_outer_norm;
    }
    if (lane.sharded != nullptr) {
      row.state_bytes = largest(lane.shard_report["state_bytes"]);
      row.peak_rss_bytes = largest(lane.shard_report["peak_rss_bytes"]);
    }
    if (lane.scaler) {
      row.loss_scale = lane.scaler->scale();
      row.skipped_steps = static_cast<double>(lane.scaler->skipped_steps());
    }
    if (has_average[i]) {
      row.avg_val_loss = averaged[i].loss;
      row.avg_val_error = averaged[i].error;
    }
    row.extra = metrics[i].extra;
    lane.rows.push_back(row);
    if (hooks.on_eval) hooks.on_eval(i, row);
    lane.loss_sum = 0;
    lane.losses = 0;
    if (!std::isfinite(val_loss)) {
      leave(i, TrialStatus::kDiverged, seconds(), hooks);
      continue;
    }
    const double metric = target_metric(lane.config, row);
    if (!std::isnan(metric)) lane.best_metric = std::min(lane.best_metric, metric);
    if (metric <= lane.config.target.threshold && !lane.result.steps_to_target) {
      lane.result.steps_to_target = step_;
      lane.result.examples_to_target = examples_;
      if (!std::isnan(row.bytes_sent)) lane.bytes_to_target = row.bytes_sent;
      if (!std::isnan(row.syncs)) lane.syncs_to_target = static_cast<std::int64_t>(row.syncs);
      if (!hooks.past_target) leave(i, TrialStatus::kReached, seconds(), hooks);
    }
  }
}

std::vector<TrialResult> Trainer::run() { return run(Hooks{}); }

std::vector<TrialResult> Trainer::run(const Hooks& hooks) {
  const auto start = std::chrono::steady_clock::now();
  const double before = elapsed_;
  step_seconds_ = 0;  // the data-wait fraction is this run's
  wait_base_ = loader_ ? loader_->waited() : 0;
  const std::function<double()> seconds = [&] {
    return before + std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const std::int64_t every = lanes_.front()->config.target.eval_every;  // the lanes share it
  const std::int64_t checkpoint_every = lanes_.front()->config.checkpoint_every;
  double last_report = 0;
  while (step_ < budget_ && any_active()) {
    if (hooks.interrupt) {
      const Interrupt how = hooks.interrupt();
      if (how != Interrupt::kNone) {
        elapsed_ = seconds();
        if (how == Interrupt::kCheckpoint && hooks.on_checkpoint && lanes_.size() == 1 && step_ > 0 &&
            lanes_.front()->config.distributed.synchronous()) {  // (the ranks' own models, the past parameters)
          hooks.on_checkpoint(checkpoint());
        }
        throw TrialInterrupted(how);
      }
    }
    if (hooks.before_step) hooks.before_step(step_);
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
    if (!lanes_[i]->active) continue;
    leave(i, lanes_[i]->result.steps_to_target ? TrialStatus::kReached : TrialStatus::kNotReached, elapsed_, hooks);
  }
  std::vector<TrialResult> out;
  for (const auto& lane : lanes_) out.push_back(lane->result);
  return out;
}

std::vector<std::pair<std::string, double>> Trainer::layer_scalars(std::size_t lane) const {
  const Lane& l = *lanes_.at(lane);
  const std::vector<LayerScalar> scalars =
      l.sharded != nullptr ? l.shard_scalars : experiments::layer_scalars(l.config.optimizer, *l.optimizer);
  if (scalars.empty()) return {};  // SGD, Adam, AdamW
  std::map<const void*, std::string> names;
  for (const auto& item : model_->lane(lane).named_parameters()) names[item.value().unsafeGetTensorImpl()] = item.key();
  std::vector<std::pair<std::string, double>> out;
  for (const auto& s : scalars) out.emplace_back(s.tag + "/" + names.at(s.param.unsafeGetTensorImpl()), s.value);
  return out;
}

}  // namespace bigbatch::experiments
