// The multi-tensor step sharded across ranks (kernels/engine.h's ShardSpec),
// on both runners: the CPU runner, and the CUDA runner with its device code on
// the SIMT executor (its chunk sums placed among the whole tensors' by
// place_whole_kernel, the all-reduce between kernels, the finalizer over the
// whole array). Three ranks are forked processes that all-reduce through
// shared memory; they cut three tensors at chunk boundaries (one tensor
// across two ranks, another across two others), and their steps must be the
// unsharded step of the same runner bit for bit: parameters, trust ratios,
// LAMB's global clipping, and a step every rank skips for a NaN that only
// one rank holds.
#include "../kernels/host_tensors.h"

#include "../../kernels/engine.h"
#include "../../kernels/lamb.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <pthread.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

namespace {

using namespace bigbatch::kernels;

constexpr int kRanks = 3;
constexpr int kSteps = 3;
constexpr std::int64_t K = kChunkElements;
const std::vector<std::int64_t> kSizes{40000, 100, 20000};  // 3, 1 and 2 chunks
// Each rank's [begin, end) of each tensor: rank 0 the first two chunks of
// tensor 0; rank 1 the rest of it, tensor 1 and the first chunk of tensor 2;
// rank 2 the rest of tensor 2.
const std::int64_t kPieces[kRanks][3][2] = {{{0, 2 * K}, {0, 0}, {0, 0}},
                                            {{2 * K, 40000}, {0, 100}, {0, K}},
                                            {{40000, 40000}, {100, 100}, {K, 20000}}};
constexpr std::size_t kWholeChunks = 6;
constexpr std::size_t kElements = 60100;

// What the forked ranks share: a barrier, each rank's contribution to the
// all-reduce, and their results.
struct Shared {
  pthread_barrier_t barrier;
  double contribution[kRanks][2 * kWholeChunks];
  float w[kElements];
  double ratio[kRanks][3];
};

// LAMB with global clipping: the gradients' global norm is about 8, clipped to 1.
LambGroup lamb_options() { return bigbatch::test::lamb_group(true, 1.0); }

// Tensors with varied weights and gradients (the same in every process).
bigbatch::test::HostTensors tensors() {
  bigbatch::test::HostTensors t(kSizes, 0.0f, 0.0f);
  for (std::size_t k = 0; k < kSizes.size(); ++k) {
    for (std::size_t i = 0; i < t.w[k].size(); ++i) {
      t.w[k][i] = std::sin(0.37f * static_cast<float>(i) + static_cast<float>(k));
      t.g[k][i] = 0.05f * std::cos(0.11f * static_cast<float>(i) + 2.0f * static_cast<float>(k));
    }
  }
  return t;
}

std::unique_ptr<MultiTensorStep<LambPlan>> make(bool cuda) {
  return cuda ? cuda::make_step<LambPlan>() : make_cpu_step<LambPlan>();
}

// kSteps steps of `slots`; the second finds a NaN in tensor 2's last gradient element.
template <typename Step>
void run_steps(Step& step, const std::vector<TensorSlot>& slots, float* nan_at) {
  for (int s = 0; s < kSteps; ++s) {
    const float saved = nan_at != nullptr ? *nan_at : 0.0f;
    if (s == 1 && nan_at != nullptr) *nan_at = NAN;
    step.bind(slots, {lamb_options()}, nullptr);
    step.run(nullptr);
    if (s == 1 && nan_at != nullptr) *nan_at = saved;
  }
}

// One forked rank: its pieces, kSteps sharded steps, its results into `shared`.
int rank_main(bool cuda, int rank, Shared* shared) {
  // One thread: OpenMP's team does not survive fork(), and a parallel region
  // in the child of a process that had one waits for it forever.
  at::set_num_threads(1);
  auto t = tensors();
  std::vector<TensorSlot> slots;
  auto spec = std::make_shared<ShardSpec>();
  for (std::size_t k = 0; k < kSizes.size(); ++k) {
    const std::int64_t b = kPieces[rank][k][0], e = kPieces[rank][k][1];
    TensorSlot s;
    s.param = t.w[k].data() + b;
    s.grad = t.g[k].data() + b;
    s.m = t.m[k].data() + b;
    s.v = t.v[k].data() + b;
    s.numel = e - b;
    slots.push_back(s);
    spec->tensor_chunks.push_back((kSizes[k] + K - 1) / K);
    spec->first_chunk.push_back(b / K);
  }
  spec->allreduce_sum = [rank, shared](double* data, std::int64_t n, cudaStream_t) {
    std::memcpy(shared->contribution[rank], data, static_cast<std::size_t>(n) * sizeof(double));
    pthread_barrier_wait(&shared->barrier);
    for (std::int64_t i = 0; i < n; ++i) {
      double sum = 0;
      for (int r = 0; r < kRanks; ++r) sum += shared->contribution[r][i];
      data[i] = sum;
    }
    pthread_barrier_wait(&shared->barrier);  // every rank has read before the next call writes
  };
  auto step = make(cuda);
  step->set_shard(spec);
  float* nan_at = kPieces[rank][2][1] == kSizes[2] && kPieces[rank][2][0] < kSizes[2] ? &t.g[2].back() : nullptr;
  run_steps(*step, slots, nan_at);
  std::int64_t offset = 0;
  for (std::size_t k = 0; k < kSizes.size(); ++k) {
    const std::int64_t b = kPieces[rank][k][0], e = kPieces[rank][k][1];
    std::memcpy(shared->w + offset + b, t.w[k].data() + b, static_cast<std::size_t>(e - b) * sizeof(float));
    offset += kSizes[k];
  }
  const std::vector<double> ratios = step->trust_ratios();
  std::memcpy(shared->ratio[rank], ratios.data(), sizeof(shared->ratio[rank]));
  return step->skipped_steps() == 1 && step->steps() == std::vector<std::int64_t>(3, kSteps - 1) ? 0 : 3;
}

void expect_sharded_equals_unsharded(bool cuda) {
  // The unsharded step of the same runner.
  auto whole = tensors();
  auto reference = make(cuda);
  run_steps(*reference, whole.slots(), &whole.g[2].back());
  ASSERT_EQ(reference->skipped_steps(), 1);
  const std::vector<double> ratios = reference->trust_ratios();
  ASSERT_TRUE(std::isfinite(ratios[0]) && ratios[0] != 1.0);

  void* memory = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(memory, MAP_FAILED);
  auto* shared = static_cast<Shared*>(memory);
  pthread_barrierattr_t attr;
  pthread_barrierattr_init(&attr);
  pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_barrier_init(&shared->barrier, &attr, kRanks);
  std::vector<pid_t> pids;
  for (int r = 0; r < kRanks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) _exit(rank_main(cuda, r, shared));
    pids.push_back(pid);
  }
  for (int r = 0; r < kRanks; ++r) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << r << " status " << status;
  }
  std::int64_t offset = 0;
  for (std::size_t k = 0; k < kSizes.size(); ++k) {
    EXPECT_EQ(std::memcmp(shared->w + offset, whole.w[k].data(), whole.w[k].size() * sizeof(float)), 0)
        << "tensor " << k;
    offset += kSizes[k];
  }
  for (int r = 0; r < kRanks; ++r) {  // every rank reports every tensor's ratio, the unsharded one
    EXPECT_EQ(std::memcmp(shared->ratio[r], ratios.data(), sizeof(shared->ratio[r])), 0) << "rank " << r;
  }
  pthread_barrier_destroy(&shared->barrier);
  munmap(memory, sizeof(Shared));
}

TEST(ShardedEngine, CpuRunnerStepsAsUnsharded) { expect_sharded_equals_unsharded(false); }

TEST(ShardedEngine, CudaRunnerStepsAsUnsharded) { expect_sharded_equals_unsharded(true); }

TEST(ShardedEngine, ASpecThatDoesNotFitTheSlotsIsRefused) {
  auto t = tensors();
  for (const bool cuda : {false, true}) {
    auto step = make(cuda);
    auto spec = std::make_shared<ShardSpec>();
    spec->tensor_chunks = {3, 1};  // three slots
    spec->first_chunk = {0, 0};
    spec->allreduce_sum = [](double*, std::int64_t, cudaStream_t) {};
    step->set_shard(spec);
    EXPECT_THROW(step->bind(t.slots(), {lamb_options()}, nullptr), std::invalid_argument);
    spec->tensor_chunks = {3, 1, 1};  // tensor 2's slot has 2 chunks
    spec->first_chunk = {0, 0, 0};
    EXPECT_THROW(step->bind(t.slots(), {lamb_options()}, nullptr), std::invalid_argument);
  }
}

}  // namespace
