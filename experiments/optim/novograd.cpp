// "novograd": bigbatch's NovoGrad (Ginsburg et al. 2019) over the two usual
// groups; its trust ratios (the per-layer normalization's scale).
#include "builtin.h"
#include "entry.h"
#include "../../optimizers/novograd.h"

namespace bigbatch::experiments {
namespace {

struct NovoGradKeys {
  std::vector<double> betas{0.95, 0.98};
  double eps = optim::NovoGradOptions().eps();
  double weight_decay = optim::NovoGradOptions().weight_decay();
};

template <typename Io, typename Keys>
void novograd_keys(Io& io, Keys& k) {
  betas_key(io, k.betas);
  eps_key(io, k.eps);
  weight_decay_key(io, k.weight_decay);
}

}  // namespace

OptimizerEntry novograd_entry() {
  OptimizerEntry e = keyed_entry<NovoGradKeys>(
      "novograd", [](auto& io, auto& k) { novograd_keys(io, k); },
      [](const NovoGradKeys& k, double lr, torch::nn::Module& model) {
        const auto o = optim::NovoGradOptions(lr).betas(beta_pair(k.betas)).eps(k.eps).weight_decay(k.weight_decay);
        return layerwise<optim::NovoGrad>(o, model);
      });
  e.scalars = trust_ratio_scalars;
  e.shards = true;
  return e;
}

}  // namespace bigbatch::experiments
