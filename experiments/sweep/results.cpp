// Result files and the report (results.h).
#include "results.h"

#include "../io/csv.h"
#include "../io/files.h"
#include "machine.h"
#include "trial_queue.h"
#include "../../noise/critical_batch.h"

#include <c10/util/Exception.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <type_traits>

#ifndef BIGBATCH_CODE_VERSION
#define BIGBATCH_CODE_VERSION "unknown"
#endif

namespace bigbatch::experiments {
namespace fs = std::filesystem;
using nlohmann::json;

std::string code_version() { return BIGBATCH_CODE_VERSION; }

std::string libtorch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

json finite_or_null(double x) { return std::isfinite(x) ? json(x) : json(nullptr); }

std::string metrics_csv(const std::vector<EvalRow>& rows, const std::vector<std::string>& extra) {
  std::ostringstream s;
  const char* sep = "";
  for_each_field(EvalRow{}, [&](const char* name, const auto&) {
    s << sep << name;
    sep = ",";
  });
  for (const auto& name : extra) s << ",val_" << name;
  s << '\n';
  for (const auto& r : rows) {
    sep = "";
    for_each_field(r, [&](const char*, const auto& value) {
      s << sep;
      if constexpr (std::is_integral_v<std::decay_t<decltype(value)>>) {
        s << value;
      } else {
        s << csv_number(value);
      }
      sep = ",";
    });
    for (std::size_t i = 0; i < extra.size(); ++i) s << ',' << (i < r.extra.size() ? csv_number(r.extra[i]) : "");
    s << '\n';
  }
  return s.str();
}

json summary_json(const TrialConfig& t, const TrialResult& r) {
  json j = {{"trial", t.name},
            {"status", to_string(r.status)},
            {"steps_to_target", r.steps_to_target ? json(*r.steps_to_target) : json(nullptr)},
            {"examples_to_target", r.examples_to_target ? json(*r.examples_to_target) : json(nullptr)},
            {"steps", r.steps},
            {"budget", r.budget},
            {"metric", to_string(t.target.metric)},
            {"best_metric", finite_or_null(r.best_metric)},
            {"batch_size", t.batch_size},
            {"base_lr", t.schedule.base_lr},
            {"peak_lr", r.peak_lr},
            {"momentum", t.optimizer.momentum() ? json(*t.optimizer.momentum()) : json(nullptr)},
            {"seed", t.seed},
            {"wall_time", r.wall_time},
            {"code_version", code_version()},
            {"libtorch_version", libtorch_version()},
            {"machine", machine_record(this_machine())}};
  if (!r.error.empty()) j["error"] = r.error;
  json data = {{"loader_threads", r.loader_threads}, {"wait_fraction", finite_or_null(r.data_wait_fraction)}};
  if (r.data_report.is_object()) data.update(r.data_report);
  j["data"] = data;
  if (r.exchange.is_object()) j["exchange"] = r.exchange;
  if (r.shard.is_object()) j["shard"] = r.shard;
  if (r.staleness.is_object()) j["staleness"] = r.staleness;
  if (t.precision != Precision::kFp32) {
    j["precision"] = {{"name", to_string(t.precision)}, {"loss_scale", nullptr}, {"skipped_steps", nullptr}};
    if (!r.rows.empty() && std::isfinite(r.rows.back().loss_scale)) {
      j["precision"]["loss_scale"] = r.rows.back().loss_scale;
      j["precision"]["skipped_steps"] = r.rows.back().skipped_steps;
    }
  }
  if (!r.rows.empty()) {
    const EvalRow& last = r.rows.back();
    j["final"] = {{"val_loss", finite_or_null(last.val_loss)},
                  {"val_error", finite_or_null(last.val_error)},
                  {"gns", finite_or_null(last.gns)}};
  }
  return j;
}

TrialResult result_from_summary(const json& summary) {
  const auto integer = [&](const char* key) {
    return summary.contains(key) && summary[key].is_number_integer()
               ? std::optional<std::int64_t>(summary[key].get<std::int64_t>())
               : std::nullopt;
  };
  TrialResult r;
  r.status = config::enum_value(kTrialStatuses, summary.value("status", std::string("not_reached")), "status");
  r.steps_to_target = integer("steps_to_target");
  r.examples_to_target = integer("examples_to_target");
  r.steps = integer("steps").value_or(0);
  r.budget = integer("budget").value_or(0);
  r.best_metric = summary.contains("best_metric") && summary["best_metric"].is_number()
                      ? summary["best_metric"].get<double>()
                      : kNaN;
  r.peak_lr = summary.value("peak_lr", 0.0);
  r.wall_time = summary.value("wall_time", 0.0);
  if (summary.contains("error") && summary["error"].is_string()) r.error = summary["error"].get<std::string>();
  if (summary.contains("exchange") && summary["exchange"].is_object()) r.exchange = summary["exchange"];
  if (summary.contains("shard") && summary["shard"].is_object()) r.shard = summary["shard"];
  if (summary.contains("staleness") && summary["staleness"].is_object()) r.staleness = summary["staleness"];
  return r;
}

std::string search_edge(const std::vector<TrialConfig>& trials, const std::string& chosen) {
  const auto it = std::find_if(trials.begin(), trials.end(), [&](const TrialConfig& t) { return t.name == chosen; });
  if (it == trials.end()) return "";
  std::set<double> rates;
  for (const auto& t : trials) {
    if (t.batch_size == it->batch_size) rates.insert(t.schedule.base_lr);
  }
  if (rates.size() < 2) return "";
  const double lr = it->schedule.base_lr;
  return lr == *rates.begin() ? "low" : lr == *rates.rbegin() ? "high" : "";
}

std::string steps_text(double steps) {
  if (std::isinf(steps)) return "inf";
  std::ostringstream out;
  if (steps == std::round(steps)) {
    out << static_cast<std::int64_t>(steps);
  } else {
    out << std::fixed << std::setprecision(1) << steps;
  }
  return out.str();
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int kResamples = 2000;

// A seed's steps and examples to target: +infinity unless it reached.
// bytes, syncs: what rank 0 sent to reach it and the synchronizations it
// took (a data-parallel trial's exchange), NaN when the trial did not count them.
struct SeedResult {
  json summary;
  double steps = kInf, examples = kInf;
  double bytes = std::numeric_limits<double>::quiet_NaN();
  double syncs = std::numeric_limits<double>::quiet_NaN();
};

SeedResult seed_result(const fs::path& dir, const TrialConfig& t) {
  SeedResult r{read_json((dir / t.name / "summary.json").string())};
  const bool counted = r.summary.contains("exchange") && r.summary["exchange"].is_object();
  if (counted) r.bytes = kInf;
  // (summaries from before the synchronizations were counted have no syncs_to_target)
  const bool synced = counted && r.summary["exchange"].contains("syncs_to_target");
  if (synced) r.syncs = kInf;
  if (r.summary["status"] == to_string(TrialStatus::kReached)) {
    r.steps = static_cast<double>(r.summary["steps_to_target"].get<std::int64_t>());
    r.examples = static_cast<double>(r.summary["examples_to_target"].get<std::int64_t>());
    if (counted && r.summary["exchange"].value("bytes_to_target", json()).is_number()) {
      r.bytes = r.summary["exchange"]["bytes_to_target"].get<double>();
    }
    if (synced && r.summary["exchange"]["syncs_to_target"].is_number()) {
      r.syncs = r.summary["exchange"]["syncs_to_target"].get<double>();
    }
  }
  return r;
}

std::string cell(const std::optional<double>& x) { return x ? steps_text(*x) : std::string(); }

// "90%": the intervals' level, as the report and the comparison write it.
std::string level_text() { return std::to_string(std::lround(100 * kIntervalLevel)) + "%"; }

double metric_of(const json& summary) {
  return summary["best_metric"].is_number() ? summary["best_metric"].get<double>() : kInf;
}

// One batch size's row: its best rate by the median over seeds, and the
// rate's median seed (the lower of the two middle ones, ties in seed order)
// as the trial it names; none reached: the rate of the trial with the best
// metric, which it names. `rates` are the batch size's, their trials'
// indices into `results`.
std::pair<TargetRow, std::size_t> batch_row(std::int64_t batch, const std::vector<std::vector<std::size_t>>& rates,
                                            const std::vector<SeedResult>& results) {
  TargetRow row;
  row.batch_size = batch;
  std::optional<std::size_t> best;
  double best_median = kInf;
  std::optional<std::size_t> closest;
  for (std::size_t r = 0; r < rates.size(); ++r) {
    std::vector<double> steps;
    for (const auto i : rates[r]) {
      steps.push_back(results[i].steps);
      if (results[i].summary["status"] == to_string(TrialStatus::kFailed)) ++row.failed;
      if (!closest || metric_of(results[i].summary) < metric_of(results[*closest].summary)) closest = i;
    }
    const double m = noise::median_steps(steps);
    if (m < best_median) {
      best_median = m;
      best = r;
    }
  }
  const std::vector<std::size_t>& rate = best ? rates[*best] : *std::find_if(rates.begin(), rates.end(), [&](const auto& q) {
    return std::find(q.begin(), q.end(), *closest) != q.end();
  });
  std::vector<double> steps, examples, bytes, syncs;
  for (const auto i : rate) {
    steps.push_back(results[i].steps);
    examples.push_back(results[i].examples);
    if (!std::isnan(results[i].bytes)) bytes.push_back(results[i].bytes);
    if (!std::isnan(results[i].syncs)) syncs.push_back(results[i].syncs);
  }
  row.seeds = static_cast<std::int64_t>(rate.size());
  row.seeds_reached = std::count_if(steps.begin(), steps.end(), [](double x) { return std::isfinite(x); });
  row.seed_steps = steps;
  if (!best) return {row, *closest};
  std::vector<std::size_t> order(rate.size());
  for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return steps[a] < steps[b]; });
  row.reached = true;
  row.steps = best_median;
  row.examples = noise::median_steps(examples);
  if (bytes.size() == steps.size()) row.bytes = noise::median_steps(bytes);
  if (syncs.size() == steps.size()) row.syncs = noise::median_steps(syncs);
  row.steps_min = *std::min_element(steps.begin(), steps.end());
  row.steps_max = *std::max_element(steps.begin(), steps.end());
  if (steps.size() > 1) {
    const noise::Interval in = noise::bootstrap_median(steps, kResamples, kIntervalLevel, static_cast<std::uint64_t>(batch));
    row.steps_low = in.low;
    row.steps_high = in.high;
  }
  return {row, rate[order[(order.size() - 1) / 2]]};
}

