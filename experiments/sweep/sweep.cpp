// The sweep runner (sweep.h): the resume check against sweep.json, the list of
// trials left, and a pool of `jobs` threads that runs them.
#include "sweep.h"

#include "executor.h"
#include "../workload/python.h"

#include "../train/batched.h"
#include "../cluster/claims.h"
#include "../cluster/cores.h"
#include "machine.h"
#include "../io/files.h"
#include "../workload/models.h"
#include "preflight.h"
#include "progress.h"
#include "horizons.h"
#include "results.h"
#include "../io/tensorboard.h"
#include "trial_folder.h"
#include "trial_queue.h"
#include "workers.h"

#include <ATen/Parallel.h>
#include <ATen/ops/full.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <filesystem>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

namespace bigbatch::experiments {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// One grid step beyond the edge, for each row of the table whose trial has
// the lowest or highest rate of its batch size. The step is the geometric
// mean spacing of the search's own rates there.
std::vector<ExtraPoint> beyond_edges(const SweepConfig& sweep, const std::vector<TrialConfig>& trials,
                                     const fs::path& dir) {
  const std::vector<TrialConfig> grid = expand(sweep);
  std::vector<ExtraPoint> out;
  for (const TargetRow& row : read_steps_to_target(dir.string())) {
    if (row.edge.empty()) continue;
    std::set<double> own, all;
    for (const auto& t : grid) {
      if (t.batch_size == row.batch_size) own.insert(t.schedule.base_lr);
    }
    for (const auto& t : trials) {
      if (t.batch_size == row.batch_size) all.insert(t.schedule.base_lr);
    }
    if (own.size() < 2) continue;
    const double step = std::pow(*own.rbegin() / *own.begin(), 1.0 / static_cast<double>(own.size() - 1));
    const double lr = row.edge == "low" ? *all.begin() / step : *all.rbegin() * step;
    const auto chosen = std::find_if(trials.begin(), trials.end(), [&](const TrialConfig& t) { return t.name == row.trial; });
    if (!sweep.search.momentum.empty()) {
      for (const double m : sweep.search.momentum) out.push_back({row.batch_size, lr, m});
    } else if (sweep.search.momentum_max > 0 && chosen != trials.end()) {
      out.push_back({row.batch_size, lr, chosen->optimizer.momentum()});
    } else {
      out.push_back({row.batch_size, lr, std::nullopt});
    }
  }
  return out;
}

// What one pass over a sweep's trials did.
struct RoundTotals {
  std::int64_t skipped = 0;             // finished before
  std::atomic<std::int64_t> pruned{0};  // stopped as hopeless
  std::atomic<std::int64_t> released{0};  // given back when stopped
};

// A worker's next piece of work: one trial, with the step it is pruned from
// under a process group, or a batched group of trials.
struct Job {
  std::size_t index;
  std::optional<std::int64_t> prune_from;
  std::vector<std::size_t> group;  // a batched group (more than one trial), index among them
};

// Trial i's end, for the queue's bounds.
void finish(TrialQueue& queue, std::size_t i, const TrialResult& r) {
  if (r.status == TrialStatus::kReached && r.steps_to_target) {
    queue.finished(i, TrialQueue::Outcome::kReached, *r.steps_to_target);
  } else if (r.status == TrialStatus::kFailed) {
    // Not final: a rerun tries it again, so its steps are unknown, not +inf
    // (as a bound, like a trial pruned before its first step).
    queue.finished(i, TrialQueue::Outcome::kPruned, 0);
  } else {
    queue.finished(i, r.status == TrialStatus::kPruned ? TrialQueue::Outcome::kPruned : TrialQueue::Outcome::kNotReached,
                   r.steps);
  }
}

// Where a round's workers take their jobs, in the queue's order. Three
// sources: one process, trial by trial; one process, batched groups of the
// trials that can share one; a process group, where rank 0 picks the trial
// and the step it is pruned from and broadcasts both (trials then run one at
// a time, so that step cannot move during one, and every rank prunes at it).
// With a claim board (every sweep but a data-parallel one's other ranks), a
// trial is handed out only once this worker holds its claim; trials other
// workers hold are given back to the queue, and when nothing else is left
// the source waits for them, polling, and takes over those whose worker fell
// silent. Trials other workers finish enter the queue's bounds (refresh()).
class JobSource {
 public:
  JobSource(TrialQueue& queue, const std::vector<TrialConfig>& trials, const fs::path& dir, bool prune, bool batch,
            distributed::ProcessGroup* group, ClaimBoard* board, const std::atomic<int>* stop)
      : queue_(queue),
        trials_(trials),
        dir_(dir),
        prune_(prune),
        batch_(batch && group == nullptr),
        group_(group),
        board_(board),
        stop_(stop),
        known_(trials.size(), false) {
    for (std::size_t i = 0; i < trials.size(); ++i) index_.emplace(trials[i].name, i);
  }

