// Data-parallel building blocks on PyTorch's c10d: the world from torchrun's or
// Open MPI's environment, a Gloo (CPU) or NCCL (CUDA) process group behind a
// TCPStore rendezvous, the initial broadcast, bucketed gradient averaging, and
// the shared shuffle.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <chrono>
#include <functional>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace bigbatch::distributed {

/// Where this process sits in the job.
struct WorldInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;  ///< ranks on this machine, which share its cores
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string launcher = "none";  ///< torchrun, mpirun, srun, none
};

/// torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
/// MASTER_PORT, else Open MPI's OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK,
/// _LOCAL_SIZE (with MASTER_ADDR and
/// MASTER_PORT, defaults 127.0.0.1:29500), else a task of Slurm's `srun`:
/// SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, the tasks of this node
/// (SLURM_STEP_TASKS_PER_NODE at SLURM_NODEID), rank 0 on the step's first
/// host (SLURM_STEP_NODELIST) at port 29500 + SLURM_JOB_ID % 20000 unless
/// MASTER_ADDR, MASTER_PORT say otherwise; else a world of one. Malformed or
/// inconsistent values throw c10::Error naming the variable.
WorldInfo world_from_env();

/// c10d's backends: Gloo for CPU tensors, NCCL for CUDA tensors.
enum class Backend { kGloo, kNccl };

/// Whether this build has c10d's NCCL backend (a CUDA LibTorch built with
/// NCCL, and bigbatch configured with BIGBATCH_CUDA).
bool nccl_available();

/// "gloo" or "nccl".
const char* backend_name(Backend backend);

/// A c10d process group with a TCPStore rendezvous at master_addr:master_port
/// hosted by rank 0. Every collective gives up with an error after `timeout`,
/// so a dead rank stops the others instead of hanging. With NCCL the
/// collectives run on device cuda:local_rank, which becomes the current device
/// (CPU tensors given to them are copied there and back); NCCL without
/// nccl_available() throws c10::Error.
class ProcessGroup {
 public:
  explicit ProcessGroup(const WorldInfo& world,
                        std::chrono::milliseconds timeout = std::chrono::seconds(60),
                        Backend backend = Backend::kGloo);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return world_.rank; }
  int size() const { return world_.world_size; }
  int local_rank() const { return world_.local_rank; }
  int local_size() const { return world_.local_world_size; }
  Backend backend() const { return backend_; }

  /// In place: every tensor becomes the sum over ranks.
  void allreduce_sum(std::vector<at::Tensor>& tensors);
  /// allreduce_sum started, not waited for: the backend works on it while the
  /// caller goes on (Gloo on its own threads, NCCL on its stream). Call the
  /// returned function to wait; the tensors (on the group's device) must live
  /// until then.
  std::function<void()> allreduce_sum_async(std::vector<at::Tensor> tensors);
  /// Every rank's `input` (the same shape and dtype on every rank) in rank
  /// order: element r is rank r's (this rank's a copy).
  std::vector<at::Tensor> allgather(const at::Tensor& input);
  /// `input` (1-D, the same length on every rank, a multiple of the world
  /// size) cut into size() equal parts: returns this rank's part summed over
  /// the ranks (a reduce-scatter: each rank sends and receives (N-1)/N of
  /// input in a ring, half an all-reduce). NCCL's reduce-scatter; over Gloo,
  /// which has none in every LibTorch we build against, one reduce to each
  /// part's rank. `input` may be overwritten.
  at::Tensor reduce_scatter_sum(at::Tensor& input);
  /// In place: every tensor becomes root's.
  void broadcast(std::vector<at::Tensor>& tensors, int root = 0);
  void barrier();

 private:
  struct Impl;
  WorldInfo world_;
  Backend backend_;
  std::unique_ptr<Impl> impl_;
};

/// Root's bytes on every rank (a checkpoint that only rank 0 can read).
std::string broadcast_bytes(ProcessGroup& group, const std::string& bytes, int root = 0);

/// Copies rank 0's parameters and buffers to every rank.
void broadcast_module(ProcessGroup& group, torch::nn::Module& module);

/// The rows of one epoch for `rank`: a permutation of [0, n) shared by every
/// rank (from seed and epoch), cut to a whole number of global batches
/// (batch_per_rank x world), and rank's interleaved share of each batch, so
/// every rank gets the same number of batches whatever n is.
/// Returns int64 indices of shape [batches, batch_per_rank].
at::Tensor epoch_partition(std::int64_t n, std::int64_t batch_per_rank, int rank, int world,
                           std::uint64_t seed, std::int64_t epoch);

}  // namespace bigbatch::distributed
