// How the optimizers behave as torch::optim::Optimizers: per-group options,
// the two-group helper, save/load continuation, non-finite skipping, bad
// input, LibTorch schedulers, and fused against reference on a network.
#include "engine_device.h"
#include "reference64.h"

#include "../../bigbatch.h"
#include "../../compat/warnings.h"

#include <gtest/gtest.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/schedulers/step_lr.h>
#include <torch/cuda.h>
#include <torch/serialize.h>

#include <sstream>
#include <string>

namespace {

using namespace bigbatch::optim;

// Expects `fn` to throw a c10::Error whose message contains `needle`.
template <typename F>
void expect_error(F fn, const std::string& needle) {
  try {
    fn();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message was: " << e.what_without_backtrace();
    return;
  }
  ADD_FAILURE() << "no error thrown, expected one containing '" << needle << "'";
}

torch::nn::Sequential small_net() {
  torch::manual_seed(3);
  return torch::nn::Sequential(torch::nn::Linear(10, 16), torch::nn::ReLU(),
                               torch::nn::LayerNorm(torch::nn::LayerNormOptions({16})),
                               torch::nn::Linear(16, 3));
}

// One training step on a fixed random batch chosen by `seed`.
void train_step(torch::nn::Sequential& net, torch::optim::Optimizer& opt, int seed) {
  torch::manual_seed(1000 + seed);
  const auto x = torch::randn({32, 10});
  const auto y = torch::randint(0, 3, {32});
  opt.zero_grad();
  torch::nn::functional::cross_entropy(net->forward(x), y).backward();
  opt.step();
}

std::vector<at::Tensor> snapshot(const torch::nn::Module& net) {
  std::vector<at::Tensor> out;
  for (const auto& p : net.parameters()) out.push_back(p.detach().clone());
  return out;
}

// ------------------------------------------------------------------ groups --

TEST(Groups, PerGroupOptionsSurviveConstruction) {
  auto net = small_net();
  auto groups = layerwise_param_groups(*net, LAMBOptions(2e-3).weight_decay(0.05));
  ASSERT_EQ(groups.size(), 2u);
  LAMB opt(groups, LAMBOptions(1e-3));
  const auto& weights = static_cast<const LAMBOptions&>(opt.param_groups()[0].options());
  const auto& others = static_cast<const LAMBOptions&>(opt.param_groups()[1].options());
  EXPECT_DOUBLE_EQ(weights.lr(), 2e-3);
  EXPECT_DOUBLE_EQ(weights.weight_decay(), 0.05);
  EXPECT_TRUE(weights.adapt());
  EXPECT_DOUBLE_EQ(others.weight_decay(), 0.0);
  EXPECT_FALSE(others.adapt());
  EXPECT_DOUBLE_EQ(static_cast<const LAMBOptions&>(opt.defaults()).lr(), 1e-3);
  // 2-D weights in group 0; biases and LayerNorm's scale and shift in group 1.
  for (const auto& p : opt.param_groups()[0].params()) EXPECT_EQ(p.dim(), 2);
  for (const auto& p : opt.param_groups()[1].params()) EXPECT_EQ(p.dim(), 1);
  EXPECT_EQ(opt.param_groups()[0].params().size() + opt.param_groups()[1].params().size(),
            net->parameters().size());
}

TEST(Groups, ANoAdaptGroupStepsWithoutTrustRatio) {
  // Group 1 (adapt false, no decay) must take the plain bias-corrected Adam
  // step, which a float64 LAMB with adapt=false reproduces.
  torch::manual_seed(5);
  auto w = torch::randn({4, 3}).requires_grad_(true);
  auto b = torch::randn({3}).requires_grad_(true);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{w});
  groups.emplace_back(std::vector<at::Tensor>{b},
                      std::make_unique<LAMBOptions>(LAMBOptions(0.1).weight_decay(0).adapt(false)));
  LAMB opt(groups, LAMBOptions(0.1));
  ref64::Lamb ref;
  ref.lr = 0.1;
  ref.wd = 0;
  ref.adapt = false;
  std::vector<ref64::Vec> wb = {ref64::Vec(b.data_ptr<float>(), b.data_ptr<float>() + 3)};
  std::vector<ref64::State> st(1);
  for (int s = 0; s < 3; ++s) {
    w.mutable_grad() = torch::randn({4, 3});
    b.mutable_grad() = torch::randn({3});
    ref.step(wb, {ref64::Vec(b.grad().data_ptr<float>(), b.grad().data_ptr<float>() + 3)}, st);
    opt.step();
  }
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(b[i].item<double>(), wb[0][i], 1e-5);
}

TEST(Groups, RejectsOptionsOfAnotherOptimizer) {
  auto w = torch::zeros({2}, torch::requires_grad());
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{w}, std::make_unique<LARSOptions>(0.1));
  expect_error([&] { LAMB opt(groups, LAMBOptions()); }, "are not LAMBOptions");
}

TEST(Groups, InvalidGroupOptionsFailInTheConstructor) {
  auto w = torch::zeros({2}, torch::requires_grad());
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{w}, std::make_unique<NovoGradOptions>(NovoGradOptions(-0.5)));
  expect_error([&] { NovoGrad opt(groups, NovoGradOptions()); }, "Invalid NovoGrad option lr: -0.5");
}

// ---------------------------------------------------------------- save/load --