  std::optional<Job> next() {
    if (group_ != nullptr) return rank0s();
    return take();
  }

  // Trial i's end is in the queue (this worker's result, or one found).
  void known(std::size_t i) {
    std::lock_guard<std::mutex> lock(known_mutex_);
    known_[i] = true;
  }

  // The results other workers announced since the last look, into the
  // queue: one listing of the claims folder, then a read of each new
  // result. (A result written without its announcement, by a worker that
  // died between the two, is read when its trial comes up: claim().)
  void refresh() {
    if (board_ == nullptr) return;
    for (const std::string& name : board_->announced()) {
      const auto it = index_.find(name);
      if (it == index_.end()) continue;  // another round's trial
      const std::size_t i = it->second;
      {
        std::lock_guard<std::mutex> lock(known_mutex_);
        if (known_[i] || board_->robbed(trials_[i].name)) continue;
      }
      const fs::path folder = dir_ / trials_[i].name;
      if (const auto done = finished_summary(trials_[i], folder.string(), prune_)) {
        std::lock_guard<std::mutex> lock(known_mutex_);
        if (known_[i]) continue;
        known_[i] = true;
        finish(queue_, i, result_from_summary(*done));
      }
    }
  }

  bool stopped() const { return stop_ != nullptr && stop_->load() != 0; }

  // refresh(), when the claims folder changed (a result announced, a trial
  // taken) or a lease/8 has passed; looked at most every 0.2 s. Cheap enough
  // to ask before every step: pruning then sees the others' results within
  // a fraction of a second, as threads of one process do.
  void refresh_if_due() {
    if (board_ == nullptr) return;
    const auto now = std::chrono::steady_clock::now();
    {
      std::lock_guard<std::mutex> lock(due_mutex_);
      if (now - last_look_ < std::chrono::milliseconds(200)) return;
      last_look_ = now;
    }
    const bool stale = now - last_refresh_.load() > std::chrono::duration<double>(board_->lease() / 8);
    if (board_->changed() || stale) {
      last_refresh_ = now;
      refresh();
    }
  }

 private:
  static constexpr std::size_t kMaxLanes = 32;

  // The next trials of the queue (a batched group, or one), not yet claimed.
  std::vector<std::size_t> from_queue() {
    if (batch_) {
      const auto together = [&](std::size_t a, std::size_t b) { return batchable_together(trials_[a], trials_[b]); };
      return queue_.next_group(together, kMaxLanes);
    }
    const auto i = queue_.next();
    return i ? std::vector<std::size_t>{*i} : std::vector<std::size_t>{};
  }

  static Job job_of(const std::vector<std::size_t>& lanes) {
    return Job{lanes.front(), std::nullopt, lanes.size() > 1 ? lanes : std::vector<std::size_t>()};
  }

  // A trial this worker now holds; nullopt when every trial has its result
  // (or a stop came). With `wait` false, kWait instead of waiting for the
  // trials other workers hold.
  static constexpr std::size_t kWait = static_cast<std::size_t>(-1);
  std::optional<Job> take(bool wait = true) {
    if (board_ == nullptr) {
      const auto lanes = from_queue();
      return lanes.empty() ? std::nullopt : std::optional<Job>(job_of(lanes));
    }
    std::lock_guard<std::mutex> lock(take_mutex_);
    bool said = false;
    // Polls at a fraction of the lease: a dead worker's trial is taken over
    // soon after its lease runs out, and a live one's result seen soon.
    const auto poll = std::chrono::duration<double>(std::clamp(board_->lease() / 8, 0.1, 5.0));
    for (;;) {
      if (stopped()) return std::nullopt;
      refresh();
      std::vector<std::size_t> busy, mine;
      while (mine.empty()) {
        const auto lanes = from_queue();
        if (lanes.empty()) break;
        for (const auto i : lanes) {
          switch (claim(i)) {
            case ClaimBoard::State::kClaimed: mine.push_back(i); break;
            case ClaimBoard::State::kBusy: busy.push_back(i); break;
            case ClaimBoard::State::kSettled: break;
          }
        }
      }
      for (const auto i : busy) queue_.give_back(i);
      if (!mine.empty()) return job_of(mine);
      if (busy.empty()) return std::nullopt;  // every trial has its result
      if (!wait) return Job{kWait, std::nullopt, {}};
      if (!said) {
        std::cerr << "waiting for " << busy.size() << " trial(s) that other workers hold\n";
        said = true;
      }
      // Until the poll is due, or sooner when the claims folder changes (a
      // result announced, a trial given back).
      const auto until = std::chrono::steady_clock::now() + poll;
      while (!stopped() && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (board_->changed()) break;
      }
    }
  }

