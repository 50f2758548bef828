// The CPU runner of the multi-tensor step (kernels/engine.h): it executes a
// plan (kernels/plan.h) over the chunks of every tensor at once. A pass hands
// ATen's threads ranges of equal element counts, each a run of whole chunks
// of any tensors, so a step costs little per tensor; each chunk keeps its two
// sums, added per tensor in chunk order by the finalizer (the same bits for
// any thread count). Each algorithm's .cpp in kernels/ includes this and
// instantiates make_cpu_step for its plan, with the kernels library's flags
// (the loops are written for the auto-vectorizer: kernels/CMakeLists.txt).
// Internal to kernels/.
#pragma once

#include "../engine.h"
#include "isa.h"
#include "loops.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace bigbatch::kernels {
namespace cpu {

/// Elements per block of the element loop: its sq values wait in two float
/// arrays of this size (2 KiB, in L1) for the sum of squares.
constexpr std::int64_t kBlock = 256;
constexpr int kLanes = 8;  ///< partial sums of squares per element loop

/// Applies op(p, g, m, v, sq) to elements [begin, end) of one tensor, with
/// kRead loaded and kWrite stored; p is the master copy when kMaster (and then
/// both copies are written). With kReduce, out[k] is the sum of sq[k]^2 in
/// double. The squares are summed in a second loop per block rather than in
/// the first: the op's constants already fill the SIMD registers, and double
/// accumulators beside them spill to the stack (a 1.5x slower LAMB step).
template <unsigned kRead, unsigned kWrite, bool kReduce, bool kMaster, typename T, typename Op>
[[gnu::always_inline]] inline void element_body(const Slot& s, const void* grad_ptr, std::int64_t begin,
                                                std::int64_t end, const Op& op, double (&out)[2]) {
  T* const param = static_cast<T*>(s.param);
  const T* const grad = static_cast<const T*>(grad_ptr);
  float* const master = s.master;
  float* const m = s.m;
  float* const v = s.v;
  double lanes0[kLanes] = {};
  double lanes1[kLanes] = {};
  for (std::int64_t block = begin; block < end; block += kBlock) {
    const std::int64_t block_end = std::min(end, block + kBlock);
    float sq0[kBlock];
    float sq1[kBlock];
#pragma omp simd
    for (std::int64_t i = block; i < block_end; ++i) {
      float p = 0;
      float g = 0;
      float mm = 0;
      float vv = 0;
      if (kRead & kParam) p = kMaster ? master[i] : cpu::load(param, i);
      if (kRead & kGrad) g = cpu::load(grad, i);
      if (kRead & kM) mm = m[i];
      if (kRead & kV) vv = v[i];
      float sq[2] = {0, 0};
      op(p, g, mm, vv, sq);
      if (kReduce) {
        sq0[i - block] = sq[0];
        sq1[i - block] = sq[1];
      }
      if (kWrite & kParam) {
        if (kMaster) master[i] = p;
        cpu::store(param, i, p);
      }
      if (kWrite & kM) m[i] = mm;
      if (kWrite & kV) v[i] = vv;
    }
    if constexpr (kReduce) {
      // kLanes independent partial sums: one accumulator would make the
      // loop wait on each addition's latency.
      const std::int64_t n = block_end - block;
      std::int64_t j = 0;
      for (; j + kLanes <= n; j += kLanes) {
#pragma omp simd
        for (int k = 0; k < kLanes; ++k) {
          lanes0[k] += static_cast<double>(sq0[j + k]) * sq0[j + k];
          lanes1[k] += static_cast<double>(sq1[j + k]) * sq1[j + k];
        }
      }
      for (; j < n; ++j) {
        lanes0[0] += static_cast<double>(sq0[j]) * sq0[j];
        lanes1[0] += static_cast<double>(sq1[j]) * sq1[j];
      }
    }
  }
  out[0] = 0;
  out[1] = 0;
  for (int k = 0; k < kLanes; ++k) {  // in a fixed order: the same bits on any thread
    out[0] += lanes0[k];
    out[1] += lanes1[k];
  }
}

// The body compiled for each ISA (isa.h): the wider variants only add vector
// instructions (no "arch=", so the op, compiled for the baseline, still
// inlines into them; no FMA).
#if defined(__x86_64__) && defined(__GNUC__)
#define BIGBATCH_ISA_VARIANTS 1
template <unsigned kRead, unsigned kWrite, bool kReduce, bool kMaster, typename T, typename Op>
__attribute__((target("avx2,f16c"))) void element_loop_avx2(const Slot& s, const void* grad_ptr,
                                                             std::int64_t begin, std::int64_t end, const Op& op,
                                                             double (&out)[2]) {
  element_body<kRead, kWrite, kReduce, kMaster, T>(s, grad_ptr, begin, end, op, out);
}
template <unsigned kRead, unsigned kWrite, bool kReduce, bool kMaster, typename T, typename Op>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,f16c"))) void element_loop_avx512(
    const Slot& s, const void* grad_ptr, std::int64_t begin, std::int64_t end, const Op& op, double (&out)[2]) {
  element_body<kRead, kWrite, kReduce, kMaster, T>(s, grad_ptr, begin, end, op, out);
}
#endif

