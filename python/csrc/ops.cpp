// The Python package's operators (docs/python.md): bigbatch's C++ optimizers
// (optimizers/) behind torch custom operators in the namespace `bigbatch`, so
// that Python's bigbatch.optim classes step with the same code, bit for bit,
// as a C++ program does, and the step shows in the profiler as bigbatch::step.
//
// An optimizer lives here, in a table, under an integer handle that the
// Python object holds: its state (moments, fp32 master copies, the step counts
// the CUDA engine keeps on the device, the skipped-step counter) stays where
// the C++ step keeps it, and Python reads or replaces it through state() and
// set_state(). Options cross as JSON objects keyed by the options' archive
// names (the keys the C++ optimizers save), read against the kind's defaults.
#include "../../optimizers/lamb.h"
#include "../../optimizers/larc.h"
#include "../../optimizers/lars.h"
#include "../../optimizers/lion.h"
#include "../../optimizers/muon.h"
#include "../../optimizers/novograd.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>
#include <torch/serialize/archive.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace bigbatch::python {
namespace {

using nlohmann::json;
using optim::LayerwiseOptimizerBase;
using torch::optim::OptimizerParamGroup;

// ------------------------------------------------- options as JSON ----

/// An option's value as JSON: a non-finite double as the string "inf",
/// "-inf" or "nan" (JSON has no such numbers; Python's side reads them back).
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
/// a ValueError names the option and the value it refuses.
c10::IValue from_json(const json& j, const c10::IValue& like, const std::string& kind, const std::string& key) {
  const auto refuse = [&](const char* expected) {
    TORCH_CHECK_VALUE(false, "Invalid ", kind, " option ", key, ": ", j.dump(), " (expected ", expected, ")");
  };
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
      refuse(elements.size() == 2 ? "a pair of numbers" : "a tuple of numbers of the default's length");
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

/// Every option of `options` by its archive key, in the archive's order.
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

/// `base` with the options `j` names replaced, validated. A key `base` has not
/// is refused, naming it.
template <typename Options>
Options options_from_json(const Options& base, const json& j, const std::string& kind) {
  TORCH_CHECK_VALUE(j.is_object(), kind, " options: expected an object, got ", j.dump());
  auto values = option_values(base);
  for (const auto& [key, value] : j.items()) {
    const auto it = std::find_if(values.begin(), values.end(), [&](const auto& v) { return v.first == key; });
    TORCH_CHECK_VALUE(it != values.end(), kind, " has no option '", key, "'");
    it->second = from_json(value, it->second, kind, key);
  }
  torch::serialize::OutputArchive out;
  for (const auto& [key, value] : values) out.write(key, value);
  torch::serialize::InputArchive in = reread(out);
  Options options = base;
  options.serialize(in);
  try {
    options.validate();
  } catch (const c10::Error& e) {  // "Invalid LAMB option eps: -1 (must be >= 0)"
    TORCH_CHECK_VALUE(false, e.what_without_backtrace());
  }
  return options;
}

json parse(const std::string& text, const char* what) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    TORCH_CHECK_VALUE(false, "bigbatch: ", what, " is not JSON (", e.what(), "): ", text);
  }
}

// ------------------------------------------------------- the kinds ----

/// What the operators do with an optimizer of one kind (the calls that need
/// its options type or its class: construction and the options of a group).
struct Kind {
  /// Its state's fields by name (the field lists of optimizers/*.cpp, in
  /// their order; tests/python checks them against what a step makes), the
  /// integer ones, and the tensors that are one number per parameter rather
  /// than shaped like it.
  std::vector<std::string> fields;
  std::vector<std::string> int_fields{"step"};
  std::vector<std::string> scalar_fields;
  virtual ~Kind() = default;
  virtual json defaults() const = 0;
  virtual std::unique_ptr<LayerwiseOptimizerBase> make(const std::vector<std::vector<at::Tensor>>& groups,
                                                       const json& defaults, const json& group_options) const = 0;
  virtual json group_options(const LayerwiseOptimizerBase& opt, std::int64_t group) const = 0;
  virtual void set_group_options(LayerwiseOptimizerBase& opt, std::int64_t group, const json& options) const = 0;
  virtual void add_group(LayerwiseOptimizerBase& opt, std::vector<at::Tensor> params, const json& options) const = 0;
  /// The options as they would be set (all of them), refused as set_group_options would.
  virtual json check_options(const json& options) const = 0;
};