  // Tries to claim trial i, which the queue handed out; a result another
  // worker wrote meanwhile goes into the queue (kSettled).
  ClaimBoard::State claim(std::size_t i) {
    const TrialConfig& t = trials_[i];
    const fs::path folder = dir_ / t.name;
    if (const auto done = finished_summary(t, folder.string(), prune_)) {
      settle(i, result_from_summary(*done));
      return ClaimBoard::State::kSettled;
    }
    const bool has_summary = fs::exists(folder / "summary.json");
    const ClaimBoard::State state = board_->try_claim(t.name, has_summary);
    if (state == ClaimBoard::State::kSettled) {
      // A worker of this generation committed a result this sweep does not
      // take as final (a failure): settled for this run, as if it were ours.
      TrialResult failed;
      failed.status = TrialStatus::kFailed;
      settle(i, failed);
    }
    return state;
  }

  void settle(std::size_t i, const TrialResult& r) {
    std::lock_guard<std::mutex> lock(known_mutex_);
    if (known_[i]) return;
    known_[i] = true;
    finish(queue_, i, r);
  }

  // {index, prune_from}, -1 for none, from rank 0; index -2 while rank 0
  // waits for trials other workers hold: every rank asks again after a
  // pause, so no collective waits longer than that (--timeout).
  std::optional<Job> rank0s() {
    for (;;) {
      std::vector<at::Tensor> message{at::full({2}, -1, at::kLong)};
      if (group_->rank() == 0) {
        if (const auto job = take(false)) {
          message[0][0] = job->index == kWait ? -2 : static_cast<std::int64_t>(job->index);
          if (job->index != kWait) {
            if (const auto from = queue_.prune_from(job->index)) message[0][1] = *from;
          }
        }
      }
      group_->broadcast(message, 0);
      const auto m = message[0].contiguous();
      const std::int64_t* v = m.data_ptr<std::int64_t>();
      if (v[0] == -2) {
        if (group_->rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(500));
        continue;
      }
      return job_from(v);
    }
  }

  static std::optional<Job> job_from(const std::int64_t* v) {
    if (v[0] < 0) return std::nullopt;
    Job job{static_cast<std::size_t>(v[0]), std::nullopt, {}};
    if (v[1] >= 0) job.prune_from = v[1];
    return job;
  }

  TrialQueue& queue_;
  const std::vector<TrialConfig>& trials_;
  const fs::path dir_;
  const bool prune_;
  bool batch_;
  distributed::ProcessGroup* group_;
  ClaimBoard* board_;
  const std::atomic<int>* stop_;
  std::vector<bool> known_;
  std::map<std::string, std::size_t> index_;  // trial name -> index
  std::mutex known_mutex_, take_mutex_, due_mutex_;
  std::chrono::steady_clock::time_point last_look_{};
  std::atomic<std::chrono::steady_clock::time_point> last_refresh_{std::chrono::steady_clock::now()};
};

// The trials left to run in `dir` go into the queue; the finished ones bound
// their batch sizes from the start. Rank 0 decides (other nodes may not see
// its files) and every rank learns how many are left.
std::int64_t queue_unfinished(const std::vector<TrialConfig>& trials, const fs::path& dir, bool prune,
                              distributed::ProcessGroup* group, TrialQueue& queue, RoundTotals& totals,
                              JobSource& source) {
  std::int64_t left = 0;
  if (group == nullptr || group->rank() == 0) {
    for (std::size_t i = 0; i < trials.size(); ++i) {
      const auto done = finished_summary(trials[i], (dir / trials[i].name).string(), prune);
      if (!done) {
        queue.add(i);
        ++left;
        continue;
      }
      ++totals.skipped;
      finish(queue, i, result_from_summary(*done));
      source.known(i);  // in the queue: no later look takes it in again
    }
  }
  if (group != nullptr) {
    std::vector<at::Tensor> count{at::full({1}, left, at::kLong)};
    group->broadcast(count, 0);
    left = count[0].item<std::int64_t>();
  }
  return left;
}

// The claim board's heartbeat looks for other workers' results for the
// round that runs now (the sweep sets and clears it).
struct RoundWatch {
  std::mutex mutex;
  JobSource* source = nullptr;
  void tick() {
    std::lock_guard<std::mutex> lock(mutex);
    if (source != nullptr) source->refresh();
  }
};

// The executor that trains a sweep's trials in another process (executor.h),
// when there is one, and what it needs of the data.
struct External {
  TrialExecutor* executor = nullptr;
  std::int64_t train_size = 0;
  std::int64_t threads = 1;
};

// One round's jobs: a trial, or a batched group of them, run into its
// folder with the hooks that tie it to the round (the queue's bounds, the
// progress board, the claim board of a shared folder), and what happens
// when it ends, is stopped, is taken over or throws.
class RoundRunner {
 public:
  RoundRunner(const std::vector<TrialConfig>& trials, const WorkloadData& data, const fs::path& dir,
              distributed::ProcessGroup* group, ClaimBoard* board, TrialQueue& queue, JobSource& source,
              ProgressBoard& progress, RoundTotals& totals, const External& external)
      : trials_(trials), data_(data), dir_(dir), group_(group), board_(board), queue_(queue), source_(source),
        progress_(progress), totals_(totals), external_(external) {}

