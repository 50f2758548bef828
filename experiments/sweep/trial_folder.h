// One trial's folder, <sweep>/<trial>/: config.json first, checkpoint.pt while
// it runs (with checkpoint_every), events.out.tfevents.bigbatch (TensorBoard,
// one event per evaluation, unless tensorboard is false), metrics.csv and
// summary.json at the end.
// summary.json is written last: a trial is finished when it exists beside a
// config.json equal to the trial's config, and a killed trial is redone (from
// its checkpoint when it has one: a periodic one, or the one a preempted
// sweep wrote when it was stopped).
#pragma once

#include "../runconfig/config.h"
#include "../io/tensorboard.h"
#include "../train/trial.h"
#include "../../distributed/process_group.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
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

/// What a trial's run in its folder reports and asks, lane by lane (lane 0
/// for run_one); each may be empty: Trainer::Hooks' progress, prune and
/// finished, the last called once a trial's files are written.
struct FolderHooks {
  std::function<void(const TrialProgress&)> progress;
  std::function<bool(std::size_t lane, std::int64_t next_eval)> prune;
  std::function<void(std::size_t lane, const TrialResult&)> finished;
  /// Trainer::Hooks::interrupt; also asked before each checkpoint is
  /// written (none once it says kAbandon).
  std::function<Interrupt()> interrupt;
  /// Asked once a lane has ended, before its metrics.csv and summary.json
  /// are written: false refuses the result (nothing is written, finished is
  /// not called). A sweep's claim commit (claims.h).
  std::function<bool(std::size_t lane)> commit;
  /// Trainer::Hooks' before_step and past_target.
  std::function<void(std::int64_t step)> before_step;
  bool past_target = false;
};

/// Runs one trial into `dir`, resuming from its checkpoint when the folder
/// holds one of the same config. Data-parallel with a process group; only
/// rank 0 writes (and reports progress).
///
/// A trial with horizons (config.h horizon_trial) trains to its budget
/// whatever the target, unpruned, and branches each horizon's run at the
/// first step where their schedules part (branch_point) into
/// `dir`/horizon_<k>/, written as a trial of its own: restored from this
/// run's state there, it trains on to its budget. A horizon folder already
/// finished is kept; one with a checkpoint of its own resumes from it. Not
/// under a process group.
TrialResult run_one(const TrialConfig& trial, const WorkloadData& data, const std::string& dir,
                    const FolderHooks& hooks = {}, distributed::ProcessGroup* group = nullptr);

/// The first step at which `branch`'s schedule (a horizon_trial of `trial`)
/// gives another rate or batch size than `trial`'s: the two runs are the
/// same run before it. At most the branch's last step.
std::int64_t branch_point(const TrialConfig& trial, const TrialConfig& branch, std::int64_t train_size);

/// The folder of a trial's horizon k (from 0) under the trial's `folder`:
/// horizon_<k + 1>/.
std::filesystem::path horizon_folder(const std::filesystem::path& folder, std::size_t k);

/// A trial's horizons as a run branches them (run_one, run_external): each
/// horizon's trial, its branch point, and whether its folder under the
/// trial's `folder` holds its finished run.
struct HorizonBranches {
  std::vector<TrialConfig> trials;
  std::vector<std::int64_t> points;
  std::vector<bool> done;
};
HorizonBranches horizon_branches(const TrialConfig& trial, const std::filesystem::path& folder,
                                 std::int64_t train_size);

/// The hooks a horizon's branch runs with, under its trial's `outer` ones:
/// their progress and interrupt, training past the target; no pruning, and
/// no claim or finished report of its own (its trial's cover it).
FolderHooks branch_hooks(const FolderHooks& outer);

/// branched.json in a horizon's `folder`: the step the branch parted from its
/// trial at (0: trained from the start), what the horizons table counts as
/// its cost.
void write_branched(const std::filesystem::path& folder, std::int64_t step);

/// A trial's folder, ready for its run: made, its config.json written.
/// Returns the checkpoint an interrupted run of the same config left there
/// (periodic, or written when it was preempted), if `resumable`; any other is
/// removed. A summary.json of the same config stays until the run replaces
/// it: one the sweep does not take as final (a failure) still describes the
/// trial to the tables other workers may write meanwhile, and a worker that
/// stalled here past its claim's lease must not remove the result of the
/// worker that took the trial over. Another config's summary goes.
std::string prepare_folder(const TrialConfig& t, const std::filesystem::path& folder, bool resumable);
/// A finished trial's record: metrics.csv (the workload's further metrics
/// named by `metric_names`), then summary.json, which marks it finished; its
/// checkpoint goes.
void write_result(const TrialConfig& t, const std::filesystem::path& folder, const TrialResult& r,
                  const std::vector<std::string>& metric_names);
/// An evaluation as TensorBoard scalars: what metrics.csv holds (NaN cells
/// left out) and the optimizer's per-layer scalars (Trainer::layer_scalars).
std::vector<tensorboard::Event::Scalar> eval_scalars(const EvalRow& row, const std::vector<std::string>& extra,
                                                     const std::vector<std::pair<std::string, double>>& layers);

/// Marks a trial failed (TrialStatus::kFailed): its summary.json with the
/// workload's message under "error", what the tables count and a resumed
/// sweep runs again. The result it recorded.
TrialResult record_failure(const TrialConfig& trial, const std::string& dir, const std::string& error);

/// Runs a batched group of trials (batched.h), each into its own folder of
/// `dirs` exactly as run_one would (no checkpoints: batched trials have
/// none); their results in order.
std::vector<TrialResult> run_group(const std::vector<TrialConfig>& trials, const WorkloadData& data,
                                   const std::vector<std::string>& dirs, const FolderHooks& hooks = {});

}  // namespace bigbatch::experiments