/// The options a kind starts from: its defaults, with lr 0 for LARS and LARC,
/// which have no default rate (Python's classes ask for one).
template <typename Options>
Options default_options_of() {
  if constexpr (std::is_default_constructible_v<Options>) {
    return Options();
  } else {
    return Options(0.0);
  }
}

template <typename Opt, typename Options>
struct KindOf final : Kind {
  KindOf(std::string name, std::vector<std::string> state_fields, std::vector<std::string> scalars = {})
      : name(std::move(name)) {
    fields = std::move(state_fields);
    scalar_fields = std::move(scalars);
  }
  std::string name;

  json check_options(const json& options) const override {
    return options_json(options_from_json(default_options_of<Options>(), options, name));
  }

  json defaults() const override { return options_json(default_options_of<Options>()); }

  std::unique_ptr<LayerwiseOptimizerBase> make(const std::vector<std::vector<at::Tensor>>& groups,
                                               const json& defaults, const json& group_options) const override {
    TORCH_CHECK_VALUE(group_options.is_array() && group_options.size() == groups.size(), name, ": ",
                      groups.size(), " parameter groups but options for ", group_options.size());
    const Options base = options_from_json(default_options_of<Options>(), defaults, name);
    std::vector<OptimizerParamGroup> param_groups;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      param_groups.emplace_back(groups[g], std::make_unique<Options>(options_from_json(base, group_options[g], name)));
    }
    return std::make_unique<Opt>(std::move(param_groups), base);
  }

  static const Options& options_of(const LayerwiseOptimizerBase& opt, std::int64_t group) {
    TORCH_CHECK_INDEX(group >= 0 && static_cast<std::size_t>(group) < opt.param_groups().size(), "bigbatch: group ",
                      group, " of ", opt.param_groups().size());
    return static_cast<const Options&>(opt.param_groups()[group].options());
  }

  json group_options(const LayerwiseOptimizerBase& opt, std::int64_t group) const override {
    return options_json(options_of(opt, group));
  }

  void set_group_options(LayerwiseOptimizerBase& opt, std::int64_t group, const json& options) const override {
    Options o = options_from_json(options_of(opt, group), options, name);
    opt.param_groups()[group].set_options(std::make_unique<Options>(std::move(o)));
  }

  void add_group(LayerwiseOptimizerBase& opt, std::vector<at::Tensor> params, const json& options) const override {
    const auto& defaults = static_cast<const Options&>(opt.defaults());
    auto o = std::make_unique<Options>(options_from_json(defaults, options, name));
    static_cast<Opt&>(opt).add_param_group(OptimizerParamGroup(std::move(params), std::move(o)));
  }
};

const Kind& kind_named(const std::string& name) {
  static const std::map<std::string, std::shared_ptr<const Kind>> kinds = {
      {"LAMB", std::make_shared<KindOf<optim::LAMB, optim::LAMBOptions>>(
                   "LAMB", std::vector<std::string>{"step", "exp_avg", "exp_avg_sq", "master"})},
      {"LARS", std::make_shared<KindOf<optim::LARS, optim::LARSOptions>>(
                   "LARS", std::vector<std::string>{"momentum_buffer", "master"})},
      {"LARC", std::make_shared<KindOf<optim::LARC, optim::LARCOptions>>(
                   "LARC", std::vector<std::string>{"momentum_buffer", "master"})},
      {"NovoGrad", std::make_shared<KindOf<optim::NovoGrad, optim::NovoGradOptions>>(
                       "NovoGrad", std::vector<std::string>{"step", "exp_avg", "exp_avg_sq", "master"},
                       std::vector<std::string>{"exp_avg_sq"})},
      {"Lion", std::make_shared<KindOf<optim::Lion, optim::LionOptions>>(
                   "Lion", std::vector<std::string>{"step", "exp_avg", "master"})},
      {"Muon", std::make_shared<KindOf<optim::Muon, optim::MuonOptions>>(
                   "Muon", std::vector<std::string>{"step", "momentum_buffer", "exp_avg", "exp_avg_sq", "master"})},
  };
  const auto it = kinds.find(name);
  TORCH_CHECK_VALUE(it != kinds.end(), "bigbatch: no optimizer named '", name,
                    "' (LAMB, LARS, LARC, NovoGrad, Lion, Muon)");
  return *it->second;
}

