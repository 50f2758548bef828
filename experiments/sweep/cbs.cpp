// bigbatch cbs's runner (cbs.h): the reference runs and their checkpoints,
// the branches, and the three-way comparison; the config is config.cpp's,
// the curve and report cbs_results.cpp's.
#include "cbs.h"

#include "../io/files.h"
#include "machine.h"
#include "preflight.h"
#include "progress.h"
#include "results.h"
#include "../io/tensorboard.h"
#include "../train/trial.h"
#include "trial_folder.h"
#include "workers.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <sstream>

namespace bigbatch::experiments {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Runs fn(i) for i in [0, count), `jobs` at a time (run_cbs allows only one
// under a process group; as many as fit the cores, workers.h), each thread
// with `threads` intra-op threads.
template <typename Fn>
void for_each_job(std::size_t count, int jobs, int threads, distributed::ProcessGroup* group, Fn&& fn) {
  jobs = std::max(1, std::min<int>(jobs_that_fit(jobs, threads, group != nullptr ? group->local_size() : 1),
                                   static_cast<int>(std::max<std::size_t>(1, count))));
  std::atomic<std::size_t> next{0};
  run_workers(
      jobs, threads,
      [&]() -> std::optional<std::size_t> {
        const std::size_t i = next++;
        return i < count ? std::optional<std::size_t>(i) : std::nullopt;
      },
      fn);
}

// Rank 0's answer, on every rank (its own without a group).
bool agreed(distributed::ProcessGroup* group, bool value) {
  if (group == nullptr) return value;
  std::vector<at::Tensor> flag{at::full({1}, value ? 1 : 0, at::kLong)};
  group->broadcast(flag, 0);
  return flag[0].item<std::int64_t>() != 0;
}

// The reference run of one seed at the reference batch and rate.
TrialConfig reference_trial(const CbsConfig& c, std::uint64_t seed) {
  TrialConfig t = c.sweep.base;
  t.loader = c.sweep.runner.loader;
  t.name = "reference_s" + std::to_string(seed);
  t.batch_size = c.cbs.reference_batch;
  t.seed = seed;
  t.schedule.base_lr = c.cbs.reference_lr;
  const std::int64_t steps = std::max<std::int64_t>(1, c.cbs.checkpoints.back() / c.cbs.reference_batch);
  t.budget = {static_cast<double>(steps), schedules::Unit::kSteps};
  t.checkpoint_every = 0;
  t.tensorboard = false;
  return t;
}

// A branch: the reference's state at a checkpoint, then `window` examples
// at `batch` and the scaled rate times the factor, evaluated at the end.
TrialConfig branch_trial(const CbsConfig& c, std::int64_t examples, std::int64_t batch, std::size_t factor,
                         std::uint64_t seed) {
  TrialConfig t = reference_trial(c, seed);
  t.name = CbsFolder{}.branch(examples, batch, factor, seed).filename().string();
  t.batch_size = batch;
  t.schedule.base_lr = c.cbs.reference_lr * c.cbs.lr_factors[factor];
  const std::int64_t steps = c.cbs.window / batch;
  t.budget = {static_cast<double>(steps), schedules::Unit::kSteps};
  t.target = {Metric::kValLoss, -1.0, steps};  // never reached: the window runs whole
  return t;
}

// The checkpoint bytes of reference `seed` at examples `e`, once they exist
// (the .json beside them is written after them).
bool point_saved(const CbsFolder& l, std::uint64_t seed, std::int64_t e) {
  return fs::exists(l.point(seed, e, ".json")) && fs::exists(l.point(seed, e, ".pt"));
}

// Trains reference `seed` through every checkpoint, from its last saved one.
void run_reference(const CbsConfig& c, const WorkloadData& data, const CbsFolder& l, std::uint64_t seed,
                   distributed::ProcessGroup* group) {
  const bool writer = group == nullptr || group->rank() == 0;
  const auto& points = c.cbs.checkpoints;
  std::size_t have = 0;  // points[0, have) are saved
  while (have < points.size() && agreed(group, writer && point_saved(l, seed, points[have]))) ++have;
  if (have == points.size()) return;
  const TrialConfig t = reference_trial(c, seed);
  Trainer trainer(t, data, group);
  if (have > 0) {
    std::string bytes = writer ? read_file(l.point(seed, points[have - 1], ".pt").string()) : std::string();
    if (group != nullptr) bytes = distributed::broadcast_bytes(*group, bytes);
    trainer.restore(bytes);
    if (writer) std::cerr << t.name << ": resuming from its checkpoint at " << points[have - 1] << " examples\n";
  }
  std::optional<tensorboard::EventWriter> events;  // one event per checkpoint, by the reference's step
  if (writer) {
    fs::create_directories(l.reference(seed) / "checkpoints");
    write_file_atomic((l.reference(seed) / "config.json").string(), to_json(t).dump(2) + "\n");
    if (c.sweep.base.tensorboard) {
      events.emplace(l.reference(seed).string(), have > 0 ? points[have - 1] / c.cbs.reference_batch : -1);
    } else {
      fs::remove(l.reference(seed) / tensorboard::kEventFileName);
    }
  }
  const auto start = std::chrono::steady_clock::now();
  double loss_sum = 0;
  std::int64_t losses = 0;
  for (std::size_t k = have; k < points.size(); ++k) {
    const std::int64_t step = points[k] / c.cbs.reference_batch;
    while (trainer.step() < step) {
      loss_sum += trainer.train_step().front();
      ++losses;
    }
    const ValidationMetrics v = trainer.evaluate().front();
    const double val_loss = v.loss, val_error = v.error;
    const std::string bytes = trainer.checkpoint();
    if (!writer) continue;
    const double train_loss = losses > 0 ? loss_sum / static_cast<double>(losses) : kNaN;
    const double b_simple = trainer.b_simple();
    write_file_atomic(l.point(seed, points[k], ".pt").string(), bytes);
    const json j = {{"step", step},
                    {"examples", points[k]},
                    {"train_loss", finite_or_null(train_loss)},
                    {"val_loss", finite_or_null(val_loss)},
                    {"val_error", finite_or_null(val_error)},
                    {"b_simple", finite_or_null(b_simple)}};
    write_file_atomic(l.point(seed, points[k], ".json").string(), j.dump(2) + "\n");
    if (events) {
      std::vector<tensorboard::Event::Scalar> scalars{{"val/loss", static_cast<float>(val_loss)},
                                                      {"examples", static_cast<float>(points[k])}};
      for (const auto& [tag, value] : {std::pair<const char*, double>{"train/loss", train_loss},
                                       {"val/error", val_error}, {"gns/b_simple", b_simple}}) {
        if (std::isfinite(value)) scalars.push_back({tag, static_cast<float>(value)});
      }
      events->scalars(step, scalars);
    }
    std::cerr << t.name << ": checkpoint " << k + 1 << "/" << points.size() << " at " << points[k]
              << " examples (step " << step << ", val_loss " << val_loss << ", "
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() << " s)\n";
    loss_sum = 0;
    losses = 0;
  }
}

// Whether `dir` holds the result.json of branch `t` (of this config).
bool branch_finished(const TrialConfig& t, const fs::path& dir) {
  try {
    if (!fs::exists(dir / "result.json")) return false;
    const json j = read_json((dir / "result.json").string());
    return j.is_object() && j.contains("config") && identity(j["config"]) == identity(to_json(t));
  } catch (const std::exception&) {
    std::cerr << "warning: " << (dir / "result.json").string() << ": not readable; redoing " << t.name << "\n";
    return false;
  }
}

struct Branch {
  std::int64_t examples, batch;
  std::size_t factor;
  std::uint64_t seed;
};

void run_branch(const CbsConfig& c, const WorkloadData& data, const CbsFolder& l, const Branch& b,
                distributed::ProcessGroup* group, ProgressBoard& board) {
  const bool writer = group == nullptr || group->rank() == 0;
  const TrialConfig t = branch_trial(c, b.examples, b.batch, b.factor, b.seed);
  std::string bytes = writer ? read_file(l.point(b.seed, b.examples, ".pt").string()) : std::string();
  if (group != nullptr) bytes = distributed::broadcast_bytes(*group, bytes);
  Trainer trainer(t, data, group);
  trainer.branch_from(bytes);
  Trainer::Hooks hooks;
  if (writer) hooks.progress = [&](const TrialProgress& p) { board.update(t.name, p); };
  const TrialResult r = trainer.run(hooks).front();
  if (!writer) return;
  const double loss = r.rows.empty() ? kNaN : r.rows.back().val_loss;
  const fs::path dir = l.branch(b.examples, b.batch, b.factor, b.seed);
  fs::create_directories(dir);
  const json j = {{"config", to_json(t)},
                  {"from_examples", b.examples},
                  {"batch_size", b.batch},
                  {"lr", r.peak_lr},
                  {"status", to_string(r.status)},
                  {"steps", r.steps},
                  {"val_loss", finite_or_null(loss)},
                  {"val_error", finite_or_null(r.rows.empty() ? kNaN : r.rows.back().val_error)},
                  {"wall_time", r.wall_time}};
  write_file_atomic((dir / "result.json").string(), j.dump(2) + "\n");
  board.finished(t.name, r, Metric::kValLoss);
}

// --compare: the fixed reference batch, a fixed large batch (the warmup's
// last, or the largest branch batch when the warmup never doubles) and the
// warmup, each to the target.
std::vector<CompareRun> compare_runs(const CbsConfig& c, const BatchWarmup& w) {
  const std::int64_t large =
      w.final_batch > c.cbs.reference_batch ? w.final_batch : c.cbs.branch_batches.back();
  std::vector<CompareRun> out;
  for (const auto seed : c.sweep.seeds) {
    const auto make = [&](const char* kind, std::int64_t batch, bool warm) {
      TrialConfig t = c.sweep.base;
      t.loader = c.sweep.runner.loader;
      t.batch_size = batch;
      t.seed = seed;
      t.schedule.base_lr = c.cbs.reference_lr;
      if (warm) t.schedule.batch_warmup = w.stages;
      std::ostringstream name;
      name << kind << "_b" << batch << "_s" << seed;
      t.name = name.str();
      out.push_back({kind, t});
    };
    make("small", c.cbs.reference_batch, false);
    make("large", large, false);
    make("warmup", w.final_batch, true);
  }
  return out;
}

void run_compare(const CbsConfig& c, const BatchWarmup& w, const WorkloadData& data, const fs::path& dir, int jobs,
                 distributed::ProcessGroup* group) {
  const bool writer = group == nullptr || group->rank() == 0;
  const auto runs = compare_runs(c, w);
  std::vector<TrialResult> results(runs.size());
  std::vector<std::size_t> left;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const fs::path folder = dir / "compare" / runs[i].trial.name;
    std::optional<json> done;
    if (writer) done = finished_summary(runs[i].trial, folder.string());
    if (agreed(group, done.has_value())) {
      if (writer) results[i] = result_from_summary(*done);
    } else {
      left.push_back(i);
    }
  }
  ProgressBoard board(static_cast<std::int64_t>(left.size()));
  for_each_job(left.size(), jobs, static_cast<int>(c.sweep.runner.threads_per_trial), group, [&](std::size_t k) {
    const CompareRun& run = runs[left[k]];
    FolderHooks hooks;
    hooks.progress = [&](const TrialProgress& p) { board.update(run.trial.name, p); };
    results[left[k]] = run_one(run.trial, data, (dir / "compare" / run.trial.name).string(), hooks, group);
    if (writer) board.finished(run.trial.name, results[left[k]], run.trial.target.metric);
  });
  if (writer) write_file_atomic((dir / "compare.csv").string(), compare_csv(runs, results));
}

}  // namespace

