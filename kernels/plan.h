// The shape of every fused optimizer step, shared by the CPU runner
// (kernels/cpu/runner.h) and the CUDA runner (kernels/cuda/runner.cuh).
//
// A step is a plan: a fixed sequence of passes over every element of every
// tensor and of finalizers between them. A pass reads and writes named arrays
// of each tensor (PassArrays: what the bytes-per-step count is made of),
// applies an element op that the plan builds once per chunk from the
// per-tensor coefficients, op(p, g, m, v, sq), and may reduce (kReduce) the
// two values it leaves in sq[2] to two sums of squares per chunk, which the
// runner accumulates in double (finite iff every value is). A finalizer runs
// once per step on the per-tensor sums (added in chunk order: deterministic)
// and decides what the next pass needs: the skip flag, trust ratios, clipping.
//
// Each algorithm writes its plan once, next to its per-element math
// (kernels/lamb.h, momentum.h, novograd.h), as `Plan::run(runner, config)`
// calling `runner.pass(p)` and `runner.finalize(f)` in order. A runner
// executes it: the CPU one over chunks spread across threads, the CUDA one as
// one kernel per pass or finalizer; a counting runner reads off its bytes and
// launches. Finalizers see the runner's Block (HostBlock here, DeviceBlock in
// multi_tensor.cuh): the loop over tensors, the "any" and "sum" across it.
#pragma once

#include "common.h"

#include <math.h>

#include <cstdint>

// A host-and-device template that calls through a type parameter, so that its
// host instantiation may call device-only members (nvcc checks it otherwise).
#if defined(__CUDACC__)
#define BIGBATCH_HD_TEMPLATE _Pragma("nv_exec_check_disable")
#else
#define BIGBATCH_HD_TEMPLATE
#endif