  void run(const Job& job) {
    Lanes l;
    l.lanes = job.group.empty() ? std::vector<std::size_t>{job.index} : job.group;
    l.ended.assign(l.lanes.size(), false);
    l.committed.assign(l.lanes.size(), false);
    const FolderHooks hooks = hooks_for(job, l);
    if (own_claims() && !still_ours(l)) return;
    try {
      if (external_.executor != nullptr) {
        run_external(trials_[job.index], external_.train_size, external_.threads, folder(job.index), hooks,
                     *external_.executor);
        return;
      }
      if (job.group.empty()) {
        run_one(trials_[job.index], data_, folder(job.index), hooks, group_);
        return;
      }
      std::vector<TrialConfig> configs;
      std::vector<std::string> dirs;
      for (const auto i : l.lanes) {
        configs.push_back(trials_[i]);
        dirs.push_back(folder(i));
      }
      run_group(configs, data_, dirs, hooks);
    } catch (const TrialInterrupted&) {
      give_back_interrupted(l);
    } catch (const ExecutorGone&) {  // the sweep ends; the trial is not at fault
      if (board_ != nullptr) give_back_interrupted(l);
      throw;
    } catch (const std::exception& e) {
      // The workload threw: the trial fails with its message and the sweep
      // goes on. (Data-parallel, the ranks may be out of step: stop.)
      if (group_ != nullptr) throw;
      fail(l, error_line(e));
    }
  }

 private:
  // A job's trials (its lanes) and, per lane, whether it has ended and
  // whether its result was committed on the claim board.
  struct Lanes {
    std::vector<std::size_t> lanes;
    std::vector<bool> ended, committed;
  };

  bool writer() const { return group_ == nullptr || group_->rank() == 0; }
  // A data-parallel trial is fenced at its commit only.
  bool own_claims() const { return board_ != nullptr && group_ == nullptr; }
  std::string folder(std::size_t i) const { return (dir_ / trials_[i].name).string(); }

  // A trial's end: its bound for its siblings, the counts, the board.
  void record(std::size_t i, const TrialResult& r) {
    if (board_ != nullptr && writer()) board_->announce(trials_[i].name);  // its files are written: tell the others
    source_.known(i);
    finish(queue_, i, r);
    if (r.status == TrialStatus::kPruned) ++totals_.pruned;
    if (writer()) progress_.finished(trials_[i].name, r, trials_[i].target.metric);
  }

  // A lane whose result was refused (another worker took it over) goes back
  // to the queue: the round then waits for the other's result, which its
  // tables need.
  void refused(Lanes& l, std::size_t lane) {
    l.ended[lane] = true;
    queue_.give_back(l.lanes[lane]);
  }