template <typename Opt, typename Options>
void expect_save_load_continues(const Options& options) {
  constexpr int kSteps = 5;
  // Straight: 2N steps.
  auto straight = small_net();
  Opt opt_straight(layerwise_param_groups(*straight, options), options);
  for (int s = 0; s < 2 * kSteps; ++s) train_step(straight, opt_straight, s);

  // N steps, save model and optimizer, load both into fresh objects, N more.
  auto first = small_net();
  Opt opt_first(layerwise_param_groups(*first, options), options);
  for (int s = 0; s < kSteps; ++s) train_step(first, opt_first, s);
  std::stringstream model_bytes;
  std::stringstream opt_bytes;
  torch::save(first, model_bytes);
  torch::save(opt_first, opt_bytes);

  auto second = small_net();
  torch::load(second, model_bytes);
  Opt opt_second(layerwise_param_groups(*second, options), options);
  torch::load(opt_second, opt_bytes);
  EXPECT_EQ(opt_second.state().size(), opt_first.state().size());
  for (int s = kSteps; s < 2 * kSteps; ++s) train_step(second, opt_second, s);

  const auto a = snapshot(*straight);
  const auto b = snapshot(*second);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
  }
}

TEST(SaveLoad, LARSContinuesAsIfNeverStopped) { expect_save_load_continues<LARS>(LARSOptions(0.5)); }
TEST(SaveLoad, LARCContinuesAsIfNeverStopped) { expect_save_load_continues<LARC>(LARCOptions(0.1)); }
TEST(SaveLoad, LAMBContinuesAsIfNeverStopped) { expect_save_load_continues<LAMB>(LAMBOptions(0.01)); }
TEST(SaveLoad, NovoGradContinuesAsIfNeverStopped) {
  expect_save_load_continues<NovoGrad>(NovoGradOptions(0.01));
}

TEST(SaveLoad, LionContinuesAsIfNeverStopped) {
  expect_save_load_continues<Lion>(LionOptions(1e-3).weight_decay(0.1));
}

TEST(SaveLoad, ScheduleFreeContinuesAsIfNeverStopped) {
  expect_save_load_continues<AdamWScheduleFree>(AdamWScheduleFreeOptions(0.01).weight_decay(0.1).warmup_steps(3));
  expect_save_load_continues<SGDScheduleFree>(SGDScheduleFreeOptions(0.1).warmup_steps(3));
}

// Saved at the evaluation point (the parameters at x), loaded: the mode
// comes back, so train() moves the loaded parameters to y (by the inverse
// interpolation: the copy of y eval() kept is not saved) and the run goes on
// as the uninterrupted one, to rounding.
TEST(SaveLoad, SOAPContinuesAsIfNeverStopped) {
  // Its factors, bases and rotated moments are state; a refresh falls in each half.
  expect_save_load_continues<SOAP>(SOAPOptions(0.01).precondition_frequency(2));
}

TEST(SaveLoad, ShampooContinuesAsIfNeverStopped) {
  // Its factors, inverse roots, filtered gradient, graft and momentum are
  // state; a refresh falls in each half.
  expect_save_load_continues<Shampoo>(
      ShampooOptions(0.01).betas({0.9, 0.99}).momentum(0.5).precondition_frequency(2).epsilon(1e-5));
}

TEST(SaveLoad, ScheduleFreeSavedInEvalModeResumesThroughTrain) {
  const auto options = AdamWScheduleFreeOptions(0.01).weight_decay(0.1);
  auto straight = small_net();
  AdamWScheduleFree opt_straight(layerwise_param_groups(*straight, options), options);
  auto first = small_net();
  AdamWScheduleFree opt_first(layerwise_param_groups(*first, options), options);
  for (int s = 0; s < 4; ++s) {
    train_step(straight, opt_straight, s);
    train_step(first, opt_first, s);
  }
  opt_first.eval();
  std::stringstream model_bytes;
  std::stringstream opt_bytes;
  torch::save(first, model_bytes);
  torch::save(opt_first, opt_bytes);
  auto second = small_net();
  torch::load(second, model_bytes);
  AdamWScheduleFree opt_second(layerwise_param_groups(*second, options), options);
  torch::load(opt_second, opt_bytes);
  EXPECT_FALSE(opt_second.is_training());
  opt_second.train();
  {
    const auto a = snapshot(*straight);
    const auto b = snapshot(*second);
    for (std::size_t i = 0; i < a.size(); ++i) {
      EXPECT_LE((a[i] - b[i]).abs().max().item<double>(), 1e-6 * (1 + a[i].abs().max().item<double>()));
    }
  }
  opt_straight.eval();
  opt_straight.train();  // y kept: exactly where it was
  for (int s = 4; s < 8; ++s) {
    train_step(straight, opt_straight, s);
    train_step(second, opt_second, s);
  }
  const auto a = snapshot(*straight);
  const auto b = snapshot(*second);
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_LE(((a[i] - b[i]).norm() / a[i].norm()).item<double>(), 1e-5) << "parameter " << i;
  }
}

TEST(SaveLoad, KeepsTheSkippedStepCounter) {
  auto w = torch::ones({3}, torch::requires_grad());
  LAMB opt({w}, LAMBOptions());
  w.mutable_grad() = torch::full({3}, std::numeric_limits<float>::quiet_NaN());
  opt.step();
  std::stringstream bytes;
  torch::save(opt, bytes);
  LAMB loaded({w}, LAMBOptions());
  torch::load(loaded, bytes);
  EXPECT_EQ(loaded.skipped_steps(), 1);
}

// ---------------------------------------------------------------- non-finite --

// The paths a step can take: 0 the reference, 1 fused on the CPU, 2 fused on
// CUDA (named _CUDA, skipped without a GPU; on the SIMT executor in simt_optimizers_tests).
at::Device path_device(int path) { return path == 2 ? engine_device() : at::Device(at::kCPU); }
bool path_fused(int path) { return path != 0; }

