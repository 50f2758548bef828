// What the benchmarks that run as data-parallel ranks of themselves share
// (bm_data_parallel, bm_sharded): joining the world the launcher made, with
// this machine's cores split among its ranks as the runner's ranks split
// them, and re-executing the benchmark as more ranks. Iteration counts must
// be fixed (Iterations(n)) so that the ranks stay in step.
#pragma once

#include "../distributed/process_group.h"
#include "../experiments/cluster/launch.h"

#include <ATen/Parallel.h>

#include <unistd.h>  // getpid

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>

namespace bigbatch::bench {

/// The process group of `world` (none for a world of one), with each rank
/// given its share of the cores for intra-op threads.
inline std::unique_ptr<distributed::ProcessGroup> join_world(const distributed::WorldInfo& world) {
  if (world.world_size <= 1) return nullptr;
  auto group = std::make_unique<distributed::ProcessGroup>(world, std::chrono::seconds(120));
  at::set_num_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / world.world_size));
  return group;
}

/// Runs this benchmark again as `ranks` processes on this machine (argv as
/// given) and returns their launcher's exit code.
inline int run_as_ranks(int ranks, int argc, char** argv) {
  experiments::LaunchOptions options;
  options.nproc = ranks;
  options.master_port = 29000 + static_cast<int>((getpid() + ranks) % 1000);
  return experiments::launch_local(options, argc, argv);
}

}  // namespace bigbatch::bench
