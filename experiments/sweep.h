// The sweep runner: every trial of a sweep config into <out>/<name>/, resumable
// (finished trials are skipped; trial_folder.h says what "finished" means),
// then the steps-to-target table and the critical-batch fit (results.h).
#pragma once

#include "config.h"
#include "../distributed/process_group.h"

#include <cstdint>
#include <string>
#include <vector>

namespace bigbatch::experiments {

struct SweepOptions {
  std::string out = "runs";  ///< the sweep goes to <out>/<name>/
  int jobs = 1;              ///< trials in parallel (at most what fits the cores, workers.h)
  /// Rounds of --extend-search: after the trials, each round adds a rate one
  /// grid step beyond the edge for every batch size whose best rate is on
  /// it (results.h search_edge), runs those trials and redoes the tables;
  /// it stops early once no best rate is on an edge. 0: none.
  int extend_search = 0;
};

struct SweepSummary {
  std::string dir;
  std::int64_t trials = 0, skipped = 0, reached = 0;
  std::int64_t pruned = 0;  ///< trials this run stopped (trial_queue.h)
  double wall_time = 0;
};

/// extensions.json, the rates --extend-search added to a sweep folder, in the
/// order added; parse_extensions throws ConfigError naming `path` on text
/// that is not such a list.
std::string extensions_json(const std::vector<ExtraPoint>& extra);
std::vector<ExtraPoint> parse_extensions(const std::string& text, const std::string& path);

/// Runs (or resumes) a sweep. Throws ConfigError for a config the data
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
