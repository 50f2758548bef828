// Every option and state field of the eight optimizers, one at a time set to a
// value other than its default: operator== sees it, a copy and clone() keep
// it, save/load keeps it, and an option the fused plans take reaches the
// plan's group (what the engine uploads to the device). The count of archive
// keys ties this test's lists to the types: a field added to a type and not
// here fails the test, and one added to a type but not to its fields() does
// not compile.
#include "../../bigbatch.h"

#include <gtest/gtest.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <functional>
#include <memory>
#include <type_traits>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace bigbatch::optim;

template <typename T>
struct Change {
  const char* field;
  std::function<void(T&)> apply;
  bool reaches_plan = false;  ///< options only: the fused plans' group holds it
};

template <typename T>
T save_and_load(const T& value, T fresh) {
  torch::serialize::OutputArchive out;
  value.serialize(out);
  std::stringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  fresh.serialize(in);
  return fresh;
}

template <typename T>
std::size_t archive_keys(const T& value) {
  torch::serialize::OutputArchive out;
  value.serialize(out);
  std::stringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  return in.keys().size();
}

template <typename T, typename Base>
void expect_clone_equal(const T& value) {
  const std::unique_ptr<Base> copy = static_cast<const Base&>(value).clone();
  EXPECT_TRUE(dynamic_cast<const T&>(*copy) == value);
}

template <typename T>
void expect_every_field_survives(const T& base, const std::vector<Change<T>>& changes) {
  using Base = std::conditional_t<std::is_base_of_v<torch::optim::OptimizerOptions, T>,
                                  torch::optim::OptimizerOptions, torch::optim::OptimizerParamState>;
  T all = base;
  for (const auto& change : changes) {
    SCOPED_TRACE(change.field);
    T one = base;
    change.apply(one);
    EXPECT_FALSE(one == base) << "operator== does not see the field";
    const T copy = one;
    EXPECT_TRUE(copy == one);
    expect_clone_equal<T, Base>(one);
    EXPECT_TRUE(save_and_load(one, base) == one) << "lost in save/load";
    if constexpr (std::is_same_v<Base, torch::optim::OptimizerOptions>) {
      const auto group = kernel_group(one);
      const auto base_group = kernel_group(base);
      const bool same_group = bigbatch::kernels::fields(group) == bigbatch::kernels::fields(base_group);
      EXPECT_EQ(same_group, !change.reaches_plan) << (change.reaches_plan ? "does not reach the plan's group"
                                                                          : "changes the plan's group");
    }
    change.apply(all);
  }
  EXPECT_TRUE(save_and_load(all, base) == all);
  EXPECT_EQ(archive_keys(all), changes.size()) << "the archive keys and the fields this test changes differ: a field is missing from fields() or from here";
}

/// The options LARS and LARC share (LARC adds clip).
template <typename Options>
std::vector<Change<Options>> momentum_option_changes() {
  return {{"lr", [](auto& o) { o.lr(0.2); }, true},
          {"momentum", [](auto& o) { o.momentum(0.5); }, true},
          {"weight_decay", [](auto& o) { o.weight_decay(1e-3); }, true},
          {"trust_coefficient", [](auto& o) { o.trust_coefficient(0.5); }, true},
          {"eps", [](auto& o) { o.eps(1e-3); }, true},
          {"nesterov", [](auto& o) { o.nesterov(true); }, true},
          {"adapt", [](auto& o) { o.adapt(false); }, true},
          {"always_adapt", [](auto& o) { o.always_adapt(false); }, true},  // (the base has no decay)
          {"skip_nonfinite", [](auto& o) { o.skip_nonfinite(false); }, true},
          {"fused", [](auto& o) { o.fused(false); }},
          {"master_weights", [](auto& o) { o.master_weights(true); }}};
}

TEST(Fields, LARSOptionsSurviveCopySaveLoadAndReachThePlan) {
  expect_every_field_survives(LARSOptions(0.1), momentum_option_changes<LARSOptions>());
}

