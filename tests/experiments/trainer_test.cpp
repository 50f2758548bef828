// Trainer, models and data of the runner: parameter counts of the shipped
// architectures, the sampler's epochs, and the three ways a trial ends.
#include "../../distributed/process_group.h"
#include "../../experiments/io/csv.h"
#include "../../experiments/io/files.h"
#include "../../experiments/io/records.h"
#include "../../experiments/train/trial.h"
#include "../../experiments/sweep/results.h"
#include "../../experiments/sweep/trial_folder.h"
#include "../free_port.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <set>
#include <sstream>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

using namespace bigbatch::experiments;

std::int64_t count(torch::nn::Sequential& m) {
  std::int64_t n = 0;
  for (const auto& p : m->parameters()) n += p.numel();
  return n;
}

TEST(Models, ParameterCountsOfTheShippedArchitectures) {
  ModelSpec cnn;
  cnn.type = ModelType::kSimpleCnn;
  auto base = make_model(cnn, {1, 28, 28}, 10);
  // conv 5x5x1x32+32, conv 5x5x32x64+64, fc 7*7*64 x 1024 + 1024, fc 1024 x 10 + 10.
  EXPECT_EQ(count(base), 832 + 51264 + (3136 * 1024 + 1024) + 10250);
  cnn.variant = CnnVariant::kNarrow;
  auto narrow = make_model(cnn, {1, 28, 28}, 10);
  EXPECT_EQ(count(narrow), (25 * 16 + 16) + (25 * 16 * 32 + 32) + (7 * 7 * 32 * 512 + 512) + 5130);
  ModelSpec mlp;
  mlp.widths = {256, 256};
  auto m = make_model(mlp, {1, 28, 28}, 10);
  EXPECT_EQ(count(m), (784 * 256 + 256) + (256 * 256 + 256) + (256 * 10 + 10));
  ModelSpec res;
  res.type = ModelType::kResnet;
  res.norm = Norm::kGhost;
  res.ghost_batch_size = 4;
  auto r = make_model(res, {1, 28, 28}, 10);
  EXPECT_EQ(r->forward(at::randn({8, 1, 28, 28})).sizes(), (std::vector<std::int64_t>{8, 10}));
  std::int64_t weight_layers = 0;
  for (const auto& p : r->named_parameters()) {
    weight_layers += p.value().dim() >= 2 && p.key().find("shortcut") == std::string::npos ? 1 : 0;
  }
  EXPECT_EQ(weight_layers, 8);  // stem, 3 blocks x 2 convs, fc
}

TEST(BatchSampler, EachEpochIsAPermutationAndBatchesHaveTheirSize) {
  BatchSampler s(10, 3);
  std::set<std::int64_t> seen;
  for (int i = 0; i < 3; ++i) {
    const at::Tensor b = s.next(3);
    ASSERT_EQ(b.numel(), 3);
    for (int k = 0; k < 3; ++k) seen.insert(b[k].item<std::int64_t>());
  }
  EXPECT_EQ(seen.size(), 9u);  // no repeats within the epoch; the tail of 1 is dropped
  EXPECT_THROW(s.next(11), c10::Error);
}

TrialConfig mixture_trial(double lr, double threshold) {
  TrialConfig c;
  c.data.name = "gaussian_mixture";
  c.data.params["train_size"] = 2048;
  c.data.params["val_size"] = 512;
  c.data.params["classes"] = 3;
  c.data.params["dim"] = 5;
  c.data.params["separation"] = 3;
  c.model.params["widths"] = std::vector<std::int64_t>{16};
  c.optimizer = resolve_optimizer("sgd");
  c.schedule.base_lr = lr;
  c.target.threshold = threshold;
  c.target.eval_every = 5;
  c.budget = {200, bigbatch::schedules::Unit::kSteps};
  c.batch_size = 64;
  return c;
}

