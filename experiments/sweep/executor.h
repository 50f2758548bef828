// A trial executor in another process: the sweep's trials trained by the
// Python package (bigbatch.sweep with the user's nn.Module and DataLoader,
// python/bigbatch/executor.py) while this process keeps everything else of
// the sweep, as for its own trials: the claims, the order, pruning, the stop
// rules, every trial file and the tables. So a folder, a resumed sweep, other
// workers on it, `bigbatch cbs` and the plots cannot tell who trained a trial
// but by summary.json's data.executor.
//
// The protocol, one JSON object per line over two pipes
// (docs/python.md "The executor's protocol"):
//   -> {"run": {"trial", "dir", "config", "budget", "eval_every", "lr": [one
//      per step], "batch_size": [[first step, size], ...], "threads"}}
//      and, for a horizon of a trial the executor is training, "from": STEP:
//      that trial's state at STEP copied (weights, optimizer, average, the
//      batches to come), the horizon trained from there (its own "go"s and
//      "stop"), then that trial goes on
//   -> {"go": STEP}: train up to step STEP, then evaluate;
//      {"go": STEP, "evaluate": false}: train up to STEP (a branch point);
//      {"stop": STATUS}: the trial is over ("reached", "not_reached",
//      "diverged", "pruned"; "interrupted": given back, to redo; "failed":
//      this program failed to record it)
// Each message of the executor names its trial ("trial": NAME); one of
// another trial (late, after the program ended it) is dropped.
//   <- {"progress": {"step", "loss", "steps_per_second"}}
//   <- {"stepped": {"step"}}: answers a "go" without evaluation
//   <- {"eval": {"step", "train_loss", "val_loss", "val_error", "metrics":
//      {name: value}, "wall_time", "data": {...}, "executor": {...}}}
//      answered by "go" or "stop"
//   <- {"diverged": {"step", "wall_time", ...}}: a non-finite training loss
//   <- {"error": LINE}: the user's code threw; the trial fails with LINE
//      (sent in answer to "go": the program may end a trial before its first)
#pragma once

#include "trial_folder.h"
#include "../runconfig/config.h"

#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

namespace bigbatch::experiments {

/// The executor's end of the pipes went away (its process ended or closed
/// them): the sweep stops, the trial given back (not a failure of the trial).
struct ExecutorGone : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class TrialExecutor {
 public:
  /// Reads messages from `read_fd`, writes to `write_fd` (both owned: closed
  /// at destruction).
  TrialExecutor(int read_fd, int write_fd);
  ~TrialExecutor();
  TrialExecutor(const TrialExecutor&) = delete;
  TrialExecutor& operator=(const TrialExecutor&) = delete;

  /// One message, one line. Throws ExecutorGone when the other end is closed.
  void send(const nlohmann::json& message);
  /// The next message. Throws ExecutorGone at the end of the stream, and
  /// std::runtime_error on a line that is not a JSON object.
  nlohmann::json receive();

 private:
  int in_, out_;
  std::string buffer_;
};

/// --executor R,W: two open file descriptors (ConfigError naming --executor
/// otherwise, before any work).
std::unique_ptr<TrialExecutor> open_executor(const std::string& spec);

/// What of `trial` the Python executor does not do (empty: it can run it),
/// as "KEY: why", checked for every trial before any runs.
std::string executor_refusal(const TrialConfig& trial);

/// Runs one trial through `executor` into `dir`, as run_one does with the
/// trainer: the folder prepared, the executor sent the trial and told when to
/// evaluate and when to stop (the target, a non-finite loss, the budget,
/// hooks.prune, hooks.interrupt), and the same files written. Trials of this
/// executor have no checkpoints: one stopped midway starts over. A trial
/// with horizons branches each (run_one's horizon_<k>/ folders and
/// branched.json) from the executor's copy of its state at the branch point.
/// `threads`: the intra-op threads the trial may use (runner.threads_per_trial).
TrialResult run_external(const TrialConfig& trial, std::int64_t train_size, std::int64_t threads,
                         const std::string& dir, const FolderHooks& hooks, TrialExecutor& executor);

}  // namespace bigbatch::experiments
