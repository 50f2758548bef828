// The sweep runner: every trial of a sweep config into <out>/<name>/, resumable
// (finished trials are skipped; trial_folder.h says what "finished" means),
// then the steps-to-target table and the critical-batch fit (results.h).
#pragma once

#include "../runconfig/config.h"
#include "../../distributed/process_group.h"

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace bigbatch::experiments {

class TrialExecutor;

struct SweepOptions {
  std::string out = "runs";  ///< the sweep goes to <out>/<name>/
  int jobs = 1;              ///< trials in parallel (at most what fits the cores, workers.h)
  /// Rounds of --extend-search: after the trials, each round adds a rate one
  /// grid step beyond the edge for every batch size whose best rate is on
  /// it (results.h search_edge), runs those trials and redoes the tables;
  /// it stops early once no best rate is on an edge. 0: none.
  int extend_search = 0;
  /// Seconds a claim on a trial lives without its worker's heartbeat (every
  /// lease/8) before another worker takes the trial over from its last
  /// checkpoint (claims.h, docs/cluster.md). Longer than any stall of a
  /// live worker (a swap storm, an NFS server failover).
  double lease = 120;
  /// When set and nonzero (a signal handler stores its signal number): the
  /// running trials stop at their next step, write a checkpoint, give their
  /// claims back, and run_sweep returns with `interrupted` set. Batched
  /// groups have no checkpoints: they are given back to start over.
  const std::atomic<int>* stop = nullptr;
  /// When set, the trials are trained by this executor (executor.h: the
  /// Python package's, over the user's module and data), one at a time, and
  /// everything else of the sweep is as without it. The config's "dataset"
  /// and "model" may then be "python" (workload/python.h).
  TrialExecutor* executor = nullptr;
};

struct SweepSummary {
  std::string dir;
  std::int64_t trials = 0, skipped = 0, reached = 0;
  std::int64_t pruned = 0;  ///< trials this run stopped (trial_queue.h)
  double wall_time = 0;
  int interrupted = 0;          ///< *options.stop when it ended the run early, else 0
  std::int64_t released = 0;    ///< trials this run gave back when stopped
  int jobs = 0;                 ///< trials it ran at a time (the cores it could have: cores.h)
};

/// extensions.json, the rates --extend-search added to a sweep folder, in the
/// order added; parse_extensions throws ConfigError naming `path` on text
/// that is not such a list.
std::string extensions_json(const std::vector<ExtraPoint>& extra);
std::vector<ExtraPoint> parse_extensions(const std::string& text, const std::string& path);

/// Runs (or resumes) a sweep. Any number of processes may run the same sweep
/// into the same folder at once, on one machine or on many sharing it over
/// NFS or Lustre: each takes trials by claims (claims.h), runs each trial it
/// holds, sees the others' results (pruning, the tables, --extend-search),
/// waits for the trials they hold once none is left to take, and takes over
/// a trial whose worker fell silent for options.lease. Processes on one
/// machine share its cores (cores.h): one that finds no core free for a
/// trial throws ConfigError. Throws ConfigError for a config the data
/// refutes (a batch larger than the training set, a missing dataset) or a
/// folder that holds a different sweep; std::runtime_error on failures.
/// With a process group (world > 1) every rank runs the same sweep, one trial
/// at a time, each trial data-parallel; rank 0 alone decides which trials are
/// left and their order, writes every file and prints. With
/// sweep.runner.prune, a trial that can no longer change the steps-to-target
/// table stops as "pruned" (trial_queue.h); the table is the same either way.
SweepSummary run_sweep(const SweepConfig& sweep, const SweepOptions& options,
                       distributed::ProcessGroup* group = nullptr);

}  // namespace bigbatch::experiments
