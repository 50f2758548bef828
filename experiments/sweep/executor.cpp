// The Python trial executor's end of the sweep (executor.h).
#include "executor.h"

#include "../../schedules/schedule.h"
#include "../io/config_error.h"
#include "../io/tensorboard.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace bigbatch::experiments {
namespace fs = std::filesystem;
using json = nlohmann::json;

TrialExecutor::TrialExecutor(int read_fd, int write_fd) : in_(read_fd), out_(write_fd) {}

TrialExecutor::~TrialExecutor() {
  ::close(in_);
  ::close(out_);
}

void TrialExecutor::send(const json& message) {
  const std::string line = message.dump() + "\n";
  std::size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(out_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw ExecutorGone(std::string("the trial executor's pipe: ") + std::strerror(errno));
    done += static_cast<std::size_t>(n);
  }
}

json TrialExecutor::receive() {
  for (;;) {
    const std::size_t end = buffer_.find('\n');
    if (end != std::string::npos) {
      const std::string line = buffer_.substr(0, end);
      buffer_.erase(0, end + 1);
      json message = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!message.is_object()) {
        throw std::runtime_error("the trial executor sent a line that is not a JSON object: " + line.substr(0, 200));
      }
      return message;
    }
    char chunk[65536];
    const ssize_t n = ::read(in_, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw ExecutorGone(std::string("the trial executor's pipe: ") + std::strerror(errno));
    if (n == 0) throw ExecutorGone("the trial executor closed its pipe");
    buffer_.append(chunk, static_cast<std::size_t>(n));
  }
}

std::unique_ptr<TrialExecutor> open_executor(const std::string& spec) {
  const auto comma = spec.find(',');
  int fds[2] = {-1, -1};
  try {
    std::size_t used = 0;
    if (comma == std::string::npos) throw std::invalid_argument(spec);
    fds[0] = std::stoi(spec.substr(0, comma), &used);
    if (used != comma) throw std::invalid_argument(spec);
    fds[1] = std::stoi(spec.substr(comma + 1), &used);
    if (used != spec.size() - comma - 1) throw std::invalid_argument(spec);
  } catch (const std::logic_error&) {
    throw ConfigError("--executor: expected two file descriptors R,W (bigbatch.sweep passes them), got '" + spec + "'");
  }
  if (fds[0] == fds[1]) {
    throw ConfigError("--executor: two file descriptors, one to read and one to write, got " + spec);
  }
  for (const int fd : fds) {
    if (fd < 0 || ::fcntl(fd, F_GETFD) == -1) {
      throw ConfigError("--executor: file descriptor " + std::to_string(fd) + " is not open");
    }
  }
  return std::make_unique<TrialExecutor>(fds[0], fds[1]);
}

std::string executor_refusal(const TrialConfig& t) {
  if (t.noise.type != NoiseType::kNone) return "noise: gradient noise is the C++ trainer's";
  if (t.precision != Precision::kFp32) {
    return "precision: " + to_string(t.precision) + " is the C++ trainer's (use autocast in the module's forward)";
  }
  if (!t.distributed.is_default()) return "distributed: data-parallel trials are the C++ trainer's";
  return "";
}

namespace {

double number_or_nan(const json& message, const char* key) {
  const auto it = message.find(key);
  return it != message.end() && it->is_number() ? it->get<double>() : kNaN;
}

std::int64_t integer_at(const json& message, const char* key) {
  const auto it = message.find(key);
  if (it == message.end() || !it->is_number_integer()) {
    throw std::runtime_error(std::string("the trial executor's message lacks an integer \"") + key + "\": " +
                             message.dump().substr(0, 200));
  }
  return it->get<std::int64_t>();
}

// The data report and the executor's own record of a message, into `r`.
void take_reports(const json& message, TrialResult& r) {
  if (const auto d = message.find("data"); d != message.end() && d->is_object()) {
    r.loader_threads = d->value("loader_threads", 0);
    r.data_wait_fraction = number_or_nan(*d, "wait_fraction");
  }
  if (const auto e = message.find("executor"); e != message.end() && e->is_object()) r.data_report = {{"executor", *e}};
}

}  // namespace

