// The CUDA runner's device side (apex's multi_tensor_apply, with a device
// table instead of kernel-argument lists): chunks of 16384 elements, one block
// each; dtype dispatch; one element loop (16-byte vector path for aligned
// tensors, scalar path otherwise); the deterministic per-chunk and per-tensor
// sums; the last-block finalize; and the runner that launches a plan
// (kernels/plan.h) pass by pass.
#pragma once

#include "../engine.h"
#include "../plan.h"

#if defined(BIGBATCH_SIMT)
#include "../simt/cuda.h"  // the device code on the CPU executor (tests)
#include <math.h>
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif

#include <cstdint>

namespace bigbatch::kernels::cuda {

/// Throws std::runtime_error naming the call, file and line when err is not cudaSuccess.
void check(cudaError_t err, const char* call, const char* file, int line);
#define BIGBATCH_CUDA_CHECK(call) ::bigbatch::kernels::cuda::check((call), #call, __FILE__, __LINE__)

constexpr int kThreads = 256;                // every kernel here: block_sum needs it fixed
constexpr int kWarps = kThreads / 32;
constexpr std::int64_t kChunk = kChunkElements;  // elements per block (a multiple of 4)

/// Uploads host bytes to the device by kernel arguments, ordered on `stream`
/// (multi_tensor.cu). Returns the number of kernels it launched.
int upload(void* dst, const void* src, std::size_t bytes, cudaStream_t stream);

// ------------------------------------------------------------ device side ----
// Compiled by nvcc, and by g++ against the SIMT executor (BIGBATCH_SIMT).

#if defined(__CUDACC__) || defined(BIGBATCH_SIMT)

/// The one place a kernel is launched: `<<<>>>` under nvcc, the executor under BIGBATCH_SIMT.
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, const Args&... args) {
#if defined(__CUDACC__)
  kernel<<<grid, block, 0, stream>>>(args...);
#else
  simt::launch(grid, block, stream, [kernel, args...] { kernel(args...); });
#endif
}

__device__ inline float to_float(float x) { return x; }
__device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline float to_float(__half x) { return __half2float(x); }

template <typename T>
__device__ inline T from_float(float x);
template <>
__device__ inline float from_float<float>(float x) { return x; }
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ inline __half from_float<__half>(float x) { return __float2half_rn(x); }

/// Four elements in one 8- or 16-byte access.
template <typename T>
struct alignas(4 * sizeof(T)) Pack4 {
  T x[4];
};

template <typename T>
__device__ inline void load4(const T* p, float (&out)[4]) {
  const Pack4<T> pack = *reinterpret_cast<const Pack4<T>*>(p);
#pragma unroll
  for (int k = 0; k < 4; ++k) out[k] = to_float(pack.x[k]);
}

template <typename T>
__device__ inline void store4(T* p, const float (&in)[4]) {
  Pack4<T> pack;
#pragma unroll
  for (int k = 0; k < 4; ++k) pack.x[k] = from_float<T>(in[k]);
  *reinterpret_cast<Pack4<T>*>(p) = pack;
}

/// acc[k] += sq[k]^2 in double: a sum of squares is finite iff every value is.
__device__ inline void add_squares(const float (&sq)[2], double (&acc)[2]) {
  acc[0] += static_cast<double>(sq[0]) * sq[0];
  acc[1] += static_cast<double>(sq[1]) * sq[1];
}

