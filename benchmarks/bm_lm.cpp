// The language-model workload's cost: a bigbatch trial's training step
// (Trainer: sampler, windows, the runner's loss, LAMB over its two groups)
// against a bare LibTorch loop over the same model, batch and optimizer
// (windows gathered by tensor indexing, cross_entropy, step), at two model
// sizes; and the sampler's windows alone. Tokens are random over a
// 73-character vocabulary (the quickstart's), so that nothing is read from
// disk. docs/benchmarks.md has a run's numbers.
#include "../experiments/runconfig/config.h"
#include "../experiments/workload/gpt.h"
#include "../experiments/optim/optimizer.h"
#include "../experiments/workload/text.h"
#include "../experiments/train/trial.h"

#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <torch/nn/functional/loss.h>

#include <vector>

namespace {

namespace bx = bigbatch::experiments;

constexpr std::int64_t kVocabulary = 73, kContext = 64, kBatch = 64, kSteps = 6;

// 2M tokens: the quickstart's windows over random characters.
const bx::WorkloadData& data() {
  static const bx::WorkloadData d = [] {
    at::manual_seed(1);
    const at::Tensor tokens = at::randint(0, kVocabulary, {2'000'000}, at::kInt);
    std::vector<std::int64_t> starts;
    for (std::int64_t s = 0; s + 2 * kContext + 1 <= tokens.numel(); s += kContext) starts.push_back(s);
    bx::WorkloadData out;
    out.classes = kVocabulary;
    out.train = bx::token_windows(tokens, starts, kContext, kContext);
    out.validation = bx::token_windows(tokens, {0, kContext}, kContext, 0);
    return out;
  }();
  return d;
}

// Size 0: the quickstart's model (2 layers, width 64, 4 heads); 1: 4 layers,
// width 256, 8 heads (3.2M parameters).
nlohmann::json gpt_params(std::int64_t size) {
  return size == 0 ? nlohmann::json{{"layers", 2}, {"width", 64}, {"heads", 4}}
                   : nlohmann::json{{"layers", 4}, {"width", 256}, {"heads", 8}};
}

bx::OptimizerSpec lamb() { return bx::resolve_optimizer("lamb", {{"weight_decay", 0.01}}); }

void BM_LmTrialStep(benchmark::State& state) {
  bx::TrialConfig t;
  t.sweep = "bm";
  t.name = "lm";
  t.data = {"text", nlohmann::json::object()};  // (not loaded: `data()` is given)
  t.model = {"gpt", gpt_params(state.range(0))};
  t.optimizer = lamb();
  t.batch_size = kBatch;
  t.schedule.base_lr = 0.01;
  t.schedule.base_batch = kBatch;
  t.budget = {1e9, bigbatch::schedules::Unit::kSteps};
  t.target = {bx::Metric::kValLoss, -1, 1000000};
  at::set_num_threads(2);
  bx::Trainer trainer(t, data());
  trainer.train_step();  // (warm)
  for (auto _ : state) {
    for (std::int64_t s = 0; s < kSteps; ++s) trainer.train_step();
  }
  state.SetItemsProcessed(state.iterations() * kSteps * kBatch * kContext);
  state.SetLabel("tokens");
}

// The loop a LibTorch user writes: random window starts, the windows by
// indexing, forward, cross_entropy, backward, step.
void BM_LmBareLoop(benchmark::State& state) {
  const bx::ModelRegistration r = bx::gpt_model();
  bx::ModelInput input;
  input.example_shape = {kContext};
  input.outputs = kVocabulary;
  at::manual_seed(0);
  const bx::Model model = r.build(r.resolve(gpt_params(state.range(0))), input);
  const auto optimizer = bx::make_optimizer(lamb(), 0.01, model.module());
  at::manual_seed(1);
  const at::Tensor tokens = at::randint(0, kVocabulary, {2'000'000}, at::kLong);
  const at::Tensor offsets = at::arange(kContext, at::kLong);
  at::set_num_threads(2);
  namespace F = torch::nn::functional;
  const auto step = [&] {
    const at::Tensor starts = at::randint(0, tokens.numel() - kContext - 1, {kBatch, 1}, at::kLong);
    const at::Tensor where = starts + offsets;
    const at::Tensor x = tokens.index_select(0, where.view(-1)).view({kBatch, kContext});
    const at::Tensor y = tokens.index_select(0, (where + 1).view(-1)).view({kBatch, kContext});
    optimizer->zero_grad();
    const at::Tensor logits = model.forward(x);
    F::cross_entropy(logits.view({-1, kVocabulary}), y.view(-1)).backward();
    optimizer->step();
  };
  step();
  for (auto _ : state) {
    for (std::int64_t s = 0; s < kSteps; ++s) step();
  }
  state.SetItemsProcessed(state.iterations() * kSteps * kBatch * kContext);
  state.SetLabel("tokens");
}

BENCHMARK(BM_LmTrialStep)->ArgName("size")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_LmBareLoop)->ArgName("size")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// The sampler's side alone: a batch of windows at seeded offsets, on one thread.
void BM_LmWindows(benchmark::State& state) {
  const bx::WorkloadData& d = data();
  const at::Tensor index = at::randint(0, d.train->size(), {kBatch}, at::kLong);
  std::int64_t epoch = 0;
  for (auto _ : state) benchmark::DoNotOptimize(d.train->augmented(index, {7, epoch++}).input);
  state.SetItemsProcessed(state.iterations() * kBatch * kContext);
  state.SetLabel("tokens");
}
BENCHMARK(BM_LmWindows)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
