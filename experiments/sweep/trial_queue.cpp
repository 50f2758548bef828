// The sweep's trial order and exact pruning (trial_queue.h).
#include "trial_queue.h"

#include "../../noise/critical_batch.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace bigbatch::experiments {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}  // namespace

std::vector<std::vector<std::size_t>> rates_of(const std::vector<TrialConfig>& trials) {
  std::vector<std::vector<std::size_t>> rates;
  for (std::size_t i = 0; i < trials.size(); ++i) {
    const TrialConfig& t = trials[i];
    const auto same = [&](const std::vector<std::size_t>& rate) {
      const TrialConfig& u = trials[rate.front()];
      return u.batch_size == t.batch_size && u.schedule.base_lr == t.schedule.base_lr &&
             u.optimizer.momentum() == t.optimizer.momentum();
    };
    const auto it = std::find_if(rates.begin(), rates.end(), same);
    if (it == rates.end()) {
      rates.push_back({i});
    } else {
      it->push_back(i);
    }
  }
  return rates;
}

TrialQueue::TrialQueue(const std::vector<TrialConfig>& trials, bool prune)
    : trials_(trials),
      prune_(prune),
      rates_(rates_of(trials)),
      rate_(trials.size()),
      lower_(trials.size(), 0),
      upper_(trials.size(), kInf),
      pending_(trials.size(), false),
      out_(trials.size(), false) {
  for (const auto& t : trials) {
    const auto it = std::find(batches_.begin(), batches_.end(), t.batch_size);
    group_.push_back(static_cast<std::size_t>(it - batches_.begin()));
    if (it == batches_.end()) batches_.push_back(t.batch_size);
  }
  batch_rates_.resize(batches_.size());
  for (std::size_t r = 0; r < rates_.size(); ++r) {
    for (const auto i : rates_[r]) rate_[i] = r;
    batch_rates_[group_[rates_[r].front()]].push_back(r);
  }
  fastest_.resize(batches_.size());
  running_.resize(batches_.size(), 0);
}

void TrialQueue::add(std::size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.at(index) = true;
}

void TrialQueue::finished(std::size_t index, Outcome outcome, std::int64_t steps) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::size_t g = group_.at(index);
  if (out_[index] && pending_[index]) --running_[g];
  pending_[index] = false;
  switch (outcome) {
    case Outcome::kReached: {
      lower_[index] = upper_[index] = static_cast<double>(steps);
      std::optional<Reach>& f = fastest_[g];
      if (!f || steps < f->steps || (steps == f->steps && index < f->index)) f = Reach{steps, index};
      break;
    }
    case Outcome::kNotReached:
      lower_[index] = upper_[index] = kInf;
      break;
    case Outcome::kPruned:  // it had not reached by `steps`
      lower_[index] = std::max(lower_[index], static_cast<double>(steps) + 1);
      upper_[index] = kInf;
      break;
  }
}

bool TrialQueue::hopeless(std::size_t index, double lower) const {
  const auto median_of = [&](std::size_t r, const std::vector<double>& bound) {
    std::vector<double> v;
    for (const auto i : rates_[r]) v.push_back(&bound == &lower_ && i == index ? lower : bound[i]);
    return noise::median_steps(std::move(v));
  };
  // The least (upper median, rate) of the batch size: the row is no worse.
  double best = kInf;
  std::size_t best_rate = 0;
  for (const auto q : batch_rates_[group_[index]]) {
    const double m = median_of(q, upper_);
    if (m < best) {
      best = m;
      best_rate = q;
    }
  }
  if (!std::isfinite(best)) return false;
  const std::size_t r = rate_[index];
  const double low = median_of(r, lower_);
  return low > best || (low == best && r > best_rate);
}

std::optional<double> TrialQueue::predicted_lr(std::size_t g) const {
  if (fastest_[g]) return trials_[fastest_[g]->index].schedule.base_lr;
  // The batch sizes that reached, nearest (in log batch size) first.
  struct Known {
    double distance, log_batch, log_lr;
  };
  std::vector<Known> known;
  const double here = std::log(static_cast<double>(batches_[g]));
  for (std::size_t h = 0; h < batches_.size(); ++h) {
    if (h == g || !fastest_[h]) continue;
    const double x = std::log(static_cast<double>(batches_[h]));
    known.push_back({std::abs(x - here), x, std::log(trials_[fastest_[h]->index].schedule.base_lr)});
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

void TrialQueue::give_back(std::size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!out_.at(index)) return;
  out_[index] = false;
  if (pending_[index]) --running_[group_[index]];
}

bool TrialQueue::pruned(std::size_t index, std::int64_t next_eval) {
  if (!prune_) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  lower_.at(index) = std::max(lower_[index], static_cast<double>(next_eval));
  return hopeless(index, lower_[index]);
}

std::optional<std::int64_t> TrialQueue::prune_from(std::size_t index) const {
  if (!prune_) return std::nullopt;
  std::lock_guard<std::mutex> lock(mutex_);
  // hopeless() is monotone in the lower bound: the least step by bisection.
  std::int64_t low = static_cast<std::int64_t>(lower_.at(index)), high = std::int64_t{1} << 50;
  if (!hopeless(index, static_cast<double>(high))) return std::nullopt;
  if (hopeless(index, static_cast<double>(low))) return low;
  while (high - low > 1) {  // hopeless at high, not at low
    const std::int64_t mid = low + (high - low) / 2;
    (hopeless(index, static_cast<double>(mid)) ? high : low) = mid;
  }
  return high;
}

}  // namespace bigbatch::experiments