namespace {

// Where a run starts: step 0, or a horizon's branch point with its trial's
// result there (rows, best metric, target), which the branch's files begin
// with, as a branch of the C++ trainer's restored from its checkpoint.
struct Start {
  std::int64_t step = 0;
  const TrialResult* parent = nullptr;
  std::vector<std::string> metric_names;
};

TrialResult run_from(const TrialConfig& trial, std::int64_t train_size, std::int64_t threads, const std::string& dir,
                     const FolderHooks& hooks, TrialExecutor& executor, const Start& start) {
  const fs::path folder(dir);
  prepare_folder(trial, folder, false);  // (a checkpoint of this trial would be the C++ trainer's)
  if (start.parent != nullptr) write_branched(folder, start.step);
  const schedules::Schedule schedule(trial.schedule, trial.batch_size, train_size);
  const std::int64_t budget = schedule.steps(trial.budget.length, trial.budget.unit);
  const std::int64_t every = trial.target.eval_every;
  json lr = json::array(), sizes = json::array();
  for (std::int64_t t = 0; t < budget; ++t) {
    lr.push_back(schedule.lr(t));
    const std::int64_t b = schedule.batch_size(t);
    if (b > train_size) {
      throw ConfigError("batch size " + std::to_string(b) + " at step " + std::to_string(t) +
                        " is larger than the training set (" + std::to_string(train_size) + " examples)");
    }
    if (sizes.empty() || sizes.back()[1].get<std::int64_t>() != b) sizes.push_back({t, b});
  }
  json run = {{"trial", trial.name}, {"dir", dir},           {"config", to_json(trial)},
              {"budget", budget},     {"eval_every", every}, {"lr", lr},
              {"batch_size", sizes},  {"threads", threads}};
  if (start.parent != nullptr) run["from"] = start.step;
  executor.send({{"run", run}});
  // The executor waits for an order after each stretch of steps, unless it
  // ended the trial itself ("diverged", "error"): whatever ends the trial
  // here, a return or an exception (a full disk, a hook's failure), that
  // order is a "stop", so the executor never takes the next trial's "run"
  // for one. A horizon run inside a trial gets its own stop, so the
  // trial's stop never ends the horizon instead.
  struct Owed {
    TrialExecutor& executor;
    bool stop = true;
    void send(const std::string& status) {
      stop = false;
      executor.send({{"stop", status}});
    }
    ~Owed() {
      if (!stop) return;
      try {
        executor.send({{"stop", "failed"}});
      } catch (const std::exception&) {  // (gone: nothing waits)
      }
    }
  } owed{executor};

  std::optional<tensorboard::EventWriter> events;
  if (trial.tensorboard) {
    events.emplace(dir, -1);
  } else {
    fs::remove(folder / tensorboard::kEventFileName);  // an earlier run's would contradict this one
  }
  TrialResult r;
  r.budget = budget;
  r.peak_lr = schedule.peak_lr();
  r.best_metric = std::numeric_limits<double>::infinity();
  r.data_wait_fraction = kNaN;
  std::vector<std::string> metric_names = start.metric_names;
  std::int64_t step = start.step;
  if (start.parent != nullptr) {
    r.rows = start.parent->rows;
    r.best_metric = start.parent->best_metric;
    r.steps_to_target = start.parent->steps_to_target;
    r.examples_to_target = start.parent->examples_to_target;
  }
  // Its horizons (run_one's): each branched at its point, unless its folder
  // holds its finished run; such a trial trains past the target, unpruned.
  HorizonBranches plan = horizon_branches(trial, folder, train_size);
  const std::vector<TrialConfig>& branches = plan.trials;
  const std::vector<std::int64_t>& points = plan.points;
  std::vector<bool>& done = plan.done;
  const bool past_target = hooks.past_target || !branches.empty();
  // The trial's end: its files (commit, then metrics.csv and summary.json),
  // then the executor's stop unless it ended the trial itself.
  const auto end = [&](TrialStatus status, double seconds, bool tell = true) {
    r.status = status;
    r.steps = step;
    r.wall_time = seconds;
    if (!tell) owed.stop = false;
    events.reset();
    if (hooks.commit && !hooks.commit(0)) {
      std::cerr << "trial " << trial.name << ": taken over by another worker while this one stalled; "
                << "this worker's result is refused\n";
    } else {
      write_result(trial, folder, r, metric_names);
      if (hooks.finished) hooks.finished(0, r);
    }
    if (tell) owed.send(to_string(status));
    return r;
  };
  double seconds = 0;
  for (;;) {
    // Before the next stretch of steps, as the trainer asks before each step
    // (a run at its budget ends first).
    if (step >= budget) {
      return end(r.steps_to_target ? TrialStatus::kReached : TrialStatus::kNotReached, seconds);
    }
    if (hooks.interrupt) {
      const Interrupt how = hooks.interrupt();
      if (how != Interrupt::kNone) {
        owed.send("interrupted");
        throw TrialInterrupted(how);
      }
    }
    std::int64_t next_eval = std::min(budget, (step / every + 1) * every);
    for (std::size_t k = 0; k < branches.size(); ++k) {
      if (done[k] || points[k] != step) continue;
      done[k] = true;
      run_from(branches[k], train_size, threads, horizon_folder(folder, k).string(), branch_hooks(hooks), executor,
               Start{step, &r, metric_names});
    }
    bool evaluate = true;  // false: a stretch to a branch point
    for (std::size_t k = 0; k < branches.size(); ++k) {
      if (!done[k] && points[k] > step && points[k] < next_eval) {
        next_eval = points[k];
        evaluate = false;
      }
    }
    if (branches.empty() && hooks.prune && hooks.prune(0, next_eval)) return end(TrialStatus::kPruned, seconds);
    executor.send(evaluate ? json{{"go", next_eval}} : json{{"go", next_eval}, {"evaluate", false}});
    for (;;) {  // until the evaluation at next_eval (or the step there), or the trial's end
      const json message = executor.receive();
      if (message.value("trial", std::string()) != trial.name) continue;  // an earlier trial's, late
      if (const auto p = message.find("progress"); p != message.end()) {
        if (hooks.progress) {
          hooks.progress({p->value("step", step), budget, number_or_nan(*p, "loss"),
                          number_or_nan(*p, "steps_per_second")});
        }
        continue;
      }
      if (const auto e = message.find("error"); e != message.end()) {
        owed.stop = false;  // (the executor ended the trial)
        throw std::runtime_error(e->is_string() ? e->get<std::string>() : e->dump());
      }
      if (const auto d = message.find("diverged"); d != message.end()) {
        step = integer_at(*d, "step");
        take_reports(*d, r);
        return end(TrialStatus::kDiverged, number_or_nan(*d, "wall_time"), false);
      }
      if (const auto at = message.find("stepped"); at != message.end() && !evaluate) {
        step = integer_at(*at, "step");
        if (step != next_eval) {
          throw std::runtime_error("the trial executor stopped at step " + std::to_string(step) + ", not at " +
                                   std::to_string(next_eval));
        }
        break;
      }
      const auto e = message.find("eval");
      if (e == message.end() || !evaluate) {
        throw std::runtime_error("the trial executor sent an unknown message: " + message.dump().substr(0, 200));
      }
      step = integer_at(*e, "step");
      if (step != next_eval) {
        throw std::runtime_error("the trial executor evaluated at step " + std::to_string(step) + ", not at " +
                                 std::to_string(next_eval));
      }
      seconds = number_or_nan(*e, "wall_time");
      take_reports(*e, r);
      EvalRow row;
      row.step = step;
      row.examples = schedule.examples_seen(step);
      row.epoch = static_cast<double>(row.examples) / static_cast<double>(train_size);
      row.train_loss = number_or_nan(*e, "train_loss");
      row.val_loss = number_or_nan(*e, "val_loss");
      row.val_error = number_or_nan(*e, "val_error");
      row.avg_val_loss = number_or_nan(*e, "avg_val_loss");  // absent without "average"
      row.avg_val_error = number_or_nan(*e, "avg_val_error");
      row.lr = schedule.lr(step - 1);
      row.batch_size = schedule.batch_size(step - 1);
      row.wall_time = seconds;
      row.gns = kNaN;  // not measured by this executor
      if (const auto m = e->find("metrics"); m != e->end() && m->is_object()) {
        if (r.rows.empty()) {
          for (const auto& item : m->items()) metric_names.push_back(item.key());
        }
        for (const auto& name : metric_names) row.extra.push_back(number_or_nan(*m, name.c_str()));
      }
      r.rows.push_back(row);
      if (events) events->scalars(row.step, eval_scalars(row, metric_names, {}));
      if (!std::isfinite(row.val_loss)) return end(TrialStatus::kDiverged, seconds);
      const double metric = target_metric(trial, row);
      if (!std::isnan(metric)) r.best_metric = std::min(r.best_metric, metric);
      if (metric <= trial.target.threshold && !r.steps_to_target) {
        r.steps_to_target = step;
        r.examples_to_target = row.examples;
        if (!past_target) return end(TrialStatus::kReached, seconds);
      }
      break;
    }
  }
}

}  // namespace

TrialResult run_external(const TrialConfig& trial, std::int64_t train_size, std::int64_t threads,
                         const std::string& dir, const FolderHooks& hooks, TrialExecutor& executor) {
  return run_from(trial, train_size, threads, dir, hooks, executor, Start{});
}

}  // namespace bigbatch::experiments
