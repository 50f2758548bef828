// bigbatch cbs's results (cbs.h): the critical batch size its branches
// measured at each checkpoint (Merrill et al.'s rule; cbs.csv, with
// TensorBoard events), the batch-size warmup that curve allows
// (schedule.json), the table of --compare (compare.csv), and the report.
// docs/formulas.md "Critical batch size, measured directly".
#pragma once

#include "../runconfig/config.h"
#include "../train/trial.h"
#include "../../schedules/schedule.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace bigbatch::experiments {

/// The paths of one cbs folder: what the runner (cbs.cpp) writes and the
/// results read.
struct CbsFolder {
  std::filesystem::path dir;
  /// A reference run's folder, and its record at a checkpoint ("e<examples>"
  /// + ".pt": the checkpoint, ".json": the evaluation there).
  std::filesystem::path reference(std::uint64_t seed) const;
  std::filesystem::path point(std::uint64_t seed, std::int64_t examples, const char* ext) const;
  /// A branch's folder (its result.json).
  std::filesystem::path branch(std::int64_t examples, std::int64_t batch, std::size_t factor,
                               std::uint64_t seed) const;
};

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

/// From every branch's result.json and every reference checkpoint's record
/// in `folder`: cbs.csv (a row per checkpoint: the critical batch, the next
/// branch batch, B_simple, the references' validation loss, and each branch
/// batch's loss and rate), the curve's TensorBoard events, and schedule.json;
/// returns the warmup it holds.
BatchWarmup write_curve(const CbsConfig& config, const CbsFolder& folder);

/// schedule.json: a JSON merge patch that turns the workload into the warmup
/// run; and the warmup a patch holds.
nlohmann::json schedule_patch(const CbsConfig& config, const BatchWarmup& warmup);
BatchWarmup warmup_of(const nlohmann::json& patch);

/// One run of --compare: "small" (the reference batch), "large" or "warmup".
struct CompareRun {
  const char* kind;
  TrialConfig trial;
};
/// compare.csv: a row per run with its result.
std::string compare_csv(const std::vector<CompareRun>& runs, const std::vector<TrialResult>& results);

/// The text report of a finished cbs folder: the curve beside B_simple, the
/// derived warmup, and the comparison when it was run.
std::string cbs_report(const std::string& dir);

}  // namespace bigbatch::experiments
