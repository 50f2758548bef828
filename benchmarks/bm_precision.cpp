// A trial's training step in fp32 against bf16 (config "precision"; the
// forward and backward autocast, fp32 weights and optimizer), for three
// workloads: the quickstart's MLP (784-256-256-10, batch 256, LAMB), a
// ResNet-8 (width 16, BatchNorm, 3x32x32 images, batch 128, SGD) and the
// language-model quickstart's GPT (2 layers, width 64, 4 heads, 64-character
// windows, batch 64, LAMB); one intra-op thread, as the runner's trials.
// Each step reports the rate of its matrix products and convolutions
// (gemm_gflops: their FLOPs, counted from the shapes below, over the step's
// time) beside this machine's fp32 one-thread matrix-product peak
// (sgemm_peak_gflops: the best of at::mm at 256 to 2048): their ratio is the
// share of the peak a step reaches. Run with
// --benchmark_min_time=1 --benchmark_repetitions=3 for the docs' numbers.
// docs/benchmarks.md "Mixed precision" has a run's numbers.
#include "../experiments/runconfig/config.h"
#include "../experiments/workload/text.h"
#include "../experiments/train/trial.h"
#include "../experiments/workload/workload.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/randn.h>
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <vector>

namespace {

namespace bx = bigbatch::experiments;

// The best rate of one thread's fp32 at::mm over square sizes 256 to 2048.
double sgemm_peak_gflops() {
  static const double peak = [] {
    at::set_num_threads(1);
    double best = 0;
    for (const std::int64_t n : {256, 512, 1024, 2048}) {
      const at::Tensor a = at::randn({n, n}), b = at::randn({n, n});
      at::Tensor c = at::mm(a, b);
      for (int r = 0; r < 3; ++r) {
        const auto start = std::chrono::steady_clock::now();
        c = at::mm(a, b);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        best = std::max(best, 2.0 * static_cast<double>(n * n * n) / s / 1e9);
      }
    }
    return best;
  }();
  return peak;
}

void BM_SgemmPeak(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(sgemm_peak_gflops());
  state.counters["sgemm_peak_gflops"] = sgemm_peak_gflops();
}

enum Workload : std::int64_t { kMlp = 0, kResnet8 = 1, kGpt = 2 };

bx::WorkloadData images(std::int64_t channels, std::int64_t side) {
  auto gen = at::detail::createCPUGenerator(0);
  bx::WorkloadData d;
  d.classes = 10;
  const at::Tensor x = at::randn({4096, channels, side, side}, gen, at::kFloat);
  const at::Tensor y = at::randint(10, {4096}, gen, at::kLong);
  d.train = bx::tensor_examples(x, y);
  d.validation = bx::tensor_examples(x.slice(0, 0, 512), y.slice(0, 0, 512));
  return d;
}

constexpr std::int64_t kVocabulary = 73, kContext = 64;

bx::WorkloadData characters() {
  at::manual_seed(1);
  const at::Tensor tokens = at::randint(0, kVocabulary, {500'000}, at::kInt);
  std::vector<std::int64_t> starts;
  for (std::int64_t s = 0; s + 2 * kContext + 1 <= tokens.numel(); s += kContext) starts.push_back(s);
  bx::WorkloadData d;
  d.classes = kVocabulary;
  d.train = bx::token_windows(tokens, starts, kContext, kContext);
  d.validation = bx::token_windows(tokens, {0, kContext}, kContext, 0);
  return d;
}

struct Setup {
  bx::TrialConfig trial;
  bx::WorkloadData data;
  double flops = 0;  // matrix products and convolutions of one step, forward and backward
};

// Forward 2 m k n for each product; backward twice that (the gradients of
// the weights and of the inputs), but for the first layer, whose input
// needs no gradient.
double product_flops(double m, double k, double n, bool first) { return 2 * m * k * n * (first ? 2 : 3); }

Setup setup(std::int64_t workload) {
  Setup s;
  bx::TrialConfig& t = s.trial;
  t.sweep = "bm";
  t.name = "precision";
  t.budget = {1e9, bigbatch::schedules::Unit::kSteps};
  t.target.threshold = -1;
  t.target.eval_every = 1000000;
  t.optimizer = bx::resolve_optimizer("lamb");
  t.schedule.base_lr = 1e-3;
  if (workload == kMlp) {
    bx::ModelSpec mlp;
    mlp.widths = {256, 256};
    t.model = bx::model_part(mlp);
    t.batch_size = 256;
    s.data = images(1, 28);
    const double b = 256;
    s.flops = product_flops(b, 784, 256, true) + product_flops(b, 256, 256, false) + product_flops(b, 256, 10, false);
  } else if (workload == kResnet8) {
    bx::ModelSpec res;
    res.type = bx::ModelType::kResnet;
    res.norm = bx::Norm::kBatch;
    res.width = 16;
    res.depth = 8;
    t.model = bx::model_part(res);
    t.optimizer = bx::resolve_optimizer("sgd");
    t.batch_size = 128;
    s.data = images(3, 32);
    // A 3x3 convolution from c to o channels on an h x h output is a product
    // of (b h^2) x (9 c) by (9 c) x o: the stem (3 -> 16 at 32), a block at
    // 32 (16 -> 16, twice), at 16 (16 -> 32, 32 -> 32, the 1x1 shortcut
    // 16 -> 32) and at 8 (32 -> 64, 64 -> 64, 1x1 32 -> 64), and the head.
    const double b = 128;
    const auto conv = [&](double k2c, double o, double side, bool first) {
      return product_flops(b * side * side, k2c, o, first);
    };
    s.flops = conv(9 * 3, 16, 32, true) + 2 * conv(9 * 16, 16, 32, false) + conv(9 * 16, 32, 16, false) +
              conv(9 * 32, 32, 16, false) + conv(16, 32, 16, false) + conv(9 * 32, 64, 8, false) +
              conv(9 * 64, 64, 8, false) + conv(32, 64, 8, false) + product_flops(b, 64, 10, false);
  } else {
    t.data = {"text", nlohmann::json::object()};  // (not loaded: the data is given)
    t.model = {"gpt", {{"layers", 2}, {"width", 64}, {"heads", 4}}};
    t.target.metric = bx::Metric::kValLoss;
    t.optimizer = bx::resolve_optimizer("lamb", {{"weight_decay", 0.01}});
    t.batch_size = 64;
    s.data = characters();
    // Per layer: the q, k, v and output projections (4 d^2 a token), the
    // MLP (8 d^2), attention's scores and weighted sum (2 T d each, the
    // whole square as the kernels compute it); then the head (d V a token).
    const double tokens = 64.0 * kContext, d = 64, T = kContext, V = kVocabulary;
    const double per_layer = product_flops(tokens, d, 12 * d, false) + 2 * product_flops(tokens, T, d, false);
    s.flops = 2 * per_layer + product_flops(tokens, d, V, false);
  }
  return s;
}

// Arguments: the workload, and 0 for fp32 or 1 for bf16.
void BM_TrialStep(benchmark::State& state) {
  at::set_num_threads(1);
  const double peak = sgemm_peak_gflops();
  Setup s = setup(state.range(0));
  s.trial.precision = state.range(1) == 0 ? bx::Precision::kFp32 : bx::Precision::kBf16;
  bx::Trainer trainer(s.trial, s.data);
  for (int warm = 0; warm < 3; ++warm) trainer.train_step();
  for (auto _ : state) benchmark::DoNotOptimize(trainer.train_step());
  state.counters["gemm_gflops"] = benchmark::Counter(s.flops, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["step_gflop"] = s.flops / 1e9;
  state.counters["sgemm_peak_gflops"] = peak;
  const char* names[] = {"mlp", "resnet8", "gpt"};
  state.SetLabel(std::string(names[state.range(0)]) + (state.range(1) == 0 ? " fp32" : " bf16"));
}

}  // namespace

BENCHMARK(BM_SgemmPeak)->Iterations(1);
BENCHMARK(BM_TrialStep)
    ->ArgsProduct({{kMlp, kResnet8, kGpt}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK_MAIN();