// `poisons_weights`: without the skip, the bad gradient makes the weights
// non-finite (Lion's sign of a non-finite value is finite: only its momentum is).
template <typename Opt, typename Options>
void expect_nonfinite_step_skipped(const Options& options, float bad, at::Device device, bool poisons_weights = true) {
  const auto on = torch::TensorOptions().device(device);
  auto a = torch::randn({5}).to(device).requires_grad_(true);
  auto b = torch::randn({4}).to(device).requires_grad_(true);
  Opt opt({a, b}, options);
  a.mutable_grad() = torch::randn({5}).to(device);
  b.mutable_grad() = torch::randn({4}).to(device);
  opt.step();  // state exists now
  const auto a0 = a.detach().clone();
  const auto b0 = b.detach().clone();
  std::stringstream before;
  torch::save(opt, before);

  a.mutable_grad() = torch::randn({5}, on);
  b.mutable_grad() = torch::randn({4}, on);
  b.mutable_grad()[2] = bad;  // one bad element in the second tensor
  opt.step();
  EXPECT_EQ(opt.skipped_steps(), 1);
  EXPECT_TRUE(torch::equal(a, a0)) << "a finite tensor of a skipped step changed";
  EXPECT_TRUE(torch::equal(b, b0));
  // The state too: compare with the state saved before the skipped step.
  Opt reloaded({a, b}, options);
  torch::load(reloaded, before, device);
  for (const auto& p : {a, b}) {
    const auto* s0 = opt.param_state(p);
    const auto* s1 = reloaded.param_state(p);
    ASSERT_TRUE(s0 != nullptr && s1 != nullptr);
    EXPECT_TRUE(*s0 == *s1) << "state of a tensor changed in a skipped step";
  }

  // Skipping off: the step is applied as computed and b becomes non-finite.
  Options apply = options;
  apply.skip_nonfinite(false);
  Opt loose({a, b}, apply);
  loose.step();
  EXPECT_EQ(loose.skipped_steps(), 0);
  EXPECT_NE(torch::isfinite(b).all().item<bool>(), poisons_weights);
}

class NonFinite : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (GetParam() == 2 && !engine_available()) GTEST_SKIP() << "no CUDA device";
  }
  bool fused() const { return path_fused(GetParam()); }
  at::Device device() const { return path_device(GetParam()); }
};
TEST_P(NonFinite, LARSSkipsTheWholeStep) {
  expect_nonfinite_step_skipped<LARS>(LARSOptions(0.1).fused(fused()), NAN, device());
}
TEST_P(NonFinite, LARCSkipsTheWholeStep) {
  expect_nonfinite_step_skipped<LARC>(LARCOptions(0.1).fused(fused()), INFINITY, device());
}
TEST_P(NonFinite, LAMBSkipsTheWholeStep) {
  expect_nonfinite_step_skipped<LAMB>(LAMBOptions(0.1).fused(fused()), -INFINITY, device());
}
TEST_P(NonFinite, LAMBWithClippingSkipsTheWholeStep) {
  expect_nonfinite_step_skipped<LAMB>(LAMBOptions(0.1).max_grad_norm(1).fused(fused()), NAN, device());
}
TEST_P(NonFinite, NovoGradSkipsTheWholeStep) {
  expect_nonfinite_step_skipped<NovoGrad>(NovoGradOptions(0.1).fused(fused()), NAN, device());
}
TEST_P(NonFinite, LionSkipsTheWholeStep) {
  for (const float bad : {NAN, INFINITY}) {
    expect_nonfinite_step_skipped<Lion>(LionOptions(0.1).weight_decay(0.1).fused(fused()), bad, device(),
                                        /*poisons_weights=*/false);
  }
}
TEST_P(NonFinite, ScheduleFreeSkipsTheWholeStepAndItsWeight) {
  // The state compared after the skip holds the weight sum and largest rate too.
  expect_nonfinite_step_skipped<AdamWScheduleFree>(
      AdamWScheduleFreeOptions(0.1).weight_decay(0.1).warmup_steps(2).fused(fused()), NAN, device());
  expect_nonfinite_step_skipped<SGDScheduleFree>(SGDScheduleFreeOptions(0.1).warmup_steps(2).fused(fused()),
                                                 INFINITY, device());
}
TEST_P(NonFinite, SOAPSkipsTheWholeStep) {
  // The step without the skip is a fresh optimizer's first, which builds the
  // factors and moves nothing: the weights stay finite.
  expect_nonfinite_step_skipped<SOAP>(SOAPOptions(0.1).precondition_1d(true).fused(fused()), NAN, device(),
                                      /*poisons_weights=*/false);
  expect_nonfinite_step_skipped<SOAP>(SOAPOptions(0.1).fused(fused()), INFINITY, device(), /*poisons_weights=*/false);
}
TEST_P(NonFinite, ShampooSkipsTheWholeStep) {
  expect_nonfinite_step_skipped<Shampoo>(ShampooOptions(0.1).fused(fused()), NAN, device());
  expect_nonfinite_step_skipped<Shampoo>(ShampooOptions(0.1).momentum(0.9).grafting("adagrad").fused(fused()),
                                         INFINITY, device());
}
TEST_P(NonFinite, AFirstStepSkippedCreatesNoState) {
  auto w = torch::randn({3}).to(device()).requires_grad_(true);
  LAMB opt({w}, LAMBOptions().fused(fused()));
  w.mutable_grad() = torch::tensor({1.0f, NAN, 2.0f}).to(device());
  opt.step();
  EXPECT_EQ(opt.skipped_steps(), 1);
  if (fused()) {
    // The engine decides after the state exists: it stays, zero, at step 0,
    // which the next step cannot tell from no state.
    const auto* st = opt.param_state(w);
    ASSERT_NE(st, nullptr);
    EXPECT_EQ(st->step(), 0);
    EXPECT_EQ(st->exp_avg().abs().sum().item<float>(), 0.0f);
    EXPECT_EQ(st->exp_avg_sq().abs().sum().item<float>(), 0.0f);
    return;
  }
  EXPECT_EQ(opt.param_state(w), nullptr);
  EXPECT_TRUE(opt.state().empty());
}
TEST_P(NonFinite, HugeFiniteGradientsAreNotSkipped) {
  // 1e30^2 overflows fp32 but the gradient is finite: the step must happen.
  auto w = torch::ones({2}).to(device()).requires_grad_(true);
  LARS opt({w}, LARSOptions(0.1).fused(fused()));
  w.mutable_grad() = torch::full({2}, 1e30f).to(device());
  opt.step();
  EXPECT_EQ(opt.skipped_steps(), 0);
  EXPECT_LT(w[0].item<float>(), 1.0f);
}
INSTANTIATE_TEST_SUITE_P(Paths, NonFinite, ::testing::Values(0, 1, 2), [](const auto& info) {
  return std::string(info.param == 0 ? "reference" : info.param == 1 ? "fused" : "fused_CUDA");
});

