// The horizons table (horizons.h): each horizon run's final metric, read from
// its folder (the trial's own for the budget, horizon_<k>/ for the others).
#include "horizons.h"

#include "../io/csv.h"
#include "../io/files.h"
#include "results.h"
#include "trial_folder.h"
#include "trial_queue.h"
#include "../train/trial.h"
#include "../../noise/critical_batch.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <sstream>

namespace bigbatch::experiments {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// One horizon run of one trial, as its folder records it.
struct HorizonRun {
  double final = kInf;     // the target metric at its last evaluation (+inf: not finished, diverged)
  double val_loss = kInf;  // val_loss there
  double steps_to_target = kInf;
  std::int64_t budget = 0, examples = 0, branch_steps = 0;
  double peak_lr = 0;
  bool finished = false;
};

// The folder of horizon h of `t` (h == horizons.size(): the trial itself).
fs::path run_folder(const fs::path& dir, const TrialConfig& t, std::size_t h) {
  const fs::path trial = dir / t.name;
  return h == t.horizons.size() ? trial : horizon_folder(trial, h);
}

HorizonRun read_run(const fs::path& folder, const TrialConfig& t) {
  HorizonRun run;
  if (!fs::exists(folder / "summary.json") || !fs::exists(folder / "metrics.csv")) return run;
  const json summary = read_json((folder / "summary.json").string());
  const std::string status = summary.value("status", "");
  if (status != to_string(TrialStatus::kReached) && status != to_string(TrialStatus::kNotReached)) return run;
  const CsvTable rows = CsvTable::read((folder / "metrics.csv").string());
  if (rows.rows() == 0) return run;
  const std::size_t last = rows.rows() - 1;
  const bool averaged = t.average.on() && t.average.target_on == TargetOn::kAveraged;
  const std::string column = std::string(averaged ? "avg_" : "") + to_string(t.target.metric);
  run.final = rows.number(last, column).value_or(kInf);
  run.val_loss = rows.number(last, "val_loss").value_or(kInf);
  run.examples = rows.integer(last, "examples").value_or(0);
  run.budget = summary.value("budget", std::int64_t{0});
  run.peak_lr = summary.value("peak_lr", 0.0);
  if (summary["steps_to_target"].is_number()) run.steps_to_target = summary["steps_to_target"].get<double>();
  std::int64_t from = 0;
  if (fs::exists(folder / "branched.json")) from = read_json((folder / "branched.json").string()).value("step", 0);
  run.branch_steps = run.budget - from;
  run.finished = true;
  return run;
}

std::string number_cell(double x) { return std::isfinite(x) ? csv_number(x) : "inf"; }

}  // namespace

void write_horizon_tables(const std::vector<TrialConfig>& trials, const std::string& sweep_dir) {
  if (trials.empty() || trials.front().horizons.empty()) return;
  const fs::path dir(sweep_dir);
  const std::size_t count = trials.front().horizons.size() + 1;  // the horizons, then the budget
  std::vector<std::vector<HorizonRun>> runs;                      // [trial][horizon]
  for (const auto& t : trials) {
    runs.emplace_back();
    for (std::size_t h = 0; h < count; ++h) runs.back().push_back(read_run(run_folder(dir, t, h), t));
  }
  std::map<std::int64_t, std::vector<std::vector<std::size_t>>> batches;
  for (auto& rate : rates_of(trials)) batches[trials[rate.front()].batch_size].push_back(std::move(rate));

  const std::string metric = to_string(trials.front().target.metric);
  std::ostringstream csv;
  csv << "batch_size,horizon,steps,examples,best_lr,trial,edge,metric,seeds,final,final_min,final_max,final_low,"
         "final_high,val_loss,steps_to_target,branch_steps\n";
  json cost = json::object();
  for (const auto& [batch, rates] : batches) {
    for (std::size_t h = 0; h < count; ++h) {
      // The rate with the lowest median final metric over its seeds.
      std::optional<std::size_t> best;
      double best_median = kInf;
      for (std::size_t r = 0; r < rates.size(); ++r) {
        std::vector<double> finals;
        for (const auto i : rates[r]) finals.push_back(runs[i][h].final);
        const double m = noise::median_steps(finals);
        if (!best || m < best_median) {
          best = r;
          best_median = m;
        }
      }
      const std::vector<std::size_t>& rate = rates[*best];
      std::vector<double> finals, losses, reached, branch;
      for (const auto i : rate) {
        finals.push_back(runs[i][h].final);
        losses.push_back(runs[i][h].val_loss);
        reached.push_back(runs[i][h].steps_to_target);
        branch.push_back(static_cast<double>(runs[i][h].branch_steps));
      }
      std::vector<std::size_t> order(rate.size());
      for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
      std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return finals[a] < finals[b]; });
      const std::size_t median_seed = rate[order[(order.size() - 1) / 2]];
      const HorizonRun& shown = runs[median_seed][h];
      const TrialConfig& t = trials[median_seed];
      std::string low, high;
      if (finals.size() > 1) {
        const noise::Interval in = noise::bootstrap_median(finals, 2000, kIntervalLevel,
                                                           static_cast<std::uint64_t>(batch * 1000 + h));
        low = number_cell(in.low);
        high = number_cell(in.high);
      }
      const fs::path shown_folder = fs::relative(run_folder(dir, t, h), dir);
      csv << batch << ',' << csv_number(h + 1 == count ? t.budget.length : t.horizons[h]) << ',' << shown.budget
          << ',' << shown.examples << ',' << csv_number(shown.peak_lr) << ',' << shown_folder.generic_string() << ','
          << search_edge(trials, t.name) << ',' << (t.average.on() && t.average.target_on == TargetOn::kAveraged ? "avg_" : "") << metric << ','
          << rate.size() << ',' << number_cell(best_median) << ','
          << number_cell(*std::min_element(finals.begin(), finals.end())) << ','
          << number_cell(*std::max_element(finals.begin(), finals.end())) << ',' << low << ',' << high << ','
          << number_cell(noise::median_steps(losses)) << ',' << steps_text(noise::median_steps(reached)) << ','
          << steps_text(noise::median_steps(branch)) << '\n';
    }
    // What one rate and seed trained for all its horizons, with branching and without.
    const std::size_t first = rates.front().front();
    std::int64_t branched = 0, separate = 0;
    bool complete = true;
    for (const HorizonRun& run : runs[first]) {
      complete = complete && run.finished;
      branched += run.branch_steps;
      separate += run.budget;
    }
    cost[std::to_string(batch)] =
        complete ? json({{"branched_steps", branched},
                         {"separate_steps", separate},
                         {"ratio", static_cast<double>(branched) / static_cast<double>(separate)}})
                 : json(nullptr);
  }
  write_file_atomic((dir / "horizons.csv").string(), csv.str());
  write_file_atomic((dir / "horizons.json").string(), json({{"metric", metric}, {"cost", cost}}).dump(2) + "\n");
}

}  // namespace bigbatch::experiments
