// Checks made before any training starts: a sweep config against the world
// size and against its data. Both the sweep and `bigbatch train` run them, so
// a refuted config fails in seconds, before any trial folder is touched.
#pragma once

#include "config.h"
#include "data.h"

#include <string>

namespace bigbatch::experiments {

/// Throws ConfigError unless every batch size divides by the world size.
void check_world(const SweepConfig& sweep, int world_size);

/// Throws ConfigError unless --jobs is >= 1, and 1 when data-parallel (every
/// rank takes part in each run): `runs_one` says what then runs one at a
/// time, e.g. "sweep runs one trial".
void check_jobs(int jobs, bool data_parallel, const std::string& runs_one);

/// Throws ConfigError unless `dir` exists or can be made, and a file can be
/// written there (the file is removed again).
void check_folder(const std::string& dir, const std::string& what);

/// The sweep's dataset, checked against its batch sizes first (without
/// loading: the size of the training set is known from the config): each,
/// and the largest that batch-size increase grows it to, must fit the
/// training set and split into gns.micro_batches. A missing dataset or a
/// refuted batch is a ConfigError.
Dataset load_data(const SweepConfig& sweep);

}  // namespace bigbatch::experiments
