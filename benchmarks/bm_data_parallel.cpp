// Data parallelism on this machine: per step, the compute (forward+backward of
// an MLP on the per-rank batch), the bucketed gradient all-reduce, and the
// whole step in samples/s, in a world of 1 and of 2 processes (Gloo, 127.0.0.1);
// in world 2 also the step with 1 MB buckets, exchanged after backward and
// overlapped with it (distributed/compression.h, overlap).
// Run without arguments: it measures world 1 itself, then re-executes itself
// as 2 ranks; rank 0 prints. Iteration counts are fixed so ranks stay in step.
#include "../distributed/compression.h"
#include "../distributed/process_group.h"
#include "../experiments/cluster/launch.h"
#include "../optimizers/lamb.h"
#include "rank_bench.h"
#include "smoke.h"

#include <benchmark/benchmark.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

namespace {

namespace bd = bigbatch::distributed;
constexpr std::int64_t kGlobalBatch = 512;
std::unique_ptr<bd::ProcessGroup> group;

struct Setup {
  torch::nn::Sequential net{torch::nn::Linear(784, 512), torch::nn::ReLU(), torch::nn::Linear(512, 512),
                            torch::nn::ReLU(), torch::nn::Linear(512, 10)};
  std::unique_ptr<bigbatch::optim::LAMB> opt =
      std::make_unique<bigbatch::optim::LAMB>(net->parameters(), bigbatch::optim::LAMBOptions(1e-3));
  std::int64_t local = kGlobalBatch / (group ? group->size() : 1);
  at::Tensor x = at::randn({local, 784});
  at::Tensor y = at::randint(10, {local});
  void backward() {
    opt->zero_grad();
    torch::nn::functional::cross_entropy(net->forward(x), y).backward();
  }
  void reduce() {
    if (group) bd::allreduce_gradients(*group, net->parameters());
  }
};

void bm_compute(benchmark::State& state) {
  Setup s;
  for (auto _ : state) s.backward();
  state.SetItemsProcessed(state.iterations() * s.local);
}

void bm_allreduce(benchmark::State& state) {
  Setup s;
  s.backward();
  for (auto _ : state) s.reduce();
  state.counters["MB"] = 4.0 * static_cast<double>(784 * 512 + 512 * 512 + 5130 + 1024) / 1e6;
}

void bm_step(benchmark::State& state) {
  Setup s;
  for (auto _ : state) {
    s.backward();
    s.reduce();
    s.opt->step();
  }
  state.SetItemsProcessed(state.iterations() * kGlobalBatch);  // samples/s of the whole job
}

// The step with 1 MB buckets, their all-reduces after backward or during it.
void bm_step_buckets(benchmark::State& state, bool overlap) {
  Setup s;
  bd::CompressionSpec spec;
  spec.bucket_bytes = 1 << 20;
  spec.overlap = overlap;
  bd::GradientExchange exchange(spec);
  const auto params = s.net->parameters();
  for (auto _ : state) {
    s.opt->zero_grad();
    for (auto& p : params) {  // zeroed, not none: what begin() needs (LibTorch 2's zero_grad sets none)
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    }
    if (overlap) exchange.begin(*group, params);
    torch::nn::functional::cross_entropy(s.net->forward(s.x), s.y).backward();
    exchange.exchange(*group, params);
    s.opt->step();
  }
  state.counters["comm_wait_ms"] = 1e3 * exchange.totals().communicate_seconds / static_cast<double>(state.iterations());
  state.counters["overlapped"] = static_cast<double>(exchange.last_overlapped());
  state.counters["buckets"] = static_cast<double>(exchange.buckets());
  state.SetItemsProcessed(state.iterations() * kGlobalBatch);
}

}  // namespace

int main(int argc, char** argv) {
  const auto world = bd::world_from_env();
  const bool launched = bigbatch::experiments::launched_by_bigbatch();
  group = bigbatch::bench::join_world(world);
  const std::string suffix = "/world" + std::to_string(world.world_size);
  benchmark::RegisterBenchmark(("compute_per_rank" + suffix).c_str(), bm_compute)
      ->Iterations(bigbatch::bench::iterations(100))->Unit(benchmark::kMillisecond)->UseRealTime();
  if (group) {
    benchmark::RegisterBenchmark(("allreduce" + suffix).c_str(), bm_allreduce)
        ->Iterations(bigbatch::bench::iterations(100))->Unit(benchmark::kMillisecond)->UseRealTime();
  }
  benchmark::RegisterBenchmark(("step" + suffix).c_str(), bm_step)
      ->Iterations(bigbatch::bench::iterations(100))->Unit(benchmark::kMillisecond)->UseRealTime();
  if (group) {
    for (const bool overlap : {false, true}) {
      benchmark::RegisterBenchmark(("step_1MB_buckets" + std::string(overlap ? "_overlap" : "") + suffix).c_str(),
                                   [overlap](benchmark::State& st) { bm_step_buckets(st, overlap); })
          ->Iterations(bigbatch::bench::iterations(100))->Unit(benchmark::kMillisecond)->UseRealTime();
    }
  }
  if (world.rank != 0) std::freopen("/dev/null", "w", stdout);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (launched || world.world_size > 1) return 0;
  std::fflush(stdout);
  return bigbatch::bench::run_as_ranks(2, argc, argv);  // now the same as 2 ranks
}
