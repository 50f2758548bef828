// Mixed-precision trials (config "precision"; docs/experiments.md "Mixed
// precision"): autocast from C++ against a float64 bound worked out by hand,
// fp32 master weights, a bf16 trial against fp32 ones, and the fp16 loop's
// loss scale with the steps it skips.
#include "../../compat/autocast.h"
#include "../../experiments/train/batched.h"
#include "../../experiments/runconfig/config.h"
#include "../../experiments/train/lane_model.h"
#include "../../experiments/io/records.h"
#include "../../experiments/train/trial.h"

#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/serialize/input-archive.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <sstream>
#include <string>

namespace {

using namespace bigbatch::experiments;
using bigbatch::compat::AutocastGuard;

TEST(Autocast, TheGuardTurnsItOnForItsScopeAndRestoresWhatWasBefore) {
  const at::Tensor a = at::randn({8, 8}), b = at::randn({8, 8});
  EXPECT_EQ(at::mm(a, b).scalar_type(), at::kFloat);
  {
    const AutocastGuard outer(c10::DeviceType::CPU, at::kBFloat16);
    EXPECT_EQ(at::mm(a, b).scalar_type(), at::kBFloat16);
    EXPECT_EQ((a + b).scalar_type(), at::kFloat) << "an elementwise add is not autocast";
    {
      const AutocastGuard inner(c10::DeviceType::CPU, at::kBFloat16);
      EXPECT_EQ(at::mm(a, b).scalar_type(), at::kBFloat16);
    }
    EXPECT_EQ(at::mm(a, b).scalar_type(), at::kBFloat16) << "the inner guard's end leaves the outer's region on";
  }
  EXPECT_EQ(at::mm(a, b).scalar_type(), at::kFloat);
}

// A linear layer under bf16 autocast against float64, element by element,
// with the bound of its rounding: x and W (and the bias) are rounded to bf16
// (8 significant bits: relative error u = 2^-8 each, so each product x_k w_k is off by at most
// (2u + u^2) |x_k w_k|), the products are summed in fp32 (K terms: gamma_K =
// K 2^-24 / (1 - K 2^-24) of sum |x_k w_k|), and the output is rounded to
// bf16 (u of its value). Autocast off, the same layer stays within fp32's
// bound alone, and the two differ: the bf16 rounding is there.
TEST(Autocast, ALinearLayerIsWithinTheBoundOfBf16Rounding) {
  torch::manual_seed(7);
  const std::int64_t K = 784;
  torch::nn::Linear layer(K, 64);
  const at::Tensor x = at::randn({32, K});
  const at::Tensor w = layer->weight.detach().to(at::kDouble), bias = layer->bias.detach().to(at::kDouble);
  const at::Tensor x64 = x.to(at::kDouble);
  const at::Tensor exact = at::addmm(bias, x64, w.t());
  const at::Tensor magnitude = at::mm(x64.abs(), w.abs().t());  // sum_k |x_k w_k|
  const double u = std::ldexp(1.0, -8), u32 = std::ldexp(1.0, -24);
  const double gamma = K * u32 / (1 - K * u32);
  const at::Tensor inner = (2 * u + u * u + gamma) * magnitude + u * bias.abs();
  const at::Tensor bound = inner + u * (exact.abs() + inner);

  const at::Tensor mixed =
      forward_in(Precision::kBf16, at::Device(at::kCPU), [&] { return layer->forward(x); }).to(at::kDouble);
  EXPECT_EQ(forward_in(Precision::kBf16, at::Device(at::kCPU), [&] { return layer->forward(x); }).scalar_type(),
            at::kFloat)
      << "forward_in hands the loss fp32 outputs";
  const at::Tensor excess = (mixed - exact).abs() - bound;
  EXPECT_LE(excess.max().item<double>(), 0) << "worst element over its bound by " << excess.max().item<double>();
  // Not a vacuous bound: the error reaches a sizeable part of it somewhere.
  const double reach = ((mixed - exact).abs() / bound).max().item<double>();
  std::cout << "the largest error is " << reach << " of its bound\n";
  EXPECT_GT(reach, 0.02);

  const at::Tensor plain = forward_in(Precision::kFp32, at::Device(at::kCPU), [&] { return layer->forward(x); });
  EXPECT_LE(((plain.to(at::kDouble) - exact).abs() - (gamma + u32) * (magnitude + bias.abs())).max().item<double>(), 0);
  EXPECT_GT((plain.to(at::kDouble) - mixed).abs().max().item<double>(), 0) << "autocast changed nothing";
}

TrialConfig mixture_trial(Precision precision, std::uint64_t seed) {
  TrialConfig c;
  c.data.name = "gaussian_mixture";
  c.data.params["train_size"] = 4096;
  c.data.params["val_size"] = 2048;
  c.data.params["classes"] = 4;
  c.data.params["dim"] = 32;
  c.data.params["separation"] = 0.6;
  c.model.params["widths"] = std::vector<std::int64_t>{64, 64};
  c.optimizer = resolve_optimizer("lamb");
  c.schedule.base_lr = 0.01;
  c.target.threshold = 0;  // never reached: every run goes the whole budget
  c.target.eval_every = 50;
  c.budget = {150, bigbatch::schedules::Unit::kSteps};
  c.batch_size = 64;
  c.seed = seed;
  c.precision = precision;
  return c;
}

// A bf16 trial keeps fp32 weights (the optimizer updates them in fp32; only
// the forward's copies are bf16), and its validation loss after 150 steps is
// as close to the fp32 trial of its seed as the tolerance derived here: the
// spread of the fp32 trial's loss over three seeds. bf16's rounding perturbs
// the run from its first step, as a change of seed changes its start and
// its batches; a bf16 run farther from its fp32 twin than other seeds are
// from each other would mean the precision, not chance, moved it.
TEST(MixedPrecision, ABf16TrialStaysWithinTheSeedsSpreadOfFp32) {
  const WorkloadData d = load_dataset(mixture_trial(Precision::kFp32, 0).data);
  std::vector<double> fp32;
  for (std::uint64_t seed : {0, 1, 2}) {
    Trainer t(mixture_trial(Precision::kFp32, seed), d);
    fp32.push_back(t.run().front().rows.back().val_loss);
  }
  Trainer mixed(mixture_trial(Precision::kBf16, 0), d);
  const TrialResult r = mixed.run().front();
  const double spread = *std::max_element(fp32.begin(), fp32.end()) - *std::min_element(fp32.begin(), fp32.end());
  const double difference = std::abs(r.rows.back().val_loss - fp32[0]);
  std::cout << "val_loss after 150 steps: fp32 seeds " << fp32[0] << " " << fp32[1] << " " << fp32[2] << ", bf16 seed 0 "
            << r.rows.back().val_loss << ": |bf16 - fp32| " << difference << " against a spread of " << spread << "\n";
  EXPECT_GT(spread, 0);
  EXPECT_LE(difference, spread) << "bf16 " << r.rows.back().val_loss << ", fp32 seeds " << fp32[0] << " " << fp32[1]
                                << " " << fp32[2];
  EXPECT_GT(difference, 0) << "the bf16 trial computed what the fp32 one did";
  EXPECT_TRUE(std::isnan(r.rows.back().loss_scale)) << "bf16 needs no loss scale";

  std::int64_t finer = 0, total = 0;
  for (const auto& p : mixed.model()->parameters()) {
    ASSERT_EQ(p.scalar_type(), at::kFloat);
    finer += p.ne(p.to(at::kBFloat16).to(at::kFloat)).sum().item<std::int64_t>();
    total += p.numel();
  }
  EXPECT_GT(finer, total * 9 / 10) << "the weights hold fp32's bits, not bf16's";
}

// The config key: fp32 is left out of resolved configs (so folders from
// before it keep their identity), bf16 is written, anything else is refused
// by name; fp16 on the CPU needs LibTorch 2.5 or later, and refuses a compressor
// that keeps gradients between steps.
TEST(MixedPrecision, TheConfigKey) {
  nlohmann::json j = nlohmann::json::parse(R"({"name": "p", "dataset": {"name": "gaussian_mixture"},
      "model": {"type": "mlp", "widths": [8]}, "optimizer": {"name": "sgd"}, "target": {"threshold": 0.1},
      "budget": {"steps": 10}, "batch_sizes": [32], "search": {"lr": [0.1]}})");
  EXPECT_FALSE(to_json(parse_sweep(j)).contains("precision"));
  j["precision"] = "bf16";
  const SweepConfig s = parse_sweep(j);
  EXPECT_EQ(s.base.precision, Precision::kBf16);
  EXPECT_EQ(to_json(s)["precision"], "bf16");
  EXPECT_EQ(expand(s).front().precision, Precision::kBf16);
  j["precision"] = "fp8";
  try {
    parse_sweep(j);
    ADD_FAILURE() << "fp8 accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("precision"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("fp8"), std::string::npos) << e.what();
  }
  j["precision"] = "fp16";
  if (bigbatch::compat::autocast_supports(c10::DeviceType::CPU, at::kHalf)) {
    EXPECT_EQ(parse_sweep(j).base.precision, Precision::kFp16);
    // A compressor that keeps gradients between steps would keep loss-scaled
    // ones (an overflow's inf for good): refused with fp16, by name; the same
    // compressor without memory, and with bf16, is accepted.
    j["distributed"] = {{"compression", {{"name", "topk"}}}};
    try {
      parse_sweep(j);
      ADD_FAILURE() << "fp16 with topk's error memory accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("precision: fp16's loss-scaled gradients cannot feed "
                                           "distributed.compression topk"),
                std::string::npos)
          << e.what();
    }
    j["distributed"] = {{"compression", {{"name", "sign"}, {"error_feedback", false}}}};
    EXPECT_EQ(parse_sweep(j).base.distributed.compression.method, bigbatch::distributed::Compression::kSign);
    j["distributed"] = {{"compression", {{"name", "powersgd"}}}};
    EXPECT_THROW(parse_sweep(j), ConfigError) << "PowerSGD's warm-started Q is memory too";
    j["precision"] = "bf16";
    EXPECT_EQ(parse_sweep(j).base.precision, Precision::kBf16);
    j.erase("distributed");
    j["precision"] = "fp16";
  } else {
    try {
      parse_sweep(j);
      ADD_FAILURE() << "fp16 on the CPU accepted by a LibTorch without CPU fp16 autocast";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("precision: fp16 on device cpu needs LibTorch 2.5 or later"), std::string::npos)
          << e.what();
    }
  }
  // Batched groups take bf16 lanes, not fp16's (each lane would need its own loss scale).
  TrialConfig t = mixture_trial(Precision::kBf16, 0);
  EXPECT_EQ(batch_refusal(t), "");
  t.precision = Precision::kFp16;
  EXPECT_EQ(batch_refusal(t), "fp16's loss scale");
}