// A row of steps_to_target.csv; `summary` is its trial's.
std::string csv_row(const TargetRow& row, const json& summary, const std::vector<TrialConfig>& trials) {
  std::string seed_cells;
  for (const double x : row.seed_steps) seed_cells += (seed_cells.empty() ? "" : " ") + steps_text(x);
  std::ostringstream csv;
  csv << row.batch_size << ',' << cell(row.steps) << ',' << cell(row.examples) << ','
      << csv_number(summary["peak_lr"].get<double>()) << ',' << row.trial << ',' << (row.reached ? 1 : 0) << ','
      << search_edge(trials, row.trial) << ',' << row.failed << ',' << row.seeds << ',' << row.seeds_reached << ','
      << cell(row.steps_min) << ',' << cell(row.steps_max) << ',' << cell(row.steps_low) << ','
      << cell(row.steps_high) << ',' << seed_cells << ',' << (row.bytes ? csv_number(*row.bytes) : std::string())
      << ',' << cell(row.syncs) << "\n";
  return csv.str();
}

// fit.json: S(B) = S_min (1 + B_crit / B) through the rows that reached the
// target, with its bootstrap range: over seeds where rows have several,
// else over the residuals about the curve.
json fit_json(const std::vector<TargetRow>& reached) {
  json fit_batches = json::array(), fit_steps = json::array();
  std::vector<std::pair<double, double>> points;
  std::vector<std::pair<double, std::vector<double>>> seed_points;
  std::size_t most_seeds = 0;
  for (const TargetRow& row : reached) {
    points.emplace_back(static_cast<double>(row.batch_size), *row.steps);
    seed_points.emplace_back(static_cast<double>(row.batch_size), row.seed_steps);
    most_seeds = std::max(most_seeds, row.seed_steps.size());
    fit_batches.push_back(row.batch_size);
    fit_steps.push_back(*row.steps);
  }
  json fit = {{"batch_sizes", fit_batches}, {"steps", fit_steps}};
  if (points.size() < 3) {
    // Two points fit two parameters exactly: no residual, no range, no evidence.
    fit["error"] = "too few batch sizes: " + std::to_string(points.size()) +
                   " reached the target, the fit needs 3 (2 parameters and a residual)";
    return fit;
  }
  const noise::CriticalBatchFit f = noise::fit_critical_batch(points);
  fit["s_min"] = f.s_min;
  fit["e_min"] = f.e_min;
  fit["b_crit"] = finite_or_null(f.b_crit);
  fit["rms_relative_error"] = f.rms_relative_error;
  // Several seeds: their spread is the uncertainty (drawn per batch size);
  // one seed: the residuals about the curve stand in for it.
  const bool by_seeds = most_seeds > 1;
  const noise::CriticalBatchRange range = by_seeds
                                              ? noise::bootstrap_critical_batch_seeds(seed_points, kResamples, kIntervalLevel)
                                              : noise::bootstrap_critical_batch(points, kResamples, kIntervalLevel);
  fit["range"] = {{"level", range.level},
                  {"resamples", range.resamples},
                  {"method", by_seeds ? "seeds" : "residuals"},
                  {"b_crit", {finite_or_null(range.b_crit_low), finite_or_null(range.b_crit_high)}},
                  {"s_min", {range.s_min_low, range.s_min_high}}};
  return fit;
}

}  // namespace

