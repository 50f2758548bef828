// Checks made before any training starts: a sweep config against the world
// size and against its data. Both the sweep and `bigbatch train` run them, so
// a refuted config fails in seconds, before any trial folder is touched.
#pragma once

#include "../runconfig/config.h"
#include "../workload/data.h"

#include <string>

namespace bigbatch::experiments {

/// Throws ConfigError unless every batch size divides by the world size, and
/// when the config compresses the gradient exchange of, or shards the
/// optimizer across, a world of one.
void check_world(const SweepConfig& sweep, int world_size);

/// Throws ConfigError unless --jobs is >= 1, and 1 when data-parallel (every
/// rank takes part in each run): `runs_one` says what then runs one at a
/// time, e.g. "sweep runs one trial".
void check_jobs(int jobs, bool data_parallel, const std::string& runs_one);

/// Throws ConfigError unless `dir` exists or can be made, and a file can be
/// written there (the file is removed again).
void check_folder(const std::string& dir, const std::string& what);

/// Throws ConfigError unless each batch size, and the largest that
/// batch-size increase grows it to, fits a training set of `train_size`
/// examples and splits into gns.micro_batches (load_data checks it).
void check_batches(const SweepConfig& sweep, std::int64_t train_size);

/// The sweep's dataset, loaded through its registration (workload.h) and
/// checked before any training: both splits have examples; each batch size,
/// and the largest that batch-size increase grows it to, fits the training
/// set and splits into gns.micro_batches; val_error has a classification
/// task; and one model, built as a trial builds it, gives outputs that fit
/// the targets. Each failure (a missing dataset, an unknown name, a bad
/// TorchScript file, ...) is a ConfigError naming the thing and the value.
WorkloadData load_data(const SweepConfig& sweep);

}  // namespace bigbatch::experiments