namespace bigbatch::kernels {

/// Elements per chunk: the unit of work of one CUDA block or one CPU task, and
/// the unit of the norm sums (whose order is fixed by it).
constexpr std::int64_t kChunkElements = 1 << 14;

/// The chunks a tensor of `numel` elements is cut in (the last one partial).
/// Numbers a plan may carry per tensor from step to step (Table::carry).
constexpr int kCarried = 2;

constexpr std::int64_t chunks_of(std::int64_t numel) { return (numel + kChunkElements - 1) / kChunkElements; }

/// The arrays of a tensor a pass reads or writes.
enum Array : unsigned { kParam = 1, kGrad = 2, kM = 4, kV = 8 };

struct PassArrays {
  unsigned read;
  unsigned write;
};

/// Bytes per element a pass moves for one tensor: the storage type for the
/// parameter and gradient, fp32 for the state. A master copy replaces the
/// parameter read by an fp32 read and adds an fp32 write to each write.
constexpr std::int64_t pass_bytes(PassArrays pass, DType dtype, bool master) {
  const std::int64_t storage = dtype == DType::kFloat32 ? 4 : 2;
  std::int64_t bytes = 0;
  if (pass.read & kParam) bytes += master ? 4 : storage;
  if (pass.write & kParam) bytes += master ? 4 + storage : storage;
  if (pass.read & kGrad) bytes += storage;
  if (pass.read & kM) bytes += 4;
  if (pass.write & kM) bytes += 4;
  if (pass.read & kV) bytes += 4;
  if (pass.write & kV) bytes += 4;
  return bytes;
}

/// A tensor as a runner holds it (its gradient pointer is apart: it may move
/// every step, the rest only when the tensors change).
struct Slot {
  void* param;       ///< numel elements of dtype
  float* master;     ///< fp32 copy of a 16-bit parameter, or null
  float* m;          ///< first state array (numel floats)
  float* v;          ///< second state: numel floats (LAMB), one float (NovoGrad), or null
  std::int64_t numel;
  std::int32_t group;
  DType dtype;
};

/// Step-wide scalars that outlive table rebuilds.
struct Scalars {
  int skip;                   ///< this step changes nothing (set by the first finalizer)
  unsigned int blocks_done;   ///< CUDA finalize's last-block count; back to 0 after each
  long long skipped_steps;    ///< steps skipped so far
};

/// Everything a pass or finalizer sees, passed by value (pointers into host
/// memory for the CPU runner, into the device arena for the CUDA runner).
/// `Group` is the plan's per-group options struct.
template <typename Group>
struct Table {
  const Slot* slots;                 ///< [T]
  const void* const* grads;          ///< [T]
  const std::int64_t* chunk_start;   ///< [T + 1]: tensor t owns chunks [start[t], start[t+1])
  const std::int32_t* chunk_tensor;  ///< [chunks]: the tensor that owns each chunk
  const Group* groups;               ///< [G]
  double* partial;                   ///< [chunks][2] each chunk's two sums
  double* sums;                      ///< [T][2] each tensor's two sums, in chunk order
  float* coef;                       ///< [T] a per-tensor coefficient for the next pass
  double* ratio;                     ///< [T] each tensor's trust ratio in this step, NaN where none
                                     ///<     (every plan's finalizer writes it every run)
  std::int64_t* steps;               ///< [T] each tensor's step count
  double* carry;                     ///< [T][kCarried] numbers a plan keeps per tensor across steps
  float* group_coef;                 ///< [G] a per-group coefficient (LAMB: clipping factor)
  Scalars* scalars;
  int num_tensors;
  int num_groups;
  std::int64_t num_chunks;
};

/// The finalizer's view of the CPU runner: one thread visits every tensor.
struct HostBlock {
  int first() const { return 0; }
  int stride() const { return 1; }
  bool any(bool x) const { return x; }        ///< over the visiting threads
  double sum(double x) const { return x; }    ///< over the visiting threads
  bool leader() const { return true; }        ///< the one thread that writes scalars
  double read(const double* p) const { return *p; }
};

/// Inside a finalizer: whether some tensor whose group asks for
/// skip_nonfinite has a non-finite sum k (a sum of squares in double is finite
/// iff every element is). Sets scalars->skip and counts the skipped step.
BIGBATCH_HD_TEMPLATE
template <typename Group, typename Block>
BIGBATCH_HD bool decide_skip(const Table<Group>& table, int k, const Block& block) {
  bool bad = false;
  for (int t = block.first(); t < table.num_tensors; t += block.stride()) {
    const double s = block.read(table.sums + 2 * t + k);
    bad = bad || (table.groups[table.slots[t].group].skip_nonfinite && !isfinite(s));
  }
  const bool skip = block.any(bad);
  if (block.leader()) {
    table.scalars->skip = skip ? 1 : 0;
    if (skip) table.scalars->skipped_steps += 1;
  }
  return skip;
}

/// What a finalizer records as a tensor's trust ratio (Table::ratio): the
/// ratio the step scaled it by, or NaN where its group does not adapt or the
/// step was skipped, so that a reader (LayerwiseOptimizer::trust_ratios) sees
/// the ratio the step used, never a recomputation.
BIGBATCH_HD inline double recorded_ratio(double ratio, bool adapted, bool skipped) {
  return adapted && !skipped ? ratio : static_cast<double>(NAN);
}

/// The norm pass LARS, LARC and NovoGrad start with, and LAMB's first pass:
/// per chunk, the sum of g^2 (sum 0) and, kWithWeight, of w^2 (sum 1), in
/// double (finite iff g is). Writes nothing, so a step can still be abandoned.
template <bool kWithWeight>
struct SquaresPass {
  static constexpr PassArrays kArrays{kWithWeight ? (kParam | kGrad) : kGrad, 0};
  static constexpr bool kReduce = true;
  bool check_skip = false;

  struct Op {
    BIGBATCH_HD void operator()(float& w, float& g, float&, float&, float (&sq)[2]) const {
      sq[0] = g;                   // ||g||^2
      if (kWithWeight) sq[1] = w;  // ||w||^2
    }
  };
  template <typename Group>
  BIGBATCH_HD Op element_op(const Table<Group>&, int, const Slot&) const { return {}; }
};

/// Whether some group asks for skip_nonfinite (every plan's groups have it).
template <typename Group>
bool any_skip_nonfinite(const Group* groups, int n) {
  for (int i = 0; i < n; ++i) {
    if (groups[i].skip_nonfinite) return true;
  }
  return false;
}

}  // namespace bigbatch::kernels
