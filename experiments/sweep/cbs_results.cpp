// bigbatch cbs's results (cbs_results.h).
#include "cbs_results.h"

#include "../io/csv.h"
#include "../io/files.h"
#include "results.h"
#include "../io/tensorboard.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace bigbatch::experiments {
namespace fs = std::filesystem;
using nlohmann::json;

fs::path CbsFolder::reference(std::uint64_t seed) const { return dir / ("reference_s" + std::to_string(seed)); }

fs::path CbsFolder::point(std::uint64_t seed, std::int64_t examples, const char* ext) const {
  return reference(seed) / "checkpoints" / ("e" + std::to_string(examples) + ext);
}

fs::path CbsFolder::branch(std::int64_t examples, std::int64_t batch, std::size_t factor, std::uint64_t seed) const {
  return dir / "branches" /
         ("e" + std::to_string(examples) + "_b" + std::to_string(batch) + "_f" + std::to_string(factor) + "_s" +
          std::to_string(seed));
}

std::optional<std::size_t> critical_index(const std::vector<double>& losses, const CbsTolerance& tolerance) {
  std::optional<std::size_t> best;
  for (std::size_t k = 0; k < losses.size(); ++k) {
    if (!std::isfinite(losses[k])) continue;
    bool within = true;
    for (std::size_t j = 0; j < k && within; ++j) {
      const double allowed = tolerance.relative ? losses[j] * (1 + tolerance.value) : losses[j] + tolerance.value;
      within = !std::isfinite(losses[j]) || losses[k] <= allowed;
    }
    if (within) best = k;
  }
  if (losses.empty() || !std::isfinite(losses.front())) return std::nullopt;
  return best;
}

BatchWarmup derive_warmup(const std::vector<std::int64_t>& examples,
                          const std::vector<std::optional<std::int64_t>>& critical, std::int64_t reference_batch) {
  TORCH_CHECK(examples.size() == critical.size(), "derive_warmup: ", examples.size(), " checkpoints, ",
              critical.size(), " critical batches");
  BatchWarmup w;
  std::int64_t batch = reference_batch;
  for (std::size_t k = 0; k < examples.size(); ++k) {
    if (!critical[k]) continue;
    std::int64_t grown = batch;
    while (*critical[k] >= 2 * grown) grown *= 2;
    if (grown == batch) continue;
    if (examples[k] > 0) w.stages.push_back({batch, examples[k]});
    batch = grown;
  }
  w.final_batch = batch;
  return w;
}

