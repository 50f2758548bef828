// "lars": what the runner adds to the entry it derives from LARS's own
// description (kind.cpp): Goyal et al.'s momentum correction, a runner key of
// its own (LARS keeps the rate in its momentum buffer; with the correction, a
// change of rate rescales the buffer by the same factor).
#include "builtin.h"
#include "entry.h"
#include "../../config/json_reader.h"
#include "../../optimizers/lars.h"

#include <c10/util/Exception.h>

namespace bigbatch::experiments {

OptimizerEntry lars_entry(const optim::OptimizerKind& kind) {
  const OptimizerEntry derived = kind_entry(kind);
  OptimizerEntry e = derived;
  e.resolve = [resolve = derived.resolve](const nlohmann::json& keys) {
    nlohmann::json options = keys;
    const bool correction = config::JsonReader(keys, "optimizer").boolean("momentum_correction", false);
    options.erase("momentum_correction");
    nlohmann::json out = resolve(options);
    out["momentum_correction"] = correction;
    return out;
  };
  e.make = [make = derived.make](const nlohmann::json& keys, double lr, torch::nn::Module& model) {
    nlohmann::json options = keys;
    options.erase("momentum_correction");
    return make(options, lr, model);
  };
  e.rate_change = [](const nlohmann::json& keys, torch::optim::Optimizer& optimizer) {
    schedules::LRAdapter::RateChange change;
    if (!keys.value("momentum_correction", false)) return change;
    auto* lars = dynamic_cast<optim::LARS*>(&optimizer);
    TORCH_INTERNAL_ASSERT(lars != nullptr, "the lars entry made an optimizer that is not LARS");
    change = [lars](double factor) { lars->rescale_momentum(factor); };
    return change;
  };
  return e;
}

}  // namespace bigbatch::experiments