TEST(Trainer, EndsReachedNotReachedOrDiverged) {
  const auto run = [](const TrialConfig& c) {
    const WorkloadData d = load_dataset(c.data);
    Trainer t(c, d);
    return t.run().front();
  };
  const TrialResult reached = run(mixture_trial(0.05, 0.2));
  EXPECT_EQ(reached.status, TrialStatus::kReached);
  ASSERT_TRUE(reached.steps_to_target.has_value());
  EXPECT_EQ(*reached.steps_to_target % 5, 0);
  EXPECT_EQ(*reached.examples_to_target, *reached.steps_to_target * 64);
  EXPECT_LE(reached.rows.back().val_error, 0.2);
  EXPECT_EQ(reached.rows.back().step, *reached.steps_to_target);

  TrialConfig overlapping = mixture_trial(0.05, 0.05);
  overlapping.data.params["separation"] = 0.3;  // classes overlap: the Bayes error is far above 0.05
  const TrialResult never = run(overlapping);
  EXPECT_EQ(never.status, TrialStatus::kNotReached);
  EXPECT_EQ(never.steps, 200);
  EXPECT_EQ(never.rows.size(), 40u);

  const TrialResult diverged = run(mixture_trial(1e30, 0.2));
  EXPECT_EQ(diverged.status, TrialStatus::kDiverged);
  EXPECT_LT(diverged.steps, 200);
}

// Schedule-Free: the trainer evaluates at the optimizer's average x, with
// BatchNorm statistics recomputed there from the first 2,048 training
// examples (their plain average over batches of 256), and training goes on
// from y. Re-derived here by hand on a second trainer of the same trial.
TEST(Trainer, ScheduleFreeIsEvaluatedAtItsAverageWithBatchNormRecomputed) {
  TrialConfig c = mixture_trial(0.02, 0.0);
  c.model.params["norm"] = "batch";
  c.optimizer = resolve_optimizer("adamwschedulefree", {{"warmup_steps", 3}});
  c.target.eval_every = 12;
  c.budget = {12, bigbatch::schedules::Unit::kSteps};
  const WorkloadData d = load_dataset(c.data);
  Trainer runner(c, d);
  const TrialResult r = runner.run().front();
  ASSERT_EQ(r.rows.size(), 1u);

  Trainer by_hand(c, d);
  for (int i = 0; i < 12; ++i) by_hand.train_step();
  auto& model = by_hand.model();
  // Its parameters after the runner's evaluation: back at y, as these.
  for (std::size_t i = 0; i < model->parameters().size(); ++i) {
    EXPECT_TRUE(torch::equal(model->parameters()[i], runner.model()->parameters()[i])) << "parameter " << i;
  }
  const auto y_metrics = by_hand.evaluate().front();  // at y, the statistics of training
  auto& opt = dynamic_cast<bigbatch::optim::LayerwiseOptimizerBase&>(by_hand.optimizer());
  ASSERT_TRUE(opt.has_evaluation_point());
  opt.eval();
  {
    torch::NoGradGuard no_grad;
    int norms = 0;
    for (const auto& m : model->modules()) {
      if (auto* bn = dynamic_cast<torch::nn::BatchNorm1dImpl*>(m.get())) {
        bn->running_mean.zero_();
        bn->running_var.fill_(1);
        bn->num_batches_tracked.zero_();
        bn->options.momentum({});  // none: the plain average
        ++norms;
      }
    }
    ASSERT_EQ(norms, 1);
    for (std::int64_t b = 0; b < 2048; b += 256) model->forward(d.train->range(b, b + 256).input);
  }
  const auto x_metrics = by_hand.evaluate().front();
  EXPECT_NEAR(r.rows[0].val_loss, x_metrics.loss, 1e-6 * x_metrics.loss);
  EXPECT_EQ(r.rows[0].val_error, x_metrics.error);
  EXPECT_GT(std::abs(x_metrics.loss - y_metrics.loss), 1e-4 * x_metrics.loss) << "x and y evaluate alike: no check";
}

