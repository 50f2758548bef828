// The training loop of one trial (trial.h), following docs/formulas.md "Steps to
// result": steps-to-target is the first evaluation step at which the
// validation metric reaches the target.
#include <bigbatch/experiments/trial.h>

#include <bigbatch/experiments/models.h>
#include <bigbatch/optimizers/lamb.h>
#include <bigbatch/optimizers/larc.h>
#include <bigbatch/optimizers/lars.h>
#include <bigbatch/optimizers/novograd.h>
#include <bigbatch/optimizers/param_groups.h>

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <limits>
#include <mutex>
#include <sstream>

namespace bigbatch::experiments {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Model initialization draws from LibTorch's global generator: one trial at a
// time seeds and builds, so parallel trials stay reproducible.
std::mutex& init_mutex() {
  static std::mutex m;
  return m;
}

template <typename Options>
std::unique_ptr<torch::optim::Optimizer> layerwise(torch::nn::Module& model, const Options& o) {
  using Opt = std::conditional_t<std::is_same_v<Options, optim::LARSOptions>, optim::LARS,
              std::conditional_t<std::is_same_v<Options, optim::LARCOptions>, optim::LARC,
              std::conditional_t<std::is_same_v<Options, optim::LAMBOptions>, optim::LAMB, optim::NovoGrad>>>;
  return std::make_unique<Opt>(optim::layerwise_param_groups(model, o), o);
}

}  // namespace

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerSpec& s, double lr,
                                                        torch::nn::Module& model) {
  const auto betas = [&](std::tuple<double, double> fallback) {
    return s.betas ? std::make_tuple((*s.betas)[0], (*s.betas)[1]) : fallback;
  };
  if (s.name == "sgd") {
    auto o = torch::optim::SGDOptions(lr).momentum(s.momentum).nesterov(s.nesterov);
    if (s.weight_decay) o.weight_decay(*s.weight_decay);
    return std::make_unique<torch::optim::SGD>(model.parameters(), o);
  }
  if (s.name == "adam" || s.name == "adamw") {
    if (s.name == "adam") {
      auto o = torch::optim::AdamOptions(lr).betas(betas({0.9, 0.999}));
      if (s.eps) o.eps(*s.eps);
      if (s.weight_decay) o.weight_decay(*s.weight_decay);
      return std::make_unique<torch::optim::Adam>(model.parameters(), o);
    }
    auto o = torch::optim::AdamWOptions(lr).betas(betas({0.9, 0.999}));
    if (s.eps) o.eps(*s.eps);
    if (s.weight_decay) o.weight_decay(*s.weight_decay);
    return std::make_unique<torch::optim::AdamW>(model.parameters(), o);
  }
  if (s.name == "lars" || s.name == "larc") {
    auto apply = [&](auto o) {
      o.momentum(s.momentum).nesterov(s.nesterov);
      if (s.weight_decay) o.weight_decay(*s.weight_decay);
      if (s.trust_coefficient) o.trust_coefficient(*s.trust_coefficient);
      if (s.eps) o.eps(*s.eps);
      return layerwise(model, o);
    };
    return s.name == "lars" ? apply(optim::LARSOptions(lr)) : apply(optim::LARCOptions(lr));
  }
  if (s.name == "lamb") {
    auto o = optim::LAMBOptions(lr).betas(betas({0.9, 0.999}));
    if (s.eps) o.eps(*s.eps);
    if (s.weight_decay) o.weight_decay(*s.weight_decay);
    if (s.max_grad_norm) o.max_grad_norm(*s.max_grad_norm);
    return layerwise(model, o);
  }
  TORCH_CHECK(s.name == "novograd", "optimizer.name: unknown optimizer \"", s.name, "\"");
  auto o = optim::NovoGradOptions(lr).betas(betas({0.95, 0.98}));
  if (s.eps) o.eps(*s.eps);
  if (s.weight_decay) o.weight_decay(*s.weight_decay);
  return layerwise(model, o);
}

namespace {

// "cpu", or "cuda": device LOCAL_RANK (modulo the devices) under a process group.
at::Device trial_device(const std::string& name, const distributed::ProcessGroup* group) {
  if (name == "cpu") return at::Device(at::kCPU);
  TORCH_CHECK(name == "cuda", "device must be \"cpu\" or \"cuda\", got \"", name, "\"");
  const auto devices = static_cast<int>(torch::cuda::device_count());
  TORCH_CHECK(devices > 0, "device \"cuda\": no CUDA device is visible (or this LibTorch has no CUDA)");
  const int local = group != nullptr ? group->local_rank() : 0;
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(local % devices));
}

}  // namespace

