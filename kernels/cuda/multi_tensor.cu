// The host side of the multi-tensor CUDA step (kernels/multi_tensor.h): the
// device table, its uploads by kernel arguments, and the dispatch to the
// launcher of each algorithm (lamb.cu, momentum.cu, novograd.cu).
#include <bigbatch/kernels/cuda/multi_tensor.cuh>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <tuple>

namespace bigbatch::kernels::cuda {

void check(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return;
  throw std::runtime_error(std::string("CUDA error ") + cudaGetErrorName(err) + " (" +
                           cudaGetErrorString(err) + ") in " + call + " at " + file + ":" +
                           std::to_string(line));
}

namespace {
// Every member of GroupOptions, by a structured binding: a field added to the
// struct and not here is a compile error, not an option change bind() misses.
auto fields(const GroupOptions& o) {
  const auto& [lr, momentum, beta1, beta2, eps, weight_decay, trust_coefficient, max_grad_norm, min_trust,
               max_trust, flags] = o;
  return std::tie(lr, momentum, beta1, beta2, eps, weight_decay, trust_coefficient, max_grad_norm, min_trust,
                  max_trust, flags);
}
}  // namespace

bool operator==(const GroupOptions& a, const GroupOptions& b) { return fields(a) == fields(b); }

bool device_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

std::int64_t pass_bytes(PassArrays pass, DType dtype, bool master) {
  const std::int64_t storage = dtype == DType::kFloat32 ? 4 : 2;
  std::int64_t bytes = 0;
  if (pass.read & kParam) bytes += master ? 4 : storage;
  if (pass.write & kParam) bytes += master ? 4 + storage : storage;
  if (pass.read & kGrad) bytes += storage;
  for (const unsigned fp32 : {unsigned{kM}, unsigned{kV}}) {
    if (pass.read & fp32) bytes += 4;
    if (pass.write & fp32) bytes += 4;
  }
  return bytes;
}

namespace {

// ----------------------------------------------------------------- upload ----
// Host data reaches the device as kernel arguments: the launch copies them,
// so the host buffer is free at once, nothing is pinned, and the upload is
// ordered on the stream (and captured into a graph like any kernel).

constexpr std::size_t kUploadBytes = 3968;  // with the other arguments, under the 4 KiB limit

struct UploadPayload {
  unsigned char bytes[kUploadBytes];
};

__global__ void upload_kernel(unsigned char* dst, UploadPayload payload, unsigned size) {
  for (unsigned i = threadIdx.x; i < size; i += blockDim.x) dst[i] = payload.bytes[i];
}

/// Returns the number of kernels it launched.
int upload(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
  int launches = 0;
  auto* out = static_cast<unsigned char*>(dst);
  const auto* in = static_cast<const unsigned char*>(src);
  for (std::size_t done = 0; done < bytes; done += kUploadBytes) {
    const std::size_t n = std::min(kUploadBytes, bytes - done);
    UploadPayload payload;
    std::memcpy(payload.bytes, in + done, n);
    launch_kernel(upload_kernel, dim3(1), dim3(kThreads), stream, out + done, payload, static_cast<unsigned>(n));
    BIGBATCH_CUDA_CHECK(cudaGetLastError());
    ++launches;
  }
  return launches;
}

template <typename T>
int upload(T* dst, const std::vector<T>& src, cudaStream_t stream) {
  return upload(dst, src.data(), src.size() * sizeof(T), stream);
}

std::size_t round_up(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

bool same_tensor(const TensorSlot& a, const TensorSlot& b) {
  return a.param == b.param && a.master == b.master && a.m == b.m && a.v == b.v && a.numel == b.numel &&
         a.group == b.group && a.dtype == b.dtype;
}

}  // namespace

// ------------------------------------------------------------------ engine ----

struct MultiTensorStep::Impl {
  Algorithm algorithm;
  std::vector<TensorSlot> slots;        // as bound, host copies
  std::vector<GroupOptions> groups;
  Launch launch{false, false};
  Table table{};
  void* arena = nullptr;                // the table and its work arrays
  std::size_t arena_bytes = 0;
  Scalars* scalars = nullptr;           // kept across rebuilds on one device
  int device = -1;                      // where arena and scalars live
  cudaEvent_t done = nullptr;           // recorded after each eager bind() and run()
  bool captured = false;                // a step was captured: its replays are not ours to see
  int bind_launches = 0;                // uploads of the last bind()

