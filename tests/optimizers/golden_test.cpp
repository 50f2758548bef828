// Golden-value tests: every option variant of docs/formulas.md, on the fused and
// the reference path, against the float64 re-derivation in reference64.h.
// Tensors of odd sizes, one element, empty, all-zero weights, all-zero
// gradients, and one larger than a kernel chunk (parallel, several chunks).
#include "engine_device.h"
#include "golden_check.h"
#include "reference64.h"

#include "../../bigbatch.h"

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <set>
#include <string>

namespace {

using namespace bigbatch::optim;
using ref64::Vec;
using golden::expect_fp32_close;
using golden::GoldenRun;
using golden::to_vec;

// (params, fused, master_weights) -> the optimizer of a variant.
using MakeFn = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>, bool, bool)>;
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
  return [o](std::vector<at::Tensor> params, bool fused, bool master_weights) {
    Options copy = o;
    copy.fused(fused).master_weights(master_weights);
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
    // always_adapt(false), timm's rule: the ratio only with weight decay.
    auto t = lars(0.05, 1e-3); t.adapt = false;
    v.push_back({"LARS_timm_rule_no_decay", maker<LARS>(LARSOptions(0.05).always_adapt(false)), per_tensor(t)});
    auto td = lars(1.0, 0.02); td.wd = 0.01;
    v.push_back({"LARS_timm_rule_decay",
                 maker<LARS>(LARSOptions(1.0).trust_coefficient(0.02).always_adapt(false).weight_decay(0.01)),
                 per_tensor(td)});
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
    auto tn = larc(0.05); tn.adapt = false;  // timm's rule without weight decay: no scale
    v.push_back({"LARC_timm_rule_no_decay", maker<LARC>(LARCOptions(0.05).always_adapt(false)), per_tensor(tn)});
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
  {
    ref64::Lion r; r.lr = 0.01;
    v.push_back({"Lion_defaults", maker<Lion>(LionOptions(0.01)), per_tensor(r)});
    ref64::Lion d; d.lr = 0.01; d.wd = 0.5; d.b1 = 0.95; d.b2 = 0.98;
    v.push_back({"Lion_decay_betas",
                 maker<Lion>(LionOptions(0.01).weight_decay(0.5).betas(std::make_tuple(0.95, 0.98))), per_tensor(d)});
  }
  {
    ref64::ScheduleFree a; a.lr = 0.01; a.wd = 0.1; a.warmup = 3;
    v.push_back({"AdamWScheduleFree_warmup_decay",
                 maker<AdamWScheduleFree>(AdamWScheduleFreeOptions(0.01).weight_decay(0.1).warmup_steps(3)),
                 per_tensor(a)});
    ref64::ScheduleFree p; p.lr = 0.01; p.b1 = 0.8; p.b2 = 0.99; p.r = 1; p.power = 1; p.eps = 1e-6;
    v.push_back({"AdamWScheduleFree_r_power",
                 maker<AdamWScheduleFree>(AdamWScheduleFreeOptions(0.01).betas(std::make_tuple(0.8, 0.99)).r(1)
                                              .weight_lr_power(1).eps(1e-6)),
                 per_tensor(p)});
    ref64::ScheduleFree s; s.lr = 0.5; s.adaptive = false; s.wd = 0.01; s.warmup = 2;
    v.push_back({"SGDScheduleFree_warmup_decay",
                 maker<SGDScheduleFree>(SGDScheduleFreeOptions(0.5).weight_decay(0.01).warmup_steps(2)),
                 per_tensor(s)});
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

// Where and how the library's tensors live in a run.
struct Placement {
  at::Device device = at::kCPU;
  bool misaligned = false;  ///< each tensor a view one element into its storage
  bool master_weights = false;
  std::vector<std::int64_t> sizes = kSizes;
};

// A tensor holding `values` on `where.device`, one element into a larger
// storage when `where.misaligned` (an address no vector load can assume).
at::Tensor place(const at::Tensor& values, const Placement& where) {
  if (!where.misaligned) return values.to(where.device);
  at::Tensor storage = at::zeros({values.numel() + 1}, values.options().device(where.device));
  at::Tensor view = storage.narrow(0, 1, values.numel());
  view.copy_(values);
  return view;
}

// Runs `steps` steps of the library optimizer and of the float64 reference
// on the same random gradients (drawn in `dtype`, so both see the same values).
GoldenRun run(const Variant& variant, bool fused, at::ScalarType dtype, int steps,
              const Placement& where = {}) {
  torch::manual_seed(7);
  GoldenRun r;
  const auto& sizes = where.sizes;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    at::Tensor w = k == kZeroWeights ? at::zeros({sizes[k]}) : at::randn({sizes[k]});
    r.params.push_back(place(w.to(dtype), where));
    if (!where.misaligned) r.params.back().requires_grad_(true);
    r.ref.push_back(to_vec(r.params.back()));
  }
  r.start = r.ref;
  r.opt = variant.make(r.params, fused, where.master_weights);
  std::vector<ref64::State> state(sizes.size());
  for (int s = 0; s < steps; ++s) {
    std::vector<Vec> grads;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      at::Tensor g = k == kZeroGrads ? at::zeros({sizes[k]}) : 0.1 * at::randn({sizes[k]});
      r.params[k].mutable_grad() = place(g.to(dtype), where);
      grads.push_back(to_vec(r.params[k].grad()));
    }
    r.opt->step();
    variant.ref(r.ref, grads, state);
  }
  r.states = state;
  return r;
}