  FolderHooks hooks_for(const Job& job, Lanes& l) {
    FolderHooks hooks;
    hooks.progress = [this, &l](const TrialProgress& p) { progress_.update(trials_[l.lanes.front()].name, p); };
    hooks.prune = [this, &job, &l](std::size_t lane, std::int64_t next_eval) {
      if (group_ != nullptr) return TrialQueue::beaten(job.prune_from, next_eval);
      source_.refresh_if_due();  // the other workers' results, for the bounds
      return queue_.pruned(l.lanes[lane], next_eval);
    };
    hooks.finished = [this, &l](std::size_t lane, const TrialResult& r) {
      l.ended[lane] = true;
      record(l.lanes[lane], r);
    };
    if (board_ != nullptr && writer()) {
      hooks.commit = [this, &l](std::size_t lane) {
        if (board_->commit(trials_[l.lanes[lane]].name)) {
          l.committed[lane] = true;
          return true;
        }
        refused(l, lane);
        return false;
      };
    }
    if (own_claims()) {
      hooks.interrupt = [this, &l] {
        // No longer this worker's first: such a trial writes nothing more,
        // not even the checkpoint a stop would.
        for (std::size_t lane = 0; lane < l.lanes.size(); ++lane) {
          if (!l.ended[lane] && board_->robbed(trials_[l.lanes[lane]].name)) return Interrupt::kAbandon;
        }
        return source_.stopped() ? Interrupt::kCheckpoint : Interrupt::kNone;
      };
    }
    return hooks;
  }

  // Whether every lane's claim is still this worker's, looked up now, before
  // its folder is touched (a claim taken over while this worker stalled
  // since it claimed). If one is not, all the job's claims are let go and
  // its trials go back to the queue.
  bool still_ours(const Lanes& l) {
    for (std::size_t lane = 0; lane < l.lanes.size(); ++lane) {
      if (board_->verify(trials_[l.lanes[lane]].name)) continue;
      for (const std::size_t i : l.lanes) {
        const std::string& name = trials_[i].name;
        board_->verify(name) ? board_->release(name) : board_->abandon(name);
        queue_.give_back(i);
      }
      return false;
    }
    return true;
  }

  // Stopped (preemption), or no longer this worker's: give back what it
  // still holds; the queue takes the trials back for a later look.
  void give_back_interrupted(const Lanes& l) {
    for (std::size_t lane = 0; lane < l.lanes.size(); ++lane) {
      if (l.ended[lane]) continue;
      const std::string& name = trials_[l.lanes[lane]].name;
      if (board_->robbed(name)) {
        board_->abandon(name);
        std::cerr << "trial " << name << ": taken over by another worker while this one stalled; stopped here\n";
      } else {
        board_->release(name);
        ++totals_.released;
      }
      queue_.give_back(l.lanes[lane]);
    }
  }

  // Each lane still running fails with the workload's message.
  void fail(Lanes& l, const std::string& message) {
    for (std::size_t lane = 0; lane < l.lanes.size(); ++lane) {
      if (l.ended[lane]) continue;
      const TrialConfig& t = trials_[l.lanes[lane]];
      // (Committed already when writing its result failed: a full disk.)
      if (board_ != nullptr && !l.committed[lane] && !board_->commit(t.name)) {  // taken over: the other's result stands
        refused(l, lane);
        continue;
      }
      std::cerr << "trial " << t.name << " failed: " << message << "\n";
      record(l.lanes[lane], record_failure(t, folder(l.lanes[lane]), message));
    }
  }

  const std::vector<TrialConfig>& trials_;
  const WorkloadData& data_;
  const fs::path& dir_;
  distributed::ProcessGroup* group_;
  ClaimBoard* board_;
  TrialQueue& queue_;
  JobSource& source_;
  ProgressBoard& progress_;
  RoundTotals& totals_;
  const External& external_;
};

// Runs what is left of `trials` into `dir`, `jobs` at a time: the body of
// run_sweep (sweep.h), once per round of the search.
void run_trials(const std::vector<TrialConfig>& trials, const WorkloadData& data, const fs::path& dir,
                const SweepOptions& options, int jobs_granted, const RunnerSpec& runner,
                distributed::ProcessGroup* group, ClaimBoard* board, RoundWatch& watch, bool report_resume,
                RoundTotals& totals, const External& external) {
  const bool writer = group == nullptr || group->rank() == 0;
  TrialQueue queue(trials, runner.prune);
  JobSource source(queue, trials, dir, runner.prune, runner.batch_trials.value_or(false), group, board,
                   options.stop);
  const std::int64_t left = queue_unfinished(trials, dir, runner.prune, group, queue, totals, source);
  if (writer && report_resume && totals.skipped > 0) {
    std::cerr << "resuming " << dir.string() << ": " << totals.skipped << " of " << trials.size()
              << " trials already finished\n";
  }
  {
    std::lock_guard<std::mutex> lock(watch.mutex);
    watch.source = &source;
  }
  struct Unwatch {  // before the source goes, whatever happens
    RoundWatch& w;
    ~Unwatch() {
      std::lock_guard<std::mutex> lock(w.mutex);
      w.source = nullptr;
    }
  } unwatch{watch};
  ProgressBoard progress(left);
  RoundRunner round(trials, data, dir, group, board, queue, source, progress, totals, external);
  const int jobs = std::min<int>(jobs_granted, static_cast<int>(std::max<std::int64_t>(1, left)));
  // Each worker's intra-op pool: the config's, whatever --jobs is.
  run_workers(jobs, static_cast<int>(runner.threads_per_trial), [&] { return source.next(); },
              [&](const Job& job) { round.run(job); });
}

}  // namespace

