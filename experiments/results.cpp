// Result files and the report (results.h).
#include "results.h"

#include "csv.h"
#include "files.h"
#include "../noise/critical_batch.h"

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
            {"momentum", t.optimizer.momentum},
            {"seed", t.seed},
            {"wall_time", r.wall_time},
            {"code_version", code_version()},
            {"libtorch_version", libtorch_version()}};
  if (!r.error.empty()) j["error"] = r.error;
  json data = {{"loader_threads", r.loader_threads}, {"wait_fraction", finite_or_null(r.data_wait_fraction)}};
  if (r.data_report.is_object()) data.update(r.data_report);
  j["data"] = data;
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

std::int64_t write_tables(const std::vector<TrialConfig>& trials, const std::string& sweep_dir) {
  const fs::path dir(sweep_dir);
  struct Best {
    std::optional<json> reached;  // the fastest trial that reached
    std::optional<json> closest;  // else the one with the best metric
    std::int64_t failed = 0;      // trials whose workload threw
  };
  const auto metric_of = [](const std::optional<json>& s) {
    return s && (*s)["best_metric"].is_number() ? (*s)["best_metric"].get<double>()
                                                : std::numeric_limits<double>::infinity();
  };
  std::map<std::int64_t, Best> best;
  std::int64_t reached = 0;
  for (const auto& t : trials) {
    json s = read_json((dir / t.name / "summary.json").string());
    Best& b = best[t.batch_size];
    if (s["status"] == to_string(TrialStatus::kFailed)) ++b.failed;
    if (s["status"] == to_string(TrialStatus::kReached)) {
      ++reached;
      if (!b.reached || s["steps_to_target"].get<std::int64_t>() < (*b.reached)["steps_to_target"].get<std::int64_t>()) {
        b.reached = s;
      }
    } else if (!b.closest || metric_of(s) < metric_of(b.closest)) {
      b.closest = s;
    }
  }
  std::ostringstream csv;
  csv << "batch_size,steps,examples,best_lr,trial,reached,edge,failed\n";
  std::vector<std::pair<double, double>> points;
  json fit_batches = json::array(), fit_steps = json::array();
  for (const auto& [batch, b] : best) {
    const json& s = b.reached ? *b.reached : *b.closest;
    const std::string trial = s["trial"].get<std::string>();
    if (b.reached) {
      const auto steps = s["steps_to_target"].get<std::int64_t>();
      csv << batch << ',' << steps << ',' << s["examples_to_target"].get<std::int64_t>() << ',';
      points.emplace_back(static_cast<double>(batch), static_cast<double>(steps));
      fit_batches.push_back(batch);
      fit_steps.push_back(steps);
    } else {
      csv << batch << ",,,";
    }
    csv << csv_number(s["peak_lr"].get<double>()) << ',' << trial << ',' << (b.reached ? 1 : 0) << ','
        << search_edge(trials, trial) << ',' << b.failed << "\n";
  }
  write_file_atomic((dir / "steps_to_target.csv").string(), csv.str());
  json fit = {{"batch_sizes", fit_batches}, {"steps", fit_steps}};
  if (points.size() < 3) {
    // Two points fit two parameters exactly: no residual, no range, no evidence.
    fit["error"] = "too few batch sizes: " + std::to_string(points.size()) +
                   " reached the target, the fit needs 3 (2 parameters and a residual)";
  } else {
    const noise::CriticalBatchFit f = noise::fit_critical_batch(points);
    const noise::CriticalBatchRange range = noise::bootstrap_critical_batch(points);
    fit["s_min"] = f.s_min;
    fit["e_min"] = f.e_min;
    fit["b_crit"] = finite_or_null(f.b_crit);
    fit["rms_relative_error"] = f.rms_relative_error;
    fit["range"] = {{"level", range.level},
                    {"resamples", range.resamples},
                    {"b_crit", {finite_or_null(range.b_crit_low), finite_or_null(range.b_crit_high)}},
                    {"s_min", {range.s_min_low, range.s_min_high}}};
  }
  write_file_atomic((dir / "fit.json").string(), fit.dump(2) + "\n");
  return reached;
}

