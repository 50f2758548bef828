// One trial's folder, <sweep>/<trial>/: config.json first, checkpoint.pt while
// it runs (with checkpoint_every), events.out.tfevents.bigbatch (TensorBoard,
// one event per evaluation, unless tensorboard is false), metrics.csv and
// summary.json at the end.
// summary.json is written last: a trial is finished when it exists beside a
// config.json equal to the trial's config, and a killed trial is redone (from
// its checkpoint when it has one).
#pragma once

#include <bigbatch/experiments/config.h>
#include <bigbatch/experiments/trial.h>
#include <bigbatch/distributed/process_group.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace bigbatch::experiments {

/// The summary.json of `trial`'s finished run in `dir`, if it has one. A
/// pruned trial counts as finished only with accept_pruned (a sweep run with
/// pruning off redoes it in full).
std::optional<nlohmann::json> finished_summary(const TrialConfig& trial, const std::string& dir,
                                               bool accept_pruned = true);
/// Whether `dir` holds the finished run of `trial`.
bool trial_finished(const TrialConfig& trial, const std::string& dir);

/// Runs one trial into `dir`, resuming from its checkpoint when the folder
/// holds one of the same config. Data-parallel with a process group; only
/// rank 0 writes (and reports progress). `prune` is Trainer::run's.
TrialResult run_one(const TrialConfig& trial, const Dataset& data, const std::string& dir,
                    const std::function<void(const TrialProgress&)>& progress = {},
                    distributed::ProcessGroup* group = nullptr,
                    const std::function<bool(std::int64_t)>& prune = {});

/// Runs a batched group of trials (batched.h), each into its own folder of
/// `dirs` exactly as run_one would (no checkpoints: batched trials have
/// none). `prune(lane, next_eval)` as Trainer::run's; `finished` sees each
/// lane's result as soon as its files are written.
void run_group(const std::vector<TrialConfig>& trials, const Dataset& data, const std::vector<std::string>& dirs,
               const std::function<void(const TrialProgress&)>& progress,
               const std::function<bool(std::size_t, std::int64_t)>& prune,
               const std::function<void(std::size_t, const TrialResult&)>& finished);

}  // namespace bigbatch::experiments