// ------------------------------------------------------ the handles ----

struct Held {
  const Kind* kind;
  std::unique_ptr<LayerwiseOptimizerBase> opt;
  std::mutex step_mutex;  // one call at a time on one optimizer
};

std::mutex table_mutex;
std::unordered_map<std::int64_t, std::shared_ptr<Held>> table;
std::int64_t next_handle = 1;

std::shared_ptr<Held> held(std::int64_t handle) {
  std::lock_guard<std::mutex> lock(table_mutex);
  const auto it = table.find(handle);
  TORCH_CHECK_VALUE(it != table.end(), "bigbatch: no optimizer with handle ", handle,
                    " (released, or made in another process)");
  return it->second;
}

/// The optimizer's parameters in group order.
std::vector<at::Tensor> flat_params(const LayerwiseOptimizerBase& opt) {
  std::vector<at::Tensor> out;
  for (const auto& g : opt.param_groups()) out.insert(out.end(), g.params().begin(), g.params().end());
  return out;
}

const at::Tensor& param_at(const LayerwiseOptimizerBase& opt, std::int64_t index) {
  std::int64_t i = index;
  for (const auto& g : opt.param_groups()) {
    if (i >= 0 && static_cast<std::size_t>(i) < g.params().size()) return g.params()[i];
    i -= static_cast<std::int64_t>(g.params().size());
  }
  TORCH_CHECK_INDEX(false, "bigbatch: parameter ", index, " of ", flat_params(opt).size());
}

// ------------------------------------------------------ the operators ----

std::int64_t create(const std::string& kind_name, const std::vector<at::Tensor>& params,
                    const std::vector<std::int64_t>& group_sizes, const std::string& defaults,
                    const std::string& group_options) {
  const Kind& kind = kind_named(kind_name);
  std::vector<std::vector<at::Tensor>> groups;
  std::size_t next = 0;
  for (const std::int64_t n : group_sizes) {
    TORCH_CHECK_VALUE(n >= 0 && next + static_cast<std::size_t>(n) <= params.size(), "bigbatch: group sizes ",
                      c10::IntArrayRef(group_sizes), " for ", params.size(), " parameters");
    groups.emplace_back(params.begin() + static_cast<std::ptrdiff_t>(next),
                        params.begin() + static_cast<std::ptrdiff_t>(next + n));
    next += static_cast<std::size_t>(n);
  }
  TORCH_CHECK_VALUE(next == params.size(), "bigbatch: group sizes ", c10::IntArrayRef(group_sizes), " for ",
                    params.size(), " parameters");
  auto h = std::make_shared<Held>();
  h->kind = &kind;
  h->opt = kind.make(groups, parse(defaults, "the defaults"), parse(group_options, "the group options"));
  std::lock_guard<std::mutex> lock(table_mutex);
  table.emplace(next_handle, std::move(h));
  return next_handle++;
}

void release(std::int64_t handle) {
  std::lock_guard<std::mutex> lock(table_mutex);
  table.erase(handle);
}

std::string default_options(const std::string& kind) { return kind_named(kind).defaults().dump(); }

std::string group_options(std::int64_t handle, std::int64_t group) {
  const auto h = held(handle);
  std::lock_guard<std::mutex> lock(h->step_mutex);
  return h->kind->group_options(*h->opt, group).dump();
}

void set_group_options(std::int64_t handle, std::int64_t group, const std::string& options) {
  const auto h = held(handle);
  std::lock_guard<std::mutex> lock(h->step_mutex);
  h->kind->set_group_options(*h->opt, group, parse(options, "the group options"));
}

