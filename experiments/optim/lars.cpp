// "lars" and "larc": bigbatch's layer-wise SGD (You et al. 2017) and its
// clipped form (NVIDIA's LARC), over the two usual groups; LARS's momentum
// correction (Goyal et al. 2017) when the rate changes; their trust ratios.
#include "builtin.h"
#include "entry.h"
#include "../../optimizers/larc.h"
#include "../../optimizers/lars.h"

#include <c10/util/Exception.h>

namespace bigbatch::experiments {
namespace {

struct LarsKeys {
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 0;
  double trust_coefficient = 0;
  double eps = 0;
  bool momentum_correction = false;  ///< lars: rescale the buffer when lr changes
};

template <typename Io, typename Keys>
void lars_like_keys(Io& io, Keys& k) {
  momentum_key(io, k.momentum);
  io.field("nesterov", k.nesterov);
  weight_decay_key(io, k.weight_decay);
  io.field("trust_coefficient", k.trust_coefficient);
  io.check("trust_coefficient", k.trust_coefficient > 0, "must be > 0, got " + config::num(k.trust_coefficient));
  eps_key(io, k.eps);
}

template <typename Options>
Options lars_like_options(const LarsKeys& k, double lr) {
  return Options(lr)
      .momentum(k.momentum)
      .nesterov(k.nesterov)
      .weight_decay(k.weight_decay)
      .trust_coefficient(k.trust_coefficient)
      .eps(k.eps);
}

// The keys' defaults: the trust coefficient and eps are each optimizer's own.
template <typename Options>
LarsKeys lars_like_defaults() {
  const Options d(0);
  LarsKeys k;
  k.trust_coefficient = d.trust_coefficient();
  k.eps = d.eps();
  return k;
}

}  // namespace

OptimizerEntry lars_entry() {
  OptimizerEntry e = keyed_entry<LarsKeys>(
      "lars",
      [](auto& io, auto& k) {
        lars_like_keys(io, k);
        io.field("momentum_correction", k.momentum_correction);
      },
      [](const LarsKeys& k, double lr, torch::nn::Module& model) {
        return layerwise<optim::LARS>(lars_like_options<optim::LARSOptions>(k, lr), model);
      },
      lars_like_defaults<optim::LARSOptions>());
  // LARS keeps the rate in its momentum buffer: with the correction, a rate
  // change rescales the buffer by the same factor.
  e.rate_change = [](const nlohmann::json& keys, torch::optim::Optimizer& optimizer) {
    schedules::LRAdapter::RateChange change;
    if (!keys.value("momentum_correction", false)) return change;
    auto* lars = dynamic_cast<optim::LARS*>(&optimizer);
    TORCH_INTERNAL_ASSERT(lars != nullptr, "the lars entry made an optimizer that is not LARS");
    change = [lars](double factor) { lars->rescale_momentum(factor); };
    return change;
  };
  e.scalars = trust_ratio_scalars;
  e.shards = true;
  return e;
}

OptimizerEntry larc_entry() {
  OptimizerEntry e = keyed_entry<LarsKeys>(
      "larc", [](auto& io, auto& k) { lars_like_keys(io, k); },
      [](const LarsKeys& k, double lr, torch::nn::Module& model) {
        return layerwise<optim::LARC>(lars_like_options<optim::LARCOptions>(k, lr), model);
      },
      lars_like_defaults<optim::LARCOptions>());
  e.scalars = trust_ratio_scalars;
  e.shards = true;
  return e;
}

}  // namespace bigbatch::experiments
