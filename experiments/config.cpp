// Sweep and trial configs (config.h).
#include <bigbatch/experiments/config.h>

#include <bigbatch/schedules/json_reader.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

namespace bigbatch::experiments {
namespace {

using schedules::JsonReader;
using schedules::config_error;
using nlohmann::json;

void require(bool ok, const std::string& path, const std::string& problem) {
  if (!ok) config_error(path, problem);
}

std::string num(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

void one_of(const std::string& value, const std::set<std::string>& choices, const std::string& path) {
  if (choices.count(value)) return;
  std::string list;
  for (const auto& c : choices) list += (list.empty() ? "" : ", ") + c;
  config_error(path, "unknown value \"" + value + "\" (one of: " + list + ")");
}

DataSpec parse_data(JsonReader r) {
  DataSpec d;
  d.name = r.string("name", d.name);
  one_of(d.name, {"fashion_mnist", "linear_regression", "gaussian_mixture"}, r.path_of("name"));
  const bool synthetic = d.name != "fashion_mnist";
  if (synthetic) {
    d.train_size = r.integer("train_size", 8192);
    d.val_size = r.integer("val_size", 2048);
    d.seed = static_cast<std::uint64_t>(r.integer("seed", 0));
    require(d.train_size > 1, r.path_of("train_size"), "must be > 1, got " + std::to_string(d.train_size));
    require(d.val_size > 0, r.path_of("val_size"), "must be > 0, got " + std::to_string(d.val_size));
  }
  if (d.name == "gaussian_mixture") {
    d.classes = r.integer("classes", 10);
    d.dim = r.integer("dim", 20);
    d.separation = r.number("separation", 2.0);
    require(d.classes >= 2, r.path_of("classes"), "must be >= 2, got " + std::to_string(d.classes));
    require(d.dim >= 1, r.path_of("dim"), "must be >= 1, got " + std::to_string(d.dim));
    require(d.separation > 0, r.path_of("separation"), "must be > 0, got " + num(d.separation));
  }
  r.finish();
  return d;
}

json data_json(const DataSpec& d) {
  json j = {{"name", d.name}};
  if (d.name == "fashion_mnist") return j;
  j["train_size"] = d.train_size;
  j["val_size"] = d.val_size;
  j["seed"] = d.seed;
  if (d.name == "gaussian_mixture") {
    j["classes"] = d.classes;
    j["dim"] = d.dim;
    j["separation"] = d.separation;
  }
  return j;
}

ModelSpec parse_model(JsonReader r) {
  ModelSpec m;
  m.type = r.string("type", m.type);
  one_of(m.type, {"linear", "mlp", "simple_cnn", "resnet"}, r.path_of("type"));
  if (m.type == "mlp") m.widths = r.integers("widths", m.widths);
  for (std::size_t i = 0; i < m.widths.size(); ++i) {
    require(m.widths[i] > 0, r.path_of("widths") + "[" + std::to_string(i) + "]",
            "must be > 0, got " + std::to_string(m.widths[i]));
  }
  if (m.type == "mlp" || m.type == "resnet") {
    m.norm = r.string("norm", m.type == "resnet" ? "batch" : "none");
    one_of(m.norm, {"none", "batch", "ghost"}, r.path_of("norm"));
    m.ghost_batch_size = r.integer("ghost_batch_size", m.ghost_batch_size);
    require(m.ghost_batch_size > 1, r.path_of("ghost_batch_size"),
            "must be > 1, got " + std::to_string(m.ghost_batch_size));
  }
  if (m.type == "simple_cnn") {
    m.variant = r.string("variant", m.variant);
    one_of(m.variant, {"base", "narrow", "wide"}, r.path_of("variant"));
  }
  if (m.type == "resnet") {
    m.width = r.integer("width", m.width);
    require(m.width > 0, r.path_of("width"), "must be > 0, got " + std::to_string(m.width));
  }
  r.finish();
  return m;
}

json model_json(const ModelSpec& m) {
  json j = {{"type", m.type}};
  if (m.type == "mlp") j["widths"] = m.widths;
  if (m.type == "mlp" || m.type == "resnet") {
    j["norm"] = m.norm;
    j["ghost_batch_size"] = m.ghost_batch_size;
  }
  if (m.type == "simple_cnn") j["variant"] = m.variant;
  if (m.type == "resnet") j["width"] = m.width;
  return j;
}

OptimizerSpec parse_optimizer(JsonReader r) {
  OptimizerSpec o;
  o.name = r.string("name", o.name);
  one_of(o.name, {"sgd", "adam", "adamw", "lars", "larc", "lamb", "novograd"}, r.path_of("name"));
  o.momentum = r.number("momentum", o.momentum);
  require(o.momentum >= 0 && o.momentum < 1, r.path_of("momentum"), "must be in [0, 1), got " + num(o.momentum));
  o.weight_decay = r.optional_number("weight_decay");
  if (o.weight_decay) {
    require(*o.weight_decay >= 0, r.path_of("weight_decay"), "must be >= 0, got " + num(*o.weight_decay));
  }
  o.nesterov = r.boolean("nesterov", false);
  o.trust_coefficient = r.optional_number("trust_coefficient");
  if (o.trust_coefficient) {
    require(*o.trust_coefficient > 0, r.path_of("trust_coefficient"),
            "must be > 0, got " + num(*o.trust_coefficient));
  }
  o.eps = r.optional_number("eps");
  if (o.eps) require(*o.eps >= 0, r.path_of("eps"), "must be >= 0, got " + num(*o.eps));
  if (r.has("betas")) {
    o.betas = r.numbers("betas", {});
    require(o.betas->size() == 2, r.path_of("betas"), "expected two numbers [beta1, beta2]");
    for (const double b : *o.betas) {
      require(b >= 0 && b < 1, r.path_of("betas"), "each must be in [0, 1), got " + num(b));
    }
  } else {
    r.raw("betas");
  }
  o.max_grad_norm = r.optional_number("max_grad_norm");
  if (o.max_grad_norm) {
    require(*o.max_grad_norm >= 0, r.path_of("max_grad_norm"), "must be >= 0, got " + num(*o.max_grad_norm));
  }
  o.momentum_correction = r.boolean("momentum_correction", false);
  require(!o.momentum_correction || o.name == "lars", r.path_of("momentum_correction"),
          "only lars keeps the learning rate in its momentum buffer");
  r.finish();
  return o;
}

json optimizer_json(const OptimizerSpec& o) {
  json j = {{"name", o.name}, {"momentum", o.momentum}, {"nesterov", o.nesterov},
            {"momentum_correction", o.momentum_correction}};
  if (o.weight_decay) j["weight_decay"] = *o.weight_decay;
  if (o.trust_coefficient) j["trust_coefficient"] = *o.trust_coefficient;
  if (o.eps) j["eps"] = *o.eps;
  if (o.betas) j["betas"] = *o.betas;
  if (o.max_grad_norm) j["max_grad_norm"] = *o.max_grad_norm;
  return j;
}

NoiseSpec parse_noise(JsonReader r) {
  NoiseSpec n;
  n.type = r.string("type", n.type);
  one_of(n.type, {"none", "annealed", "multiplicative"}, r.path_of("type"));
  if (n.type == "annealed") {
    n.eta = r.number("eta", n.eta);
    n.gamma = r.number("gamma", n.gamma);
    require(n.eta >= 0, r.path_of("eta"), "must be >= 0 (a variance), got " + num(n.eta));
    require(n.gamma >= 0, r.path_of("gamma"), "must be >= 0, got " + num(n.gamma));
  }
  if (n.type == "multiplicative") {
    n.base_batch = r.integer("base_batch");
    require(n.base_batch > 0, r.path_of("base_batch"), "must be > 0, got " + std::to_string(n.base_batch));
  }
  r.finish();
  return n;
}

json noise_json(const NoiseSpec& n) {
  json j = {{"type", n.type}};
  if (n.type == "annealed") {
    j["eta"] = n.eta;
    j["gamma"] = n.gamma;
  }
  if (n.type == "multiplicative") j["base_batch"] = n.base_batch;
  return j;
}

TargetSpec parse_target(JsonReader r) {
  TargetSpec t;
  t.metric = r.string("metric", t.metric);
  one_of(t.metric, {"val_error", "val_loss"}, r.path_of("metric"));
  t.threshold = r.number("threshold");
  t.eval_every = r.integer("eval_every", t.eval_every);
  require(t.threshold > 0, r.path_of("threshold"), "must be > 0, got " + num(t.threshold));
  require(t.eval_every > 0, r.path_of("eval_every"), "must be > 0, got " + std::to_string(t.eval_every));
  r.finish();
  return t;
}

BudgetSpec parse_budget(JsonReader r) {
  BudgetSpec b;
  require(r.has("steps") != r.has("epochs"), r.path_of("steps"), "give exactly one of budget.steps, budget.epochs");
  if (r.has("steps")) {
    b.length = static_cast<double>(r.integer("steps"));
  } else {
    b.length = r.number("epochs");
    b.unit = schedules::Unit::kEpochs;
  }
  require(b.length > 0, r.path_of(r.has("steps") ? "steps" : "epochs"), "must be > 0, got " + num(b.length));
  r.finish();
  return b;
}

json budget_json(const BudgetSpec& b) {
  if (b.unit == schedules::Unit::kSteps) return {{"steps", static_cast<std::int64_t>(b.length)}};
  return {{"epochs", b.length}};
}

GnsSpec parse_gns(JsonReader r) {
  GnsSpec g;
  g.micro_batches = r.integer("micro_batches", 0);
  g.beta = r.number("beta", g.beta);
  require(g.micro_batches == 0 || g.micro_batches >= 2, r.path_of("micro_batches"),
          "must be 0 (off) or >= 2, got " + std::to_string(g.micro_batches));
  require(g.beta >= 0 && g.beta < 1, r.path_of("beta"), "must be in [0, 1), got " + num(g.beta));
  r.finish();
  return g;
}

// The schedule without its base rate, which the search sets.
schedules::ScheduleSpec parse_schedule(const json* j) {
  json copy = j ? *j : json::object();
  if (!copy.is_object()) config_error("schedule", "expected an object");
  if (copy.contains("base_lr")) config_error("schedule.base_lr", "set by search.lr, not here");
  copy["base_lr"] = 1.0;
  return schedules::schedule_from_json(copy);
}

json schedule_json(const schedules::ScheduleSpec& s, bool with_rate) {
  json j = schedules::to_json(s);
  if (!with_rate) j.erase("base_lr");
  return j;
}

SearchSpec parse_search(JsonReader r) {
  SearchSpec s;
  require(r.has("lr") != r.has("lr_range"), r.path_of("lr"), "give exactly one of search.lr, search.lr_range");
  if (r.has("lr")) {
    s.lr = r.numbers("lr", {});
    require(!s.lr.empty(), r.path_of("lr"), "must not be empty");
    for (std::size_t i = 0; i < s.lr.size(); ++i) {
      require(s.lr[i] > 0, r.path_of("lr") + "[" + std::to_string(i) + "]", "must be > 0, got " + num(s.lr[i]));
    }
  } else {
    JsonReader q = r.object("lr_range");
    s.lr_min = q.number("min");
    s.lr_max = q.number("max");
    s.trials = q.integer("trials");
    require(s.lr_min > 0, q.path_of("min"), "must be > 0, got " + num(s.lr_min));
    require(s.lr_max >= s.lr_min, q.path_of("max"), "must be >= min, got " + num(s.lr_max));
    require(s.trials >= 1, q.path_of("trials"), "must be >= 1, got " + std::to_string(s.trials));
    q.finish();
  }
  s.momentum = r.numbers("momentum", {});
  for (const double m : s.momentum) {
    require(m >= 0 && m < 1, r.path_of("momentum"), "each must be in [0, 1), got " + num(m));
  }
  if (r.has("momentum_range")) {
    require(s.momentum.empty() && s.trials > 0, r.path_of("momentum_range"),
            "goes with search.lr_range and without search.momentum");
    JsonReader q = r.object("momentum_range");
    s.momentum_min = q.number("min");
    s.momentum_max = q.number("max");
    require(s.momentum_min >= 0 && s.momentum_max < 1 && s.momentum_min <= s.momentum_max, q.path_of("max"),
            "need 0 <= min <= max < 1");
    q.finish();
  } else {
    r.raw("momentum_range");
  }
  r.finish();
  return s;
}

json search_json(const SearchSpec& s) {
  json j = json::object();
  if (!s.lr.empty()) {
    j["lr"] = s.lr;
  } else {
    j["lr_range"] = {{"min", s.lr_min}, {"max", s.lr_max}, {"trials", s.trials}};
  }
  if (!s.momentum.empty()) j["momentum"] = s.momentum;
  if (s.momentum_max > 0) j["momentum_range"] = {{"min", s.momentum_min}, {"max", s.momentum_max}};
  return j;
}

// Van der Corput radical inverse: the Halton sequence's coordinate in `base`.
double radical_inverse(std::int64_t i, std::int64_t base) {
  double f = 1, r = 0;
  for (; i > 0; i /= base) {
    f /= static_cast<double>(base);
    r += f * static_cast<double>(i % base);
  }
  return r;
}

struct Point {
  double lr;
  std::optional<double> momentum;
};

std::vector<Point> search_points(const SearchSpec& s) {
  std::vector<Point> out;
  if (!s.lr.empty()) {
    for (const double lr : s.lr) {
      if (s.momentum.empty()) {
        out.push_back({lr, std::nullopt});
      } else {
        for (const double m : s.momentum) out.push_back({lr, m});
      }
    }
    return out;
  }
  // Log-uniform quasi-random (Halton, bases 2 and 3), as in Shallue et al.
  for (std::int64_t i = 1; i <= s.trials; ++i) {
    const double lr = std::exp(std::log(s.lr_min) + (std::log(s.lr_max) - std::log(s.lr_min)) * radical_inverse(i, 2));
    std::optional<double> m;
    if (s.momentum_max > 0) {
      const double lo = std::log(1 - s.momentum_max), hi = std::log(1 - s.momentum_min);
      m = 1 - std::exp(lo + (hi - lo) * radical_inverse(i, 3));
    }
    if (s.momentum.empty()) {
      out.push_back({lr, m});
    } else {
      for (const double mm : s.momentum) out.push_back({lr, mm});
    }
  }
  return out;
}

json trial_common_json(const TrialConfig& t, bool with_rate) {
  return {{"dataset", data_json(t.data)},   {"model", model_json(t.model)},
          {"optimizer", optimizer_json(t.optimizer)},
          {"schedule", schedule_json(t.schedule, with_rate)},
          {"noise", noise_json(t.noise)},
          {"target", {{"metric", t.target.metric}, {"threshold", t.target.threshold}, {"eval_every", t.target.eval_every}}},
          {"budget", budget_json(t.budget)},
          {"gns", {{"micro_batches", t.gns.micro_batches}, {"beta", t.gns.beta}}},
          {"device", t.device},
          {"checkpoint_every", t.checkpoint_every}};
}

}  // namespace

void check_name(const std::string& name, const std::string& what) {
  const bool ok = !name.empty() && name != "." && name != ".." && name.size() <= 128 &&
                  std::all_of(name.begin(), name.end(), [](char c) {
                    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
                  });
  if (!ok) {
    throw ConfigError(what + ": \"" + name +
                      "\" is not a valid name (letters, digits, '.', '_', '-'; not \".\" or \"..\")");
  }
}

SweepConfig parse_sweep(const json& j) {
  try {
    JsonReader r(j, "");
    SweepConfig s;
    TrialConfig& t = s.base;
    t.sweep = r.string("name");
    check_name(t.sweep, "name");
    t.data = parse_data(r.object("dataset"));
    t.model = parse_model(r.object("model"));
    t.optimizer = parse_optimizer(r.object("optimizer"));
    t.schedule = parse_schedule(r.raw("schedule"));
    t.noise = parse_noise(r.object("noise"));
    if (!r.has("target")) config_error("target", "missing (an object with metric, threshold, eval_every)");
    t.target = parse_target(r.object("target"));
    if (!r.has("budget")) config_error("budget", "missing (an object with steps or epochs)");
    t.budget = parse_budget(r.object("budget"));
    t.gns = parse_gns(r.object("gns"));
    t.device = r.string("device", t.device);
    require(t.device == "cpu" || t.device == "cuda", "device", "must be \"cpu\" or \"cuda\", got \"" + t.device + "\"");
    t.checkpoint_every = r.integer("checkpoint_every", 0);
    require(t.checkpoint_every >= 0 && t.checkpoint_every % t.target.eval_every == 0, "checkpoint_every",
            "must be 0 (off) or a multiple of target.eval_every (" + std::to_string(t.target.eval_every) + "), got " +
                std::to_string(t.checkpoint_every));
    if (!r.has("batch_sizes")) config_error("batch_sizes", "missing (a list of batch sizes)");
    s.batch_sizes = r.integers("batch_sizes", {});
    require(!s.batch_sizes.empty(), "batch_sizes", "must not be empty");
    std::set<std::int64_t> seen;
    for (std::size_t i = 0; i < s.batch_sizes.size(); ++i) {
      const auto b = s.batch_sizes[i];
      const std::string path = "batch_sizes[" + std::to_string(i) + "]";
      require(b > 0, path, "must be > 0, got " + std::to_string(b));
      require(seen.insert(b).second, path, "repeats batch size " + std::to_string(b));
      require(t.gns.micro_batches == 0 || b % t.gns.micro_batches == 0, path,
              std::to_string(b) + " is not divisible by gns.micro_batches " + std::to_string(t.gns.micro_batches));
      require(t.noise.type != "multiplicative" || b >= t.noise.base_batch, path,
              std::to_string(b) + " is smaller than noise.base_batch " + std::to_string(t.noise.base_batch));
    }
    if (!r.has("search")) config_error("search", "missing (an object with lr or lr_range)");
    s.search = parse_search(r.object("search"));
    const auto seeds = r.integers("seeds", {0});
    require(!seeds.empty(), "seeds", "must not be empty");
    s.seeds.assign(seeds.begin(), seeds.end());
    for (const auto seed : seeds) require(seed >= 0, "seeds", "must be >= 0, got " + std::to_string(seed));
    require(t.target.metric != "val_error" || t.data.name != "linear_regression", "target.metric",
            "val_error needs a classification dataset; linear_regression has val_loss");
    r.finish();
    return s;
  } catch (const c10::Error& e) {
    throw ConfigError(e.what_without_backtrace());
  }
}

namespace {

json read_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path + ": cannot open the config file");
  try {
    return json::parse(in);
  } catch (const json::parse_error& e) {
    throw ConfigError(path + ": not valid JSON: " + e.what());
  }
}

}  // namespace

