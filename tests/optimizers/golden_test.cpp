// Golden-value tests: every option variant of FORMULAS.md, on the fused and
// the reference path, against the float64 re-derivation in reference64.h.
// Tensors of odd sizes, one element, empty, all-zero weights, all-zero
// gradients, and one larger than a kernel chunk (parallel, several chunks).
#include "reference64.h"

#include <bigbatch/bigbatch.h>

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>

namespace {

using namespace bigbatch::optim;
using ref64::Vec;

using MakeFn = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>, bool)>;
using RefFn = std::function<void(std::vector<Vec>&, const std::vector<Vec>&, std::vector<ref64::State>&)>;

struct Variant {
  std::string name;
  MakeFn make;
  RefFn ref;
};

template <typename R>
RefFn per_tensor(R r) {
  return [r](std::vector<Vec>& ws, const std::vector<Vec>& gs, std::vector<ref64::State>& st) {
    for (std::size_t k = 0; k < ws.size(); ++k) r.step(ws[k], gs[k], st[k]);
  };
}
RefFn whole(ref64::Lamb r) {
  return [r](std::vector<Vec>& ws, const std::vector<Vec>& gs, std::vector<ref64::State>& st) {
    r.step(ws, gs, st);
  };
}

template <typename Opt, typename Options>
MakeFn maker(Options o) {
  return [o](std::vector<at::Tensor> params, bool fused) {
    Options copy = o;
    copy.fused(fused);
    return std::make_unique<Opt>(std::move(params), copy);
  };
}

ref64::Lars lars(double lr, double tc) { ref64::Lars r; r.lr = lr; r.tc = tc; return r; }
ref64::Larc larc(double lr) { ref64::Larc r; r.lr = lr; return r; }
ref64::Lamb lamb(double lr) { ref64::Lamb r; r.lr = lr; return r; }
ref64::NovoGrad novograd(double lr) { ref64::NovoGrad r; r.lr = lr; return r; }

std::vector<Variant> make_variants() {
  std::vector<Variant> v;
  {
    auto r = lars(1.0, 0.02);
    v.push_back({"LARS_plain", maker<LARS>(LARSOptions(1.0).trust_coefficient(0.02)), per_tensor(r)});
    r.wd = 0.01; r.nesterov = true; r.eps = 1e-8;
    v.push_back({"LARS_decay_nesterov_eps",
                 maker<LARS>(LARSOptions(1.0).trust_coefficient(0.02).weight_decay(0.01).nesterov(true).eps(1e-8)),
                 per_tensor(r)});
    auto n = lars(0.05, 1e-3); n.adapt = false; n.momentum = 0.5;
    v.push_back({"LARS_no_adapt", maker<LARS>(LARSOptions(0.05).adapt(false).momentum(0.5)), per_tensor(n)});
  }
  {
    auto r = larc(0.1);
    v.push_back({"LARC_clip", maker<LARC>(LARCOptions(0.1)), per_tensor(r)});
    auto s = larc(2.0); s.clip = false;
    v.push_back({"LARC_scale", maker<LARC>(LARCOptions(2.0).clip(false)), per_tensor(s)});
    auto nd = larc(0.1); nd.nesterov = true; nd.wd = 0.01;
    v.push_back({"LARC_clip_nesterov_decay", maker<LARC>(LARCOptions(0.1).nesterov(true).weight_decay(0.01)),
                 per_tensor(nd)});
    auto na = larc(0.05); na.adapt = false;
    v.push_back({"LARC_no_adapt", maker<LARC>(LARCOptions(0.05).adapt(false)), per_tensor(na)});
  }
  {
    v.push_back({"LAMB_defaults", maker<LAMB>(LAMBOptions(0.02)), whole(lamb(0.02))});
    auto c = lamb(0.02); c.max_grad_norm = 1.0;
    v.push_back({"LAMB_global_clip", maker<LAMB>(LAMBOptions(0.02).max_grad_norm(1.0)), whole(c)});
    auto nb = lamb(0.02); nb.bias_correction = false;
    v.push_back({"LAMB_no_bias_correction", maker<LAMB>(LAMBOptions(0.02).bias_correction(false)), whole(nb)});
    auto ga = lamb(0.02); ga.grad_averaging = false;
    v.push_back({"LAMB_no_grad_averaging", maker<LAMB>(LAMBOptions(0.02).grad_averaging(false)), whole(ga)});
    auto l2 = lamb(0.02); l2.adam_w_mode = false; l2.wd = 0.1;
    v.push_back({"LAMB_l2_mode", maker<LAMB>(LAMBOptions(0.02).adam_w_mode(false).weight_decay(0.1)), whole(l2)});
    auto aa = lamb(0.02); aa.wd = 0; aa.always_adapt = true;
    v.push_back({"LAMB_always_adapt", maker<LAMB>(LAMBOptions(0.02).weight_decay(0).always_adapt(true)), whole(aa)});
    auto nw = lamb(0.02); nw.wd = 0;
    v.push_back({"LAMB_no_decay_no_ratio", maker<LAMB>(LAMBOptions(0.02).weight_decay(0)), whole(nw)});
    auto tc = lamb(0.02); tc.trust_clip = true;
    v.push_back({"LAMB_trust_clip", maker<LAMB>(LAMBOptions(0.02).trust_clip(true)), whole(tc)});
    auto ds = lamb(0.02); ds.min_trust = 0.5; ds.max_trust = 2.0;
    v.push_back({"LAMB_trust_bounds", maker<LAMB>(LAMBOptions(0.02).min_trust(0.5).max_trust(2.0)), whole(ds)});
    auto na = lamb(0.02); na.adapt = false;
    v.push_back({"LAMB_no_adapt", maker<LAMB>(LAMBOptions(0.02).adapt(false)), whole(na)});
  }
  {
    v.push_back({"NovoGrad_defaults", maker<NovoGrad>(NovoGradOptions(1.0)), per_tensor(novograd(1.0))});
    auto r = novograd(1.0); r.grad_averaging = true; r.wd = 0.01;
    v.push_back({"NovoGrad_averaging_decay",
                 maker<NovoGrad>(NovoGradOptions(1.0).grad_averaging(true).weight_decay(0.01)), per_tensor(r)});
  }
  return v;
}