// fp16 through the training loop (on the CPU, where LibTorch 2.5's and later autocast
// has fp16): a linear regression y = 10(x + N(0,1)) + 2 at batch 1, whose
// output gradient 2(y_hat - y) times the initial scale 2^16 overflows fp16
// (largest 65504) until the scale has halved enough. The loop skips those
// steps, leaving the weights as they were, halves the scale each time, then
// trains; metrics.csv's columns and a resumed run carry the scaler.
TEST(MixedPrecision, TheFp16LoopSkipsOverflowsAndHalvesTheScale) {
  if (!bigbatch::compat::autocast_supports(c10::DeviceType::CPU, at::kHalf)) {
    GTEST_SKIP() << "this LibTorch's CPU autocast has no fp16 (1.13)";
  }
  TrialConfig c;
  DataSpec data;
  data.name = DatasetName::kLinearRegression;
  data.train_size = 1024;
  data.val_size = 256;
  c.data = dataset_part(data);
  ModelSpec model;
  model.type = ModelType::kLinear;
  c.model = model_part(model);
  c.optimizer = resolve_optimizer("sgd", {{"momentum", 0}});
  c.schedule.base_lr = 0.001;
  c.target.metric = Metric::kValLoss;
  c.target.threshold = 0;
  c.target.eval_every = 10;
  c.budget = {40, bigbatch::schedules::Unit::kSteps};
  c.batch_size = 1;
  c.precision = Precision::kFp16;
  c.checkpoint_every = 10;
  const WorkloadData d = load_dataset(c.data);

  Trainer t(c, d);
  std::vector<at::Tensor> before;
  for (const auto& p : t.model()->parameters()) before.push_back(p.detach().clone());
  // Step by step: a step changes the weights exactly when it was not skipped.
  std::int64_t skipped = 0;
  for (int k = 0; k < 40; ++k) {
    std::vector<at::Tensor> w;
    for (const auto& p : t.model()->parameters()) w.push_back(p.detach().clone());
    t.train_step();
    bool moved = false;
    for (std::size_t i = 0; i < w.size(); ++i) moved = moved || !at::equal(w[i], t.model()->parameters()[i]);
    if (!moved) ++skipped;
  }
  Trainer fresh(c, d);
  std::vector<std::string> whole_saved;
  Trainer::Hooks whole_hooks;
  whole_hooks.on_checkpoint = [&](const std::string& bytes) { whole_saved.push_back(bytes); };
  const TrialResult r = fresh.run(whole_hooks).front();
  ASSERT_EQ(r.rows.size(), 4u);
  const double scale = r.rows.back().loss_scale, skips = r.rows.back().skipped_steps;
  std::cout << "fp16: " << skips << " steps skipped, loss scale " << scale << " after 40 steps\n";
  EXPECT_GE(skips, 1) << "the initial 2^16 overflows fp16 here";
  EXPECT_EQ(skips, static_cast<double>(skipped)) << "a skipped step is one that left the weights alone";
  EXPECT_EQ(scale, std::ldexp(65536.0, -static_cast<int>(skips))) << "halved once per skipped step";
  EXPECT_LT(r.rows.back().val_loss, r.rows.front().val_loss) << "and then it trains";

  // Resumed from its checkpoint at step 20, the run ends as the whole one.
  std::vector<std::string> saved;
  TrialConfig first = c;
  first.budget = {30, bigbatch::schedules::Unit::kSteps};
  Trainer a(first, d);
  Trainer::Hooks hooks;
  hooks.on_checkpoint = [&](const std::string& bytes) { saved.push_back(bytes); };
  a.run(hooks);
  ASSERT_EQ(saved.size(), 2u);  // steps 10 and 20 (a run's last step writes none)
  Trainer b(c, d);
  b.restore(saved.back());
  std::vector<std::string> resumed_saved;
  Trainer::Hooks resumed_hooks;
  resumed_hooks.on_checkpoint = [&](const std::string& bytes) { resumed_saved.push_back(bytes); };
  const TrialResult resumed = b.run(resumed_hooks).front();
  // The scaler's state at step 30 as each checkpoint holds it: the run of
  // finite steps counts from the last overflow, before the resume too (a
  // resume that lost it would count from step 20 and grow the scale late).
  ASSERT_EQ(whole_saved.size(), 3u);
  ASSERT_EQ(resumed_saved.size(), 1u);
  const auto scaler_state = [](const std::string& bytes) {
    // The checkpoint's layout (trial.h): a header line, then one framed
    // record holding the torch archive.
    const std::string header = "bigbatch checkpoint\n";
    EXPECT_EQ(bytes.compare(0, header.size(), header), 0);
    const auto framed = bigbatch::experiments::records::read_records(std::string_view(bytes).substr(header.size()));
    EXPECT_EQ(framed.payloads.size(), 1u);
    std::istringstream in(framed.payloads.front());
    torch::serialize::InputArchive archive;
    archive.load_from(in);
    at::Tensor scale, run, skipped;
    archive.read("loss_scaler/scale", scale);
    archive.read("loss_scaler/run", run);
    archive.read("loss_scaler/skipped", skipped);
    return std::vector<double>{scale.item<double>(), run.item<double>(), skipped.item<double>()};
  };
  const std::vector<double> whole_state = scaler_state(whole_saved.back());
  EXPECT_GT(whole_state[1], 10) << "the last overflow came before the resume at step 20";
  EXPECT_EQ(scaler_state(resumed_saved.back()), whole_state);
  ASSERT_EQ(resumed.rows.size(), r.rows.size());
  for (std::size_t i = 0; i < r.rows.size(); ++i) {
    EXPECT_EQ(resumed.rows[i].val_loss, r.rows[i].val_loss) << i;
    EXPECT_EQ(resumed.rows[i].loss_scale, r.rows[i].loss_scale) << i;
    EXPECT_EQ(resumed.rows[i].skipped_steps, r.rows[i].skipped_steps) << i;
  }
}

}  // namespace