std::string extensions_json(const std::vector<ExtraPoint>& extra) {
  json points = json::array();
  for (const auto& p : extra) {
    points.push_back({{"batch_size", p.batch_size},
                      {"lr", p.lr},
                      {"momentum", p.momentum ? json(*p.momentum) : json(nullptr)}});
  }
  return json{{"points", points}}.dump(2) + "\n";
}

std::vector<ExtraPoint> parse_extensions(const std::string& text, const std::string& path) {
  // Each value's type is checked before it is read: nlohmann's get<> of a
  // float as an integer (or of a huge one) is undefined behaviour, not an error.
  const auto number = [](const json& p, const char* key, bool integer) -> const json& {
    const json& v = p.at(key);
    if (!(integer ? v.is_number_integer() : v.is_number())) {
      throw std::invalid_argument(std::string(key) + " is not " + (integer ? "an integer" : "a number"));
    }
    return v;
  };
  std::vector<ExtraPoint> out;
  try {
    const json parsed = json::parse(text);
    const json& points = parsed.at("points");
    if (!points.is_array()) throw std::invalid_argument("points is not a list");
    for (const json& p : points) {
      ExtraPoint e{number(p, "batch_size", true).get<std::int64_t>(), number(p, "lr", false).get<double>(),
                   std::nullopt};
      if (!p.at("momentum").is_null()) e.momentum = number(p, "momentum", false).get<double>();
      if (!(e.lr > 0) || !std::isfinite(e.lr) || e.batch_size < 1) {
        throw std::invalid_argument("a rate or batch size out of range");
      }
      out.push_back(e);
    }
  } catch (const std::exception& e) {
    throw ConfigError(path + ": not a list of extension points (" + e.what() + "); remove it to drop them");
  }
  return out;
}

namespace {

// A folder that holds another config's sweep.json is refused, naming where
// the two first differ.
void check_same_sweep(const fs::path& dir, const json& resolved, const std::string& name) {
  if (!fs::exists(dir / "sweep.json")) return;
  if (const auto where = identity_difference(read_json((dir / "sweep.json").string()), resolved)) {
    throw ConfigError(dir.string() + " holds a different config for sweep \"" + name + "\" (first difference at " +
                      *where + "); use another --out or sweep name");
  }
}

// Rates an earlier --extend-search added (rank 0 reads, every rank learns them).
std::vector<ExtraPoint> read_extensions(const fs::path& extensions, bool writer, distributed::ProcessGroup* group) {
  std::string text;
  if (writer && fs::exists(extensions)) text = read_file(extensions.string());
  if (group != nullptr) text = distributed::broadcast_bytes(*group, text);
  return text.empty() ? std::vector<ExtraPoint>() : parse_extensions(text, extensions.string());
}

// This process's share of the machine's cores (cores.h), before the data: a
// worker with no core free says so in a moment. A data-parallel sweep's
// ranks were placed by their launcher. The jobs it may run at once.
int grant_jobs(const SweepOptions& options, int threads, distributed::ProcessGroup* group, bool writer,
               std::optional<CoreLedger>& ledger) {
  int jobs = jobs_that_fit(options.jobs, threads, group != nullptr ? group->local_size() : 1);
  if (group == nullptr) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    ledger.emplace(core_ledger_folder(), cores);
    const int granted = ledger->reserve(jobs, threads);
    if (granted == 0) {
      std::string who;
      for (const auto& [pid, n] : ledger->others()) who += (who.empty() ? "" : ", ") + ("pid " + std::to_string(pid) + ": " + std::to_string(n));
      throw ConfigError("no core of this machine's " + std::to_string(cores) + " is free for a trial of " +
                        std::to_string(threads) + " thread(s): other bigbatch workers hold them (" + who +
                        "); start this one when one ends, or on another machine");
    }
    jobs = granted;
  }
  if (writer && jobs < options.jobs) {
    std::cerr << "note: --jobs " << options.jobs << " at " << threads << " thread(s) per trial would oversubscribe "
              << "this machine's cores" << (ledger && !ledger->others().empty() ? " (shared with other workers)" : "")
              << ": running " << jobs << " at a time\n";
  }
  return jobs;
}

