// The order in which a sweep runs its trials, and exact pruning: which
// running trial can no longer change the steps-to-target table.
//
// A batch size's result is the minimum, over its trials, of the first
// evaluation step at which the target is reached; write_tables breaks a tie by
// the trials' order in expand(). So once trial i* of batch size B has reached
// at step s*, any other trial i of B whose next evaluation e has
// (e, i) > (s*, i*) (lexicographically) cannot become B's row: it is pruned.
// The order only decides how soon the bound is known (docs/experiments.md
// "Pruning"); the table does not depend on it.
#pragma once

#include "config.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

namespace bigbatch::experiments {

class TrialQueue {
 public:
  /// The reach that bounds a batch size: step and the trial's index.
  struct Bound {
    std::int64_t steps = 0;
    std::size_t index = 0;
  };

  /// `trials` in write_tables's order (expand(), then any extension points);
  /// the queue keeps a reference. With prune false, pruned() is always false.
  TrialQueue(const std::vector<TrialConfig>& trials, bool prune);

  /// Trial `index` is to be run (handed out by next()).
  void add(std::size_t index);
  /// Trial `index` ended (now, or in an earlier run): reached at
  /// `steps_to_target`, or not (nullopt: not reached, diverged or pruned).
  void finished(std::size_t index, std::optional<std::int64_t> steps_to_target);

  /// The next trial to run, or nullopt when every added trial is handed out.
  /// Batch sizes in the config's order, a batch size with nothing running
  /// first (so parallel jobs spread over batch sizes and a batch size's later
  /// trials start once its likely winner has set the bound); within a batch
  /// size, the rate nearest (in log) to the predicted best: its own best so
  /// far, else the line through the best rates of the two nearest batch sizes
  /// that reached (log rate against log batch), else the one nearest, else the
  /// middle of its rates. Ties go by index.
  std::optional<std::size_t> next();
  /// next(), then every other trial left to hand out whose batch size is the
  /// same and for which together(first, other) holds, in index order: a
  /// batched group (batched.h), at most `max` trials. Empty when none is left.
  std::vector<std::size_t> next_group(const std::function<bool(std::size_t, std::size_t)>& together,
                                      std::size_t max);

  /// Whether trial `index`, whose next evaluation is at step `next_eval`, can
  /// no longer become its batch size's row. Thread-safe; cheap.
  bool pruned(std::size_t index, std::int64_t next_eval) const;

  /// The bound of trial `index`'s batch size, if one of its trials reached.
  std::optional<Bound> bound(std::size_t index) const;

  /// Whether (next_eval, index) cannot beat `bound` (the rule above).
  static bool beaten(const std::optional<Bound>& bound, std::size_t index, std::int64_t next_eval);

 private:
  std::optional<double> predicted_lr(std::size_t group) const;
  std::optional<std::size_t> next_locked();

  const std::vector<TrialConfig>& trials_;
  const bool prune_;
  std::vector<std::int64_t> batches_;     // distinct batch sizes, config order
  std::vector<std::size_t> group_;        // trial -> index in batches_
  std::vector<std::optional<Bound>> bounds_;  // per batch size
  std::vector<int> running_;              // per batch size: handed out, not finished
  std::vector<bool> pending_, out_;       // per trial
  mutable std::mutex mutex_;
};

}  // namespace bigbatch::experiments