  ~Impl() {
    // A destructor must not throw: errors here (a device already torn down) are ignored.
    if (arena != nullptr) cudaFree(arena);
    if (scalars != nullptr) cudaFree(scalars);
    if (done != nullptr) cudaEventDestroy(done);
  }

  // Marks the end of the work just enqueued, for the read-backs. Not under
  // capture: an event last recorded in a capture cannot be waited on.
  void record(cudaStream_t stream) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    BIGBATCH_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    if (capture != cudaStreamCaptureStatusNone) {
      captured = true;
      return;
    }
    if (done == nullptr) BIGBATCH_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    BIGBATCH_CUDA_CHECK(cudaEventRecord(done, stream));
  }

  // Copies device bytes back once the last bind() or run() has finished,
  // whatever stream it ran on (the current one may be another). Once a step
  // was captured, its graph may replay on any stream: then the whole device.
  void read_back(void* dst, const void* src, std::size_t bytes) const {
    if (captured) {
      BIGBATCH_CUDA_CHECK(cudaDeviceSynchronize());
    } else if (done != nullptr) {
      BIGBATCH_CUDA_CHECK(cudaEventSynchronize(done));
    }
    BIGBATCH_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  }

  void rebuild(const std::vector<TensorSlot>& new_slots, std::size_t num_groups, cudaStream_t stream) {
    check_not_capturing(stream);
    int current = -1;
    BIGBATCH_CUDA_CHECK(cudaGetDevice(&current));
    long long skipped = 0;
    if (current != device && (arena != nullptr || scalars != nullptr)) {
      // The tensors moved to another device: so do the table and the scalars
      // (the skipped-step count goes with them).
      if (scalars != nullptr) read_back(&skipped, &scalars->skipped_steps, sizeof(skipped));
      BIGBATCH_CUDA_CHECK(cudaFree(arena));
      BIGBATCH_CUDA_CHECK(cudaFree(scalars));
      arena = nullptr;
      arena_bytes = 0;
      scalars = nullptr;
    }
    device = current;
    bind_launches = 0;
    const std::size_t t = new_slots.size();
    std::vector<std::int64_t> chunk_start(t + 1, 0);
    for (std::size_t i = 0; i < t; ++i) {
      chunk_start[i + 1] = chunk_start[i] + (new_slots[i].numel + kChunk - 1) / kChunk;
    }
    const std::int64_t chunks = chunk_start[t];
    if (chunks > 0x7fffffff) throw std::runtime_error("bigbatch: more than 2^31 - 1 chunks in one CUDA step");
    std::vector<std::int32_t> chunk_tensor(static_cast<std::size_t>(chunks));
    for (std::size_t i = 0; i < t; ++i) {
      std::fill(chunk_tensor.begin() + chunk_start[i], chunk_tensor.begin() + chunk_start[i + 1],
                static_cast<std::int32_t>(i));
    }

    // One allocation, carved in this order.
    const std::size_t sizes[] = {
        round_up(t * sizeof(Slot)),          round_up(t * sizeof(void*)),
        round_up((t + 1) * sizeof(std::int64_t)), round_up(num_groups * sizeof(GroupOptions)),
        round_up(2 * chunks * sizeof(double)), round_up(2 * t * sizeof(double)),
        round_up(t * sizeof(float)),         round_up(t * sizeof(std::int64_t)),
        round_up(num_groups * sizeof(float)), round_up(chunks * sizeof(std::int32_t))};
    std::size_t total = 0;
    for (const std::size_t size : sizes) total += size;
    if (total > arena_bytes) {
      if (arena != nullptr) BIGBATCH_CUDA_CHECK(cudaFree(arena));
      arena = nullptr;
      BIGBATCH_CUDA_CHECK(cudaMalloc(&arena, total));
      arena_bytes = total;
    }
    if (scalars == nullptr) {
      BIGBATCH_CUDA_CHECK(cudaMalloc(&scalars, sizeof(Scalars)));
      const Scalars initial{0, 0u, skipped};
      bind_launches += upload(scalars, &initial, sizeof(initial), stream);
    }
    auto* base = static_cast<unsigned char*>(arena);
    std::size_t offset = 0;
    auto carve = [&](std::size_t index) {
      void* p = base + offset;
      offset += sizes[index];
      return p;
    };
    table = Table{};
    auto* dev_slots = static_cast<Slot*>(carve(0));
    auto* dev_grads = static_cast<const void**>(carve(1));
    auto* dev_chunk_start = static_cast<std::int64_t*>(carve(2));
    auto* dev_groups = static_cast<GroupOptions*>(carve(3));
    table.slots = dev_slots;
    table.grads = dev_grads;
    table.chunk_start = dev_chunk_start;
    table.groups = dev_groups;
    table.partial = static_cast<double*>(carve(4));
    table.sums = static_cast<double*>(carve(5));
    table.coef = static_cast<float*>(carve(6));
    table.steps = static_cast<std::int64_t*>(carve(7));
    table.group_scale = static_cast<float*>(carve(8));
    auto* dev_chunk_tensor = static_cast<std::int32_t*>(carve(9));
    table.chunk_tensor = dev_chunk_tensor;
    table.scalars = scalars;
    table.num_tensors = static_cast<int>(t);
    table.num_groups = static_cast<int>(num_groups);
    table.num_chunks = chunks;

    std::vector<Slot> host_slots(t);
    std::vector<const void*> grads(t);
    std::vector<std::int64_t> steps(t);
    for (std::size_t i = 0; i < t; ++i) {
      const TensorSlot& slot = new_slots[i];
      host_slots[i] = Slot{slot.param, slot.master, slot.m, slot.v, slot.numel, slot.group, slot.dtype};
      grads[i] = slot.grad;
      steps[i] = slot.step;
    }
    bind_launches += upload(dev_slots, host_slots, stream);
    bind_launches += upload(dev_grads, grads, stream);
    bind_launches += upload(dev_chunk_start, chunk_start, stream);
    bind_launches += upload(dev_chunk_tensor, chunk_tensor, stream);
    bind_launches += upload(table.steps, steps, stream);
    bind_launches += upload(table.group_scale, std::vector<float>(num_groups, 1.0f), stream);
    slots = new_slots;
    groups.clear();  // uploaded by bind()
  }

