// One optimizer step on the GPU: the fused multi-tensor CUDA path against the
// reference path (fused(false), ATen CUDA ops) and a device-to-device copy
// moving the same bytes, all timed with CUDA events in one run. Parameter
// lists: BERT-large-like (336M fp32 in 396 tensors), ResNet-50-like (~25M
// in ~160 tensors), and 10,000 small tensors. Bytes per fp32 parameter each
// fused step moves (docs/cuda.md): LARS/LARC 28, LAMB 44 (40 without
// skip_nonfinite and clipping), NovoGrad 24, Lion 24, AdamWScheduleFree 32.
// The *_bf16 entries keep bf16
// parameters and gradients with fp32 master weights (on the two large
// lists). Each entry's bytes per parameter is its `bytes_per_param` counter.
// Built with BIGBATCH_CUDA.
#include "optimizer_bench.h"

#include "../bigbatch.h"
#include "../kernels/engine.h"

#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <benchmark/benchmark.h>
#include <torch/cuda.h>

#include <functional>
#include <iterator>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using namespace bigbatch::optim;
using bigbatch::bench::Make;
using bigbatch::bench::maker;
using bigbatch::bench::ParamList;

void cuda_check(cudaError_t err) {
  if (err != cudaSuccess) throw std::runtime_error(cudaGetErrorString(err));
}

ParamList bert_large() { return bigbatch::bench::bert_large().sizes(); }
ParamList resnet50() { return bigbatch::bench::resnet50().sizes(); }

// 10,000 tensors of 64 to 1,024 elements: launch and table overhead.
ParamList many_small() {
  ParamList p{"small_10000t", {}};
  for (int i = 0; i < 10000; ++i) p.sizes.push_back(64 << (i % 5));
  return p;
}

// Times body() per iteration with CUDA events on the current stream.
template <typename Body>
void time_with_events(benchmark::State& state, Body&& body) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  cuda_check(cudaEventCreate(&start));
  cuda_check(cudaEventCreate(&stop));
  for (auto _ : state) {
    cuda_check(cudaEventRecord(start, stream));
    body();
    cuda_check(cudaEventRecord(stop, stream));
    cuda_check(cudaEventSynchronize(stop));
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, start, stop));
    state.SetIterationTime(ms / 1e3);
  }
  cuda_check(cudaEventDestroy(start));
  cuda_check(cudaEventDestroy(stop));
}

void bm_step(benchmark::State& state, const ParamList& list, const Make& make, bool fused,
             double bytes_per_param, at::ScalarType dtype) {
  if (!torch::cuda::is_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  torch::manual_seed(0);
  std::vector<at::Tensor> params;
  for (auto n : list.sizes) {
    params.push_back(torch::randn({n}, torch::kCUDA).to(dtype));
    params.back().mutable_grad() = (1e-3 * torch::randn({n}, torch::kCUDA)).to(dtype);
  }
  auto opt = make(params, fused);
  opt->step();  // state and table outside the timing
  opt->step();
  time_with_events(state, [&] { opt->step(); });
  const double bytes = bytes_per_param * static_cast<double>(list.total());
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
  state.counters["params"] = static_cast<double>(list.total());
  state.counters["tensors"] = static_cast<double>(list.sizes.size());
  state.counters["bytes_per_param"] = bytes_per_param;
}

// A device-to-device copy of half the bytes: it reads and writes the same total.
void bm_copy(benchmark::State& state, const ParamList& list, double bytes_per_param) {
  if (!torch::cuda::is_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const auto bytes = static_cast<std::size_t>(bytes_per_param * static_cast<double>(list.total()) / 2);
  void* src = nullptr;
  void* dst = nullptr;
  cuda_check(cudaMalloc(&src, bytes));
  cuda_check(cudaMalloc(&dst, bytes));
  cuda_check(cudaMemset(src, 1, bytes));
  cuda_check(cudaMemset(dst, 0, bytes));  // first touch outside the timing
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  time_with_events(state, [&] {
    cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
  });
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * 2.0 * static_cast<double>(bytes)));
  cuda_check(cudaFree(src));
  cuda_check(cudaFree(dst));
}

struct Optimizer {
  const char* name;
  Make make;
  double bytes_per_param;
  at::ScalarType dtype = at::kFloat;
};

