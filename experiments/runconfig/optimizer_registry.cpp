// The optimizer registry (optimizer_registry.h).
#include "optimizer_registry.h"

#include "../../optimizers/lamb.h"
#include "../../optimizers/larc.h"
#include "../../optimizers/lars.h"
#include "../../optimizers/lion.h"
#include "../../optimizers/muon.h"
#include "../../optimizers/novograd.h"
#include "../../optimizers/param_groups.h"

#include <c10/util/Exception.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/nn/modules/embedding.h>
#include <torch/optim/sgd.h>

#include <functional>
#include <unordered_set>

#include <tuple>

namespace bigbatch::experiments {
namespace {

using OptimizerPtr = std::unique_ptr<torch::optim::Optimizer>;

std::tuple<double, double> betas_or(const OptimizerSpec& s, std::tuple<double, double> fallback) {
  return s.betas ? std::make_tuple((*s.betas)[0], (*s.betas)[1]) : fallback;
}

// The options every optimizer here has: weight decay and eps, when the spec sets them.
template <typename Options>
Options& common(Options& o, const OptimizerSpec& s) {
  if (s.weight_decay) o.weight_decay(*s.weight_decay);
  if (s.eps) o.eps(*s.eps);
  return o;
}

// The parameters that get neither weight decay nor a trust ratio: biases
// and normalization parameters (0 or 1 dimensions), and embedding tables
// (the weights of torch::nn::Embedding modules). docs/optimizers.md
// "Parameter groups" says why embeddings.
std::function<bool(const at::Tensor&)> plain_rule(const torch::nn::Module& model) {
  std::unordered_set<const void*> tables;
  const auto note = [&](const torch::nn::Module& m) {
    if (const auto* e = dynamic_cast<const torch::nn::EmbeddingImpl*>(&m)) tables.insert(e->weight.unsafeGetTensorImpl());
  };
  note(model);
  for (const auto& m : model.modules(/*include_self=*/false)) note(*m);
  return [tables = std::move(tables)](const at::Tensor& p) {
    return p.dim() < 2 || tables.count(p.unsafeGetTensorImpl()) > 0;
  };
}

// torch's optimizers over the same two groups as bigbatch's, the plain one
// without weight decay, so that a comparison differs in the update alone.
template <typename Options>
std::vector<torch::optim::OptimizerParamGroup> torch_groups(torch::nn::Module& model, const Options& o) {
  const auto plain = plain_rule(model);
  std::vector<at::Tensor> decayed, others;
  for (const auto& p : model.parameters()) {
    if (p.requires_grad()) (plain(p) ? others : decayed).push_back(p);
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decayed.empty()) groups.emplace_back(decayed, std::make_unique<Options>(o));
  if (!others.empty()) {
    auto no_decay = std::make_unique<Options>(o);
    no_decay->weight_decay(0);
    groups.emplace_back(others, std::move(no_decay));
  }
  return groups;
}

OptimizerPtr sgd(const OptimizerSpec& s, double lr, torch::nn::Module& model) {
  auto o = torch::optim::SGDOptions(lr).momentum(s.momentum).nesterov(s.nesterov);
  if (s.weight_decay) o.weight_decay(*s.weight_decay);  // SGD has no eps
  return std::make_unique<torch::optim::SGD>(torch_groups(model, o), o);
}

template <typename Optimizer, typename Options>
OptimizerPtr adam_like(const OptimizerSpec& s, double lr, torch::nn::Module& model) {
  auto o = Options(lr).betas(betas_or(s, {0.9, 0.999}));
  common(o, s);
  return std::make_unique<Optimizer>(torch_groups(model, o), o);
}

// bigbatch's layer-wise optimizers over the two usual groups.
template <typename Optimizer, typename Options>
OptimizerPtr layerwise(const Options& o, torch::nn::Module& model) {
  return std::make_unique<Optimizer>(optim::layerwise_param_groups(model, o, plain_rule(model)), o);
}

template <typename Optimizer, typename Options>
OptimizerPtr lars_like(const OptimizerSpec& s, double lr, torch::nn::Module& model) {
  auto o = Options(lr).momentum(s.momentum).nesterov(s.nesterov);
  if (s.trust_coefficient) o.trust_coefficient(*s.trust_coefficient);
  return layerwise<Optimizer>(common(o, s), model);
}

OptimizerPtr lamb(const OptimizerSpec& s, double lr, torch::nn::Module& model) {
  auto o = optim::LAMBOptions(lr).betas(betas_or(s, {0.9, 0.999}));
  if (s.max_grad_norm) o.max_grad_norm(*s.max_grad_norm);
  return layerwise<optim::LAMB>(common(o, s), model);
}

OptimizerPtr novograd(const OptimizerSpec& s, double lr, torch::nn::Module& model) {
  auto o = optim::NovoGradOptions(lr).betas(betas_or(s, {0.95, 0.98}));
  return layerwise<optim::NovoGrad>(common(o, s), model);
}

OptimizerPtr lion(const OptimizerSpec& s, double lr, torch::nn::Module& model) {
  auto o = optim::LionOptions(lr).betas(betas_or(s, {0.9, 0.99}));
  if (s.weight_decay) o.weight_decay(*s.weight_decay);  // Lion has no eps
  return layerwise<optim::Lion>(o, model);
}

// Muon on the hidden matrices, AdamW (its betas and eps from the spec) on the
// rest: the input layer, the output head, and the plain parameters without
// decay (embedding tables among them, as for the others). The update scale
// is Moonshot's match_rms_adamw unless the spec says: one rate then suits
// both parts, which is what a rate search over one lr needs.
OptimizerPtr muon(const OptimizerSpec& s, double lr, torch::nn::Module& model) {
  auto o = optim::MuonOptions(lr)
               .momentum(s.momentum)
               .nesterov(s.nesterov)
               .adjust_lr(s.adjust_lr.value_or("match_rms_adamw"))
               .adamw_betas(betas_or(s, {0.9, 0.999}));
  if (s.weight_decay) o.weight_decay(*s.weight_decay);
  if (s.eps) o.adamw_eps(*s.eps);
  const auto plain = plain_rule(model);
  const auto groups = optim::muon_param_groups(model, o, optim::muon_adamw_rule(model),
                                               [&](const std::string&, const at::Tensor& p) { return plain(p); });
  return std::make_unique<optim::Muon>(groups, o);
}

}  // namespace

const std::vector<OptimizerEntry>& optimizer_registry() {
  static const std::vector<OptimizerEntry> registry = {
      {OptimizerName::kSgd, "sgd", sgd},
      {OptimizerName::kAdam, "adam", adam_like<torch::optim::Adam, torch::optim::AdamOptions>},
      {OptimizerName::kAdamW, "adamw", adam_like<torch::optim::AdamW, torch::optim::AdamWOptions>},
      {OptimizerName::kLars, "lars", lars_like<optim::LARS, optim::LARSOptions>},
      {OptimizerName::kLarc, "larc", lars_like<optim::LARC, optim::LARCOptions>},
      {OptimizerName::kLamb, "lamb", lamb},
      {OptimizerName::kNovoGrad, "novograd", novograd},
      {OptimizerName::kLion, "lion", lion},
      {OptimizerName::kMuon, "muon", muon},
  };
  return registry;
}

std::string to_string(OptimizerName name) { return config::enum_name(optimizer_registry(), name); }

OptimizerPtr make_optimizer(const OptimizerSpec& spec, double lr, torch::nn::Module& model) {
  for (const auto& entry : optimizer_registry()) {
    if (entry.value == spec.name) return entry.make(spec, lr, model);
  }
  TORCH_INTERNAL_ASSERT(false, "optimizer ", static_cast<int>(spec.name), " is not in the registry");
}

schedules::LRAdapter::RateChange rate_change(const OptimizerSpec& spec, torch::optim::Optimizer& optimizer) {
  if (!spec.momentum_correction) return {};
  auto* lars = dynamic_cast<optim::LARS*>(&optimizer);
  TORCH_INTERNAL_ASSERT(lars != nullptr, "config validation allows momentum_correction for lars only");
  return [lars](double factor) { lars->rescale_momentum(factor); };
}

}  // namespace bigbatch::experiments