std::int64_t write_tables(const std::vector<TrialConfig>& trials, const std::string& sweep_dir) {
  const fs::path dir(sweep_dir);
  std::vector<SeedResult> results;
  std::int64_t reached = 0;
  for (const auto& t : trials) {
    results.push_back(seed_result(dir, t));
    if (std::isfinite(results.back().steps)) ++reached;
  }
  // Per batch size (ascending): its rates, in order.
  std::map<std::int64_t, std::vector<std::vector<std::size_t>>> batches;
  for (auto& rate : rates_of(trials)) batches[trials[rate.front()].batch_size].push_back(std::move(rate));

  std::string csv =
      "batch_size,steps,examples,best_lr,trial,reached,edge,failed,seeds,seeds_reached,steps_min,steps_max,"
      "steps_low,steps_high,seed_steps,bytes,syncs\n";
  std::vector<TargetRow> reached_rows;
  for (const auto& [batch, rates] : batches) {
    auto [row, chosen] = batch_row(batch, rates, results);
    const json& summary = results[chosen].summary;
    row.trial = summary["trial"].get<std::string>();
    csv += csv_row(row, summary, trials);
    if (row.reached) reached_rows.push_back(row);
  }
  write_file_atomic((dir / "steps_to_target.csv").string(), csv);
  write_file_atomic((dir / "fit.json").string(), fit_json(reached_rows).dump(2) + "\n");
  return reached;
}

