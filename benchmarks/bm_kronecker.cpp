// The Kronecker-factored optimizers' steps, SOAP's and Shampoo's, on the
// hidden matrices of a GPT (4 layers of width 256: 16 matrices, 3.1M
// parameters, factors up to 1024 x 1024), their costs apart. SOAP:
//   fused          the whole step at precondition_frequency 10 (one refresh
//                  in ten steps: the timing covers 20 steps, two refreshes)
//   reference      the same on the reference path (one matrix at a time)
//   no_refresh     the fused step without a refresh: the rotations in and
//                  out, the factors' update and the elementwise part
//   elementwise    the fused step with no factor (max_precond_dim 1): Adam's
//                  pass and the update alone, through the same code
// so that the refresh costs fused - no_refresh (amortized over ten steps) and
// the rotations and factors no_refresh - elementwise. Shampoo (Adam grafting,
// blocks of 1024, the factors summed):
//   fused          the whole step, inverse roots every 10 steps
//   reference      the same on the reference path (one block at a time)
//   every_step     the roots at every step (precondition_frequency 1)
//   graft_only     before the start step: the factors' products, the graft
//                  and the update, no preconditioning and no root
// so that one recomputation of the roots costs (every_step - fused) * 10/9,
// and the preconditioning products fused - graft_only less the roots' tenth.
// pytorch-optimizer's SOAP and ScalableShampoo on the same list:
// benchmarks/python/bench_optim.py --suite soap / shampoo. In ctest's smoke
// run the widths are cut down (smoke.h) and each case runs two steps.
#include "optimizer_bench.h"
#include "smoke.h"

#include "../bigbatch.h"

#include <benchmark/benchmark.h>

#include <string>
#include <vector>

namespace {

using namespace bigbatch::optim;
using bigbatch::bench::ShapeList;

// `warm` steps outside the timing: SOAP's first builds the factors and bases;
// Shampoo's until its start step precondition nothing.
template <typename Optimizer, typename Options>
void bm_step(benchmark::State& state, const ShapeList& list, Options options, int warm) {
  torch::manual_seed(0);
  std::vector<at::Tensor> params;
  for (const auto& s : list.shapes) {
    params.push_back((0.02 * at::randn(s)).requires_grad_(true));
    params.back().mutable_grad() = 1e-3 * at::randn(s);
  }
  Optimizer opt(params, options);
  for (int i = 0; i < warm; ++i) opt.step();
  for (auto _ : state) opt.step();
  state.counters["params_M"] = static_cast<double>(list.sizes().total()) / 1e6;
}

template <typename Options>
struct Case {
  const char* name;
  Options options;
  int warm;
};

template <typename Optimizer, typename Options>
void register_cases(const char* optimizer, const ShapeList& list, int steps, const std::vector<Case<Options>>& cases) {
  for (const auto& c : cases) {
    benchmark::RegisterBenchmark((std::string(optimizer) + "/" + c.name + "/" + list.name).c_str(),
                                 bm_step<Optimizer, Options>, list, c.options, c.warm)
        ->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(steps);
  }
}

}  // namespace

int main(int argc, char** argv) {
  // The widths cut down in a smoke run (smoke.h).
  const ShapeList list = bigbatch::bench::gpt_matrices("gpt_mini_3M", 4, bigbatch::bench::dimension(256));
  const int steps = bigbatch::bench::iterations(20);
  const SOAPOptions soap = SOAPOptions(3e-3).precondition_frequency(10);
  register_cases<SOAP, SOAPOptions>("SOAP", list, steps,
                                    {{"fused", soap, 1},
                                     {"reference", SOAPOptions(soap).fused(false), 1},
                                     {"no_refresh", SOAPOptions(soap).precondition_frequency(1000000), 1},
                                     {"elementwise", SOAPOptions(soap).max_precond_dim(1), 1}});
  // The timed steps follow the start step (10): roots at 20 and 30 of steps 11-30.
  const ShampooOptions shampoo = ShampooOptions(1e-3).precondition_frequency(10);
  register_cases<Shampoo, ShampooOptions>(
      "Shampoo", list, steps,
      {{"fused", shampoo, 10},
       {"reference", ShampooOptions(shampoo).fused(false), 10},
       {"every_step", ShampooOptions(shampoo).precondition_frequency(1), 1},
       {"graft_only", ShampooOptions(shampoo).start_preconditioning_step(1000000), 1}});
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
