// Data parallelism on c10d/Gloo with 2 processes on 127.0.0.1: the test binary
// re-executes itself as the workers (BIGBATCH_DIST_WORKER=scenario), so each
// rank is a fresh process, as under torchrun.
#include "../../distributed/compression.h"
#include "../../distributed/process_group.h"
#include "../../optimizers/lamb.h"
#include "../../optimizers/lars.h"

#include "../test_main.h"
#include "ranks.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace bd = bigbatch::distributed;
using bigbatch::test::launch;
using bigbatch::test::Ranks;
using bigbatch::test::read_tensor;
using bigbatch::test::slurp;
using bigbatch::test::tmp;
using bigbatch::test::write_tensor;
constexpr std::int64_t kPerRank = 4;
constexpr int kSteps = 10;

torch::nn::Sequential make_net(std::uint64_t seed) {
  at::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::Tanh(), torch::nn::Linear(8, 3));
}

std::unique_ptr<torch::optim::Optimizer> make_opt(const std::string& name, torch::nn::Sequential& net) {
  if (name == "lamb") {
    return std::make_unique<bigbatch::optim::LAMB>(net->parameters(), bigbatch::optim::LAMBOptions(1e-2));
  }
  if (name == "lars") {
    return std::make_unique<bigbatch::optim::LARS>(net->parameters(),
                                                    bigbatch::optim::LARSOptions(1.0).weight_decay(1e-4));
  }
  return std::make_unique<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
}

// The data every rank and the single process share: 10 global batches of 8.
std::pair<at::Tensor, at::Tensor> data() {
  auto gen = at::detail::createCPUGenerator(123);
  return {at::randn({kSteps * 2 * kPerRank, 6}, gen, at::kFloat),
          at::randint(3, {kSteps * 2 * kPerRank}, gen, at::kLong)};
}

at::Tensor flat_params(torch::nn::Sequential& net) {
  std::vector<at::Tensor> parts;
  for (const auto& p : net->parameters()) parts.push_back(p.detach().reshape({-1}));
  return at::cat(parts);
}

// ----------------------------------------------------------------- workers --

int worker(const std::string& scenario) {
  if (scenario.rfind("compress:", 0) == 0) return bigbatch::test::compression_worker(scenario.substr(9));
  if (scenario.rfind("shard:", 0) == 0) return bigbatch::test::sharded_worker(scenario.substr(6));
  if (scenario.rfind("local_sgd:", 0) == 0) return bigbatch::test::local_sgd_worker(scenario.substr(10));
  const bd::WorldInfo world = bd::world_from_env();
  const std::string out = std::getenv("BIGBATCH_DIST_OUT");
  // 5 s where a rank dies (the survivor's error comes within it); elsewhere
  // room for the ranks' start-ups to differ on a loaded machine.
  bd::ProcessGroup group(world, std::chrono::seconds(scenario == "kill" ? 5 : 60));
  auto net = make_net(100 + world.rank);  // different seeds: the broadcast must fix that
  const at::Tensor before = flat_params(net).clone();
  bd::broadcast_module(group, *net);
  if (scenario == "broadcast") {
    write_tensor(out + "." + std::to_string(world.rank), flat_params(net));
    return world.rank == 1 && at::equal(before, flat_params(net)) ? 3 : 0;
  }
  if (scenario == "bytes") {  // rank 0's checkpoint bytes reach rank 1, zeros and all
    const std::string sent("\0checkpoint\xff\x01", 13);
    const std::string got = bd::broadcast_bytes(group, world.rank == 0 ? sent : std::string("stale"));
    const std::string none = bd::broadcast_bytes(group, std::string());
    return got == sent && none.empty() ? 0 : 4;
  }
  if (scenario == "uneven") {  // 103 examples, 2 ranks x 4: 12 batches each, 2 epochs
    auto opt = make_opt("sgd", net);
    const at::Tensor x = at::randn({103, 6});
    const at::Tensor y = at::randint(3, {103});
    for (std::int64_t epoch = 0; epoch < 2; ++epoch) {
      const at::Tensor rows = bd::epoch_partition(103, kPerRank, world.rank, world.world_size, 7, epoch);
      for (std::int64_t b = 0; b < rows.size(0); ++b) {
        opt->zero_grad();
        torch::nn::functional::cross_entropy(net->forward(x.index_select(0, rows[b])), y.index_select(0, rows[b]))
            .backward();
        bd::allreduce_gradients(group, net->parameters());
        opt->step();
      }
    }
    group.barrier();
    return 0;
  }
  // equivalence:<optimizer> and kill
  const std::string opt_name = scenario.rfind("equivalence:", 0) == 0 ? scenario.substr(12) : "sgd";
  auto opt = make_opt(opt_name, net);
  const auto [x, y] = data();
  for (int step = 0; step < (scenario == "kill" ? 1000 : kSteps); ++step) {
    if (scenario == "kill" && world.rank == 1 && step == 3) std::_Exit(9);  // dies mid-training
    const std::int64_t begin = (step % kSteps) * 2 * kPerRank + world.rank * kPerRank;
    opt->zero_grad();
    torch::nn::functional::cross_entropy(net->forward(x.slice(0, begin, begin + kPerRank)),
                                         y.slice(0, begin, begin + kPerRank))
        .backward();
    bd::allreduce_gradients(group, net->parameters(), /*bucket_bytes=*/64);  // several buckets
    opt->step();
  }
  write_tensor(out + "." + std::to_string(world.rank), flat_params(net));
  return 0;
}

