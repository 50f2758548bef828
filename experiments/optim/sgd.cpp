// "sgd": torch's SGD with momentum (0.9 unless given) and weight decay on
// the decayed group only (entry.h).
#include "builtin.h"
#include "entry.h"

#include <torch/optim/sgd.h>

namespace bigbatch::experiments {
namespace {

struct SgdKeys {
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 0;
};

template <typename Io, typename Keys>
void sgd_keys(Io& io, Keys& k) {
  momentum_key(io, k.momentum);
  io.field("nesterov", k.nesterov);
  weight_decay_key(io, k.weight_decay);
}

}  // namespace

OptimizerEntry sgd_entry() {
  return keyed_entry<SgdKeys>(
      "sgd", [](auto& io, auto& k) { sgd_keys(io, k); },
      [](const SgdKeys& k, double lr, torch::nn::Module& model) -> std::unique_ptr<torch::optim::Optimizer> {
        const auto o = torch::optim::SGDOptions(lr).momentum(k.momentum).nesterov(k.nesterov).weight_decay(k.weight_decay);
        return std::make_unique<torch::optim::SGD>(torch_groups(model, o), o);
      });
}

}  // namespace bigbatch::experiments
