// bigbatch cbs's config (cbs_config.h): the "cbs" object from one field list
// (config_io.h), the workload from the sweep config's.
#include "cbs_config.h"

#include "config_io.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>

namespace bigbatch::experiments {
namespace {

using config::config_error;
using config_io::num;
using config_io::Reader;
using config_io::Writer;
using nlohmann::json;

// "checkpoints" as given: a list of examples, or {"first", "last", "count"}
// spaced evenly in log(examples), each rounded to a multiple of the
// reference batch. `path` names the key in errors.
std::vector<std::int64_t> read_checkpoints(const json& value, std::int64_t batch, const std::string& path) {
  std::vector<std::int64_t> out;
  if (value.is_object()) {
    config::JsonReader r(value, path);
    const std::int64_t first = r.integer("first");
    const std::int64_t last = r.integer("last");
    const std::int64_t count = r.integer("count");
    r.finish();
    if (first <= 0) config_error(r.path_of("first"), "must be > 0, got " + std::to_string(first));
    if (last <= first) {
      config_error(r.path_of("last"), "must be > first (" + std::to_string(first) + "), got " + std::to_string(last));
    }
    if (count < 2) config_error(r.path_of("count"), "must be >= 2, got " + std::to_string(count));
    for (std::int64_t i = 0; i < count; ++i) {
      const double e = static_cast<double>(first) *
                       std::pow(static_cast<double>(last) / static_cast<double>(first),
                                static_cast<double>(i) / static_cast<double>(count - 1));
      const std::int64_t rounded = std::max<std::int64_t>(1, std::llround(e / static_cast<double>(batch))) * batch;
      if (!out.empty() && rounded <= out.back()) {
        config_error(r.path_of("count"), std::to_string(count) + " checkpoints between " + std::to_string(first) +
                                             " and " + std::to_string(last) +
                                             " collide once rounded to multiples of the reference batch (" +
                                             std::to_string(batch) + "); use fewer");
      }
      out.push_back(rounded);
    }
    return out;
  }
  if (!value.is_array() || value.empty()) {
    config_error(path, "expected a non-empty list of examples or {first, last, count}");
  }
  for (std::size_t i = 0; i < value.size(); ++i) {
    const std::string key = path + "[" + std::to_string(i) + "]";
    if (!value[i].is_number_integer()) config_error(key, "expected an integer (examples seen)");
    out.push_back(value[i].get<std::int64_t>());
  }
  return out;
}

// {"absolute": x} or {"relative": x}: the key is the kind.
template <typename Io, typename Spec>
void tolerance_fields(Io& io, Spec& t) {
  const bool relative = io.given("relative", t.relative);
  io.check_whole(relative != io.given("absolute", !t.relative), "give exactly one of \"absolute\" and \"relative\"");
  io.required(relative ? "relative" : "absolute", t.value);
  if constexpr (Io::kReading) t.relative = relative;
  io.check(relative ? "relative" : "absolute", t.value >= 0 && std::isfinite(t.value),
           "must be >= 0, got " + num(t.value));
}

template <typename Io, typename Spec>
void cbs_fields(Io& io, Spec& c) {
  io.required("reference_batch", c.reference_batch);
  io.check("reference_batch", c.reference_batch > 0, "must be > 0, got " + std::to_string(c.reference_batch));
  io.required("reference_lr", c.reference_lr);
  io.check("reference_lr", c.reference_lr > 0, "must be > 0, got " + num(c.reference_lr));
  if constexpr (Io::kReading) {  // a list, or a log-spaced range that reads as one
    auto& r = io.json_reader();
    const json* given = r.raw("checkpoints");
    if (given == nullptr) config_error(r.path_of("checkpoints"), "missing (a list or {first, last, count})");
    c.checkpoints = read_checkpoints(*given, c.reference_batch, r.path_of("checkpoints"));
  } else {
    io.field("checkpoints", c.checkpoints);
  }
  for (std::size_t i = 0; i < c.checkpoints.size(); ++i) {
    const std::string key = "checkpoints[" + std::to_string(i) + "]";
    const std::int64_t e = c.checkpoints[i];
    io.check(key, e >= 0 && e % c.reference_batch == 0,
             "must be a multiple of cbs.reference_batch (" + std::to_string(c.reference_batch) + ") and >= 0, got " +
                 std::to_string(e));
    io.check(key, i == 0 || e > c.checkpoints[i - 1],
             "must be greater than the one before (" + std::to_string(i > 0 ? c.checkpoints[i - 1] : 0) + "), got " +
                 std::to_string(e));
  }
  io.field("branch_batches", c.branch_batches);
  const auto& b = c.branch_batches;
  io.check("branch_batches", b.size() >= 2, "needs at least 2 batch sizes, got " + std::to_string(b.size()));
  for (std::size_t i = 0; i < b.size(); ++i) {
    const std::string key = "branch_batches[" + std::to_string(i) + "]";
    io.check(key, b[i] > 0, "must be > 0, got " + std::to_string(b[i]));
    io.check(key, i == 0 || b[i] > b[i - 1],
             "must be greater than the one before (" + std::to_string(i > 0 ? b[i - 1] : 0) + "), got " +
                 std::to_string(b[i]));
  }
  io.check("branch_batches", std::find(b.begin(), b.end(), c.reference_batch) != b.end(),
           "must include cbs.reference_batch (" + std::to_string(c.reference_batch) + ")");
  io.required("window", c.window);
  io.check("window", c.window > 0, "must be > 0, got " + std::to_string(c.window));
  for (const auto batch : b) {
    io.check("window", c.window % batch == 0,
             "must be a multiple of every branch batch, so that each trains the same examples; " +
                 std::to_string(c.window) + " is not a multiple of " + std::to_string(batch));
  }
  if (io.given("tolerance", true)) {  // the writer writes it; absent, the default stays
    io.object("tolerance", c.tolerance, [](auto& q, auto& t) { tolerance_fields(q, t); });
  }
  io.field("lr_factors", c.lr_factors);
  io.check("lr_factors", !c.lr_factors.empty(), "must not be empty");
  for (std::size_t i = 0; i < c.lr_factors.size(); ++i) {
    io.check("lr_factors[" + std::to_string(i) + "]", c.lr_factors[i] > 0 && std::isfinite(c.lr_factors[i]),
             "must be > 0, got " + num(c.lr_factors[i]));
  }
}

}  // namespace

CbsConfig parse_cbs(const json& j) {
  if (!j.is_object()) throw ConfigError("a cbs config must be a JSON object");
  if (!j.contains("cbs")) throw ConfigError("cbs: missing (an object: reference_batch, reference_lr, checkpoints, ...)");
  for (const char* key : {"batch_sizes", "search", "variants"}) {
    if (j.contains(key)) {
      throw ConfigError(std::string(key) + ": not a key of a cbs config (cbs.reference_batch, cbs.reference_lr and "
                                           "cbs.branch_batches set the batches and rates)");
    }
  }
  CbsConfig c;
  try {
    Reader r(config::JsonReader(j.at("cbs"), "cbs"));
    cbs_fields(r, c.cbs);
    r.json_reader().finish();
  } catch (const c10::Error& e) {
    throw ConfigError(e.what_without_backtrace());
  }
  json workload = j;
  workload.erase("cbs");
  if (workload.contains("schedule") && workload["schedule"].is_object()) {
    json& s = workload["schedule"];
    if (s.contains("base_batch") && s["base_batch"] != json(c.cbs.reference_batch)) {
      throw ConfigError("schedule.base_batch: set by cbs.reference_batch (" + std::to_string(c.cbs.reference_batch) +
                        ") in a cbs config, got " + s["base_batch"].dump());
    }
    s["base_batch"] = c.cbs.reference_batch;
  } else if (!workload.contains("schedule")) {
    workload["schedule"] = {{"base_batch", c.cbs.reference_batch}};
  }
  workload["batch_sizes"] = c.cbs.branch_batches;
  workload["search"] = {{"lr", {c.cbs.reference_lr}}};
  c.sweep = parse_sweep(workload);
  const schedules::ScheduleSpec& s = c.sweep.base.schedule;
  if (s.warmup.length != 0 || s.decay.type != schedules::DecayType::kConstant || s.batch_increase ||
      !s.batch_warmup.empty() || s.regime_adaptation) {
    throw ConfigError("schedule: a cbs reference and its branches train at a constant rate (the scaling rule sets "
                      "each branch's), so no warmup, decay, batch_increase, batch_warmup or regime_adaptation");
  }
  if (c.sweep.base.checkpoint_every != 0) {
    throw ConfigError("checkpoint_every: not a key of a cbs config (cbs.checkpoints says where the reference saves)");
  }
  return c;
}

CbsConfig load_cbs(const std::string& path) {
  const json j = read_config(path);
  try {
    return parse_cbs(j);
  } catch (const ConfigError& e) {
    throw ConfigError(path + ": " + e.what());
  }
}

json to_json(const CbsConfig& c) {
  json j = to_json(c.sweep);
  j.erase("batch_sizes");
  j.erase("search");
  j.erase("runner");
  Writer w;
  cbs_fields(w, c.cbs);
  j["cbs"] = w.out();
  return j;
}

}  // namespace bigbatch::experiments
