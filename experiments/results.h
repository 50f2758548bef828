// The results a sweep leaves in its folder, and the table it prints:
//   <trial>/metrics.csv      one row per evaluation (EvalRow's fields, in order)
//   <trial>/summary.json     the trial's outcome, written last
//   steps_to_target.csv      per batch size, the fastest trial that reached
//   fit.json                 S(B) = S_min (1 + B_crit / B) fitted to that table
#pragma once

#include <bigbatch/experiments/config.h>
#include <bigbatch/experiments/trial.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace bigbatch::experiments {

/// metrics.csv: a header of EvalRow's field names, then one line per row;
/// a number that is not finite is an empty cell.
std::string metrics_csv(const std::vector<EvalRow>& rows);

/// summary.json of a finished trial.
nlohmann::json summary_json(const TrialConfig& trial, const TrialResult& result);

/// Writes steps_to_target.csv and fit.json of the sweep folder `dir` from the
/// summary.json of each of `trials`. Returns how many trials reached the target.
std::int64_t write_tables(const std::vector<TrialConfig>& trials, const std::string& dir);

/// The steps-to-target table of a sweep folder, formatted for a terminal.
/// Throws ConfigError when the folder holds no finished sweep.
std::string report(const std::string& sweep_dir);

}  // namespace bigbatch::experiments