// ------------------------------------------------------------------ parent --

class TwoRanks : public testing::TestWithParam<const char*> {};

TEST_P(TwoRanks, EqualOneProcessWithTheDoubleBatch) {
  const std::string opt = GetParam();
  const std::string out = tmp(opt);
  const Ranks r = launch("equivalence:" + opt, out);
  ASSERT_EQ(r.status, (std::vector<int>{0, 0})) << slurp(r.logs[0]) << slurp(r.logs[1]);
  // One process, rank 0's initial weights, batch 8 = both ranks' rows.
  auto net = make_net(100);
  auto optimizer = make_opt(opt, net);
  const auto [x, y] = data();
  for (int step = 0; step < kSteps; ++step) {
    optimizer->zero_grad();
    const std::int64_t begin = step * 2 * kPerRank;
    torch::nn::functional::cross_entropy(net->forward(x.slice(0, begin, begin + 2 * kPerRank)),
                                         y.slice(0, begin, begin + 2 * kPerRank))
        .backward();
    optimizer->step();
  }
  const at::Tensor single = flat_params(net);
  for (int rank = 0; rank < 2; ++rank) {
    const at::Tensor got = read_tensor(out + "." + std::to_string(rank), single.numel());
    const double rel = (got - single).norm().item<double>() / single.norm().item<double>();
    EXPECT_LE(rel, 1e-6) << opt << " rank " << rank;
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, TwoRanks, testing::Values("lamb", "lars", "sgd"));

TEST(DataParallel, BroadcastGivesEveryRankRankZerosParameters) {
  const std::string out = tmp("broadcast");
  const Ranks r = launch("broadcast", out);
  ASSERT_EQ(r.status, (std::vector<int>{0, 0})) << slurp(r.logs[0]) << slurp(r.logs[1]);
  auto net = make_net(100);
  const at::Tensor rank0 = flat_params(net);
  EXPECT_TRUE(at::equal(read_tensor(out + ".0", rank0.numel()), rank0));
  EXPECT_TRUE(at::equal(read_tensor(out + ".1", rank0.numel()), rank0));
}

TEST(DataParallel, BroadcastBytesGivesEveryRankRankZerosBytes) {
  const Ranks r = launch("bytes", tmp("bytes"));
  EXPECT_EQ(r.status, (std::vector<int>{0, 0})) << slurp(r.logs[0]) << slurp(r.logs[1]);
}

TEST(DataParallel, UnevenDatasetFinishesWithoutHanging) {
  const Ranks r = launch("uneven", tmp("uneven"), 2, 60);
  EXPECT_EQ(r.status, (std::vector<int>{0, 0})) << slurp(r.logs[0]) << slurp(r.logs[1]);
}

TEST(DataParallel, ADeadRankStopsTheOtherWithAClearError) {
  const std::string out = tmp("kill");
  const Ranks r = launch("kill", out, 2, 60);
  EXPECT_EQ(r.status[1], 9);
  EXPECT_NE(r.status[0], 0);
  EXPECT_NE(r.status[0], -1) << "rank 0 hung until the test's limit";
  // Counted from rank 1's death, not from the launch (which also holds two
  // LibTorch start-ups, slow on a loaded machine): a watchdog far above the
  // group's 5 s timeout, where a missed death waits for the test's limit.
  EXPECT_LT(r.exited[0] - r.exited[1], 30) << "rank 0 ended " << r.exited[0] << " s in, rank 1 " << r.exited[1];
  const std::string log = slurp(r.logs[0]);
  EXPECT_NE(log.find("rank 0"), std::string::npos) << log;
  std::cout << "rank 0 after the death of rank 1 (" << r.seconds << " s): " << log << "\n";
}

// A world of one on `backend`: the collectives run (a group asked for is used)
// and change nothing, so 10 steps equal 10 steps without a group, bit for bit.
void expect_world_of_one_is_identity(bd::Backend backend, const at::Device& device) {
  bd::WorldInfo world;
  world.master_port = bigbatch::testing_support::free_port();
  bd::ProcessGroup group(world, std::chrono::seconds(30), backend);
  EXPECT_EQ(group.backend(), backend);
  auto alone = make_net(5);
  auto grouped = make_net(5);
  alone->to(device);
  grouped->to(device);
  bd::broadcast_module(group, *grouped);
  auto opt_alone = make_opt("lamb", alone);
  auto opt_grouped = make_opt("lamb", grouped);
  const auto [x_cpu, y_cpu] = data();
  const at::Tensor x = x_cpu.to(device);
  const at::Tensor y = y_cpu.to(device);
  for (int step = 0; step < kSteps; ++step) {
    const at::Tensor xb = x.slice(0, step * kPerRank, (step + 1) * kPerRank);
    const at::Tensor yb = y.slice(0, step * kPerRank, (step + 1) * kPerRank);
    for (auto* pair : {&alone, &grouped}) {
      (pair == &alone ? opt_alone : opt_grouped)->zero_grad();
      torch::nn::functional::cross_entropy((*pair)->forward(xb), yb).backward();
    }
    const auto norms = bd::allreduce_gradients(group, grouped->parameters());
    EXPECT_DOUBLE_EQ(norms.local_sq, norms.global_sq);
    opt_alone->step();
    opt_grouped->step();
  }
  EXPECT_TRUE(at::equal(flat_params(alone), flat_params(grouped)));
  std::vector<at::Tensor> scalar{at::full({1}, 2.5, at::kDouble)};  // a CPU tensor, as the runner sends
  group.allreduce_sum(scalar);
  EXPECT_EQ(scalar[0].item<double>(), 2.5);
  EXPECT_TRUE(scalar[0].device().is_cpu());
}

TEST(DataParallel, GlooWorldOfOneRunsItsCollectives) {
  expect_world_of_one_is_identity(bd::Backend::kGloo, at::kCPU);
}

TEST(DataParallel, NcclWorldOfOneRunsItsCollectives_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (!bd::nccl_available()) GTEST_SKIP() << "this build has no NCCL backend";
  expect_world_of_one_is_identity(bd::Backend::kNccl, at::kCUDA);
}

TEST(DataParallel, NcclWithoutItInTheBuildIsRefused) {
  if (bd::nccl_available()) GTEST_SKIP() << "this build has NCCL";
  bd::WorldInfo world;
  world.master_port = bigbatch::testing_support::free_port();
  EXPECT_THROW(bd::ProcessGroup(world, std::chrono::seconds(5), bd::Backend::kNccl), c10::Error);
}

TEST(EpochPartition, SharedShuffleEqualShares) {
  const at::Tensor a = bd::epoch_partition(103, 4, 0, 2, 7, 0);
  const at::Tensor b = bd::epoch_partition(103, 4, 1, 2, 7, 0);
  EXPECT_EQ(a.sizes(), (std::vector<std::int64_t>{12, 4}));
  EXPECT_EQ(b.sizes(), a.sizes());
  const at::Tensor all = std::get<0>(at::cat({a.reshape(-1), b.reshape(-1)}).sort());
  EXPECT_EQ(std::get<0>(at::_unique(all)).numel(), 96);  // disjoint
  EXPECT_FALSE(at::equal(a, bd::epoch_partition(103, 4, 0, 2, 7, 1)));  // a new shuffle per epoch
}

TEST(WorldFromEnv, TorchrunOpenMpiLocalSizesAndBadValues) {
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "4", 1);
  setenv("MASTER_PORT", "12345", 1);
  bd::WorldInfo w = bd::world_from_env();
  EXPECT_EQ(w.rank, 1);
  EXPECT_EQ(w.world_size, 4);
  EXPECT_EQ(w.master_port, 12345);
  EXPECT_EQ(w.launcher, "torchrun");
  EXPECT_EQ(w.local_world_size, 4);  // unset: every rank may be on this machine
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  EXPECT_EQ(bd::world_from_env().local_world_size, 2);
  setenv("LOCAL_WORLD_SIZE", "5", 1);  // more ranks here than in the world
  EXPECT_THROW(bd::world_from_env(), c10::Error);
  unsetenv("LOCAL_WORLD_SIZE");
  setenv("RANK", "4", 1);
  EXPECT_THROW(bd::world_from_env(), c10::Error);
  setenv("RANK", "x", 1);
  EXPECT_THROW(bd::world_from_env(), c10::Error);
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  setenv("OMPI_COMM_WORLD_RANK", "2", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
  w = bd::world_from_env();
  EXPECT_EQ(w.rank, 2);
  EXPECT_EQ(w.world_size, 3);
  EXPECT_EQ(w.launcher, "mpirun");
  EXPECT_EQ(w.local_world_size, 3);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "1", 1);
  EXPECT_EQ(bd::world_from_env().local_world_size, 1);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "0", 1);
  try {
    bd::world_from_env();
    ADD_FAILURE() << "OMPI_COMM_WORLD_LOCAL_SIZE=0 accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("OMPI_COMM_WORLD_LOCAL_SIZE must be in [1, 3], got 0"), std::string::npos)
        << e.what();
  }
  unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  unsetenv("OMPI_COMM_WORLD_RANK");
  unsetenv("OMPI_COMM_WORLD_SIZE");
  unsetenv("MASTER_PORT");
  EXPECT_EQ(bd::world_from_env().world_size, 1);
}

}  // namespace

int main(int argc, char** argv) {
  if (const char* scenario = std::getenv("BIGBATCH_DIST_WORKER")) {
    try {
      return worker(scenario);
    } catch (const c10::Error& e) {
      std::cerr << "rank " << std::getenv("RANK") << ": " << e.what_without_backtrace() << "\n";
      return 1;
    } catch (const std::exception& e) {
      std::cerr << "rank " << std::getenv("RANK") << ": " << e.what() << "\n";
      return 1;
    }
  }
  testing::InitGoogleTest(&argc, argv);
  return bigbatch::testing_support::run_all_tests();
}
