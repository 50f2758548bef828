// SOAP's step on the hidden matrices of a GPT (4 layers of width 256: 16
// matrices, 3.1M parameters, factors up to 1024 x 1024), its costs apart:
//   fused          the whole step at precondition_frequency 10 (one refresh
//                  in ten steps: the timing covers 20 steps, two refreshes)
//   reference      the same on the reference path (one matrix at a time)
//   no_refresh     the fused step without a refresh: the rotations in and
//                  out, the factors' update and the elementwise part
//   elementwise    the fused step with no factor (max_precond_dim 1): Adam's
//                  pass and the update alone, through the same code
// so that the refresh costs fused - no_refresh (amortized over ten steps) and
// the rotations and factors no_refresh - elementwise. pytorch-optimizer's
// SOAP on the same list: benchmarks/python/bench_optim.py --suite soap. In
// ctest's smoke run the widths are cut down (smoke.h) and each case runs two
// steps.
#include "optimizer_bench.h"
#include "smoke.h"

#include "../bigbatch.h"

#include <benchmark/benchmark.h>

#include <string>
#include <vector>

namespace {

using namespace bigbatch::optim;
using bigbatch::bench::ShapeList;

void bm_soap(benchmark::State& state, const ShapeList& list, SOAPOptions options) {
  torch::manual_seed(0);
  std::vector<at::Tensor> params;
  for (const auto& s : list.shapes) {
    params.push_back((0.02 * at::randn(s)).requires_grad_(true));
    params.back().mutable_grad() = 1e-3 * at::randn(s);
  }
  SOAP opt(params, options);
  opt.step();  // the first step builds the factors and bases: outside the timing
  for (auto _ : state) opt.step();
  state.counters["params_M"] = static_cast<double>(list.sizes().total()) / 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  // The widths cut down in a smoke run (smoke.h).
  const ShapeList list = bigbatch::bench::gpt_matrices("gpt_mini_3M", 4, bigbatch::bench::dimension(256));
  const SOAPOptions base = SOAPOptions(3e-3).precondition_frequency(10);
  const int steps = bigbatch::bench::iterations(20);
  struct Case {
    const char* name;
    SOAPOptions options;
  };
  const std::vector<Case> cases = {
      {"fused", base},
      {"reference", SOAPOptions(base).fused(false)},
      {"no_refresh", SOAPOptions(base).precondition_frequency(1000000)},
      {"elementwise", SOAPOptions(base).max_precond_dim(1)},
  };
  for (const auto& c : cases) {
    benchmark::RegisterBenchmark((std::string("SOAP/") + c.name + "/" + list.name).c_str(), bm_soap, list, c.options)
        ->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(steps);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