TEST(Fields, LARCOptionsSurviveCopySaveLoadAndReachThePlan) {
  auto changes = momentum_option_changes<LARCOptions>();
  changes.push_back({"clip", [](auto& o) { o.clip(false); }, true});
  expect_every_field_survives(LARCOptions(0.1), changes);
}

TEST(Fields, LAMBOptionsSurviveCopySaveLoadAndReachThePlan) {
  expect_every_field_survives<LAMBOptions>(
      LAMBOptions(), {{"lr", [](auto& o) { o.lr(0.2); }, true},
                      {"betas", [](auto& o) { o.betas({0.8, 0.9}); }, true},
                      {"eps", [](auto& o) { o.eps(1e-3); }, true},
                      {"weight_decay", [](auto& o) { o.weight_decay(0.1); }, true},
                      {"bias_correction", [](auto& o) { o.bias_correction(false); }, true},
                      {"grad_averaging", [](auto& o) { o.grad_averaging(false); }, true},
                      {"adam_w_mode", [](auto& o) { o.adam_w_mode(false); }, true},
                      {"max_grad_norm", [](auto& o) { o.max_grad_norm(1); }, true},
                      {"always_adapt", [](auto& o) { o.always_adapt(true); }, true},
                      {"trust_clip", [](auto& o) { o.trust_clip(true); }, true},
                      {"min_trust", [](auto& o) { o.min_trust(0.1); }, true},
                      {"max_trust", [](auto& o) { o.max_trust(5); }, true},
                      {"adapt", [](auto& o) { o.adapt(false); }, true},
                      {"skip_nonfinite", [](auto& o) { o.skip_nonfinite(false); }, true},
                      {"fused", [](auto& o) { o.fused(false); }},
                      {"master_weights", [](auto& o) { o.master_weights(true); }}});
}

TEST(Fields, NovoGradOptionsSurviveCopySaveLoadAndReachThePlan) {
  expect_every_field_survives<NovoGradOptions>(
      NovoGradOptions(), {{"lr", [](auto& o) { o.lr(0.2); }, true},
                          {"betas", [](auto& o) { o.betas({0.8, 0.9}); }, true},
                          {"eps", [](auto& o) { o.eps(1e-3); }, true},
                          {"weight_decay", [](auto& o) { o.weight_decay(0.1); }, true},
                          {"grad_averaging", [](auto& o) { o.grad_averaging(true); }, true},
                          {"adapt", [](auto& o) { o.adapt(false); }},  // no trust ratio in NovoGrad
                          {"skip_nonfinite", [](auto& o) { o.skip_nonfinite(false); }, true},
                          {"fused", [](auto& o) { o.fused(false); }},
                          {"master_weights", [](auto& o) { o.master_weights(true); }}});
}

TEST(Fields, LionOptionsSurviveCopySaveLoadAndReachThePlan) {
  expect_every_field_survives<LionOptions>(
      LionOptions(), {{"lr", [](auto& o) { o.lr(0.2); }, true},
                      {"betas", [](auto& o) { o.betas({0.8, 0.9}); }, true},
                      {"weight_decay", [](auto& o) { o.weight_decay(0.1); }, true},
                      {"adapt", [](auto& o) { o.adapt(false); }},  // no trust ratio in Lion
                      {"skip_nonfinite", [](auto& o) { o.skip_nonfinite(false); }, true},
                      {"fused", [](auto& o) { o.fused(false); }},
                      {"master_weights", [](auto& o) { o.master_weights(true); }}});
}

