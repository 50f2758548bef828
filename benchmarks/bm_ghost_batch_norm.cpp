// Ghost batch norm against torch::nn::BatchNorm2d on the same input: one
// forward and backward each, in one binary (compare the ratio, not the times).
#include "../normalization/ghost_batch_norm.h"

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <torch/nn/modules/batchnorm.h>

#include <string>

namespace {

struct Shape {
  const char* name;
  std::int64_t n, c, hw, ghost;
};

template <typename Module>
void bm_forward_backward(benchmark::State& state, Module module, const Shape& s) {
  at::manual_seed(0);
  const at::Tensor x = at::randn({s.n, s.c, s.hw, s.hw}).requires_grad_(true);
  const at::Tensor upstream = at::randn({s.n, s.c, s.hw, s.hw});
  for (auto _ : state) {
    x.mutable_grad() = at::Tensor();
    module->forward(x).backward(upstream);
    benchmark::DoNotOptimize(x.grad().data_ptr());
  }
  state.SetItemsProcessed(state.iterations() * s.n);
}

}  // namespace

int main(int argc, char** argv) {
  // A ResNet stage at batch 256 (ghost 32, the paper's choice), and an MLP-like
  // wide, shallow map at batch 1024 (ghost 128).
  for (const Shape& s : {Shape{"resnet_256x64x16x16_g32", 256, 64, 16, 32},
                         Shape{"wide_1024x256x4x4_g128", 1024, 256, 4, 128}}) {
    benchmark::RegisterBenchmark((std::string("BatchNorm2d/") + s.name).c_str(), [s](benchmark::State& st) {
      bm_forward_backward(st, torch::nn::BatchNorm2d(s.c), s);
    })->Unit(benchmark::kMillisecond)->UseRealTime();
    benchmark::RegisterBenchmark((std::string("GhostBatchNorm2d/") + s.name).c_str(), [s](benchmark::State& st) {
      bm_forward_backward(st, bigbatch::nn::GhostBatchNorm2d(bigbatch::nn::GhostBatchNormOptions(s.c, s.ghost)), s);
    })->Unit(benchmark::kMillisecond)->UseRealTime();
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