// ------------------------------------------------------------- engine hooks --
// The options as the engine's plans receive them: every option of
// docs/formulas.md lands in its member (a member a plan adds and the optimizer
// does not fill keeps its zero default, which these values tell apart).

TEST(EngineHooks, OptionsReachThePlansMemberByMember) {
  const auto lars = kernel_group(LARSOptions(0.5).momentum(0.8).weight_decay(1e-4).eps(1e-9));
  EXPECT_EQ(lars.lr, 0.5);
  EXPECT_EQ(lars.momentum, 0.8);
  EXPECT_EQ(lars.weight_decay, 1e-4);
  EXPECT_EQ(lars.eps, 1e-9);
  EXPECT_EQ(lars.trust_coefficient, 1e-3);
  EXPECT_TRUE(lars.adapt && lars.skip_nonfinite && !lars.nesterov);

  const auto larc = kernel_group(LARCOptions(0.1).clip(false).nesterov(true).skip_nonfinite(false));
  EXPECT_EQ(larc.trust_coefficient, 0.02);
  EXPECT_TRUE(larc.adapt && larc.nesterov && !larc.clip && !larc.skip_nonfinite);
  const auto larc_plain = kernel_group(LARCOptions(0.1).adapt(false));
  EXPECT_TRUE(!larc_plain.adapt && larc_plain.clip && larc_plain.skip_nonfinite && !larc_plain.nesterov);

  const auto lamb = kernel_group(LAMBOptions(0.02).betas({0.8, 0.9}).max_grad_norm(1).min_trust(0.01).max_trust(10));
  EXPECT_EQ(lamb.lr, 0.02);
  EXPECT_EQ(lamb.beta1, 0.8);
  EXPECT_EQ(lamb.beta2, 0.9);
  EXPECT_EQ(lamb.eps, 1e-6);
  EXPECT_EQ(lamb.weight_decay, 0.01);
  EXPECT_EQ(lamb.max_grad_norm, 1.0);
  EXPECT_EQ(lamb.min_trust, 0.01);
  EXPECT_EQ(lamb.max_trust, 10.0);
  EXPECT_TRUE(lamb.adapt && lamb.bias_correction && lamb.grad_averaging && lamb.adam_w_mode && lamb.skip_nonfinite);
  EXPECT_TRUE(!lamb.always_adapt && !lamb.trust_clip);
  const auto lamb_flipped = kernel_group(LAMBOptions().bias_correction(false).grad_averaging(false).adam_w_mode(false)
                                             .always_adapt(true).trust_clip(true).adapt(false).skip_nonfinite(false));
  EXPECT_TRUE(lamb_flipped.always_adapt && lamb_flipped.trust_clip);
  EXPECT_TRUE(!lamb_flipped.adapt && !lamb_flipped.bias_correction && !lamb_flipped.grad_averaging &&
              !lamb_flipped.adam_w_mode && !lamb_flipped.skip_nonfinite);

  const auto novograd = kernel_group(NovoGradOptions(0.3).weight_decay(1e-3));
  EXPECT_EQ(novograd.lr, 0.3);
  EXPECT_EQ(novograd.beta1, 0.95);
  EXPECT_EQ(novograd.beta2, 0.98);
  EXPECT_EQ(novograd.eps, 1e-8);
  EXPECT_EQ(novograd.weight_decay, 1e-3);
  EXPECT_TRUE(novograd.skip_nonfinite && !novograd.grad_averaging);
  EXPECT_TRUE(kernel_group(NovoGradOptions().grad_averaging(true)).grad_averaging);

  const auto lion = kernel_group(LionOptions(3e-4).weight_decay(0.2).betas({0.8, 0.95}).skip_nonfinite(false));
  EXPECT_EQ(lion.lr, 3e-4);
  EXPECT_EQ(lion.beta1, 0.8);
  EXPECT_EQ(lion.beta2, 0.95);
  EXPECT_EQ(lion.weight_decay, 0.2);
  EXPECT_FALSE(lion.skip_nonfinite);
  EXPECT_TRUE(kernel_group(LionOptions()).skip_nonfinite);

  // SOAP's Adam pass (its rotations and update take the rest, which its golden tests cover).
  const auto soap = kernel_group(SOAPOptions().betas({0.8, 0.9}).eps(1e-6));
  EXPECT_EQ(soap.beta1, 0.8);
  EXPECT_EQ(soap.beta2, 0.9);
  EXPECT_EQ(soap.eps, 1e-6);
  EXPECT_FALSE(soap.skip_nonfinite);  // decided before the passes

  // Shampoo's graft pass at step 3 (its bias corrections) and its apply pass.
  const auto graft = kernel_group(ShampooOptions().betas({0.8, 1.0}).grafting_beta2(0.9).grafting_epsilon(1e-6), 3);
  EXPECT_EQ(graft.beta1, 0.8);
  EXPECT_DOUBLE_EQ(graft.m_scale, 1 / (1 - 0.8 * 0.8 * 0.8));
  EXPECT_EQ(graft.v_decay, 0.9);
  EXPECT_DOUBLE_EQ(graft.v_weight, 1 - 0.9);
  EXPECT_DOUBLE_EQ(graft.v_scale, 1 / (1 - 0.9 * 0.9 * 0.9));
  EXPECT_EQ(graft.eps, 1e-6);
  EXPECT_TRUE(graft.divide);
  const auto adagrad = kernel_group(ShampooOptions().grafting("adagrad").use_bias_correction(false), 3);
  EXPECT_EQ(adagrad.v_decay, 1);
  EXPECT_EQ(adagrad.v_weight, 1);
  EXPECT_EQ(adagrad.v_scale, 1);
  EXPECT_EQ(adagrad.m_scale, 1);
  EXPECT_FALSE(kernel_group(ShampooOptions().grafting("sgd")).divide);
  const auto apply = apply_group(ShampooOptions(0.3).weight_decay(0.2).momentum(0.7).dampening(0.1).use_nesterov(true));
  EXPECT_EQ(apply.lr, 0.3);
  EXPECT_EQ(apply.weight_decay, 0.2);
  EXPECT_EQ(apply.momentum, 0.7);
  EXPECT_EQ(apply.dampening, 0.1);
  EXPECT_TRUE(apply.nesterov);
  EXPECT_EQ(apply_group(ShampooOptions().weight_decay(0.2).use_decoupled_weight_decay(false)).weight_decay, 0);
}