// "average": the trainer keeps an EMA of the weights after every step and
// evaluates it beside the trained weights, which training goes on from. The
// weights after each step are read before the next (the prune hook runs
// there), averaged here in float64, put into the model and evaluated: the
// row's avg_val_loss. With BatchNorm, its statistics are recomputed at the
// average (the first 2,048 training examples, their plain average).
TEST(Trainer, AveragedWeightsAreEvaluatedBesideTheTrainedOnes) {
  TrialConfig c = mixture_trial(0.05, 1e-9);
  c.model.params["norm"] = "batch";
  c.average.options.type = bigbatch::optim::AverageType::kEma;
  c.average.options.half_life = 64 * 4;  // d = 2^(-1/4) per step of 64
  c.target.eval_every = 10;
  c.budget = {10, bigbatch::schedules::Unit::kSteps};
  const WorkloadData d = load_dataset(c.data);
  Trainer runner(c, d);
  std::vector<std::vector<at::Tensor>> after;  // the weights after steps 1..10, float64
  const auto snapshot = [&] {
    std::vector<at::Tensor> now;
    for (const auto& p : runner.model()->parameters()) now.push_back(p.detach().to(at::kDouble));
    return now;
  };
  Trainer::Hooks hooks;
  hooks.prune = [&](std::size_t, std::int64_t) {
    if (runner.step() > 0) after.push_back(snapshot());
    return false;
  };
  const TrialResult r = runner.run(hooks).front();
  after.push_back(snapshot());
  ASSERT_EQ(after.size(), 10u);
  ASSERT_EQ(r.rows.size(), 1u);
  const double decay = std::pow(2.0, -0.25);
  std::vector<at::Tensor> ema = after[0];
  for (std::size_t t = 1; t < after.size(); ++t) {
    for (std::size_t i = 0; i < ema.size(); ++i) ema[i] = decay * ema[i] + (1 - decay) * after[t][i];
  }
  const auto raw = runner.evaluate().front();  // the trained weights are back
  EXPECT_EQ(r.rows[0].val_loss, raw.loss);
  auto& model = runner.model();
  {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < ema.size(); ++i) model->parameters()[i].copy_(ema[i]);
    for (const auto& m : model->modules()) {
      if (auto* bn = dynamic_cast<torch::nn::BatchNorm1dImpl*>(m.get())) {
        bn->running_mean.zero_();
        bn->running_var.fill_(1);
        bn->num_batches_tracked.zero_();
        bn->options.momentum({});
      }
    }
    for (std::int64_t b = 0; b < 2048; b += 256) model->forward(d.train->range(b, b + 256).input);
  }
  const auto by_hand = runner.evaluate().front();
  EXPECT_NEAR(r.rows[0].avg_val_loss, by_hand.loss, 1e-5 * by_hand.loss);
  EXPECT_NEAR(r.rows[0].avg_val_error, by_hand.error, 1.5 / 512);
  EXPECT_GT(std::abs(r.rows[0].avg_val_loss - r.rows[0].val_loss), 1e-3 * by_hand.loss) << "no check: alike";

  // target_on "averaged": the target is read on the averaged loss.
  TrialConfig on_average = mixture_trial(0.05, 1e-9);
  on_average.target = {Metric::kValLoss, r.rows[0].avg_val_loss * 1.0000001, 10};
  on_average.model.params["norm"] = "batch";
  on_average.average = c.average;
  on_average.budget = {20, bigbatch::schedules::Unit::kSteps};
  TrialConfig on_raw = on_average;
  on_average.average.target_on = TargetOn::kAveraged;
  const bool raw_is_lower = r.rows[0].val_loss < r.rows[0].avg_val_loss;
  Trainer averaged_target(on_average, d), raw_target(on_raw, d);
  const TrialResult a = averaged_target.run().front(), b = raw_target.run().front();
  EXPECT_EQ(a.status, TrialStatus::kReached);
  EXPECT_EQ(a.steps_to_target, std::optional<std::int64_t>(10));
  EXPECT_EQ(a.best_metric, a.rows[0].avg_val_loss);
  double lowest_raw = b.rows[0].val_loss;
  for (const EvalRow& row : b.rows) lowest_raw = std::min(lowest_raw, row.val_loss);
  EXPECT_EQ(b.best_metric, lowest_raw);
  if (!raw_is_lower) EXPECT_NE(b.steps_to_target, std::optional<std::int64_t>(10));
}

TEST(Trainer, SameSeedSameRun) {
  const TrialConfig c = mixture_trial(0.05, 0.001);
  const WorkloadData d = load_dataset(c.data);
  Trainer a(c, d), b(c, d);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(a.train_step().front(), b.train_step().front());
}