__device__ inline bool aligned_to(const void* p, std::uintptr_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

/// Applies op(p, g, m, v, sq) to elements [begin, end) of one tensor, adding
/// the squares of the two sq values to acc in double (kReduce), with
/// `kRead` loaded and `.write` stored. p is the master copy when
/// the tensor has one (and then both copies are written). The vector path
/// needs every array it touches aligned to its 4-element access; chunks start
/// at multiples of 4 elements, so one test per block decides.
template <unsigned kRead, unsigned kWrite, bool kReduce, typename T, typename Op>
__device__ void for_each_element(const Slot& s, const void* grad_ptr, std::int64_t begin,
                                 std::int64_t end, const Op& op, double (&acc)[2]) {
  T* param = static_cast<T*>(s.param);
  const T* grad = static_cast<const T*>(grad_ptr);
  float* master = s.master;
  float* m = s.m;
  float* v = s.v;
  constexpr unsigned kTouch = kRead | kWrite;
  bool vec = true;
  if (kTouch & kParam) {
    vec = vec && aligned_to(param + begin, 4 * sizeof(T)) &&
          (master == nullptr || aligned_to(master + begin, 16));
  }
  if (kTouch & kGrad) vec = vec && aligned_to(grad + begin, 4 * sizeof(T));
  if (kTouch & kM) vec = vec && aligned_to(m + begin, 16);
  if (kTouch & kV) vec = vec && aligned_to(v + begin, 16);

  const std::int64_t vec_end = vec ? begin + ((end - begin) & ~std::int64_t{3}) : begin;
  for (std::int64_t i = begin + 4 * threadIdx.x; i < vec_end; i += 4 * blockDim.x) {
    float p[4] = {0, 0, 0, 0}, g[4] = {0, 0, 0, 0}, mm[4] = {0, 0, 0, 0}, vv[4] = {0, 0, 0, 0};
    if (kRead & kParam) {
      if (master != nullptr) {
        load4(master + i, p);
      } else {
        load4(param + i, p);
      }
    }
    if (kRead & kGrad) load4(grad + i, g);
    if (kRead & kM) load4(m + i, mm);
    if (kRead & kV) load4(v + i, vv);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float sq[2] = {0, 0};
      op(p[k], g[k], mm[k], vv[k], sq);
      if (kReduce) add_squares(sq, acc);
    }
    if (kWrite & kParam) {
      if (master != nullptr) store4(master + i, p);
      store4(param + i, p);
    }
    if (kWrite & kM) store4(m + i, mm);
    if (kWrite & kV) store4(v + i, vv);
  }
  // The scalar path: a misaligned tensor, or the last n % 4 elements.
  for (std::int64_t i = vec_end + threadIdx.x; i < end; i += blockDim.x) {
    float p = 0, g = 0, mm = 0, vv = 0;
    if (kRead & kParam) p = master != nullptr ? master[i] : to_float(param[i]);
    if (kRead & kGrad) g = to_float(grad[i]);
    if (kRead & kM) mm = m[i];
    if (kRead & kV) vv = v[i];
    float sq[2] = {0, 0};
    op(p, g, mm, vv, sq);
    if (kReduce) add_squares(sq, acc);
    if (kWrite & kParam) {
      if (master != nullptr) master[i] = p;
      param[i] = from_float<T>(p);
    }
    if (kWrite & kM) m[i] = mm;
    if (kWrite & kV) v[i] = vv;
  }
}

/// Sums a and b over the block in a fixed tree (the same bits every run):
/// warp shuffles, then thread 0 adds the warps' sums in order. The results
/// are valid in thread 0 only. The block must be kThreads wide.
__device__ inline void block_sums_to_thread0(double& a, double& b) {
  __shared__ double warp_sums[2][kWarps];
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    a += __shfl_down_sync(0xffffffffu, a, offset);
    b += __shfl_down_sync(0xffffffffu, b, offset);
  }
  if (threadIdx.x % 32 == 0) {
    warp_sums[0][threadIdx.x / 32] = a;
    warp_sums[1][threadIdx.x / 32] = b;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    a = 0;
    b = 0;
    for (int w = 0; w < kWarps; ++w) {
      a += warp_sums[0][w];
      b += warp_sums[1][w];
    }
  }
}

/// Sums one double over the block in the tree of block_sums_to_thread0; the
/// result is valid in every thread.
__device__ inline double block_sum(double x) {
  __shared__ double total;
  double unused = 0;
  block_sums_to_thread0(x, unused);
  if (threadIdx.x == 0) total = x;
  __syncthreads();
  const double result = total;
  __syncthreads();  // total and the warp sums may be reused by the next call
  return result;
}

/// The element kernel of a pass (kernels/plan.h): one block per chunk. With
/// Pass::kReduce each chunk's two sums go to table.partial.
template <typename Group, typename Pass>
__global__ void __launch_bounds__(kThreads) chunk_kernel(Table<Group> table, Pass pass) {
  if (pass.check_skip && table.scalars->skip) return;  // the step was abandoned
  const std::int64_t chunk = blockIdx.x;
  const int t = table.chunk_tensor[chunk];
  const Slot s = table.slots[t];
  const std::int64_t begin = (chunk - table.chunk_start[t]) * kChunk;
  const std::int64_t end = begin + kChunk < s.numel ? begin + kChunk : s.numel;
  // The tensor's coefficients (LAMB's bias corrections: two fp64 pow) are
  // worked out once per block by thread 0 and read by all from shared memory.
  using Op = decltype(pass.element_op(table, t, s));
  __shared__ __align__(16) unsigned char op_bytes[sizeof(Op)];
  if (threadIdx.x == 0) {
    const Op first = pass.element_op(table, t, s);
    memcpy(op_bytes, &first, sizeof(Op));
  }
  __syncthreads();
  Op op;
  memcpy(&op, op_bytes, sizeof(Op));
  double acc[2] = {0, 0};
  constexpr unsigned kRead = Pass::kArrays.read;
  constexpr unsigned kWrite = Pass::kArrays.write;
  switch (s.dtype) {
    case DType::kFloat32:
      for_each_element<kRead, kWrite, Pass::kReduce, float>(s, table.grads[t], begin, end, op, acc);
      break;
    case DType::kBFloat16:
      for_each_element<kRead, kWrite, Pass::kReduce, __nv_bfloat16>(s, table.grads[t], begin, end, op, acc);
      break;
    case DType::kFloat16:
      for_each_element<kRead, kWrite, Pass::kReduce, __half>(s, table.grads[t], begin, end, op, acc);
      break;
  }
  if constexpr (Pass::kReduce) {
    block_sums_to_thread0(acc[0], acc[1]);
    if (threadIdx.x == 0) {
      table.partial[2 * chunk] = acc[0];
      table.partial[2 * chunk + 1] = acc[1];
    }
  }
}

