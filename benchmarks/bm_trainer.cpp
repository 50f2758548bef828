// The trainer's overhead: one training step of the same MLP, batch and
// optimizer through experiments::Trainer and through a bare LibTorch loop.
#include <bigbatch/experiments/trial.h>
#include <bigbatch/optimizers/lamb.h>
#include <bigbatch/optimizers/param_groups.h>

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

}  // namespace

BENCHMARK(bm_bare_loop)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(bm_trainer)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_MAIN();