TEST(Fields, ScheduleFreeOptionsSurviveCopySaveLoadAndReachThePlan) {
  expect_every_field_survives<AdamWScheduleFreeOptions>(
      AdamWScheduleFreeOptions(), {{"lr", [](auto& o) { o.lr(0.2); }, true},
                                   {"betas", [](auto& o) { o.betas({0.8, 0.9}); }, true},
                                   {"eps", [](auto& o) { o.eps(1e-6); }, true},
                                   {"weight_decay", [](auto& o) { o.weight_decay(0.1); }, true},
                                   {"warmup_steps", [](auto& o) { o.warmup_steps(5); }, true},
                                   {"r", [](auto& o) { o.r(1); }, true},
                                   {"weight_lr_power", [](auto& o) { o.weight_lr_power(1); }, true},
                                   {"adapt", [](auto& o) { o.adapt(false); }},  // no trust ratio
                                   {"skip_nonfinite", [](auto& o) { o.skip_nonfinite(false); }, true},
                                   {"fused", [](auto& o) { o.fused(false); }},
                                   {"master_weights", [](auto& o) { o.master_weights(true); }}});
  expect_every_field_survives<SGDScheduleFreeOptions>(
      SGDScheduleFreeOptions(), {{"lr", [](auto& o) { o.lr(0.2); }, true},
                                 {"momentum", [](auto& o) { o.momentum(0.5); }, true},
                                 {"weight_decay", [](auto& o) { o.weight_decay(0.1); }, true},
                                 {"warmup_steps", [](auto& o) { o.warmup_steps(5); }, true},
                                 {"r", [](auto& o) { o.r(1); }, true},
                                 {"weight_lr_power", [](auto& o) { o.weight_lr_power(1); }, true},
                                 {"adapt", [](auto& o) { o.adapt(false); }},
                                 {"skip_nonfinite", [](auto& o) { o.skip_nonfinite(false); }, true},
                                 {"fused", [](auto& o) { o.fused(false); }},
                                 {"master_weights", [](auto& o) { o.master_weights(true); }}});
}

// Muon's plan group is its AdamW groups' (LAMB's plan without the trust
// ratio): the rate, decay, betas and eps reach it. The orthogonalized
// groups' options go to Muon's own two plans and the iteration, which the
// golden tests cover option by option.
TEST(Fields, MuonOptionsSurviveCopySaveLoadAndReachThePlan) {
  expect_every_field_survives<MuonOptions>(
      MuonOptions(), {{"lr", [](auto& o) { o.lr(0.2); }, true},
                      {"weight_decay", [](auto& o) { o.weight_decay(0.3); }, true},
                      {"orthogonalize", [](auto& o) { o.orthogonalize(false); }},
                      {"momentum", [](auto& o) { o.momentum(0.9); }},
                      {"nesterov", [](auto& o) { o.nesterov(false); }},
                      {"ns_coefficients", [](auto& o) { o.ns_coefficients({2.0, -1.5, 0.5}); }},
                      {"ns_steps", [](auto& o) { o.ns_steps(3); }},
                      {"eps", [](auto& o) { o.eps(1e-5); }},
                      {"adjust_lr", [](auto& o) { o.adjust_lr("match_rms_adamw"); }},
                      {"ns_bfloat16", [](auto& o) { o.ns_bfloat16(true); }},
                      {"adamw_betas", [](auto& o) { o.adamw_betas({0.8, 0.9}); }, true},
                      {"adamw_eps", [](auto& o) { o.adamw_eps(1e-6); }, true},
                      {"skip_nonfinite", [](auto& o) { o.skip_nonfinite(false); }},  // decided before the plans
                      {"fused", [](auto& o) { o.fused(false); }},
                      {"master_weights", [](auto& o) { o.master_weights(true); }}});
}

