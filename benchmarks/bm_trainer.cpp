// The trainer's overhead: one training step of the same MLP, batch and
// optimizer through experiments::Trainer and through a bare LibTorch loop.
// Batched trials: a step of 5 LAMB trials (rates 1e-3 to 5e-3) as one
// stacked group against a step of each of 5 separate trainers, at batch
// sizes 16, 256 and 4096; and one evaluation (1024 examples) of each.
#include "../experiments/batched.h"
#include "../experiments/trial.h"
#include "../optimizers/lamb.h"
#include "../optimizers/param_groups.h"

#include <ATen/CPUGeneratorImpl.h>
#include <benchmark/benchmark.h>
#include <torch/nn/functional/loss.h>

namespace {

namespace bx = bigbatch::experiments;

constexpr std::int64_t kBatch = 256;

bx::Dataset data() {
  auto gen = at::detail::createCPUGenerator(0);
  bx::Dataset d;
  d.classes = 10;
  d.x_train = at::randn({16384, 1, 28, 28}, gen, at::kFloat);
  d.y_train = at::randint(10, {16384}, gen, at::kLong);
  d.x_val = d.x_train.slice(0, 0, 1024);
  d.y_val = d.y_train.slice(0, 0, 1024);
  return d;
}

bx::TrialConfig config() {
  bx::TrialConfig c;
  c.sweep = "bench";
  c.name = "trial";
  c.model.type = bx::ModelType::kMlp;
  c.model.widths = {256, 256};
  c.optimizer.name = bx::OptimizerName::kLamb;
  c.schedule.base_lr = 1e-3;
  c.target.threshold = 0.01;
  c.budget = {1e9, bigbatch::schedules::Unit::kSteps};
  c.batch_size = kBatch;
  return c;
}

void bm_trainer(benchmark::State& state) {
  const bx::Dataset d = data();
  bx::Trainer trainer(config(), d);
  for (auto _ : state) benchmark::DoNotOptimize(trainer.train_step());
  state.SetItemsProcessed(state.iterations() * kBatch);
}

void bm_bare_loop(benchmark::State& state) {
  const bx::Dataset d = data();
  at::manual_seed(0);
  auto model = bx::make_model(config().model, d.example_shape(), 10);
  const auto o = bigbatch::optim::LAMBOptions(1e-3);
  bigbatch::optim::LAMB opt(bigbatch::optim::layerwise_param_groups(*model, o), o);
  auto gen = at::detail::createCPUGenerator(1);
  std::int64_t pos = d.train_size();
  at::Tensor order;
  for (auto _ : state) {
    if (pos + kBatch > d.train_size()) {
      order = at::randperm(d.train_size(), gen, at::kLong);
      pos = 0;
    }
    const at::Tensor idx = order.slice(0, pos, pos + kBatch);
    pos += kBatch;
    opt.zero_grad();
    const at::Tensor loss = torch::nn::functional::cross_entropy(model->forward(d.x_train.index_select(0, idx)),
                                                                 d.y_train.index_select(0, idx));
    loss.backward();
    opt.step();
    benchmark::DoNotOptimize(loss.item<double>());
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}

constexpr int kLanes = 5;

std::vector<bx::TrialConfig> five(std::int64_t batch) {
  std::vector<bx::TrialConfig> out;
  for (int k = 0; k < kLanes; ++k) {
    bx::TrialConfig c = config();
    c.batch_size = batch;
    c.schedule.base_lr = 1e-3 * (k + 1);
    c.name = "trial" + std::to_string(k);
    out.push_back(c);
  }
  return out;
}

void bm_five_separate(benchmark::State& state) {
  const bx::Dataset d = data();
  std::vector<std::unique_ptr<bx::Trainer>> trainers;
  for (const auto& c : five(state.range(0))) trainers.push_back(std::make_unique<bx::Trainer>(c, d));
  for (auto _ : state) {
    for (auto& t : trainers) benchmark::DoNotOptimize(t->train_step());
  }
  state.SetItemsProcessed(state.iterations() * kLanes * state.range(0));
}

void bm_five_batched(benchmark::State& state) {
  const bx::Dataset d = data();
  bx::Trainer group(five(state.range(0)), d);
  for (auto _ : state) group.train_step();
  state.SetItemsProcessed(state.iterations() * kLanes * state.range(0));
}

void bm_five_separate_eval(benchmark::State& state) {
  const bx::Dataset d = data();
  std::vector<std::unique_ptr<bx::Trainer>> trainers;
  for (const auto& c : five(256)) trainers.push_back(std::make_unique<bx::Trainer>(c, d));
  for (auto _ : state) {
    for (auto& t : trainers) benchmark::DoNotOptimize(t->evaluate());
  }
}

void bm_five_batched_eval(benchmark::State& state) {
  const bx::Dataset d = data();
  bx::Trainer group(five(256), d);
  for (auto _ : state) benchmark::DoNotOptimize(group.evaluate());
}

}  // namespace

BENCHMARK(bm_five_separate)->Arg(16)->Arg(256)->Arg(4096)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(bm_five_batched)->Arg(16)->Arg(256)->Arg(4096)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(bm_five_separate_eval)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(bm_five_batched_eval)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(bm_bare_loop)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(bm_trainer)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_MAIN();