std::vector<TargetRow> target_rows(const CsvTable& csv) {
  const bool has_edge = std::find(csv.header().begin(), csv.header().end(), "edge") != csv.header().end();
  const bool has_failed = std::find(csv.header().begin(), csv.header().end(), "failed") != csv.header().end();
  std::vector<TargetRow> rows;
  for (std::size_t i = 0; i < csv.rows(); ++i) {
    TargetRow r;
    r.batch_size = csv.integer(i, "batch_size").value_or(0);
    r.steps = csv.integer(i, "steps");
    r.examples = csv.integer(i, "examples");
    r.best_lr = csv.number(i, "best_lr").value_or(std::numeric_limits<double>::quiet_NaN());
    r.trial = csv.at(i, "trial");
    r.reached = csv.at(i, "reached") == "1";
    if (has_edge) r.edge = csv.at(i, "edge");  // files from before the edge column have none
    if (has_failed) r.failed = csv.integer(i, "failed").value_or(0);
    rows.push_back(std::move(r));
  }
  return rows;
}

std::vector<TargetRow> read_steps_to_target(const std::string& sweep_dir) {
  const fs::path path = fs::path(sweep_dir) / "steps_to_target.csv";
  if (!fs::exists(path)) throw ConfigError(sweep_dir + ": no steps_to_target.csv (not a finished sweep folder)");
  return target_rows(CsvTable::read(path.string()));
}

std::string report(const std::string& sweep_dir) {
  const fs::path dir(sweep_dir);
  const auto dash = [](const std::optional<std::int64_t>& x) { return x ? std::to_string(*x) : std::string("-"); };
  std::ostringstream out;
  out << std::left << std::setw(12) << "batch" << std::setw(10) << "steps" << std::setw(12) << "examples"
      << std::setw(12) << "best lr" << std::setw(10) << "reached" << std::setw(7) << "edge" << "trial\n";
  std::vector<std::string> edges, failed;
  for (const TargetRow& r : read_steps_to_target(sweep_dir)) {
    if (r.failed > 0) failed.push_back(std::to_string(r.batch_size) + " (" + std::to_string(r.failed) + ")");
    std::ostringstream lr;
    lr << std::setprecision(4) << r.best_lr;
    out << std::setw(12) << r.batch_size << std::setw(10) << dash(r.steps) << std::setw(12) << dash(r.examples)
        << std::setw(12) << (std::isfinite(r.best_lr) ? lr.str() : "-") << std::setw(10)
        << (r.reached ? "yes" : "no") << std::setw(7) << (r.edge.empty() ? "-" : r.edge) << r.trial << "\n";
    if (!r.edge.empty()) edges.push_back(std::to_string(r.batch_size) + " (" + r.edge + ")");
  }
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
        out << "  " << std::lround(100 * r["level"].get<double>()) << "% bootstrap range: B_crit "
            << bound(r["b_crit"][0]) << " to " << bound(r["b_crit"][1]) << ", S_min " << r["s_min"][0].dump()
            << " to " << r["s_min"][1].dump() << "\n";
      }
    }
  }
  return out.str();
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
  // The cells of each row: batch, steps per sweep, then ratios to the first.
  std::vector<std::string> header{"batch size"};
  for (const auto& s : sweeps) header.push_back(s.label);
  for (std::size_t k = 1; k < sweeps.size(); ++k) header.push_back(sweeps[k].label + " / " + sweeps[0].label);
  const std::string none = format == TableFormat::kCsv ? "" : "-";
  std::vector<std::vector<std::string>> rows;
  for (const auto batch : batches) {
    std::vector<std::optional<std::int64_t>> steps;
    for (const auto& t : tables) {
      const auto it = t.find(batch);
      steps.push_back(it == t.end() ? std::nullopt : it->second.steps);
    }
    std::vector<std::string> row{std::to_string(batch)};
    for (const auto& s : steps) row.push_back(s ? std::to_string(*s) : none);
    for (std::size_t k = 1; k < steps.size(); ++k) {
      std::ostringstream ratio;
      if (steps[0] && steps[k]) ratio << std::fixed << std::setprecision(2) << static_cast<double>(*steps[k]) / static_cast<double>(*steps[0]);
      row.push_back(steps[0] && steps[k] ? ratio.str() : none);
    }
    rows.push_back(std::move(row));
  }
  return format_table(header, rows, format);
}

}  // namespace bigbatch::experiments
