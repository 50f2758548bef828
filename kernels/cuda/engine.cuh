// The CUDA runner of the multi-tensor step (kernels/engine.h): the device
// table of a plan, its uploads by kernel arguments, and the run of the plan
// (DeviceRunner, multi_tensor.cuh). Included by each algorithm's .cu, which
// instantiates it for its plan. What lives on the device: the table of
// tensors (built once, rebuilt only when the tensors change), each tensor's
// step count, the options, the skip flag and skipped-step counter, and the
// per-chunk and per-tensor sums. A step launches a fixed number of kernels
// whatever the number of tensors, allocates nothing, never waits for the
// device, and can be captured in a CUDA graph once bound.
#pragma once

#include <bigbatch/kernels/cuda/multi_tensor.cuh>

#include <algorithm>
#include <stdexcept>
#include <vector>

namespace bigbatch::kernels::cuda {

inline std::size_t round_up(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

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
    if (done_ != nullptr) cudaEventDestroy(done_);
  }

  bool same_tensors(const std::vector<TensorSlot>& slots) const override {
    return kernels::same_tensors(slots, slots_);
  }

  void bind(const std::vector<TensorSlot>& slots, const std::vector<Group>& groups, cudaStream_t stream) override {
    check_slot_groups(slots, groups.size());
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
    if (!same_groups(groups, groups_)) {
      bind_launches_ += upload(const_cast<Group*>(table_.groups), groups, stream);
      groups_ = groups;
      config_ = Plan::configure(groups_.data(), static_cast<int>(groups_.size()));
    }
    record(stream);
  }

  void run(cudaStream_t stream) override {
    if (slots_.empty()) return;
    const DeviceRunner<Group> runner{table_, stream};
    Plan::run(runner, config_);
    record(stream);
  }

  std::vector<std::int64_t> steps() const override {
    std::vector<std::int64_t> out(slots_.size());
    if (out.empty()) return out;
    read_back(out.data(), table_.steps, out.size() * sizeof(std::int64_t));
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
    return bind_launches_ + static_cast<int>(counted.passes.size()) + counted.finalizers;
  }

  std::int64_t bytes_per_step() const override { return plan_bytes<Plan>(slots_, config_); }

 private:
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
      arena_ = nullptr;
      arena_bytes_ = 0;
      scalars_ = nullptr;
    }
    device_ = current;
    bind_launches_ = 0;
    const std::size_t t = slots.size();
    const ChunkLayout layout = chunk_layout(slots);
    const auto chunks = static_cast<std::size_t>(layout.chunk_start.back());

    // One allocation, carved in this order.
    const std::size_t sizes[] = {round_up(t * sizeof(Slot)),
                                 round_up(t * sizeof(void*)),
                                 round_up((t + 1) * sizeof(std::int64_t)),
                                 round_up(num_groups * sizeof(Group)),
                                 round_up(2 * chunks * sizeof(double)),
                                 round_up(2 * t * sizeof(double)),
                                 round_up(t * sizeof(float)),
                                 round_up(t * sizeof(std::int64_t)),
                                 round_up(num_groups * sizeof(float)),
                                 round_up(chunks * sizeof(std::int32_t))};
    std::size_t total = 0;
    for (const std::size_t size : sizes) total += size;
    if (total > arena_bytes_) {
      if (arena_ != nullptr) BIGBATCH_CUDA_CHECK(cudaFree(arena_));
      arena_ = nullptr;
      BIGBATCH_CUDA_CHECK(cudaMalloc(&arena_, total));
      arena_bytes_ = total;
    }
    if (scalars_ == nullptr) {
      BIGBATCH_CUDA_CHECK(cudaMalloc(&scalars_, sizeof(Scalars)));
      const Scalars initial{0, 0u, skipped};
      bind_launches_ += upload(scalars_, &initial, sizeof(initial), stream);
    }
    auto* base = static_cast<unsigned char*>(arena_);
    std::size_t offset = 0;
    auto carve = [&](std::size_t index) {
      void* p = base + offset;
      offset += sizes[index];
      return p;
    };
    auto* dev_slots = static_cast<Slot*>(carve(0));
    auto* dev_grads = static_cast<const void**>(carve(1));
    auto* dev_chunk_start = static_cast<std::int64_t*>(carve(2));
    auto* dev_groups = static_cast<Group*>(carve(3));
    table_ = Table<Group>{};
    table_.slots = dev_slots;
    table_.grads = dev_grads;
    table_.chunk_start = dev_chunk_start;
    table_.groups = dev_groups;
    table_.partial = static_cast<double*>(carve(4));
    table_.sums = static_cast<double*>(carve(5));
    table_.coef = static_cast<float*>(carve(6));
    table_.steps = static_cast<std::int64_t*>(carve(7));
    table_.group_coef = static_cast<float*>(carve(8));
    auto* dev_chunk_tensor = static_cast<std::int32_t*>(carve(9));
    table_.chunk_tensor = dev_chunk_tensor;
    table_.scalars = scalars_;
    table_.num_tensors = static_cast<int>(t);
    table_.num_groups = static_cast<int>(num_groups);
    table_.num_chunks = static_cast<std::int64_t>(chunks);

    std::vector<Slot> host_slots(t);
    std::vector<const void*> grads(t);
    std::vector<std::int64_t> steps(t);
    for (std::size_t i = 0; i < t; ++i) {
      host_slots[i] = runner_slot(slots[i]);
      grads[i] = slots[i].grad;
      steps[i] = slots[i].step;
    }
    bind_launches_ += upload(dev_slots, host_slots, stream);
    bind_launches_ += upload(dev_grads, grads, stream);
    bind_launches_ += upload(dev_chunk_start, layout.chunk_start, stream);
    bind_launches_ += upload(dev_chunk_tensor, layout.chunk_tensor, stream);
    bind_launches_ += upload(table_.steps, steps, stream);
    bind_launches_ += upload(table_.group_coef, std::vector<float>(num_groups, 1.0f), stream);
    slots_ = slots;
    groups_.clear();  // uploaded by bind()
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
  int bind_launches_ = 0;               // uploads of the last bind()
};

/// Instantiated for its plan by each algorithm's .cu.
template <typename Plan>
std::unique_ptr<MultiTensorStep<Plan>> make_step() {
  return std::make_unique<CudaStep<Plan>>();
}

}  // namespace bigbatch::kernels::cuda

