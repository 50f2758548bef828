// The training loop of one trial (trial.h), following docs/formulas.md "Steps to
// result": steps-to-target is the first evaluation step at which the
// validation metric reaches the target.
#include <bigbatch/experiments/trial.h>

#include <bigbatch/experiments/models.h>
#include <bigbatch/experiments/optimizer_registry.h>
#include <bigbatch/experiments/tensorboard.h>
#include <bigbatch/optimizers/lamb.h>
#include <bigbatch/optimizers/larc.h>
#include <bigbatch/optimizers/lars.h>

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/nn/functional/loss.h>

#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <string_view>
#include <type_traits>

namespace bigbatch::experiments {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// "cpu", or "cuda": device LOCAL_RANK (modulo the devices) under a process group.
at::Device trial_device(DeviceType type, const distributed::ProcessGroup* group) {
  if (type == DeviceType::kCpu) return at::Device(at::kCPU);
  const auto devices = static_cast<int>(torch::cuda::device_count());
  TORCH_CHECK(devices > 0, "device \"cuda\": no CUDA device is visible (or this LibTorch has no CUDA)");
  const int local = group != nullptr ? group->local_rank() : 0;
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(local % devices));
}

}  // namespace

std::mutex& model_init_mutex() {
  static std::mutex m;
  return m;
}

std::string to_string(TrialStatus status) { return schedules::enum_name(kTrialStatuses, status); }

Trainer::Trainer(const TrialConfig& config, const Dataset& data, distributed::ProcessGroup* group)
    : config_(config),
      data_(data),
      group_(group),
      device_(trial_device(config.device, group)),
      sampler_(data.train_size(), config.seed * 7919 + 1),
      gns_(config.gns.beta),
      best_metric_(std::numeric_limits<double>::infinity()) {
  {
    std::lock_guard<std::mutex> lock(model_init_mutex());
    at::manual_seed(config.seed);
    model_ = make_model(config.model, data.example_shape(), data.classes > 0 ? data.classes : 1);
  }
  model_->to(device_);
  if (group_) distributed::broadcast_module(*group_, *model_);
  params_ = model_->parameters();
  optimizer_ = make_optimizer(config.optimizer, config.schedule.base_lr, *model_);
  schedules::Schedule schedule(config.schedule, config.batch_size, data.train_size());
  budget_ = schedule.steps(config.budget.length, config.budget.unit);
  schedules::LRAdapter::RateChange momentum_correction;
  if (config.optimizer.momentum_correction) {
    auto* lars = dynamic_cast<optim::LARS*>(optimizer_.get());
    TORCH_INTERNAL_ASSERT(lars != nullptr, "config validation allows momentum_correction for lars only");
    momentum_correction = [lars](double factor) { lars->rescale_momentum(factor); };
  }
  adapter_.emplace(*optimizer_, std::move(schedule), std::move(momentum_correction));
  if (config.noise.type == NoiseType::kAnnealed) {
    annealed_.emplace(noise::AnnealedNoiseOptions(config.noise.eta).gamma(config.noise.gamma).seed(config.seed));
  } else if (config.noise.type == NoiseType::kMultiplicative) {
    multiplicative_.emplace(config.noise.base_batch, config.seed);
  }
}

at::Tensor Trainer::batch_loss(const at::Tensor& x, const at::Tensor& y, const at::Tensor& weights) {
  namespace F = torch::nn::functional;
  const at::Tensor out = model_->forward(x);
  at::Tensor per_sample = data_.classes > 0
                              ? F::cross_entropy(out, y, F::CrossEntropyFuncOptions().reduction(torch::kNone))
                              : (out - y).pow(2).sum(1);
  return weights.defined() ? (per_sample * weights).mean() : per_sample.mean();
}

