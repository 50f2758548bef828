// The Python package's operators (docs/python.md): bigbatch's C++ optimizers
// (optimizers/) behind torch custom operators in the namespace `bigbatch`, so
// that Python's bigbatch.optim classes step with the same code, bit for bit,
// as a C++ program does, and the step shows in the profiler as bigbatch::step.
//
// An optimizer lives here, in a table, under an integer handle that the
// Python object holds: its state (moments, fp32 master copies, the step counts
// the CUDA engine keeps on the device, the skipped-step counter) stays where
// the C++ step keeps it, and Python reads or replaces it through state() and
// set_state(). The kinds, their options (JSON objects keyed by the options'
// archive names) and their state fields are the library's own description of
// each optimizer (optimizers/kind.h): nothing here names one but Muon, for
// its update_rms().
#include "../../kernels/cpu/isa.h"
#include "../../optimizers/kind.h"
#include "../../optimizers/muon.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/library.h>
#include <torch/serialize/archive.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace bigbatch::python {
namespace {

using nlohmann::json;
using optim::LayerwiseOptimizerBase;
using Kind = optim::OptimizerKind;

json parse(const std::string& text, const char* what) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    TORCH_CHECK_VALUE(false, "bigbatch: ", what, " is not JSON (", e.what(), "): ", text);
  }
}

// ------------------------------------------------------ the handles ----

struct Held {
  const Kind* kind;
  json defaults;  // the full options it was made with (a group added later starts from them)
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
  const Kind& kind = optim::optimizer_kind(kind_name);
  json given = parse(defaults, "the defaults");
  const json options = parse(group_options, "the group options");
  TORCH_CHECK_VALUE(options.is_array() && options.size() == group_sizes.size(), kind.name, ": ",
                    group_sizes.size(), " parameter groups but options for ", options.size());
  // A required option (LARC's lr) that only the groups give: the defaults
  // take the first group's, which is what they are checked with (a later
  // group must give its own, as torch.optim's `required` makes it).
  for (const auto& key : kind.required) {
    if (given.is_object() && !given.contains(key) && !options.empty() && options[0].is_object() &&
        options[0].contains(key)) {
      given[key] = options[0][key];
    }
  }
  const json base = kind.check(kind.defaults, given);
  std::vector<std::pair<std::vector<at::Tensor>, json>> groups;
  std::size_t next = 0;
  for (std::size_t g = 0; g < group_sizes.size(); ++g) {
    const std::int64_t n = group_sizes[g];
    TORCH_CHECK_VALUE(n >= 0 && next + static_cast<std::size_t>(n) <= params.size(), "bigbatch: group sizes ",
                      c10::IntArrayRef(group_sizes), " for ", params.size(), " parameters");
    groups.emplace_back(std::vector<at::Tensor>(params.begin() + static_cast<std::ptrdiff_t>(next),
                                                params.begin() + static_cast<std::ptrdiff_t>(next + n)),
                        kind.check(base, options[g]));
    next += static_cast<std::size_t>(n);
  }
  TORCH_CHECK_VALUE(next == params.size(), "bigbatch: group sizes ", c10::IntArrayRef(group_sizes), " for ",
                    params.size(), " parameters");
  auto h = std::make_shared<Held>();
  h->kind = &kind;
  h->defaults = base;
  h->opt = kind.make(groups, base);
  std::lock_guard<std::mutex> lock(table_mutex);
  table.emplace(next_handle, std::move(h));
  return next_handle++;
}

void release(std::int64_t handle) {
  std::lock_guard<std::mutex> lock(table_mutex);
  table.erase(handle);
}

std::string default_options(const std::string& kind) { return optim::optimizer_kind(kind).defaults.dump(); }

/// The library's optimizers by name (each a class of bigbatch.optim).
std::vector<std::string> kinds() {
  std::vector<std::string> out;
  for (const auto& k : optim::optimizer_kinds()) out.push_back(k.name);
  return out;
}

