// The fused CUDA step without host synchronization: captured once in a CUDA
// graph and replayed, it gives the bits of eager steps; after its first step
// it allocates nothing. Built with BIGBATCH_CUDA only; skipped without a GPU.
#include "../../bigbatch.h"

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <functional>
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

INSTANTIATE_TEST_SUITE_P(Optimizers, CudaGraph, ::testing::Range(0, static_cast<int>(cases().size())),
                         [](const auto& info) { return cases()[info.param].name; });

}  // namespace
