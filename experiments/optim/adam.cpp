// "adam" and "adamw": torch's, over the same two groups as bigbatch's
// optimizers (entry.h), with torch's defaults (AdamW's weight decay 0.01).
#include "builtin.h"
#include "entry.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

namespace bigbatch::experiments {
namespace {

struct AdamKeys {
  std::vector<double> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0;
};

template <typename Io, typename Keys>
void adam_keys(Io& io, Keys& k) {
  betas_key(io, k.betas);
  eps_key(io, k.eps);
  weight_decay_key(io, k.weight_decay);
}

template <typename Optimizer, typename Options>
OptimizerEntry adam_like(const char* name, double weight_decay) {
  AdamKeys defaults;
  defaults.weight_decay = weight_decay;
  auto entry = keyed_entry<AdamKeys>(
      name, [](auto& io, auto& k) { adam_keys(io, k); },
      [](const AdamKeys& k, double lr, torch::nn::Module& model) -> std::unique_ptr<torch::optim::Optimizer> {
        const auto o = Options(lr).betas(beta_pair(k.betas)).eps(k.eps).weight_decay(k.weight_decay);
        return std::make_unique<Optimizer>(torch_groups(model, o), o);
      },
      defaults);
  return entry;
}

}  // namespace

OptimizerEntry adam_entry() { return adam_like<torch::optim::Adam, torch::optim::AdamOptions>("adam", 0); }
OptimizerEntry adamw_entry() {
  return adam_like<torch::optim::AdamW, torch::optim::AdamWOptions>("adamw", torch::optim::AdamWOptions().weight_decay());
}

}  // namespace bigbatch::experiments
