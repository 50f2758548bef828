// The multi-tensor step of one optimizer, one API for two runners: the CPU
// runner (kernels/cpu/runner.h) and the CUDA runner (kernels/cuda/runner.cuh)
// execute any plan (kernels/plan.h); each algorithm's plan is its own header
// (kernels/lamb.h, ...), whose .cpp and .cu instantiate the two runners for it.
// Plain C++: no CUDA or LibTorch headers.
#pragma once

#include "plan.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

typedef struct CUstream_st* cudaStream_t;  // as cuda_runtime_api.h declares it

namespace bigbatch::kernels {

/// One tensor of a step: pointers to its storage and fp32 state (device
/// pointers for the CUDA runner, host pointers for the CPU runner).
struct TensorSlot {
  void* param = nullptr;        ///< numel elements of dtype
  const void* grad = nullptr;   ///< numel elements of dtype
  float* master = nullptr;      ///< fp32 copy of a 16-bit parameter, or null
  float* m = nullptr;           ///< LARS/LARC momentum buffer; LAMB/NovoGrad first moment
  float* v = nullptr;           ///< LAMB second moment (numel floats); NovoGrad one float; else null
  std::int64_t numel = 0;
  std::int64_t step = 0;        ///< steps taken before this one (read on a rebuild)
  /// Numbers a plan carries from step to step for this tensor beside its
  /// step count, in double (Schedule-Free: its weight sum and largest rate so
  /// far); read on a rebuild as `step` is, and left alone by other plans.
  double carry[kCarried] = {0, 0};
  std::int32_t group = 0;       ///< index into the groups
  DType dtype = DType::kFloat32;
};

/// Where a rank's slots lie in whole tensors cut across data-parallel ranks
/// (distributed/sharded.h): slot t holds chunks [first_chunk[t],
/// first_chunk[t] + its own chunks) of a tensor of tensor_chunks[t] chunks,
/// cut at chunk boundaries, so that each of its chunks is one chunk of the
/// whole tensor. Every rank binds the same tensors in the same order (a slot
/// may hold no element). After each reduce pass the runner places its chunk
/// sums in an array of every chunk of every whole tensor (zero elsewhere),
/// calls allreduce_sum on it (2 doubles per chunk; device memory on `stream`
/// for the CUDA runner), and the finalizer adds each tensor's chunk sums in
/// chunk order: the sums, trust ratios, clipping norm and skip decision of
/// the unsharded step, bit for bit, on every rank.
struct ShardSpec {
  std::vector<std::int64_t> tensor_chunks;  ///< [T] chunks of the whole tensor
  std::vector<std::int64_t> first_chunk;    ///< [T] the whole tensor's chunk where the slot starts
  std::function<void(double* data, std::int64_t count, cudaStream_t stream)> allreduce_sum;
};

/// The chunk arrays of a sharded step: where each whole tensor's chunks start
/// in the array allreduce_sum sees, and the index there of each local chunk.
struct ShardLayout {
  std::vector<std::int64_t> chunk_start;  ///< [T + 1] over the whole tensors
  std::vector<std::int64_t> chunk_index;  ///< [local chunks] each local chunk's place in the whole array
};

/// Checks `spec` against the slots (a slot whose chunks overrun its tensor,
/// arrays of the wrong length) and lays out its chunks; throws std::invalid_argument.
inline ShardLayout shard_layout(const ShardSpec& spec, const std::vector<TensorSlot>& slots) {
  if (spec.tensor_chunks.size() != slots.size() || spec.first_chunk.size() != slots.size() || !spec.allreduce_sum) {
    throw std::invalid_argument("bigbatch: a shard spec for " + std::to_string(spec.tensor_chunks.size()) +
                                " tensors (or without allreduce_sum) bound to " + std::to_string(slots.size()));
  }
  ShardLayout layout;
  layout.chunk_start.assign(slots.size() + 1, 0);
  for (std::size_t t = 0; t < slots.size(); ++t) {
    const std::int64_t own = chunks_of(slots[t].numel);
    if (spec.first_chunk[t] < 0 || spec.first_chunk[t] + own > spec.tensor_chunks[t]) {
      throw std::invalid_argument("bigbatch: slot " + std::to_string(t) + " holds " + std::to_string(own) +
                                  " chunks from chunk " + std::to_string(spec.first_chunk[t]) + " of a tensor of " +
                                  std::to_string(spec.tensor_chunks[t]));
    }
    layout.chunk_start[t + 1] = layout.chunk_start[t] + spec.tensor_chunks[t];
    for (std::int64_t c = 0; c < own; ++c) layout.chunk_index.push_back(layout.chunk_start[t] + spec.first_chunk[t] + c);
  }
  return layout;
}

/// The multi-tensor step of one optimizer. bind() describes the tensors and
/// the options of each group; run() executes (CPU) or enqueues (CUDA) one
/// step. The engine keeps each tensor's step count and the skipped-step
/// counter from one bind() to the next; they are read back by steps() and
/// skipped_steps(). The same tensors bound again keep the table; gradient
/// pointers and options may change every step.
template <typename Plan>
class MultiTensorStep {
 public:
  using Group = typename Plan::Group;

