// Optimizer state sharded across data-parallel ranks (distributed/sharded.h)
// on this machine: per world size (1, 2, 4 processes over Gloo on
// 127.0.0.1), the step (backward, gradient exchange, LAMB or Muon step)
// unsharded and at stages "states" and "gradients", with counters:
//   state_bytes          this rank's optimizer state, measured (state_bytes())
//   state_formula        8 bytes (LAMB's two fp32 moments; Muon's AdamW
//                        biases) or 4 (Muon's momentum of its matrices) x
//                        this rank's elements
//   state_bytes_max      the largest rank's state: Muon gives each matrix
//                        whole to one rank, so its shares are uneven
//   exchange_formula     bytes a rank sends per step by the ring formulas
//                        (docs/distributed.md): 2(N-1)/N x 4P for the
//                        all-reduce, (N-1)/N x 4P for a reduce-scatter or the
//                        fp32 parameters' all-gather
//   loopback_per_rank    bytes the loopback interface carried per step and
//                        rank (/proc/net/dev, "lo" transmit): what the ranks
//                        really sent, TCP/IP framing included, when nothing
//                        else uses 127.0.0.1 meanwhile
// Run without arguments: it measures world 1 itself, then re-executes itself
// as 2 and as 4 ranks; rank 0 prints. Iteration counts are fixed so that the
// ranks stay in step (30; 2 in ctest's smoke run, benchmarks/smoke.h).
#include "../distributed/process_group.h"
#include "../distributed/sharded.h"
#include "../experiments/cluster/launch.h"
#include "../optimizers/lamb.h"
#include "../optimizers/muon.h"
#include "rank_bench.h"
#include "smoke.h"

#include <benchmark/benchmark.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace bd = bigbatch::distributed;
namespace bo = bigbatch::optim;
constexpr std::int64_t kGlobalBatch = 256;
std::unique_ptr<bd::ProcessGroup> group;

// Bytes the loopback interface has transmitted since boot.
double loopback_tx_bytes() {
  std::ifstream in("/proc/net/dev");
  std::string line;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    if (name != "lo") continue;
    std::istringstream fields(line.substr(colon + 1));
    double v[9] = {};
    for (double& x : v) fields >> x;
    return v[8];  // receive: bytes packets errs drop fifo frame compressed multicast; then transmit bytes
  }
  return 0;
}

// An MLP of 1.86M parameters (784-1024-1024-10): 113 chunks of the fused engine.
struct Setup {
  torch::nn::Sequential net{torch::nn::Linear(784, 1024), torch::nn::ReLU(), torch::nn::Linear(1024, 1024),
                            torch::nn::ReLU(), torch::nn::Linear(1024, 10)};
  std::int64_t local = kGlobalBatch / (group ? group->size() : 1);
  at::Tensor x = at::randn({local, 784});
  at::Tensor y = at::randint(10, {local});
  void backward(torch::optim::Optimizer& opt) {
    opt.zero_grad();
    torch::nn::functional::cross_entropy(net->forward(x), y).backward();
  }
  std::int64_t parameters() {
    std::int64_t n = 0;
    for (const auto& p : net->parameters()) n += p.numel();
    return n;
  }
};

// LAMB over every parameter, or Muon: the weights orthogonalized, the biases by AdamW.
std::unique_ptr<bo::LayerwiseOptimizerBase> make_optimizer(const std::string& kind, torch::nn::Sequential& net) {
  if (kind == "lamb") return std::make_unique<bo::LAMB>(net->parameters(), bo::LAMBOptions(1e-3).weight_decay(0.01));
  std::vector<at::Tensor> weights, biases;
  for (const auto& p : net->named_parameters()) (p.key().find("bias") != std::string::npos ? biases : weights).push_back(p.value());
  const auto options = bo::MuonOptions(0.02).weight_decay(0.01);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(weights);
  groups.emplace_back(biases, std::make_unique<bo::MuonOptions>(bo::MuonOptions(options).orthogonalize(false).weight_decay(0)));
  return std::make_unique<bo::Muon>(groups, options);
}

