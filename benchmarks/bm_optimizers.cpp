// One optimizer step, fused against reference, on (a) ~10M fp32 parameters in
// 50 tensors of transformer-like sizes and (b) 1,000 small tensors, beside a
// plain copy moving the same number of bytes. bytes_per_second counts the
// bytes each fused step must move (kernels/*.h): LARS/LARC 28, LAMB 44,
// NovoGrad 24, Lion 24 (20 without the non-finite check's read of g),
// AdamWScheduleFree 32 (28), SGDScheduleFree 24 (20) per fp32 parameter; the
// copy reads half and writes half.
#include "optimizer_bench.h"

#include "../bigbatch.h"

#include <benchmark/benchmark.h>

#include <functional>
#include <memory>
#include <string>

namespace {

using namespace bigbatch::optim;
using bigbatch::bench::Make;
using bigbatch::bench::maker;
using bigbatch::bench::ParamList;

// (a) 24 blocks of a 640x640 weight, its bias, plus two norm vectors: 50 tensors, 9.84M.
ParamList large() {
  ParamList p{"large_10M_50t", {}};
  for (int i = 0; i < 24; ++i) {
    p.sizes.push_back(640 * 640);
    p.sizes.push_back(640);
  }
  p.sizes.push_back(640);
  p.sizes.push_back(640);
  return p;
}

// (b) 1,000 tensors of 64 to 1,024 elements (biases, norms, small heads).
ParamList small() {
  ParamList p{"small_1000t", {}};
  for (int i = 0; i < 1000; ++i) p.sizes.push_back(64 << (i % 5));
  return p;
}

void bm_step(benchmark::State& state, const ParamList& list, const Make& make, bool fused,
             double bytes_per_param) {
  torch::manual_seed(0);
  std::vector<at::Tensor> params;
  for (auto n : list.sizes) {
    params.push_back(at::randn({n}).requires_grad_(true));
    params.back().mutable_grad() = 1e-3 * at::randn({n});
  }
  auto opt = make(params, fused);
  opt->step();  // state allocation outside the timing
  for (auto _ : state) opt->step();
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes_per_param *
                                                    static_cast<double>(list.total())));
}

void bm_copy(benchmark::State& state, const ParamList& list, double bytes_per_param) {
  const auto floats = static_cast<std::int64_t>(bytes_per_param / 2 / 4 * static_cast<double>(list.total()));
  const auto src = at::randn({floats});
  auto dst = at::empty_like(src);
  dst.copy_(src);  // first touch outside the timing: page faults are not copying
  for (auto _ : state) {
    dst.copy_(src);
    benchmark::DoNotOptimize(dst.data_ptr());
  }
  state.SetBytesProcessed(state.iterations() * floats * 8);
}

}  // namespace

int main(int argc, char** argv) {
  struct Entry {
    const char* name;
    Make make;
    double bytes;
  };
  const std::vector<Entry> optimizers = {
      {"LARS", maker<LARS>(LARSOptions(0.1).weight_decay(1e-4)), 28},
      {"LARC", maker<LARC>(LARCOptions(0.1).weight_decay(1e-4)), 28},
      {"LAMB", maker<LAMB>(LAMBOptions(1e-3)), 44},
      {"NovoGrad", maker<NovoGrad>(NovoGradOptions(1e-3)), 24},
      {"Lion", maker<Lion>(LionOptions(1e-4).weight_decay(0.1)), 24},
      {"AdamWScheduleFree", maker<AdamWScheduleFree>(AdamWScheduleFreeOptions(2.5e-3).weight_decay(0.1)), 32},
      {"SGDScheduleFree", maker<SGDScheduleFree>(SGDScheduleFreeOptions(0.1)), 24},
  };
  for (const auto& list : {large(), small()}) {
    for (const auto& o : optimizers) {
      for (const bool fused : {true, false}) {
        const std::string name = std::string(o.name) + (fused ? "/fused/" : "/reference/") + list.name;
        benchmark::RegisterBenchmark(name.c_str(), bm_step, list, o.make, fused, o.bytes)
            ->Unit(benchmark::kMillisecond)->UseRealTime();
      }
      const std::string copy = std::string(o.name) + "/copy_same_bytes/" + list.name;
      benchmark::RegisterBenchmark(copy.c_str(), bm_copy, list, o.bytes)
          ->Unit(benchmark::kMillisecond)->UseRealTime();
    }
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