CbsSummary run_cbs(const CbsConfig& c, const CbsOptions& options, distributed::ProcessGroup* group) {
  const auto start = std::chrono::steady_clock::now();
  check_jobs(options.jobs, group != nullptr, "cbs runs one branch");
  const bool writer = group == nullptr || group->rank() == 0;
  if (group != nullptr) check_world(c.sweep, group->size());
  const CbsFolder l{fs::path(options.out) / c.sweep.base.sweep};
  const json resolved = to_json(c);
  if (writer && fs::exists(l.dir / "cbs.json")) {
    if (const auto where = identity_difference(read_json((l.dir / "cbs.json").string()), resolved)) {
      throw ConfigError(l.dir.string() + " holds a different cbs config \"" + c.sweep.base.sweep +
                        "\" (first difference at " + *where + "); use another --out or name");
    }
  }
  if (writer) check_folder(l.dir.string(), "--out");
  const json written = with_machine(resolved, writer);  // measured before any run (machine.h)
  const WorkloadData data = load_data(c.sweep);
  if (writer) write_file_atomic((l.dir / "cbs.json").string(), written.dump(2) + "\n");

  // The references, one per seed (in parallel with --jobs), then the branches.
  const int threads = static_cast<int>(c.sweep.runner.threads_per_trial);
  for_each_job(c.sweep.seeds.size(), options.jobs, threads, group,
               [&](std::size_t i) { run_reference(c, data, l, c.sweep.seeds[i], group); });
  std::vector<Branch> all, left;
  for (const auto e : c.cbs.checkpoints) {
    for (const auto b : c.cbs.branch_batches) {
      for (std::size_t f = 0; f < c.cbs.lr_factors.size(); ++f) {
        for (const auto seed : c.sweep.seeds) all.push_back({e, b, f, seed});
      }
    }
  }
  for (const Branch& b : all) {
    const bool done = writer && branch_finished(branch_trial(c, b.examples, b.batch, b.factor, b.seed),
                                                l.branch(b.examples, b.batch, b.factor, b.seed));
    if (!agreed(group, done)) left.push_back(b);
  }
  CbsSummary summary;
  summary.dir = l.dir.string();
  summary.branches = static_cast<std::int64_t>(all.size());
  summary.skipped = summary.branches - static_cast<std::int64_t>(left.size());
  if (writer && summary.skipped > 0) {
    std::cerr << "resuming " << l.dir.string() << ": " << summary.skipped << " of " << summary.branches
              << " branches already finished\n";
  }
  ProgressBoard board(static_cast<std::int64_t>(left.size()));
  for_each_job(left.size(), options.jobs, threads, group,
               [&](std::size_t i) { run_branch(c, data, l, left[i], group, board); });

  BatchWarmup warmup;
  if (writer) warmup = write_curve(c, l);
  if (options.compare) {
    if (group != nullptr) {  // the other ranks take rank 0's warmup
      const std::string patch =
          distributed::broadcast_bytes(*group, writer ? schedule_patch(c, warmup).dump() : std::string());
      if (!writer) warmup = warmup_of(json::parse(patch));
    }
    run_compare(c, warmup, data, l.dir, options.jobs, group);
  }
  summary.wall_time = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace bigbatch::experiments
