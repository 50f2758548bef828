// "lamb": bigbatch's LAMB (You et al. 2019) over the two usual groups, with
// its optional global gradient-norm clipping; its trust ratios.
#include "builtin.h"
#include "entry.h"
#include "../../optimizers/lamb.h"

namespace bigbatch::experiments {
namespace {

struct LambKeys {
  std::vector<double> betas{0.9, 0.999};
  double eps = optim::LAMBOptions().eps();
  double weight_decay = optim::LAMBOptions().weight_decay();
  double max_grad_norm = optim::LAMBOptions().max_grad_norm();  ///< 0: no clipping
};

template <typename Io, typename Keys>
void lamb_keys(Io& io, Keys& k) {
  betas_key(io, k.betas);
  eps_key(io, k.eps);
  weight_decay_key(io, k.weight_decay);
  io.field("max_grad_norm", k.max_grad_norm);
  io.check("max_grad_norm", k.max_grad_norm >= 0, "must be >= 0, got " + config::num(k.max_grad_norm));
}

}  // namespace

OptimizerEntry lamb_entry() {
  OptimizerEntry e = keyed_entry<LambKeys>(
      "lamb", [](auto& io, auto& k) { lamb_keys(io, k); },
      [](const LambKeys& k, double lr, torch::nn::Module& model) {
        const auto o = optim::LAMBOptions(lr)
                           .betas(beta_pair(k.betas))
                           .eps(k.eps)
                           .weight_decay(k.weight_decay)
                           .max_grad_norm(k.max_grad_norm);
        return layerwise<optim::LAMB>(o, model);
      });
  e.scalars = trust_ratio_scalars;
  e.shards = true;
  return e;
}

}  // namespace bigbatch::experiments