// A group of one process (what `train --backend nccl` on one GPU makes) has
// one batch size for both of the noise scale's norms: the trainer measures
// it in micro-batches, as without a group, and trains the same run bit for
// bit. (It used to stop at the first step: "need 0 < small_batch <
// big_batch, got 64 and 64".)
TEST(Trainer, AWorldOfOneMeasuresTheNoiseScaleInMicroBatches) {
  TrialConfig c = mixture_trial(0.05, 0.001);
  c.gns.micro_batches = 2;
  const WorkloadData d = load_dataset(c.data);
  bigbatch::distributed::WorldInfo world;
  world.master_port = bigbatch::testing_support::free_port();
  bigbatch::distributed::ProcessGroup group(world, std::chrono::seconds(30), bigbatch::distributed::Backend::kGloo);
  Trainer alone(c, d), grouped(c, d, &group);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(alone.train_step().front(), grouped.train_step().front()) << "step " << i;
  EXPECT_TRUE(std::isfinite(grouped.b_simple()));
  EXPECT_EQ(alone.b_simple(), grouped.b_simple());
}

// An interrupted run resumed from its last checkpoint ends exactly as the
// uninterrupted run: same evaluations, same parameters, bit for bit. With the
// state that must survive: LAMB's moments and step counts, the sampler in the
// middle of an epoch, the noise-scale averages, a warmup schedule, and the
// weight average.
TEST(Trainer, ResumedFromACheckpointEqualsUninterrupted) {
  for (const std::string optimizer : {"lamb", "sgd"}) {
    TrialConfig c = mixture_trial(0.05, 0.001);
    c.optimizer = resolve_optimizer(optimizer);
    c.data.params["separation"] = 0.5;  // overlapping classes: the target is never reached
    c.checkpoint_every = 20;
    c.gns.micro_batches = 2;
    c.noise.type = NoiseType::kMultiplicative;
    c.noise.base_batch = 32;
    c.schedule.warmup.length = 30;
    c.budget = {90, bigbatch::schedules::Unit::kSteps};
    // And the weight average: LAMB's LAWA window part full at the
    // checkpoint, SGD's EMA.
    c.average.options.type = optimizer == "lamb" ? bigbatch::optim::AverageType::kLawa
                                                 : bigbatch::optim::AverageType::kEma;
    c.average.options.k = 3;
    c.average.options.every = 15;
    c.average.options.decay = 0.9;
    const WorkloadData d = load_dataset(c.data);

    Trainer whole(c, d);
    const TrialResult full = whole.run().front();

    std::vector<std::string> saved;
    std::int64_t stopped_at = 0;
    {
      TrialConfig first = c;
      first.budget = {50, bigbatch::schedules::Unit::kSteps};  // "killed" after step 50
      Trainer a(first, d);
      Trainer::Hooks hooks;
      hooks.on_checkpoint = [&](const std::string& bytes) { saved.push_back(bytes); };
      a.run(hooks);
      stopped_at = a.step();
    }
    ASSERT_EQ(stopped_at, 50);
    ASSERT_EQ(saved.size(), 2u) << "checkpoints at steps 20 and 40";
    Trainer b(c, d);
    b.restore(saved.back());  // step 40
    EXPECT_EQ(b.step(), 40);
    const TrialResult resumed = b.run().front();

    ASSERT_EQ(resumed.rows.size(), full.rows.size()) << optimizer;
    for (std::size_t i = 0; i < full.rows.size(); ++i) {
      EXPECT_EQ(resumed.rows[i].step, full.rows[i].step);
      EXPECT_EQ(resumed.rows[i].train_loss, full.rows[i].train_loss) << optimizer << ", row " << i;
      EXPECT_EQ(resumed.rows[i].val_loss, full.rows[i].val_loss) << optimizer << ", row " << i;
      const double ra = resumed.rows[i].avg_val_loss, fa = full.rows[i].avg_val_loss;
      EXPECT_TRUE(ra == fa || (std::isnan(ra) && std::isnan(fa) && full.rows[i].step < 15)) << optimizer << ", row " << i;
      EXPECT_EQ(resumed.rows[i].lr, full.rows[i].lr);
      EXPECT_TRUE(resumed.rows[i].gns == full.rows[i].gns || (std::isnan(resumed.rows[i].gns) && std::isnan(full.rows[i].gns)));
    }
    EXPECT_TRUE(std::isfinite(full.rows.back().avg_val_loss)) << optimizer << ": nothing averaged";
    EXPECT_EQ(resumed.status, full.status);
    EXPECT_EQ(resumed.best_metric, full.best_metric);
    const auto pw = whole.model()->parameters();
    const auto pb = b.model()->parameters();
    for (std::size_t k = 0; k < pw.size(); ++k) EXPECT_TRUE(at::equal(pw[k], pb[k])) << optimizer << ", parameter " << k;
  }
}

