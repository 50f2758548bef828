// The library's optimizers described at run time, each from its own
// declarations: the options (names, defaults and types from the options
// type's field list, checks from its validate()) and the state fields (the
// state type's field list). The runner's config keys (experiments/optim/),
// the Python package's keyword arguments, defaults, classes and state checks
// (python/), and any list of their names derive from this one description;
// an optimizer is registered once, in kinds.cpp.
//
// Options cross as JSON objects keyed by the options' archive names (the
// keys save() writes): numbers, booleans, strings, and arrays for tuples
// (betas); a non-finite number as the string "inf", "-inf" or "nan".
#pragma once

#include "layerwise_optimizer.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace bigbatch::optim {

/// Which parameters get neither weight decay nor a trust ratio (biases,
/// normalization parameters, embedding tables: the caller's rule).
using PlainRule = std::function<bool(const at::Tensor& param)>;

struct OptimizerKind {
  /// The class's name, which its checkpoints record ("LAMB", "NovoGrad").
  std::string name;
  /// Every option with its default.
  nlohmann::json defaults;
  /// The options without a default ("lr" for LARS and LARC): `defaults`
  /// holds 0 for them, and a user must give them.
  std::vector<std::string> required;
  /// The per-parameter state's fields, in declaration order.
  std::vector<StateField> state;
  /// Whether its point to evaluate differs from the training point
  /// (LayerwiseOptimizerBase::has_evaluation_point: Schedule-Free).
  bool evaluation_point = false;

  /// Every option: `base` (options as `defaults` holds them) with the
  /// options `given` names replaced, read as the defaults' types and
  /// validated as a whole. An option the kind has not, a value of the wrong
  /// type or one validate() refuses throws OptionError naming it.
  std::function<nlohmann::json(const nlohmann::json& base, const nlohmann::json& given)> check;
  /// The optimizer over `groups`, each its parameters and its full options
  /// (as check() gives them), with `defaults` (full options) for groups added later.
  std::function<std::unique_ptr<LayerwiseOptimizerBase>(
      const std::vector<std::pair<std::vector<at::Tensor>, nlohmann::json>>& groups, const nlohmann::json& defaults)>
      make;
  /// The usual parameter groups of `module` for `options` (full), each group
  /// with its full options: LARS/LARC/LAMB/NovoGrad/Lion's two groups
  /// (param_groups.h: the plain parameters without decay and trust ratio),
  /// Muon's split (muon_param_groups). `plain` is the caller's rule.
  std::function<std::vector<std::pair<std::vector<at::Tensor>, nlohmann::json>>(
      const torch::nn::Module& module, const nlohmann::json& options, const PlainRule& plain)>
      param_groups;
  /// The full options of group `group` of `optimizer` (one of this kind).
  std::function<nlohmann::json(const LayerwiseOptimizerBase& optimizer, std::size_t group)> group_options;
  /// Replaces the options of group `group` by `options` (full, as check() gives them).
  std::function<void(LayerwiseOptimizerBase& optimizer, std::size_t group, const nlohmann::json& options)>
      set_group_options;
  /// Adds a group of `params` with `options` (full, as check() gives them).
  std::function<void(LayerwiseOptimizerBase& optimizer, std::vector<at::Tensor> params, const nlohmann::json& options)>
      add_group;
};

/// The library's optimizers, in the order their lists are written (LARS,
/// LARC, LAMB, NovoGrad, Lion, Muon, AdamWScheduleFree, SGDScheduleFree): what
/// kinds.cpp registers.
const std::vector<OptimizerKind>& optimizer_kinds();

/// The kind named `name`; a c10::ValueError listing the kinds where there is none.
const OptimizerKind& optimizer_kind(const std::string& name);

}  // namespace bigbatch::optim
