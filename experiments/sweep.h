// The sweep runner: every trial of a sweep config into <out>/<name>/, resumable
// (finished trials are skipped, every file is written to a temporary name and
// renamed), with the steps-to-target table and the critical-batch fit.
#pragma once

#include <bigbatch/experiments/config.h>
#include <bigbatch/experiments/trial.h>

#include <cstdint>
#include <string>

namespace bigbatch::experiments {

struct SweepOptions {
  std::string out = "runs";  ///< the sweep goes to <out>/<name>/
  int jobs = 1;              ///< trials in parallel; intra-op threads = cores / jobs
};

struct SweepSummary {
  std::string dir;
  std::int64_t trials = 0, skipped = 0, reached = 0;
  double wall_time = 0;
};

/// Throws ConfigError unless every batch size divides by the world size.
void check_world(const SweepConfig& sweep, int world_size);

/// The sweep's dataset, checked against its batch sizes: each, and the largest
/// that batch-size increase grows it to, must fit the training set and split
/// into gns.micro_batches. A missing dataset or a refuted batch is a ConfigError.
Dataset load_data(const SweepConfig& sweep);

/// Runs (or resumes) a sweep. Throws ConfigError for a config the data
/// refutes (a batch larger than the training set, a missing dataset) or a
/// folder that holds a different sweep; std::runtime_error on failures.
/// With a process group (world > 1) every rank runs the same sweep, one trial
/// at a time, each trial data-parallel; rank 0 alone decides which trials are
/// left, writes every file and prints.
SweepSummary run_sweep(const SweepConfig& sweep, const SweepOptions& options,
                       distributed::ProcessGroup* group = nullptr);

/// Runs one trial into `dir` (config.json, metrics.csv, summary.json last).
/// Data-parallel with a process group; only rank 0 writes.
TrialResult run_one(const TrialConfig& trial, const Dataset& data, const std::string& dir,
                    const std::function<void(const TrialProgress&)>& progress = {},
                    distributed::ProcessGroup* group = nullptr);

/// The steps-to-target table of a sweep folder, formatted for a terminal.
std::string report(const std::string& sweep_dir);

/// Writes `text` to `path` through a temporary file and a rename, so that a
/// reader (or a killed writer) never sees half a file.
void write_file_atomic(const std::string& path, const std::string& text);

/// The code version (git describe at configure time) and the LibTorch version.
std::string code_version();
std::string libtorch_version();

}  // namespace bigbatch::experiments
