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

#include "../distributed/process_group.h"
#include "config.h"
#include "../schedules/schedule.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace bigbatch::experiments {

/// How far a branch's loss may be above a smaller branch's: loss_b <=
/// loss_a + value (absolute, the paper's 0.01) or loss_a * (1 + value).
struct CbsTolerance {
  bool relative = false;
  double value = 0.01;
};

struct CbsSpec {
  std::int64_t reference_batch = 0;
  double reference_lr = 0;  ///< the rate at reference_batch; branches scale it by schedule.scaling
  /// Examples the reference has seen at each checkpoint (multiples of
  /// reference_batch, increasing; 0 is the initialization).
  std::vector<std::int64_t> checkpoints;
  std::vector<std::int64_t> branch_batches;  ///< increasing, including reference_batch
  std::int64_t window = 0;                   ///< examples each branch trains (a multiple of every branch batch)
  CbsTolerance tolerance;
  /// The branch rate rule: the scaled rate times each factor; a branch's loss
  /// is its best factor's (mean over seeds). {1}: the scaling rule alone.
  std::vector<double> lr_factors{1.0};
};

/// A cbs config: a sweep config's workload (dataset, model, optimizer,
/// schedule, noise, gns, target and budget for --compare, seeds, device)
/// without batch_sizes and search, plus "cbs". `sweep.batch_sizes` holds the
/// branch batches (checked against the data like a sweep's) and
/// `sweep.search.lr` the reference rate.
struct CbsConfig {
  SweepConfig sweep;
  CbsSpec cbs;
};

/// Parses a cbs config; ConfigError "<key>: <problem>" (exit 2 in the CLI).
CbsConfig parse_cbs(const nlohmann::json& j);
CbsConfig load_cbs(const std::string& path);
/// The resolved config (cbs.json): every default written out, the
/// checkpoints as a list.
nlohmann::json to_json(const CbsConfig& config);

/// Merrill et al.'s rule on the branch losses at one checkpoint (in branch
/// batch order): the index of the largest batch whose loss is finite and
/// within the tolerance of every smaller batch's; nullopt when the smallest
/// batch's loss is not finite.
std::optional<std::size_t> critical_index(const std::vector<double>& losses, const CbsTolerance& tolerance);

/// The batch-size warmup a measured curve allows: start at the reference
/// batch, and at each checkpoint double the batch while the critical batch
/// measured there is at least twice it (never shrinking). The stages end
/// at the checkpoints where the batch doubles; the last batch is the run's.
struct BatchWarmup {
  std::vector<schedules::BatchStage> stages;
  std::int64_t final_batch = 0;
};
BatchWarmup derive_warmup(const std::vector<std::int64_t>& examples,
                          const std::vector<std::optional<std::int64_t>>& critical, std::int64_t reference_batch);

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

/// The text report of a finished cbs folder: the curve beside B_simple, the
/// derived warmup, and the comparison when it was run.
std::string cbs_report(const std::string& dir);

}  // namespace bigbatch::experiments
