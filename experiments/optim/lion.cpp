// "lion": bigbatch's Lion (Chen et al. 2023) over the two usual groups (it
// has no eps).
#include "builtin.h"
#include "entry.h"
#include "../../optimizers/lion.h"

namespace bigbatch::experiments {
namespace {

struct LionKeys {
  std::vector<double> betas{0.9, 0.99};
  double weight_decay = optim::LionOptions().weight_decay();
};

template <typename Io, typename Keys>
void lion_keys(Io& io, Keys& k) {
  betas_key(io, k.betas);
  weight_decay_key(io, k.weight_decay);
}

}  // namespace

OptimizerEntry lion_entry() {
  OptimizerEntry e = keyed_entry<LionKeys>(
      "lion", [](auto& io, auto& k) { lion_keys(io, k); },
      [](const LionKeys& k, double lr, torch::nn::Module& model) {
        const auto o = optim::LionOptions(lr).betas(beta_pair(k.betas)).weight_decay(k.weight_decay);
        return layerwise<optim::Lion>(o, model);
      });
  e.scalars = trust_ratio_scalars;
  e.shards = true;
  return e;
}

}  // namespace bigbatch::experiments