// ---------------------------------------------------------------- bad input --

TEST(BadInput, InvalidOptionsNameTheOptionAndValue) {
  auto w = torch::zeros({2}, torch::requires_grad());
  const std::vector<at::Tensor> p{w};
  expect_error([&] { LARS(p, LARSOptions(-1)); }, "Invalid LARS option lr: -1");
  expect_error([&] { LARS(p, LARSOptions(0.1).trust_coefficient(0)); }, "trust_coefficient: 0");
  expect_error([&] { LARS(p, LARSOptions(0.1).momentum(-0.1)); }, "momentum: -0.1");
  expect_error([&] { LARS(p, LARSOptions(0.1).momentum(0).nesterov(true)); }, "with nesterov");
  expect_error([&] { LARC(p, LARCOptions(0.1).eps(-1e-8)); }, "Invalid LARC option eps: -1e-08");
  expect_error([&] { LARC(p, LARCOptions(0)); }, "LARC option lr: 0 (must be > 0 with clip)");
  expect_error([&] { LARC(p, LARCOptions(0.1).weight_decay(-1)); }, "weight_decay: -1");
  expect_error([&] { LAMB(p, LAMBOptions().betas({1.0, 0.999})); }, "betas[0]: 1");
  expect_error([&] { LAMB(p, LAMBOptions().betas({0.9, -0.1})); }, "betas[1]: -0.1");
  expect_error([&] { LAMB(p, LAMBOptions().min_trust(2).max_trust(1)); }, "max_trust: 1");
  expect_error([&] { LAMB(p, LAMBOptions().max_grad_norm(-1)); }, "max_grad_norm: -1");
  expect_error([&] { LAMB(p, LAMBOptions().eps(NAN)); }, "eps: nan");
  expect_error([&] { NovoGrad(p, NovoGradOptions().weight_decay(-0.1)); }, "weight_decay: -0.1");
  expect_error([&] { Lion(p, LionOptions().betas({0.9, 1.0})); }, "Invalid Lion option betas[1]: 1");
  expect_error([&] { Lion(p, LionOptions().betas({-0.5, 0.99})); }, "Invalid Lion option betas[0]: -0.5");
  expect_error([&] { Lion(p, LionOptions(-1e-4)); }, "Invalid Lion option lr: -0.0001");
  expect_error([&] { Lion(p, LionOptions().weight_decay(-1)); }, "Invalid Lion option weight_decay: -1");
  expect_error([&] { AdamWScheduleFree(p, AdamWScheduleFreeOptions().betas({0.0, 0.999})); },
               "Invalid AdamWScheduleFree option betas[0]: 0 (must be in (0, 1))");
  expect_error([&] { AdamWScheduleFree(p, AdamWScheduleFreeOptions().warmup_steps(-1)); },
               "Invalid AdamWScheduleFree option warmup_steps: -1");
  expect_error([&] { SGDScheduleFree(p, SGDScheduleFreeOptions().momentum(1)); },
               "Invalid SGDScheduleFree option momentum: 1 (must be in (0, 1))");
  expect_error([&] { SOAP(p, SOAPOptions().shampoo_beta(1)); }, "Invalid SOAP option shampoo_beta: 1 (must be < 1");
  expect_error([&] { SOAP(p, SOAPOptions().precondition_frequency(0)); },
               "Invalid SOAP option precondition_frequency: 0 (must be >= 1)");
  expect_error([&] { SOAP(p, SOAPOptions().max_precond_dim(0)); }, "Invalid SOAP option max_precond_dim: 0");
  expect_error([&] { SOAP(p, SOAPOptions().betas({0.9, 1.0})); }, "Invalid SOAP option betas[1]: 1");
  expect_error([&] { Shampoo(p, ShampooOptions().precondition_frequency(10).start_preconditioning_step(5)); },
               "Invalid Shampoo option start_preconditioning_step: 5 (must be >= precondition_frequency, or -1");
  expect_error([&] { Shampoo(p, ShampooOptions().grafting("adamw")); },
               "Invalid Shampoo option grafting: \"adamw\" (must be \"adam\", \"rmsprop\", \"adagrad\", \"sgd\" or \"none\")");
  expect_error([&] { Shampoo(p, ShampooOptions().betas({0.9, 0.0})); }, "Invalid Shampoo option betas[1]: 0 (must be in (0, 1])");
  expect_error([&] { Shampoo(p, ShampooOptions().max_preconditioner_dim(0)); },
               "Invalid Shampoo option max_preconditioner_dim: 0");
  expect_error([&] { SGDScheduleFree(p, SGDScheduleFreeOptions().weight_lr_power(-2)); },
               "Invalid SGDScheduleFree option weight_lr_power: -2");
}