// Asserts that every element is the float64 result rounded once to a type
// with `mantissa_bits` bits after the point: within one unit in the last place.
void expect_rounded_once(const std::vector<at::Tensor>& got_tensors, const std::vector<Vec>& ref,
                         int mantissa_bits, const std::string& what) {
  for (std::size_t k = 0; k < got_tensors.size(); ++k) {
    const Vec got = to_vec(got_tensors[k]);
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double ulp = std::ldexp(1.0, std::ilogb(std::max(std::abs(ref[k][i]), 1e-30)) - mantissa_bits);
      ASSERT_NEAR(got[i], ref[k][i], ulp + 1e-6) << what << ", tensor " << k << ", element " << i;
    }
  }
}

std::string path_name(bool fused) { return fused ? " fused" : " reference"; }

class Golden : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(Golden, MatchesFloat64ReferenceInFp32) {
  const auto [index, fused] = GetParam();
  const Variant& variant = variants()[index];
  expect_fp32_close(run(variant, fused, at::kFloat, 4), variant.name + path_name(fused));
}

TEST_P(Golden, Bf16ParametersRoundOnceFromFp32Math) {
  const auto [index, fused] = GetParam();
  const Variant& variant = variants()[index];
  const GoldenRun r = run(variant, fused, at::kBFloat16, 1);
  for (const auto& p : r.params) EXPECT_EQ(p.scalar_type(), at::kBFloat16);
  // bf16 keeps 8 significant bits: the stored value is the float64 result
  // rounded once, so it is within one unit in the last place.
  expect_rounded_once(r.params, r.ref, 7, variant.name + path_name(fused));
}

// With master weights, 16-bit parameters follow the fp32 trajectory: the
// master copy matches the float64 reference to fp32 rounding over several
// steps, and the parameter is that copy rounded once.
at::Tensor master_of(const torch::optim::OptimizerParamState& st) {
  if (const auto* s = dynamic_cast<const LARSParamState*>(&st)) return s->master();
  if (const auto* s = dynamic_cast<const LARCParamState*>(&st)) return s->master();
  if (const auto* s = dynamic_cast<const LAMBParamState*>(&st)) return s->master();
  if (const auto* s = dynamic_cast<const LionParamState*>(&st)) return s->master();
  if (const auto* s = dynamic_cast<const AdamWScheduleFreeParamState*>(&st)) return s->master();
  if (const auto* s = dynamic_cast<const SGDScheduleFreeParamState*>(&st)) return s->master();
  return dynamic_cast<const NovoGradParamState&>(st).master();
}

void expect_master_weights_track_fp32(const Variant& variant, bool fused, Placement where) {
  where.master_weights = true;
  const GoldenRun r = run(variant, fused, at::kBFloat16, 4, where);
  std::vector<at::Tensor> masters;
  for (const auto& p : r.params) {
    masters.push_back(master_of(*r.opt->state().at(bigbatch::compat::optimizer_state_key(p))));
    ASSERT_TRUE(masters.back().defined() && masters.back().scalar_type() == at::kFloat) << variant.name;
  }
  GoldenRun m{masters, r.ref, r.start, nullptr};
  expect_fp32_close(m, variant.name + path_name(fused) + " master");
  for (std::size_t k = 0; k < masters.size(); ++k) {
    EXPECT_TRUE(at::equal(masters[k].to(at::kBFloat16), r.params[k])) << variant.name << ", tensor " << k;
  }
}