// Whether the sweep's trials run batched: runner.batch_trials, unset the
// measured default (on for CUDA); off, said when it was asked for, where
// batching cannot be done.
bool batch_trials(const SweepConfig& sweep, const WorkloadData& data, distributed::ProcessGroup* group, bool writer) {
  const bool asked = sweep.runner.batch_trials.value_or(false);
  if (!sweep.runner.batch_trials.value_or(sweep.base.device == DeviceType::kCuda)) return false;
  std::string refusal = group != nullptr ? "a data-parallel sweep" : batch_refusal(sweep.base);
  if (refusal.empty()) {
    const std::string model = stack_refusal(build_model(sweep.base.model, data, sweep.seeds.front()));
    if (!model.empty()) refusal = "model \"" + sweep.base.model.name + "\" cannot be stacked: " + model;
  }
  if (refusal.empty()) return true;
  if (writer && asked) std::cerr << "note: no batched trials (" << refusal << "): each trial runs alone\n";
  return false;
}

// One --extend-search round's points: `extra` with the rates beyond the
// edges of the last round's table added (or the points another worker
// wrote already: every worker derives the same from the same table); rank
// 0 decides and writes extensions.json, every rank learns them. Empty when
// no edge is left.
std::string extend(const SweepConfig& sweep, const std::vector<TrialConfig>& trials, const fs::path& dir,
                   std::vector<ExtraPoint> extra, int round, int rounds, bool writer, distributed::ProcessGroup* group) {
  const fs::path extensions = dir / "extensions.json";
  std::string more;
  if (writer) {
    const std::vector<ExtraPoint> on_disk = fs::exists(extensions)
                                                ? parse_extensions(read_file(extensions.string()), extensions.string())
                                                : std::vector<ExtraPoint>();
    const std::vector<ExtraPoint> added =
        on_disk.size() > extra.size() ? std::vector<ExtraPoint>() : beyond_edges(sweep, trials, dir);
    if (on_disk.size() > extra.size()) {
      more = extensions_json(on_disk);
    } else if (!added.empty()) {
      extra.insert(extra.end(), added.begin(), added.end());
      more = extensions_json(extra);
      write_file_atomic(extensions.string(), more);
      std::cerr << "extending the search (round " << round + 1 << " of " << rounds << "): " << added.size()
                << " rate(s) beyond the edge\n";
    }
  }
  if (group != nullptr) more = distributed::broadcast_bytes(*group, more);
  return more;
}

// The sweep folder's TensorBoard text (its tables, on the folder's own run
// "."), or no event file when the config turns TensorBoard off.
void write_sweep_events(const SweepConfig& sweep, const fs::path& dir) {
  if (sweep.base.tensorboard) {
    tensorboard::EventWriter(dir.string())
        .text("steps_to_target", 0,
              compare_report({{sweep.base.sweep, dir.string()}}, TableFormat::kMarkdown) + "\n\n```\n" +
                  report(dir.string()) + "```\n");
  } else {
    fs::remove(dir / tensorboard::kEventFileName);
  }
}

// A sweep's trials trained by an executor in another process (executor.h):
// checked before any work. Its train_size is set for a "python" dataset (0:
// the loaded data's). Without an executor, a "python" dataset or model is
// refused: only the Python process holding them can train them.
External external_trials(const SweepConfig& sweep, const SweepOptions& options, distributed::ProcessGroup* group) {
  const bool python = sweep.base.data.name == "python" || sweep.base.model.name == "python";
  if (options.executor == nullptr) {
    if (python) refuse_python_part(sweep.base.data.name == "python" ? "dataset" : "model");
    return {};
  }
  if (group != nullptr) throw ConfigError("--executor: a data-parallel sweep trains its own trials");
  if (options.jobs != 1) {
    throw ConfigError("--jobs: the trial executor trains one trial at a time, got " + std::to_string(options.jobs));
  }
  const std::string refusal = executor_refusal(sweep.base);
  if (!refusal.empty()) throw ConfigError(refusal + ", not the Python executor's");
  External out;
  out.executor = options.executor;
  out.threads = sweep.runner.threads_per_trial;
  if (sweep.base.data.name == "python") {
    out.train_size = python_train_size(sweep.base.data);
    check_batches(sweep, out.train_size);
  }
  return out;
}

}  // namespace

