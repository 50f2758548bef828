// The sweep runner (sweep.h): the resume check against sweep.json, the list of
// trials left, and a pool of `jobs` threads that runs them.
#include <bigbatch/experiments/sweep.h>

#include <bigbatch/experiments/files.h>
#include <bigbatch/experiments/preflight.h>
#include <bigbatch/experiments/progress.h>
#include <bigbatch/experiments/results.h>
#include <bigbatch/experiments/tensorboard.h>
#include <bigbatch/experiments/trial_folder.h>

#include <ATen/Parallel.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <thread>

namespace bigbatch::experiments {
namespace fs = std::filesystem;
using nlohmann::json;

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
    const json existing = read_json((dir / "sweep.json").string());
    if (identity(existing) != identity(resolved)) {
      const json patch = json::diff(identity(existing), identity(resolved));
      const std::string where = patch.empty() ? "" : patch[0].value("path", std::string());
      throw ConfigError(dir.string() + " holds a different config for sweep \"" + sweep.base.sweep +
                        "\" (first difference at " + where + "); use another --out or sweep name");
    }
  }
  // The folder is made (and tried) before the data: a bad --out fails in a moment.
  if (writer) check_folder(dir.string(), "--out");
  const Dataset data = load_data(sweep);
  if (writer) write_file_atomic((dir / "sweep.json").string(), resolved.dump(2) + "\n");

  const std::vector<TrialConfig> trials = expand(sweep);
  // Rank 0 decides what is left (other nodes may not see its files).
  at::Tensor left = at::zeros({static_cast<std::int64_t>(trials.size())}, at::kInt);
  if (writer) {
    for (std::size_t i = 0; i < trials.size(); ++i) {
      left[static_cast<std::int64_t>(i)] = trial_finished(trials[i], (dir / trials[i].name).string()) ? 0 : 1;
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
  summary.reached = write_tables(trials, dir.string());
  if (sweep.base.tensorboard) {
    // TensorBoard's Text tab, on the sweep folder's own run ".".
    tensorboard::EventWriter(dir.string())
        .text("steps_to_target", 0,
              compare_report({{sweep.base.sweep, dir.string()}}, TableFormat::kMarkdown) + "\n\n```\n" +
                  report(dir.string()) + "```\n");
  } else {
    fs::remove(dir / tensorboard::kEventFileName);
  }
  summary.wall_time = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace bigbatch::experiments
