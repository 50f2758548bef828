// Trial folders (trial_folder.h).
#include "trial_folder.h"

#include "../io/files.h"
#include "results.h"
#include "../io/tensorboard.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <optional>
#include <set>

namespace bigbatch::experiments {
namespace fs = std::filesystem;

namespace {

// Whether the folder's config.json is t's (false when missing or unreadable).
bool same_config(const TrialConfig& t, const fs::path& dir) {
  try {
    return fs::exists(dir / "config.json") &&
           identity(read_json((dir / "config.json").string())) == identity(to_json(t));
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

std::vector<tensorboard::Event::Scalar> eval_scalars(const EvalRow& row, const std::vector<std::string>& extra,
                                                     const std::vector<std::pair<std::string, double>>& layers) {
  std::vector<tensorboard::Event::Scalar> out;
  const auto add = [&](const char* tag, double value) {
    if (!std::isnan(value)) out.push_back({tag, static_cast<float>(value)});
  };
  add("train/loss", row.train_loss);
  add("val/loss", row.val_loss);
  add("val/error", row.val_error);
  add("val_averaged/loss", row.avg_val_loss);
  add("val_averaged/error", row.avg_val_error);
  add("lr", row.lr);
  add("batch_size", static_cast<double>(row.batch_size));
  add("examples", static_cast<double>(row.examples));
  add("epoch", row.epoch);
  add("gns/b_simple", row.gns);
  add("exchange/bytes_sent", row.bytes_sent);
  add("exchange/bytes_received", row.bytes_received);
  add("exchange/compress_seconds", row.compress_seconds);
  add("exchange/comm_seconds", row.comm_seconds);
  add("exchange/syncs", row.syncs);
  add("sync/outer_norm", row.outer_norm);
  add("precision/loss_scale", row.loss_scale);
  add("precision/skipped_steps", row.skipped_steps);
  for (std::size_t i = 0; i < extra.size() && i < row.extra.size(); ++i) {
    if (!std::isnan(row.extra[i])) out.push_back({"val/" + extra[i], static_cast<float>(row.extra[i])});
  }
  for (const auto& [tag, value] : layers) out.push_back({tag, static_cast<float>(value)});
  return out;
}

std::string prepare_folder(const TrialConfig& t, const fs::path& folder, bool resumable) {
  fs::create_directories(folder);
  const bool same = same_config(t, folder);
  if (!same) fs::remove(folder / "summary.json");
  const fs::path checkpoint = folder / "checkpoint.pt";
  std::string saved;
  if (resumable && same && fs::exists(checkpoint)) {
    saved = read_file(checkpoint.string());
  } else {
    fs::remove(checkpoint);  // another config's
  }
  write_file_atomic((folder / "config.json").string(), to_json(t).dump(2) + "\n");
  return saved;
}

void write_result(const TrialConfig& t, const fs::path& folder, const TrialResult& r,
                  const std::vector<std::string>& metric_names) {
  write_file_atomic((folder / "metrics.csv").string(), metrics_csv(r.rows, metric_names));
  write_file_atomic((folder / "summary.json").string(), summary_json(t, r).dump(2) + "\n");
  fs::remove(folder / "checkpoint.pt");  // finished: the summary and metrics are the record
}

namespace {

// Runs the trainer's lanes, trial i into folders[i]: its event file (kept up
// to step `resumed_at` of a resumed trial, else new), its checkpoints, and
// its metrics.csv and summary.json (last: it marks the trial finished) as
// soon as it ends. Only a writer writes.
std::vector<TrialResult> run_into(Trainer& trainer, const std::vector<TrialConfig>& trials,
                                  const std::vector<fs::path>& folders, bool writer, std::int64_t resumed_at,
                                  const FolderHooks& outer) {
  std::vector<std::optional<tensorboard::EventWriter>> events(trials.size());
  Trainer::Hooks hooks;
  if (writer) {
    for (std::size_t i = 0; i < trials.size(); ++i) {
      if (trials[i].tensorboard) {
        events[i].emplace(folders[i].string(), resumed_at);
      } else {
        fs::remove(folders[i] / tensorboard::kEventFileName);  // an earlier run's would contradict this one
      }
    }
    hooks.progress = outer.progress;
    hooks.on_eval = [&](std::size_t i, const EvalRow& row) {
      if (events[i]) events[i]->scalars(row.step, eval_scalars(row, trainer.metric_names(), trainer.layer_scalars(i)));
    };
  }
  // Periodic (checkpoint_every), and on preemption. Every rank takes the
  // checkpoint (a sharded optimizer's is a collective: each rank's shard goes
  // into rank 0's file); the writer writes it.
  if (trials.size() == 1) {
    hooks.on_checkpoint = [&, writer](const std::string& bytes) {
      if (!writer) return;
      if (outer.interrupt && outer.interrupt() == Interrupt::kAbandon) return;  // no longer ours
      write_file_atomic((folders[0] / "checkpoint.pt").string(), bytes);
    };
  }
  hooks.prune = outer.prune;
  hooks.interrupt = outer.interrupt;
  hooks.before_step = outer.before_step;
  hooks.past_target = outer.past_target;
  hooks.finished = [&](std::size_t i, const TrialResult& r) {
    if (outer.commit && !outer.commit(i)) {
      if (writer) {
        std::cerr << "trial " << trials[i].name << ": taken over by another worker while this one stalled; "
                  << "this worker's result is refused\n";
      }
      events[i].reset();
      return;
    }
    if (writer) {
      write_result(trials[i], folders[i], r, trainer.metric_names());
      events[i].reset();
    }
    if (outer.finished) outer.finished(i, r);
  };
  return trainer.run(hooks);
}

}  // namespace

namespace {

// A warning about a trial folder's summary.json, once per file and process:
// a sweep looks at a trial's summary more than once (the queue, its claim).
void warn_once(const fs::path& summary, const std::string& why, const std::string& trial) {
  static std::mutex mutex;
  static std::set<std::string> warned;
  std::lock_guard<std::mutex> lock(mutex);
  if (!warned.insert(summary.string()).second) return;
  std::cerr << "warning: " << summary.string() << ": " << why << "; redoing " << trial << "\n";
}

}  // namespace

std::optional<nlohmann::json> finished_summary(const TrialConfig& t, const std::string& folder, bool accept_pruned) {
  const fs::path dir(folder);
  if (!fs::exists(dir / "summary.json") || !same_config(t, dir)) return std::nullopt;
  nlohmann::json summary;
  try {
    summary = read_json((dir / "summary.json").string());
  } catch (const std::exception&) {
    // Cut short or damaged (a disk that filled up, a hand edit): redo it.
    warn_once(dir / "summary.json", "not readable JSON", t.name);
    return std::nullopt;
  }
  const auto status = summary.is_object() && summary.contains("status") && summary["status"].is_string()
                          ? summary["status"].get<std::string>()
                          : std::string();
  if (std::none_of(std::begin(kTrialStatuses), std::end(kTrialStatuses),
                   [&](const auto& s) { return status == s.name; })) {
    warn_once(dir / "summary.json", "no status", t.name);
    return std::nullopt;
  }
  // What the tables read of it (write_tables), of the types they read.
  const bool reached = status == to_string(TrialStatus::kReached);
  if (!summary.contains("peak_lr") || !summary["peak_lr"].is_number() ||
      (reached && !(summary.contains("steps_to_target") && summary["steps_to_target"].is_number_integer() &&
                    summary.contains("examples_to_target") && summary["examples_to_target"].is_number_integer()))) {
    warn_once(dir / "summary.json", "a field missing or of another type", t.name);
    return std::nullopt;
  }
  if (!accept_pruned && summary["status"] == to_string(TrialStatus::kPruned)) return std::nullopt;
  if (summary["status"] == to_string(TrialStatus::kFailed)) return std::nullopt;  // perhaps fixed since: try again
  return summary;
}

TrialResult record_failure(const TrialConfig& trial, const std::string& dir, const std::string& error) {
  TrialResult r;
  r.status = TrialStatus::kFailed;
  r.error = error;
  r.best_metric = kNaN;
  fs::create_directories(dir);
  write_file_atomic((fs::path(dir) / "config.json").string(), to_json(trial).dump(2) + "\n");
  write_file_atomic((fs::path(dir) / "summary.json").string(), summary_json(trial, r).dump(2) + "\n");
  return r;
}

bool trial_finished(const TrialConfig& t, const std::string& folder) { return finished_summary(t, folder).has_value(); }

std::int64_t branch_point(const TrialConfig& trial, const TrialConfig& branch, std::int64_t train_size) {
  const schedules::Schedule a(trial.schedule, trial.batch_size, train_size);
  const schedules::Schedule b(branch.schedule, branch.batch_size, train_size);
  const std::int64_t end = b.steps(branch.budget.length, branch.budget.unit);
  std::int64_t t = 0;
  while (t + 1 < end && a.lr(t) == b.lr(t) && a.batch_size(t) == b.batch_size(t)) ++t;
  return t;
}

fs::path horizon_folder(const fs::path& folder, std::size_t k) { return folder / ("horizon_" + std::to_string(k + 1)); }

HorizonBranches horizon_branches(const TrialConfig& trial, const fs::path& folder, std::int64_t train_size) {
  HorizonBranches h;
  for (std::size_t k = 0; k < trial.horizons.size(); ++k) {
    h.trials.push_back(horizon_trial(trial, k));
    h.points.push_back(branch_point(trial, h.trials.back(), train_size));
    h.done.push_back(trial_finished(h.trials.back(), horizon_folder(folder, k).string()));
  }
  return h;
}

FolderHooks branch_hooks(const FolderHooks& outer) {
  FolderHooks hooks;
  hooks.progress = outer.progress;
  hooks.interrupt = outer.interrupt;
  hooks.past_target = true;
  return hooks;
}

void write_branched(const fs::path& folder, std::int64_t step) {
  write_file_atomic((folder / "branched.json").string(), nlohmann::json({{"step", step}}).dump() + "\n");
}

namespace {

// Horizon `branch` of a trial into `folder`: resumed from the folder's own
// checkpoint when it has one, else from `from` (the trial's state at the
// branch point; empty: from step 0).
void run_branch(const TrialConfig& branch, const WorkloadData& data, const fs::path& folder, const std::string& from,
                std::int64_t point, const FolderHooks& outer) {
  const std::string saved = prepare_folder(branch, folder, true);
  write_branched(folder, from.empty() ? 0 : point);
  std::optional<Trainer> trainer;
  trainer.emplace(branch, data);
  bool resumed = false;
  if (!saved.empty()) {
    try {
      trainer->restore(saved);
      resumed = true;
      std::cerr << "resuming " << branch.name << " from its checkpoint at step " << trainer->step() << "\n";
    } catch (const std::exception& e) {
      std::cerr << "warning: " << (folder / "checkpoint.pt").string() << ": " << error_line(e) << "; branching "
                << branch.name << " again\n";
      trainer.emplace(branch, data);
    }
  }
  if (!resumed && !from.empty()) trainer->restore(from);
  run_into(*trainer, {branch}, {folder}, true, trainer->step() > 0 ? trainer->step() : -1, branch_hooks(outer));
}

}  // namespace

TrialResult run_one(const TrialConfig& trial, const WorkloadData& data, const std::string& dir, const FolderHooks& hooks,
                    distributed::ProcessGroup* group) {
  TORCH_CHECK(trial.horizons.empty() || group == nullptr, "horizons: ", trial.name,
              " is data-parallel, and branching horizons is done in one process only");
  const bool writer = group == nullptr || group->rank() == 0;
  const fs::path folder(dir);
  std::string saved;  // the trial's last checkpoint, from an interrupted run of the same config
  if (writer) saved = prepare_folder(trial, folder, true);
  if (group != nullptr) saved = distributed::broadcast_bytes(*group, saved);  // rank 0's, to every rank
  std::optional<Trainer> trainer;
  trainer.emplace(trial, data, group);
  std::int64_t resumed_at = -1;
  if (!saved.empty()) {
    try {
      trainer->restore(saved);
      resumed_at = trainer->step();
      if (writer) std::cerr << "resuming " << trial.name << " from its checkpoint at step " << resumed_at << "\n";
    } catch (const std::exception& e) {
      // Unreadable (truncated, or another version's): the trial starts over.
      // Every rank read the same bytes, so every rank gets here.
      if (writer) {
        std::cerr << "warning: " << (folder / "checkpoint.pt").string() << ": " << error_line(e) << "; starting "
                  << trial.name << " over\n";
      }
      trainer.emplace(trial, data, group);
    }
  }
  if (trial.horizons.empty()) return run_into(*trainer, {trial}, {folder}, writer, resumed_at, hooks).front();
  HorizonBranches plan = horizon_branches(trial, folder, data.train_size());
  const std::vector<TrialConfig>& branches = plan.trials;
  const std::vector<std::int64_t>& points = plan.points;
  std::vector<bool>& done = plan.done;
  FolderHooks with = hooks;
  with.prune = nullptr;  // every horizon's final metrics are the measurement
  with.past_target = true;
  Trainer& main = *trainer;
  const auto branch = [&](std::size_t k, const std::string& from) {
    done[k] = true;
    run_branch(branches[k], data, horizon_folder(folder, k), from, points[k], hooks);
  };
  // A branch whose point this run has passed (a checkpoint from a run that
  // lost the branch's folder) trains from step 0: the same run, dearer.
  for (std::size_t k = 0; k < branches.size(); ++k) {
    if (!done[k] && points[k] < main.step()) branch(k, "");
  }
  with.before_step = [&](std::int64_t step) {
    for (std::size_t k = 0; k < branches.size(); ++k) {
      if (!done[k] && points[k] == step) branch(k, main.checkpoint());
    }
  };
  return run_into(main, {trial}, {folder}, writer, resumed_at, with).front();
}

std::vector<TrialResult> run_group(const std::vector<TrialConfig>& trials, const WorkloadData& data,
                                   const std::vector<std::string>& dirs, const FolderHooks& hooks) {
  std::vector<fs::path> folders;
  for (std::size_t i = 0; i < trials.size(); ++i) {
    folders.emplace_back(dirs[i]);
    prepare_folder(trials[i], folders.back(), false);
  }
  Trainer group(trials, data);
  return run_into(group, trials, folders, true, -1, hooks);
}

}  // namespace bigbatch::experiments