std::vector<TargetRow> target_rows(const CsvTable& csv) {
  const bool has_edge = std::find(csv.header().begin(), csv.header().end(), "edge") != csv.header().end();
  const bool has_failed = std::find(csv.header().begin(), csv.header().end(), "failed") != csv.header().end();
  const bool has_seeds = std::find(csv.header().begin(), csv.header().end(), "seed_steps") != csv.header().end();
  const bool has_bytes = std::find(csv.header().begin(), csv.header().end(), "bytes") != csv.header().end();
  const bool has_syncs = std::find(csv.header().begin(), csv.header().end(), "syncs") != csv.header().end();
  std::vector<TargetRow> rows;
  for (std::size_t i = 0; i < csv.rows(); ++i) {
    TargetRow r;
    r.batch_size = csv.integer(i, "batch_size").value_or(0);
    r.steps = csv.number(i, "steps");
    r.examples = csv.number(i, "examples");
    r.best_lr = csv.number(i, "best_lr").value_or(std::numeric_limits<double>::quiet_NaN());
    r.trial = csv.at(i, "trial");
    r.reached = csv.at(i, "reached") == "1";
    if (has_bytes) r.bytes = csv.number(i, "bytes");
    if (has_syncs) r.syncs = csv.number(i, "syncs");
    if (has_edge) r.edge = csv.at(i, "edge");  // files from before the edge column have none
    if (has_failed) r.failed = csv.integer(i, "failed").value_or(0);
    if (has_seeds) {  // nor from before the seeds' columns
      r.seeds = csv.integer(i, "seeds").value_or(1);
      r.seeds_reached = csv.integer(i, "seeds_reached").value_or(0);
      r.steps_min = csv.number(i, "steps_min");
      r.steps_max = csv.number(i, "steps_max");
      r.steps_low = csv.number(i, "steps_low");
      r.steps_high = csv.number(i, "steps_high");
      r.seed_steps = csv.numbers(i, "seed_steps");
      if (std::any_of(r.seed_steps.begin(), r.seed_steps.end(), [](double x) { return std::isnan(x); })) {
        throw std::runtime_error(csv.path() + ": row " + std::to_string(i + 1) +
                                 ", column seed_steps: NaN is not a number of steps");
      }
    } else {
      r.seeds_reached = r.reached ? 1 : 0;
      if (r.steps) r.seed_steps = {*r.steps};
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

std::vector<TargetRow> read_steps_to_target(const std::string& sweep_dir) {
  const fs::path path = fs::path(sweep_dir) / "steps_to_target.csv";
  if (!fs::exists(path)) throw ConfigError(sweep_dir + ": no steps_to_target.csv (not a finished sweep folder)");
  return target_rows(CsvTable::read(path.string()));
}

std::string search_edge_warning(const std::vector<std::string>& rows) {
  std::string list;
  for (const auto& r : rows) list += (list.empty() ? "" : ", ") + r;
  return "warning: the best rate is on the edge of the search at batch sizes " + list +
         ": their steps may be overestimates (bigbatch sweep --extend-search tries rates beyond)";
}

void check_comparable(const std::vector<LabelledSweep>& sweeps) {
  std::optional<json> first;
  for (const auto& s : sweeps) {
    const fs::path file = fs::path(s.dir) / "sweep.json";
    if (!fs::exists(file)) throw ConfigError(s.dir + ": no sweep.json (not a sweep folder)");
    const json target = read_json(file.string()).at("target");
    const json key = {target.at("metric"), target.at("threshold")};
    if (first && key != *first) {
      throw ConfigError(s.dir + ": its target (" + key[0].get<std::string>() + " <= " + key[1].dump() +
                        ") differs from " + sweeps.front().dir + "'s (" + (*first)[0].get<std::string>() +
                        " <= " + (*first)[1].dump() + "); only sweeps with the same target compare");
    }
    if (!first) first = key;
  }
}

namespace {

// A table's header and rows in `format`: CSV, Markdown, LaTeX (tabular) or
// text with aligned columns.
std::string format_table(std::vector<std::string> header, const std::vector<std::vector<std::string>>& rows,
                         TableFormat format) {
  std::ostringstream out;
  const auto line = [&](const std::vector<std::string>& cells, const char* begin, const char* sep, const char* end) {
    out << begin;
    for (std::size_t i = 0; i < cells.size(); ++i) out << (i ? sep : "") << cells[i];
    out << end << "\n";
  };
  switch (format) {
    case TableFormat::kCsv: {
      for (auto& h : header) std::replace(h.begin(), h.end(), ',', ' ');
      line(header, "", ",", "");
      for (const auto& r : rows) line(r, "", ",", "");
      break;
    }
    case TableFormat::kMarkdown: {
      line(header, "| ", " | ", " |");
      line(std::vector<std::string>(header.size(), "---:"), "|", "|", "|");
      for (const auto& r : rows) line(r, "| ", " | ", " |");
      break;
    }
    case TableFormat::kLatex: {
      const auto escape = [](std::string text) {
        std::string e;
        for (const char c : text) e += c == '_' || c == '%' || c == '&' || c == '#' ? std::string("\\") + c : std::string(1, c);
        return e;
      };
      out << "\\begin{tabular}{" << std::string(header.size(), 'r') << "}\n\\hline\n";
      std::vector<std::string> escaped;
      for (const auto& h : header) escaped.push_back(escape(h));
      line(escaped, "", " & ", " \\\\");
      out << "\\hline\n";
      for (const auto& r : rows) line(r, "", " & ", " \\\\");
      out << "\\hline\n\\end{tabular}\n";
      break;
    }
    case TableFormat::kText: {
      std::vector<std::size_t> width(header.size());
      for (std::size_t i = 0; i < header.size(); ++i) {
        width[i] = header[i].size();
        for (const auto& r : rows) width[i] = std::max(width[i], r[i].size());
      }
      const auto padded = [&](const std::vector<std::string>& cells) {
        std::vector<std::string> p;
        for (std::size_t i = 0; i < cells.size(); ++i) {
          const bool last = i + 1 == cells.size();
          p.push_back(cells[i] + std::string(last ? 0 : width[i] - cells[i].size(), ' '));
        }
        return p;
      };
      line(padded(header), "", "  ", "");
      for (const auto& r : rows) line(padded(r), "", "  ", "");
      break;
    }
  }
  return out.str();
}

}  // namespace

namespace {

std::string fixed2(double x) {
  if (std::isinf(x)) return std::string("inf");
  std::ostringstream o;
  o << std::fixed << std::setprecision(2) << x;
  return o.str();
}

// The comparison's columns: batch, steps per sweep, then ratios to the first
// (in CSV each with its interval's ends and whether it excludes 1).
std::vector<std::string> compare_header(const std::vector<LabelledSweep>& sweeps, bool csv) {
  std::vector<std::string> header{"batch size"};
  for (const auto& s : sweeps) header.push_back(s.label);
  for (std::size_t k = 1; k < sweeps.size(); ++k) {
    const std::string name = sweeps[k].label + " / " + sweeps[0].label;
    header.push_back(name);
    if (csv) {
      for (const char* part : {" low", " high", " differs"}) header.push_back(name + part);
    }
  }
  return header;
}

// Whether a table's ratios had intervals, and whether some had none.
struct RatioNotes {
  bool intervals = false, without = false;
};

// The cells of the ratio b / a at one batch size (`none` where a side did
// not reach the target): the ratio of the medians and, where both sides
// have several seeds, its bootstrap interval over them.
void append_ratio(std::vector<std::string>& row, const TargetRow* a, const TargetRow* b, std::int64_t batch,
                  bool csv, const std::string& none, RatioNotes& notes) {
  if (!a || !b) {
    row.insert(row.end(), csv ? 4 : 1, none);
    return;
  }
  const double ratio = *b->steps / *a->steps;
  std::optional<noise::Interval> in;
  if (a->seed_steps.size() > 1 && b->seed_steps.size() > 1) {
    in = noise::bootstrap_median_ratio(a->seed_steps, b->seed_steps, kResamples, kIntervalLevel,
                                       static_cast<std::uint64_t>(batch));
  }
  const bool differs = in && (in->low > 1 || in->high < 1);
  notes.intervals = notes.intervals || in.has_value();
  notes.without = notes.without || !in;
  if (csv) {
    row.push_back(fixed2(ratio));
    row.push_back(in ? fixed2(in->low) : "");
    row.push_back(in ? fixed2(in->high) : "");
    row.push_back(in ? (differs ? "1" : "0") : "");
  } else {
    row.push_back(fixed2(ratio) + (in ? " [" + fixed2(in->low) + "-" + fixed2(in->high) + "]" : "") +
                  (differs ? " *" : ""));
  }
}

// What the text and Markdown tables say below the ratios.
std::string ratio_footnotes(const RatioNotes& notes, TableFormat format) {
  std::string out;
  if (notes.intervals) {
    out += (format == TableFormat::kMarkdown ? "\n" : "") + std::string("ratio [") + level_text() +
           " bootstrap interval over both sweeps' seeds]; * the interval excludes 1: the seeds support a "
           "difference\n";
  }
  if (notes.without) {
    out += (format == TableFormat::kMarkdown ? "\n" : "") +
           std::string("a ratio without an interval has one seed on a side: it carries no spread, and a "
                       "difference of 20% may be noise\n");
  }
  return out;
}

}  // namespace

std::string compare_report(const std::vector<LabelledSweep>& sweeps, TableFormat format) {
  check_comparable(sweeps);
  std::vector<std::map<std::int64_t, TargetRow>> tables;
  std::set<std::int64_t> batches;
  for (const auto& s : sweeps) {
    auto& t = tables.emplace_back();
    for (TargetRow& r : read_steps_to_target(s.dir)) {
      batches.insert(r.batch_size);
      t[r.batch_size] = std::move(r);
    }
  }
  const bool csv = format == TableFormat::kCsv;
  const std::string none = csv ? "" : "-";
  RatioNotes notes;
  std::vector<std::vector<std::string>> rows;
  for (const auto batch : batches) {
    std::vector<const TargetRow*> row_of;
    for (const auto& t : tables) {
      const auto it = t.find(batch);
      row_of.push_back(it == t.end() || !it->second.steps ? nullptr : &it->second);
    }
    std::vector<std::string> row{std::to_string(batch)};
    for (const auto* r : row_of) row.push_back(r ? steps_text(*r->steps) : none);
    for (std::size_t k = 1; k < row_of.size(); ++k) append_ratio(row, row_of[0], row_of[k], batch, csv, none, notes);
    rows.push_back(std::move(row));
  }
  std::string out = format_table(compare_header(sweeps, csv), rows, format);
  if (sweeps.size() > 1 && (format == TableFormat::kText || format == TableFormat::kMarkdown)) {
    out += ratio_footnotes(notes, format);
  }
  return out;
}

std::string bytes_text(double bytes) {
  if (std::isinf(bytes)) return "inf";
  std::ostringstream s;
  s << std::setprecision(3);
  if (bytes >= 1e9) {
    s << bytes / 1e9 << " GB";
  } else if (bytes >= 1e6) {
    s << bytes / 1e6 << " MB";
  } else if (bytes >= 1e3) {
    s << bytes / 1e3 << " kB";
  } else {
    s << bytes << " B";
  }
  return s.str();
}

std::string report(const std::string& sweep_dir) {
  const fs::path dir(sweep_dir);
  const auto opt = [](const std::optional<double>& x) { return x ? steps_text(*x) : std::string("-"); };
  const std::vector<TargetRow> table = read_steps_to_target(sweep_dir);
  const std::string level = level_text();
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> edges, failed;
  bool one_seed = true;
  const bool counted = std::any_of(table.begin(), table.end(), [](const TargetRow& r) { return r.bytes.has_value(); });
  const bool synced = std::any_of(table.begin(), table.end(), [](const TargetRow& r) { return r.syncs.has_value(); });
  for (const TargetRow& r : table) {
    if (r.failed > 0) failed.push_back(std::to_string(r.batch_size) + " (" + std::to_string(r.failed) + ")");
    if (!r.edge.empty()) edges.push_back(std::to_string(r.batch_size) + " (" + r.edge + ")");
    one_seed = one_seed && r.seeds <= 1;
    std::ostringstream lr;
    lr << std::setprecision(4) << r.best_lr;
    rows.push_back({std::to_string(r.batch_size), opt(r.steps),
                    r.steps_low ? opt(r.steps_low) + "-" + opt(r.steps_high) : "-",
                    r.reached && r.steps_min ? opt(r.steps_min) + "-" + opt(r.steps_max) : "-",
                    std::to_string(r.seeds_reached) + "/" + std::to_string(r.seeds), opt(r.examples),
                    std::isfinite(r.best_lr) ? lr.str() : "-", r.edge.empty() ? "-" : r.edge, r.trial});
    if (synced) rows.back().insert(rows.back().begin() + 6, opt(r.syncs));
    if (counted) rows.back().insert(rows.back().begin() + 6, r.bytes ? bytes_text(*r.bytes) : "-");
  }
  std::vector<std::string> header{"batch", "steps", level + " interval", "min-max", "reached", "examples",
                                  "best lr", "edge", "trial"};
  if (synced) header.insert(header.begin() + 6, "syncs");
  if (counted) header.insert(header.begin() + 6, "bytes sent");
  std::ostringstream out;
  out << format_table(header, rows, TableFormat::kText);
  if (counted) {
    out << "bytes sent: by each rank in the gradient exchange until the target (the median seed's), "
           "counted from what the collectives carried (docs/distributed.md)\n";
  }
  if (synced) {
    out << "syncs: synchronizations until the target (every step of synchronous data parallelism; the rounds of "
           "local SGD or DiLoCo)\n";
  }
  out << (one_seed ? "one seed per rate: the rows carry no spread (\"seeds\": [0, 1, 2] gives each a median, a "
                     "range and an interval)\n"
                   : "steps: the best rate's median over its seeds; interval: bootstrap over those seeds; "
                     "reached: seeds that reached of those run\n");
  if (!edges.empty()) out << search_edge_warning(edges) << "\n";
  if (!failed.empty()) {
    std::string list;
    for (const auto& f : failed) list += (list.empty() ? "" : ", ") + f;
    out << "warning: trials failed (their workload threw) at batch sizes " << list
        << ": each one's summary.json says why; a rerun tries them again\n";
  }
  if (fs::exists(dir / "fit.json")) {
    const json fit = read_json((dir / "fit.json").string());
    if (fit.contains("error")) {
      out << "fit S(B) = S_min (1 + B_crit / B): " << fit["error"].get<std::string>() << "\n";
    } else {
      const auto bound = [](const json& x) { return x.is_null() ? std::string("inf") : x.dump(); };
      out << "fit S(B) = S_min (1 + B_crit / B): S_min " << fit["s_min"].get<double>() << ", B_crit "
          << (fit["b_crit"].is_null() ? std::string("inf (no plateau)") : fit["b_crit"].dump()) << ", E_min "
          << fit["e_min"].get<double>() << " (rms relative error " << fit["rms_relative_error"].get<double>() << ")\n";
      if (fit.contains("range")) {
        const json& r = fit["range"];
        out << "  " << std::lround(100 * r["level"].get<double>()) << "% bootstrap range"
            << (r.value("method", std::string("residuals")) == "seeds" ? " (over seeds)" : " (over residuals: one seed)")
            << ": B_crit " << bound(r["b_crit"][0]) << " to " << bound(r["b_crit"][1]) << ", S_min "
            << r["s_min"][0].dump() << " to " << r["s_min"][1].dump() << "\n";
      }
    }
  }
  return out.str();
}

}  // namespace bigbatch::experiments
