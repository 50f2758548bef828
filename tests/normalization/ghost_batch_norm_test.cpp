// GhostBatchNorm against torch::nn::BatchNorm (batch <= ghost size) and against
// a float64 re-derivation of docs/formulas.md from plain ops (batch > ghost size).
#include "../../normalization/ghost_batch_norm.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <vector>

namespace {

using bigbatch::nn::GhostBatchNorm1d;
using bigbatch::nn::GhostBatchNorm2d;
using bigbatch::nn::GhostBatchNormOptions;

void expect_close(const at::Tensor& a, const at::Tensor& b, double tol, const char* what) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  const double err = (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
  const double scale = std::max(1.0, b.to(at::kDouble).abs().max().item<double>());
  EXPECT_LE(err, tol * scale) << what;
}

TEST(GhostBatchNorm2d, EqualsBatchNormWhenTheBatchFitsOneGhostBatch) {
  torch::manual_seed(0);
  GhostBatchNorm2d gbn(GhostBatchNormOptions(3, 16).momentum(0.2));
  torch::nn::BatchNorm2d bn(torch::nn::BatchNorm2dOptions(3).momentum(0.2));
  {
    at::NoGradGuard no_grad;
    gbn->weight.copy_(at::randn({3}));
    gbn->bias.copy_(at::randn({3}));
    bn->weight.copy_(gbn->weight);
    bn->bias.copy_(gbn->bias);
  }
  const at::Tensor x = at::randn({8, 3, 5, 5}) * 3 + 1;
  const at::Tensor upstream = at::randn({8, 3, 5, 5});
  const at::Tensor xa = x.clone().requires_grad_(true);
  const at::Tensor xb = x.clone().requires_grad_(true);
  for (int i = 0; i < 3; ++i) {  // three steps of running statistics
    const at::Tensor ya = gbn(xa);
    const at::Tensor yb = bn(xb);
    expect_close(ya, yb, 1e-6, "output");
    (ya * upstream).sum().backward();
    (yb * upstream).sum().backward();
  }
  expect_close(xa.grad(), xb.grad(), 1e-6, "input gradient");
  expect_close(gbn->weight.grad(), bn->weight.grad(), 1e-6, "weight gradient");
  expect_close(gbn->bias.grad(), bn->bias.grad(), 1e-6, "bias gradient");
  expect_close(gbn->running_mean, bn->running_mean, 1e-6, "running mean");
  expect_close(gbn->running_var, bn->running_var, 1e-6, "running var");
  gbn->eval();
  bn->eval();
  expect_close(gbn(x), bn(x), 1e-6, "evaluation output");
}

// docs/formulas.md in float64 with plain ops: per-chunk mean and biased variance
// normalize; the running statistics take each chunk's mean and unbiased
// variance in order.
struct Reference {
  at::Tensor y, running_mean, running_var;
};
Reference reference(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, std::int64_t ghost,
                    double momentum, double eps) {
  const std::vector<std::int64_t> dims = x.dim() == 2 ? std::vector<std::int64_t>{0}
                                                      : std::vector<std::int64_t>{0, 2};
  const auto shape = x.dim() == 2 ? std::vector<std::int64_t>{1, -1} : std::vector<std::int64_t>{1, -1, 1};
  at::Tensor rm = at::zeros({x.size(1)}, at::kDouble);
  at::Tensor rv = at::ones({x.size(1)}, at::kDouble);
  std::vector<at::Tensor> ys;
  for (std::int64_t begin = 0; begin < x.size(0); begin += ghost) {
    const at::Tensor c = x.narrow(0, begin, std::min(ghost, x.size(0) - begin));
    const double n = static_cast<double>(c.numel() / c.size(1));
    const at::Tensor mean = c.mean(dims);
    const at::Tensor var = (c - mean.view(shape)).pow(2).mean(dims);
    ys.push_back((c - mean.view(shape)) / (var.view(shape) + eps).sqrt() * w.view(shape) + b.view(shape));
    rm = (1 - momentum) * rm + momentum * mean.detach();
    rv = (1 - momentum) * rv + momentum * var.detach() * n / (n - 1);
  }
  return {at::cat(ys, 0), rm, rv};
}

TEST(GhostBatchNorm1d, MatchesFloat64ReferenceWithAShortLastChunk) {
  torch::manual_seed(1);
  for (const bool three_d : {false, true}) {
    const at::Tensor x = three_d ? at::randn({10, 3, 4}) : at::randn({10, 3}) * 2 - 1;
    GhostBatchNorm1d gbn(GhostBatchNormOptions(3, 4));  // chunks of 4, 4, 2
    {
      at::NoGradGuard no_grad;
      gbn->weight.copy_(at::randn({3}));
      gbn->bias.copy_(at::randn({3}));
    }
    const at::Tensor upstream = at::randn(x.sizes());
    const at::Tensor xa = x.clone().requires_grad_(true);
    const at::Tensor y = gbn(xa);
    (y * upstream).sum().backward();

    const at::Tensor x64 = x.to(at::kDouble).requires_grad_(true);
    const at::Tensor w64 = gbn->weight.detach().to(at::kDouble).requires_grad_(true);
    const at::Tensor b64 = gbn->bias.detach().to(at::kDouble).requires_grad_(true);
    const Reference r = reference(x64, w64, b64, 4, 0.1, 1e-5);
    (r.y * upstream.to(at::kDouble)).sum().backward();

    expect_close(y, r.y, 1e-5, "output");
    expect_close(xa.grad(), x64.grad(), 1e-5, "input gradient");
    expect_close(gbn->weight.grad(), w64.grad(), 1e-5, "weight gradient");
    expect_close(gbn->bias.grad(), b64.grad(), 1e-5, "bias gradient");
    expect_close(gbn->running_mean, r.running_mean, 1e-6, "running mean");
    expect_close(gbn->running_var, r.running_var, 1e-6, "running var");
    EXPECT_EQ(gbn->num_batches_tracked.item<std::int64_t>(), 3);
  }
}

TEST(GhostBatchNorm2d, EvaluationUsesRunningStatistics) {
  torch::manual_seed(2);
  GhostBatchNorm2d gbn(GhostBatchNormOptions(2, 4));
  gbn(at::randn({12, 2, 3, 3}) * 2 + 3);
  gbn->eval();
  const at::Tensor x = at::randn({5, 2, 3, 3});
  const auto v = [](const at::Tensor& t) { return t.view({1, -1, 1, 1}); };
  const at::Tensor expected =
      (x - v(gbn->running_mean)) / (v(gbn->running_var) + 1e-5).sqrt() * v(gbn->weight) + v(gbn->bias);
  expect_close(gbn(x), expected.detach(), 1e-6, "evaluation");
}

TEST(GhostBatchNorm2d, WithoutRunningStatisticsNormalizesEachChunk) {
  GhostBatchNorm2d gbn(GhostBatchNormOptions(2, 3).track_running_stats(false).affine(false));
  gbn->eval();
  const at::Tensor x = at::randn({6, 2, 2, 2});
  const at::Tensor y = gbn(x);
  for (int c = 0; c < 2; ++c) {
    const at::Tensor chunk = y.narrow(0, c * 3, 3);
    EXPECT_NEAR(chunk.mean({0, 2, 3}).abs().max().item<double>(), 0, 1e-6);
  }
  EXPECT_FALSE(gbn->running_mean.defined());
}

TEST(GhostBatchNorm, WorksInsideModulesAndClones) {
  torch::nn::Sequential net(torch::nn::Linear(4, 3), GhostBatchNorm1d(GhostBatchNormOptions(3, 2)));
  const at::Tensor y = net->forward(at::randn({6, 4}));
  EXPECT_EQ(y.sizes(), (std::vector<std::int64_t>{6, 3}));
  const auto copy = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(net->clone());
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(copy->named_buffers().size(), net->named_buffers().size());
}

TEST(GhostBatchNorm, BadInputNamesTheProblem) {
  GhostBatchNorm2d gbn(GhostBatchNormOptions(3, 4));
  EXPECT_THROW(gbn(at::randn({4, 3, 2})), c10::Error);
  try {
    gbn(at::randn({4, 5, 2, 2}));
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_STREQ(e.what_without_backtrace(), "GhostBatchNorm2d: expected 3 features (dim 1), got 5");
  }
  GhostBatchNorm1d one(GhostBatchNormOptions(3, 4));
  try {
    one(at::randn({9, 3}));
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_STREQ(e.what_without_backtrace(),
                 "GhostBatchNorm1d: a chunk needs more than 1 value per channel in training; batch 9 "
                 "with ghost_batch_size 4 leaves a last chunk of 1 example(s)");
  }
  EXPECT_THROW(GhostBatchNorm1d(GhostBatchNormOptions(3, 0)), c10::Error);
}

TEST(GhostBatchNorm2d, CudaMatchesCpu_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(3);
  GhostBatchNorm2d cpu(GhostBatchNormOptions(4, 8));
  GhostBatchNorm2d gpu(GhostBatchNormOptions(4, 8));
  gpu->to(at::kCUDA);
  const at::Tensor x = at::randn({20, 4, 6, 6});
  expect_close(gpu(x.to(at::kCUDA)).cpu(), cpu(x), 1e-5, "output");
  expect_close(gpu->running_var.cpu(), cpu->running_var, 1e-6, "running var");
}

}  // namespace
