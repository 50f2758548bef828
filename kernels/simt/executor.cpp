// The SIMT executor (kernels/simt/cuda.h): each CUDA thread of a block is a
// Boost.Context fiber with its own stack; a scheduler runs the runnable ones
// (in a seeded shuffled order) until each waits at a synchronization point,
// then releases whole barriers and whole warps, and reports misuse when
// nothing can be released. Blocks run one at a time, in a shuffled order.
// Device memory is host memory; runtime calls are synchronous except on
// created streams, whose work waits in a queue until someone waits for it.
#include "cuda.h"

#include <boost/context/fiber.hpp>

#include <sys/mman.h>

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif

namespace ctx = boost::context;

#if defined(__SANITIZE_ADDRESS__)
// The tests link LibTorch, whose allocations at exit are not ours to judge.
extern "C" const char* __asan_default_options() { return "detect_leaks=0"; }
#endif

namespace bigbatch::simt {
namespace {

// ------------------------------------------------------------------ state ----

struct Stream {
  std::deque<std::function<void()>> queue;  // not yet run
  std::int64_t enqueued = 0;
  std::int64_t executed = 0;
  bool capturing = false;
  bool blocking = true;  // the legacy default stream's synchronous calls wait for it
};

struct Event {
  Stream* stream = nullptr;  // null: recorded on the default stream (already complete)
  std::int64_t position = 0; // the stream's enqueued count at the record
  bool captured = false;     // last recorded in a capturing stream
};

struct Runtime {
  std::recursive_mutex mutex;
  cudaError_t last_error = cudaSuccess;
  std::string last_message;
  int device_count = 2;
  int device = 0;
  std::map<void*, int> allocations;  // pointer -> device
  std::set<Stream*> streams;
  Stream default_stream;             // runs at once; only its capture flag is used
  std::uint64_t seed = 1;
  std::int64_t launches = 0;
};

Runtime& runtime() {
  static Runtime r;
  return r;
}

Stream* stream_of(cudaStream_t s) {
  return s == nullptr ? &runtime().default_stream : reinterpret_cast<Stream*>(s);
}

cudaError_t fail(cudaError_t err, std::string message) {
  Runtime& r = runtime();
  r.last_error = err;
  r.last_message = std::move(message);
  return err;
}

// Runs (or queues, on a created stream) one unit of stream work.
cudaError_t submit(cudaStream_t s, std::function<void()> work) {
  Stream* stream = stream_of(s);
  if (stream->capturing) return cudaSuccess;  // recorded into the graph, not run
  if (s == nullptr) {
    work();
    return cudaSuccess;
  }
  stream->queue.push_back(std::move(work));
  ++stream->enqueued;
  return cudaSuccess;
}

void flush(Stream* stream, std::int64_t upto) {
  while (stream->executed < upto && !stream->queue.empty()) {
    auto work = std::move(stream->queue.front());
    stream->queue.pop_front();
    ++stream->executed;
    work();
  }
}

// ---------------------------------------------------------------- threads ----

constexpr std::size_t kStackBytes = 256 * 1024;
constexpr unsigned kMaxThreads = 1024;

enum class Wait : std::uint8_t { kRunning, kBarrier, kBarrierOr, kWarp, kBlockEnd, kExited };

struct Abort {};  // unwinds a thread's stack when its launch is abandoned

struct Thread {
  dim3 idx;
  unsigned linear = 0;
  ctx::fiber self;   // resumes this thread
  ctx::fiber sched;  // resumes the scheduler
  Wait wait = Wait::kRunning;
  const char* file = nullptr;  // the barrier's site
  int line = 0;
  int predicate = 0;
  unsigned mask = 0;
  unsigned delta = 0;
  int width = 32;
  std::uint64_t value = 0;
  std::uint64_t result = 0;
  void* fake_stack = nullptr;  // ASan's, while switched away
  char* stack = nullptr;
};

// Fiber stacks, mapped once and reused (untouched pages cost nothing).
char* stacks() {
  static char* base = [] {
    void* p = mmap(nullptr, kStackBytes * kMaxThreads, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("simt: cannot map fiber stacks");
    return static_cast<char*>(p);
  }();
  return base;
}

struct NoDeallocation {
  void deallocate(ctx::stack_context&) noexcept {}
};

struct Grid {
  dim3 grid;
  dim3 block;
  dim3 block_idx;
  std::function<void()> body;
  std::vector<Thread> threads;
  bool done = false;
  bool abort = false;
  std::string error;
  const void* main_bottom = nullptr;  // the scheduler's stack, for ASan
  std::size_t main_size = 0;
  void* main_fake_stack = nullptr;
};

// Plain globals, not thread_local (a TLS lookup per call costs more than the
// switch): launches hold the runtime's mutex, so one grid runs at a time.
Grid* g_grid = nullptr;
Thread* g_thread = nullptr;

// A small, fast generator for the orders (xorshift64*): a fresh order every
// round must cost less than the round itself.
struct Rng {
  std::uint64_t state;
  std::uint64_t next() {
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return state * 0x2545f4914f6cdd1dull;
  }
  template <typename It>
  void shuffle(It first, It last) {
    for (auto n = last - first; n > 1; --n) std::swap(first[n - 1], first[next() % static_cast<std::uint64_t>(n)]);
  }
};

// ASan must be told about every stack switch, or it reports the fibers' frames.
void switch_start(void** fake_save, const void* bottom, std::size_t size) {
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_start_switch_fiber(fake_save, bottom, size);
#else
  (void)fake_save, (void)bottom, (void)size;
#endif
}
void switch_finish(void* fake_save, const void** bottom_old, std::size_t* size_old) {
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_finish_switch_fiber(fake_save, bottom_old, size_old);
#else
  (void)fake_save, (void)bottom_old, (void)size_old;
#endif
}

Thread& current_thread() {
  if (g_thread == nullptr) throw std::logic_error("simt: a device function was called outside a kernel");
  return *g_thread;
}

// The running thread gives control back to the scheduler.
void yield(Thread& t) {
  Grid& grid = *g_grid;
  switch_start(&t.fake_stack, grid.main_bottom, grid.main_size);
  t.sched = std::move(t.sched).resume();
  switch_finish(t.fake_stack, nullptr, nullptr);
  if (grid.abort) throw Abort{};
}

// The scheduler runs thread t until it waits or exits.
void resume(Grid& grid, Thread& t) {
  g_thread = &t;
  t.wait = Wait::kRunning;
  switch_start(&grid.main_fake_stack, t.stack, kStackBytes);
  t.self = std::move(t.self).resume();
  switch_finish(grid.main_fake_stack, nullptr, nullptr);
  g_thread = nullptr;
}

void start_thread(Grid& grid, Thread& t) {
  t.self = ctx::fiber(std::allocator_arg, ctx::preallocated(t.stack + kStackBytes, kStackBytes,
                                                           ctx::stack_context{kStackBytes, t.stack + kStackBytes}),
                      NoDeallocation{}, [&grid, &t](ctx::fiber&& sched) {
                        t.sched = std::move(sched);
                        switch_finish(nullptr, &grid.main_bottom, &grid.main_size);
                        try {
                          while (!grid.done && !grid.abort) {
                            try {
                              grid.body();
                            } catch (const std::exception& e) {
                              if (grid.error.empty()) grid.error = std::string("a thread threw: ") + e.what();
                            }
                            t.wait = Wait::kBlockEnd;
                            yield(t);
                          }
                        } catch (const Abort&) {
                        }
                        t.wait = Wait::kExited;
                        switch_start(nullptr, grid.main_bottom, grid.main_size);
                        return std::move(t.sched);
                      });
}

std::string where(const Grid& grid, const Thread& t) {
  return "block " + std::to_string(grid.block_idx.x) + ", thread " + std::to_string(t.linear);
}

// Releases the warps whose every lane in the mask waits at a shuffle with that
// mask. Returns whether one was released; sets grid.error on misuse.
bool release_warps(Grid& grid) {
  bool released = false;
  const unsigned n = static_cast<unsigned>(grid.threads.size());
  for (unsigned base = 0; base < n; base += 32) {
    const unsigned lanes = std::min(32u, n - base);
    int first = -1;
    for (unsigned l = 0; l < lanes; ++l) {
      if (grid.threads[base + l].wait == Wait::kWarp) {
        first = static_cast<int>(l);
        break;
      }
    }
    if (first < 0) continue;
    const unsigned mask = grid.threads[base + first].mask;
    bool ready = true;
    for (unsigned l = 0; l < lanes; ++l) {
      const Thread& t = grid.threads[base + l];
      const bool in_mask = (mask >> l) & 1u;
      if (t.wait == Wait::kWarp && !((t.mask >> l) & 1u)) {
        grid.error = where(grid, t) + ": lane " + std::to_string(l) + " calls a shuffle whose mask " +
                     std::to_string(t.mask) + " leaves it out";
        return false;
      }
      if (t.wait == Wait::kWarp && t.mask != mask) {
        grid.error = where(grid, t) + ": lanes of one warp shuffle with different masks";
        return false;
      }
      if (in_mask && t.wait != Wait::kWarp) ready = false;
    }
    for (unsigned l = lanes; l < 32; ++l) {
      if ((mask >> l) & 1u) {
        grid.error = where(grid, grid.threads[base + first]) + ": shuffle mask names lane " +
                     std::to_string(l) + ", which does not exist";
        return false;
      }
    }
    if (!ready) continue;
    for (unsigned l = 0; l < lanes; ++l) {
      Thread& t = grid.threads[base + l];
      if (!((mask >> l) & 1u)) continue;
      const unsigned segment = l / static_cast<unsigned>(t.width) * static_cast<unsigned>(t.width);
      const unsigned src = l + t.delta;
      if (src >= segment + static_cast<unsigned>(t.width) || src >= lanes) {
        t.result = t.value;  // no lane that far down: the caller's own value
      } else if (!((mask >> src) & 1u)) {
        grid.error = where(grid, t) + ": shuffle reads lane " + std::to_string(src) + ", not in the mask";
        return false;
      } else {
        t.result = grid.threads[base + src].value;
      }
    }
    for (unsigned l = 0; l < lanes; ++l) {
      if ((mask >> l) & 1u) grid.threads[base + l].wait = Wait::kRunning;
    }
    released = true;
  }
  return released;
}

// Releases the block barrier when every thread waits at the same one.
bool release_barrier(Grid& grid) {
  const Thread* at = nullptr;
  for (const Thread& t : grid.threads) {
    if (t.wait == Wait::kBarrier || t.wait == Wait::kBarrierOr) {
      at = &t;
      break;
    }
  }
  if (at == nullptr) return false;
  int any = 0;
  for (const Thread& t : grid.threads) {
    if (t.wait == Wait::kWarp) return false;  // warps may still get there
    if (t.wait == Wait::kBlockEnd) {
      grid.error = where(grid, t) + " returned while others wait at the barrier at " + at->file + ":" +
                   std::to_string(at->line) + " (a barrier not every thread of the block reaches)";
      return false;
    }
    if (t.wait != at->wait || t.line != at->line || (t.file != at->file && std::strcmp(t.file, at->file) != 0)) {
      grid.error = where(grid, t) + " waits at " + (t.file ? t.file : "?") + ":" + std::to_string(t.line) +
                   " while thread " + std::to_string(at->linear) + " waits at " + at->file + ":" +
                   std::to_string(at->line);
      return false;
    }
    any |= t.predicate;
  }
  for (Thread& t : grid.threads) {
    t.result = static_cast<std::uint64_t>(any != 0);
    t.wait = Wait::kRunning;
  }
  return true;
}

// Runs one block to its end. Returns false on misuse (grid.error says which).
bool run_block(Grid& grid, Rng& rng) {
  std::vector<unsigned> order(grid.threads.size());
  std::iota(order.begin(), order.end(), 0u);
  for (Thread& t : grid.threads) t.wait = Wait::kRunning;
  for (;;) {
    rng.shuffle(order.begin(), order.end());
    for (const unsigned i : order) {
      if (grid.threads[i].wait == Wait::kRunning) resume(grid, grid.threads[i]);
      if (!grid.error.empty()) return false;
    }
    if (std::all_of(grid.threads.begin(), grid.threads.end(),
                    [](const Thread& t) { return t.wait == Wait::kBlockEnd; })) {
      return true;
    }
    const bool warps = release_warps(grid);
    if (!grid.error.empty()) return false;
    const bool barrier = !warps && release_barrier(grid);
    if (!grid.error.empty()) return false;
    if (!warps && !barrier) {
      for (const Thread& t : grid.threads) {
        if (t.wait == Wait::kWarp) {
          grid.error = where(grid, t) + ": a shuffle waits for a lane of its mask that never arrives";
          return false;
        }
      }
      grid.error = "deadlock in block " + std::to_string(grid.block_idx.x);
      return false;
    }
  }
}

void run_grid(dim3 grid_dim, dim3 block_dim, const std::function<void()>& body) {
  Runtime& r = runtime();
  const std::uint64_t threads = std::uint64_t{block_dim.x} * block_dim.y * block_dim.z;
  const std::uint64_t blocks = std::uint64_t{grid_dim.x} * grid_dim.y * grid_dim.z;
  if (threads == 0 || threads > kMaxThreads || blocks == 0) {
    fail(cudaErrorInvalidValue, "simt: a launch of " + std::to_string(blocks) + " blocks of " +
                                    std::to_string(threads) + " threads");
    return;
  }
  if (block_dim.y != 1 || block_dim.z != 1 || grid_dim.y != 1 || grid_dim.z != 1) {
    fail(cudaErrorInvalidValue, "simt: only one-dimensional grids and blocks are modelled");
    return;
  }
  Grid grid;
  grid.grid = grid_dim;
  grid.block = block_dim;
  grid.body = body;
  grid.threads.resize(threads);
  for (unsigned i = 0; i < threads; ++i) {
    grid.threads[i].idx = dim3(i);
    grid.threads[i].linear = i;
    grid.threads[i].stack = stacks() + std::size_t{i} * kStackBytes;
  }
  Grid* const outer = g_grid;
  if (outer != nullptr) throw std::logic_error("simt: a kernel launched from device code");
  g_grid = &grid;
  for (Thread& t : grid.threads) start_thread(grid, t);

  Rng rng{(r.seed ^ (0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(r.launches + 1))) | 1u};
  std::vector<unsigned> order(blocks);
  std::iota(order.begin(), order.end(), 0u);
  rng.shuffle(order.begin(), order.end());
  bool ok = true;
  for (const unsigned b : order) {
    grid.block_idx = dim3(b);
    if (!run_block(grid, rng)) {
      ok = false;
      break;
    }
  }
  // Let every fiber return: normally from its block loop, else by unwinding.
  if (ok) {
    grid.done = true;
  } else {
    grid.abort = true;
  }
  for (Thread& t : grid.threads) {
    if (t.wait != Wait::kExited && t.self) resume(grid, t);
  }
  g_grid = outer;
  if (!ok) fail(cudaErrorLaunchFailure, "simt: " + grid.error);
}

}  // namespace

// ------------------------------------------------------------ device side ----

void launch(dim3 grid, dim3 block, cudaStream_t stream, std::function<void()> body) {
  Runtime& r = runtime();
  const std::lock_guard<std::recursive_mutex> lock(r.mutex);
  ++r.launches;
  submit(stream, [grid, block, body = std::move(body)] { run_grid(grid, block, body); });
}

const dim3& thread_idx() { return current_thread().idx; }
const dim3& block_idx() { return g_grid->block_idx; }
const dim3& block_dim() { return g_grid->block; }
const dim3& grid_dim() { return g_grid->grid; }

void syncthreads(const char* file, int line) {
  Thread& t = current_thread();
  t.wait = Wait::kBarrier;
  t.file = file;
  t.line = line;
  t.predicate = 0;
  yield(t);
}

int syncthreads_or(int predicate, const char* file, int line) {
  Thread& t = current_thread();
  t.wait = Wait::kBarrierOr;
  t.file = file;
  t.line = line;
  t.predicate = predicate != 0;
  yield(t);
  return static_cast<int>(t.result);
}

std::uint64_t shfl_down(unsigned mask, std::uint64_t bits, unsigned delta, int width) {
  Thread& t = current_thread();
  if (width <= 0 || width > 32 || (width & (width - 1)) != 0) {
    throw std::invalid_argument("simt: shuffle width " + std::to_string(width));
  }
  t.wait = Wait::kWarp;
  t.mask = mask;
  t.value = bits;
  t.delta = delta;
  t.width = width;
  yield(t);
  return t.result;
}

void set_seed(std::uint64_t seed) { runtime().seed = seed; }
std::int64_t launches() { return runtime().launches; }
std::int64_t allocations_on(int device) {
  const auto& a = runtime().allocations;
  return std::count_if(a.begin(), a.end(), [&](const auto& kv) { return kv.second == device; });
}
void set_capturing(cudaStream_t stream, bool capturing) { stream_of(stream)->capturing = capturing; }
void set_device_count(int count) { runtime().device_count = count; }

}  // namespace bigbatch::simt

// ------------------------------------------------------------ runtime API ----

using bigbatch::simt::fail;
using bigbatch::simt::runtime;
using bigbatch::simt::stream_of;
using bigbatch::simt::submit;

namespace {

const char* error_name(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorCapturedEvent: return "cudaErrorCapturedEvent";
  }
  return "cudaErrorUnknown";
}

// A synchronous call while `stream` captures invalidates the capture, as CUDA does.
cudaError_t refuse_if_capturing(cudaStream_t stream, const char* call) {
  auto* s = stream_of(stream);
  if (!s->capturing) return cudaSuccess;
  return fail(cudaErrorStreamCaptureUnsupported, std::string("simt: ") + call + " while the stream is captured");
}

}  // namespace