  virtual ~MultiTensorStep() = default;

  /// Whether bind(slots, ...) would keep the current table: the same tensors
  /// (parameters, masters, states, sizes, groups, dtypes) in the same order.
  virtual bool same_tensors(const std::vector<TensorSlot>& slots) const = 0;

  /// Binds the tensors and options of the next steps. A rebuild (first call,
  /// other tensors, another device) takes each tensor's step count from its
  /// slot. CUDA: on `stream`'s device (the current one); throws
  /// std::runtime_error on a CUDA error or on a rebuild under capture.
  virtual void bind(const std::vector<TensorSlot>& slots, const std::vector<Group>& groups,
                    cudaStream_t stream) = 0;

  /// Shards the next steps' sums across ranks (ShardSpec), or, with null,
  /// not. Takes effect at the next bind(), which checks it against the slots.
  virtual void set_shard(std::shared_ptr<const ShardSpec> spec) = 0;

  /// One step of the bound tensors: done on return (CPU), enqueued on `stream` (CUDA).
  virtual void run(cudaStream_t stream) = 0;

  /// Each bound tensor's step count (CUDA: waits for the last bind() or run()).
  virtual std::vector<std::int64_t> steps() const = 0;

  /// Each bound tensor's carried numbers (TensorSlot::carry), kCarried per
  /// tensor in slot order (CUDA: waits as steps()).
  virtual std::vector<double> carried() const = 0;

  /// Each bound tensor's trust ratio in the last run(): the ratio its update
  /// was scaled by (LARS's and LAMB's, LARC's clipped scale), NaN where its
  /// group does not adapt, the step was skipped, the plan has none, or before
  /// the first run (CUDA: waits as steps()).
  virtual std::vector<double> trust_ratios() const = 0;

  /// Steps skipped for non-finite gradients so far (CUDA: waits as steps()).
  virtual std::int64_t skipped_steps() const = 0;

  /// Throws the std::runtime_error a rebuild would throw now (CUDA: `stream`
  /// is being captured), so that a caller that must read back before a
  /// rebuild can fail with that message first. Never throws on the CPU.
  virtual void check_rebuild_allowed(cudaStream_t stream) const = 0;

  /// Kernel launches of one step: those of the last bind() (uploads) and of
  /// run(). 0 on the CPU.
  virtual int launches_per_step() const = 0;

  /// Bytes of tensor data one run() reads and writes (the sums and table add a
  /// few bytes per 16384 elements): the numerator of achieved bandwidth.
  virtual std::int64_t bytes_per_step() const = 0;
};

/// The CPU runner: chunks of every tensor spread over ATen's threads
/// (instantiated for each plan by the plan's .cpp).
template <typename Plan>
std::unique_ptr<MultiTensorStep<Plan>> make_cpu_step();

namespace cuda {
/// Whether this process sees a CUDA device (false without BIGBATCH_CUDA).
bool device_available();

/// The CUDA runner (builds with BIGBATCH_CUDA, or the SIMT executor in tests;
/// instantiated for each plan by the plan's .cu).
template <typename Plan>
std::unique_ptr<MultiTensorStep<Plan>> make_step();
}  // namespace cuda

// ------------------------------------------------------ what plans move ----

/// Records a plan's passes and finalizers without running them.
struct CountingRunner {
  std::vector<PassArrays> passes;
  int finalizers = 0;