template <unsigned kRead, unsigned kWrite, bool kReduce, bool kMaster, typename T, typename Op>
void element_loop(const Slot& s, const void* grad_ptr, std::int64_t begin, std::int64_t end, const Op op,
                  double (&out)[2]) {
#ifdef BIGBATCH_ISA_VARIANTS
  switch (cpu_isa()) {
    case Isa::kAvx512: return element_loop_avx512<kRead, kWrite, kReduce, kMaster, T>(s, grad_ptr, begin, end, op, out);
    case Isa::kAvx2: return element_loop_avx2<kRead, kWrite, kReduce, kMaster, T>(s, grad_ptr, begin, end, op, out);
    case Isa::kBaseline: break;
  }
#endif
  element_body<kRead, kWrite, kReduce, kMaster, T>(s, grad_ptr, begin, end, op, out);
}

/// Runs a plan on host memory: pass() over every chunk in parallel,
/// finalize() on one thread.
template <typename Group>
struct CpuRunner {
  const Table<Group>& table;
  const std::vector<std::int64_t>& chunk_offset;  // [chunks + 1] first element of each chunk, over all tensors
  const ShardSpec* shard = nullptr;               // sharded across ranks (engine.h), or null
  const ShardLayout* shard_layout = nullptr;
  double* whole = nullptr;                        // [2 x chunks of the whole tensors]

  template <typename Pass>
  void pass(const Pass& pass) const {
    if (pass.check_skip && table.scalars->skip) return;  // the step was abandoned
    const std::int64_t total = chunk_offset.back();
    // Whole chunks whose first element lies in [begin, end): equal work per thread.
    at::parallel_for(0, total, kChunkElements, [&](std::int64_t begin, std::int64_t end) {
      const auto first = std::lower_bound(chunk_offset.begin(), chunk_offset.end() - 1, begin);
      const auto last = std::lower_bound(first, chunk_offset.end() - 1, end);
      for (auto c = first - chunk_offset.begin(); c < last - chunk_offset.begin(); ++c) run_chunk(pass, c);
    });
  }

  template <typename Pass>
  void run_chunk(const Pass& pass, std::int64_t chunk) const {
    const int t = table.chunk_tensor[chunk];
    const Slot& s = table.slots[t];
    const std::int64_t begin = (chunk - table.chunk_start[t]) * kChunkElements;
    const std::int64_t end = std::min(begin + kChunkElements, s.numel);
    const auto op = pass.element_op(table, t, s);
    double sums[2] = {0, 0};
    constexpr unsigned kRead = Pass::kArrays.read;
    constexpr unsigned kWrite = Pass::kArrays.write;
    cpu::dispatch(s.dtype, [&](auto tag) {
      using T = decltype(tag);
      if (s.master != nullptr) {
        element_loop<kRead, kWrite, Pass::kReduce, true, T>(s, table.grads[t], begin, end, op, sums);
      } else {
        element_loop<kRead, kWrite, Pass::kReduce, false, T>(s, table.grads[t], begin, end, op, sums);
      }
    });
    if constexpr (Pass::kReduce) {
      table.partial[2 * chunk] = sums[0];
      table.partial[2 * chunk + 1] = sums[1];
    }
  }

  template <typename Fin>
  void finalize(const Fin& fin) const {
    const double* partial = table.partial;
    const std::int64_t* chunk_start = table.chunk_start;
    if (shard != nullptr) {  // every rank's chunk sums, in the whole tensors' chunk order
      const std::int64_t whole_chunks = shard_layout->chunk_start.back();
      std::fill(whole, whole + 2 * whole_chunks, 0.0);
      for (std::int64_t c = 0; c < table.num_chunks; ++c) {
        whole[2 * shard_layout->chunk_index[c]] = partial[2 * c];
        whole[2 * shard_layout->chunk_index[c] + 1] = partial[2 * c + 1];
      }
      shard->allreduce_sum(whole, 2 * whole_chunks, nullptr);
      partial = whole;
      chunk_start = shard_layout->chunk_start.data();
    }
    for (int t = 0; t < table.num_tensors; ++t) {
      double a = 0;
      double b = 0;
      for (std::int64_t c = chunk_start[t]; c < chunk_start[t + 1]; ++c) {
        a += partial[2 * c];
        b += partial[2 * c + 1];
      }
      table.sums[2 * t] = a;
      table.sums[2 * t + 1] = b;
    }
    fin(table, HostBlock{});
  }
};

template <typename Plan>
class CpuStep final : public MultiTensorStep<Plan> {
 public:
  using Group = typename Plan::Group;

  bool same_tensors(const std::vector<TensorSlot>& slots) const override {
    return kernels::same_tensors(slots, slots_);
  }