/// The options of `kind` without a default ("lr" for LARS and LARC).
std::vector<std::string> required_options(const std::string& kind) { return optim::optimizer_kind(kind).required; }

std::string group_options(std::int64_t handle, std::int64_t group) {
  const auto h = held(handle);
  std::lock_guard<std::mutex> lock(h->step_mutex);
  TORCH_CHECK_INDEX(group >= 0, "bigbatch: group ", group);
  return h->kind->group_options(*h->opt, static_cast<std::size_t>(group)).dump();
}

void set_group_options(std::int64_t handle, std::int64_t group, const std::string& options) {
  const auto h = held(handle);
  std::lock_guard<std::mutex> lock(h->step_mutex);
  TORCH_CHECK_INDEX(group >= 0, "bigbatch: group ", group);
  const json current = h->kind->group_options(*h->opt, static_cast<std::size_t>(group));
  h->kind->set_group_options(*h->opt, static_cast<std::size_t>(group),
                             h->kind->check(current, parse(options, "the group options")));
}

void add_group(std::int64_t handle, const std::vector<at::Tensor>& params, const std::string& options) {
  const auto h = held(handle);
  std::lock_guard<std::mutex> lock(h->step_mutex);
  h->kind->add_group(*h->opt, params, h->kind->check(h->defaults, parse(options, "the group options")));
}

