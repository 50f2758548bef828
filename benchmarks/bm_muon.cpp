// Muon's step (its orthogonalized matrices; no AdamW groups) fused against
// the reference path, and against the floor of its products alone: per
// matrix shape, 5 iterations of the three batched products (X X^T, b*A +
// c*A A, a*X + B X) on preallocated tensors, which no implementation of the
// iteration can beat. Two parameter lists: GPT-small-like (12 layers of
// width 768: 124M parameters of which 85M in the 48 hidden matrices) and
// ResNet-50-like (its 53 convolutions, flattened to (out, in*k*k), and the
// classifier: 25.5M), plus gpt_mini (4 layers of width 256) for the smoke run
// ctest makes. PyTorch's Muon on the same lists: benchmarks/torch_muon_bench.py.
// Every case in fp32 (the default) and with ns_bfloat16 (PyTorch's precision);
// --device=cuda runs them on the GPU (a BIGBATCH_CUDA build).
#include "optimizer_bench.h"

#include "../bigbatch.h"

#include <benchmark/benchmark.h>
#include <torch/cuda.h>

#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace {

using namespace bigbatch::optim;
using bigbatch::bench::ShapeList;

at::Device g_device = at::kCPU;

// ResNet-50's matrices: every convolution and the classifier (the BatchNorm
// vectors are AdamW's and left out).
ShapeList resnet50_matrices() {
  ShapeList all = bigbatch::bench::resnet50();
  ShapeList p{all.name, {}};
  for (const auto& s : all.shapes) {
    if (s.size() >= 2) p.shapes.push_back(s);
  }
  return p;
}

void synchronize() {
  if (g_device.is_cuda()) torch::cuda::synchronize();
}

void bm_muon(benchmark::State& state, const ShapeList& list, bool fused, bool bf16) {
  torch::manual_seed(0);
  std::vector<at::Tensor> params;
  for (const auto& s : list.shapes) {
    params.push_back((0.02 * at::randn(s)).to(g_device).requires_grad_(true));
    params.back().mutable_grad() = (1e-3 * at::randn(s)).to(g_device);
  }
  Muon opt(params, MuonOptions(0.02).fused(fused).ns_bfloat16(bf16));
  opt.step();  // state and buffers outside the timing
  synchronize();
  for (auto _ : state) {
    opt.step();
    synchronize();
  }
  state.counters["params_M"] = static_cast<double>(list.sizes().total()) / 1e6;
}

// The products alone: for each shape, its matrices as one batch in the wide
// orientation, 5 x (bmm, baddbmm, baddbmm) into preallocated outputs.
void bm_gemm_floor(benchmark::State& state, const ShapeList& list, bool bf16) {
  std::map<std::tuple<std::int64_t, std::int64_t>, std::int64_t> counts;
  for (const auto& s : list.shapes) {
    std::int64_t cols = 1;
    for (std::size_t d = 1; d < s.size(); ++d) cols *= s[d];
    counts[{std::min(s[0], cols), std::max(s[0], cols)}] += 1;
  }
  const auto options = at::TensorOptions(g_device).dtype(bf16 ? at::kBFloat16 : at::kFloat);
  struct Batch {
    at::Tensor x, y, gram, poly;
  };
  std::vector<Batch> batches;
  double flops = 0;
  for (const auto& [shape, k] : counts) {
    const auto [r, c] = shape;
    batches.push_back({0.01 * at::randn({k, r, c}, options), at::empty({k, r, c}, options),
                       at::empty({k, r, r}, options), at::empty({k, r, r}, options)});
    flops += 5.0 * static_cast<double>(k) * (4.0 * r * r * c + 2.0 * r * r * r);
  }
  for (auto _ : state) {
    for (auto& b : batches) {
      for (int i = 0; i < 5; ++i) {
        at::bmm_out(b.gram, b.x, b.x.transpose(1, 2));
        at::baddbmm_out(b.poly, b.gram, b.gram, b.gram, -4.7750, 2.0315);
        at::baddbmm_out(b.y, b.x, b.poly, b.x, 3.4445);
        std::swap(b.x, b.y);
      }
    }
    synchronize();
  }
  state.counters["GFLOP"] = flops / 1e9;
  state.counters["GFLOPS"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--device=cuda") == 0) {
      g_device = at::kCUDA;
    } else {
      args.push_back(argv[i]);
    }
  }
  if (g_device.is_cuda() && !torch::cuda::is_available()) {
    std::fprintf(stderr, "bm_muon: --device=cuda but no CUDA device\n");
    return 2;
  }
  int count = static_cast<int>(args.size());
  const std::vector<bool> precisions{false, true};
  using bigbatch::bench::gpt_matrices;
  for (const auto& list : {gpt_matrices("gpt_mini_3M", 4, 256), gpt_matrices("gpt_small_124M", 12, 768), resnet50_matrices()}) {
    for (const bool bf16 : precisions) {
      const std::string suffix = std::string(bf16 ? "/bf16/" : "/fp32/") + list.name;
      benchmark::RegisterBenchmark(("Muon/fused" + suffix).c_str(), bm_muon, list, true, bf16)
          ->Unit(benchmark::kMillisecond)->UseRealTime();
      benchmark::RegisterBenchmark(("Muon/reference" + suffix).c_str(), bm_muon, list, false, bf16)
          ->Unit(benchmark::kMillisecond)->UseRealTime();
      benchmark::RegisterBenchmark(("Muon/gemm_floor" + suffix).c_str(), bm_gemm_floor, list, bf16)
          ->Unit(benchmark::kMillisecond)->UseRealTime();
    }
  }
  benchmark::Initialize(&count, args.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
