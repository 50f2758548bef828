// Drives any torch::optim::Optimizer (LibTorch's or bigbatch's) from a
// Schedule: once per step, every param group gets the scheduled rate times its
// own ratio, with docs/formulas.md's optional momentum correction for LARS.
#pragma once

#include <bigbatch/schedules/schedule.h>

#include <torch/optim/optimizer.h>

#include <cstdint>
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
  /// momentum_correction: when the rate changes from lr_a to lr_b, multiply
  /// the momentum buffers by lr_b / lr_a (Goyal et al.). Only meaningful
  /// where the buffer holds the rate, as in bigbatch's LARS; any other
  /// optimizer is rejected.
  LRAdapter(torch::optim::Optimizer& optimizer, Schedule schedule, bool momentum_correction = false);

  /// Sets the rates of step t; returns the scheduled (ratio 1) rate.
  double apply(std::int64_t step);

  const Schedule& schedule() const { return schedule_; }
  const std::vector<double>& group_ratios() const { return ratios_; }

 private:
  void correct_momentum(double factor);

  torch::optim::Optimizer& optimizer_;
  Schedule schedule_;
  bool momentum_correction_;
  std::vector<double> ratios_;
  std::optional<std::int64_t> last_step_;
};

}  // namespace bigbatch::schedules
