// bigbatch cbs (cbs.h): config, the reference runs and their checkpoints,
// the branches, cbs.csv, the derived warmup and the three-way comparison.
#include "cbs.h"

#include "files.h"
#include "preflight.h"
#include "progress.h"
#include "results.h"
#include "tensorboard.h"
#include "trial.h"
#include "trial_folder.h"
#include "workers.h"
#include "../schedules/json_reader.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>

namespace bigbatch::experiments {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string num(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

// "checkpoints": a list of examples, or {"first", "last", "count"} spaced
// evenly in log(examples); each rounded to a multiple of the reference batch.
std::vector<std::int64_t> read_checkpoints(const json& value, std::int64_t batch) {
  std::vector<std::int64_t> out;
  if (value.is_object()) {
    schedules::JsonReader r(value, "cbs.checkpoints");
    const std::int64_t first = r.integer("first");
    const std::int64_t last = r.integer("last");
    const std::int64_t count = r.integer("count");
    r.finish();
    if (first <= 0) schedules::config_error("cbs.checkpoints.first", "must be > 0, got " + std::to_string(first));
    if (last <= first) {
      schedules::config_error("cbs.checkpoints.last", "must be > first (" + std::to_string(first) + "), got " +
                                                          std::to_string(last));
    }
    if (count < 2) schedules::config_error("cbs.checkpoints.count", "must be >= 2, got " + std::to_string(count));
    for (std::int64_t i = 0; i < count; ++i) {
      const double e = static_cast<double>(first) *
                       std::pow(static_cast<double>(last) / static_cast<double>(first),
                                static_cast<double>(i) / static_cast<double>(count - 1));
      const std::int64_t rounded = std::max<std::int64_t>(1, std::llround(e / static_cast<double>(batch))) * batch;
      if (!out.empty() && rounded <= out.back()) {
        schedules::config_error("cbs.checkpoints.count", std::to_string(count) + " checkpoints between " +
                                                             std::to_string(first) + " and " + std::to_string(last) +
                                                             " collide once rounded to multiples of the reference "
                                                             "batch (" + std::to_string(batch) + "); use fewer");
      }
      out.push_back(rounded);
    }
    return out;
  }
  if (!value.is_array() || value.empty()) {
    schedules::config_error("cbs.checkpoints", "expected a non-empty list of examples or {first, last, count}");
  }
  for (std::size_t i = 0; i < value.size(); ++i) {
    const std::string key = "cbs.checkpoints[" + std::to_string(i) + "]";
    if (!value[i].is_number_integer()) schedules::config_error(key, "expected an integer (examples seen)");
    const auto e = value[i].get<std::int64_t>();
    if (e < 0 || e % batch != 0) {
      schedules::config_error(key, "must be a multiple of cbs.reference_batch (" + std::to_string(batch) +
                                       ") and >= 0, got " + std::to_string(e));
    }
    if (!out.empty() && e <= out.back()) {
      schedules::config_error(key, "must be greater than the one before (" + std::to_string(out.back()) +
                                       "), got " + std::to_string(e));
    }
    out.push_back(e);
  }
  return out;
}

CbsSpec read_cbs(const json& value) {
  schedules::JsonReader r(value, "cbs");
  CbsSpec c;
  c.reference_batch = r.integer("reference_batch");
  if (c.reference_batch <= 0) {
    schedules::config_error("cbs.reference_batch", "must be > 0, got " + std::to_string(c.reference_batch));
  }
  c.reference_lr = r.number("reference_lr");
  if (!(c.reference_lr > 0)) schedules::config_error("cbs.reference_lr", "must be > 0, got " + num(c.reference_lr));
  const json* checkpoints = r.raw("checkpoints");
  if (checkpoints == nullptr) schedules::config_error("cbs.checkpoints", "missing (a list or {first, last, count})");
  c.checkpoints = read_checkpoints(*checkpoints, c.reference_batch);
  c.branch_batches = r.integers("branch_batches", {});
  if (c.branch_batches.size() < 2) {
    schedules::config_error("cbs.branch_batches", "needs at least 2 batch sizes, got " +
                                                      std::to_string(c.branch_batches.size()));
  }
  for (std::size_t i = 0; i < c.branch_batches.size(); ++i) {
    const auto b = c.branch_batches[i];
    const std::string key = "cbs.branch_batches[" + std::to_string(i) + "]";
    if (b <= 0) schedules::config_error(key, "must be > 0, got " + std::to_string(b));
    if (i > 0 && b <= c.branch_batches[i - 1]) {
      schedules::config_error(key, "must be greater than the one before (" + std::to_string(c.branch_batches[i - 1]) +
                                       "), got " + std::to_string(b));
    }
  }
  if (std::find(c.branch_batches.begin(), c.branch_batches.end(), c.reference_batch) == c.branch_batches.end()) {
    schedules::config_error("cbs.branch_batches", "must include cbs.reference_batch (" +
                                                      std::to_string(c.reference_batch) + ")");
  }
  c.window = r.integer("window");
  if (c.window <= 0) schedules::config_error("cbs.window", "must be > 0, got " + std::to_string(c.window));
  for (const auto b : c.branch_batches) {
    if (c.window % b != 0) {
      schedules::config_error("cbs.window", "must be a multiple of every branch batch, so that each trains the "
                                            "same examples; " + std::to_string(c.window) +
                                                " is not a multiple of " + std::to_string(b));
    }
  }
  if (r.has("tolerance")) {
    schedules::JsonReader t = r.object("tolerance");
    const auto absolute = t.optional_number("absolute");
    const auto relative = t.optional_number("relative");
    t.finish();
    if (absolute.has_value() == relative.has_value()) {
      schedules::config_error("cbs.tolerance", "give exactly one of \"absolute\" and \"relative\"");
    }
    c.tolerance = {relative.has_value(), relative.value_or(absolute.value_or(0))};
    if (!(c.tolerance.value >= 0) || !std::isfinite(c.tolerance.value)) {
      schedules::config_error(std::string("cbs.tolerance.") + (c.tolerance.relative ? "relative" : "absolute"),
                              "must be >= 0, got " + num(c.tolerance.value));
    }
  }
  c.lr_factors = r.numbers("lr_factors", c.lr_factors);
  if (c.lr_factors.empty()) schedules::config_error("cbs.lr_factors", "must not be empty");
  for (std::size_t i = 0; i < c.lr_factors.size(); ++i) {
    if (!(c.lr_factors[i] > 0) || !std::isfinite(c.lr_factors[i])) {
      schedules::config_error("cbs.lr_factors[" + std::to_string(i) + "]", "must be > 0, got " + num(c.lr_factors[i]));
    }
  }
  r.finish();
  return c;
}

json cbs_json(const CbsSpec& c) {
  return {{"reference_batch", c.reference_batch},
          {"reference_lr", c.reference_lr},
          {"checkpoints", c.checkpoints},
          {"branch_batches", c.branch_batches},
          {"window", c.window},
          {"tolerance", {{c.tolerance.relative ? "relative" : "absolute", c.tolerance.value}}},
          {"lr_factors", c.lr_factors}};
}

// Runs fn(i) for i in [0, count), `jobs` at a time (run_cbs allows only one
// under a process group), each thread with cores / jobs / local ranks
// intra-op threads.
template <typename Fn>
void for_each_job(std::size_t count, int jobs, distributed::ProcessGroup* group, Fn&& fn) {
  jobs = std::max(1, std::min<int>(jobs, static_cast<int>(std::max<std::size_t>(1, count))));
  std::atomic<std::size_t> next{0};
  run_workers(
      jobs, threads_per_job(jobs, group != nullptr ? group->local_size() : 1),
      [&]() -> std::optional<std::size_t> {
        const std::size_t i = next++;
        return i < count ? std::optional<std::size_t>(i) : std::nullopt;
      },
      fn);
}

// Rank 0's answer, on every rank (its own without a group).
bool agreed(distributed::ProcessGroup* group, bool value) {
  if (group == nullptr) return value;
  std::vector<at::Tensor> flag{at::full({1}, value ? 1 : 0, at::kLong)};
  group->broadcast(flag, 0);
  return flag[0].item<std::int64_t>() != 0;
}

// The paths of one cbs folder.
struct Layout {
  fs::path dir;
  fs::path reference(std::uint64_t seed) const { return dir / ("reference_s" + std::to_string(seed)); }
  fs::path point(std::uint64_t seed, std::int64_t examples, const char* ext) const {
    return reference(seed) / "checkpoints" / ("e" + std::to_string(examples) + ext);
  }
  fs::path branch(std::int64_t examples, std::int64_t batch, std::size_t factor, std::uint64_t seed) const {
    return dir / "branches" /
           ("e" + std::to_string(examples) + "_b" + std::to_string(batch) + "_f" + std::to_string(factor) + "_s" +
            std::to_string(seed));
  }
};

// The reference run of one seed at the reference batch and rate.
TrialConfig reference_trial(const CbsConfig& c, std::uint64_t seed) {
  TrialConfig t = c.sweep.base;
  t.name = "reference_s" + std::to_string(seed);
  t.batch_size = c.cbs.reference_batch;
  t.seed = seed;
  t.schedule.base_lr = c.cbs.reference_lr;
  const std::int64_t steps = std::max<std::int64_t>(1, c.cbs.checkpoints.back() / c.cbs.reference_batch);
  t.budget = {static_cast<double>(steps), schedules::Unit::kSteps};
  t.checkpoint_every = 0;
  t.tensorboard = false;
  return t;
}

// A branch: the reference's state at a checkpoint, then `window` examples
// at `batch` and the scaled rate times the factor, evaluated at the end.
TrialConfig branch_trial(const CbsConfig& c, std::int64_t examples, std::int64_t batch, std::size_t factor,
                         std::uint64_t seed) {
  TrialConfig t = reference_trial(c, seed);
  t.name = Layout{}.branch(examples, batch, factor, seed).filename().string();
  t.batch_size = batch;
  t.schedule.base_lr = c.cbs.reference_lr * c.cbs.lr_factors[factor];
  const std::int64_t steps = c.cbs.window / batch;
  t.budget = {static_cast<double>(steps), schedules::Unit::kSteps};
  t.target = {Metric::kValLoss, -1.0, steps};  // never reached: the window runs whole
  return t;
}

// The checkpoint bytes of reference `seed` at examples `e`, once they exist
// (the .json beside them is written after them).
bool point_saved(const Layout& l, std::uint64_t seed, std::int64_t e) {
  return fs::exists(l.point(seed, e, ".json")) && fs::exists(l.point(seed, e, ".pt"));
}

// Trains reference `seed` through every checkpoint, from its last saved one.
void run_reference(const CbsConfig& c, const Dataset& data, const Layout& l, std::uint64_t seed,
                   distributed::ProcessGroup* group) {
  const bool writer = group == nullptr || group->rank() == 0;
  const auto& points = c.cbs.checkpoints;
  std::size_t have = 0;  // points[0, have) are saved
  while (have < points.size() && agreed(group, writer && point_saved(l, seed, points[have]))) ++have;
  if (have == points.size()) return;
  const TrialConfig t = reference_trial(c, seed);
  Trainer trainer(t, data, group);
  if (have > 0) {
    std::string bytes = writer ? read_file(l.point(seed, points[have - 1], ".pt").string()) : std::string();
    if (group != nullptr) bytes = distributed::broadcast_bytes(*group, bytes);
    trainer.restore(bytes);
    if (writer) std::cerr << t.name << ": resuming from its checkpoint at " << points[have - 1] << " examples\n";
  }
  std::optional<tensorboard::EventWriter> events;  // one event per checkpoint, by the reference's step
  if (writer) {
    fs::create_directories(l.reference(seed) / "checkpoints");
    write_file_atomic((l.reference(seed) / "config.json").string(), to_json(t).dump(2) + "\n");
    if (c.sweep.base.tensorboard) {
      events.emplace(l.reference(seed).string(), have > 0 ? points[have - 1] / c.cbs.reference_batch : -1);
    } else {
      fs::remove(l.reference(seed) / tensorboard::kEventFileName);
    }
  }
  const auto start = std::chrono::steady_clock::now();
  double loss_sum = 0;
  std::int64_t losses = 0;
  for (std::size_t k = have; k < points.size(); ++k) {
    const std::int64_t step = points[k] / c.cbs.reference_batch;
    while (trainer.step() < step) {
      loss_sum += trainer.train_step().front();
      ++losses;
    }
    const auto [val_loss, val_error] = trainer.evaluate().front();
    const std::string bytes = trainer.checkpoint();
    if (!writer) continue;
    const double train_loss = losses > 0 ? loss_sum / static_cast<double>(losses) : kNaN;
    const double b_simple = trainer.b_simple();
    write_file_atomic(l.point(seed, points[k], ".pt").string(), bytes);
    const json j = {{"step", step},
                    {"examples", points[k]},
                    {"train_loss", finite_or_null(train_loss)},
                    {"val_loss", finite_or_null(val_loss)},
                    {"val_error", finite_or_null(val_error)},
                    {"b_simple", finite_or_null(b_simple)}};
    write_file_atomic(l.point(seed, points[k], ".json").string(), j.dump(2) + "\n");
    if (events) {
      std::vector<tensorboard::Event::Scalar> scalars{{"val/loss", static_cast<float>(val_loss)},
                                                      {"examples", static_cast<float>(points[k])}};
      for (const auto& [tag, value] : {std::pair<const char*, double>{"train/loss", train_loss},
                                       {"val/error", val_error}, {"gns/b_simple", b_simple}}) {
        if (std::isfinite(value)) scalars.push_back({tag, static_cast<float>(value)});
      }
      events->scalars(step, scalars);
    }
    std::cerr << t.name << ": checkpoint " << k + 1 << "/" << points.size() << " at " << points[k]
              << " examples (step " << step << ", val_loss " << val_loss << ", "
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() << " s)\n";
    loss_sum = 0;
    losses = 0;
  }
}

// Whether `dir` holds the result.json of branch `t` (of this config).
bool branch_finished(const TrialConfig& t, const fs::path& dir) {
  try {
    if (!fs::exists(dir / "result.json")) return false;
    const json j = read_json((dir / "result.json").string());
    return j.is_object() && j.contains("config") && identity(j["config"]) == identity(to_json(t));
  } catch (const std::exception&) {
    std::cerr << "warning: " << (dir / "result.json").string() << ": not readable; redoing " << t.name << "\n";
    return false;
  }
}

struct Branch {
  std::int64_t examples, batch;
  std::size_t factor;
  std::uint64_t seed;
};

void run_branch(const CbsConfig& c, const Dataset& data, const Layout& l, const Branch& b,
                distributed::ProcessGroup* group, ProgressBoard& board) {
  const bool writer = group == nullptr || group->rank() == 0;
  const TrialConfig t = branch_trial(c, b.examples, b.batch, b.factor, b.seed);
  std::string bytes = writer ? read_file(l.point(b.seed, b.examples, ".pt").string()) : std::string();
  if (group != nullptr) bytes = distributed::broadcast_bytes(*group, bytes);
  Trainer trainer(t, data, group);
  trainer.branch_from(bytes);
  Trainer::Hooks hooks;
  if (writer) hooks.progress = [&](const TrialProgress& p) { board.update(t.name, p); };
  const TrialResult r = trainer.run(hooks).front();
  if (!writer) return;
  const double loss = r.rows.empty() ? kNaN : r.rows.back().val_loss;
  const fs::path dir = l.branch(b.examples, b.batch, b.factor, b.seed);
  fs::create_directories(dir);
  const json j = {{"config", to_json(t)},
                  {"from_examples", b.examples},
                  {"batch_size", b.batch},
                  {"lr", r.peak_lr},
                  {"status", to_string(r.status)},
                  {"steps", r.steps},
                  {"val_loss", finite_or_null(loss)},
                  {"val_error", finite_or_null(r.rows.empty() ? kNaN : r.rows.back().val_error)},
                  {"wall_time", r.wall_time}};
  write_file_atomic((dir / "result.json").string(), j.dump(2) + "\n");
  board.finished(t.name, r, Metric::kValLoss);
}

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

std::vector<CurvePoint> read_curve(const CbsConfig& c, const Layout& l) {
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

// schedule.json: a merge patch that turns the workload into the warmup run.
json schedule_patch(const CbsConfig& c, const BatchWarmup& w) {
  schedules::ScheduleSpec spec = c.sweep.base.schedule;
  spec.batch_warmup = w.stages;
  json s = schedules::to_json(spec);
  s.erase("base_lr");
  return {{"batch_sizes", {w.final_batch}}, {"search", {{"lr", {c.cbs.reference_lr}}}}, {"schedule", s}};
}

// The warmup a schedule_patch holds.
BatchWarmup warmup_of(const json& patch) {
  BatchWarmup w;
  w.final_batch = patch.at("batch_sizes").at(0).get<std::int64_t>();
  for (const auto& st : patch.at("schedule").value("batch_warmup", json::array())) {
    w.stages.push_back({st.at("batch").get<std::int64_t>(), st.at("until_examples").get<std::int64_t>()});
  }
  return w;
}

// --compare: the fixed reference batch, a fixed large batch (the warmup's
// last, or the largest branch batch when the warmup never doubles) and the
// warmup, each to the target.
struct CompareRun {
  const char* kind;
  TrialConfig trial;
};

std::vector<CompareRun> compare_runs(const CbsConfig& c, const BatchWarmup& w) {
  const std::int64_t large =
      w.final_batch > c.cbs.reference_batch ? w.final_batch : c.cbs.branch_batches.back();
  std::vector<CompareRun> out;
  for (const auto seed : c.sweep.seeds) {
    const auto make = [&](const char* kind, std::int64_t batch, bool warm) {
      TrialConfig t = c.sweep.base;
      t.batch_size = batch;
      t.seed = seed;
      t.schedule.base_lr = c.cbs.reference_lr;
      if (warm) t.schedule.batch_warmup = w.stages;
      std::ostringstream name;
      name << kind << "_b" << batch << "_s" << seed;
      t.name = name.str();
      out.push_back({kind, t});
    };
    make("small", c.cbs.reference_batch, false);
    make("large", large, false);
    make("warmup", w.final_batch, true);
  }
  return out;
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

// A finished compare run's result from its folder.
TrialResult result_of(const json& summary) {
  TrialResult r;
  r.status = schedules::enum_value(kTrialStatuses, summary.value("status", std::string("not_reached")), "status");
  if (summary.contains("steps_to_target") && summary["steps_to_target"].is_number_integer()) {
    r.steps_to_target = summary["steps_to_target"].get<std::int64_t>();
  }
  if (summary.contains("examples_to_target") && summary["examples_to_target"].is_number_integer()) {
    r.examples_to_target = summary["examples_to_target"].get<std::int64_t>();
  }
  r.steps = summary.value("steps", std::int64_t{0});
  r.best_metric = number_or_nan(summary, "best_metric");
  return r;
}

void run_compare(const CbsConfig& c, const BatchWarmup& w, const Dataset& data, const fs::path& dir, int jobs,
                 distributed::ProcessGroup* group) {
  const bool writer = group == nullptr || group->rank() == 0;
  const auto runs = compare_runs(c, w);
  std::vector<TrialResult> results(runs.size());
  std::vector<std::size_t> left;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const fs::path folder = dir / "compare" / runs[i].trial.name;
    std::optional<json> done;
    if (writer) done = finished_summary(runs[i].trial, folder.string());
    if (agreed(group, done.has_value())) {
      if (writer) results[i] = result_of(*done);
    } else {
      left.push_back(i);
    }
  }
  ProgressBoard board(static_cast<std::int64_t>(left.size()));
  for_each_job(left.size(), jobs, group, [&](std::size_t k) {
    const CompareRun& run = runs[left[k]];
    FolderHooks hooks;
    hooks.progress = [&](const TrialProgress& p) { board.update(run.trial.name, p); };
    results[left[k]] = run_one(run.trial, data, (dir / "compare" / run.trial.name).string(), hooks, group);
    if (writer) board.finished(run.trial.name, results[left[k]], run.trial.target.metric);
  });
  if (writer) write_file_atomic((dir / "compare.csv").string(), compare_csv(runs, results));
}

}  // namespace

CbsConfig parse_cbs(const json& j) {
  if (!j.is_object()) throw ConfigError("a cbs config must be a JSON object");
  if (!j.contains("cbs")) throw ConfigError("cbs: missing (an object: reference_batch, reference_lr, checkpoints, ...)");
  for (const char* key : {"batch_sizes", "search", "variants"}) {
    if (j.contains(key)) {
      throw ConfigError(std::string(key) + ": not a key of a cbs config (cbs.reference_batch, cbs.reference_lr and "
                                           "cbs.branch_batches set the batches and rates)");
    }
  }
  CbsConfig c;
  try {
    if (!j.at("cbs").is_object()) schedules::config_error("cbs", "expected an object");
    c.cbs = read_cbs(j.at("cbs"));
  } catch (const c10::Error& e) {
    throw ConfigError(e.what_without_backtrace());
  }
  json workload = j;
  workload.erase("cbs");
  if (workload.contains("schedule") && workload["schedule"].is_object()) {
    json& s = workload["schedule"];
    if (s.contains("base_batch") && s["base_batch"] != json(c.cbs.reference_batch)) {
      throw ConfigError("schedule.base_batch: set by cbs.reference_batch (" + std::to_string(c.cbs.reference_batch) +
                        ") in a cbs config, got " + s["base_batch"].dump());
    }
    s["base_batch"] = c.cbs.reference_batch;
  } else if (!workload.contains("schedule")) {
    workload["schedule"] = {{"base_batch", c.cbs.reference_batch}};
  }
  workload["batch_sizes"] = c.cbs.branch_batches;
  workload["search"] = {{"lr", {c.cbs.reference_lr}}};
  c.sweep = parse_sweep(workload);
  const schedules::ScheduleSpec& s = c.sweep.base.schedule;
  if (s.warmup.length != 0 || s.decay.type != schedules::DecayType::kConstant || s.batch_increase ||
      !s.batch_warmup.empty() || s.regime_adaptation) {
    throw ConfigError("schedule: a cbs reference and its branches train at a constant rate (the scaling rule sets "
                      "each branch's), so no warmup, decay, batch_increase, batch_warmup or regime_adaptation");
  }
  if (c.sweep.base.checkpoint_every != 0) {
    throw ConfigError("checkpoint_every: not a key of a cbs config (cbs.checkpoints says where the reference saves)");
  }
  return c;
}

CbsConfig load_cbs(const std::string& path) {
  const json j = read_config(path);
  try {
    return parse_cbs(j);
  } catch (const ConfigError& e) {
    throw ConfigError(path + ": " + e.what());
  }
}

json to_json(const CbsConfig& c) {
  json j = to_json(c.sweep);
  j.erase("batch_sizes");
  j.erase("search");
  j.erase("runner");
  j["cbs"] = cbs_json(c.cbs);
  return j;
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

CbsSummary run_cbs(const CbsConfig& c, const CbsOptions& options, distributed::ProcessGroup* group) {
  const auto start = std::chrono::steady_clock::now();
  check_jobs(options.jobs, group != nullptr, "cbs runs one branch");
  const bool writer = group == nullptr || group->rank() == 0;
  if (group != nullptr) check_world(c.sweep, group->size());
  const Layout l{fs::path(options.out) / c.sweep.base.sweep};
  const json resolved = to_json(c);
  if (writer && fs::exists(l.dir / "cbs.json")) {
    if (const auto where = identity_difference(read_json((l.dir / "cbs.json").string()), resolved)) {
      throw ConfigError(l.dir.string() + " holds a different cbs config \"" + c.sweep.base.sweep +
                        "\" (first difference at " + *where + "); use another --out or name");
    }
  }
  if (writer) check_folder(l.dir.string(), "--out");
  const Dataset data = load_data(c.sweep);
  if (writer) write_file_atomic((l.dir / "cbs.json").string(), resolved.dump(2) + "\n");

  // The references, one per seed (in parallel with --jobs), then the branches.
  for_each_job(c.sweep.seeds.size(), options.jobs, group,
               [&](std::size_t i) { run_reference(c, data, l, c.sweep.seeds[i], group); });
  std::vector<Branch> all, left;
  for (const auto e : c.cbs.checkpoints) {
    for (const auto b : c.cbs.branch_batches) {
      for (std::size_t f = 0; f < c.cbs.lr_factors.size(); ++f) {
        for (const auto seed : c.sweep.seeds) all.push_back({e, b, f, seed});
      }
    }
  }
  for (const Branch& b : all) {
    const bool done = writer && branch_finished(branch_trial(c, b.examples, b.batch, b.factor, b.seed),
                                                l.branch(b.examples, b.batch, b.factor, b.seed));
    if (!agreed(group, done)) left.push_back(b);
  }
  CbsSummary summary;
  summary.dir = l.dir.string();
  summary.branches = static_cast<std::int64_t>(all.size());
  summary.skipped = summary.branches - static_cast<std::int64_t>(left.size());
  if (writer && summary.skipped > 0) {
    std::cerr << "resuming " << l.dir.string() << ": " << summary.skipped << " of " << summary.branches
              << " branches already finished\n";
  }
  ProgressBoard board(static_cast<std::int64_t>(left.size()));
  for_each_job(left.size(), options.jobs, group,
               [&](std::size_t i) { run_branch(c, data, l, left[i], group, board); });

  std::vector<std::optional<std::int64_t>> critical;
  BatchWarmup warmup;
  if (writer) {
    const auto curve = read_curve(c, l);
    std::vector<std::int64_t> examples;
    for (const auto& p : curve) {
      examples.push_back(p.examples);
      critical.push_back(p.critical ? std::optional<std::int64_t>(c.cbs.branch_batches[*p.critical]) : std::nullopt);
    }
    warmup = derive_warmup(examples, critical, c.cbs.reference_batch);
    write_file_atomic((l.dir / "cbs.csv").string(), curve_csv(c, curve));
    write_curve_events(c, curve, l.dir);
    write_file_atomic((l.dir / "schedule.json").string(), schedule_patch(c, warmup).dump(2) + "\n");
  }
  if (options.compare) {
    if (group != nullptr) {  // the other ranks take rank 0's warmup
      const std::string patch =
          distributed::broadcast_bytes(*group, writer ? schedule_patch(c, warmup).dump() : std::string());
      if (!writer) warmup = warmup_of(json::parse(patch));
    }
    run_compare(c, warmup, data, l.dir, options.jobs, group);
  }
  summary.wall_time = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

namespace {

// The cells of one CSV line (bigbatch's own files: no quoting), at least `n`.
std::vector<std::string> cells_of(const std::string& line, std::size_t n) {
  std::vector<std::string> cells;
  std::stringstream ls(line);
  std::string cell;
  while (std::getline(ls, cell, ',')) cells.push_back(cell);
  cells.resize(std::max(n, cells.size()));
  return cells;
}

}  // namespace

std::string cbs_report(const std::string& folder) {
  const fs::path dir(folder);
  const CbsConfig c = parse_cbs(read_json((dir / "cbs.json").string()));  // the resolved config parses as given
  std::ostringstream s;
  s << "critical batch size of " << c.sweep.base.sweep << " (Merrill et al. 2025): reference batch "
    << c.cbs.reference_batch << " at rate " << c.cbs.reference_lr << ", window " << c.cbs.window
    << " examples, tolerance " << (c.cbs.tolerance.relative ? "relative " : "absolute ") << c.cbs.tolerance.value
    << " on val_loss\n";
  s << std::setw(12) << "examples" << std::setw(16) << "critical batch" << std::setw(12) << "B_simple"
    << std::setw(14) << "ref val_loss" << "\n";
  std::istringstream csv(read_file((dir / "cbs.csv").string()));
  std::string line;
  std::getline(csv, line);  // header
  while (std::getline(csv, line)) {
    const auto cells = cells_of(line, 6);
    std::string critical = cells[2].empty() ? "-" : cells[2];
    if (!cells[2].empty()) critical = cells[3].empty() ? ">= " + cells[2] : cells[2] + "-" + cells[3];
    const auto shown = [](const std::string& x) {
      if (x.empty()) return std::string("-");
      std::ostringstream o;
      o << std::setprecision(4) << std::stod(x);
      return o.str();
    };
    s << std::setw(12) << cells[1] << std::setw(16) << critical << std::setw(12) << shown(cells[4]) << std::setw(14)
      << shown(cells[5]) << "\n";
  }
  const BatchWarmup warmup = warmup_of(read_json((dir / "schedule.json").string()));
  s << "batch-size warmup (schedule.json): ";
  for (const auto& st : warmup.stages) s << st.batch << " until " << st.until_examples << " examples, ";
  s << (warmup.stages.empty() ? "none: the measured critical batch never reached twice the reference batch; "
                              : "then ")
    << warmup.final_batch << "\n";
  if (fs::exists(dir / "compare.csv")) {
    s << "comparison to " << to_string(c.sweep.base.target.metric) << " <= " << c.sweep.base.target.threshold
      << " (mean over seeds; compare.csv):\n";
    std::istringstream cc(read_file((dir / "compare.csv").string()));
    std::getline(cc, line);
    struct Sum {
      std::int64_t batch = 0;
      double steps = 0, examples = 0;
      int reached = 0, runs = 0;
    };
    std::vector<std::pair<std::string, Sum>> sums;
    while (std::getline(cc, line)) {
      const auto cells = cells_of(line, 8);
      auto it = std::find_if(sums.begin(), sums.end(), [&](const auto& p) { return p.first == cells[0]; });
      if (it == sums.end()) it = sums.insert(sums.end(), {cells[0], Sum{}});
      Sum& m = it->second;
      m.batch = std::stoll(cells[1]);
      ++m.runs;
      if (!cells[4].empty()) {
        ++m.reached;
        m.steps += std::stod(cells[4]);
        m.examples += std::stod(cells[5]);
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
  }
  return s.str();
}

}  // namespace bigbatch::experiments