// A run stopped by a signal between two evaluations (Hooks::interrupt, a
// sweep's preemption) writes its checkpoint there, with no checkpoint_every,
// and resumed from it ends exactly as the uninterrupted run: the training
// losses since the last evaluation are part of the checkpoint.
TEST(Trainer, InterruptedBetweenEvaluationsResumesExactly) {
  TrialConfig c = mixture_trial(0.05, 0.001);
  c.optimizer = resolve_optimizer("lamb");
  c.data.params["separation"] = 0.5;  // the target is never reached
  c.target.eval_every = 10;
  c.checkpoint_every = 0;
  c.gns.micro_batches = 2;
  c.budget = {60, bigbatch::schedules::Unit::kSteps};
  const WorkloadData d = load_dataset(c.data);
  Trainer whole(c, d);
  const TrialResult full = whole.run().front();

  std::string saved;
  Trainer a(c, d);
  Trainer::Hooks hooks;
  hooks.on_checkpoint = [&](const std::string& bytes) { saved = bytes; };
  hooks.interrupt = [&] { return a.step() == 27 ? Interrupt::kCheckpoint : Interrupt::kNone; };
  bool interrupted = false;
  try {
    a.run(hooks);
  } catch (const TrialInterrupted& e) {
    interrupted = e.how == Interrupt::kCheckpoint;
  }
  ASSERT_TRUE(interrupted);
  ASSERT_FALSE(saved.empty()) << "no checkpoint at the interruption";
  Trainer b(c, d);
  b.restore(saved);
  EXPECT_EQ(b.step(), 27);
  const TrialResult resumed = b.run().front();
  ASSERT_EQ(resumed.rows.size(), full.rows.size());
  for (std::size_t i = 0; i < full.rows.size(); ++i) {
    EXPECT_EQ(resumed.rows[i].step, full.rows[i].step);
    EXPECT_EQ(resumed.rows[i].train_loss, full.rows[i].train_loss) << "row " << i;
    EXPECT_EQ(resumed.rows[i].val_loss, full.rows[i].val_loss) << "row " << i;
  }
  // Abandoned (another worker holds the trial): no checkpoint is taken.
  saved.clear();
  Trainer e(c, d);
  hooks.interrupt = [&] { return e.step() == 13 ? Interrupt::kAbandon : Interrupt::kNone; };
  EXPECT_THROW(e.run(hooks), TrialInterrupted);
  EXPECT_TRUE(saved.empty());
}