  void bind(const std::vector<TensorSlot>& slots, const std::vector<Group>& groups, cudaStream_t) override {
    check_slot_groups(slots, groups.size());
    if (shard_ != nullptr) {  // checked before anything changes
      shard_layout_ = shard_layout(*shard_, slots);
      whole_.resize(2 * static_cast<std::size_t>(shard_layout_.chunk_start.back()));  // finalize() zeroes it
    }
    if (!same_tensors(slots)) rebuild(slots);
    for (std::size_t i = 0; i < slots.size(); ++i) grads_[i] = slots[i].grad;
    if (!same_groups(groups, groups_)) {
      groups_ = groups;
      config_ = Plan::configure(groups_.data(), static_cast<int>(groups_.size()));
      group_coef_.assign(groups_.size(), 1.0f);
      table_.groups = groups_.data();
      table_.group_coef = group_coef_.data();
      table_.num_groups = static_cast<int>(groups_.size());
    }
  }

  void run(cudaStream_t) override {
    if (slots_.empty()) return;
    scalars_.skip = 0;
    const CpuRunner<Group> runner{table_, chunk_offset_, shard_.get(), &shard_layout_, whole_.data()};
    Plan::run(runner, config_);
  }

  std::vector<std::int64_t> steps() const override { return steps_; }
  std::vector<double> carried() const override { return carry_; }
  void set_shard(std::shared_ptr<const ShardSpec> spec) override { shard_ = std::move(spec); }

  std::vector<double> trust_ratios() const override { return ratio_; }
  std::int64_t skipped_steps() const override { return scalars_.skipped_steps; }
  void check_rebuild_allowed(cudaStream_t) const override {}
  int launches_per_step() const override { return 0; }

  std::int64_t bytes_per_step() const override { return plan_bytes<Plan>(slots_, config_); }

 private:
  void rebuild(const std::vector<TensorSlot>& slots) {
    const ChunkLayout layout = chunk_layout(slots);
    slots_ = slots;
    chunk_start_ = layout.chunk_start;
    chunk_tensor_ = layout.chunk_tensor;
    const std::size_t chunks = chunk_tensor_.size();
    chunk_offset_.assign(chunks + 1, 0);
    runner_slots_.clear();
    grads_.assign(slots.size(), nullptr);
    steps_.clear();
    carry_.clear();
    for (std::size_t i = 0; i < slots.size(); ++i) {
      runner_slots_.push_back(runner_slot(slots[i]));
      steps_.push_back(slots[i].step);
      carry_.insert(carry_.end(), slots[i].carry, slots[i].carry + kCarried);
      for (std::int64_t c = chunk_start_[i]; c < chunk_start_[i + 1]; ++c) {
        chunk_offset_[c + 1] = chunk_offset_[c] + std::min(kChunkElements, slots[i].numel - (c - chunk_start_[i]) * kChunkElements);
      }
    }
    partial_.assign(2 * chunks, 0.0);
    sums_.assign(2 * slots.size(), 0.0);
    coef_.assign(slots.size(), 0.0f);
    ratio_.assign(slots.size(), std::numeric_limits<double>::quiet_NaN());
    table_.slots = runner_slots_.data();
    table_.grads = grads_.data();
    table_.chunk_start = chunk_start_.data();
    table_.chunk_tensor = chunk_tensor_.data();
    table_.partial = partial_.data();
    table_.sums = sums_.data();
    table_.coef = coef_.data();
    table_.ratio = ratio_.data();
    table_.steps = steps_.data();
    table_.carry = carry_.data();
    table_.scalars = &scalars_;
    table_.num_tensors = static_cast<int>(slots.size());
    table_.num_chunks = static_cast<std::int64_t>(chunks);
  }

  std::vector<TensorSlot> slots_;
  std::vector<Group> groups_;
  typename Plan::Config config_{};
  std::vector<Slot> runner_slots_;
  std::vector<const void*> grads_;
  std::vector<std::int64_t> chunk_start_;
  std::vector<std::int32_t> chunk_tensor_;
  std::vector<std::int64_t> chunk_offset_;
  std::vector<double> partial_;
  std::vector<double> sums_;
  std::vector<float> coef_;
  std::vector<double> ratio_;
  std::vector<std::int64_t> steps_;
  std::vector<double> carry_;
  std::vector<float> group_coef_;
  Scalars scalars_{0, 0u, 0};
  Table<Group> table_{};
  std::shared_ptr<const ShardSpec> shard_;
  ShardLayout shard_layout_;
  std::vector<double> whole_;
};

}  // namespace cpu

/// The CPU runner of `Plan` (declared in engine.h; instantiated by the plan's .cpp).
template <typename Plan>
std::unique_ptr<MultiTensorStep<Plan>> make_cpu_step() {
  return std::make_unique<cpu::CpuStep<Plan>>();
}

}  // namespace bigbatch::kernels