std::vector<NamedSweep> parse_sweeps(const json& j) {
  if (!j.is_object() || !j.contains("variants")) {
    SweepConfig s = parse_sweep(j);
    return {{s.base.sweep, std::move(s)}};
  }
  const json& variants = j.at("variants");
  if (!variants.is_object() || variants.empty()) {
    throw ConfigError("variants: expected a non-empty object of name -> changes to the base config");
  }
  json base = j;
  base.erase("variants");
  const std::string name = base.value("name", std::string());
  check_name(name, "name");
  std::vector<NamedSweep> out;
  for (const auto& [variant, patch] : variants.items()) {
    check_name(variant, "variants");
    if (!patch.is_object()) throw ConfigError("variants." + variant + ": expected an object");
    json v = base;
    v.merge_patch(patch);
    v["name"] = variant;
    try {
      out.push_back({name + "/" + variant, parse_sweep(v)});
    } catch (const ConfigError& e) {
      throw ConfigError("variants." + variant + ": " + e.what());
    }
  }
  return out;
}

std::vector<NamedSweep> load_sweeps(const std::string& path) {
  const json j = read_config(path);
  try {
    return parse_sweeps(j);
  } catch (const ConfigError& e) {
    throw ConfigError(path + ": " + e.what());
  }
}

std::vector<TrialConfig> expand(const SweepConfig& sweep) {
  std::vector<TrialConfig> out;
  const auto points = search_points(sweep.search);
  for (const auto batch : sweep.batch_sizes) {
    for (std::size_t i = 0; i < points.size(); ++i) {
      for (const auto seed : sweep.seeds) {
        TrialConfig t = sweep.base;
        t.batch_size = batch;
        t.seed = seed;
        t.schedule.base_lr = points[i].lr;
        if (points[i].momentum) t.optimizer.momentum = *points[i].momentum;
        t.name = "b" + std::to_string(batch) + "_p" + std::to_string(i) + "_s" + std::to_string(seed);
        out.push_back(std::move(t));
      }
    }
  }
  return out;
}

json to_json(const SweepConfig& s) {
  json j = {{"name", s.base.sweep}};
  j.update(trial_common_json(s.base, /*with_rate=*/false));
  j["batch_sizes"] = s.batch_sizes;
  j["search"] = search_json(s.search);
  j["seeds"] = s.seeds;
  return j;
}

json to_json(const TrialConfig& t) {
  json j = {{"sweep", t.sweep}, {"name", t.name}, {"batch_size", t.batch_size}, {"seed", t.seed}};
  j.update(trial_common_json(t, /*with_rate=*/true));
  return j;
}

}  // namespace bigbatch::experiments
