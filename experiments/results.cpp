// Result files and the report (results.h).
#include <bigbatch/experiments/results.h>

#include <bigbatch/experiments/files.h>
#include <bigbatch/noise/critical_batch.h>

#include <c10/util/Exception.h>

#include <cmath>
#include <filesystem>
#include <iomanip>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <type_traits>

namespace bigbatch::experiments {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A number for CSV: empty when not finite, shortest round-trip form otherwise.
std::string csv_number(double x) {
  if (!std::isfinite(x)) return "";
  std::ostringstream s;
  s << std::setprecision(10) << x;
  return s.str();
}

// "0.03535533906" -> "0.03536": four significant digits for the table.
std::string short_number(const std::string& text) {
  if (text.empty()) return "-";
  std::ostringstream s;
  s << std::setprecision(4) << std::stod(text);
  return s.str();
}

json finite_or_null(double x) { return std::isfinite(x) ? json(x) : json(nullptr); }

}  // namespace

std::string metrics_csv(const std::vector<EvalRow>& rows) {
  std::ostringstream s;
  const char* sep = "";
  for_each_field(EvalRow{}, [&](const char* name, const auto&) {
    s << sep << name;
    sep = ",";
  });
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
  if (!r.rows.empty()) {
    const EvalRow& last = r.rows.back();
    j["final"] = {{"val_loss", finite_or_null(last.val_loss)},
                  {"val_error", finite_or_null(last.val_error)},
                  {"gns", finite_or_null(last.gns)}};
  }
  return j;
}

std::int64_t write_tables(const std::vector<TrialConfig>& trials, const std::string& sweep_dir) {
  const fs::path dir(sweep_dir);
  struct Best {
    std::optional<json> reached;  // the fastest trial that reached
    std::optional<json> closest;  // else the one with the best metric
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
  csv << "batch_size,steps,examples,best_lr,trial,reached\n";
  std::vector<std::pair<double, double>> points;
  json fit_batches = json::array(), fit_steps = json::array();
  for (const auto& [batch, b] : best) {
    if (b.reached) {
      const json& s = *b.reached;
      const auto steps = s["steps_to_target"].get<std::int64_t>();
      csv << batch << ',' << steps << ',' << s["examples_to_target"].get<std::int64_t>() << ','
          << csv_number(s["peak_lr"].get<double>()) << ',' << s["trial"].get<std::string>() << ",1\n";
      points.emplace_back(static_cast<double>(batch), static_cast<double>(steps));
      fit_batches.push_back(batch);
      fit_steps.push_back(steps);
    } else {
      const json& s = *b.closest;
      csv << batch << ",,," << csv_number(s["peak_lr"].get<double>()) << ',' << s["trial"].get<std::string>() << ",0\n";
    }
  }
  write_file_atomic((dir / "steps_to_target.csv").string(), csv.str());
  json fit = {{"batch_sizes", fit_batches}, {"steps", fit_steps}};
  try {
    const noise::CriticalBatchFit f = noise::fit_critical_batch(points);
    fit["s_min"] = f.s_min;
    fit["e_min"] = f.e_min;
    fit["b_crit"] = finite_or_null(f.b_crit);
    fit["rms_relative_error"] = f.rms_relative_error;
  } catch (const c10::Error& e) {
    fit["error"] = e.what_without_backtrace();
  }
  write_file_atomic((dir / "fit.json").string(), fit.dump(2) + "\n");
  return reached;
}

std::string report(const std::string& sweep_dir) {
  const fs::path dir(sweep_dir);
  if (!fs::exists(dir / "steps_to_target.csv")) {
    throw ConfigError(sweep_dir + ": no steps_to_target.csv (not a finished sweep folder)");
  }
  std::istringstream csv(read_file((dir / "steps_to_target.csv").string()));
  std::ostringstream out;
  std::string line;
  std::getline(csv, line);  // header
  out << std::left << std::setw(12) << "batch" << std::setw(10) << "steps" << std::setw(12) << "examples"
      << std::setw(12) << "best lr" << std::setw(10) << "reached" << "trial\n";
  while (std::getline(csv, line)) {
    std::vector<std::string> f;
    std::stringstream ls(line);
    for (std::string cell; std::getline(ls, cell, ',');) f.push_back(cell);
    f.resize(6);
    out << std::setw(12) << f[0] << std::setw(10) << (f[1].empty() ? "-" : f[1]) << std::setw(12)
        << (f[2].empty() ? "-" : f[2]) << std::setw(12) << short_number(f[3]) << std::setw(10) << (f[5] == "1" ? "yes" : "no")
        << f[4] << "\n";
  }
  if (fs::exists(dir / "fit.json")) {
    const json fit = read_json((dir / "fit.json").string());
    if (fit.contains("error")) {
      out << "fit S(B) = S_min (1 + B_crit / B): " << fit["error"].get<std::string>() << "\n";
    } else {
      out << "fit S(B) = S_min (1 + B_crit / B): S_min " << fit["s_min"].get<double>() << ", B_crit "
          << (fit["b_crit"].is_null() ? std::string("inf (no plateau)") : fit["b_crit"].dump()) << ", E_min "
          << fit["e_min"].get<double>() << " (rms relative error " << fit["rms_relative_error"].get<double>() << ")\n";
    }
  }
  return out.str();
}

}  // namespace bigbatch::experiments