  template <typename Pass>
  void pass(const Pass&) { passes.push_back(Pass::kArrays); }
  template <typename Fin>
  void finalize(const Fin&) { ++finalizers; }
};

/// The passes of one step of `Plan` with `config`.
template <typename Plan>
CountingRunner count_plan(const typename Plan::Config& config) {
  CountingRunner counter;
  Plan::run(counter, config);
  return counter;
}

/// Bytes of tensor data one step moves per element of a tensor (docs/cuda.md)
/// for the options `groups`, its storage dtype, with or without a master copy.
template <typename Plan>
std::int64_t step_bytes_per_element(const std::vector<typename Plan::Group>& groups, DType dtype, bool master) {
  std::int64_t bytes = 0;
  const auto config = Plan::configure(groups.data(), static_cast<int>(groups.size()));
  for (const PassArrays& pass : count_plan<Plan>(config).passes) bytes += pass_bytes(pass, dtype, master);
  return bytes;
}

// ------------------------------------------------ what runners share (host) ----

/// Where each tensor's chunks start, and which tensor owns each chunk.
struct ChunkLayout {
  std::vector<std::int64_t> chunk_start;   ///< [T + 1]
  std::vector<std::int32_t> chunk_tensor;  ///< [chunks]
};

inline ChunkLayout chunk_layout(const std::vector<TensorSlot>& slots) {
  ChunkLayout layout;
  layout.chunk_start.assign(slots.size() + 1, 0);
  for (std::size_t i = 0; i < slots.size(); ++i) {
    layout.chunk_start[i + 1] = layout.chunk_start[i] + chunks_of(slots[i].numel);
  }
  if (layout.chunk_start.back() > 0x7fffffff) {
    throw std::runtime_error("bigbatch: more than 2^31 - 1 chunks in one multi-tensor step");
  }
  layout.chunk_tensor.reserve(static_cast<std::size_t>(layout.chunk_start.back()));
  for (std::size_t i = 0; i < slots.size(); ++i) {
    layout.chunk_tensor.insert(layout.chunk_tensor.end(), layout.chunk_start[i + 1] - layout.chunk_start[i],
                               static_cast<std::int32_t>(i));
  }
  return layout;
}

/// A slot as the runners keep it (its gradient and step count apart).
inline Slot runner_slot(const TensorSlot& s) {
  return Slot{s.param, s.master, s.m, s.v, s.numel, s.group, s.dtype};
}

/// Whether two slots describe the same tensor (the gradient may differ).
inline bool same_tensor(const TensorSlot& a, const TensorSlot& b) {
  return a.param == b.param && a.master == b.master && a.m == b.m && a.v == b.v && a.numel == b.numel &&
         a.group == b.group && a.dtype == b.dtype;
}

/// Whether two slot lists describe the same tensors in the same order.
inline bool same_tensors(const std::vector<TensorSlot>& a, const std::vector<TensorSlot>& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), same_tensor);
}

/// Bytes of tensor data one step of `Plan` with `config` moves over `slots`.
template <typename Plan>
std::int64_t plan_bytes(const std::vector<TensorSlot>& slots, const typename Plan::Config& config) {
  std::int64_t bytes = 0;
  const auto passes = count_plan<Plan>(config).passes;
  for (const TensorSlot& s : slots) {
    for (const PassArrays& pass : passes) bytes += s.numel * pass_bytes(pass, s.dtype, s.master != nullptr);
  }
  return bytes;
}

/// Throws std::invalid_argument when a slot names a group that does not exist.
inline void check_slot_groups(const std::vector<TensorSlot>& slots, std::size_t num_groups) {
  for (const TensorSlot& s : slots) {
    if (s.group < 0 || static_cast<std::size_t>(s.group) >= num_groups) {
      throw std::invalid_argument("bigbatch: a tensor slot names group " + std::to_string(s.group) + " of " +
                                  std::to_string(num_groups));
    }
  }
}

/// Whether two lists of group options are equal, member by member (fields()).
template <typename Group>
bool same_groups(const std::vector<Group>& a, const std::vector<Group>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (fields(a[i]) != fields(b[i])) return false;
  }
  return true;
}

}  // namespace bigbatch::kernels