void add_group(std::int64_t handle, const std::vector<at::Tensor>& params, const std::string& options) {
  const auto h = held(handle);
  std::lock_guard<std::mutex> lock(h->step_mutex);
  h->kind->add_group(*h->opt, params, parse(options, "the group options"));
}

/// One step of every group, each at its rate in `lrs` (the schedulers' rates
/// live in Python's param_groups). `params` must be the optimizer's own
/// parameters, in group order: the schema declares them written, which is
/// what a traced or compiled caller needs to know, and the check refuses a
/// call on copies (which the step would not write).
void step(std::int64_t handle, const std::vector<at::Tensor>& params, c10::ArrayRef<double> lrs) {
  const auto h = held(handle);
  std::lock_guard<std::mutex> lock(h->step_mutex);
  auto& groups = h->opt->param_groups();
  TORCH_CHECK_VALUE(lrs.size() == groups.size(), "bigbatch::step: ", lrs.size(), " learning rates for ",
                    groups.size(), " parameter groups");
  std::size_t i = 0;
  for (const auto& g : groups) {
    for (const auto& p : g.params()) {
      TORCH_CHECK_VALUE(i < params.size() && params[i].unsafeGetTensorImpl() == p.unsafeGetTensorImpl(),
                        "bigbatch::step: parameter ", i, " is not the optimizer's own (", params.size(),
                        " given): pass the optimizer's parameters, not copies");
      ++i;
    }
  }
  TORCH_CHECK_VALUE(i == params.size(), "bigbatch::step: ", params.size(), " parameters for an optimizer of ", i);
  for (std::size_t g = 0; g < groups.size(); ++g) {  // as the options' own check of lr
    TORCH_CHECK_VALUE(std::isfinite(lrs[g]) && lrs[g] >= 0, "Invalid ", h->opt->kind(), " option lr: ", lrs[g],
                      " (must be >= 0) in parameter group ", g);
  }
  for (std::size_t g = 0; g < groups.size(); ++g) groups[g].options().set_lr(lrs[g]);
  {
    at::NoGradGuard no_grad;
    h->opt->step();
  }
  // The fused step writes through raw pointers, past autograd's version
  // counters: bumped here, as an in-place op would, so that a backward
  // through a graph that saved a parameter before the step refuses, as
  // torch.optim's steps make it.
  for (const auto& p : params) torch::autograd::impl::bump_version(p);
}

/// The state of parameter `index` as names and tensors (an integer field,
/// "step", as a 0-dim int64 tensor); empty before its first step.
std::tuple<std::vector<std::string>, std::vector<at::Tensor>> state(std::int64_t handle, std::int64_t index) {
  const auto h = held(handle);
  std::lock_guard<std::mutex> lock(h->step_mutex);
  std::vector<std::string> names;
  std::vector<at::Tensor> values;
  const auto named = h->opt->named_state(param_at(*h->opt, index));
  if (!named) return {names, values};
  for (const auto& [name, value] : *named) {
    names.push_back(name);
    if (value.isInt()) {
      values.push_back(at::scalar_tensor(value.toInt(), at::kLong));
    } else {
      values.push_back(value.toTensor());
    }
  }
  return {names, values};
}