// The bytes a step moves per parameter, as the plans count them
// (skip_nonfinite on, the default; LAMB's max_grad_norm where `clip`): fp32
// parameters, or bf16 ones with an fp32 master copy.
template <typename Plan>
double step_bytes(bool bf16_master = false, bool clip = false) {
  namespace k = bigbatch::kernels;
  typename Plan::Group group;
  group.skip_nonfinite = true;
  if constexpr (std::is_same_v<Plan, k::LambPlan>) group.max_grad_norm = clip ? 1.0 : 0.0;
  return static_cast<double>(k::step_bytes_per_element<Plan>(
      {group}, bf16_master ? k::DType::kBFloat16 : k::DType::kFloat32, /*master=*/bf16_master));
}

int register_all() {
  namespace k = bigbatch::kernels;
  const Optimizer optimizers[] = {
      {"LAMB", maker<LAMB>(LAMBOptions(1e-3)), step_bytes<k::LambPlan>()},
      {"LAMB_clip", maker<LAMB>(LAMBOptions(1e-3).max_grad_norm(1.0)), step_bytes<k::LambPlan>(false, true)},
      {"LARS", maker<LARS>(LARSOptions(0.1).weight_decay(1e-4)), step_bytes<k::LarsPlan>()},
      {"LARC", maker<LARC>(LARCOptions(0.1).weight_decay(1e-4)), step_bytes<k::LarcPlan>()},
      {"NovoGrad", maker<NovoGrad>(NovoGradOptions(1e-2)), step_bytes<k::NovoGradPlan>()},
      {"Lion", maker<Lion>(LionOptions(1e-4).weight_decay(0.1)), step_bytes<k::LionPlan>()},
      {"AdamWScheduleFree", maker<AdamWScheduleFree>(AdamWScheduleFreeOptions(2.5e-3).weight_decay(0.1)),
       step_bytes<k::ScheduleFreeAdamWPlan>()},
  };
  const Optimizer bf16[] = {
      {"LAMB_bf16", maker<LAMB>(LAMBOptions(1e-3).master_weights(true)), step_bytes<k::LambPlan>(true),
       at::kBFloat16},
      {"LARS_bf16", maker<LARS>(LARSOptions(0.1).weight_decay(1e-4).master_weights(true)),
       step_bytes<k::LarsPlan>(true), at::kBFloat16},
      {"LARC_bf16", maker<LARC>(LARCOptions(0.1).weight_decay(1e-4).master_weights(true)),
       step_bytes<k::LarcPlan>(true), at::kBFloat16},
      {"NovoGrad_bf16", maker<NovoGrad>(NovoGradOptions(1e-2).master_weights(true)),
       step_bytes<k::NovoGradPlan>(true), at::kBFloat16},
      {"Lion_bf16", maker<Lion>(LionOptions(1e-4).weight_decay(0.1).master_weights(true)),
       step_bytes<k::LionPlan>(true), at::kBFloat16},
      {"AdamWScheduleFree_bf16",
       maker<AdamWScheduleFree>(AdamWScheduleFreeOptions(2.5e-3).weight_decay(0.1).master_weights(true)),
       step_bytes<k::ScheduleFreeAdamWPlan>(true), at::kBFloat16},
  };
  for (const ParamList& list : {bert_large(), resnet50(), many_small()}) {
    std::vector<Optimizer> here(std::begin(optimizers), std::end(optimizers));
    if (list.sizes.size() < 1000) here.insert(here.end(), std::begin(bf16), std::end(bf16));
    std::set<double> copy_bytes;  // one copy per distinct byte count
    for (const Optimizer& o : here) copy_bytes.insert(o.bytes_per_param);
    for (const double bytes : copy_bytes) {
      benchmark::RegisterBenchmark((std::string("copy/") + list.name + "/" + std::to_string(int(bytes)) + "B").c_str(),
                                   [list, bytes](benchmark::State& s) { bm_copy(s, list, bytes); })
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
    for (const Optimizer& o : here) {
      for (const bool fused : {true, false}) {
        const std::string name = std::string(o.name) + "/" + list.name + (fused ? "/fused" : "/reference");
        benchmark::RegisterBenchmark(name.c_str(), [list, o, fused](benchmark::State& s) {
          bm_step(s, list, o.make, fused, o.bytes_per_param, o.dtype);
        })->UseManualTime()->Unit(benchmark::kMillisecond);
      }
    }
  }
  return 0;
}

const int registered = register_all();

}  // namespace

BENCHMARK_MAIN();
