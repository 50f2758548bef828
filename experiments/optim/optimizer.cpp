// The optimizer registry and what the runner asks of an entry (optimizer.h),
// and the helpers the entries share (entry.h).
#include "optimizer.h"

#include "builtin.h"
#include "entry.h"
#include "../../config/json_reader.h"
#include "../../optimizers/layerwise_optimizer.h"

#include <c10/util/Exception.h>
#include <torch/nn/modules/embedding.h>

#include <cctype>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <unordered_set>

namespace bigbatch::experiments {
namespace {

// An optimizer a config can name: a built-in, whose entry is made on first
// use (`make`), or one registered whole.
struct Slot {
  std::string name;
  std::function<OptimizerEntry()> make;
  std::unique_ptr<OptimizerEntry> entry;
};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

struct Registry {
  std::mutex mutex;
  std::deque<Slot> slots;  // a deque: entries stay where they are as others are added
};

// The registry, with the built-ins' names in it from the start (not added by
// static initializers, which a static library's linker may drop).
Registry& registry() {
  static Registry* r = [] {
    auto* out = new Registry;  // never destroyed: entries may be read at exit
    for (const auto& b : kTorchOptimizers) out->slots.push_back({b.name, b.entry, nullptr});
    for (const optim::OptimizerKind& kind : optim::optimizer_kinds()) {
      const std::string name = lower(kind.name);
      std::function<OptimizerEntry()> make = [&kind] { return kind_entry(kind); };
      for (const auto& d : kDecoratedKinds) {
        if (name == d.name) make = [&kind, entry = d.entry] { return entry(kind); };
      }
      out->slots.push_back({name, std::move(make), nullptr});
    }
    return out;
  }();
  return *r;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// An entry's keys with their defaults: its keys are those resolve({}) writes.
nlohmann::json default_keys(const OptimizerEntry& entry) { return entry.resolve(nlohmann::json::object()); }

std::vector<std::string> keys_of(const nlohmann::json& object) {
  std::vector<std::string> out;
  for (const auto& item : object.items()) out.push_back(item.key());
  return out;
}

}  // namespace

std::optional<double> OptimizerSpec::momentum() const {
  const auto it = params.find("momentum");
  if (it == params.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

void register_optimizer(OptimizerEntry entry) {
  if (entry.name.empty()) throw std::invalid_argument("register_optimizer: an empty name");
  if (!entry.resolve || !entry.make) {
    throw std::invalid_argument("register_optimizer: \"" + entry.name + "\" needs resolve and make");
  }
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  for (const auto& slot : r.slots) {
    if (slot.name == entry.name) {
      throw std::invalid_argument("register_optimizer: \"" + entry.name + "\" is registered already");
    }
  }
  std::string name = entry.name;
  r.slots.push_back({std::move(name), nullptr, std::make_unique<OptimizerEntry>(std::move(entry))});
}

std::vector<std::string> registered_optimizers() {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> out;
  for (const auto& slot : r.slots) out.push_back(slot.name);
  return out;
}

const OptimizerEntry& optimizer_entry(const std::string& name) {
  {
    Registry& r = registry();
    const std::lock_guard<std::mutex> lock(r.mutex);
    for (auto& slot : r.slots) {
      if (slot.name != name) continue;
      if (!slot.entry) {
        slot.entry = std::make_unique<OptimizerEntry>(slot.make());
        TORCH_INTERNAL_ASSERT(slot.entry->name == name, "the built-in \"", name, "\" made an entry named \"",
                              slot.entry->name, "\"");
      }
      return *slot.entry;
    }
  }
  config::config_error("optimizer.name",
                       "unknown value \"" + name + "\" (one of: " + joined(registered_optimizers()) + ")");
}

OptimizerSpec resolve_optimizer(const std::string& name, const nlohmann::json& keys) {
  const OptimizerEntry& entry = optimizer_entry(name);
  if (!keys.is_object()) config::config_error("optimizer", std::string("expected an object, got ") + keys.type_name());
  const nlohmann::json defaults = default_keys(entry);
  const std::string own = joined(keys_of(defaults));
  for (const auto& item : keys.items()) {
    if (defaults.contains(item.key())) continue;
    bool other = false;
    for (const auto& n : registered_optimizers()) {
      other = other || (n != name && default_keys(optimizer_entry(n)).contains(item.key()));
    }
    if (other) {
      config::config_error("optimizer." + item.key(), name + " has no such key (its keys: " + own +
                                                          "); a variant drops its base's with \"" + item.key() +
                                                          "\": null");
    }
    config::config_error("optimizer." + item.key(), "unknown key (" + name + "'s keys: " + own + ")");
  }
  nlohmann::json resolved = entry.resolve(keys);
  TORCH_CHECK(resolved.is_object(), "optimizer \"", name, "\": its entry resolved the keys to a non-object");
  return {name, std::move(resolved)};
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerSpec& spec, double lr,
                                                        torch::nn::Module& model) {
  return optimizer_entry(spec.name).make(spec.params, lr, model);
}

schedules::LRAdapter::RateChange rate_change(const OptimizerSpec& spec, torch::optim::Optimizer& optimizer) {
  const OptimizerEntry& entry = optimizer_entry(spec.name);
  return entry.rate_change ? entry.rate_change(spec.params, optimizer) : schedules::LRAdapter::RateChange{};
}

std::vector<LayerScalar> layer_scalars(const OptimizerSpec& spec, const torch::optim::Optimizer& optimizer) {
  const OptimizerEntry& entry = optimizer_entry(spec.name);
  return entry.scalars ? entry.scalars(optimizer) : std::vector<LayerScalar>{};
}

nlohmann::json normalized_optimizer(const nlohmann::json& resolved) {
  if (!resolved.is_object() || !resolved.contains("name") || !resolved["name"].is_string()) return resolved;
  try {
    const std::string name = resolved["name"].get<std::string>();
    const OptimizerEntry& entry = optimizer_entry(name);
    const nlohmann::json defaults = default_keys(entry);
    nlohmann::json given = resolved;
    given.erase("name");
    if (entry.upgrade) given = entry.upgrade(std::move(given));
    nlohmann::json keys = nlohmann::json::object();
    for (const auto& item : given.items()) {
      if (defaults.contains(item.key())) keys[item.key()] = item.value();
    }
    nlohmann::json out = entry.resolve(keys);
    out["name"] = name;
    return out;
  } catch (const c10::Error&) {
    return resolved;  // not a config of today: compared as it is
  }
}

// ------------------------------------------------------------- entry.h --

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

OptimizerEntry kind_entry(const optim::OptimizerKind& kind, const nlohmann::json& runner_defaults) {
  // The optimizer's own check, reported at the config key it concerns.
  const auto checked = [&kind](const nlohmann::json& base, const nlohmann::json& given) {
    try {
      return kind.check(base, given);
    } catch (const optim::OptionError& e) {
      config::config_error("optimizer." + e.option, "must be " + e.requirement + ", got " + e.value);
    }
  };
  // Keys are checked at a stand-in rate of 1 (the search's rates are > 0;
  // LARS's and LARC's have no default, and LARC refuses 0).
  nlohmann::json start = kind.defaults;
  start["lr"] = 1.0;
  const nlohmann::json base = checked(start, runner_defaults);
  OptimizerEntry e;
  e.name = lower(kind.name);
  e.resolve = [checked, base](const nlohmann::json& keys) {
    nlohmann::json out = checked(base, keys);
    out.erase("lr");  // the schedule's
    return out;
  };
  e.make = [&kind, checked, base](const nlohmann::json& keys, double lr, torch::nn::Module& model) {
    nlohmann::json given = keys;
    given["lr"] = lr;
    const nlohmann::json options = checked(base, given);
    std::unique_ptr<torch::optim::Optimizer> made = kind.make(kind.param_groups(model, options, plain_rule(model)), options);
    return made;
  };
  e.scalars = [](const torch::optim::Optimizer& optimizer) {
    std::vector<LayerScalar> out;
    if (const auto* ours = dynamic_cast<const optim::LayerwiseOptimizerBase*>(&optimizer)) {
      for (auto& s : ours->scalars()) out.push_back({std::move(s.tag), std::move(s.param), s.value});
    }
    return out;
  };
  e.evaluation_point = kind.evaluation_point;
  e.shards = true;  // every one is a LayerwiseOptimizerBase, which distributed::ShardedOptimizer takes
  return e;
}

}  // namespace bigbatch::experiments