/// The finalizer's view of a block: its threads visit the tensors in turn.
struct DeviceBlock {
  __device__ int first() const { return threadIdx.x; }
  __device__ int stride() const { return kThreads; }
  __device__ bool any(bool x) const { return __syncthreads_or(x) != 0; }
  __device__ double sum(double x) const { return block_sum(x); }
  __device__ bool leader() const { return threadIdx.x == 0; }
  /// Read past L1: other blocks wrote the sums.
  __device__ double read(const double* p) const { return __ldcg(p); }
};

/// Finalize: every warp adds one tensor's chunk sums in chunk order into
/// table.sums; then the last block to finish runs fin(table, block) (whole
/// block), which makes the step-wide decisions and the per-tensor
/// coefficients. Deterministic: each sum has a fixed order, whatever the scheduling.
template <typename Group, typename Fin>
__global__ void __launch_bounds__(kThreads) finalize_kernel(Table<Group> table, Fin fin) {
  const int warp = (blockIdx.x * kThreads + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp < table.num_tensors) {
    double a = 0;
    double b = 0;
    for (std::int64_t c = table.chunk_start[warp] + lane; c < table.chunk_start[warp + 1]; c += 32) {
      a += table.partial[2 * c];
      b += table.partial[2 * c + 1];
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
      a += __shfl_down_sync(0xffffffffu, a, offset);
      b += __shfl_down_sync(0xffffffffu, b, offset);
    }
    if (lane == 0) {
      table.sums[2 * warp] = a;
      table.sums[2 * warp + 1] = b;
    }
  }
  // The last block sees every block's sums (threadFenceReduction).
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&table.scalars->blocks_done, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  fin(table, DeviceBlock{});
  if (threadIdx.x == 0) table.scalars->blocks_done = 0;
}

/// A sharded step's chunk sums placed among every whole tensor's (engine.h's
/// ShardSpec): whole chunk i gets local chunk local_of[i]'s two sums, or 0.
/// A template (of the plan's group, unused) as every kernel in a header: one
/// definition per instantiation rather than one per .cu.
template <typename Group>
__global__ void __launch_bounds__(kThreads) place_whole_kernel(double* whole, const double* partial,
                                                               const std::int64_t* local_of, std::int64_t n) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n) return;
  const std::int64_t local = local_of[i];
  whole[2 * i] = local >= 0 ? partial[2 * local] : 0.0;
  whole[2 * i + 1] = local >= 0 ? partial[2 * local + 1] : 0.0;
}

/// The device arrays of a sharded step (CudaStep keeps them).
struct DeviceShard {
  const ShardSpec* spec = nullptr;
  double* whole = nullptr;                    ///< [2 x whole chunks]
  const std::int64_t* chunk_start = nullptr;  ///< [T + 1] over the whole tensors
  const std::int64_t* local_of = nullptr;     ///< [whole chunks] the local chunk, or -1
  std::int64_t whole_chunks = 0;
};

/// Runs a plan on the device: each pass one chunk kernel over every chunk,
/// each finalizer one finalize kernel with a warp per tensor; all on `stream`.
/// Sharded, a finalizer first places the chunk sums among the whole tensors'
/// and all-reduces them (ShardSpec), then finalizes over those.
template <typename Group>
struct DeviceRunner {
  const Table<Group>& table;
  cudaStream_t stream;
  DeviceShard shard{};

  template <typename Pass>
  void pass(const Pass& pass) const {
    if (table.num_chunks == 0) return;
    launch_kernel(chunk_kernel<Group, Pass>, dim3(static_cast<unsigned>(table.num_chunks)), dim3(kThreads), stream,
                  table, pass);
    BIGBATCH_CUDA_CHECK(cudaGetLastError());
  }

  template <typename Fin>
  void finalize(const Fin& fin) const {
    Table<Group> over = table;
    if (shard.spec != nullptr) {
      if (shard.whole_chunks > 0) {
        const auto place_blocks = static_cast<unsigned>((shard.whole_chunks + kThreads - 1) / kThreads);
        launch_kernel(place_whole_kernel<Group>, dim3(place_blocks), dim3(kThreads), stream, shard.whole, table.partial,
                      shard.local_of, shard.whole_chunks);
        BIGBATCH_CUDA_CHECK(cudaGetLastError());
      }
      shard.spec->allreduce_sum(shard.whole, 2 * shard.whole_chunks, stream);
      over.partial = shard.whole;
      over.chunk_start = shard.chunk_start;
    }
    const int blocks = (table.num_tensors + kWarps - 1) / kWarps;
    launch_kernel(finalize_kernel<Group, Fin>, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), stream, over,
                  fin);
    BIGBATCH_CUDA_CHECK(cudaGetLastError());
  }
};

#endif  // __CUDACC__ || BIGBATCH_SIMT

}  // namespace bigbatch::kernels::cuda
