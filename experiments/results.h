// The results a sweep leaves in its folder, and the table it prints:
//   <trial>/metrics.csv      one row per evaluation (EvalRow's fields, in order)
//   <trial>/summary.json     the trial's outcome, written last
//   steps_to_target.csv      per batch size, the fastest trial that reached, and
//                            whether its rate is on the edge of the search
//   fit.json                 S(B) = S_min (1 + B_crit / B) fitted to that table
//                            (from 3 batch sizes that reached), with a range
#pragma once

#include "config.h"
#include "csv.h"
#include "trial.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace bigbatch::experiments {

/// A number for JSON: null when not finite.
nlohmann::json finite_or_null(double x);

/// metrics.csv: a header of EvalRow's field names, then one line per row;
/// a number that is not finite is an empty cell.
std::string metrics_csv(const std::vector<EvalRow>& rows, const std::vector<std::string>& extra = {});

/// The code version (git describe at configure time) and the LibTorch
/// version, which every summary.json records.
std::string code_version();
std::string libtorch_version();

/// summary.json of a finished trial, and the result it records (without the
/// rows: metrics.csv has those).
nlohmann::json summary_json(const TrialConfig& trial, const TrialResult& result);
TrialResult result_from_summary(const nlohmann::json& summary);

/// "low" or "high" when trial `chosen`'s rate is the lowest or highest of the
/// rates its batch size tried (at least two), else "": its batch size's best
/// rate may lie outside the search, and its steps overestimate.
std::string search_edge(const std::vector<TrialConfig>& trials, const std::string& chosen);

/// Writes steps_to_target.csv and fit.json of the sweep folder `dir` from the
/// summary.json of each of `trials`. Returns how many trials reached the target.
std::int64_t write_tables(const std::vector<TrialConfig>& trials, const std::string& dir);

/// One row of steps_to_target.csv.
struct TargetRow {
  std::int64_t batch_size = 0;
  std::optional<std::int64_t> steps, examples;  ///< empty when no trial reached
  double best_lr = 0;
  std::string trial;  ///< the fastest trial that reached, else the closest
  bool reached = false;
  std::string edge;  ///< search_edge() of the trial
  std::int64_t failed = 0;  ///< trials of this batch size whose workload threw (0 in tables from before the column)
};

/// A finished sweep folder's steps_to_target.csv. Throws ConfigError when the
/// folder holds no finished sweep, std::runtime_error naming the file when a
/// cell is not what its column holds.
std::vector<TargetRow> read_steps_to_target(const std::string& sweep_dir);
/// The rows of a steps_to_target.csv already read (the same errors).
std::vector<TargetRow> target_rows(const CsvTable& csv);

/// The steps-to-target table of a sweep folder, formatted for a terminal.
/// Throws ConfigError when the folder holds no finished sweep.
std::string report(const std::string& sweep_dir);

/// The one line that says which batch sizes ("64 (high)") have their best
/// rate on the edge of the search.
std::string search_edge_warning(const std::vector<std::string>& rows);

/// A sweep folder under the name a comparison shows.
struct LabelledSweep {
  std::string label;
  std::string dir;
};

/// Throws ConfigError unless the sweeps share their target (metric and
/// threshold): steps to different targets are not comparable.
void check_comparable(const std::vector<LabelledSweep>& sweeps);

enum class TableFormat { kText, kMarkdown, kCsv, kLatex };
inline constexpr config::EnumName<TableFormat> kTableFormats[] = {
    {TableFormat::kText, "text"}, {TableFormat::kMarkdown, "markdown"}, {TableFormat::kCsv, "csv"},
    {TableFormat::kLatex, "latex"}};

/// The steps-to-target tables of several sweeps side by side: a row per batch
/// size, a steps column per sweep ("-" or empty where it did not reach), then
/// each later sweep's steps as a ratio to the first's. Checks comparability.
std::string compare_report(const std::vector<LabelledSweep>& sweeps, TableFormat format);

}  // namespace bigbatch::experiments