// SOAP's plan group is its Adam pass's: the betas and eps reach it; the
// rest go to the rotations and the update, which the golden tests cover.
TEST(Fields, SOAPOptionsSurviveCopySaveLoadAndReachThePlan) {
  expect_every_field_survives<SOAPOptions>(
      SOAPOptions(), {{"lr", [](auto& o) { o.lr(0.2); }},
                      {"betas", [](auto& o) { o.betas({0.8, 0.9}); }, true},
                      {"shampoo_beta", [](auto& o) { o.shampoo_beta(0.5); }},
                      {"eps", [](auto& o) { o.eps(1e-6); }, true},
                      {"weight_decay", [](auto& o) { o.weight_decay(0.3); }},
                      {"precondition_frequency", [](auto& o) { o.precondition_frequency(3); }},
                      {"max_precond_dim", [](auto& o) { o.max_precond_dim(64); }},
                      {"merge_dims", [](auto& o) { o.merge_dims(true); }},
                      {"precondition_1d", [](auto& o) { o.precondition_1d(true); }},
                      {"normalize_grads", [](auto& o) { o.normalize_grads(true); }},
                      {"correct_bias", [](auto& o) { o.correct_bias(false); }},
                      {"adapt", [](auto& o) { o.adapt(false); }},  // no trust ratio
                      {"skip_nonfinite", [](auto& o) { o.skip_nonfinite(false); }},  // decided before the pass
                      {"fused", [](auto& o) { o.fused(false); }},
                      {"master_weights", [](auto& o) { o.master_weights(true); }}});
}

// Shampoo's plan groups are its graft and apply passes'; the rest go to the
// blocks, factors and roots, which its golden tests cover.
TEST(Fields, ShampooOptionsSurviveCopySaveLoadAndReachThePlan) {
  expect_every_field_survives<ShampooOptions>(
      ShampooOptions(), {{"lr", [](auto& o) { o.lr(0.2); }},
                         {"betas", [](auto& o) { o.betas({0.8, 0.9}); }, true},
                         {"epsilon", [](auto& o) { o.epsilon(1e-6); }},
                         {"momentum", [](auto& o) { o.momentum(0.5); }},
                         {"dampening", [](auto& o) { o.dampening(0.1); }},
                         {"weight_decay", [](auto& o) { o.weight_decay(0.3); }},
                         {"max_preconditioner_dim", [](auto& o) { o.max_preconditioner_dim(64); }},
                         {"precondition_frequency", [](auto& o) { o.precondition_frequency(3); }},
                         {"start_preconditioning_step", [](auto& o) { o.start_preconditioning_step(4); }},
                         {"inv_root_override", [](auto& o) { o.inv_root_override(2); }},
                         {"use_nesterov", [](auto& o) { o.use_nesterov(true); }},
                         {"use_bias_correction", [](auto& o) { o.use_bias_correction(false); }, true},
                         {"use_decoupled_weight_decay", [](auto& o) { o.use_decoupled_weight_decay(false); }},
                         {"grafting", [](auto& o) { o.grafting("adagrad"); }, true},
                         {"grafting_beta2", [](auto& o) { o.grafting_beta2(0.9); }, true},
                         {"grafting_epsilon", [](auto& o) { o.grafting_epsilon(1e-6); }, true},
                         {"use_merge_dims", [](auto& o) { o.use_merge_dims(false); }},
                         {"precondition_1d", [](auto& o) { o.precondition_1d(false); }},
                         {"adapt", [](auto& o) { o.adapt(false); }},  // no trust ratio
                         {"skip_nonfinite", [](auto& o) { o.skip_nonfinite(false); }},  // decided before the pass
                         {"fused", [](auto& o) { o.fused(false); }},
                         {"master_weights", [](auto& o) { o.master_weights(true); }}});
}

