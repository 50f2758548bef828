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

/// How many of `jobs` workers, each with `threads` intra-op threads, fit
/// the cores of this machine when `local_ranks` processes share them: at most
/// `jobs`, at least one. More would oversubscribe the cores, and OpenMP's
/// spinning barriers then cost a scheduler slice per parallel region (a
/// 2-rank Gloo run on 2 cores with 2 threads each ran about 6x slower than
/// with 1). The thread count itself is the config's (runner.threads_per_trial),
/// never derived from --jobs or the cores: it decides the order of
/// floating-point sums, and with it the results (docs/experiments.md).
inline int jobs_that_fit(int jobs, int threads, int local_ranks) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, std::min(jobs, cores / std::max(1, threads * std::max(1, local_ranks))));
}

/// Runs `jobs` workers (the calling thread is one), each with `threads`
/// intra-op threads, each doing run(*job) for job = next() until next()
/// gives nothing or some next() or run has thrown. next() must be safe to
/// call from several threads. The first exception is rethrown once every worker has
/// stopped.
template <typename Next, typename Run>
void run_workers(int jobs, int threads, Next&& next, Run&& run) {
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  const auto worker = [&] {
    at::set_num_threads(threads);
    while (!failed) {
      try {
        auto job = next();  // it may do I/O (claims on a shared folder) and throw
        if (!job) return;
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