namespace {

double mean(const std::vector<double>& v) {
  double s = 0;
  for (const double x : v) s += x;
  return v.empty() ? kNaN : s / static_cast<double>(v.size());
}

double number_or_nan(const json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : kNaN;
}

// One checkpoint of the curve: each branch batch's loss (its best factor's
// mean over seeds) and rate, the critical batch, and the references' B_simple.
struct CurvePoint {
  std::int64_t examples = 0;
  std::vector<double> loss, lr;
  std::optional<std::size_t> critical;
  double b_simple = kNaN, reference_val_loss = kNaN;
};

std::vector<CurvePoint> read_curve(const CbsConfig& c, const CbsFolder& l) {
  std::vector<CurvePoint> out;
  for (const auto e : c.cbs.checkpoints) {
    CurvePoint p;
    p.examples = e;
    std::vector<double> gns, val;
    for (const auto seed : c.sweep.seeds) {
      const json j = read_json(l.point(seed, e, ".json").string());
      gns.push_back(number_or_nan(j, "b_simple"));
      val.push_back(number_or_nan(j, "val_loss"));
    }
    p.b_simple = mean(gns);
    p.reference_val_loss = mean(val);
    for (const auto batch : c.cbs.branch_batches) {
      double best = kNaN, best_lr = kNaN;
      for (std::size_t f = 0; f < c.cbs.lr_factors.size(); ++f) {
        std::vector<double> losses;
        double lr = kNaN;
        for (const auto seed : c.sweep.seeds) {
          const json j = read_json((l.branch(e, batch, f, seed) / "result.json").string());
          const double v = number_or_nan(j, "val_loss");
          losses.push_back(std::isfinite(v) ? v : std::numeric_limits<double>::infinity());
          lr = number_or_nan(j, "lr");
        }
        const double m = mean(losses);
        if (std::isfinite(m) && !(m >= best)) {
          best = m;
          best_lr = lr;
        }
      }
      p.loss.push_back(best);
      p.lr.push_back(best_lr);
    }
    p.critical = critical_index(p.loss, c.cbs.tolerance);
    out.push_back(p);
  }
  return out;
}

// The curve for TensorBoard, by examples seen: the critical batch, B_simple,
// each branch's loss (a new file each time cbs.csv is written).
void write_curve_events(const CbsConfig& c, const std::vector<CurvePoint>& curve, const fs::path& dir) {
  if (!c.sweep.base.tensorboard) {
    fs::remove(dir / tensorboard::kEventFileName);
    return;
  }
  tensorboard::EventWriter events(dir.string());
  for (const CurvePoint& p : curve) {
    std::vector<tensorboard::Event::Scalar> scalars;
    if (p.critical) {
      scalars.push_back({"cbs/critical_batch", static_cast<float>(c.cbs.branch_batches[*p.critical])});
    }
    if (std::isfinite(p.b_simple)) scalars.push_back({"cbs/b_simple", static_cast<float>(p.b_simple)});
    for (std::size_t i = 0; i < p.loss.size(); ++i) {
      if (std::isfinite(p.loss[i])) {
        scalars.push_back({"branch_loss/b" + std::to_string(c.cbs.branch_batches[i]), static_cast<float>(p.loss[i])});
      }
    }
    events.scalars(p.examples, scalars);
  }
}

std::string curve_csv(const CbsConfig& c, const std::vector<CurvePoint>& curve) {
  std::ostringstream s;
  s << "checkpoint,examples,critical_batch,next_batch,b_simple,reference_val_loss";
  for (const auto b : c.cbs.branch_batches) s << ",loss_b" << b;
  for (const auto b : c.cbs.branch_batches) s << ",lr_b" << b;
  s << "\n";
  const auto& batches = c.cbs.branch_batches;
  for (std::size_t k = 0; k < curve.size(); ++k) {
    const CurvePoint& p = curve[k];
    s << k << "," << p.examples << ",";
    if (p.critical) s << batches[*p.critical];
    s << ",";
    if (p.critical && *p.critical + 1 < batches.size()) s << batches[*p.critical + 1];
    s << "," << csv_number(p.b_simple) << "," << csv_number(p.reference_val_loss);
    for (const double x : p.loss) s << "," << csv_number(x);
    for (const double x : p.lr) s << "," << csv_number(x);
    s << "\n";
  }
  return s.str();
}

}  // namespace

json schedule_patch(const CbsConfig& c, const BatchWarmup& w) {
  schedules::ScheduleSpec spec = c.sweep.base.schedule;
  spec.batch_warmup = w.stages;
  json s = schedules::to_json(spec);
  s.erase("base_lr");
  return {{"batch_sizes", {w.final_batch}}, {"search", {{"lr", {c.cbs.reference_lr}}}}, {"schedule", s}};
}

BatchWarmup warmup_of(const json& patch) {
  // Types checked before reading (a hand-edited schedule.json): get<> of a
  // float as an integer is undefined behaviour, not an error.
  const auto integer = [](const json& v, const char* what) {
    if (!v.is_number_integer()) throw std::runtime_error(std::string("schedule.json: ") + what + " is not an integer");
    return v.get<std::int64_t>();
  };
  BatchWarmup w;
  w.final_batch = integer(patch.at("batch_sizes").at(0), "batch_sizes[0]");
  const json stages = patch.at("schedule").value("batch_warmup", json::array());
  if (!stages.is_array()) throw std::runtime_error("schedule.json: schedule.batch_warmup is not a list");
  for (const auto& st : stages) {
    w.stages.push_back({integer(st.at("batch"), "a stage's batch"), integer(st.at("until_examples"), "until_examples")});
  }
  return w;
}

BatchWarmup write_curve(const CbsConfig& c, const CbsFolder& folder) {
  const auto curve = read_curve(c, folder);
  std::vector<std::int64_t> examples;
  std::vector<std::optional<std::int64_t>> critical;
  for (const auto& p : curve) {
    examples.push_back(p.examples);
    critical.push_back(p.critical ? std::optional<std::int64_t>(c.cbs.branch_batches[*p.critical]) : std::nullopt);
  }
  const BatchWarmup warmup = derive_warmup(examples, critical, c.cbs.reference_batch);
  write_file_atomic((folder.dir / "cbs.csv").string(), curve_csv(c, curve));
  write_curve_events(c, curve, folder.dir);
  write_file_atomic((folder.dir / "schedule.json").string(), schedule_patch(c, warmup).dump(2) + "\n");
  return warmup;
}