Trainer::Trainer(const TrialConfig& config, const Dataset& data, distributed::ProcessGroup* group)
    : config_(config),
      data_(data),
      group_(group),
      device_(trial_device(config.device, group)),
      sampler_(data.train_size(), config.seed * 7919 + 1),
      gns_(config.gns.beta),
      best_metric_(std::numeric_limits<double>::infinity()) {
  {
    std::lock_guard<std::mutex> lock(init_mutex());
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
  if (config.noise.type == "annealed") {
    annealed_.emplace(noise::AnnealedNoiseOptions(config.noise.eta).gamma(config.noise.gamma).seed(config.seed));
  } else if (config.noise.type == "multiplicative") {
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
  const std::int64_t batch = adapter_->schedule().batch_size(step_);
  adapter_->apply(step_);
  last_lr_ = optimizer_->param_groups().front().options().get_lr();
  // Every rank draws the same global batch (same seed) and takes its share.
  at::Tensor index = sampler_.next(batch);
  at::Tensor weights = multiplicative_ ? multiplicative_->weights(batch, step_) : at::Tensor();
  std::int64_t local = batch;
  if (group_) {
    const std::int64_t world = group_->size();
    TORCH_CHECK(batch % world == 0, "batch size ", batch, " is not divisible by the world size ", world);
    local = batch / world;
    index = index.slice(0, group_->rank() * local, (group_->rank() + 1) * local);
    if (weights.defined()) weights = weights.slice(0, group_->rank() * local, (group_->rank() + 1) * local);
  }
  const at::Tensor x = data_.x_train.index_select(0, index).to(device_);
  const at::Tensor y = data_.y_train.index_select(0, index).to(device_);
  if (weights.defined()) weights = weights.to(device_);
  optimizer_->zero_grad();
  double loss = 0;
  if (group_) {
    const at::Tensor l = batch_loss(x, y, weights);
    l.backward();
    const auto norms = distributed::allreduce_gradients(*group_, params_);
    std::vector<at::Tensor> mean{l.detach().reshape({1}).to(at::kDouble)};
    group_->allreduce_sum(mean);
    loss = mean[0].item<double>() / static_cast<double>(group_->size());
    if (std::isfinite(norms.local_sq) && std::isfinite(norms.global_sq)) {
      gns_.update(norms.local_sq, local, norms.global_sq, batch);
    }
  } else if (config_.gns.micro_batches >= 2) {
    const auto m = noise::micro_batch_step(params_, batch, config_.gns.micro_batches,
                                           [&](std::int64_t begin, std::int64_t end) {
                                             return batch_loss(x.slice(0, begin, end), y.slice(0, begin, end),
                                                               weights.defined() ? weights.slice(0, begin, end)
                                                                                 : at::Tensor());
                                           });
    loss = m.loss;
    if (std::isfinite(m.small_sq_norm) && std::isfinite(m.big_sq_norm)) {
      gns_.update(m.small_sq_norm, m.small_batch, m.big_sq_norm, m.big_batch);
    }
  } else {
    const at::Tensor l = batch_loss(x, y, weights);
    l.backward();
    loss = l.item<double>();
  }
  if (annealed_) annealed_->apply(params_, step_);  // the same noise on every rank
  optimizer_->step();
  ++step_;
  examples_ += batch;
  return loss;
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
                         const std::function<void(const std::string&)>& on_checkpoint) {
  const auto start = std::chrono::steady_clock::now();
  const double before = elapsed_;
  const auto seconds = [&] {
    return before + std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  TrialResult r;
  r.budget = budget_;
  r.peak_lr = adapter_->schedule().peak_lr();
  r.status = "not_reached";
  const bool use_error = config_.target.metric == "val_error";
  double loss_sum = 0;
  std::int64_t loss_count = 0;
  double last_report = 0;
  while (step_ < budget_) {
    const double loss = train_step();
    if (!std::isfinite(loss)) {
      r.status = "diverged";
      break;
    }
    loss_sum += loss;
    ++loss_count;
    if (progress && (seconds() - last_report > 0.5 || step_ == budget_)) {
      last_report = seconds();
      progress({step_, budget_, loss, static_cast<double>(step_) / std::max(1e-9, last_report)});
    }
    if (step_ % config_.target.eval_every != 0 && step_ != budget_) continue;
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
    row.gns = gns_.updates() > 0 ? gns_.b_simple() : kNaN;
    rows_.push_back(row);
    loss_sum = 0;
    loss_count = 0;
    const double metric = use_error ? val_error : val_loss;
    if (!std::isfinite(val_loss)) {
      r.status = "diverged";
      break;
    }
    best_metric_ = std::min(best_metric_, metric);
    if (metric <= config_.target.threshold) {
      r.status = "reached";
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

// --------------------------------------------------------------- checkpoints --

namespace {

constexpr int kRowFields = 10;

at::Tensor rows_tensor(const std::vector<EvalRow>& rows) {
  std::vector<double> flat;
  for (const EvalRow& r : rows) {
    flat.insert(flat.end(), {static_cast<double>(r.step), r.epoch, static_cast<double>(r.examples), r.train_loss,
                             r.val_loss, r.val_error, r.lr, static_cast<double>(r.batch_size), r.wall_time, r.gns});
  }
  return at::tensor(flat, at::kDouble).view({static_cast<std::int64_t>(rows.size()), kRowFields});
}

std::vector<EvalRow> rows_of(const at::Tensor& t) {
  TORCH_CHECK(t.dim() == 2 && t.size(1) == kRowFields, "checkpoint: evaluations of shape ", t.sizes());
  const at::Tensor c = t.to(at::kDouble).contiguous();
  const double* v = c.data_ptr<double>();
  std::vector<EvalRow> rows(static_cast<std::size_t>(c.size(0)));
  for (auto& r : rows) {
    r.step = static_cast<std::int64_t>(v[0]);
    r.epoch = v[1];
    r.examples = static_cast<std::int64_t>(v[2]);
    r.train_loss = v[3];
    r.val_loss = v[4];
    r.val_error = v[5];
    r.lr = v[6];
    r.batch_size = static_cast<std::int64_t>(v[7]);
    r.wall_time = v[8];
    r.gns = v[9];
    v += kRowFields;
  }
  return rows;
}

}  // namespace

std::string Trainer::checkpoint() const {
  torch::serialize::OutputArchive archive;
  torch::serialize::OutputArchive model;
  torch::serialize::OutputArchive optimizer;
  model_->save(model);
  optimizer_->save(optimizer);
  archive.write("model", model);
  archive.write("optimizer", optimizer);
  const auto sampler = sampler_.state();
  for (std::size_t k = 0; k < sampler.size(); ++k) archive.write("sampler/" + std::to_string(k), sampler[k]);
  const auto g = gns_.state();
  archive.write("gns", at::tensor(std::vector<double>{g.grad_sq, g.trace, g.correction}, at::kDouble));
  archive.write("counters", at::tensor(std::vector<std::int64_t>{step_, examples_, g.updates}, at::kLong));
  archive.write("scalars", at::tensor(std::vector<double>{last_lr_, best_metric_, elapsed_}, at::kDouble));
  archive.write("rows", rows_tensor(rows_));
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void Trainer::restore(const std::string& bytes) {
  torch::serialize::InputArchive archive;
  std::istringstream in(bytes);
  archive.load_from(in, device_);
  torch::serialize::InputArchive model;
  torch::serialize::InputArchive optimizer;
  archive.read("model", model);
  archive.read("optimizer", optimizer);
  model_->load(model);
  optimizer_->load(optimizer);
  std::vector<at::Tensor> sampler(3);
  for (std::size_t k = 0; k < sampler.size(); ++k) archive.read("sampler/" + std::to_string(k), sampler[k]);
  for (auto& t : sampler) t = t.cpu();
  sampler_.restore(sampler);
  at::Tensor gns, counters, scalars, rows;
  archive.read("gns", gns);
  archive.read("counters", counters);
  archive.read("scalars", scalars);
  archive.read("rows", rows);
  gns = gns.cpu();
  counters = counters.cpu();
  scalars = scalars.cpu();
  step_ = counters[0].item<std::int64_t>();
  examples_ = counters[1].item<std::int64_t>();
  gns_.restore({gns[0].item<double>(), gns[1].item<double>(), gns[2].item<double>(), counters[2].item<std::int64_t>()});
  last_lr_ = scalars[0].item<double>();
  best_metric_ = scalars[1].item<double>();
  elapsed_ = scalars[2].item<double>();
  rows_ = rows_of(rows.cpu());
  TORCH_CHECK(step_ <= budget_, "checkpoint: step ", step_, " is past this trial's budget of ", budget_, " steps");
}

}  // namespace bigbatch::experiments