// About 70 lines, each step a call: the checks in the order that shows a
// user's mistake fastest (which error comes first is part of the CLI's
// behaviour), then the rounds. Splitting it further would scatter that order.
SweepSummary run_sweep(const SweepConfig& sweep, const SweepOptions& options, distributed::ProcessGroup* group) {
  const auto start = std::chrono::steady_clock::now();
  check_jobs(options.jobs, group != nullptr, "sweep runs one trial");
  const bool writer = group == nullptr || group->rank() == 0;
  if (group != nullptr) check_world(sweep, group->size());
  if (group == nullptr && sweep.base.distributed.shard != distributed::ShardStage::kNone) check_world(sweep, 1);
  const fs::path dir = fs::path(options.out) / sweep.base.sweep;
  const json resolved = to_json(sweep);
  check_same_sweep(dir, resolved, sweep.base.sweep);
  // The folder is made (and tried) before the data: a bad --out fails in a moment.
  if (writer) check_folder(dir.string(), "--out");
  // Rates an earlier --extend-search added: part of this folder's sweep.
  const fs::path extensions = dir / "extensions.json";
  std::vector<ExtraPoint> extra = read_extensions(extensions, writer, group);
  if (!(options.lease > 0) || !std::isfinite(options.lease)) {
    throw ConfigError("--lease: must be a number of seconds > 0, got " + seconds_text(options.lease));
  }
  std::optional<CoreLedger> ledger;
  const int jobs = grant_jobs(options, static_cast<int>(sweep.runner.threads_per_trial), group, writer, ledger);
  // The math check, before any trial runs (machine.h): recorded beside the
  // config, and said once when the math is slow.
  const json written = with_machine(resolved, writer);
  External external = external_trials(sweep, options, group);
  const WorkloadData data = sweep.base.data.name == "python" ? WorkloadData{} : load_data(sweep);
  if (external.executor != nullptr && external.train_size == 0) external.train_size = data.train->size();
  if (writer) write_file_atomic((dir / "sweep.json").string(), written.dump(2) + "\n");
  // Claims, so that other processes can work on this folder too (rank 0 of
  // a data-parallel sweep claims for its group).
  RoundWatch watch;
  std::optional<ClaimBoard> board;
  if (writer) board.emplace(dir.string(), options.lease, new_worker_id(), [&watch] { watch.tick(); });
  ClaimBoard* claims = board ? &*board : nullptr;
  const auto stopped = [&] { return options.stop != nullptr && options.stop->load() != 0; };

  SweepSummary summary;
  summary.dir = dir.string();
  summary.jobs = jobs;
  RunnerSpec runner = sweep.runner;
  runner.batch_trials = external.executor == nullptr && batch_trials(sweep, data, group, writer);
  // One round; false when a stop ended it before every trial had its result.
  const auto run_round = [&](const std::vector<TrialConfig>& trials, bool first) {
    RoundTotals totals;
    run_trials(trials, data, dir, options, jobs, runner, group, claims, watch, first, totals, external);
    if (first) summary.skipped = totals.skipped;
    summary.trials = static_cast<std::int64_t>(trials.size());
    summary.pruned += totals.pruned;
    summary.released += totals.released;
    if (stopped()) return false;
    if (writer) {
      summary.reached = write_tables(trials, dir.string());
      write_horizon_tables(trials, dir.string());
    }
    return true;
  };
  const auto interrupted = [&] {
    summary.interrupted = options.stop->load();
    summary.wall_time = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return summary;
  };

  // The search's own trials, then any points an --extend-search added (now or
  // in an earlier run), one round of edges at a time.
  std::vector<TrialConfig> trials = expand(sweep, extra);
  if (!run_round(trials, true)) return interrupted();
  for (int round = 0; round < options.extend_search; ++round) {
    const std::string more = extend(sweep, trials, dir, extra, round, options.extend_search, writer, group);
    if (more.empty()) break;
    extra = parse_extensions(more, extensions.string());
    trials = expand(sweep, extra);
    if (!run_round(trials, false)) return interrupted();
  }
  if (!writer) return summary;
  write_sweep_events(sweep, dir);
  summary.wall_time = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace bigbatch::experiments
