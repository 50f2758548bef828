// What the optimizers' entries share (optimizer.h): the entry derived from
// one of the library's optimizers (kind_entry), an entry from a keys struct
// and its field list (config/fields.h, for torch's), the checks of the keys
// torch's have, and the two parameter groups every optimizer gets.
#pragma once

#include "optimizer.h"
#include "../../config/fields.h"
#include "../../optimizers/kind.h"
#include "../../optimizers/param_groups.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace bigbatch::experiments {

/// The entry of an optimizer whose keys are a struct `Keys` read and written
/// by `fields(io, keys)`, starting from `defaults`; `make(keys, lr, model)`
/// builds it. rate_change and scalars can be set on the result.
template <typename Keys, typename Fields, typename Make>
OptimizerEntry keyed_entry(std::string name, Fields fields, Make make, Keys defaults = Keys{}) {
  const auto read = [fields, defaults](const nlohmann::json& keys) {
    Keys k = defaults;
    config::Reader r(config::JsonReader(keys, "optimizer"));
    fields(r, k);
    r.json_reader().finish();
    return k;
  };
  OptimizerEntry e;
  e.name = std::move(name);
  e.resolve = [read, fields](const nlohmann::json& keys) { return config::write_fields(read(keys), fields); };
  e.make = [read, make](const nlohmann::json& keys, double lr, torch::nn::Module& model) {
    return make(read(keys), lr, model);
  };
  return e;
}

/// The entry of one of the library's optimizers, derived from its own
/// description (optimizers/kind.h): its keys are every option but lr (the
/// schedule's), with the optimizer's defaults but where `runner_defaults`
/// says otherwise, read as their types and checked by the optimizer's own
/// validate() (its OptionError reported at "optimizer.<option>"); it is made
/// over the kind's usual groups of the model (plain_rule's parameters
/// without decay and trust ratio), logs the optimizer's scalars() and shards.
OptimizerEntry kind_entry(const optim::OptimizerKind& kind,
                          const nlohmann::json& runner_defaults = nlohmann::json::object());

/// Keys that several optimizers have, each with its check.
template <typename Io, typename T>
void momentum_key(Io& io, T& momentum) {
  io.field("momentum", momentum);
  io.check("momentum", momentum >= 0 && momentum < 1, "must be in [0, 1), got " + config::num(momentum));
}
template <typename Io, typename T>
void weight_decay_key(Io& io, T& weight_decay) {
  io.field("weight_decay", weight_decay);
  io.check("weight_decay", weight_decay >= 0, "must be >= 0, got " + config::num(weight_decay));
}
template <typename Io, typename T>
void eps_key(Io& io, T& eps) {
  io.field("eps", eps);
  io.check("eps", eps >= 0, "must be >= 0, got " + config::num(eps));
}
/// "betas": [beta1, beta2], each in [0, 1).
template <typename Io, typename T>
void betas_key(Io& io, T& betas) {
  io.field("betas", betas);
  io.check("betas", betas.size() == 2, "expected two numbers [beta1, beta2]");
  for (const double b : betas) io.check("betas", b >= 0 && b < 1, "each must be in [0, 1), got " + config::num(b));
}
inline std::tuple<double, double> beta_pair(const std::vector<double>& betas) { return {betas.at(0), betas.at(1)}; }

/// The parameters that get neither weight decay nor a trust ratio: biases
/// and normalization parameters (0 or 1 dimensions), and embedding tables
/// (the weights of torch::nn::Embedding modules). docs/optimizers.md
/// "Parameter groups" says why embeddings.
std::function<bool(const at::Tensor&)> plain_rule(const torch::nn::Module& model);

/// torch's optimizers over the same two groups as bigbatch's, the plain one
/// without weight decay, so that a comparison differs in the update alone.
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


}  // namespace bigbatch::experiments