// The checkpoint names what it holds: a reader finds the step and each
// evaluation column under its own key, and an archive without this format's
// marker (an older layout) is refused by name instead of misread.
TEST(Trainer, CheckpointKeysAreNamedAndOtherFormatsAreRefused) {
  TrialConfig c = mixture_trial(0.05, 0.001);
  c.data.params["separation"] = 0.5;
  c.budget = {60, bigbatch::schedules::Unit::kSteps};
  c.target.eval_every = 20;
  const WorkloadData d = load_dataset(c.data);
  Trainer t(c, d);
  const TrialResult r = t.run().front();
  ASSERT_EQ(r.rows.size(), 3u);
  // The archive: after the header line, framed as one TFRecord.
  const std::string bytes = t.checkpoint();
  const std::string header = "bigbatch checkpoint\n";
  ASSERT_EQ(bytes.substr(0, header.size()), header);
  const auto records = bigbatch::experiments::records::read_records(std::string_view(bytes).substr(header.size()));
  ASSERT_EQ(records.payloads.size(), 1u);
  torch::serialize::InputArchive archive;
  std::istringstream in(records.payloads[0]);
  archive.load_from(in);
  at::Tensor step, val_loss, batch;
  archive.read("step", step);
  archive.read("rows/val_loss", val_loss);
  archive.read("rows/batch_size", batch);
  EXPECT_EQ(step.item<std::int64_t>(), 60);
  ASSERT_EQ(val_loss.numel(), 3);
  EXPECT_EQ(val_loss[2].item<double>(), r.rows[2].val_loss);
  EXPECT_EQ(batch.scalar_type(), at::kLong);
  EXPECT_EQ(batch[0].item<std::int64_t>(), c.batch_size);

  torch::serialize::OutputArchive old;
  old.write("counters", at::zeros({3}, at::kLong));
  std::ostringstream old_bytes;
  old.save_to(old_bytes);
  const auto refused = [&](const std::string& checkpoint, const std::string& why) {
    Trainer fresh(c, d);
    try {
      fresh.restore(checkpoint);
      ADD_FAILURE() << "accepted a checkpoint that is " << why;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  refused(header + bigbatch::experiments::records::frame(old_bytes.str()), "not of format");
  refused(old_bytes.str(), "not a bigbatch checkpoint");  // an unframed archive (bigbatch before the header)
  // Cut anywhere, or one byte changed: refused before LibTorch reads it.
  for (const std::size_t cut : {header.size(), header.size() + 11, bytes.size() / 2, bytes.size() - 1}) {
    refused(bytes.substr(0, cut), "cut short or damaged");
  }
  std::string flipped = bytes;
  flipped[bytes.size() / 3] = static_cast<char>(flipped[bytes.size() / 3] ^ 1);
  refused(flipped, "cut short or damaged");
  Trainer(c, d).restore(bytes);  // and the whole one is taken
}

// A trial folder whose checkpoint cannot be read (a killed write, another
// version's format) is not a dead end: the trial starts over and ends exactly
// as a fresh run does.
TEST(TrialFolder, AnUnreadableCheckpointRestartsTheTrial) {
  TrialConfig c = mixture_trial(0.05, 0.001);
  c.name = "t";
  c.data.params["separation"] = 0.5;
  c.budget = {40, bigbatch::schedules::Unit::kSteps};
  c.target.eval_every = 10;
  c.checkpoint_every = 20;
  const WorkloadData d = load_dataset(c.data);
  const TrialResult fresh = Trainer(c, d).run().front();
  const auto dir = std::filesystem::temp_directory_path() / ("bigbatch_trial_folder_test_" + std::to_string(::getpid()));
  bigbatch::experiments::remove_tree(dir);
  std::filesystem::create_directories(dir);
  write_file_atomic((dir / "config.json").string(), to_json(c).dump(2) + "\n");
  write_file_atomic((dir / "checkpoint.pt").string(), "PK\x03\x04 not a whole archive");
  const TrialResult r = run_one(c, d, dir.string());
  ASSERT_EQ(r.rows.size(), fresh.rows.size());
  for (std::size_t i = 0; i < r.rows.size(); ++i) EXPECT_EQ(r.rows[i].val_loss, fresh.rows[i].val_loss) << i;
  EXPECT_TRUE(trial_finished(c, dir.string()));
  EXPECT_FALSE(std::filesystem::exists(dir / "checkpoint.pt"));
  bigbatch::experiments::remove_tree(dir);
}

// A trial with horizons: each horizon's run, branched where the schedules
// part, ends exactly as that horizon's trial trained alone from step 0 (its
// metrics.csv cell for cell, but for wall time); a wsd branch parts at its
// cooldown, a cosine one after the shared warmup. Every run trains past the
// target to its budget, keeping the first step that reached it. A branch
// already finished is kept when the trial runs again.
TEST(TrialFolder, HorizonsBranchedEqualTheirRunsAlone) {
  for (const auto decay : {bigbatch::schedules::DecayType::kWsd, bigbatch::schedules::DecayType::kCosine}) {
    TrialConfig c = mixture_trial(0.05, 0.3);  // reached early: the runs go on past it
    c.name = "t";
    c.optimizer = resolve_optimizer("lamb");
    c.average.options.type = bigbatch::optim::AverageType::kEma;  // its state crosses the branch too
    c.average.options.decay = 0.8;
    c.target.eval_every = 7;
    c.budget = {60, bigbatch::schedules::Unit::kSteps};
    c.schedule.warmup.length = 6;
    c.schedule.decay.type = decay;
    if (decay == bigbatch::schedules::DecayType::kWsd) {
      c.schedule.decay.stable = 42;
      c.schedule.decay.cooldown = 12;  // a fifth of the run
    } else {
      c.schedule.decay.length = 54;
    }
    c.horizons = {20, 45};
    const WorkloadData d = load_dataset(c.data);
    const auto dir = std::filesystem::temp_directory_path() / ("bigbatch_horizons_test_" + std::to_string(::getpid()));
    bigbatch::experiments::remove_tree(dir);
    const TrialResult main = run_one(c, d, (dir / "t").string());
    const std::string what = bigbatch::schedules::to_string(decay);
    EXPECT_EQ(main.status, TrialStatus::kReached) << what;
    ASSERT_TRUE(main.steps_to_target.has_value());
    EXPECT_LT(*main.steps_to_target, 60) << what;
    EXPECT_EQ(main.rows.back().step, 60) << what << ": stopped at the target";
    for (std::size_t k = 0; k < 2; ++k) {
      const TrialConfig h = horizon_trial(c, k);
      const auto folder = dir / "t" / ("horizon_" + std::to_string(k + 1));
      const std::int64_t point = branch_point(c, h, d.train_size());
      // The first step whose rate differs. wsd: the cooldown of 20% starts at
      // step 16 (of 20) and 36 (of 45), where u = 0 still gives the peak;
      // cosine: its step 0 after the warmup of 6 is the peak too.
      const std::int64_t expected = decay == bigbatch::schedules::DecayType::kWsd ? (k == 0 ? 17 : 37) : 7;
      EXPECT_EQ(point, expected) << what << " horizon " << k + 1;
      EXPECT_EQ(read_json((folder / "branched.json").string())["step"], point);
      Trainer::Hooks past;  // the horizon's trial alone, also trained past the target
      past.past_target = true;
      const TrialResult alone = Trainer(h, d).run(past).front();
      const CsvTable a = CsvTable::read((folder / "metrics.csv").string());
      const CsvTable b(metrics_csv(alone.rows), "alone");
      ASSERT_EQ(a.rows(), b.rows()) << what << " horizon " << k + 1;
      EXPECT_EQ(a.integer(a.rows() - 1, "step"), h.budget.length) << what;
      for (std::size_t r = 0; r < a.rows(); ++r) {
        for (const auto& column : a.header()) {
          if (column == "wall_time") continue;
          EXPECT_EQ(a.at(r, column), b.at(r, column)) << what << " horizon " << k + 1 << " row " << r << " " << column;
        }
      }
      const auto summary = read_json((folder / "summary.json").string());
      ASSERT_TRUE(alone.steps_to_target.has_value());
      EXPECT_EQ(summary["steps_to_target"], *alone.steps_to_target) << what;
      EXPECT_EQ(summary["status"], "reached") << what;
    }
    // Run again: the branches are finished and kept (their files unchanged).
    const std::string before = read_file((dir / "t" / "horizon_1" / "metrics.csv").string());
    std::filesystem::remove(dir / "t" / "summary.json");
    run_one(c, d, (dir / "t").string());
    EXPECT_EQ(read_file((dir / "t" / "horizon_1" / "metrics.csv").string()), before);
    bigbatch::experiments::remove_tree(dir);
  }
}

TEST(Trainer, CudaTrialFollowsTheCpuTrial_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const std::string optimizer : {"sgd", "lamb", "lars"}) {
    TrialConfig c = mixture_trial(optimizer == "lars" ? 1.0 : 0.05, 0.001);
    c.optimizer = resolve_optimizer(optimizer);
    const WorkloadData d = load_dataset(c.data);
    Trainer cpu(c, d);
    c.device = DeviceType::kCuda;
    Trainer gpu(c, d);
    EXPECT_TRUE(gpu.device().is_cuda());
    EXPECT_TRUE(gpu.model()->parameters().front().is_cuda());
    // The same data, weights and rates: the losses agree to float rounding
    // (different kernels sum in different orders) over the first steps.
    for (int i = 0; i < 10; ++i) {
      const double a = cpu.train_step().front();
      const double b = gpu.train_step().front();
      EXPECT_NEAR(a, b, 1e-3 * std::abs(a) + 1e-4) << optimizer << ", step " << i;
    }
    const double loss_cpu = cpu.evaluate().front().loss;
    const double loss_gpu = gpu.evaluate().front().loss;
    EXPECT_NEAR(loss_cpu, loss_gpu, 1e-2 * loss_cpu) << optimizer;
  }
}

TEST(Trainer, MissingCudaDeviceIsRefused) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a CUDA device is visible";
  TrialConfig c = mixture_trial(0.05, 0.2);
  c.device = DeviceType::kCuda;
  const WorkloadData d = load_dataset(c.data);
  try {
    Trainer t(c, d);
    FAIL() << "cuda was accepted without a CUDA device";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
  }
}

}  // namespace