TEST(BadInput, SparseGradientsAreRejected) {
  auto w = torch::zeros({4}, torch::requires_grad());
  LAMB opt({w}, LAMBOptions());
  w.mutable_grad() = torch::zeros({4}).to_sparse();
  expect_error([&] { opt.step(); }, "LAMB does not support sparse gradients (group 0, parameter 0)");
}

TEST(BadInput, IntegerParametersAreRejected) {
  auto w = torch::zeros({4}, torch::kLong);
  expect_error([&] { LARS({w}, LARSOptions(0.1)); }, "only floating point tensors");
}

TEST(BadInput, ParametersWithoutGradientAreSkipped) {
  auto a = torch::ones({3}, torch::requires_grad());
  auto b = torch::ones({3}, torch::requires_grad());
  LARS opt({a, b}, LARSOptions(0.1));
  a.mutable_grad() = torch::ones({3});
  opt.step();
  EXPECT_TRUE(torch::equal(b, torch::ones({3})));
  EXPECT_EQ(opt.param_state(b), nullptr);
  EXPECT_NE(opt.param_state(a), nullptr);
}

// ---------------------------------------------------------------- schedulers --

TEST(Schedulers, StepLRDrivesEveryGroupThroughGetAndSetLr) {
  auto a = torch::ones({3}, torch::requires_grad());
  auto b = torch::ones({3}, torch::requires_grad());
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{a}, std::make_unique<LARCOptions>(0.4));
  groups.emplace_back(std::vector<at::Tensor>{b}, std::make_unique<LARCOptions>(0.04));
  LARC opt(groups, LARCOptions(0.4));
  torch::optim::StepLR schedule(opt, /*step_size=*/2, /*gamma=*/0.5);
  // LibTorch's StepLR tests its counter before counting: calls 3 and 5 decay.
  for (int s = 0; s < 5; ++s) schedule.step();
  EXPECT_DOUBLE_EQ(opt.param_groups()[0].options().get_lr(), 0.1);
  EXPECT_DOUBLE_EQ(opt.param_groups()[1].options().get_lr(), 0.01);  // ratio kept
  // The step uses the scheduled rate: with adapt off LARC is SGD, w -= lr * g.
  static_cast<LARCOptions&>(opt.param_groups()[0].options()).adapt(false);
  a.mutable_grad() = torch::ones({3});
  opt.step();
  EXPECT_NEAR(a[0].item<double>(), 1 - 0.1, 1e-7);
}

// ----------------------------------------------------------------- layouts --

// A convolution weight, its bias and a matrix; `channels_last` lays the
// weight out as torch.channels_last does (what a ResNet trained that way has).
std::vector<at::Tensor> conv_params(bool channels_last, at::ScalarType dtype, at::Device device = at::kCPU) {
  torch::manual_seed(11);
  at::Tensor weight = torch::randn({8, 4, 3, 3}).to(device, dtype);
  if (channels_last) weight = weight.contiguous(at::MemoryFormat::ChannelsLast);
  return {weight, torch::randn({8}).to(device, dtype), torch::randn({5, 6}).to(device, dtype)};
}

// Step `s`'s gradients; the weight's channels_last on even steps (as autograd
// gives a channels_last weight) and contiguous on odd ones, when asked.
void set_conv_grads(const std::vector<at::Tensor>& params, int s, bool channels_last) {
  torch::manual_seed(100 + s);
  for (const auto& p : params) {
    at::Tensor g = torch::randn(p.sizes()).to(p.device(), p.scalar_type());
    if (channels_last && p.dim() == 4 && s % 2 == 0) g = g.contiguous(at::MemoryFormat::ChannelsLast);
    p.mutable_grad() = g;
  }
}

