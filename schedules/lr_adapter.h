// Drives any torch::optim::Optimizer (LibTorch's or bigbatch's) from a
// Schedule: once per step, every param group gets the scheduled rate times its
// own ratio, and an optional hook for the momentum correction of Goyal et al.
// (docs/formulas.md "Warmup"), which LARS provides.
#pragma once

#include "schedule.h"

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace bigbatch::schedules {

/// Applies `schedule` to an optimizer:
///
///     LRAdapter adapter(optimizer, Schedule(spec, batch, train_size));
///     for (int64_t t = 0; t < steps; ++t) {
///       adapter.apply(t);            // before optimizer.step()
///       ...backward...; optimizer.step();
///     }
///
/// Group i gets lr(t) * ratio_i, ratio_i = (group i's rate) / (the defaults'
/// rate) at construction, so a group built with a 10x smaller rate stays 10x
/// smaller. The schedule's state is the step alone: after a restart, apply()
/// from the restored step gives the same rates.
class LRAdapter {
 public:
  /// Called with lr_b / lr_a when the scheduled rate changes from lr_a to
  /// lr_b between two applied steps.
  using RateChange = std::function<void(double factor)>;

  /// momentum_correction: the rescaling of momentum buffers that hold the
  /// rate (Goyal et al.), for bigbatch's LARS:
  ///   LRAdapter adapter(lars, schedule, [&lars](double f) { lars.rescale_momentum(f); });
  /// Optimizers whose buffers do not hold the rate need none.
  LRAdapter(torch::optim::Optimizer& optimizer, Schedule schedule, RateChange momentum_correction = {});

  /// Sets the rates of step t; returns the scheduled (ratio 1) rate.
  double apply(std::int64_t step);

  const Schedule& schedule() const { return schedule_; }
  const std::vector<double>& group_ratios() const { return ratios_; }

 private:
  torch::optim::Optimizer& optimizer_;
  Schedule schedule_;
  RateChange momentum_correction_;
  std::vector<double> ratios_;
  std::optional<std::int64_t> last_step_;
};

}  // namespace bigbatch::schedules