/// A state whose tensors are all defined: zeros, which the changes replace.
template <typename State>
State zero_state() {
  State s;
  if constexpr (std::is_same_v<State, LARSParamState> || std::is_same_v<State, LARCParamState>) {
    s.momentum_buffer(at::zeros({3}));
  } else if constexpr (std::is_same_v<State, LionParamState>) {
    s.exp_avg(at::zeros({3}));
  } else if constexpr (std::is_same_v<State, AdamWScheduleFreeParamState>) {
    s.z(at::zeros({3}));
    s.exp_avg_sq(at::zeros({3}));
  } else if constexpr (std::is_same_v<State, SGDScheduleFreeParamState>) {
    s.z(at::zeros({3}));
  } else if constexpr (std::is_same_v<State, SOAPParamState>) {
    s.exp_avg(at::zeros({3}));
    s.exp_avg_sq(at::zeros({3}));
    s.factors(at::zeros({8}));
    s.eigenbases(at::zeros({8}));
  } else if constexpr (std::is_same_v<State, ShampooParamState>) {
    s.exp_avg(at::zeros({3}));
    s.grafting_sq(at::zeros({3}));
    s.momentum_buffer(at::zeros({3}));
    s.factors(at::zeros({9}));
    s.inverse_roots(at::zeros({9}));
  } else if constexpr (std::is_same_v<State, MuonParamState>) {
    s.momentum_buffer(at::zeros({3}));
    s.exp_avg(at::zeros({3}));
    s.exp_avg_sq(at::zeros({3}));
  } else {
    s.exp_avg(at::zeros({3}));
    s.exp_avg_sq(at::zeros({3}));
  }
  s.master(at::zeros({3}));
  return s;
}

/// The state of LARS and LARC: a momentum buffer and the master copy.
template <typename State>
std::vector<Change<State>> buffer_state_changes() {
  return {{"momentum_buffer", [](auto& s) { s.momentum_buffer(at::ones({3})); }},
          {"master", [](auto& s) { s.master(at::full({3}, 2.0)); }}};
}

/// The state of LAMB and NovoGrad: a step count, two moments and the master copy.
template <typename State>
std::vector<Change<State>> moment_state_changes() {
  return {{"step", [](auto& s) { s.step(7); }},
          {"exp_avg", [](auto& s) { s.exp_avg(at::ones({3})); }},
          {"exp_avg_sq", [](auto& s) { s.exp_avg_sq(at::full({3}, 3.0)); }},
          {"master", [](auto& s) { s.master(at::full({3}, 2.0)); }}};
}

TEST(Fields, MomentumStatesSurviveCopyAndSaveLoad) {
  expect_every_field_survives(zero_state<LARSParamState>(), buffer_state_changes<LARSParamState>());
  expect_every_field_survives(zero_state<LARCParamState>(), buffer_state_changes<LARCParamState>());
}

TEST(Fields, MomentStatesSurviveCopyAndSaveLoad) {
  expect_every_field_survives(zero_state<LAMBParamState>(), moment_state_changes<LAMBParamState>());
  expect_every_field_survives(zero_state<NovoGradParamState>(), moment_state_changes<NovoGradParamState>());
}

TEST(Fields, LionAndMuonStatesSurviveCopyAndSaveLoad) {
  expect_every_field_survives<LionParamState>(zero_state<LionParamState>(),
                                              {{"step", [](auto& s) { s.step(7); }},
                                               {"exp_avg", [](auto& s) { s.exp_avg(at::ones({3})); }},
                                               {"master", [](auto& s) { s.master(at::full({3}, 2.0)); }}});
  auto muon = moment_state_changes<MuonParamState>();
  muon.push_back({"momentum_buffer", [](auto& s) { s.momentum_buffer(at::full({3}, 4.0)); }});
  expect_every_field_survives(zero_state<MuonParamState>(), muon);
}