/// The groups' rates from `rates`, a 1-D float tensor of one per group of
/// `opt` (a tensor, so that torch.compile takes a new rate as an input rather
/// than a constant to recompile for; a CUDA tensor costs a copy to the host),
/// each checked as the options' own check of lr checks it.
std::vector<double> checked_rates(const at::Tensor& rates, const LayerwiseOptimizerBase& opt, const char* op) {
  TORCH_CHECK_VALUE(rates.dim() == 1 && rates.is_floating_point(), op, ": the rates must be a 1-D float ",
                    "tensor, one per parameter group, got ", rates.dim(), "-D ", rates.scalar_type());
  const at::Tensor host = rates.to(at::kCPU, at::kDouble).contiguous();
  std::vector<double> lrs(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
  TORCH_CHECK_VALUE(lrs.size() == opt.param_groups().size(), op, ": ", lrs.size(), " learning rates for ",
                    opt.param_groups().size(), " parameter groups");
  for (std::size_t g = 0; g < lrs.size(); ++g) {
    TORCH_CHECK_VALUE(std::isfinite(lrs[g]) && lrs[g] >= 0, "Invalid ", opt.kind(), " option lr: ", lrs[g],
                      " (must be >= 0) in parameter group ", g);
  }
  return lrs;
}

/// One step of every group, each at its rate in `lrs` (the schedulers' rates
/// live in Python's param_groups). `params` must be the optimizer's own
/// parameters, in group order: the schema declares them written, which is
/// what a traced or compiled caller needs to know, and the check refuses a
/// call on copies (which the step would not write).
void step(std::int64_t handle, const std::vector<at::Tensor>& params, const at::Tensor& rates) {
  const auto h = held(handle);
  std::lock_guard<std::mutex> lock(h->step_mutex);
  auto& groups = h->opt->param_groups();
  const std::vector<double> lrs = checked_rates(rates, *h->opt, "bigbatch::step");
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

/// From now on each parameter is a piece of a tensor cut across the ranks of
/// the c10d process group named `group` (a DTensor's local shard, FSDP2's
/// Shard(0)): parameter i starts in chunk first_chunk[i] of a tensor of
/// tensor_chunks[i] chunks (16384 elements each), and the norms, trust ratios
/// and skip decision of each step are the whole tensors' (OptimizerSharding).
/// A piece may start inside a chunk: the chunk's sum then comes from two
/// ranks, added by the all-reduce. No tensors end the sharding.
void shard(std::int64_t handle, const std::vector<std::int64_t>& tensor_chunks,
           const std::vector<std::int64_t>& first_chunk, const std::string& group) {
  const auto h = held(handle);
  std::lock_guard<std::mutex> lock(h->step_mutex);
  if (tensor_chunks.empty() && first_chunk.empty()) {
    h->opt->shard(nullptr);
    return;
  }
  const auto params = flat_params(*h->opt);
  TORCH_CHECK_VALUE(tensor_chunks.size() == params.size() && first_chunk.size() == params.size(),
                    "bigbatch::shard: places for ", tensor_chunks.size(), " and ", first_chunk.size(),
                    " parameters, the optimizer has ", params.size());
  const c10::intrusive_ptr<c10d::ProcessGroup> pg = c10d::resolve_process_group(group);
  auto sharding = std::make_shared<optim::OptimizerSharding>();
  at::Device device(at::kCPU);
  for (std::size_t i = 0; i < params.size(); ++i) {
    sharding->shards[params[i].unsafeGetTensorImpl()] = optim::ParamShard{tensor_chunks[i], first_chunk[i]};
    device = params[i].device();
  }
  sharding->allreduce_sum = [pg, device](double* data, std::int64_t count, cudaStream_t) {
    if (count == 0) return;
    std::vector<at::Tensor> sums{at::from_blob(data, {count}, at::TensorOptions().dtype(at::kDouble).device(device))};
    pg->allreduce(sums)->wait();
  };
  h->opt->shard(std::move(sharding));
}

/// Whether a sharded `kind` takes whole tensors (Muon, SOAP, Shampoo: each
/// tensor whole on one rank) rather than pieces.
bool whole_tensors(const std::string& kind) {
  const Kind& k = optim::optimizer_kind(kind);
  json options = k.defaults;  // an optimizer over no parameters to ask, with any valid value where none is given
  for (const auto& key : k.required) options[key] = 1.0;
  return k.make({}, k.check(k.defaults, options))->shards_whole_tensors();
}

/// The state of parameter `index` as names and tensors (an integer field,
/// "step", as a 0-dim int64 tensor, a number carried in double as a 0-dim
/// float64 tensor); empty before its first step.
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
    } else if (value.isDouble()) {
      values.push_back(at::scalar_tensor(value.toDouble(), at::kDouble));
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
/// ValueError names the field and what is wrong with it. A field of a shape
/// of its own (StateField::kOwn) is a 1-D fp32 tensor whose length the
/// optimizer checks when it steps.
optim::NamedState checked_state(const Kind& kind, const char* kind_name, std::int64_t index, const at::Tensor& param,
                                const std::vector<std::string>& names, const std::vector<at::Tensor>& values) {
  TORCH_CHECK_VALUE(names.size() == values.size(), "bigbatch::set_state: ", names.size(), " names for ",
                    values.size(), " values");
  using Shape = optim::StateField::Shape;
  std::vector<std::string> field_names;
  for (const auto& f : kind.state) field_names.push_back(f.name);
  optim::NamedState named;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    const at::Tensor& v = values[i];
    const auto field = std::find_if(kind.state.begin(), kind.state.end(), [&](const auto& f) { return f.name == name; });
    TORCH_CHECK_VALUE(field != kind.state.end(), kind_name, " state of parameter ", index, ": no field '", name,
                      "' (its fields: ", c10::Join(", ", field_names), ")");
    TORCH_CHECK_VALUE(std::count(names.begin(), names.end(), name) == 1, kind_name, " state of parameter ", index,
                      ": field '", name, "' given twice");
    TORCH_CHECK_VALUE(v.defined(), kind_name, " state of parameter ", index, ": field '", name, "' is undefined");
    if (field->shape == Shape::kCount) {
      TORCH_CHECK_VALUE(v.dim() == 0 && v.scalar_type() == at::kLong, kind_name, " state of parameter ", index,
                        ": field '", name, "' must be an integer, got a ", v.scalar_type(), " tensor of shape ",
                        v.sizes());
      named.emplace_back(name, c10::IValue(v.item<std::int64_t>()));
      continue;
    }
    if (field->shape == Shape::kNumber) {
      TORCH_CHECK_VALUE(v.dim() == 0 && v.is_floating_point(), kind_name, " state of parameter ", index, ": field '",
                        name, "' must be a number, got a ", v.scalar_type(), " tensor of shape ", v.sizes());
      named.emplace_back(name, c10::IValue(v.item<double>()));
      continue;
    }
    if (field->shape == Shape::kOwn) {  // a shape the optimizer derives (SOAP's packed factors): it checks the size
      TORCH_CHECK_VALUE(v.scalar_type() == at::kFloat && v.device() == param.device() && v.dim() == 1, kind_name,
                        " state of parameter ", index, ": field '", name, "' is ", v.scalar_type(), " ", v.sizes(),
                        " on ", v.device(), "; it must be a 1-D float32 tensor on ", param.device());
      named.emplace_back(name, c10::IValue(v.contiguous()));
      continue;
    }
    const bool scalar = field->shape == Shape::kPerTensor;
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

/// A tensor of its own over `t`'s elements: what step_with's optimizer
/// steps, so that neither the caller's tensors nor the handle's change but
/// through their elements.
at::Tensor alias_of(const at::Tensor& t) {
  at::Tensor out = at::empty({0}, t.options());
  out.set_(t.storage(), t.storage_offset(), t.sizes(), t.strides());
  return out;
}

/// One step of every group of the optimizer `handle` names, on tensors the
/// caller holds: `params` (written), their gradients `grads` (read; None
/// for a parameter without one, which the step leaves alone), and their
/// whole state in `state` (written): state[k] is field fields[k] of
/// parameter owners[k], a count ("step") as a 0-dim int64 tensor, a number
/// carried in double as a 0-dim float64 one, every other field a float32
/// tensor as state() gives it; each parameter with a gradient must have its
/// state (take its first step with step(), or make it as state() would show
/// it). Every tensor the step reads or writes is an argument, and the rates
/// are a tensor, so that torch.library.opcheck, functionalization (which
/// passes copies) and torch.compile see all of it, as torch._fused_adamw_
/// does. The handle gives the kind and each group's options only: its own
/// parameters and state do not change (nor its skipped-step count or trust
/// ratios, which this step does not report).
void step_with(std::int64_t handle, const std::vector<at::Tensor>& params,
               const std::vector<std::optional<at::Tensor>>& grads, const std::vector<at::Tensor>& state,
               const std::vector<std::string>& fields, const std::vector<std::int64_t>& owners,
               const at::Tensor& rates) {
  const auto h = held(handle);
  std::lock_guard<std::mutex> lock(h->step_mutex);
  const Kind& kind = *h->kind;
  const auto& groups = h->opt->param_groups();
  const auto own = flat_params(*h->opt);
  TORCH_CHECK_VALUE(params.size() == own.size() && grads.size() == own.size(), "bigbatch::step_with: ",
                    params.size(), " parameters and ", grads.size(), " gradients for an optimizer of ", own.size());
  TORCH_CHECK_VALUE(fields.size() == state.size() && owners.size() == state.size(), "bigbatch::step_with: ",
                    state.size(), " state tensors, ", fields.size(), " field names and ", owners.size(), " owners");
  const std::vector<double> lrs = checked_rates(rates, *h->opt, "bigbatch::step_with");
  std::vector<std::vector<std::string>> names(params.size());
  std::vector<std::vector<at::Tensor>> values(params.size());
  for (std::size_t k = 0; k < state.size(); ++k) {
    TORCH_CHECK_INDEX(owners[k] >= 0 && owners[k] < static_cast<std::int64_t>(params.size()), "bigbatch::step_with: ",
                      "state tensor ", k, " ('", fields[k], "') belongs to parameter ", owners[k], " of ", params.size());
    names[owners[k]].push_back(fields[k]);
    values[owners[k]].push_back(state[k]);
  }
  // The same groups and options as the handle's, over aliases of the given tensors.
  std::vector<std::pair<std::vector<at::Tensor>, json>> made;
  std::vector<at::Tensor> proxies;
  std::vector<optim::NamedState> states(params.size());
  std::size_t i = 0;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    json options = kind.group_options(*h->opt, g);
    options["lr"] = lrs[g];
    std::vector<at::Tensor> members;
    for (std::size_t j = 0; j < groups[g].params().size(); ++j, ++i) {
      const at::Tensor& p = params[i];
      TORCH_CHECK_VALUE(p.sizes() == own[i].sizes() && p.scalar_type() == own[i].scalar_type() &&
                            p.device() == own[i].device(),
                        "bigbatch::step_with: parameter ", i, " is ", p.scalar_type(), " ", p.sizes(), " on ",
                        p.device(), "; the optimizer's is ", own[i].scalar_type(), " ", own[i].sizes(), " on ",
                        own[i].device());
      at::Tensor proxy = alias_of(p);
      const auto& grad = grads[i];
      if (grad.has_value() && grad->defined()) {
        TORCH_CHECK_VALUE(grad->sizes() == p.sizes() && grad->device() == p.device(), "bigbatch::step_with: ",
                          "gradient ", i, " is ", grad->sizes(), " on ", grad->device(), " for a parameter ",
                          p.sizes(), " on ", p.device());
        proxy.mutable_grad() = alias_of(*grad);
        TORCH_CHECK_VALUE(!names[i].empty(), "bigbatch::step_with: parameter ", i, " has a gradient and no ",
                          "state; take its first step with step(), or give its state as state() shows it");
      }
      for (const auto& v : values[i]) {
        TORCH_CHECK_VALUE(v.dim() == 0 || v.is_contiguous(), "bigbatch::step_with: a state tensor of parameter ",
                          i, " is not contiguous; the step writes its elements in place");
      }
      if (!names[i].empty()) {
        states[i] = checked_state(kind, h->opt->kind(), static_cast<std::int64_t>(i), proxy, names[i], values[i]);
      }
      members.push_back(proxy);
      proxies.push_back(proxy);
    }
    made.emplace_back(std::move(members), std::move(options));
  }
  const std::unique_ptr<LayerwiseOptimizerBase> opt = kind.make(made, h->defaults);
  for (std::size_t k = 0; k < proxies.size(); ++k) {
    if (!names[k].empty()) opt->set_named_state(proxies[k], states[k]);
  }
  {
    at::NoGradGuard no_grad;
    opt->step();
  }
  // The counts and numbers back into their tensors; a tensor field the step
  // replaced (a layout conformed, a factor recomputed) copied into the given one.
  for (std::size_t k = 0; k < proxies.size(); ++k) {
    if (names[k].empty()) continue;
    const auto now = opt->named_state(proxies[k]);
    TORCH_INTERNAL_ASSERT(now.has_value());
    for (const auto& [name, value] : *now) {
      const auto at = std::find(names[k].begin(), names[k].end(), name);
      TORCH_CHECK_VALUE(at != names[k].end(), "bigbatch::step_with: the step gave parameter ", k, " a field '", name,
                        "' it was not given; give its whole state as state() shows it");
      at::Tensor given = values[k][static_cast<std::size_t>(at - names[k].begin())];
      if (value.isInt()) {
        given.fill_(value.toInt());
      } else if (value.isDouble()) {
        given.fill_(value.toDouble());
      } else if (const at::Tensor& t = value.toTensor(); !t.is_same(given)) {
        TORCH_CHECK_VALUE(t.sizes() == given.sizes(), "bigbatch::step_with: field '", name, "' of parameter ", k,
                          " is now ", t.sizes(), ", given ", given.sizes());
        if (t.data_ptr() != given.data_ptr()) given.copy_(t);
      }
    }
  }
  for (const auto& p : params) torch::autograd::impl::bump_version(p);
}

/// The options `options` would be for a group of `kind` (every option, the
/// kind's defaults where not given), checked as set_group_options checks them.
std::string check_options(const std::string& kind, const std::string& options) {
  const Kind& k = optim::optimizer_kind(kind);
  return k.check(k.defaults, parse(options, "the group options")).dump();
}

std::vector<std::string> state_fields(const std::string& kind) {
  std::vector<std::string> out;
  for (const auto& f : optim::optimizer_kind(kind).state) out.push_back(f.name);
  return out;
}

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

/// Moves the parameters to the training point (on) or the point to evaluate
/// (Schedule-Free's y and x); `move` false only sets the mode, for
/// parameters restored at that mode's point.
void train(std::int64_t handle, bool on, bool move) {
  const auto h = held(handle);
  std::lock_guard<std::mutex> lock(h->step_mutex);
  if (move) {
    h->opt->train(on);
  } else {
    h->opt->set_training_mode(on);
  }
}

bool is_training(std::int64_t handle) {
  const auto h = held(handle);
  std::lock_guard<std::mutex> lock(h->step_mutex);
  return h->opt->is_training();
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

/// The vector instructions of the CPU element loops (kernels/cpu/isa.h):
/// "baseline", "avx2" or "avx512".
std::string cpu_isa() { return bigbatch::kernels::cpu::isa_name(bigbatch::kernels::cpu::cpu_isa()); }

/// Runs the CPU element loops with `isa` from now on; a ValueError for a name
/// that is none of the three, or one this CPU cannot run.
void set_cpu_isa(const std::string& isa) {
  namespace kc = bigbatch::kernels::cpu;
  for (const kc::Isa i : {kc::Isa::kBaseline, kc::Isa::kAvx2, kc::Isa::kAvx512}) {
    if (isa != kc::isa_name(i)) continue;
    TORCH_CHECK_VALUE(kc::cpu_has(i), "bigbatch.set_cpu_isa: this CPU cannot run '", isa, "'");
    kc::set_cpu_isa(i);
    return;
  }
  TORCH_CHECK_VALUE(false, "bigbatch.set_cpu_isa: expected 'baseline', 'avx2' or 'avx512', got '", isa, "'");
}

TORCH_LIBRARY(bigbatch, m) {
  using namespace bigbatch::python;
  m.def("create(str kind, Tensor[] params, int[] group_sizes, str defaults, str group_options) -> int", &create);
  m.def("release(int handle) -> ()", &release);
  m.def("default_options(str kind) -> str", &default_options);
  m.def("kinds() -> str[]", &kinds);
  m.def("required_options(str kind) -> str[]", &required_options);
  m.def("group_options(int handle, int group) -> str", &group_options);
  m.def("set_group_options(int handle, int group, str options) -> ()", &set_group_options);
  m.def("add_group(int handle, Tensor[] params, str options) -> ()", &add_group);
  // The step: a kernel for the CPU and CUDA keys only (not a composite one),
  // so that tracing and torch.compile keep it as one opaque call; its fake
  // implementation (python/bigbatch/_ops.py) writes nothing.
  m.def("step(int handle, Tensor(a!)[] params, Tensor lrs) -> ()");
  m.impl("step", c10::DispatchKey::CPU, TORCH_FN(step));
  m.impl("step", c10::DispatchKey::CUDA, TORCH_FN(step));
  // step_with: every tensor it reads or writes in its schema (the state
  // included), for torch.library.opcheck and functionalization.
  m.def("step_with(int handle, Tensor(a!)[] params, Tensor?[] grads, Tensor(b!)[] state, str[] fields, "
        "int[] owners, Tensor lrs) -> ()");
  m.impl("step_with", c10::DispatchKey::CPU, TORCH_FN(step_with));
  m.impl("step_with", c10::DispatchKey::CUDA, TORCH_FN(step_with));
  m.def("shard(int handle, int[] tensor_chunks, int[] first_chunk, str group) -> ()", &shard);
  m.def("whole_tensors(str kind) -> bool", &whole_tensors);
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
  m.def("train(int handle, bool on, bool move) -> ()", &train);
  m.def("is_training(int handle) -> bool", &is_training);
  m.def("save(int handle, str path) -> ()", &save);
  m.def("load(int handle, str path) -> ()", &load);
  m.def("cpu_isa() -> str", &cpu_isa);
  m.def("set_cpu_isa(str isa) -> ()", &set_cpu_isa);
}