  static void check_not_capturing(cudaStream_t stream) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    BIGBATCH_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    if (capture != cudaStreamCaptureStatusNone) {
      throw std::runtime_error(
          "bigbatch: a CUDA graph captured an optimizer step whose tensors changed since the last "
          "step; run one step outside the capture first (its table is built then)");
    }
  }
};

MultiTensorStep::MultiTensorStep(Algorithm algorithm) : impl_(std::make_unique<Impl>()) {
  impl_->algorithm = algorithm;
}

MultiTensorStep::~MultiTensorStep() = default;

bool MultiTensorStep::same_tensors(const std::vector<TensorSlot>& slots) const {
  const auto& bound = impl_->slots;
  if (impl_->arena == nullptr && !slots.empty()) return false;
  return slots.size() == bound.size() && std::equal(slots.begin(), slots.end(), bound.begin(), same_tensor);
}

void MultiTensorStep::bind(const std::vector<TensorSlot>& slots, const std::vector<GroupOptions>& groups,
                           cudaStream_t stream) {
  Impl& d = *impl_;
  for (const TensorSlot& s : slots) {
    if (s.group < 0 || static_cast<std::size_t>(s.group) >= groups.size()) {
      throw std::invalid_argument("bigbatch: a tensor slot names group " + std::to_string(s.group) + " of " +
                                  std::to_string(groups.size()));
    }
  }
  d.bind_launches = 0;
  if (slots.empty()) {
    d.slots.clear();
    return;
  }
  int device = -1;
  BIGBATCH_CUDA_CHECK(cudaGetDevice(&device));
  const bool rebuild = !same_tensors(slots) || device != d.device ||
                       groups.size() != static_cast<std::size_t>(d.table.num_groups);
  if (rebuild) {
    d.rebuild(slots, groups.size(), stream);
  } else {
    // Gradients may be new tensors each step (zero_grad(set_to_none)): send the moved pointers.
    bool moved = false;
    for (std::size_t i = 0; i < slots.size() && !moved; ++i) moved = slots[i].grad != d.slots[i].grad;
    if (moved) {
      std::vector<const void*> grads(slots.size());
      for (std::size_t i = 0; i < slots.size(); ++i) {
        grads[i] = slots[i].grad;
        d.slots[i].grad = slots[i].grad;
      }
      d.bind_launches += upload(const_cast<const void**>(d.table.grads), grads, stream);
    }
  }
  if (groups != d.groups) {
    d.bind_launches += upload(const_cast<GroupOptions*>(d.table.groups), groups, stream);
    d.groups = groups;
    d.launch.check_skip = std::any_of(groups.begin(), groups.end(),
                                      [](const GroupOptions& o) { return (o.flags & kSkipNonfinite) != 0; });
    d.launch.clip = std::any_of(groups.begin(), groups.end(),
                                [](const GroupOptions& o) { return o.max_grad_norm > 0; });
  }
  d.record(stream);
}

