// "muon": bigbatch's Muon (Jordan et al. 2024) on the hidden matrices, AdamW
// (its betas and eps are "betas" and "eps") on the rest: the input layer, the
// output head, and the plain parameters without decay (embedding tables among
// them, as for the others). PyTorch's momentum 0.95 and Nesterov unless
// given. The update scale is Moonshot's match_rms_adamw unless the config
// says: one rate then suits both parts, which is what a rate search over one
// lr needs. It logs its trust ratios and each matrix's update RMS.
#include "builtin.h"
#include "entry.h"
#include "../../optimizers/muon.h"

#include <string>

namespace bigbatch::experiments {
namespace {

struct MuonKeys {
  double momentum = optim::MuonOptions().momentum();
  bool nesterov = optim::MuonOptions().nesterov();
  double weight_decay = optim::MuonOptions().weight_decay();
  double eps = optim::MuonOptions().adamw_eps();  ///< its AdamW groups'
  std::vector<double> betas{0.9, 0.999};          ///< its AdamW groups'
  std::string adjust_lr = "match_rms_adamw";
};

template <typename Io, typename Keys>
void muon_keys(Io& io, Keys& k) {
  momentum_key(io, k.momentum);
  io.field("nesterov", k.nesterov);
  weight_decay_key(io, k.weight_decay);
  eps_key(io, k.eps);
  betas_key(io, k.betas);
  io.field("adjust_lr", k.adjust_lr);
  io.check("adjust_lr", k.adjust_lr == "original" || k.adjust_lr == "match_rms_adamw" || k.adjust_lr == "spectral_unclamped",
           "must be \"original\", \"match_rms_adamw\" or \"spectral_unclamped\", got \"" + k.adjust_lr + "\"");
}

std::unique_ptr<torch::optim::Optimizer> make_muon(const MuonKeys& k, double lr, torch::nn::Module& model) {
  const auto o = optim::MuonOptions(lr)
                     .momentum(k.momentum)
                     .nesterov(k.nesterov)
                     .weight_decay(k.weight_decay)
                     .adjust_lr(k.adjust_lr)
                     .adamw_betas(beta_pair(k.betas))
                     .adamw_eps(k.eps);
  const auto plain = plain_rule(model);
  const auto groups = optim::muon_param_groups(model, o, optim::muon_adamw_rule(model),
                                               [&](const std::string&, const at::Tensor& p) { return plain(p); });
  return std::make_unique<optim::Muon>(groups, o);
}

std::vector<LayerScalar> muon_scalars(const torch::optim::Optimizer& optimizer) {
  std::vector<LayerScalar> out = trust_ratio_scalars(optimizer);
  if (const auto* muon = dynamic_cast<const optim::Muon*>(&optimizer)) {
    for (const auto& r : muon->update_rms()) out.push_back({"muon_update_rms", r.param, r.rms});
  }
  return out;
}

}  // namespace

OptimizerEntry muon_entry() {
  OptimizerEntry e = keyed_entry<MuonKeys>("muon", [](auto& io, auto& k) { muon_keys(io, k); }, make_muon);
  e.scalars = muon_scalars;
  e.shards = true;  // whole matrices to ranks (distributed/sharded.h)
  return e;
}

}  // namespace bigbatch::experiments
