// The SIMT executor itself (kernels/simt): kernels written here run as CUDA
// would run them, and the misuse the executor exists to catch is reported.
#include "../../kernels/simt/cuda.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

namespace {

constexpr int kThreads = 256;

// A block reduction in the style of kernels/cuda: warp shuffles, then shared memory.
__global__ void block_sums(const double* x, double* out) {
  __shared__ double warp_sums[kThreads / 32];
  double v = x[blockIdx.x * blockDim.x + threadIdx.x];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0;
    for (int w = 0; w < kThreads / 32; ++w) s += warp_sums[w];
    out[blockIdx.x] = s;
  }
  __syncthreads();
}

// Runs `kernel` on one block and returns the launch's error message, or "".
template <typename... Args>
std::string launch_error(void (*kernel)(Args...), Args... args) {
  bigbatch::simt::launch(dim3(1), dim3(kThreads), nullptr, [=] { kernel(args...); });
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? std::string() : cudaGetErrorString(err);
}

TEST(SimtExecutor, BlockReductionEqualsTheSerialSum) {
  constexpr int kBlocks = 37;
  std::vector<double> x(kBlocks * kThreads);
  std::iota(x.begin(), x.end(), 1.0);  // integers: every order sums exactly
  for (std::uint64_t seed : {1, 2, 3}) {
    bigbatch::simt::set_seed(seed);
    std::vector<double> out(kBlocks, -1);
    const double* in = x.data();
    double* o = out.data();
    bigbatch::simt::launch(dim3(kBlocks), dim3(kThreads), nullptr, [=] { block_sums(in, o); });
    ASSERT_EQ(cudaGetLastError(), cudaSuccess) << cudaGetErrorString(cudaErrorLaunchFailure);
    for (int b = 0; b < kBlocks; ++b) {
      const double expected = std::accumulate(x.begin() + b * kThreads, x.begin() + (b + 1) * kThreads, 0.0);
      EXPECT_EQ(out[b], expected) << "block " << b << ", seed " << seed;
    }
  }
  bigbatch::simt::set_seed(1);
}

__global__ void barrier_in_a_branch(int*) {
  if (threadIdx.x < 100) __syncthreads();
}
__global__ void two_barriers(int*) {
  if (threadIdx.x % 2 == 0) {
    __syncthreads();
  } else {
    __syncthreads();
  }
}
__global__ void mask_leaves_out_callers(int* out) {
  out[threadIdx.x] = __shfl_down_sync(0x0000ffffu, static_cast<int>(threadIdx.x), 1);
}
__global__ void reads_a_lane_outside_the_mask(int* out) {
  if (threadIdx.x % 32 < 16) out[threadIdx.x] = __shfl_down_sync(0x0000ffffu, static_cast<int>(threadIdx.x), 8);
}
__global__ void a_lane_returns_before_the_shuffle(int* out) {
  if (threadIdx.x == 5) return;
  out[threadIdx.x] = __shfl_down_sync(0xffffffffu, static_cast<int>(threadIdx.x), 1);
}
__global__ void barrier_or(int* out) {
  out[threadIdx.x] = __syncthreads_or(threadIdx.x == 200);
}

TEST(SimtExecutor, ABarrierNotEveryThreadReachesIsReported) {
  std::vector<int> out(kThreads);
  EXPECT_NE(launch_error(barrier_in_a_branch, out.data()).find("barrier not every thread"), std::string::npos);
  EXPECT_NE(launch_error(two_barriers, out.data()).find("waits at"), std::string::npos);
}

TEST(SimtExecutor, ShufflesOutsideTheirMaskAreReported) {
  std::vector<int> out(kThreads);
  EXPECT_NE(launch_error(mask_leaves_out_callers, out.data()).find("leaves it out"), std::string::npos);
  EXPECT_NE(launch_error(reads_a_lane_outside_the_mask, out.data()).find("not in the mask"), std::string::npos);
  EXPECT_NE(launch_error(a_lane_returns_before_the_shuffle, out.data()).find("never arrives"), std::string::npos);
}

TEST(SimtExecutor, SyncthreadsOrSeesEveryThread) {
  std::vector<int> out(kThreads, -1);
  ASSERT_EQ(launch_error(barrier_or, out.data()), "");
  for (int v : out) EXPECT_EQ(v, 1);
}

__global__ void write_one(int* p) {
  if (threadIdx.x == 0) *p = 1;
}

TEST(SimtExecutor, CreatedStreamsRunWhenWaitedFor) {
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  cudaEvent_t e = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  int x = 0;
  int* p = &x;
  bigbatch::simt::launch(dim3(1), dim3(32), s, [=] { write_one(p); });
  EXPECT_EQ(x, 0) << "work on a created stream ran before anyone waited for it";
  ASSERT_EQ(cudaEventRecord(e, s), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(e), cudaSuccess);
  EXPECT_EQ(x, 1);
  EXPECT_EQ(cudaEventDestroy(e), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

TEST(SimtExecutor, ASynchronousCallUnderCaptureFails) {
  bigbatch::simt::set_capturing(nullptr, true);
  EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaErrorStreamCaptureUnsupported);
  bigbatch::simt::set_capturing(nullptr, false);
  EXPECT_EQ(cudaGetLastError(), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
}

float bits_to_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(SimtExecutor, SixteenBitConversionsRoundToNearestEven) {
  // bf16: 7 fraction bits. 1 + 2^-8 is a tie: even (1.0); 1 + 3*2^-8 ties up to 1 + 2^-6.
  EXPECT_EQ(__float2bfloat16_rn(1.0f + 0x1p-8f).bits, 0x3f80);
  EXPECT_EQ(__float2bfloat16_rn(1.0f + 3 * 0x1p-8f).bits, 0x3f82);
  EXPECT_EQ(__float2bfloat16_rn(1.0f + 0x1p-8f + 0x1p-20f).bits, 0x3f81);  // above the tie: up
  EXPECT_EQ(__bfloat162float(__nv_bfloat16{0xc0a0}), -5.0f);
  EXPECT_TRUE(std::isnan(__bfloat162float(__float2bfloat16_rn(bits_to_float(0x7f800001u)))));
  // fp16: 10 fraction bits, max 65504.
  EXPECT_EQ(__half2float(__float2half_rn(1.0f + 0x1p-11f)), 1.0f);
  EXPECT_EQ(__half2float(__float2half_rn(1.0f + 3 * 0x1p-11f)), 1.0f + 0x1p-9f);
  EXPECT_EQ(__float2half_rn(-2.0f).bits, 0xc000);
  EXPECT_TRUE(std::isinf(__half2float(__float2half_rn(70000.0f))));
}

}  // namespace