const std::vector<Variant>& variants() {
  static const std::vector<Variant> table = make_variants();
  return table;
}

// Sizes: empty, one element, odd, and more than one 16384-element chunk.
// Tensor 6 has all-zero weights, tensor 7 all-zero gradients.
const std::vector<std::int64_t> kSizes = {0, 1, 7, 33, 1000, 20000, 5, 3};
constexpr std::size_t kZeroWeights = 6;
constexpr std::size_t kZeroGrads = 7;

Vec to_vec(const at::Tensor& t) {
  const at::Tensor d = t.to(at::kDouble).contiguous();
  return Vec(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

struct GoldenRun {
  std::vector<at::Tensor> params;
  std::vector<Vec> ref;
  std::vector<Vec> start;
};

// Runs `steps` steps of the library optimizer and of the float64 reference
// on the same random gradients (drawn in `dtype`, so both see the same values).
GoldenRun run(const Variant& variant, bool fused, at::ScalarType dtype, int steps) {
  torch::manual_seed(7);
  GoldenRun r;
  for (std::size_t k = 0; k < kSizes.size(); ++k) {
    at::Tensor w = k == kZeroWeights ? at::zeros({kSizes[k]}) : at::randn({kSizes[k]});
    r.params.push_back(w.to(dtype).requires_grad_(true));
    r.ref.push_back(to_vec(r.params.back()));
  }
  r.start = r.ref;
  auto opt = variant.make(r.params, fused);
  std::vector<ref64::State> state(kSizes.size());
  for (int s = 0; s < steps; ++s) {
    std::vector<Vec> grads;
    for (std::size_t k = 0; k < kSizes.size(); ++k) {
      at::Tensor g = k == kZeroGrads ? at::zeros({kSizes[k]}) : 0.1 * at::randn({kSizes[k]});
      r.params[k].mutable_grad() = g.to(dtype);
      grads.push_back(to_vec(r.params[k].grad()));
    }
    opt->step();
    variant.ref(r.ref, grads, state);
  }
  return r;
}

class Golden : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(Golden, MatchesFloat64ReferenceInFp32) {
  const auto [index, fused] = GetParam();
  const Variant& variant = variants()[index];
  const GoldenRun r = run(variant, fused, at::kFloat, 4);
  double moved = 0;
  double total = 0;
  for (std::size_t k = 0; k < kSizes.size(); ++k) {
    const Vec got = to_vec(r.params[k]);
    double scale = 0;
    for (double e : r.ref[k]) scale = std::max(scale, std::abs(e));
    for (std::size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], r.ref[k][i], 2e-5 * scale + 1e-6)
          << variant.name << (fused ? " fused" : " reference") << ", tensor " << k << ", element " << i;
      moved += std::abs(r.ref[k][i] - r.start[k][i]);
      total += std::abs(r.start[k][i]);
    }
  }
  // The check above means something only if the steps moved the weights.
  EXPECT_GT(moved, 1e-3 * total) << variant.name;
}

TEST_P(Golden, Bf16ParametersRoundOnceFromFp32Math) {
  const auto [index, fused] = GetParam();
  const Variant& variant = variants()[index];
  const GoldenRun r = run(variant, fused, at::kBFloat16, 1);
  for (std::size_t k = 0; k < kSizes.size(); ++k) {
    EXPECT_EQ(r.params[k].scalar_type(), at::kBFloat16);
    const Vec got = to_vec(r.params[k]);
    for (std::size_t i = 0; i < got.size(); ++i) {
      // bf16 keeps 8 significant bits: the stored value is the float64
      // result rounded once, so it is within one unit in the last place.
      const double ulp = std::ldexp(1.0, std::ilogb(std::max(std::abs(r.ref[k][i]), 1e-30)) - 7);
      ASSERT_NEAR(got[i], r.ref[k][i], ulp + 1e-6)
          << variant.name << (fused ? " fused" : " reference") << ", tensor " << k << ", element " << i;
    }
  }
}

std::string variant_name(const ::testing::TestParamInfo<std::tuple<int, bool>>& info) {
  return variants()[std::get<0>(info.param)].name + (std::get<1>(info.param) ? "_fused" : "_reference");
}

INSTANTIATE_TEST_SUITE_P(AllVariants, Golden,
                         ::testing::Combine(::testing::Range(0, static_cast<int>(variants().size())),
                                            ::testing::Bool()),
                         variant_name);

}  // namespace