/// `names` and `values` as state of `param` for `kind`: every name one of the
/// kind's fields, at most once; an integer field a 0-dim int64 tensor; any
/// other an fp32 tensor on the parameter's device, shaped like it (or 0-dim
/// where the field is one number per parameter), made contiguous. A
/// ValueError names the field and what is wrong with it.
optim::NamedState checked_state(const Kind& kind, const char* kind_name, std::int64_t index, const at::Tensor& param,
                                const std::vector<std::string>& names, const std::vector<at::Tensor>& values) {
  TORCH_CHECK_VALUE(names.size() == values.size(), "bigbatch::set_state: ", names.size(), " names for ",
                    values.size(), " values");
  const auto has = [](const std::vector<std::string>& list, const std::string& name) {
    return std::find(list.begin(), list.end(), name) != list.end();
  };
  optim::NamedState named;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    const at::Tensor& v = values[i];
    TORCH_CHECK_VALUE(has(kind.fields, name), kind_name, " state of parameter ", index, ": no field '", name,
                      "' (its fields: ", c10::Join(", ", kind.fields), ")");
    TORCH_CHECK_VALUE(std::count(names.begin(), names.end(), name) == 1, kind_name, " state of parameter ", index,
                      ": field '", name, "' given twice");
    TORCH_CHECK_VALUE(v.defined(), kind_name, " state of parameter ", index, ": field '", name, "' is undefined");
    if (has(kind.int_fields, name)) {
      TORCH_CHECK_VALUE(v.dim() == 0 && v.scalar_type() == at::kLong, kind_name, " state of parameter ", index,
                        ": field '", name, "' must be an integer, got a ", v.scalar_type(), " tensor of shape ",
                        v.sizes());
      named.emplace_back(name, c10::IValue(v.item<std::int64_t>()));
      continue;
    }
    const bool scalar = has(kind.scalar_fields, name);
    TORCH_CHECK_VALUE(v.scalar_type() == at::kFloat && v.device() == param.device() &&
                          (scalar ? v.dim() == 0 : v.sizes() == param.sizes()),
                      kind_name, " state of parameter ", index, ": field '", name, "' is ", v.scalar_type(), " ",
                      v.sizes(), " on ", v.device(), "; it must be float32 ", (scalar ? "of shape []" : "shaped"),
                      scalar ? "" : " like the parameter ", scalar ? "" : c10::str(param.sizes()), " on ",
                      param.device());
    named.emplace_back(name, c10::IValue(v.contiguous()));
  }
  return named;
}

/// Checks a state as set_state would take it, and changes nothing.
void check_state(std::int64_t handle, std::int64_t index, const std::vector<std::string>& names,
                 const std::vector<at::Tensor>& values) {
  const auto h = held(handle);
  std::lock_guard<std::mutex> lock(h->step_mutex);
  checked_state(*h->kind, h->opt->kind(), index, param_at(*h->opt, index), names, values);
}

/// Replaces the state of parameter `index` (checked as check_state does); no
/// names remove it. The tensors are taken, not copied (a non-contiguous one is).
void set_state(std::int64_t handle, std::int64_t index, const std::vector<std::string>& names,
               const std::vector<at::Tensor>& values) {
  const auto h = held(handle);
  std::lock_guard<std::mutex> lock(h->step_mutex);
  const at::Tensor& param = param_at(*h->opt, index);
  if (names.empty() && values.empty()) {
    h->opt->set_named_state(param, std::nullopt);
    return;
  }
  h->opt->set_named_state(param, checked_state(*h->kind, h->opt->kind(), index, param, names, values));
}

/// The options `options` would be for a group of `kind` (every option, the
/// kind's defaults where not given), checked as set_group_options checks them.
std::string check_options(const std::string& kind, const std::string& options) {
  return kind_named(kind).check_options(parse(options, "the group options")).dump();
}

std::vector<std::string> state_fields(const std::string& kind) { return kind_named(kind).fields; }

std::int64_t skipped_steps(std::int64_t handle) {
  const auto h = held(handle);
  std::lock_guard<std::mutex> lock(h->step_mutex);
  return h->opt->skipped_steps();
}

void set_skipped_steps(std::int64_t handle, std::int64_t count) {
  const auto h = held(handle);
  std::lock_guard<std::mutex> lock(h->step_mutex);
  h->opt->set_skipped_steps(count);
}

/// (parameter index, value) pairs of what an optimizer reports per
/// parameter (TrustRatio's ratio, UpdateRms's rms): `value(item)` of each.
template <typename Item, typename Value>
std::tuple<std::vector<std::int64_t>, std::vector<double>> by_index(const LayerwiseOptimizerBase& opt,
                                                                   const std::vector<Item>& items, Value value) {
  std::unordered_map<const void*, std::int64_t> index;
  const auto params = flat_params(opt);
  for (std::size_t i = 0; i < params.size(); ++i) index[params[i].unsafeGetTensorImpl()] = static_cast<std::int64_t>(i);
  std::vector<std::int64_t> which;
  std::vector<double> values;
  for (const auto& item : items) {
    which.push_back(index.at(item.param.unsafeGetTensorImpl()));
    values.push_back(value(item));
  }
  return {which, values};
}

