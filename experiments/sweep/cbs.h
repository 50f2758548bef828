// bigbatch cbs: the critical batch size measured directly over training
// (Merrill, Arora, Groeneveld, Hajishirzi 2025, "Critical Batch Size
// Revisited"), and the batch-size warmup it prescribes.
//
// One reference run at a small batch saves its whole state at checkpoints
// (Trainer::checkpoint); from each, a short branch per branch batch size
// trains the same window of examples (the reference's data order, so every
// branch sees the same examples) at the rate the scaling rule gives that
// batch. The critical batch at a checkpoint is the largest branch batch
// whose loss after the window is within the tolerance of every smaller
// branch's (docs/formulas.md "Critical batch size, measured directly").
#pragma once

#include "../runconfig/config.h"
#include "cbs_results.h"
#include "../../distributed/process_group.h"

#include <cstdint>
#include <string>

namespace bigbatch::experiments {

struct CbsOptions {
  std::string out = "runs";  ///< the run goes to <out>/<name>/
  int jobs = 1;              ///< branches (and --compare runs) in parallel
  bool compare = false;      ///< then train warmup vs. small vs. large batch to the target
};

struct CbsSummary {
  std::string dir;
  std::int64_t branches = 0, skipped = 0;
  double wall_time = 0;
};

/// Runs (or resumes) the measurement: the reference runs, every branch,
/// then cbs.csv and schedule.json; with options.compare also the three-way
/// comparison (compare.csv). Resumable at any point: a reference continues
/// from its last saved checkpoint, a finished branch (result.json) is kept.
/// Under a process group every rank trains each run data-parallel; rank 0
/// writes.
CbsSummary run_cbs(const CbsConfig& config, const CbsOptions& options, distributed::ProcessGroup* group = nullptr);

}  // namespace bigbatch::experiments
