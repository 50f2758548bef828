// LRAdapter (lr_adapter.h): scheduled rates into any optimizer's param groups.
#include "lr_adapter.h"

#include <c10/util/Exception.h>

namespace bigbatch::schedules {

LRAdapter::LRAdapter(torch::optim::Optimizer& optimizer, Schedule schedule, RateChange momentum_correction)
    : optimizer_(optimizer), schedule_(std::move(schedule)), momentum_correction_(std::move(momentum_correction)) {
  const double reference = optimizer_.defaults().get_lr();
  for (auto& group : optimizer_.param_groups()) {
    const double lr = group.options().get_lr();
    TORCH_CHECK(lr >= 0, "LRAdapter: a param group has a negative learning rate ", lr);
    ratios_.push_back(reference > 0 ? lr / reference : 1.0);
  }
}

double LRAdapter::apply(std::int64_t step) {
  auto& groups = optimizer_.param_groups();
  TORCH_CHECK(groups.size() == ratios_.size(), "LRAdapter: the optimizer had ", ratios_.size(),
              " param groups when the adapter was made and has ", groups.size(),
              " now; make the adapter after adding every group");
  const double lr = schedule_.lr(step);
  if (momentum_correction_ && step > 0 && last_step_ != step) {
    const double before = schedule_.lr(last_step_.value_or(step - 1));
    if (before > 0 && lr != before) momentum_correction_(lr / before);
  }
  for (std::size_t i = 0; i < groups.size(); ++i) groups[i].options().set_lr(lr * ratios_[i]);
  last_step_ = step;
  return lr;
}

}  // namespace bigbatch::schedules
