// The results a sweep leaves in its folder, and the table it prints:
//   <trial>/metrics.csv      one row per evaluation (EvalRow's fields, in order)
//   <trial>/summary.json     the trial's outcome, written last
//   steps_to_target.csv      per batch size, the best rate by its median steps
//                            over seeds, with the seeds' spread and a bootstrap
//                            interval, and whether the rate is on the edge of
//                            the search (docs/experiments.md "Seeds")
//   fit.json                 S(B) = S_min (1 + B_crit / B) fitted to that table
//                            (from 3 batch sizes that reached), with a range
//                            bootstrapped over seeds (or residuals: one seed)
#pragma once

#include "../runconfig/config.h"
#include "../io/csv.h"
#include "../train/trial.h"

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
/// A batch size's row: its trials are grouped into rates (rates_of,
/// trial_queue.h); a rate's steps are the median over its seeds, a seed that
/// did not reach (or was pruned) counting as +infinity, so a rate reaches when
/// more than half of its seeds do; the row is the rate with the least median,
/// ties to the earlier rate. Its spread: the seeds' min and max and a 90%
/// percentile-bootstrap interval of the median over seeds.
std::int64_t write_tables(const std::vector<TrialConfig>& trials, const std::string& dir);

/// The level of the intervals in the tables, the fit and the comparison.
inline constexpr double kIntervalLevel = 0.9;

/// One row of steps_to_target.csv.
struct TargetRow {
  std::int64_t batch_size = 0;
  /// The row's rate's medians over seeds; empty when no rate reached.
  std::optional<double> steps, examples;
  double best_lr = 0;
  std::string trial;  ///< the row's median seed (the lower of two), else the closest trial
  bool reached = false;
  std::string edge;  ///< search_edge() of the trial
  std::int64_t failed = 0;  ///< trials of this batch size whose workload threw (0 in tables from before the column)
  std::int64_t seeds = 1, seeds_reached = 0;  ///< of the row's rate
  /// Each seed's steps (+infinity: not reached), in the config's seed order;
  /// empty in tables from before the column.
  std::vector<double> seed_steps;
  /// The seeds' min and max, and the bootstrap interval of the median (empty
  /// with one seed); the max and the interval's high end may be +infinity.
  std::optional<double> steps_min, steps_max, steps_low, steps_high;
  /// Bytes each rank sent in the gradient exchange to reach the target, the
  /// median over the row's seeds (+infinity: not reached); empty when the
  /// trials did not count them (no data-parallel exchange) or before the column.
  std::optional<double> bytes;
  /// Synchronizations to reach the target (data parallelism: its steps;
  /// local SGD and DiLoCo: their rounds), the median over the row's seeds
  /// (+infinity: not reached); empty as bytes is, or before the column.
  std::optional<double> syncs;
};

/// "12.3 MB": bytes in decimal units, 3 significant digits.
std::string bytes_text(double bytes);

/// A finished sweep folder's steps_to_target.csv. Throws ConfigError when the
/// folder holds no finished sweep, std::runtime_error naming the file when a
/// cell is not what its column holds.
std::vector<TargetRow> read_steps_to_target(const std::string& sweep_dir);
/// The rows of a steps_to_target.csv already read (the same errors).
std::vector<TargetRow> target_rows(const CsvTable& csv);

/// A number of steps for a table: an integer, or one decimal (the median of
/// an even count of seeds); "inf" for +infinity.
std::string steps_text(double steps);

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
/// each later sweep's steps as a ratio to the first's, with its bootstrap
/// interval over both sweeps' seeds (noise/critical_batch.h) where both have
/// several, marked "*" when the interval excludes 1 (in CSV: low, high and
/// differs columns). Checks comparability.
std::string compare_report(const std::vector<LabelledSweep>& sweeps, TableFormat format);

}  // namespace bigbatch::experiments
