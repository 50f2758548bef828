// The sweep's progress on stderr: the trials in flight as one redrawn line on a
// terminal (plain lines every 10 s otherwise), and a line per finished trial.
// Thread-safe: parallel trials report to one board.
#pragma once

#include "../train/trial.h"

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace bigbatch::experiments {

class ProgressBoard {
 public:
  /// `total`: the trials this run will finish (the ones left).
  explicit ProgressBoard(std::int64_t total);

  /// A trial's progress; redraws at most every 0.2 s (terminal) or 10 s.
  void update(const std::string& trial, const TrialProgress& progress);
  /// A trial's outcome, printed at once; `metric` names its best value.
  void finished(const std::string& trial, const TrialResult& result, Metric metric);

 private:
  std::mutex mutex_;
  std::int64_t total_;
  std::int64_t done_ = 0;
  bool tty_;
  std::chrono::steady_clock::time_point last_{};
  std::map<std::string, TrialProgress> live_;
};

}  // namespace bigbatch::experiments
