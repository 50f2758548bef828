// The CUDA surface bigbatch's device code uses, on the CPU (test-only): a
// SIMT executor runs every CUDA thread of a block as a fiber, so that the
// kernels of kernels/cuda compile with g++ and execute, barriers, warp
// shuffles and all, in CI machines without a GPU. Included instead of the
// CUDA headers where BIGBATCH_SIMT is defined (kernels/cuda/multi_tensor.cuh).
//
// What it models: threads, blocks (one at a time, in a seeded shuffled order;
// the threads of a block in a shuffled order between synchronization points),
// __syncthreads and __syncthreads_or, the 32-lane shuffles, shared memory
// (static storage: it keeps the previous block's values, like the real one
// keeps garbage), atomics, device memory (host memory), streams (the default
// stream runs at once; a created stream runs its work when someone waits for
// it), events, devices (allocations remember their device) and stream capture
// (as far as the errors it raises). Misuse (a barrier some thread of the
// block never reaches, a shuffle whose mask leaves out a lane that calls or
// is read) stops the launch with cudaErrorLaunchFailure and a message.
// What it cannot see is listed in docs/cuda.md.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// One block runs at a time, so static storage is the block's shared memory.
#define __shared__ static

struct dim3 {
  unsigned x = 1;
  unsigned y = 1;
  unsigned z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}  // NOLINT
};

typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorLaunchFailure = 719,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorCapturedEvent = 907,
};
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};
constexpr unsigned cudaEventDisableTiming = 2;
constexpr unsigned cudaStreamNonBlocking = 1;

// ------------------------------------------------------------ runtime API ----

const char* cudaGetErrorName(cudaError_t err);
const char* cudaGetErrorString(cudaError_t err);
cudaError_t cudaGetLastError();
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaMalloc(void** ptr, std::size_t bytes);
template <typename T>
cudaError_t cudaMalloc(T** ptr, std::size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(ptr), bytes);
}
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemsetAsync(void* dst, int value, std::size_t bytes, cudaStream_t stream = nullptr);
cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags = 0);
cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t event);

// --------------------------------------------------------- the executor ----

namespace bigbatch::simt {

/// Runs `body` as a grid of grid x block threads on `stream` (at once on the
/// default stream; queued on a created stream until someone waits for it).
void launch(dim3 grid, dim3 block, cudaStream_t stream, std::function<void()> body);

const dim3& thread_idx();
const dim3& block_idx();
const dim3& block_dim();
const dim3& grid_dim();
void syncthreads(const char* file, int line);
int syncthreads_or(int predicate, const char* file, int line);
std::uint64_t shfl_down(unsigned mask, std::uint64_t bits, unsigned delta, int width);

// Test controls and counters.
void set_seed(std::uint64_t seed);           ///< the block and thread order (default 1)
std::int64_t launches();                     ///< kernel launches so far, executed or queued
std::int64_t allocations_on(int device);     ///< live cudaMalloc blocks of a device
void set_capturing(cudaStream_t stream, bool capturing);  ///< pretend a graph capture
void set_device_count(int count);            ///< devices the runtime reports (default 2)

}  // namespace bigbatch::simt

#define threadIdx (::bigbatch::simt::thread_idx())
#define blockIdx (::bigbatch::simt::block_idx())
#define blockDim (::bigbatch::simt::block_dim())
#define gridDim (::bigbatch::simt::grid_dim())
#define __syncthreads() ::bigbatch::simt::syncthreads(__FILE__, __LINE__)
#define __syncthreads_or(p) ::bigbatch::simt::syncthreads_or((p), __FILE__, __LINE__)

template <typename T>
inline T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = 32) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffles move up to 8 bytes");
  std::uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = ::bigbatch::simt::shfl_down(mask, bits, delta, width);
  std::memcpy(&value, &bits, sizeof(T));
  return value;
}

// One block runs at a time and its threads switch only at synchronization
// points, so a read-modify-write is atomic as written.
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  const unsigned old = *p;
  *p = old + v;
  return old;
}
inline int atomicAdd(int* p, int v) {
  const int old = *p;
  *p = old + v;
  return old;
}
inline void __threadfence() {}
template <typename T>
inline T __ldcg(const T* p) {
  return *p;
}
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }

// ---------------------------------------------------------- 16-bit floats ----

struct __nv_bfloat16 {
  std::uint16_t bits;
};
struct __half {
  std::uint16_t bits;
};

inline float __bfloat162float(__nv_bfloat16 x) {
  const std::uint32_t u = static_cast<std::uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
/// Round to nearest even; NaN stays a (quiet) NaN of the same sign.
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return {static_cast<std::uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return {static_cast<std::uint16_t>(u >> 16)};
}
// GCC's _Float16 converts with IEEE round-to-nearest-even.
inline float __half2float(__half x) {
  _Float16 h;
  std::memcpy(&h, &x.bits, 2);
  return static_cast<float>(h);
}
inline __half __float2half_rn(float f) {
  const auto h = static_cast<_Float16>(f);
  __half x;
  std::memcpy(&x.bits, &h, 2);
  return x;
}