double Trainer::train_step() {
  Batch b;
  b.global = adapter_->schedule().batch_size(step_);
  adapter_->apply(step_);
  last_lr_ = optimizer_->param_groups().front().options().get_lr();
  // Every rank draws the same global batch (same seed) and takes its share.
  at::Tensor index = sampler_.next(b.global);
  b.weights = multiplicative_ ? multiplicative_->weights(b.global, step_) : at::Tensor();
  b.local = b.global;
  if (group_) {
    const std::int64_t world = group_->size();
    TORCH_CHECK(b.global % world == 0, "batch size ", b.global, " is not divisible by the world size ", world);
    b.local = b.global / world;
    const std::int64_t begin = group_->rank() * b.local;
    index = index.slice(0, begin, begin + b.local);
    if (b.weights.defined()) b.weights = b.weights.slice(0, begin, begin + b.local);
  }
  b.x = data_.x_train.index_select(0, index).to(device_);
  b.y = data_.y_train.index_select(0, index).to(device_);
  if (b.weights.defined()) b.weights = b.weights.to(device_);
  optimizer_->zero_grad();
  const double loss = group_                           ? gradients_data_parallel(b)
                      : config_.gns.micro_batches >= 2 ? gradients_in_micro_batches(b)
                                                       : gradients_whole(b);
  if (annealed_) annealed_->apply(params_, step_);  // the same noise on every rank
  optimizer_->step();
  ++step_;
  examples_ += b.global;
  return loss;
}

double Trainer::gradients_whole(const Batch& b) {
  const at::Tensor l = batch_loss(b.x, b.y, b.weights);
  l.backward();
  return l.item<double>();
}

// The averaged gradient over the ranks; each rank's own gradient norm and the
// averaged one are the two batch sizes of the noise scale.
double Trainer::gradients_data_parallel(const Batch& b) {
  const at::Tensor l = batch_loss(b.x, b.y, b.weights);
  l.backward();
  const auto norms = distributed::allreduce_gradients(*group_, params_);
  std::vector<at::Tensor> mean{l.detach().reshape({1}).to(at::kDouble)};
  group_->allreduce_sum(mean);
  if (std::isfinite(norms.local_sq) && std::isfinite(norms.global_sq)) {
    gns_.update(norms.local_sq, b.local, norms.global_sq, b.global);
  }
  return mean[0].item<double>() / static_cast<double>(group_->size());
}

// One process: the batch in gns.micro_batches pieces, whose gradient norms
// and their sum's give the noise scale.
double Trainer::gradients_in_micro_batches(const Batch& b) {
  const auto m = noise::micro_batch_step(params_, b.global, config_.gns.micro_batches,
                                         [&](std::int64_t begin, std::int64_t end) {
                                           return batch_loss(b.x.slice(0, begin, end), b.y.slice(0, begin, end),
                                                             b.weights.defined() ? b.weights.slice(0, begin, end)
                                                                                 : at::Tensor());
                                         });
  if (std::isfinite(m.small_sq_norm) && std::isfinite(m.big_sq_norm)) {
    gns_.update(m.small_sq_norm, m.small_batch, m.big_sq_norm, m.big_batch);
  }
  return m.loss;
}

std::pair<double, double> Trainer::evaluate() {
  if (group_) {  // rank 0 measures, every rank gets its numbers: one stopping decision
    std::vector<at::Tensor> result{at::zeros({2}, at::kDouble)};
    if (group_->rank() == 0) {
      const auto [l, e] = evaluate_local();
      result[0][0] = l;
      result[0][1] = e;
    }
    group_->broadcast(result, 0);
    return {result[0][0].item<double>(), result[0][1].item<double>()};
  }
  return evaluate_local();
}

