// The order in which a sweep runs its trials, and exact pruning: which
// running trial can no longer change the steps-to-target table.
//
// The table's rule (results.h, docs/experiments.md "Seeds"): trials that
// differ only in their seed form a rate; a rate's steps are the median over
// its seeds (not reached counts as +infinity); a batch size's row is the rate
// with the least (median, position), its position being that of its first
// trial in expand()'s order. Every trial's steps lie in [lower, upper]: a
// reach is known, a trial that has passed step e without reaching has
// [e, inf], one not started [0, inf]. The median is monotone in each value,
// so a rate's median lies between the medians of its lower and its upper
// bounds. Trial i of rate r is pruned once
//   (median of r's lower bounds, r) > min over B's rates q of (median of q's upper bounds, q)
// (lexicographically): r can no longer become the row, and the row's rate,
// which never meets this test, runs every seed to its end. The order only
// decides how soon the bounds are known; the table does not depend on it.
#pragma once

#include "../runconfig/config.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

namespace bigbatch::experiments {

/// The rates of `trials`: each a list of the indices of trials that differ
/// only in their seed (same batch size, base rate and momentum), in index
/// order; the rates in the order of their first trials.
std::vector<std::vector<std::size_t>> rates_of(const std::vector<TrialConfig>& trials);

class TrialQueue {
 public:
  /// How a trial ended, for the bounds above.
  enum class Outcome { kReached, kNotReached, kPruned };

  /// `trials` in write_tables's order (expand(), then any extension points);
  /// the queue keeps a reference. With prune false, pruned() is always false.
  TrialQueue(const std::vector<TrialConfig>& trials, bool prune);

  /// Trial `index` is to be run (handed out by next()).
  void add(std::size_t index);
  /// Trial `index` ended (now, or in an earlier run): reached at `steps`
  /// (kReached); did not (kNotReached: budget, divergence, failure); or was
  /// pruned, its reach lying beyond step `steps` (kPruned).
  void finished(std::size_t index, Outcome outcome, std::int64_t steps);

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

  /// Takes back trial `index`, handed out by next() or next_group() but not
  /// run here (another worker holds it: claims.h); it is handed out again.
  void give_back(std::size_t index);

  /// Whether trial `index`, which has not reached before its next evaluation
  /// at step `next_eval` (now its lower bound), can no longer make its rate
  /// the row (the rule above). Thread-safe; cheap.
  bool pruned(std::size_t index, std::int64_t next_eval);

  /// The least next evaluation at which trial `index` is pruned while every
  /// other trial stays as it is now; nullopt when none is. Under a process
  /// group trials run one at a time, so rank 0 can send this with the trial.
  std::optional<std::int64_t> prune_from(std::size_t index) const;
  /// Whether `next_eval` has reached prune_from's answer.
  static bool beaten(const std::optional<std::int64_t>& prune_from, std::int64_t next_eval) {
    return prune_from && next_eval >= *prune_from;
  }

 private:
  struct Reach {
    std::int64_t steps = 0;
    std::size_t index = 0;
  };
  std::optional<double> predicted_lr(std::size_t group) const;
  std::optional<std::size_t> next_locked();
  // The rule above for trial `index` with its lower bound taken as `lower`.
  bool hopeless(std::size_t index, double lower) const;

  const std::vector<TrialConfig>& trials_;
  const bool prune_;
  std::vector<std::int64_t> batches_;     // distinct batch sizes, config order
  std::vector<std::size_t> group_;        // trial -> index in batches_
  std::vector<std::vector<std::size_t>> rates_;  // rates_of(trials)
  std::vector<std::size_t> rate_;         // trial -> index in rates_
  std::vector<std::vector<std::size_t>> batch_rates_;  // per batch size, its rates
  std::vector<double> lower_, upper_;     // per trial: its steps' bounds
  std::vector<std::optional<Reach>> fastest_;  // per batch size: its fastest reach (for the order)
  std::vector<int> running_;              // per batch size: handed out, not finished
  std::vector<bool> pending_, out_;       // per trial
  mutable std::mutex mutex_;
};

}  // namespace bigbatch::experiments