// The fused engine steps a channels_last weight as it steps the contiguous
// one, bit for bit, without a warning (so on the engine: its one other path
// warns): 3 steps; then the contiguous run's checkpoint loaded into a fresh
// optimizer over the channels_last weights (states in the other layout),
// 3 more.
template <typename Opt, typename Options>
void expect_channels_last_like_contiguous(at::Device device, Options options, at::ScalarType dtype = at::kFloat) {
  const auto a = conv_params(false, dtype, device);
  const auto b = conv_params(true, dtype, device);
  Opt oa(a, options.fused(true));
  auto ob = std::make_unique<Opt>(b, options.fused(true));
  bigbatch::compat::WarningCollector warnings;
  for (int s = 0; s < 6; ++s) {
    if (s == 3) {
      std::stringstream bytes;
      torch::save(oa, bytes);
      ob = std::make_unique<Opt>(b, options.fused(true));
      torch::load(*ob, bytes, device);
    }
    set_conv_grads(a, s, false);
    set_conv_grads(b, s, true);
    oa.step();
    ob->step();
  }
  EXPECT_TRUE(b[0].is_contiguous(at::MemoryFormat::ChannelsLast));
  for (std::size_t k = 0; k < a.size(); ++k) EXPECT_TRUE(torch::equal(a[k], b[k])) << "parameter " << k;
  const auto sa = oa.named_state(a[0]);
  const auto sb = ob->named_state(b[0]);
  ASSERT_TRUE(sa.has_value() && sb.has_value());
  ASSERT_EQ(sa->size(), sb->size());
  for (std::size_t k = 0; k < sa->size(); ++k) {
    const auto& [name, va] = (*sa)[k];
    const auto& vb = (*sb)[k].second;
    if (va.isTensor() && va.toTensor().defined()) {
      EXPECT_TRUE(torch::equal(va.toTensor(), vb.toTensor())) << name;
    }
  }
  for (const auto& m : warnings.messages()) ADD_FAILURE() << "warned: " << m;
}

// On the CPU runner, and on the CUDA runner (a GPU, or the SIMT executor).
class Layouts : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (GetParam() == 1 && !engine_available()) GTEST_SKIP() << "no CUDA device";
  }
  at::Device device() const { return GetParam() == 0 ? at::Device(at::kCPU) : engine_device(); }
};

TEST_P(Layouts, LARSStepsChannelsLastOnTheEngine) {
  expect_channels_last_like_contiguous<LARS>(device(), LARSOptions(0.5).weight_decay(1e-4));
}
TEST_P(Layouts, LARCStepsChannelsLastOnTheEngine) {
  expect_channels_last_like_contiguous<LARC>(device(), LARCOptions(0.1).weight_decay(1e-4).nesterov(true));
}
TEST_P(Layouts, LAMBStepsChannelsLastOnTheEngine) {
  expect_channels_last_like_contiguous<LAMB>(device(), LAMBOptions(0.01).max_grad_norm(1.0));
  expect_channels_last_like_contiguous<LAMB>(device(), LAMBOptions(0.01).master_weights(true), at::kBFloat16);
}
TEST_P(Layouts, NovoGradStepsChannelsLastOnTheEngine) {
  expect_channels_last_like_contiguous<NovoGrad>(device(), NovoGradOptions(0.01).weight_decay(1e-3));
}
TEST_P(Layouts, LionStepsChannelsLastOnTheEngine) {
  expect_channels_last_like_contiguous<Lion>(device(), LionOptions(1e-3).weight_decay(0.1));
}
TEST_P(Layouts, ScheduleFreeStepsChannelsLastOnTheEngine) {
  expect_channels_last_like_contiguous<AdamWScheduleFree>(device(), AdamWScheduleFreeOptions(0.01).warmup_steps(2));
  expect_channels_last_like_contiguous<SGDScheduleFree>(device(), SGDScheduleFreeOptions(0.05).weight_decay(1e-3));
}
TEST_P(Layouts, MuonsAdamWGroupsStepChannelsLastOnTheEngine) {
  expect_channels_last_like_contiguous<Muon>(device(), MuonOptions(0.01).orthogonalize(false));
}

// What the engine cannot take (here a parameter that is every other column
// of a matrix) steps on the reference path with one warning that says why,
// and a group that asks for the reference path (fused(false)) gets none.
TEST_P(Layouts, AFallbackToTheReferencePathWarnsOnceWithItsReason) {
  torch::manual_seed(5);
  const at::Tensor wide = torch::randn({8, 12}).to(device());
  const at::Tensor strided = wide.slice(1, 0, 12, 2);
  const at::Tensor copy = strided.clone();
  LAMB fused(std::vector<at::Tensor>{strided}, LAMBOptions(0.01));
  LAMB reference(std::vector<at::Tensor>{copy}, LAMBOptions(0.01).fused(false));
  bigbatch::compat::WarningCollector warnings;
  for (int s = 0; s < 3; ++s) {
    torch::manual_seed(50 + s);
    const at::Tensor g = torch::randn({8, 6}).to(device());
    strided.mutable_grad() = g.clone();
    copy.mutable_grad() = g.clone();
    fused.step();
    reference.step();
  }
  ASSERT_EQ(warnings.messages().size(), 1u);
  const std::string& m = warnings.messages()[0];
  EXPECT_NE(m.find("LAMB: steps on the reference path"), std::string::npos) << m;
  EXPECT_NE(m.find("a parameter (sizes [8, 6], strides [12, 2]) is not dense and non-overlapping"),
            std::string::npos)
      << m;
  EXPECT_TRUE(torch::equal(strided, copy));

  // A group with fused(false) sends the whole step to the reference path, as
  // asked: no warning, whatever the other groups hold.
  std::vector<torch::optim::OptimizerParamGroup> mixed;
  mixed.emplace_back(std::vector<at::Tensor>{strided}, std::make_unique<LAMBOptions>(0.01));
  mixed.emplace_back(std::vector<at::Tensor>{copy}, std::make_unique<LAMBOptions>(LAMBOptions(0.01).fused(false)));
  LAMB asked(std::move(mixed), LAMBOptions(0.01));
  asked.step();
  EXPECT_EQ(warnings.messages().size(), 1u);
}

