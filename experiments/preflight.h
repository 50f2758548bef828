// Checks made before any training starts: a sweep config against the world
// size and against its data. Both the sweep and `bigbatch train` run them, so
// a refuted config fails in seconds, before any trial folder is touched.
#pragma once

#include <bigbatch/experiments/config.h>
#include <bigbatch/experiments/data.h>

namespace bigbatch::experiments {

/// Throws ConfigError unless every batch size divides by the world size.
void check_world(const SweepConfig& sweep, int world_size);

/// The sweep's dataset, checked against its batch sizes: each, and the largest
/// that batch-size increase grows it to, must fit the training set and split
/// into gns.micro_batches. A missing dataset or a refuted batch is a ConfigError.
Dataset load_data(const SweepConfig& sweep);

}  // namespace bigbatch::experiments