TEST(Fields, ScheduleFreeStatesSurviveCopyAndSaveLoad) {
  // weight_sum and lr_max are doubles (StateField::kNumber): an fp32 round
  // trip would lose the 1e-10 below.
  expect_every_field_survives<AdamWScheduleFreeParamState>(
      zero_state<AdamWScheduleFreeParamState>(),
      {{"step", [](auto& s) { s.step(7); }},
       {"z", [](auto& s) { s.z(at::ones({3})); }},
       {"exp_avg_sq", [](auto& s) { s.exp_avg_sq(at::full({3}, 3.0)); }},
       {"weight_sum", [](auto& s) { s.weight_sum(1.0 + 1e-10); }},
       {"lr_max", [](auto& s) { s.lr_max(0.25 + 1e-10); }},
       {"master", [](auto& s) { s.master(at::full({3}, 2.0)); }}});
  expect_every_field_survives<SGDScheduleFreeParamState>(
      zero_state<SGDScheduleFreeParamState>(),
      {{"step", [](auto& s) { s.step(7); }},
       {"z", [](auto& s) { s.z(at::ones({3})); }},
       {"weight_sum", [](auto& s) { s.weight_sum(1.0 + 1e-10); }},
       {"lr_max", [](auto& s) { s.lr_max(0.25 + 1e-10); }},
       {"master", [](auto& s) { s.master(at::full({3}, 2.0)); }}});
  using Shape = StateField::Shape;
  const auto declared = AdamWScheduleFreeParamState::declared();
  ASSERT_EQ(declared.size(), 6u);
  EXPECT_EQ(declared[3].name, "weight_sum");
  EXPECT_EQ(declared[3].shape, Shape::kNumber);
  EXPECT_EQ(declared[1].shape, Shape::kLikeParam);
  EXPECT_EQ(declared[0].shape, Shape::kCount);
}

TEST(Fields, SOAPStatesSurviveCopyAndSaveLoad) {
  auto changes = moment_state_changes<SOAPParamState>();
  changes.push_back({"factors", [](auto& s) { s.factors(at::full({8}, 5.0)); }});
  changes.push_back({"eigenbases", [](auto& s) { s.eigenbases(at::full({8}, 6.0)); }});
  expect_every_field_survives(zero_state<SOAPParamState>(), changes);
  // The packed factors and bases have a shape of their own (not cut like the parameter).
  using Shape = StateField::Shape;
  const auto declared = SOAPParamState::declared();
  ASSERT_EQ(declared.size(), 6u);
  EXPECT_EQ(declared[3].name, "factors");
  EXPECT_EQ(declared[3].shape, Shape::kOwn);
  EXPECT_EQ(declared[4].shape, Shape::kOwn);
  EXPECT_EQ(declared[1].shape, Shape::kLikeParam);
}

TEST(Fields, ShampooStatesSurviveCopyAndSaveLoad) {
  expect_every_field_survives<ShampooParamState>(
      zero_state<ShampooParamState>(),
      {{"step", [](auto& s) { s.step(7); }},
       {"exp_avg", [](auto& s) { s.exp_avg(at::ones({3})); }},
       {"grafting_sq", [](auto& s) { s.grafting_sq(at::full({3}, 3.0)); }},
       {"momentum_buffer", [](auto& s) { s.momentum_buffer(at::full({3}, 4.0)); }},
       {"factors", [](auto& s) { s.factors(at::full({9}, 5.0)); }},
       {"inverse_roots", [](auto& s) { s.inverse_roots(at::full({9}, 6.0)); }},
       {"master", [](auto& s) { s.master(at::full({3}, 2.0)); }}});
  using Shape = StateField::Shape;
  const auto declared = ShampooParamState::declared();
  ASSERT_EQ(declared.size(), 7u);
  EXPECT_EQ(declared[4].name, "factors");
  EXPECT_EQ(declared[4].shape, Shape::kOwn);
  EXPECT_EQ(declared[5].shape, Shape::kOwn);
  EXPECT_EQ(declared[2].shape, Shape::kLikeParam);
}

TEST(Fields, AnUndefinedStateTensorIsLeftOutAndLoadsUndefined) {
  LAMBParamState s = zero_state<LAMBParamState>();
  s.master(at::Tensor());
  EXPECT_EQ(archive_keys(s), 3u);
  const LAMBParamState back = save_and_load(s, LAMBParamState());  // as a load makes it
  EXPECT_FALSE(back.master().defined()) << "master should stay undefined";
  EXPECT_TRUE(back == s);
}

}  // namespace
