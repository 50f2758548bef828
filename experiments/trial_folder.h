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

#include <functional>
#include <string>

namespace bigbatch::experiments {

/// Whether `dir` holds the finished run of `trial`.
bool trial_finished(const TrialConfig& trial, const std::string& dir);

/// Runs one trial into `dir`, resuming from its checkpoint when the folder
/// holds one of the same config. Data-parallel with a process group; only
/// rank 0 writes (and reports progress).
TrialResult run_one(const TrialConfig& trial, const Dataset& data, const std::string& dir,
                    const std::function<void(const TrialProgress&)>& progress = {},
                    distributed::ProcessGroup* group = nullptr);

}  // namespace bigbatch::experiments
