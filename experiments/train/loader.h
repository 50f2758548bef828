// The training loop's data pipeline: batches fetched (decoded, augmented)
// on background threads ahead of the step that needs them, through a
// bounded queue, and handed over in the order they were asked for. What a
// batch holds depends only on its request (the indices and the Draw), never
// on which thread made it or when, so a run's batches are the same with 0,
// 1 or 8 loader threads (docs/workloads.md "The data pipeline").
#pragma once

#include "../workload/workload.h"

#include <ATen/ATen.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace bigbatch::experiments {

class BatchLoader {
 public:
  /// threads 0: take() fetches the batch itself, in the caller's thread.
  /// pin: page-locked results, for non-blocking copies to a GPU.
  BatchLoader(const Examples& examples, int threads, bool pin);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  /// Asks for examples.augmented(index, draw); the caller bounds how many
  /// are pending (the prefetch depth).
  void request(at::Tensor index, const Draw& draw);
  /// The oldest request's batch, waiting for it if a worker is making it,
  /// making it here if none has begun (the seconds either way add to
  /// waited()); an error the fetch threw is rethrown
  /// here. `index` must be that request's (a check that the caller's
  /// lookahead has not drifted from its sampler).
  Batch take(const at::Tensor& index);
  /// Drops the pending requests (a restored run draws from elsewhere).
  void clear();
  /// Seconds take() has waited for batches not ready (with 0 threads: spent
  /// fetching them).
  double waited() const { return waited_; }
  int threads() const { return static_cast<int>(workers_.size()); }

 private:
  struct Slot {
    at::Tensor index;
    Draw draw;
    bool started = false, done = false;
    Batch batch;
    std::exception_ptr error;
  };
  void work();
  static void make(const Examples& examples, bool pin, Slot& slot);

  const Examples& examples_;
  bool pin_;
  mutable std::mutex mutex_;
  std::condition_variable ready_, queued_;
  std::deque<std::shared_ptr<Slot>> slots_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
  double waited_ = 0;
};

}  // namespace bigbatch::experiments
