// A torchrun-style local launcher: starts N copies of the running program as
// the ranks of a data-parallel job (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and supervises them. Torch-free.
#pragma once

#include <string>

namespace bigbatch::experiments {

struct LaunchOptions {
  int nproc = 1;        ///< ranks on this node
  int nnodes = 1;       ///< nodes in the job (run the same command on each)
  int node_rank = 0;    ///< this node's index
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
};

/// Throws ConfigError naming the option and its value when `options` cannot
/// describe a job (a count below 1, a node rank outside [0, nnodes), a port
/// outside 1-65535); the commands call it before anything else, whether or
/// not they launch.
void check_launch(const LaunchOptions& options);

/// True in a process this launcher started (it must not launch again).
bool launched_by_bigbatch();

/// Re-executes this program (argv) nproc times with the rank variables set and
/// BIGBATCH_LAUNCHED=1, waits for all, and returns 0 when all succeed. When a
/// rank fails, the others are stopped (SIGTERM, then SIGKILL after 10 s) and
/// its exit status is returned. Throws ConfigError for impossible options
/// (check_launch).
int launch_local(const LaunchOptions& options, int argc, char** argv);

}  // namespace bigbatch::experiments
