// The fused CUDA step without host synchronization: captured once in a CUDA
// graph and replayed, it gives the bits of eager steps, alone and inside a
// whole training step (forward, backward, step); after its first step it
// allocates nothing. Built with BIGBATCH_CUDA only; skipped without a GPU.
#include "../../bigbatch.h"

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <cmath>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace bigbatch::optim;
using Factory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

struct Case {
  std::string name;
  Factory make;
};

std::vector<Case> cases() {
  return {
      {"LARS", [](auto p) { return std::make_unique<LARS>(std::move(p), LARSOptions(0.5).weight_decay(1e-4)); }},
      {"LARC", [](auto p) { return std::make_unique<LARC>(std::move(p), LARCOptions(0.1).nesterov(true)); }},
      {"LAMB", [](auto p) { return std::make_unique<LAMB>(std::move(p), LAMBOptions(0.01)); }},
      {"LAMB_clipped", [](auto p) { return std::make_unique<LAMB>(std::move(p), LAMBOptions(0.01).max_grad_norm(1)); }},
      {"NovoGrad", [](auto p) { return std::make_unique<NovoGrad>(std::move(p), NovoGradOptions(0.1).weight_decay(1e-3)); }},
  };
}

// Parameters with fixed gradients (a graph replays on the same memory).
std::vector<at::Tensor> make_params() {
  torch::manual_seed(3);
  std::vector<at::Tensor> params;
  for (const std::int64_t n : {50000, 7, 16384, 1, 300}) {
    at::Tensor w = torch::randn({n}, torch::kCUDA);
    w.mutable_grad() = 0.1 * torch::randn({n}, torch::kCUDA);
    params.push_back(w);
  }
  return params;
}

class CudaGraph : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  }
  const Case& which() const {
    static const std::vector<Case> all = cases();
    return all[GetParam()];
  }
};

TEST_P(CudaGraph, ReplayEqualsEagerSteps_CUDA) {
  constexpr int kSteps = 4;
  auto eager_params = make_params();
  auto eager = which().make(eager_params);
  for (int s = 0; s < 1 + kSteps; ++s) eager->step();

  auto graph_params = make_params();
  auto captured = which().make(graph_params);
  captured->step();  // the first step builds the device table; a capture cannot
  at::cuda::CUDAGraph graph;
  const auto side = c10::cuda::getStreamFromPool();
  side.synchronize();
  {
    const c10::cuda::CUDAStreamGuard guard(side);
    graph.capture_begin();
    captured->step();
    graph.capture_end();
  }
  // Capturing ran nothing: the parameters are still after one step.
  for (int s = 0; s < kSteps; ++s) graph.replay();
  torch::cuda::synchronize();
  for (std::size_t k = 0; k < eager_params.size(); ++k) {
    EXPECT_TRUE(at::equal(eager_params[k], graph_params[k])) << which().name << ", tensor " << k;
  }
}

TEST_P(CudaGraph, StepsAfterTheFirstAllocateNothing_CUDA) {
  auto params = make_params();
  auto opt = which().make(params);
  opt->step();
  torch::cuda::synchronize();
  const auto device = params[0].device().index();
  const auto before = c10::cuda::CUDACachingAllocator::getDeviceStats(device).allocation[0].allocated;
  for (int s = 0; s < 5; ++s) opt->step();
  torch::cuda::synchronize();
  const auto after = c10::cuda::CUDACachingAllocator::getDeviceStats(device).allocation[0].allocated;
  EXPECT_EQ(after, before) << which().name << " allocated in steps after the first";
}

// A whole training step of a small MLP, captured once: forward, backward
// and the fused step replayed on new batches copied into the captured input
// follow the same steps run eagerly. The gradients are zeroed in place inside
// the graph (not set to none), so backward accumulates into the same memory
// and the step's device table, built by the eager steps before the capture,
// stays valid. The same kernels run in both, but cuBLAS may choose another
// algorithm under capture, so the parameters are compared to 1e-6 relative,
// and the output says whether they matched bit for bit.
TEST_P(CudaGraph, AWholeTrainingStepReplaysAsEagerSteps_CUDA) {
  constexpr int kWarmup = 3;
  constexpr int kSteps = 5;
  constexpr std::int64_t kBatch = 64;
  const auto make_model = [] {
    torch::manual_seed(5);
    torch::nn::Sequential m(torch::nn::Linear(20, 64), torch::nn::ReLU(), torch::nn::Linear(64, 4));
    m->to(torch::kCUDA);
    return m;
  };
  torch::manual_seed(9);
  const at::Tensor xs = torch::randn({kWarmup + kSteps, kBatch, 20}, torch::kCUDA);
  const at::Tensor ys = torch::randint(0, 4, {kWarmup + kSteps, kBatch}, torch::TensorOptions(torch::kCUDA).dtype(torch::kLong));
  const auto train_step = [](torch::nn::Sequential& m, torch::optim::Optimizer& opt, const at::Tensor& x,
                             const at::Tensor& y) {
    for (auto& p : m->parameters()) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
    at::Tensor loss = torch::nn::functional::cross_entropy(m->forward(x), y);
    loss.backward();
    opt.step();
    return loss;
  };

  auto eager_model = make_model();
  auto eager = which().make(eager_model->parameters());
  std::vector<double> eager_losses;
  for (int s = 0; s < kWarmup + kSteps; ++s) {
    eager_losses.push_back(train_step(eager_model, *eager, xs[s], ys[s]).item<double>());
  }

  auto model = make_model();
  auto opt = which().make(model->parameters());
  at::Tensor x = xs[0].clone();
  at::Tensor y = ys[0].clone();
  at::Tensor loss;
  // Eager steps on a side stream first (as PyTorch's whole-network capture
  // asks): they make the gradients, the optimizer's state and its table.
  const auto side = c10::cuda::getStreamFromPool();
  c10::cuda::getCurrentCUDAStream().synchronize();  // the copies above, before the side stream reads them
  at::cuda::CUDAGraph graph;
  {
    const c10::cuda::CUDAStreamGuard guard(side);
    for (int s = 0; s < kWarmup; ++s) {
      x.copy_(xs[s]);
      y.copy_(ys[s]);
      train_step(model, *opt, x, y);
    }
    side.synchronize();
    graph.capture_begin();
    loss = train_step(model, *opt, x, y);
    graph.capture_end();
  }
  torch::cuda::synchronize();
  for (int s = kWarmup; s < kWarmup + kSteps; ++s) {
    x.copy_(xs[s]);
    y.copy_(ys[s]);
    graph.replay();
    EXPECT_NEAR(loss.item<double>(), eager_losses[s], 1e-6 * std::abs(eager_losses[s])) << which().name << ", step " << s;
  }
  torch::cuda::synchronize();
  const auto eager_params = eager_model->parameters();
  const auto params = model->parameters();
  bool bitwise = true;
  for (std::size_t k = 0; k < params.size(); ++k) {
    bitwise = bitwise && at::equal(params[k], eager_params[k]);
    const double diff = (params[k] - eager_params[k]).abs().max().item<double>();
    const double scale = eager_params[k].abs().max().item<double>();
    EXPECT_LE(diff, 1e-6 * scale) << which().name << ", parameter " << k;
  }
  std::cout << which().name << ": a whole training step replayed " << kSteps << " times "
            << (bitwise ? "equals the eager steps bit for bit" : "is within 1e-6 of the eager steps") << "\n";
}

INSTANTIATE_TEST_SUITE_P(Optimizers, CudaGraph, ::testing::Range(0, static_cast<int>(cases().size())),
                         [](const auto& info) { return cases()[info.param].name; });

}  // namespace
