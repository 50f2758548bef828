// The CUDA runner of the multi-tensor step (kernels/engine.h): the device
// table of a plan, its uploads by kernel arguments, and the run of the plan
// (DeviceRunner, multi_tensor.cuh). Included by each algorithm's .cu in
// kernels/, which instantiates make_step for its plan. What lives on the device: the table of
// tensors (built once, rebuilt only when the tensors change), each tensor's
// step count, the options, the skip flag and skipped-step counter, and the
// per-chunk and per-tensor sums. A step launches a fixed number of kernels
// whatever the number of tensors, allocates nothing, never waits for the
// device, and can be captured in a CUDA graph once bound.
#pragma once

#include "multi_tensor.cuh"

#include <algorithm>
#include <limits>
#include <optional>
#include <stdexcept>
#include <vector>

namespace bigbatch::kernels::cuda {

inline std::size_t round_up(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

/// Where each array of a device table lies in its one allocation: the
/// offset of each, in the order placed, each 256-byte aligned.
template <typename Group>
struct ArenaLayout {
  std::size_t bytes = 0;  ///< the whole allocation (first: place() adds to it as the offsets are made)
  std::size_t slots, grads, chunk_start, groups, partial, sums, coef, ratio, steps, carry, group_coef, chunk_tensor;

  ArenaLayout(std::size_t tensors, std::size_t num_groups, std::size_t chunks)
      : slots(place(tensors * sizeof(Slot))),
        grads(place(tensors * sizeof(void*))),
        chunk_start(place((tensors + 1) * sizeof(std::int64_t))),
        groups(place(num_groups * sizeof(Group))),
        partial(place(2 * chunks * sizeof(double))),
        sums(place(2 * tensors * sizeof(double))),
        coef(place(tensors * sizeof(float))),
        ratio(place(tensors * sizeof(double))),
        steps(place(tensors * sizeof(std::int64_t))),
        carry(place(kCarried * tensors * sizeof(double))),
        group_coef(place(num_groups * sizeof(float))),
        chunk_tensor(place(chunks * sizeof(std::int32_t))) {}

  /// The array at `offset` of the allocation at `base`.
  template <typename T>
  static T* at(void* base, std::size_t offset) {
    return reinterpret_cast<T*>(static_cast<unsigned char*>(base) + offset);
  }

 private:
  // Places `size` bytes after what is placed so far.
  std::size_t place(std::size_t size) {
    const std::size_t offset = bytes;
    bytes += round_up(size);
    return offset;
  }
};

template <typename T>
int upload(T* dst, const std::vector<T>& src, cudaStream_t stream) {
  return upload(dst, src.data(), src.size() * sizeof(T), stream);
}

/// Throws, with what to do, when `stream` is being captured: a rebuild
/// allocates and uploads a table, which a graph cannot replay.
void check_not_capturing(cudaStream_t stream);

template <typename Plan>
class CudaStep final : public MultiTensorStep<Plan> {
 public:
  using Group = typename Plan::Group;

  CudaStep() = default;
  CudaStep(const CudaStep&) = delete;
  CudaStep& operator=(const CudaStep&) = delete;

  ~CudaStep() override {
    // A destructor must not throw: errors here (a device already torn down) are ignored.
    if (arena_ != nullptr) cudaFree(arena_);
    if (scalars_ != nullptr) cudaFree(scalars_);
    if (shard_arena_ != nullptr) cudaFree(shard_arena_);
    if (done_ != nullptr) cudaEventDestroy(done_);
  }

  bool same_tensors(const std::vector<TensorSlot>& slots) const override {
    return kernels::same_tensors(slots, slots_);
  }

  void bind(const std::vector<TensorSlot>& slots, const std::vector<Group>& groups, cudaStream_t stream) override {
    check_slot_groups(slots, groups.size());
    // The shard's layout, checked before anything changes.
    std::optional<ShardLayout> layout;
    if (shard_ != nullptr) layout = shard_layout(*shard_, slots);
    bind_launches_ = 0;
    if (slots.empty()) {
      slots_.clear();
      return;
    }
    int device = -1;
    BIGBATCH_CUDA_CHECK(cudaGetDevice(&device));
    if (!same_tensors(slots) || device != device_ || groups.size() != static_cast<std::size_t>(table_.num_groups)) {
      rebuild(slots, groups.size(), stream);
    } else {
      // Gradients may be new tensors each step (zero_grad(set_to_none)): send the moved pointers.
      bool moved = false;
      for (std::size_t i = 0; i < slots.size() && !moved; ++i) moved = slots[i].grad != slots_[i].grad;
      if (moved) {
        std::vector<const void*> grads(slots.size());
        for (std::size_t i = 0; i < slots.size(); ++i) {
          grads[i] = slots[i].grad;
          slots_[i].grad = slots[i].grad;
        }
        bind_launches_ += upload(const_cast<const void**>(table_.grads), grads, stream);
      }
    }
    if (layout) bind_shard(std::move(*layout), slots.size(), stream);
    if (!same_groups(groups, groups_)) {
      bind_launches_ += upload(const_cast<Group*>(table_.groups), groups, stream);
      groups_ = groups;
      config_ = Plan::configure(groups_.data(), static_cast<int>(groups_.size()));
    }
    record(stream);
  }

  void run(cudaStream_t stream) override {
    if (slots_.empty()) return;
    const DeviceRunner<Group> runner{table_, stream, shard_ != nullptr ? device_shard_ : DeviceShard{}};
    Plan::run(runner, config_);
    ran_ = true;
    record(stream);
  }

  std::vector<std::int64_t> steps() const override {
    std::vector<std::int64_t> out(slots_.size());
    if (out.empty()) return out;
    read_back(out.data(), table_.steps, out.size() * sizeof(std::int64_t));
    return out;
  }

  std::vector<double> carried() const override {
    std::vector<double> out(kCarried * slots_.size());
    if (out.empty()) return out;
    read_back(out.data(), table_.carry, out.size() * sizeof(double));
    return out;
  }

  std::vector<double> trust_ratios() const override {
    std::vector<double> out(slots_.size(), std::numeric_limits<double>::quiet_NaN());
    if (out.empty() || !ran_) return out;  // every run writes every tensor's ratio (kernels/plan.h)
    read_back(out.data(), table_.ratio, out.size() * sizeof(double));
    return out;
  }

  std::int64_t skipped_steps() const override {
    if (scalars_ == nullptr) return 0;
    long long skipped = 0;
    read_back(&skipped, &scalars_->skipped_steps, sizeof(skipped));
    return skipped;
  }

  void check_rebuild_allowed(cudaStream_t stream) const override { check_not_capturing(stream); }

  int launches_per_step() const override {
    if (slots_.empty()) return 0;
    const CountingRunner counted = count_plan<Plan>(config_);
    // Sharded, each finalizer first places the chunk sums (the all-reduce is the backend's).
    const int place = shard_ != nullptr ? counted.finalizers : 0;
    return bind_launches_ + static_cast<int>(counted.passes.size()) + counted.finalizers + place;
  }

  std::int64_t bytes_per_step() const override { return plan_bytes<Plan>(slots_, config_); }

  void set_shard(std::shared_ptr<const ShardSpec> spec) override { shard_ = std::move(spec); }

 private:
  // The device arrays of a sharded step, uploaded when the layout changes
  // (a rebuild of their own: not under capture).
  void bind_shard(ShardLayout layout, std::size_t t, cudaStream_t stream) {
    device_shard_.spec = shard_.get();
    if (layout.chunk_start == shard_host_.chunk_start && layout.chunk_index == shard_host_.chunk_index) return;
    check_not_capturing(stream);
    const auto whole = static_cast<std::size_t>(layout.chunk_start.back());
    std::vector<std::int64_t> local_of(whole, -1);
    for (std::size_t c = 0; c < layout.chunk_index.size(); ++c) {
      local_of[static_cast<std::size_t>(layout.chunk_index[c])] = static_cast<std::int64_t>(c);
    }
    const std::size_t sums_bytes = round_up(2 * whole * sizeof(double));
    const std::size_t start_bytes = round_up((t + 1) * sizeof(std::int64_t));
    const std::size_t bytes = sums_bytes + start_bytes + round_up(whole * sizeof(std::int64_t));
    if (bytes > shard_arena_bytes_) {
      if (shard_arena_ != nullptr) BIGBATCH_CUDA_CHECK(cudaFree(shard_arena_));
      shard_arena_ = nullptr;
      BIGBATCH_CUDA_CHECK(cudaMalloc(&shard_arena_, bytes));
      shard_arena_bytes_ = bytes;
    }
    using L = ArenaLayout<Group>;
    device_shard_.whole = L::template at<double>(shard_arena_, 0);
    auto* start = L::template at<std::int64_t>(shard_arena_, sums_bytes);
    auto* local = L::template at<std::int64_t>(shard_arena_, sums_bytes + start_bytes);
    bind_launches_ += upload(start, layout.chunk_start, stream);
    if (whole > 0) bind_launches_ += upload(local, local_of, stream);
    device_shard_.chunk_start = start;
    device_shard_.local_of = local;
    device_shard_.whole_chunks = static_cast<std::int64_t>(whole);
    shard_host_ = std::move(layout);
  }

  // Marks the end of the work just enqueued, for the read-backs. Not under
  // capture: an event last recorded in a capture cannot be waited on.
  void record(cudaStream_t stream) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    BIGBATCH_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    if (capture != cudaStreamCaptureStatusNone) {
      captured_ = true;
      return;
    }
    if (done_ == nullptr) BIGBATCH_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    BIGBATCH_CUDA_CHECK(cudaEventRecord(done_, stream));
  }

  // Copies device bytes back once the last bind() or run() has finished,
  // whatever stream it ran on (the current one may be another). Once a step
  // was captured, its graph may replay on any stream: then the whole device.
  void read_back(void* dst, const void* src, std::size_t bytes) const {
    if (captured_) {
      BIGBATCH_CUDA_CHECK(cudaDeviceSynchronize());
    } else if (done_ != nullptr) {
      BIGBATCH_CUDA_CHECK(cudaEventSynchronize(done_));
    }
    BIGBATCH_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  }

  void rebuild(const std::vector<TensorSlot>& slots, std::size_t num_groups, cudaStream_t stream) {
    check_not_capturing(stream);
    int current = -1;
    BIGBATCH_CUDA_CHECK(cudaGetDevice(&current));
    long long skipped = 0;
    if (current != device_ && (arena_ != nullptr || scalars_ != nullptr)) {
      // The tensors moved to another device: so do the table and the scalars
      // (the skipped-step count goes with them).
      if (scalars_ != nullptr) read_back(&skipped, &scalars_->skipped_steps, sizeof(skipped));
      BIGBATCH_CUDA_CHECK(cudaFree(arena_));
      BIGBATCH_CUDA_CHECK(cudaFree(scalars_));
      if (shard_arena_ != nullptr) BIGBATCH_CUDA_CHECK(cudaFree(shard_arena_));
      shard_arena_ = nullptr;
      shard_arena_bytes_ = 0;
      shard_host_ = ShardLayout{};
      arena_ = nullptr;
      arena_bytes_ = 0;
      scalars_ = nullptr;
    }
    device_ = current;
    bind_launches_ = 0;
    const std::size_t t = slots.size();
    const ChunkLayout layout = chunk_layout(slots);
    const auto chunks = static_cast<std::size_t>(layout.chunk_start.back());

    // One allocation holds the table and its work arrays.
    const ArenaLayout<Group> layout_of(t, num_groups, chunks);
    if (layout_of.bytes > arena_bytes_) {
      if (arena_ != nullptr) BIGBATCH_CUDA_CHECK(cudaFree(arena_));
      arena_ = nullptr;
      BIGBATCH_CUDA_CHECK(cudaMalloc(&arena_, layout_of.bytes));
      arena_bytes_ = layout_of.bytes;
    }
    if (scalars_ == nullptr) {
      BIGBATCH_CUDA_CHECK(cudaMalloc(&scalars_, sizeof(Scalars)));
      const Scalars initial{0, 0u, skipped};
      bind_launches_ += upload(scalars_, &initial, sizeof(initial), stream);
    }
    using L = ArenaLayout<Group>;
    table_ = Table<Group>{};
    table_.slots = L::template at<Slot>(arena_, layout_of.slots);
    table_.grads = L::template at<const void*>(arena_, layout_of.grads);
    table_.chunk_start = L::template at<std::int64_t>(arena_, layout_of.chunk_start);
    table_.groups = L::template at<Group>(arena_, layout_of.groups);
    table_.partial = L::template at<double>(arena_, layout_of.partial);
    table_.sums = L::template at<double>(arena_, layout_of.sums);
    table_.coef = L::template at<float>(arena_, layout_of.coef);
    table_.ratio = L::template at<double>(arena_, layout_of.ratio);
    table_.steps = L::template at<std::int64_t>(arena_, layout_of.steps);
    table_.carry = L::template at<double>(arena_, layout_of.carry);
    table_.group_coef = L::template at<float>(arena_, layout_of.group_coef);
    table_.chunk_tensor = L::template at<std::int32_t>(arena_, layout_of.chunk_tensor);
    table_.scalars = scalars_;
    table_.num_tensors = static_cast<int>(t);
    table_.num_groups = static_cast<int>(num_groups);
    table_.num_chunks = static_cast<std::int64_t>(chunks);

    std::vector<Slot> host_slots(t);
    std::vector<const void*> grads(t);
    std::vector<std::int64_t> steps(t);
    std::vector<double> carry;
    for (std::size_t i = 0; i < t; ++i) {
      host_slots[i] = runner_slot(slots[i]);
      grads[i] = slots[i].grad;
      steps[i] = slots[i].step;
      carry.insert(carry.end(), slots[i].carry, slots[i].carry + kCarried);
    }
    bind_launches_ += upload(const_cast<Slot*>(table_.slots), host_slots, stream);
    bind_launches_ += upload(const_cast<const void**>(table_.grads), grads, stream);
    bind_launches_ += upload(const_cast<std::int64_t*>(table_.chunk_start), layout.chunk_start, stream);
    bind_launches_ += upload(const_cast<std::int32_t*>(table_.chunk_tensor), layout.chunk_tensor, stream);
    bind_launches_ += upload(table_.steps, steps, stream);
    bind_launches_ += upload(table_.carry, carry, stream);
    bind_launches_ += upload(table_.group_coef, std::vector<float>(num_groups, 1.0f), stream);
    slots_ = slots;
    groups_.clear();  // uploaded by bind()
    ran_ = false;
  }

  std::vector<TensorSlot> slots_;       // as bound, host copies
  std::vector<Group> groups_;
  typename Plan::Config config_{};
  Table<Group> table_{};
  void* arena_ = nullptr;               // the table and its work arrays
  std::size_t arena_bytes_ = 0;
  Scalars* scalars_ = nullptr;          // kept across rebuilds on one device
  int device_ = -1;                     // where arena and scalars live
  cudaEvent_t done_ = nullptr;          // recorded after each eager bind() and run()
  bool captured_ = false;               // a step was captured: its replays are not ours to see
  bool ran_ = false;                    // a run since the last rebuild (the ratios are written)
  int bind_launches_ = 0;               // uploads of the last bind()
  std::shared_ptr<const ShardSpec> shard_;  // sharded across ranks, or null
  ShardLayout shard_host_;              // the layout uploaded to shard_arena_
  DeviceShard device_shard_;
  void* shard_arena_ = nullptr;         // the sharded step's arrays
  std::size_t shard_arena_bytes_ = 0;
};

/// Instantiated for its plan by each algorithm's .cu.
template <typename Plan>
std::unique_ptr<MultiTensorStep<Plan>> make_step() {
  return std::make_unique<CudaStep<Plan>>();
}

}  // namespace bigbatch::kernels::cuda