// Muon's, SOAP's and Shampoo's own fused steps read matrices in memory
// order: a channels_last weight takes their reference path, with the
// warning, and its states are contiguous (they are read as matrices); 3
// steps agree with the contiguous weight's fused steps to rounding.
template <typename Opt, typename Options>
void expect_channels_last_warns_and_agrees(const Options& options, const char* kind) {
  const auto a = conv_params(false, at::kFloat);
  const auto b = conv_params(true, at::kFloat);
  Opt oa(std::vector<at::Tensor>{a[0], a[2]}, options);
  Opt ob(std::vector<at::Tensor>{b[0], b[2]}, options);
  bigbatch::compat::WarningCollector warnings;
  for (int s = 0; s < 3; ++s) {
    set_conv_grads(a, s, false);
    set_conv_grads(b, s, true);
    oa.step();
    ob.step();
  }
  ASSERT_EQ(warnings.messages().size(), 1u) << kind;
  const std::string& m = warnings.messages()[0];
  EXPECT_NE(m.find(std::string(kind) + ": steps on the reference path"), std::string::npos) << m;
  EXPECT_NE(m.find("(sizes [8, 4, 3, 3], strides [36, 1, 12, 4]) is not contiguous, which this optimizer's fused "
                   "step needs"),
            std::string::npos)
      << m;
  for (const int k : {0, 2}) {
    EXPECT_LT(((a[k] - b[k]).norm() / a[k].norm()).item<double>(), 1e-6) << kind << " parameter " << k;
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, Layouts, ::testing::Values(0, 1), [](const auto& info) {
  return std::string(info.param == 0 ? "cpu" : "engine_CUDA");
});

// A master copy (and the states) made while the parameter was channels_last,
// read by the fused step once it is contiguous: copied into its layout first
// (read as they are, they would scramble the weights).
template <typename Opt, typename Options>
void expect_states_follow_a_layout_change(const Options& options, const char* kind) {
  const auto a = conv_params(false, at::kBFloat16);
  const auto b = conv_params(true, at::kBFloat16);
  Opt oa(std::vector<at::Tensor>{a[0]}, options);
  Opt ob(std::vector<at::Tensor>{b[0]}, options);
  bigbatch::compat::WarningCollector warnings;  // (b's first steps warn)
  for (int s = 0; s < 4; ++s) {
    if (s == 2) b[0].set_data(b[0].contiguous());
    set_conv_grads({a[0]}, s, false);
    set_conv_grads({b[0]}, s, true);
    oa.step();
    ob.step();
  }
  EXPECT_TRUE(b[0].is_contiguous());
  const auto diff = (a[0].to(at::kFloat) - b[0].to(at::kFloat)).norm() / a[0].to(at::kFloat).norm();
  EXPECT_LT(diff.item<double>(), 1e-2) << kind;
}

TEST(WholeTensorLayouts, StatesFollowTheirParameterIntoTheContiguousLayout) {
  expect_states_follow_a_layout_change<Muon>(MuonOptions(0.02).master_weights(true), "Muon");
  expect_states_follow_a_layout_change<SOAP>(SOAPOptions(0.01).master_weights(true), "SOAP");
  expect_states_follow_a_layout_change<Shampoo>(ShampooOptions(0.01).epsilon(1e-6).master_weights(true), "Shampoo");
}

TEST(WholeTensorLayouts, StepsWarnForChannelsLastAndAgree) {
  expect_channels_last_warns_and_agrees<Muon>(MuonOptions(0.01), "Muon");
  expect_channels_last_warns_and_agrees<SOAP>(SOAPOptions(0.01), "SOAP");
  expect_channels_last_warns_and_agrees<Shampoo>(ShampooOptions(0.01).epsilon(1e-6), "Shampoo");
}

// ------------------------------------------------------ fused vs reference --

template <typename Opt, typename Options>
void expect_paths_agree(Options options) {
  auto fused_net = small_net();
  auto ref_net = small_net();
  Opt fused(layerwise_param_groups(*fused_net, options.fused(true)), options.fused(true));
  Opt ref(layerwise_param_groups(*ref_net, options.fused(false)), options.fused(false));
  for (int s = 0; s < 100; ++s) {
    train_step(fused_net, fused, s);
    train_step(ref_net, ref, s);
  }
  const auto a = snapshot(*fused_net);
  const auto b = snapshot(*ref_net);
  const auto start = snapshot(*small_net());
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double rel = ((a[i] - b[i]).norm() / b[i].norm()).item<double>();
    EXPECT_LT(rel, 1e-6) << "parameter " << i;
    EXPECT_GT((b[i] - start[i]).norm().item<double>(), 1e-3) << "parameter " << i << " never moved";
  }
}

TEST(FusedVsReference, LARSAgreesAfter100Steps) {
  expect_paths_agree<LARS>(LARSOptions(2.0).weight_decay(1e-4));
}
TEST(FusedVsReference, LARCAgreesAfter100Steps) {
  expect_paths_agree<LARC>(LARCOptions(0.1).weight_decay(1e-4).nesterov(true));
}
TEST(FusedVsReference, LAMBAgreesAfter100Steps) {
  expect_paths_agree<LAMB>(LAMBOptions(5e-3).max_grad_norm(1.0));
}
TEST(FusedVsReference, NovoGradAgreesAfter100Steps) {
  expect_paths_agree<NovoGrad>(NovoGradOptions(5e-3).weight_decay(1e-3));
}
TEST(FusedVsReference, ScheduleFreeAgreesAfter100Steps) {
  expect_paths_agree<AdamWScheduleFree>(AdamWScheduleFreeOptions(5e-3).weight_decay(0.1).warmup_steps(10));
  expect_paths_agree<SGDScheduleFree>(SGDScheduleFreeOptions(0.05).weight_decay(1e-3).warmup_steps(10));
}
TEST(FusedVsReference, LionAgreesAfter100Steps) {
  expect_paths_agree<Lion>(LionOptions(1e-3).weight_decay(0.1));
}

}  // namespace
