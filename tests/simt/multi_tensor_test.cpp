// The CUDA runner of the multi-tensor step (kernels/engine.h) with its device code on
// the SIMT executor: what its host side promises about devices, streams and
// launches, checked against what the executor saw.
#include "../kernels/host_tensors.h"

#include "../../kernels/engine.h"
#include "../../kernels/simt/cuda.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace {

using namespace bigbatch::kernels;

// fp32 tensors with the state of a LAMB step, in host memory (the executor's
// device memory): weights 1, gradients 0.5.
struct Tensors : bigbatch::test::HostTensors {
  explicit Tensors(const std::vector<std::int64_t>& sizes) : HostTensors(sizes, 1.0f, 0.5f) {}
};

LambGroup lamb_options(double lr) {
  LambGroup o = bigbatch::test::lamb_group(true, 0);
  o.lr = lr;
  return o;
}

class SimtEngine : public ::testing::Test {
 protected:
  void TearDown() override {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
};

TEST_F(SimtEngine, ReadBacksWaitForTheStreamTheStepsRanOn) {
  cudaStream_t ran = nullptr;
  cudaStream_t other = nullptr;
  // Non-blocking, as LibTorch's streams: a synchronous copy does not wait for them.
  ASSERT_EQ(cudaStreamCreateWithFlags(&ran, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  {
    Tensors t({5, 40000});
    std::vector<float> bad = t.g[1];
    bad[7] = NAN;  // the first step is skipped (its gradient is another buffer: nothing has run yet)
    auto first = t.slots();
    first[1].grad = bad.data();
    auto step = cuda::make_step<LambPlan>();
    step->bind(first, {lamb_options(0.1)}, ran);
    step->run(ran);
    step->bind(t.slots(), {lamb_options(0.1)}, ran);
    step->run(ran);
    // Nothing waited for `ran`: the read-backs must, whatever the current stream.
    EXPECT_EQ(step->steps(), (std::vector<std::int64_t>{1, 1}));
    EXPECT_EQ(step->skipped_steps(), 1);
    EXPECT_LT(t.w[1][3], 1.0f) << "the applied step";
  }
  EXPECT_EQ(cudaStreamDestroy(ran), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(other), cudaSuccess);
}

TEST_F(SimtEngine, ReadBacksAfterACapturedStepNeedNoCapturedEvent) {
  Tensors t({5, 3});
  auto step = cuda::make_step<LambPlan>();
  step->bind(t.slots(), {lamb_options(0.1)}, nullptr);
  step->run(nullptr);
  bigbatch::simt::set_capturing(nullptr, true);  // a step captured into a graph (not run)
  step->bind(t.slots(), {lamb_options(0.1)}, nullptr);
  step->run(nullptr);
  bigbatch::simt::set_capturing(nullptr, false);
  EXPECT_EQ(step->steps(), (std::vector<std::int64_t>{1, 1}));
}

TEST_F(SimtEngine, TensorsOnAnotherDeviceGetATableThere) {
  Tensors a({100, 3});
  Tensors b({100, 3});
  a.g[0][0] = NAN;
  auto step = cuda::make_step<LambPlan>();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  step->bind(a.slots(), {lamb_options(0.1)}, nullptr);
  step->run(nullptr);  // skipped: counted on device 0
  EXPECT_GT(bigbatch::simt::allocations_on(0), 0);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  step->bind(b.slots(), {lamb_options(0.1)}, nullptr);
  step->run(nullptr);
  EXPECT_EQ(bigbatch::simt::allocations_on(0), 0) << "the table stayed on device 0";
  EXPECT_GT(bigbatch::simt::allocations_on(1), 0);
  EXPECT_EQ(step->skipped_steps(), 1) << "the skipped-step count moves with the table";
  EXPECT_EQ(step->steps(), (std::vector<std::int64_t>{1, 1}));
}

// Steps 0-3 of one plan: a table built, nothing new, new options, a moved gradient.
template <typename Plan>
void expect_launches_counted(Tensors& t, std::vector<TensorSlot> slots, typename Plan::Group o, const char* name) {
  auto step = cuda::make_step<Plan>();
  for (int s = 0; s < 4; ++s) {
    if (s == 2) o.lr = 0.05;  // a schedule: the options are sent again
    if (s == 3) slots[1].grad = t.g[3].data();  // a moved gradient pointer
    const std::int64_t before = bigbatch::simt::launches();
    step->bind(slots, {o}, nullptr);
    step->run(nullptr);
    EXPECT_EQ(step->launches_per_step(), bigbatch::simt::launches() - before) << name << ", step " << s;
  }
}

TEST_F(SimtEngine, LaunchesPerStepCountsEveryLaunch) {
  Tensors t({70000, 5, 0, 9});
  LarsGroup lars;
  lars.lr = 0.1;
  lars.momentum = 0.9;
  lars.trust_coefficient = 0.02;
  lars.adapt = lars.skip_nonfinite = true;
  expect_launches_counted<LarsPlan>(t, t.slots(), lars, "LARS");
  LarcGroup larc;
  larc.lr = 0.1;
  larc.momentum = 0.9;
  larc.trust_coefficient = 0.02;
  larc.adapt = larc.clip = larc.skip_nonfinite = true;
  expect_launches_counted<LarcPlan>(t, t.slots(), larc, "LARC");
  expect_launches_counted<LambPlan>(t, t.slots(), lamb_options(0.1), "LAMB");
  LambGroup clip = lamb_options(0.1);
  clip.max_grad_norm = 1.0;
  expect_launches_counted<LambPlan>(t, t.slots(), clip, "LAMB with clipping");
  std::vector<float> novograd_v(t.w.size(), 0.0f);
  auto slots = t.slots();
  for (std::size_t k = 0; k < slots.size(); ++k) slots[k].v = &novograd_v[k];
  NovoGradGroup novograd;
  novograd.lr = 0.1;
  novograd.beta1 = 0.95;
  novograd.beta2 = 0.98;
  novograd.skip_nonfinite = true;
  expect_launches_counted<NovoGradPlan>(t, slots, novograd, "NovoGrad");
}

}  // namespace
