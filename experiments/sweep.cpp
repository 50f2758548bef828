// The sweep runner (sweep.h). A trial is finished when its summary.json exists
// next to a config.json equal to the trial's config; summary.json is written
// last, so a killed trial is simply redone.
#include <bigbatch/experiments/sweep.h>

#include <bigbatch/noise/critical_batch.h>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#ifndef BIGBATCH_CODE_VERSION
#define BIGBATCH_CODE_VERSION "unknown"
#endif

namespace bigbatch::experiments {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path.string() + ": cannot read");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

json read_json(const fs::path& path) {
  try {
    return json::parse(read_file(path));
  } catch (const json::parse_error& e) {
    throw std::runtime_error(path.string() + ": not valid JSON: " + e.what());
  }
}

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

std::string metrics_csv(const std::vector<EvalRow>& rows) {
  std::ostringstream s;
  s << "step,epoch,examples,train_loss,val_loss,val_error,lr,batch_size,wall_time,gns\n";
  for (const auto& r : rows) {
    s << r.step << ',' << csv_number(r.epoch) << ',' << r.examples << ',' << csv_number(r.train_loss) << ','
      << csv_number(r.val_loss) << ',' << csv_number(r.val_error) << ',' << csv_number(r.lr) << ','
      << r.batch_size << ',' << csv_number(r.wall_time) << ',' << csv_number(r.gns) << '\n';
  }
  return s.str();
}