// Schedule-Free: eval() puts the parameters at the reference's x (the
// average it keeps explicitly), train() back at y; a step in eval mode throws.
TEST(GoldenScheduleFree, EvalIsTheAverageAndTrainIsBack) {
  int checked = 0;
  for (const Variant& v : variants()) {
    if (v.name.find("ScheduleFree") == std::string::npos) continue;
    for (const bool fused : {true, false}) {
      for (const bool master : {false, true}) {
        Placement where;
        where.master_weights = master;
        GoldenRun r = run(v, fused, master ? at::kBFloat16 : at::kFloat, 4, where);
        auto& opt = dynamic_cast<LayerwiseOptimizerBase&>(*r.opt);
        ASSERT_TRUE(opt.has_evaluation_point());
        const std::vector<at::Tensor> y = [&] {
          std::vector<at::Tensor> out;
          for (const auto& p : r.params) out.push_back(p.detach().clone());
          return out;
        }();
        opt.eval();
        EXPECT_FALSE(opt.is_training());
        EXPECT_THROW(opt.step(), c10::Error) << v.name;
        std::vector<Vec> x;
        for (const auto& s : r.states) x.push_back(s.x);
        const std::string what = v.name + path_name(fused) + (master ? " bf16 master" : "") + " at x";
        if (master) {
          expect_rounded_once(r.params, x, 7, what);
        } else {
          expect_fp32_close(GoldenRun{r.params, x, r.start, nullptr, {}}, what);
        }
        opt.train();
        for (std::size_t k = 0; k < y.size(); ++k) {  // y comes back exactly (the master copy, or eval()'s copy)
          EXPECT_TRUE(at::equal(r.params[k], y[k])) << what << ", tensor " << k;
        }
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 12);
}

TEST_P(Golden, MasterWeightsTrackTheFp32Trajectory) {
  const auto [index, fused] = GetParam();
  expect_master_weights_track_fp32(variants()[index], fused, {});
}

// ---------------------------------------------------------------- CUDA ------
// The fused CUDA path against the same float64 reference; skipped without a
// GPU, and run on the SIMT executor in simt_optimizers_tests.

class GoldenCuda : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (!engine_available()) GTEST_SKIP() << "no CUDA device";
  }
  const Variant& variant() const { return variants()[GetParam()]; }
  static Placement cuda(bool misaligned = false) {
    Placement p;
    p.device = engine_device();
    p.misaligned = misaligned;
    return p;
  }
};

TEST_P(GoldenCuda, MatchesFloat64ReferenceInFp32_CUDA) {
  expect_fp32_close(run(variant(), true, at::kFloat, 4, cuda()), variant().name + " CUDA");
}

TEST_P(GoldenCuda, MisalignedTensorsMatchFloat64Reference_CUDA) {
  expect_fp32_close(run(variant(), true, at::kFloat, 4, cuda(true)), variant().name + " CUDA misaligned");
}

TEST_P(GoldenCuda, Bf16ParametersRoundOnceFromFp32Math_CUDA) {
  const GoldenRun r = run(variant(), true, at::kBFloat16, 1, cuda());
  expect_rounded_once(r.params, r.ref, 7, variant().name + " CUDA bf16");
}

TEST_P(GoldenCuda, Fp16ParametersRoundOnceFromFp32Math_CUDA) {
  const GoldenRun r = run(variant(), true, at::kHalf, 1, cuda());
  expect_rounded_once(r.params, r.ref, 10, variant().name + " CUDA fp16");
}

TEST_P(GoldenCuda, MasterWeightsTrackTheFp32Trajectory_CUDA) {
  expect_master_weights_track_fp32(variant(), true, cuda());
  expect_master_weights_track_fp32(variant(), true, cuda(true));
}

TEST_P(GoldenCuda, SameBitsTwice_CUDA) {
  Placement where = cuda();
  where.sizes = {70000, 3, 16384, 16385, 0, 1, 5, 9};  // several chunks in a tensor
  const GoldenRun a = run(variant(), true, at::kFloat, 3, where);
  const GoldenRun b = run(variant(), true, at::kFloat, 3, where);
  for (std::size_t k = 0; k < a.params.size(); ++k) {
    EXPECT_TRUE(at::equal(a.params[k], b.params[k])) << variant().name << ", tensor " << k;
  }
}

TEST_P(GoldenCuda, ThousandsOfTensorsInOneStep_CUDA) {
#if defined(BIGBATCH_SIMT)
  // On the executor (~10 s a variant) the 3,000-tensor step runs once per pass
  // plan: LARS, LARC, LAMB with its norm pass, LAMB with global clipping, NovoGrad, Schedule-Free.
  static const std::set<std::string> plans = {"LARS_plain", "LARC_clip", "LAMB_defaults", "LAMB_global_clip",
                                              "NovoGrad_defaults", "AdamWScheduleFree_warmup_decay"};
  if (plans.count(variant().name) == 0) GTEST_SKIP() << "covered on the executor by the variant of its pass plan";
#endif
  Placement where = cuda();
  where.sizes.clear();
  for (int k = 0; k < 3000; ++k) where.sizes.push_back(1 + (k * 37) % 301);  // odd, small, many
  where.sizes[100] = 40000;
  expect_fp32_close(run(variant(), true, at::kFloat, 2, where), variant().name + " CUDA 3000 tensors");
}

INSTANTIATE_TEST_SUITE_P(AllVariants, GoldenCuda, ::testing::Range(0, static_cast<int>(variants().size())),
                         [](const auto& info) { return variants()[info.param].name; });

std::string variant_name(const ::testing::TestParamInfo<std::tuple<int, bool>>& info) {
  return variants()[std::get<0>(info.param)].name + (std::get<1>(info.param) ? "_fused" : "_reference");
}

INSTANTIATE_TEST_SUITE_P(AllVariants, Golden,
                         ::testing::Combine(::testing::Range(0, static_cast<int>(variants().size())),
                                            ::testing::Bool()),
                         variant_name);

}  // namespace
