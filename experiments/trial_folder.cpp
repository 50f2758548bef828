// Trial folders (trial_folder.h).
#include <bigbatch/experiments/trial_folder.h>

#include <bigbatch/experiments/batched.h>
#include <bigbatch/experiments/files.h>
#include <bigbatch/experiments/results.h>
#include <bigbatch/experiments/tensorboard.h>

#include <c10/util/Exception.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <optional>

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

// An evaluation as TensorBoard scalars: what metrics.csv holds (NaN cells
// left out) and the optimizer's trust ratios.
std::vector<tensorboard::Event::Scalar> eval_scalars(const EvalRow& row,
                                                     const std::vector<std::pair<std::string, double>>& ratios) {
  std::vector<tensorboard::Event::Scalar> out;
  const auto add = [&](const char* tag, double value) {
    if (!std::isnan(value)) out.push_back({tag, static_cast<float>(value)});
  };
  add("train/loss", row.train_loss);
  add("val/loss", row.val_loss);
  add("val/error", row.val_error);
  add("lr", row.lr);
  add("batch_size", static_cast<double>(row.batch_size));
  add("examples", static_cast<double>(row.examples));
  add("epoch", row.epoch);
  add("gns/b_simple", row.gns);
  for (const auto& [name, ratio] : ratios) {
    out.push_back({"trust_ratio/" + name, static_cast<float>(ratio)});
  }
  return out;
}

// The trial's event file: kept up to step keep_through (-1: a new one), or,
// with TensorBoard off, none, and an earlier run's removed (this run would
// contradict it).
std::optional<tensorboard::EventWriter> open_events(const TrialConfig& t, const fs::path& folder,
                                                    std::int64_t keep_through) {
  if (t.tensorboard) return tensorboard::EventWriter(folder.string(), keep_through);
  fs::remove(folder / tensorboard::kEventFileName);
  return std::nullopt;
}

// A finished trial's record; summary.json last, since it marks the trial finished.
void write_results(const TrialConfig& t, const fs::path& folder, const TrialResult& r) {
  write_file_atomic((folder / "metrics.csv").string(), metrics_csv(r.rows));
  write_file_atomic((folder / "summary.json").string(), summary_json(t, r).dump(2) + "\n");
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
    std::cerr << "warning: " << (dir / "summary.json").string() << ": not readable JSON; redoing " << t.name << "\n";
    return std::nullopt;
  }
  if (!summary.is_object() || !summary.contains("status")) {
    std::cerr << "warning: " << (dir / "summary.json").string() << ": no status; redoing " << t.name << "\n";
    return std::nullopt;
  }
  if (!accept_pruned && summary["status"] == to_string(TrialStatus::kPruned)) return std::nullopt;
  return summary;
}

bool trial_finished(const TrialConfig& t, const std::string& folder) { return finished_summary(t, folder).has_value(); }

TrialResult run_one(const TrialConfig& trial, const Dataset& data, const std::string& dir,
                    const std::function<void(const TrialProgress&)>& progress,
                    distributed::ProcessGroup* group, const std::function<bool(std::int64_t)>& prune) {
  const bool writer = group == nullptr || group->rank() == 0;
  const fs::path folder(dir);
  const fs::path checkpoint = folder / "checkpoint.pt";
  std::string saved;  // the trial's last checkpoint, from an interrupted run of the same config
  if (writer) {
    fs::create_directories(folder);
    fs::remove(folder / "summary.json");  // unfinished until the end
    if (trial.checkpoint_every > 0 && same_config(trial, folder) && fs::exists(checkpoint)) {
      saved = read_file(checkpoint.string());
    } else {
      fs::remove(checkpoint);  // another config's, or checkpoints are off
    }
    write_file_atomic((folder / "config.json").string(), to_json(trial).dump(2) + "\n");
  }
  if (group != nullptr) saved = distributed::broadcast_bytes(*group, saved);  // rank 0's, to every rank
  std::optional<Trainer> trainer;
  trainer.emplace(trial, data, group);
  bool resumed = false;
  if (!saved.empty()) {
    try {
      trainer->restore(saved);
      resumed = true;
      if (writer) std::cerr << "resuming " << trial.name << " from its checkpoint at step " << trainer->step() << "\n";
    } catch (const std::exception& e) {
      // Unreadable (truncated, or another version's): the trial starts over.
      // Every rank read the same bytes, so every rank gets here.
      if (writer) {
        const auto* torch_error = dynamic_cast<const c10::Error*>(&e);
        std::cerr << "warning: " << checkpoint.string() << ": "
                  << (torch_error ? torch_error->what_without_backtrace() : e.what()) << "; starting " << trial.name
                  << " over\n";
      }
      trainer.emplace(trial, data, group);
    }
  }
  std::function<void(const std::string&)> on_checkpoint;
  if (writer && trial.checkpoint_every > 0) {
    on_checkpoint = [&](const std::string& bytes) { write_file_atomic(checkpoint.string(), bytes); };
  }
  // The event file keeps what an interrupted run wrote up to its checkpoint.
  std::optional<tensorboard::EventWriter> events;
  std::function<void(const EvalRow&)> on_eval;
  if (writer) events = open_events(trial, folder, resumed ? trainer->step() : -1);
  if (events) {
    on_eval = [&](const EvalRow& row) { events->scalars(row.step, eval_scalars(row, trainer->trust_ratios())); };
  }
  const TrialResult r =
      trainer->run(writer ? progress : std::function<void(const TrialProgress&)>(), on_checkpoint, on_eval, prune);
  if (writer) {
    write_results(trial, folder, r);
    fs::remove(checkpoint);  // finished: the summary and metrics are the record
  }
  return r;
}

void run_group(const std::vector<TrialConfig>& trials, const Dataset& data, const std::vector<std::string>& dirs,
               const std::function<void(const TrialProgress&)>& progress,
               const std::function<bool(std::size_t, std::int64_t)>& prune,
               const std::function<void(std::size_t, const TrialResult&)>& finished) {
  std::vector<std::optional<tensorboard::EventWriter>> events(trials.size());
  for (std::size_t i = 0; i < trials.size(); ++i) {
    const fs::path folder(dirs[i]);
    fs::create_directories(folder);
    fs::remove(folder / "summary.json");  // unfinished until the end
    fs::remove(folder / "checkpoint.pt");
    write_file_atomic((folder / "config.json").string(), to_json(trials[i]).dump(2) + "\n");
    events[i] = open_events(trials[i], folder, -1);
  }
  GroupTrainer group(trials, data);
  GroupTrainer::Hooks hooks;
  hooks.progress = progress;
  hooks.prune = prune;
  hooks.on_eval = [&](std::size_t i, const EvalRow& row) {
    if (!events[i]) return;
    events[i]->scalars(row.step, eval_scalars(row, trust_ratios(group.lane_optimizer(i), group.lane_module(i))));
  };
  hooks.finished = [&](std::size_t i, const TrialResult& r) {
    write_results(trials[i], dirs[i], r);
    events[i].reset();
    if (finished) finished(i, r);
  };
  group.run(hooks);
}

}  // namespace bigbatch::experiments