json summary_json(const TrialConfig& t, const TrialResult& r) {
  json j = {{"trial", t.name},
            {"status", r.status},
            {"steps_to_target", r.steps_to_target ? json(*r.steps_to_target) : json(nullptr)},
            {"examples_to_target", r.examples_to_target ? json(*r.examples_to_target) : json(nullptr)},
            {"steps", r.steps},
            {"budget", r.budget},
            {"metric", t.target.metric},
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

// Shows the trials in flight: one redrawn line on a terminal, plain lines
// every 10 s otherwise, and a line per finished trial either way.
class ProgressBoard {
 public:
  explicit ProgressBoard(std::int64_t total) : total_(total), tty_(isatty(fileno(stderr)) != 0) {}

  void update(const std::string& trial, const TrialProgress& p) {
    std::lock_guard<std::mutex> lock(mutex_);
    live_[trial] = p;
    const auto now = std::chrono::steady_clock::now();
    const double since = std::chrono::duration<double>(now - last_).count();
    if (tty_ ? since < 0.2 : since < 10) return;
    last_ = now;
    std::ostringstream line;
    line << "[" << done_ << "/" << total_ << " done]";
    for (const auto& [name, q] : live_) {
      const double eta = q.steps_per_second > 0 ? static_cast<double>(q.budget - q.step) / q.steps_per_second : 0;
      line << " " << name << " step " << q.step << "/" << q.budget << " "
           << (100 * q.step / std::max<std::int64_t>(1, q.budget)) << "% loss " << std::setprecision(3) << q.loss
           << " " << std::setprecision(3) << q.steps_per_second << " steps/s ETA " << std::fixed
           << std::setprecision(0) << eta << "s" << std::defaultfloat << ";";
    }
    if (tty_) {
      std::string text = line.str();
      if (text.size() > 200) text = text.substr(0, 197) + "...";
      std::cerr << "\r\033[K" << text << std::flush;
    } else {
      std::cerr << line.str() << "\n";
    }
  }

  void finished(const std::string& trial, const TrialResult& r, const std::string& metric) {
    std::lock_guard<std::mutex> lock(mutex_);
    live_.erase(trial);
    ++done_;
    std::ostringstream line;
    line << "[" << done_ << "/" << total_ << "] " << trial << ": " << r.status;
    if (r.steps_to_target) line << " at step " << *r.steps_to_target;
    line << " (best " << metric << " " << std::setprecision(4) << r.best_metric << ", " << r.steps << " steps, "
         << std::setprecision(3) << r.wall_time << " s)";
    std::cerr << (tty_ ? "\r\033[K" : "") << line.str() << "\n";
  }

 private:
  std::mutex mutex_;
  std::int64_t total_;
  std::int64_t done_ = 0;
  bool tty_;
  std::chrono::steady_clock::time_point last_{};
  std::map<std::string, TrialProgress> live_;
};

// Whether the trial folder's config.json is t's (false when missing or unreadable).
bool same_config(const TrialConfig& t, const fs::path& dir) {
  try {
    return fs::exists(dir / "config.json") && read_json(dir / "config.json") == to_json(t);
  } catch (const std::exception&) {
    return false;
  }
}

bool finished(const TrialConfig& t, const fs::path& dir) {
  if (!fs::exists(dir / "summary.json") || !same_config(t, dir)) return false;
  try {
    return read_json(dir / "summary.json").contains("status");
  } catch (const std::exception&) {
    return false;  // unreadable: redo it
  }
}

// steps_to_target.csv and fit.json from the trial folders.
// Returns how many trials reached the target.
std::int64_t write_tables(const std::vector<TrialConfig>& trials, const fs::path& dir) {
  struct Best {
    std::optional<json> reached;  // the fastest trial that reached
    std::optional<json> closest;  // else the one with the best metric
  };
  std::map<std::int64_t, Best> best;
  std::int64_t reached = 0;
  for (const auto& t : trials) {
    json s = read_json(dir / t.name / "summary.json");
    Best& b = best[t.batch_size];
    if (s["status"] == "reached") {
      ++reached;
      if (!b.reached || s["steps_to_target"].get<std::int64_t>() < (*b.reached)["steps_to_target"].get<std::int64_t>()) {
        b.reached = s;
      }
    } else {
      const double m = s["best_metric"].is_number() ? s["best_metric"].get<double>() : std::numeric_limits<double>::infinity();
      const double bm = b.closest && (*b.closest)["best_metric"].is_number() ? (*b.closest)["best_metric"].get<double>()
                                                                            : std::numeric_limits<double>::infinity();
      if (!b.closest || m < bm) b.closest = s;
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

}  // namespace

std::string code_version() { return BIGBATCH_CODE_VERSION; }

std::string libtorch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

void write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw std::runtime_error(tmp + ": cannot write");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp);
    throw std::runtime_error(path + ": cannot rename into place: " + ec.message());
  }
}

TrialResult run_one(const TrialConfig& trial, const Dataset& data, const std::string& dir,
                    const std::function<void(const TrialProgress&)>& progress,
                    distributed::ProcessGroup* group) {
  const bool writer = group == nullptr || group->rank() == 0;
  const fs::path checkpoint = fs::path(dir) / "checkpoint.pt";
  std::string saved;  // the trial's last checkpoint, from an interrupted run of the same config
  if (writer) {
    fs::create_directories(dir);
    fs::remove(fs::path(dir) / "summary.json");  // unfinished until the end
    if (trial.checkpoint_every > 0 && same_config(trial, dir) && fs::exists(checkpoint)) {
      saved = read_file(checkpoint);
    } else {
      fs::remove(checkpoint);  // another config's, or checkpoints are off
    }
    write_file_atomic((fs::path(dir) / "config.json").string(), to_json(trial).dump(2) + "\n");
  }
  if (group != nullptr) saved = distributed::broadcast_bytes(*group, saved);  // rank 0's, to every rank
  Trainer trainer(trial, data, group);
  if (!saved.empty()) {
    trainer.restore(saved);
    if (writer) std::cerr << "resuming " << trial.name << " from its checkpoint at step " << trainer.step() << "\n";
  }
  std::function<void(const std::string&)> on_checkpoint;
  if (writer && trial.checkpoint_every > 0) {
    on_checkpoint = [&](const std::string& bytes) { write_file_atomic(checkpoint.string(), bytes); };
  }
  const TrialResult r = trainer.run(writer ? progress : std::function<void(const TrialProgress&)>(), on_checkpoint);
  if (writer) {
    write_file_atomic((fs::path(dir) / "metrics.csv").string(), metrics_csv(r.rows));
    write_file_atomic((fs::path(dir) / "summary.json").string(), summary_json(trial, r).dump(2) + "\n");
    fs::remove(checkpoint);  // finished: the summary and metrics are the record
  }
  return r;
}

void check_world(const SweepConfig& sweep, int world_size) {
  for (const auto b : sweep.batch_sizes) {
    if (b % world_size != 0) {
      throw ConfigError("batch_sizes: " + std::to_string(b) + " is not divisible by the world size " +
                        std::to_string(world_size));
    }
  }
}

Dataset load_data(const SweepConfig& sweep) {
  Dataset data;
  try {
    data = load_dataset(sweep.base.data);
  } catch (const c10::Error& e) {
    throw ConfigError(std::string("dataset: ") + e.what_without_backtrace());
  } catch (const std::runtime_error& e) {
    throw ConfigError(std::string("dataset: ") + e.what());
  }
  for (const auto b : sweep.batch_sizes) {
    if (b > data.train_size()) {
      throw ConfigError("batch_sizes: " + std::to_string(b) + " is larger than the training set (" +
                        std::to_string(data.train_size()) + " examples)");
    }
    // With batch-size increase the batch grows: its largest must fit too.
    const schedules::Schedule schedule(sweep.base.schedule, b, data.train_size());
    const std::int64_t last = schedule.steps(sweep.base.budget.length, sweep.base.budget.unit);
    const std::int64_t grown = schedule.batch_size(std::max<std::int64_t>(0, last - 1));
    if (grown > data.train_size()) {
      throw ConfigError("schedule.batch_increase: batch " + std::to_string(b) + " grows to " + std::to_string(grown) +
                        ", larger than the training set (" + std::to_string(data.train_size()) + " examples)");
    }
    const std::int64_t k = sweep.base.gns.micro_batches;
    if (k > 0 && b % k != 0) {
      throw ConfigError("batch_sizes: " + std::to_string(b) + " is not divisible by gns.micro_batches " +
                        std::to_string(k));
    }
    if (k > 0 && grown % k != 0) {
      throw ConfigError("schedule.batch_increase: batch " + std::to_string(b) + " grows to " + std::to_string(grown) +
                        ", not divisible by gns.micro_batches " + std::to_string(k));
    }
  }
  return data;
}

SweepSummary run_sweep(const SweepConfig& sweep, const SweepOptions& options, distributed::ProcessGroup* group) {
  const auto start = std::chrono::steady_clock::now();
  if (options.jobs < 1) throw ConfigError("--jobs: must be >= 1, got " + std::to_string(options.jobs));
  if (group != nullptr && options.jobs != 1) {
    throw ConfigError("--jobs: a data-parallel sweep runs one trial at a time on all ranks; got --jobs " +
                      std::to_string(options.jobs));
  }
  const bool writer = group == nullptr || group->rank() == 0;
  if (group != nullptr) check_world(sweep, group->size());
  const fs::path dir = fs::path(options.out) / sweep.base.sweep;
  const json resolved = to_json(sweep);
  if (fs::exists(dir / "sweep.json")) {
    const json existing = read_json(dir / "sweep.json");
    if (existing != resolved) {
      const json patch = json::diff(existing, resolved);
      const std::string where = patch.empty() ? "" : patch[0].value("path", std::string());
      throw ConfigError(dir.string() + " holds a different config for sweep \"" + sweep.base.sweep +
                        "\" (first difference at " + where + "); use another --out or sweep name");
    }
  }
  const Dataset data = load_data(sweep);
  if (writer) {
    fs::create_directories(dir);
    write_file_atomic((dir / "sweep.json").string(), resolved.dump(2) + "\n");
  }

  const std::vector<TrialConfig> trials = expand(sweep);
  // Rank 0 decides what is left (other nodes may not see its files).
  at::Tensor left = at::zeros({static_cast<std::int64_t>(trials.size())}, at::kInt);
  if (writer) {
    for (std::size_t i = 0; i < trials.size(); ++i) {
      left[static_cast<std::int64_t>(i)] = finished(trials[i], dir / trials[i].name) ? 0 : 1;
    }
  }
  if (group != nullptr) {
    std::vector<at::Tensor> mask{left};
    group->broadcast(mask, 0);
    left = mask[0];
  }
  std::vector<const TrialConfig*> pending;
  SweepSummary summary;
  summary.dir = dir.string();
  summary.trials = static_cast<std::int64_t>(trials.size());
  for (std::size_t i = 0; i < trials.size(); ++i) {
    if (left[static_cast<std::int64_t>(i)].item<int>() == 0) {
      ++summary.skipped;
    } else {
      pending.push_back(&trials[i]);
    }
  }
  if (writer && summary.skipped > 0) {
    std::cerr << "resuming " << dir.string() << ": " << summary.skipped << " of " << trials.size()
              << " trials already finished\n";
  }
  ProgressBoard board(static_cast<std::int64_t>(pending.size()));
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int jobs = std::min<int>(options.jobs, static_cast<int>(std::max<std::size_t>(1, pending.size())));
  // Ranks on this machine (torchrun's LOCAL_WORLD_SIZE) share its cores too.
  const char* local_world = std::getenv("LOCAL_WORLD_SIZE");
  const int local_ranks = group != nullptr && local_world != nullptr ? std::max(1, std::atoi(local_world)) : 1;
  const int threads = std::max(1, cores / jobs / local_ranks);
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  const auto worker = [&] {
    at::set_num_threads(threads);  // this thread's intra-op pool: cores / jobs
    while (!failed) {
      const std::size_t i = next++;
      if (i >= pending.size()) return;
      const TrialConfig& t = *pending[i];
      try {
        const TrialResult r = run_one(t, data, (dir / t.name).string(),
                                      [&](const TrialProgress& p) { board.update(t.name, p); }, group);
        if (writer) board.finished(t.name, r, t.target.metric);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int j = 1; j < jobs; ++j) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);

  if (!writer) return summary;
  summary.reached = write_tables(trials, dir);
  summary.wall_time = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

std::string report(const std::string& sweep_dir) {
  const fs::path dir(sweep_dir);
  if (!fs::exists(dir / "steps_to_target.csv")) {
    throw ConfigError(sweep_dir + ": no steps_to_target.csv (not a finished sweep folder)");
  }
  std::istringstream csv(read_file(dir / "steps_to_target.csv"));
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
    const json fit = read_json(dir / "fit.json");
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
