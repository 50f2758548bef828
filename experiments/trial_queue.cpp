// The sweep's trial order and exact pruning (trial_queue.h).
#include "trial_queue.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace bigbatch::experiments {

TrialQueue::TrialQueue(const std::vector<TrialConfig>& trials, bool prune)
    : trials_(trials), prune_(prune), pending_(trials.size(), false), out_(trials.size(), false) {
  for (const auto& t : trials) {
    const auto it = std::find(batches_.begin(), batches_.end(), t.batch_size);
    group_.push_back(static_cast<std::size_t>(it - batches_.begin()));
    if (it == batches_.end()) batches_.push_back(t.batch_size);
  }
  bounds_.resize(batches_.size());
  running_.resize(batches_.size(), 0);
}

void TrialQueue::add(std::size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.at(index) = true;
}

void TrialQueue::finished(std::size_t index, std::optional<std::int64_t> steps_to_target) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::size_t g = group_.at(index);
  if (out_[index] && pending_[index]) --running_[g];
  pending_[index] = false;
  if (!steps_to_target) return;
  std::optional<Bound>& b = bounds_[g];
  if (!b || *steps_to_target < b->steps || (*steps_to_target == b->steps && index < b->index)) {
    b = Bound{*steps_to_target, index};
  }
}

std::optional<double> TrialQueue::predicted_lr(std::size_t g) const {
  if (bounds_[g]) return trials_[bounds_[g]->index].schedule.base_lr;
  // The batch sizes that reached, nearest (in log batch size) first.
  struct Known {
    double distance, log_batch, log_lr;
  };
  std::vector<Known> known;
  const double here = std::log(static_cast<double>(batches_[g]));
  for (std::size_t h = 0; h < batches_.size(); ++h) {
    if (h == g || !bounds_[h]) continue;
    const double x = std::log(static_cast<double>(batches_[h]));
    known.push_back({std::abs(x - here), x, std::log(trials_[bounds_[h]->index].schedule.base_lr)});
  }
  if (known.empty()) return std::nullopt;
  std::stable_sort(known.begin(), known.end(), [](const Known& a, const Known& b) { return a.distance < b.distance; });
  if (known.size() == 1) return std::exp(known[0].log_lr);
  const Known& a = known[0];
  const Known& b = known[1];
  const double slope = (b.log_lr - a.log_lr) / (b.log_batch - a.log_batch);
  return std::exp(a.log_lr + slope * (here - a.log_batch));
}

std::optional<std::size_t> TrialQueue::next() {
  std::lock_guard<std::mutex> lock(mutex_);
  return next_locked();
}

std::vector<std::size_t> TrialQueue::next_group(const std::function<bool(std::size_t, std::size_t)>& together,
                                                std::size_t max) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::optional<std::size_t> first = next_locked();
  if (!first) return {};
  std::vector<std::size_t> group{*first};
  for (std::size_t i = 0; i < trials_.size() && group.size() < max; ++i) {
    if (i == *first || !pending_[i] || out_[i] || group_[i] != group_[*first] || !together(*first, i)) continue;
    out_[i] = true;
    ++running_[group_[i]];
    group.push_back(i);
  }
  std::sort(group.begin(), group.end());
  return group;
}

std::optional<std::size_t> TrialQueue::next_locked() {
  std::vector<bool> waiting(batches_.size(), false);
  for (std::size_t i = 0; i < trials_.size(); ++i) {
    if (pending_[i] && !out_[i]) waiting[group_[i]] = true;
  }
  std::optional<std::size_t> g;
  for (std::size_t h = 0; h < batches_.size() && !g; ++h) {
    if (waiting[h] && running_[h] == 0) g = h;
  }
  for (std::size_t h = 0; h < batches_.size() && !g; ++h) {
    if (waiting[h]) g = h;
  }
  if (!g) return std::nullopt;
  std::optional<double> target = predicted_lr(*g);
  if (!target) {  // the geometric middle of this batch size's rates
    double lo = std::numeric_limits<double>::infinity(), hi = 0;
    for (std::size_t i = 0; i < trials_.size(); ++i) {
      if (group_[i] != *g) continue;
      lo = std::min(lo, trials_[i].schedule.base_lr);
      hi = std::max(hi, trials_[i].schedule.base_lr);
    }
    target = std::sqrt(lo * hi);
  }
  std::optional<std::size_t> best;
  double best_distance = std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < trials_.size(); ++i) {
    if (group_[i] != *g || !pending_[i] || out_[i]) continue;
    const double d = std::abs(std::log(trials_[i].schedule.base_lr / *target));
    if (d < best_distance) {
      best = i;
      best_distance = d;
    }
  }
  out_[*best] = true;
  ++running_[*g];
  return best;
}

bool TrialQueue::beaten(const std::optional<Bound>& bound, std::size_t index, std::int64_t next_eval) {
  return bound && (next_eval > bound->steps || (next_eval == bound->steps && index > bound->index));
}

bool TrialQueue::pruned(std::size_t index, std::int64_t next_eval) const {
  if (!prune_) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  return beaten(bounds_[group_.at(index)], index, next_eval);
}

std::optional<TrialQueue::Bound> TrialQueue::bound(std::size_t index) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bounds_[group_.at(index)];
}

}  // namespace bigbatch::experiments