/// The trust ratios of the last step as (parameter index, ratio) pairs.
std::tuple<std::vector<std::int64_t>, std::vector<double>> trust_ratios(std::int64_t handle) {
  const auto h = held(handle);
  std::lock_guard<std::mutex> lock(h->step_mutex);
  return by_index(*h->opt, h->opt->trust_ratios(), [](const optim::TrustRatio& r) { return r.ratio; });
}

/// Muon: the RMS of each orthogonalized parameter's last update, as trust_ratios.
std::tuple<std::vector<std::int64_t>, std::vector<double>> update_rms(std::int64_t handle) {
  const auto h = held(handle);
  std::lock_guard<std::mutex> lock(h->step_mutex);
  const auto* muon = dynamic_cast<const optim::Muon*>(h->opt.get());
  TORCH_CHECK_VALUE(muon, "bigbatch::update_rms: the optimizer is ", h->opt->kind(), ", not Muon");
  return by_index(*h->opt, muon->update_rms(), [](const optim::UpdateRms& r) { return r.rms; });
}

std::int64_t state_bytes(std::int64_t handle) {
  const auto h = held(handle);
  std::lock_guard<std::mutex> lock(h->step_mutex);
  return h->opt->state_bytes();
}

/// Writes the optimizer as torch::save(optimizer, path) does in C++: a C++
/// program's torch::load reads the file back into the same kind of optimizer.
void save(std::int64_t handle, const std::string& path) {
  const auto h = held(handle);
  std::lock_guard<std::mutex> lock(h->step_mutex);
  torch::serialize::OutputArchive archive;
  h->opt->save(archive);
  archive.save_to(path);  // throws naming the path where it cannot write
}

/// Reads a file torch::save(optimizer, path) wrote (here or in C++).
void load(std::int64_t handle, const std::string& path) {
  const auto h = held(handle);
  std::lock_guard<std::mutex> lock(h->step_mutex);
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  h->opt->load(archive);
}

}  // namespace
}  // namespace bigbatch::python

TORCH_LIBRARY(bigbatch, m) {
  using namespace bigbatch::python;
  m.def("create(str kind, Tensor[] params, int[] group_sizes, str defaults, str group_options) -> int", &create);
  m.def("release(int handle) -> ()", &release);
  m.def("default_options(str kind) -> str", &default_options);
  m.def("group_options(int handle, int group) -> str", &group_options);
  m.def("set_group_options(int handle, int group, str options) -> ()", &set_group_options);
  m.def("add_group(int handle, Tensor[] params, str options) -> ()", &add_group);
  // The step: a kernel for the CPU and CUDA keys only (not a composite one),
  // so that tracing and torch.compile keep it as one opaque call; its fake
  // implementation (python/bigbatch/_ops.py) writes nothing.
  m.def("step(int handle, Tensor(a!)[] params, float[] lrs) -> ()");
  m.impl("step", c10::DispatchKey::CPU, TORCH_FN(step));
  m.impl("step", c10::DispatchKey::CUDA, TORCH_FN(step));
  m.def("state(int handle, int index) -> (str[], Tensor[])", &state);
  m.def("set_state(int handle, int index, str[] names, Tensor[] values) -> ()", &set_state);
  m.def("check_state(int handle, int index, str[] names, Tensor[] values) -> ()", &check_state);
  m.def("check_options(str kind, str options) -> str", &check_options);
  m.def("state_fields(str kind) -> str[]", &state_fields);
  m.def("skipped_steps(int handle) -> int", &skipped_steps);
  m.def("set_skipped_steps(int handle, int count) -> ()", &set_skipped_steps);
  m.def("trust_ratios(int handle) -> (int[], float[])", &trust_ratios);
  m.def("update_rms(int handle) -> (int[], float[])", &update_rms);
  m.def("state_bytes(int handle) -> int", &state_bytes);
  m.def("save(int handle, str path) -> ()", &save);
  m.def("load(int handle, str path) -> ()", &load);
}