const char* cudaGetErrorName(cudaError_t err) { return error_name(err); }

const char* cudaGetErrorString(cudaError_t err) {
  auto& r = runtime();
  if (err != cudaSuccess && !r.last_message.empty()) return r.last_message.c_str();
  return error_name(err);
}

cudaError_t cudaGetLastError() {
  auto& r = runtime();
  const cudaError_t err = r.last_error;
  r.last_error = cudaSuccess;
  return err;
}

cudaError_t cudaGetDeviceCount(int* count) {
  *count = runtime().device_count;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  *device = runtime().device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  auto& r = runtime();
  if (device < 0 || device >= r.device_count) return fail(cudaErrorInvalidDevice, "simt: no device " + std::to_string(device));
  r.device = device;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  auto& r = runtime();
  const std::lock_guard<std::recursive_mutex> lock(r.mutex);
  for (auto* s : r.streams) bigbatch::simt::flush(s, s->enqueued);
  return r.last_error;
}

cudaError_t cudaMalloc(void** ptr, std::size_t bytes) {
  auto& r = runtime();
  *ptr = std::aligned_alloc(256, (std::max<std::size_t>(bytes, 1) + 255) / 256 * 256);
  if (*ptr == nullptr) return fail(cudaErrorMemoryAllocation, "simt: cudaMalloc of " + std::to_string(bytes));
  r.allocations[*ptr] = r.device;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  auto& r = runtime();
  if (r.allocations.erase(ptr) == 0) return fail(cudaErrorInvalidValue, "simt: cudaFree of an unknown pointer");
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind) {
  if (const cudaError_t err = refuse_if_capturing(nullptr, "cudaMemcpy"); err != cudaSuccess) return err;
  // On the legacy default stream: it waits for the blocking streams, not for
  // those created cudaStreamNonBlocking (as LibTorch creates its streams).
  auto& r = runtime();
  const std::lock_guard<std::recursive_mutex> lock(r.mutex);
  for (auto* s : r.streams) {
    if (s->blocking) bigbatch::simt::flush(s, s->enqueued);
  }
  if (r.last_error != cudaSuccess) return r.last_error;
  std::memcpy(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (kind == cudaMemcpyDeviceToHost) {
    // Pageable host memory: not capturable.
    if (const cudaError_t err = refuse_if_capturing(stream, "cudaMemcpyAsync to host"); err != cudaSuccess) return err;
  }
  return submit(stream, [=] { std::memcpy(dst, src, bytes); });
}

cudaError_t cudaMemsetAsync(void* dst, int value, std::size_t bytes, cudaStream_t stream) {
  return submit(stream, [=] { std::memset(dst, value, bytes); });
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, 0); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  auto* s = new bigbatch::simt::Stream;
  s->blocking = (flags & cudaStreamNonBlocking) == 0;
  runtime().streams.insert(s);
  *stream = reinterpret_cast<cudaStream_t>(s);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (stream == nullptr) return cudaSuccess;
  auto* s = stream_of(stream);
  bigbatch::simt::flush(s, s->enqueued);
  runtime().streams.erase(s);
  delete s;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (const cudaError_t err = refuse_if_capturing(stream, "cudaStreamSynchronize"); err != cudaSuccess) return err;
  auto& r = runtime();
  const std::lock_guard<std::recursive_mutex> lock(r.mutex);
  if (stream != nullptr) bigbatch::simt::flush(stream_of(stream), stream_of(stream)->enqueued);
  return r.last_error;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  *status = stream_of(stream)->capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned) {
  *event = reinterpret_cast<cudaEvent_t>(new bigbatch::simt::Event);
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete reinterpret_cast<bigbatch::simt::Event*>(event);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  auto* e = reinterpret_cast<bigbatch::simt::Event*>(event);
  e->captured = stream_of(stream)->capturing;
  e->stream = stream == nullptr ? nullptr : stream_of(stream);
  e->position = stream == nullptr ? 0 : stream_of(stream)->enqueued;
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  auto* e = reinterpret_cast<bigbatch::simt::Event*>(event);
  if (e->captured) return fail(cudaErrorCapturedEvent, "simt: waiting on an event last recorded in a capture");
  auto& r = runtime();
  const std::lock_guard<std::recursive_mutex> lock(r.mutex);
  if (e->stream != nullptr && r.streams.count(e->stream) != 0) bigbatch::simt::flush(e->stream, e->position);
  return r.last_error;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned) {
  // Ordering the waiting stream after the event: run the event's work now.
  if (stream_of(stream)->capturing) return cudaSuccess;
  return cudaEventSynchronize(event);
}
