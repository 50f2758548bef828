// The host side of the CUDA runner (kernels/cuda/runner.cuh), which runs
// without a GPU: what a bind without tensors does, and what a bind that names
// a missing group throws. Linked against the library nvcc built; no kernel is
// launched. (The bytes each plan moves are checked in cpu_engine_test.cpp.)
#include "../../kernels/engine.h"
#include "../../kernels/lamb.h"
#include "../../kernels/momentum.h"
#include "../../kernels/novograd.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace {

using namespace bigbatch::kernels;

TEST(CudaRunner, AnEmptyBindNeedsNoDevice) {
  auto step = cuda::make_step<LambPlan>();
  EXPECT_TRUE(step->same_tensors({}));
  step->bind({}, {LambGroup{}}, nullptr);
  step->run(nullptr);  // nothing bound: nothing launched
  EXPECT_EQ(step->launches_per_step(), 0);
  EXPECT_EQ(step->bytes_per_step(), 0);
  EXPECT_TRUE(step->steps().empty());
  EXPECT_EQ(step->skipped_steps(), 0);
  TensorSlot slot;
  slot.numel = 10;
  EXPECT_FALSE(step->same_tensors({slot}));  // never bound: a rebuild
  slot.group = 3;
  EXPECT_THROW(step->bind({slot}, {LambGroup{}}, nullptr), std::invalid_argument);
}

}  // namespace