std::pair<double, double> Trainer::evaluate_local() {
  at::NoGradGuard no_grad;
  model_->eval();
  const std::int64_t n = data_.x_val.size(0);
  double loss = 0;
  double wrong = 0;
  for (std::int64_t begin = 0; begin < n; begin += 8192) {
    const std::int64_t end = std::min(n, begin + 8192);
    const at::Tensor x = data_.x_val.slice(0, begin, end).to(device_);
    const at::Tensor y = data_.y_val.slice(0, begin, end).to(device_);
    const at::Tensor out = model_->forward(x);
    if (data_.classes > 0) {
      loss += torch::nn::functional::cross_entropy(
                  out, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                  .item<double>();
      wrong += out.argmax(1).ne(y).sum().item<double>();
    } else {
      loss += (out - y).pow(2).sum().item<double>();
    }
  }
  model_->train();
  const auto count = static_cast<double>(n);
  return {loss / count, data_.classes > 0 ? wrong / count : kNaN};
}

TrialResult Trainer::run(const std::function<void(const TrialProgress&)>& progress,
                         const std::function<void(const std::string&)>& on_checkpoint,
                         const std::function<void(const EvalRow&)>& on_eval,
                         const std::function<bool(std::int64_t)>& prune) {
  const auto start = std::chrono::steady_clock::now();
  const double before = elapsed_;
  const auto seconds = [&] {
    return before + std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  TrialResult r;
  r.budget = budget_;
  r.peak_lr = adapter_->schedule().peak_lr();
  const bool use_error = config_.target.metric == Metric::kValError;
  double loss_sum = 0;
  std::int64_t loss_count = 0;
  double last_report = 0;
  const std::int64_t every = config_.target.eval_every;
  while (step_ < budget_) {
    if (prune && prune(std::min(budget_, (step_ / every + 1) * every))) {
      r.status = TrialStatus::kPruned;
      break;
    }
    const double loss = train_step();
    if (!std::isfinite(loss)) {
      r.status = TrialStatus::kDiverged;
      break;
    }
    loss_sum += loss;
    ++loss_count;
    if (progress && (seconds() - last_report > 0.5 || step_ == budget_)) {
      last_report = seconds();
      progress({step_, budget_, loss, static_cast<double>(step_) / std::max(1e-9, last_report)});
    }
    if (step_ % every != 0 && step_ != budget_) continue;
    const auto [val_loss, val_error] = evaluate();
    EvalRow row;
    row.step = step_;
    row.examples = examples_;
    row.epoch = static_cast<double>(examples_) / static_cast<double>(data_.train_size());
    row.train_loss = loss_sum / static_cast<double>(loss_count);
    row.val_loss = val_loss;
    row.val_error = val_error;
    row.lr = last_lr_;
    row.batch_size = adapter_->schedule().batch_size(step_ - 1);
    row.wall_time = seconds();
    row.gns = b_simple();
    rows_.push_back(row);
    if (on_eval) on_eval(row);
    loss_sum = 0;
    loss_count = 0;
    const double metric = use_error ? val_error : val_loss;
    if (!std::isfinite(val_loss)) {
      r.status = TrialStatus::kDiverged;
      break;
    }
    best_metric_ = std::min(best_metric_, metric);
    if (metric <= config_.target.threshold) {
      r.status = TrialStatus::kReached;
      r.steps_to_target = step_;
      r.examples_to_target = examples_;
      break;
    }
    if (on_checkpoint && config_.checkpoint_every > 0 && step_ % config_.checkpoint_every == 0 &&
        step_ < budget_) {
      elapsed_ = seconds();
      on_checkpoint(checkpoint());
    }
  }
  r.steps = step_;
  r.rows = rows_;
  r.best_metric = best_metric_;
  r.wall_time = seconds();
  elapsed_ = r.wall_time;
  return r;
}

// ------------------------------------------------------------- trust ratios --
// kernels/momentum.h's and kernels/lamb.h's ratio functions, on the norms of
// the weights, gradients and (LAMB) the Adam update the state gives.

namespace {

double l2(const at::Tensor& t) { return t.to(at::kDouble).norm().item<double>(); }

std::optional<double> lamb_ratio(const optim::LAMB& lamb, const optim::LAMBOptions& o, const at::Tensor& p) {
  if (!o.adapt() || (o.weight_decay() == 0 && !o.always_adapt())) return std::nullopt;
  const optim::LAMBParamState* s = lamb.param_state(p);
  if (s == nullptr || s->step() == 0) return std::nullopt;
  const auto [b1, b2] = o.betas();
  const auto t = static_cast<double>(s->step());
  const at::Tensor w = s->master().defined() ? s->master() : p.to(at::kFloat);
  const at::Tensor m_hat = o.bias_correction() ? s->exp_avg() / (1 - std::pow(b1, t)) : s->exp_avg();
  const at::Tensor v_hat = o.bias_correction() ? s->exp_avg_sq() / (1 - std::pow(b2, t)) : s->exp_avg_sq();
  at::Tensor u = m_hat / (v_hat.sqrt() + o.eps());
  if (o.adam_w_mode()) u = u + o.weight_decay() * w;
  return kernels::lamb_trust_ratio(l2(w), l2(u), true, o.min_trust(), o.max_trust(), o.trust_clip());
}

}  // namespace

std::vector<std::pair<std::string, double>> trust_ratios(const torch::optim::Optimizer& optimizer,
                                                        const torch::nn::Module& model) {
  at::NoGradGuard no_grad;
  std::map<const void*, std::string> names;
  for (const auto& item : model.named_parameters()) names[item.value().unsafeGetTensorImpl()] = item.key();
  const auto* lamb = dynamic_cast<const optim::LAMB*>(&optimizer);
  std::vector<std::pair<std::string, double>> out;
  for (const auto& group : optimizer.param_groups()) {
    const auto& options = group.options();
    const auto* lars = dynamic_cast<const optim::LARSOptions*>(&options);
    const auto* larc = dynamic_cast<const optim::LARCOptions*>(&options);
    const auto* lamb_options = dynamic_cast<const optim::LAMBOptions*>(&options);
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      std::optional<double> ratio;
      if (lars != nullptr && lars->adapt()) {
        ratio = kernels::lars_trust_ratio(l2(p), l2(p.grad()), true, lars->trust_coefficient(),
                                          lars->weight_decay(), lars->eps());
      } else if (larc != nullptr && larc->adapt()) {
        ratio = kernels::larc_scale(l2(p), l2(p.grad()), true, larc->clip(), larc->lr(),
                                    larc->trust_coefficient(), larc->weight_decay(), larc->eps());
      } else if (lamb != nullptr && lamb_options != nullptr) {
        ratio = lamb_ratio(*lamb, *lamb_options, p);
      }
      if (ratio) out.emplace_back(names.at(p.unsafeGetTensorImpl()), *ratio);
    }
  }
  return out;
}

std::vector<std::pair<std::string, double>> Trainer::trust_ratios() const {
  return experiments::trust_ratios(*optimizer_, *model_);
}

// --------------------------------------------------------------- checkpoints --
// Every value under its own name: scalars as 0-dim tensors, the evaluations as
// one column per EvalRow field ("rows/<field>"), the model, optimizer and
// sampler as nested archives. "format" changes when a key changes meaning.
// The archive is framed as one TFRecord (its length and CRC32C) after a
// header line, so that a cut or damaged file is refused before LibTorch's
// archive reader sees it (which can crash on damaged bytes: tests/fuzz).

namespace {

using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

constexpr std::int64_t kCheckpointFormat = 2;
constexpr std::string_view kCheckpointHeader = "bigbatch checkpoint\n";

template <typename T>
void put(OutputArchive& archive, const std::string& key, T value) {
  archive.write(key, at::scalar_tensor(value, std::is_integral_v<T> ? at::kLong : at::kDouble));
}

template <typename T>
void get(InputArchive& archive, const std::string& key, T& value) {
  at::Tensor t;
  archive.read(key, t);
  value = t.item<T>();
}

// The evaluations by column: integer fields as int64, the others as double.
struct Columns {
  std::map<std::string, std::vector<std::int64_t>> counts;
  std::map<std::string, std::vector<double>> reals;

  template <typename T>
  std::vector<T>& of(const char* name) {
    if constexpr (std::is_integral_v<T>) {
      return counts[name];
    } else {
      return reals[name];
    }
  }
};

void put_rows(OutputArchive& archive, const std::vector<EvalRow>& rows) {
  Columns columns;
  for_each_field(EvalRow{}, [&](const char* name, const auto& field) {
    columns.of<std::decay_t<decltype(field)>>(name);  // every column, also with no rows
  });
  for (const EvalRow& r : rows) {
    for_each_field(r, [&](const char* name, const auto& value) {
      columns.of<std::decay_t<decltype(value)>>(name).push_back(value);
    });
  }
  for (const auto& [name, values] : columns.counts) archive.write("rows/" + name, at::tensor(values, at::kLong));
  for (const auto& [name, values] : columns.reals) archive.write("rows/" + name, at::tensor(values, at::kDouble));
}

std::vector<EvalRow> get_rows(InputArchive& archive) {
  Columns columns;
  std::int64_t count = -1;
  for_each_field(EvalRow{}, [&](const char* name, const auto& field) {
    using T = std::decay_t<decltype(field)>;
    at::Tensor t;
    archive.read(std::string("rows/") + name, t);
    t = t.cpu().contiguous();
    TORCH_CHECK(count < 0 || t.numel() == count, "checkpoint: rows/", name, " has ", t.numel(),
                " values, rows/step has ", count);
    count = t.numel();
    columns.of<T>(name).assign(t.data_ptr<T>(), t.data_ptr<T>() + count);
  });
  std::vector<EvalRow> rows(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    for_each_field(rows[i], [&](const char* name, auto& value) {
      value = columns.of<std::decay_t<decltype(value)>>(name)[i];
    });
  }
  return rows;
}

}  // namespace

std::string Trainer::checkpoint() const {
  OutputArchive archive, model, optimizer, sampler;
  put(archive, "format", kCheckpointFormat);
  model_->save(model);
  optimizer_->save(optimizer);
  sampler_.save(sampler);
  archive.write("model", model);
  archive.write("optimizer", optimizer);
  archive.write("sampler", sampler);
  put(archive, "step", step_);
  put(archive, "examples", examples_);
  put(archive, "last_lr", last_lr_);
  put(archive, "best_metric", best_metric_);
  put(archive, "elapsed", elapsed_);
  const auto g = gns_.state();
  put(archive, "gns/grad_sq", g.grad_sq);
  put(archive, "gns/trace", g.trace);
  put(archive, "gns/correction", g.correction);
  put(archive, "gns/updates", g.updates);
  put_rows(archive, rows_);
  std::ostringstream out;
  archive.save_to(out);
  return std::string(kCheckpointHeader) + tensorboard::frame(out.str());
}

namespace {

// The archive inside checkpoint() bytes, checked (header, framing, format)
// before LibTorch reads it.
void open_checkpoint(const std::string& bytes, const at::Device& device, InputArchive& archive) {
  TORCH_CHECK(bytes.compare(0, kCheckpointHeader.size(), kCheckpointHeader) == 0,
              "checkpoint: not a bigbatch checkpoint of this version (no \"bigbatch checkpoint\" header)");
  const std::string_view body = std::string_view(bytes).substr(kCheckpointHeader.size());
  const tensorboard::Records records = tensorboard::read_records(body);
  TORCH_CHECK(records.payloads.size() == 1 && records.whole_bytes == body.size(),
              "checkpoint: cut short or damaged (its length or CRC32C does not match)");
  std::istringstream in(records.payloads.front());
  archive.load_from(in, device);
  at::Tensor format;
  TORCH_CHECK(archive.try_read("format", format) && format.item<std::int64_t>() == kCheckpointFormat,
              "checkpoint: not of format ", kCheckpointFormat, " (written by another version of bigbatch)");
}

}  // namespace

void Trainer::restore(const std::string& bytes) {
  InputArchive archive;
  open_checkpoint(bytes, device_, archive);
  load_run(archive);
  get(archive, "step", step_);
  get(archive, "last_lr", last_lr_);
  get(archive, "best_metric", best_metric_);
  get(archive, "elapsed", elapsed_);
  noise::GradientNoiseScale::State g;
  get(archive, "gns/grad_sq", g.grad_sq);
  get(archive, "gns/trace", g.trace);
  get(archive, "gns/correction", g.correction);
  get(archive, "gns/updates", g.updates);
  gns_.restore(g);
  rows_ = get_rows(archive);
  TORCH_CHECK(step_ <= budget_, "checkpoint: step ", step_, " is past this trial's budget of ", budget_, " steps");
}

void Trainer::branch_from(const std::string& bytes) {
  InputArchive archive;
  open_checkpoint(bytes, device_, archive);
  load_run(archive);
}

void Trainer::load_run(torch::serialize::InputArchive& archive) {
  InputArchive model, optimizer, sampler;
  archive.read("model", model);
  archive.read("optimizer", optimizer);
  archive.read("sampler", sampler);
  model_->load(model);
  optimizer_->load(optimizer);
  sampler_.load(sampler);
  get(archive, "examples", examples_);
}

double Trainer::b_simple() const { return gns_.updates() > 0 ? gns_.b_simple() : kNaN; }

}  // namespace bigbatch::experiments