std::string compare_csv(const std::vector<CompareRun>& runs, const std::vector<TrialResult>& results) {
  std::ostringstream s;
  s << "run,batch_size,seed,status,steps_to_target,examples_to_target,steps,best_metric\n";
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const TrialResult& r = results[i];
    s << runs[i].kind << "," << runs[i].trial.batch_size << "," << runs[i].trial.seed << "," << to_string(r.status)
      << ",";
    if (r.steps_to_target) s << *r.steps_to_target;
    s << ",";
    if (r.examples_to_target) s << *r.examples_to_target;
    s << "," << r.steps << "," << csv_number(r.best_metric) << "\n";
  }
  return s.str();
}

namespace {

// The --compare runs (compare.csv): per run, its batch, how many seeds
// reached the target, and their mean steps and examples.
std::string comparison_text(const fs::path& dir, const CbsConfig& c) {
  std::ostringstream s;
  s << "comparison to " << to_string(c.sweep.base.target.metric) << " <= " << c.sweep.base.target.threshold
    << " (mean over seeds; compare.csv):\n";
  const CsvTable runs = CsvTable::read((dir / "compare.csv").string());
  struct Sum {
    std::int64_t batch = 0;
    double steps = 0, examples = 0;
    int reached = 0, runs = 0;
  };
  std::vector<std::pair<std::string, Sum>> sums;
  for (std::size_t i = 0; i < runs.rows(); ++i) {
    const std::string& kind = runs.at(i, "run");
    auto it = std::find_if(sums.begin(), sums.end(), [&](const auto& p) { return p.first == kind; });
    if (it == sums.end()) it = sums.insert(sums.end(), {kind, Sum{}});
    Sum& m = it->second;
    m.batch = runs.integer(i, "batch_size").value_or(0);
    ++m.runs;
    if (const auto steps = runs.number(i, "steps_to_target")) {
      ++m.reached;
      m.steps += *steps;
      m.examples += runs.number(i, "examples_to_target").value_or(0);
    }
  }
  s << std::setw(10) << "run" << std::setw(8) << "batch" << std::setw(10) << "reached" << std::setw(10) << "steps"
    << std::setw(12) << "examples" << "\n";
  for (const auto& [name, m] : sums) {
    s << std::setw(10) << name << std::setw(8) << m.batch << std::setw(10)
      << (std::to_string(m.reached) + "/" + std::to_string(m.runs));
    if (m.reached == m.runs && m.runs > 0) {
      s << std::setw(10) << std::llround(m.steps / m.runs) << std::setw(12) << std::llround(m.examples / m.runs);
    } else {
      s << std::setw(10) << "-" << std::setw(12) << "-";
    }
    s << "\n";
  }
  return s.str();
}

}  // namespace

std::string cbs_report(const std::string& folder) {
  const fs::path dir(folder);
  // The resolved config parses as given, once the machine it ran on is set aside.
  json resolved = read_json((dir / "cbs.json").string());
  resolved.erase("machine");
  const CbsConfig c = parse_cbs(resolved);
  std::ostringstream s;
  s << "critical batch size of " << c.sweep.base.sweep << " (Merrill et al. 2025): reference batch "
    << c.cbs.reference_batch << " at rate " << c.cbs.reference_lr << ", window " << c.cbs.window
    << " examples, tolerance " << (c.cbs.tolerance.relative ? "relative " : "absolute ") << c.cbs.tolerance.value
    << " on val_loss\n";
  s << std::setw(12) << "examples" << std::setw(16) << "critical batch" << std::setw(12) << "B_simple"
    << std::setw(14) << "ref val_loss" << "\n";
  const CsvTable curve = CsvTable::read((dir / "cbs.csv").string());
  const auto shown = [](const std::optional<double>& x) {
    if (!x) return std::string("-");
    std::ostringstream o;
    o << std::setprecision(4) << *x;
    return o.str();
  };
  for (std::size_t i = 0; i < curve.rows(); ++i) {
    const std::string& at = curve.at(i, "critical_batch");
    const std::string& next = curve.at(i, "next_batch");
    const std::string critical = at.empty() ? "-" : next.empty() ? ">= " + at : at + "-" + next;
    s << std::setw(12) << curve.at(i, "examples") << std::setw(16) << critical << std::setw(12)
      << shown(curve.number(i, "b_simple")) << std::setw(14) << shown(curve.number(i, "reference_val_loss")) << "\n";
  }
  const BatchWarmup warmup = warmup_of(read_json((dir / "schedule.json").string()));
  s << "batch-size warmup (schedule.json): ";
  for (const auto& st : warmup.stages) s << st.batch << " until " << st.until_examples << " examples, ";
  s << (warmup.stages.empty() ? "none: the measured critical batch never reached twice the reference batch; "
                              : "then ")
    << warmup.final_batch << "\n";
  if (fs::exists(dir / "compare.csv")) s << comparison_text(dir, c);
  return s.str();
}

}  // namespace bigbatch::experiments
