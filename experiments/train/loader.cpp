// The data pipeline (loader.h): worker threads take the oldest request not
// yet started; take() hands results back strictly in request order.
#include "loader.h"

#include <c10/util/Exception.h>

#include <chrono>

namespace bigbatch::experiments {

BatchLoader::BatchLoader(const Examples& examples, int threads, bool pin) : examples_(examples), pin_(pin) {
  TORCH_CHECK(threads >= 0, "runner.loader_threads: must be >= 0 (or -1: auto), got ", threads);
  for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  queued_.notify_all();
  for (auto& w : workers_) w.join();
}

void BatchLoader::make(const Examples& examples, bool pin, Slot& slot) {
  try {
    Batch b = examples.augmented(slot.index, slot.draw);
    if (pin) b = {b.input.pin_memory(), b.target.pin_memory()};
    slot.batch = std::move(b);
  } catch (...) {
    slot.error = std::current_exception();
  }
}

void BatchLoader::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    std::shared_ptr<Slot> slot;
    queued_.wait(lock, [&] {
      if (stopping_) return true;
      for (const auto& s : slots_) {
        if (!s->started) {
          slot = s;
          return true;
        }
      }
      return false;
    });
    if (stopping_) return;
    slot->started = true;
    lock.unlock();
    make(examples_, pin_, *slot);  // (a slot cleared meanwhile is made and dropped)
    lock.lock();
    slot->done = true;
    ready_.notify_all();
  }
}

void BatchLoader::request(at::Tensor index, const Draw& draw) {
  auto slot = std::make_shared<Slot>();
  slot->index = std::move(index);
  slot->draw = draw;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    slots_.push_back(std::move(slot));
  }
  queued_.notify_one();
}

Batch BatchLoader::take(const at::Tensor& index) {
  const auto start = std::chrono::steady_clock::now();
  std::shared_ptr<Slot> slot;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    TORCH_INTERNAL_ASSERT(!slots_.empty(), "BatchLoader::take: nothing was requested");
    slot = slots_.front();
    slots_.pop_front();
    if (!slot->started) {  // no worker has begun it (or there are none): make it here rather than wait
      slot->started = true;
      lock.unlock();
      make(examples_, pin_, *slot);
    } else {
      ready_.wait(lock, [&] { return slot->done; });
    }
  }
  waited_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  TORCH_INTERNAL_ASSERT(at::equal(slot->index, index), "BatchLoader: the batch taken is not the one the step drew");
  if (slot->error) std::rethrow_exception(slot->error);
  return std::move(slot->batch);
}

void BatchLoader::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  slots_.clear();
}

}  // namespace bigbatch::experiments
