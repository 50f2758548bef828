// The library's optimizers as OptimizerKinds (kind.h): a generic description
// made from each optimizer's own types, and the one list that registers them.
#include "kind.h"

#include "lamb.h"
#include "larc.h"
#include "lars.h"
#include "lion.h"
#include "muon.h"
#include "novograd.h"
#include "param_groups.h"
#include "schedule_free.h"
#include "shampoo.h"
#include "soap.h"

#include <c10/util/Exception.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <type_traits>
#include <utility>

namespace bigbatch::optim {
namespace {

using nlohmann::json;
using torch::optim::OptimizerParamGroup;
using Groups = std::vector<std::pair<std::vector<at::Tensor>, json>>;

// ------------------------------------------------- options as JSON ----

/// An option's value as JSON: a non-finite double as "inf", "-inf" or "nan".
json to_json(const c10::IValue& v) {
  if (v.isDouble()) {
    const double d = v.toDouble();
    if (std::isnan(d)) return "nan";
    if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
    return d;
  }
  if (v.isBool()) return v.toBool();
  if (v.isInt()) return v.toInt();
  if (v.isString()) return v.toStringRef();
  if (v.isTuple()) {
    json out = json::array();
    for (const auto& e : v.toTupleRef().elements()) out.push_back(to_json(e));
    return out;
  }
  TORCH_INTERNAL_ASSERT(false, "bigbatch: an option of type ", v.tagKind(), " has no JSON form");
}

/// `j` read as the type of `like` (the default of option `key` of `kind`);
/// an OptionError names the option, the value and the type it must have.
c10::IValue from_json(const json& j, const c10::IValue& like, const std::string& kind, const std::string& key) {
  const auto refuse = [&](const char* expected) { throw OptionError(kind, key, j.dump(), expected); };
  if (like.isDouble()) {
    if (j.is_number()) return j.get<double>();
    if (j.is_string()) {
      const auto s = j.get<std::string>();
      if (s == "inf") return std::numeric_limits<double>::infinity();
      if (s == "-inf") return -std::numeric_limits<double>::infinity();
      if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
    }
    refuse("a number");
  }
  if (like.isBool()) {
    if (j.is_boolean()) return j.get<bool>();
    refuse("true or false");
  }
  if (like.isInt()) {
    if (j.is_number_integer()) return j.get<std::int64_t>();
    refuse("an integer");
  }
  if (like.isString()) {
    if (j.is_string()) return j.get<std::string>();
    refuse("a string");
  }
  if (like.isTuple()) {
    const auto& elements = like.toTupleRef().elements();
    if (!j.is_array() || j.size() != elements.size()) {
      refuse(elements.size() == 2 ? "a pair of numbers" : "a list of numbers as long as the default");
    }
    std::vector<c10::IValue> out;
    for (std::size_t i = 0; i < elements.size(); ++i) {
      out.push_back(from_json(j[i], elements[i], kind, key + "[" + std::to_string(i) + "]"));
    }
    return c10::ivalue::Tuple::create(std::move(out));
  }
  TORCH_INTERNAL_ASSERT(false, "bigbatch: option ", key, " of type ", like.tagKind(), " has no JSON form");
}

/// What `out` holds, to read back: the options types serialize one way into
/// an OutputArchive and the other way from an InputArchive only.
torch::serialize::InputArchive reread(torch::serialize::OutputArchive& out) {
  std::stringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  return in;
}

/// Every option of `options` by its archive key, in declaration order (the
/// options type's own field list, through its serialize()).
template <typename Options>
std::vector<std::pair<std::string, c10::IValue>> option_values(const Options& options) {
  torch::serialize::OutputArchive out;
  options.serialize(out);
  torch::serialize::InputArchive in = reread(out);
  std::vector<std::pair<std::string, c10::IValue>> values;
  for (const auto& key : in.keys()) {
    c10::IValue v;
    in.read(key, v);
    values.emplace_back(key, std::move(v));
  }
  return values;
}

template <typename Options>
json options_json(const Options& options) {
  json out = json::object();
  for (const auto& [key, value] : option_values(options)) out[key] = to_json(value);
  return out;
}

/// `base` with the options `j` names replaced, validated (validate()'s
/// OptionError, or one from_json throws).
template <typename Options>
Options options_from_json(const Options& base, const json& j, const std::string& kind) {
  TORCH_CHECK_VALUE(j.is_object(), kind, " options: expected an object, got ", j.dump());
  auto values = option_values(base);
  for (const auto& [key, value] : j.items()) {
    const auto it = std::find_if(values.begin(), values.end(), [&](const auto& v) { return v.first == key; });
    if (it == values.end()) {
      std::string names;
      for (const auto& v : values) names += (names.empty() ? "" : ", ") + v.first;
      throw OptionError(kind, key, value.dump(), std::string("one of its options (") + names + ")");
    }
    it->second = from_json(value, it->second, kind, key);
  }
  torch::serialize::OutputArchive out;
  for (const auto& [key, value] : values) out.write(key, value);
  torch::serialize::InputArchive in = reread(out);
  Options options = base;
  options.serialize(in);
  options.validate();
  return options;
}

/// The options a kind starts from: its defaults, with lr 0 where the options
/// have no default rate (LARS, LARC).
template <typename Options>
Options default_options_of() {
  if constexpr (std::is_default_constructible_v<Options>) {
    return Options();
  } else {
    return Options(0.0);
  }
}

// ------------------------------------------------------- the kind ----

template <typename Opt>
using OptionsOf = typename Opt::OptionsType;

/// How a kind makes its usual parameter groups of a module.
template <typename Opt>
using SplitOf = std::function<std::vector<OptimizerParamGroup>(const torch::nn::Module&, const OptionsOf<Opt>&,
                                                               const PlainRule&)>;

template <typename Opt>
const OptionsOf<Opt>& options_of(const LayerwiseOptimizerBase& opt, std::size_t group) {
  TORCH_CHECK_INDEX(group < opt.param_groups().size(), "bigbatch: group ", group, " of ", opt.param_groups().size());
  return static_cast<const OptionsOf<Opt>&>(opt.param_groups()[group].options());
}

/// The kind of optimizer class `Opt` (a LayerwiseOptimizer), made from its
/// options and state types; `split` makes its usual groups.
template <typename Opt>
OptimizerKind kind_of(SplitOf<Opt> split) {
  using Options = OptionsOf<Opt>;
  using State = typename Opt::ParamStateType;
  OptimizerKind k;
  const Options defaults = default_options_of<Options>();
  Options probe = defaults;  // a rate every kind takes (LARC refuses 0)
  probe.lr(1.0);
  const Opt blank(std::vector<OptimizerParamGroup>{}, probe);
  k.name = blank.kind();
  k.evaluation_point = blank.has_evaluation_point();
  k.defaults = options_json(defaults);
  if constexpr (!std::is_default_constructible_v<Options>) k.required = {"lr"};
  k.state = State::declared();
  const std::string name = k.name;
  const auto read = [name, defaults](const json& full) { return options_from_json(defaults, full, name); };
  k.check = [name, read](const json& base, const json& given) {
    TORCH_CHECK_VALUE(base.is_object() && given.is_object(), name, " options: expected an object, got ",
                      (base.is_object() ? given : base).dump());
    json merged = base;  // checked as a whole: `base` alone may lack a rate (LARC refuses lr 0)
    for (const auto& [key, value] : given.items()) merged[key] = value;
    return options_json(read(merged));
  };
  k.make = [read](const Groups& groups, const json& base) -> std::unique_ptr<LayerwiseOptimizerBase> {
    std::vector<OptimizerParamGroup> param_groups;
    for (const auto& [params, options] : groups) param_groups.emplace_back(params, std::make_unique<Options>(read(options)));
    return std::make_unique<Opt>(std::move(param_groups), read(base));
  };
  k.param_groups = [read, split](const torch::nn::Module& module, const json& options, const PlainRule& plain) {
    Groups out;
    for (auto& g : split(module, read(options), plain)) {
      out.emplace_back(g.params(), options_json(static_cast<const Options&>(g.options())));
    }
    return out;
  };
  k.group_options = [](const LayerwiseOptimizerBase& opt, std::size_t group) {
    return options_json(options_of<Opt>(opt, group));
  };
  k.set_group_options = [read](LayerwiseOptimizerBase& opt, std::size_t group, const json& options) {
    options_of<Opt>(opt, group);  // the index check
    opt.param_groups()[group].set_options(std::make_unique<Options>(read(options)));
  };
  k.add_group = [read](LayerwiseOptimizerBase& opt, std::vector<at::Tensor> params, const json& options) {
    static_cast<Opt&>(opt).add_param_group(OptimizerParamGroup(std::move(params), std::make_unique<Options>(read(options))));
  };
  return k;
}

/// The two groups of large-batch training (param_groups.h).
template <typename Opt>
OptimizerKind layerwise_kind() {
  return kind_of<Opt>([](const torch::nn::Module& module, const OptionsOf<Opt>& o, const PlainRule& plain) {
    return layerwise_param_groups(module, o, plain);
  });
}

/// Muon's split: hidden matrices, AdamW for the edges, AdamW without decay for the plain ones.
OptimizerKind muon_kind() {
  return kind_of<Muon>([](const torch::nn::Module& module, const MuonOptions& o, const PlainRule& plain) {
    return muon_param_groups(module, o, muon_adamw_rule(module),
                             [plain](const std::string&, const at::Tensor& p) { return plain(p); });
  });
}

}  // namespace

const std::vector<OptimizerKind>& optimizer_kinds() {
  // The one registration of each optimizer: this list.
  static const auto* kinds = new std::vector<OptimizerKind>{
      layerwise_kind<LARS>(), layerwise_kind<LARC>(), layerwise_kind<LAMB>(),
      layerwise_kind<NovoGrad>(), layerwise_kind<Lion>(), muon_kind(),
      layerwise_kind<AdamWScheduleFree>(), layerwise_kind<SGDScheduleFree>(), layerwise_kind<SOAP>(),
      layerwise_kind<Shampoo>(),
  };
  return *kinds;
}

const OptimizerKind& optimizer_kind(const std::string& name) {
  std::string names;
  for (const auto& k : optimizer_kinds()) {
    if (k.name == name) return k;
    names += (names.empty() ? "" : ", ") + k.name;
  }
  TORCH_CHECK_VALUE(false, "bigbatch: no optimizer named '", name, "' (", names, ")");
}

}  // namespace bigbatch::optim