void bm_step(benchmark::State& state, const std::string& kind, bd::ShardStage stage) {
  Setup s;
  const std::unique_ptr<bo::LayerwiseOptimizerBase> plain = make_optimizer(kind, s.net);
  std::unique_ptr<bd::ShardedOptimizer> sharded;
  if (stage != bd::ShardStage::kNone) sharded = std::make_unique<bd::ShardedOptimizer>(*group, *plain, stage);
  torch::optim::Optimizer& opt = sharded ? static_cast<torch::optim::Optimizer&>(*sharded) : *plain;
  const int n = group ? group->size() : 1;
  const double lo_before = loopback_tx_bytes();
  for (auto _ : state) {
    s.backward(opt);
    if (sharded) {
      sharded->reduce_gradients();
    } else if (group) {
      bd::allreduce_gradients(*group, s.net->parameters());
    }
    opt.step();
  }
  const double steps = static_cast<double>(state.iterations());
  const double p = static_cast<double>(s.parameters());
  const double state_bytes = static_cast<double>(sharded ? sharded->state_bytes() : plain->state_bytes());
  state.counters["state_bytes"] = state_bytes;
  // Per element: LAMB 8 bytes; Muon 4 for a matrix (dim 2), 8 for a bias (AdamW).
  double formula = 0;
  const std::vector<at::Tensor> params = sharded ? sharded->params() : s.net->parameters();  // the plan's order
  for (std::size_t t = 0; t < params.size(); ++t) {
    const double elements = static_cast<double>(sharded ? sharded->plan().piece[group->rank()][t].size() : params[t].numel());
    formula += (kind == "muon" && params[t].dim() == 2 ? 4.0 : 8.0) * elements;
  }
  state.counters["state_formula"] = formula;
  double most = state_bytes;
  if (group) {
    for (const at::Tensor& r : group->allgather(at::tensor({state_bytes}, at::kDouble))) most = std::max(most, r.item<double>());
  }
  state.counters["state_bytes_max"] = most;
  double exchange = 0;
  if (sharded) {
    const bd::ExchangeBytes b = sharded->exchange_bytes();
    exchange = static_cast<double>(b.all_reduce + b.reduce_scatter + b.all_gather);
  } else if (group) {
    exchange = 2.0 * (n - 1) / n * 4.0 * p;
  }
  state.counters["exchange_formula"] = exchange;
  if (group) state.counters["loopback_per_rank"] = (loopback_tx_bytes() - lo_before) / (steps * n);
  state.SetItemsProcessed(state.iterations() * kGlobalBatch);  // samples/s of the whole job
}

}  // namespace

int main(int argc, char** argv) {
  const auto world = bd::world_from_env();
  const bool launched = bigbatch::experiments::launched_by_bigbatch();
  group = bigbatch::bench::join_world(world);
  const std::string suffix = "/world" + std::to_string(world.world_size);
  for (const std::string kind : {"lamb", "muon"}) {
    for (const auto& [stage, name] : bd::kShardStageNames) {
      if (stage != bd::ShardStage::kNone && !group) continue;
      const bd::ShardStage s = stage;
      benchmark::RegisterBenchmark((kind + "_shard_" + name + suffix).c_str(),
                                   [kind, s](benchmark::State& st) { bm_step(st, kind, s); })
          ->Iterations(bigbatch::bench::iterations(30))->Unit(benchmark::kMillisecond)->UseRealTime();
    }
  }
  if (world.rank != 0) std::freopen("/dev/null", "w", stdout);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (launched || world.world_size > 1) return 0;
  for (const int ranks : {2, 4}) {
    std::fflush(stdout);
    const int rc = bigbatch::bench::run_as_ranks(ranks, argc, argv);
    if (rc != 0) return rc;
  }
  return 0;
}
