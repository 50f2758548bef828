// The pool of worker threads both runners use (sweep.cpp, cbs.cpp).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace bigbatch::experiments {

/// Intra-op threads for each of `jobs` workers in one of `local_ranks`
/// processes on this machine: its cores shared by all of them, less the
/// job's loader threads (loader.h) that decode and augment beside it, at
/// least one. More would oversubscribe the cores, and OpenMP's spinning
/// barriers then cost a scheduler slice per parallel region (a 2-rank Gloo
/// run on 2 cores with 2 threads each ran about 6x slower than with 1).
inline int threads_per_job(int jobs, int local_ranks, int loader_threads = 0) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, jobs) / std::max(1, local_ranks) - std::max(0, loader_threads));
}

/// Runs `jobs` workers (the calling thread is one), each with `threads`
/// intra-op threads, each doing run(*job) for job = next() until next()
/// gives nothing or some run has thrown. next() must be safe to call from
/// several threads. The first exception is rethrown once every worker has
/// stopped.
template <typename Next, typename Run>
void run_workers(int jobs, int threads, Next&& next, Run&& run) {
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  const auto worker = [&] {
    at::set_num_threads(threads);
    while (!failed) {
      auto job = next();
      if (!job) return;
      try {
        run(*job);
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
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace bigbatch::experiments