void MultiTensorStep::check_rebuild_allowed(cudaStream_t stream) const { Impl::check_not_capturing(stream); }

void MultiTensorStep::run(cudaStream_t stream) {
  Impl& d = *impl_;
  if (d.slots.empty()) return;
  switch (d.algorithm) {
    case Algorithm::kLars: run_lars_larc(d.table, d.launch, /*larc=*/false, stream); break;
    case Algorithm::kLarc: run_lars_larc(d.table, d.launch, /*larc=*/true, stream); break;
    case Algorithm::kLamb: run_lamb(d.table, d.launch, stream); break;
    case Algorithm::kNovoGrad: run_novograd(d.table, d.launch, stream); break;
  }
  d.record(stream);
}

std::vector<std::int64_t> MultiTensorStep::steps() const {
  const Impl& d = *impl_;
  std::vector<std::int64_t> out(d.slots.size());
  if (out.empty()) return out;
  d.read_back(out.data(), d.table.steps, out.size() * sizeof(std::int64_t));
  return out;
}

std::int64_t MultiTensorStep::skipped_steps() const {
  const Impl& d = *impl_;
  if (d.scalars == nullptr) return 0;
  long long skipped = 0;
  d.read_back(&skipped, &d.scalars->skipped_steps, sizeof(skipped));
  return skipped;
}

namespace {
std::vector<PassArrays> passes_of(Algorithm algorithm, const Launch& launch) {
  switch (algorithm) {
    case Algorithm::kLars:
    case Algorithm::kLarc: return lars_larc_passes(launch);
    case Algorithm::kLamb: return lamb_passes(launch);
    case Algorithm::kNovoGrad: return novograd_passes(launch);
  }
  return {};
}
}  // namespace

std::int64_t step_bytes_per_element(Algorithm algorithm, bool skip_nonfinite, bool clip, DType dtype,
                                    bool master) {
  std::int64_t bytes = 0;
  for (const PassArrays& pass : passes_of(algorithm, Launch{skip_nonfinite, clip})) {
    bytes += pass_bytes(pass, dtype, master);
  }
  return bytes;
}

int MultiTensorStep::launches_per_step() const {
  const Impl& d = *impl_;
  if (d.slots.empty()) return 0;
  const auto passes = passes_of(d.algorithm, d.launch);
  // Every pass but the last is followed by its finalize.
  return d.bind_launches + 2 * static_cast<int>(passes.size()) - 1;
}

std::int64_t MultiTensorStep::bytes_per_step() const {
  const Impl& d = *impl_;
  std::int64_t bytes = 0;
  for (const TensorSlot& s : d.slots) {
    bytes += s.numel * step_bytes_per_element(d.algorithm, d.launch.check_skip, d.launch.clip, s.dtype,
                                              s.master != nullptr);
  }
  return bytes;
}

}  // namespace bigbatch::kernels::cuda
