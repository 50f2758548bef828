// The host-side logic of the multi-tensor CUDA step, which runs without a GPU:
// the bytes each step moves (against the hand count of docs/cuda.md), and
// what a bind without a device does. Linked against the CUDA kernel library; no kernel is launched.
#include <bigbatch/kernels/multi_tensor.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace {

using namespace bigbatch::kernels;
using namespace bigbatch::kernels::cuda;

TEST(MultiTensor, BytesPerStepAsDocumented) {
  const auto f32 = DType::kFloat32;
  const auto bf16 = DType::kBFloat16;
  // LAMB: g (4) | w g m v read, m v written (24) | w m v read, w written (16).
  EXPECT_EQ(step_bytes_per_element(Algorithm::kLamb, true, false, f32, false), 44);
  EXPECT_EQ(step_bytes_per_element(Algorithm::kLamb, false, true, f32, false), 44);
  EXPECT_EQ(step_bytes_per_element(Algorithm::kLamb, false, false, f32, false), 40);
  // LARS/LARC: w g (8) | w g v read, v w written (20). NovoGrad: g (4) | w g m, m w (20).
  EXPECT_EQ(step_bytes_per_element(Algorithm::kLars, true, false, f32, false), 28);
  EXPECT_EQ(step_bytes_per_element(Algorithm::kLarc, false, false, f32, false), 28);
  EXPECT_EQ(step_bytes_per_element(Algorithm::kNovoGrad, true, false, f32, false), 24);
  // bf16 LAMB: g (2) | w g (2+2) m v (8) read, m v (8) | w (2) m v (8) read, w (2) written.
  EXPECT_EQ(step_bytes_per_element(Algorithm::kLamb, true, false, bf16, false), 2 + 20 + 12);
  // With an fp32 master: the w read is 4 bytes, the w write 4 + 2.
  EXPECT_EQ(step_bytes_per_element(Algorithm::kLamb, true, false, bf16, true), 2 + 22 + 18);
  EXPECT_EQ(step_bytes_per_element(Algorithm::kLars, true, false, bf16, true), (4 + 2) + (4 + 2 + 4 + 4 + 6));
}

TEST(MultiTensor, AnEmptyBindNeedsNoDevice) {
  MultiTensorStep step(Algorithm::kLamb);
  EXPECT_TRUE(step.same_tensors({}));
  step.bind({}, {GroupOptions{}}, nullptr);
  step.run(nullptr);  // nothing bound: nothing launched
  EXPECT_EQ(step.launches_per_step(), 0);
  EXPECT_EQ(step.bytes_per_step(), 0);
  EXPECT_TRUE(step.steps().empty());
  EXPECT_EQ(step.skipped_steps(), 0);
  TensorSlot slot;
  slot.numel = 10;
  EXPECT_FALSE(step.same_tensors({slot}));  // never bound: a rebuild
  slot.group = 3;
  EXPECT_THROW(step.bind({slot}, {GroupOptions{}}, nullptr), std::invalid_argument);
}

}  // namespace
