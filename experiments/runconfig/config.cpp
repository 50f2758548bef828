// The configs bigbatch reads (config.h): sweep and trial configs, and cbs
// configs. Reading and writing share one field list per spec:
// `xxx_fields(io, spec)` names each key once, with its default (the spec's
// initial value) and its checks (config/fields.h: Reader fills a spec from
// strict JSON and runs the checks; Writer writes it back with every default
// spelled out: sweep.json, config.json, cbs.json). The built-in datasets'
// and models' keys are theirs (workload/data.cpp, workload/models.cpp).
#include "config.h"

#include "../io/files.h"
#include "../workload/workload.h"
#include "../../compat/autocast.h"
#include "../../config/fields.h"
#include "../../schedules/option_rules.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

namespace bigbatch::experiments {
namespace {

/// The registered optimizers that shard, as a message lists them ("a, b and c").
std::string sharding_optimizers() {
  std::vector<std::string> names;
  for (const auto& name : registered_optimizers()) {
    if (optimizer_entry(name).shards) names.push_back(name);
  }
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
  }
  return out;
}

using config::JsonReader;
using config::Reader;
using config::Writer;
using config::config_error;
using config::num;
using nlohmann::json;

template <typename Io, typename Spec>
void noise_fields(Io& io, Spec& n) {
  io.choice("type", n.type, kNoiseTypes);
  if (n.type == NoiseType::kAnnealed) {
    io.field("eta", n.eta);
    io.field("gamma", n.gamma);
    io.check("eta", n.eta >= 0, "must be >= 0 (a variance), got " + num(n.eta));
    io.check("gamma", n.gamma >= 0, "must be >= 0, got " + num(n.gamma));
  }
  if (n.type == NoiseType::kMultiplicative) {
    io.required("base_batch", n.base_batch);
    io.check("base_batch", n.base_batch > 0, "must be > 0, got " + std::to_string(n.base_batch));
  }
}

template <typename Io, typename Spec>
void target_fields(Io& io, Spec& t) {
  io.choice("metric", t.metric, kMetrics);
  io.required("threshold", t.threshold);
  io.field("eval_every", t.eval_every);
  io.check("threshold", t.threshold > 0, "must be > 0, got " + num(t.threshold));
  io.check("eval_every", t.eval_every > 0, "must be > 0, got " + std::to_string(t.eval_every));
}

// {"steps": n} or {"epochs": x}: the key is the unit.
template <typename Io, typename Spec>
void budget_fields(Io& io, Spec& b) {
  const bool steps = io.given("steps", b.unit == schedules::Unit::kSteps);
  io.check("steps", steps != io.given("epochs", b.unit == schedules::Unit::kEpochs),
           "give exactly one of budget.steps, budget.epochs");
  if (steps) {
    auto n = static_cast<std::int64_t>(b.length);
    io.required("steps", n);
    if constexpr (Io::kReading) b = {static_cast<double>(n), schedules::Unit::kSteps};
  } else {
    io.required("epochs", b.length);
    if constexpr (Io::kReading) b.unit = schedules::Unit::kEpochs;
  }
  io.check(steps ? "steps" : "epochs", b.length > 0, "must be > 0, got " + num(b.length));
}

template <typename Io, typename Spec>
void gns_fields(Io& io, Spec& g) {
  io.field("micro_batches", g.micro_batches);
  io.field("beta", g.beta);
  io.check("micro_batches", g.micro_batches == 0 || g.micro_batches >= 2,
           "must be 0 (off) or >= 2, got " + std::to_string(g.micro_batches));
  io.check("beta", g.beta >= 0 && g.beta < 1, "must be in [0, 1), got " + num(g.beta));
}

// "average": EMA by exactly one of decay (per step) and half_life (in
// examples), or LAWA's k snapshots every `every` steps; and which weights the
// target is read on.
template <typename Io, typename Spec>
void average_fields(Io& io, Spec& a) {
  auto& o = a.options;
  io.choice("type", o.type, kAverageTypes);
  if (o.type == optim::AverageType::kEma) {
    const bool by_decay = io.given("decay", o.half_life == 0);
    io.check("decay", by_decay != io.given("half_life", o.half_life > 0),
             "give exactly one of average.decay, average.half_life");
    if (by_decay) {
      io.required("decay", o.decay);
      io.check("decay", o.decay >= 0 && o.decay < 1, "must be in [0, 1), got " + num(o.decay));
    } else {
      io.required("half_life", o.half_life);
      io.check("half_life", o.half_life > 0 && std::isfinite(o.half_life),
               "must be > 0 (examples), got " + num(o.half_life));
    }
  }
  if (o.type == optim::AverageType::kLawa) {
    io.required("k", o.k);
    io.check("k", o.k >= 1, "must be >= 1 (snapshots), got " + std::to_string(o.k));
    io.required("every", o.every);
    io.check("every", o.every >= 1, "must be >= 1 (steps), got " + std::to_string(o.every));
  }
  io.choice("target_on", a.target_on, kTargetOns);
}

// One compressor's parameters: only those it uses (distributed/compression.h).
template <typename Io, typename Spec>
void compression_fields(Io& io, Spec& c) {
  using distributed::Compression;
  io.choice("name", c.method, distributed::kCompressionNames);
  const Compression m = c.method;
  if (m == Compression::kTopK || m == Compression::kRandomK || m == Compression::kDgc) {
    io.field("ratio", c.ratio);
    io.check("ratio", c.ratio > 0 && c.ratio <= 1, "must be in (0, 1], got " + num(c.ratio));
  }
  if (m == Compression::kTopK || m == Compression::kRandomK || m == Compression::kSign ||
      m == Compression::kPowerSgd) {
    io.field("error_feedback", c.error_feedback);
  }
  if (m == Compression::kDgc) {
    io.field("momentum", c.momentum);
    io.check("momentum", c.momentum >= 0 && c.momentum < 1, "must be in [0, 1), got " + num(c.momentum));
    io.field("warmup_steps", c.warmup_steps);
    io.check("warmup_steps", c.warmup_steps >= 0, "must be >= 0, got " + std::to_string(c.warmup_steps));
  }
  if (m == Compression::kQsgd) {
    io.field("levels", c.levels);
    io.check("levels", c.levels >= 1 && c.levels <= 127, "must be in [1, 127], got " + std::to_string(c.levels));
    io.field("chunk", c.chunk);
    io.check("chunk", c.chunk >= 1, "must be >= 1, got " + std::to_string(c.chunk));
  }
  if (m == Compression::kPowerSgd) {
    io.field("rank", c.rank);
    io.check("rank", c.rank >= 1, "must be >= 1, got " + std::to_string(c.rank));
  }
  if (m != Compression::kNone) {
    io.field("start_steps", c.start_steps);
    io.check("start_steps", c.start_steps >= 0, "must be >= 0, got " + std::to_string(c.start_steps));
  }
}

// How often the ranks agree: every step, local SGD / DiLoCo's H steps
// (distributed/local_sgd.h) with DiLoCo's outer step, or never, asynchronous
// SGD's delays simulated (distributed/delayed.h).
template <typename Io, typename Spec>
void sync_fields(Io& io, Spec& d) {
  using distributed::SyncType;
  auto& s = d.sync;
  io.choice("type", s.type, distributed::kSyncTypeNames);
  if (s.type == SyncType::kEveryStep) return;
  if (s.type == SyncType::kDelayed) {
    auto& x = d.delay;
    io.required("tau", x.tau);
    io.check("tau", x.tau >= 0, "must be >= 0 (steps), got " + std::to_string(x.tau));
    io.choice("draw", x.draw, distributed::kStalenessDrawNames);
    io.field("staleness_aware", x.staleness_aware);
    return;
  }
  io.required("every", s.every);
  io.check("every", s.every >= 1, "must be >= 1 (steps), got " + std::to_string(s.every));
  io.field("fragments", s.fragments);
  io.check("fragments", s.fragments >= 1 && s.every % s.fragments == 0,
           "must be >= 1 and divide every (" + std::to_string(s.every) + "), got " + std::to_string(s.fragments));
  if (s.type == SyncType::kLocalSgd) {
    io.check("outer", !io.given("outer", false), "local_sgd averages the models; an outer step is diloco's");
    return;
  }
  io.object("outer", s.outer, [](auto& q, auto& o) {
    if constexpr (Io::kReading) o = distributed::diloco_outer();
    q.field("lr", o.lr);
    q.check("lr", o.lr > 0 && std::isfinite(o.lr), "must be > 0, got " + num(o.lr));
    q.field("momentum", o.momentum);
    q.check("momentum", o.momentum >= 0 && o.momentum < 1, "must be in [0, 1), got " + num(o.momentum));
    q.field("nesterov", o.nesterov);
    q.check("nesterov", !o.nesterov || o.momentum > 0, "needs momentum > 0");
  });
}

template <typename Io, typename Spec>
void distributed_fields(Io& io, Spec& d) {
  io.object("compression", d.compression, [](auto& q, auto& c) { compression_fields(q, c); });
  io.field("bucket_mb", d.bucket_mb);
  io.check("bucket_mb", d.bucket_mb > 0 && d.bucket_mb <= 4096, "must be in (0, 4096], got " + num(d.bucket_mb));
  io.field("overlap", d.compression.overlap);
  const auto m = d.compression.method;
  io.check("overlap", !d.compression.overlap || m == distributed::Compression::kNone || m == distributed::Compression::kFp16,
           std::string("only the all-reduce exchanges (none, fp16) overlap with backward; ") +
               distributed::compression_name(m) + " exchanges after it");
  if (io.given("shard", d.shard != distributed::ShardStage::kNone)) {
    io.choice("shard", d.shard, distributed::kShardStageNames);
  }
  io.check("shard", d.shard != distributed::ShardStage::kGradients || m == distributed::Compression::kNone,
           std::string("\"gradients\" reduce-scatters the gradients itself and does not compose with compression ") +
               distributed::compression_name(m) + "; \"states\" takes the compressed exchange's average");
  io.check("shard", d.shard != distributed::ShardStage::kGradients || !d.compression.overlap,
           "\"gradients\" reduce-scatters after backward; overlap must be false");
  if (io.given("sync", !d.synchronous())) {
    io.object("sync", d, [](auto& q, auto& s) { sync_fields(q, s); });
  }
  if (!d.synchronous()) {
    io.check("shard", d.shard == distributed::ShardStage::kNone,
             d.delayed() ? std::string("delayed keeps the past parameters whole on every rank; shard must be \"none\"")
                         : "the ranks of " + std::string(distributed::sync_type_name(d.sync.type)) +
                               " keep their own optimizer states between synchronizations; shard must be \"none\"");
    io.check("overlap", !d.compression.overlap,
             std::string(distributed::sync_type_name(d.sync.type)) + " exchanges no gradients in backward");
  }
  if constexpr (Io::kReading) {
    d.compression.bucket_bytes = static_cast<std::int64_t>(d.bucket_mb * (1 << 20));
  }
}

// The schedule has its own field list (schedules/schedule.h); the search sets
// its base rate, so a sweep's schedule has none.
template <typename Io, typename Spec>
void schedule_field(Io& io, Spec& s, bool with_rate) {
  if constexpr (Io::kReading) {
    const json* given = io.json_reader().raw("schedule");
    json copy = given ? *given : json::object();
    if (!copy.is_object()) config_error("schedule", "expected an object");
    if (copy.contains("base_lr")) config_error("schedule.base_lr", "set by search.lr, not here");
    copy["base_lr"] = 1.0;
    s = schedules::schedule_from_json(copy);
  } else {
    json j = schedules::to_json(s);
    if (!with_rate) j.erase("base_lr");
    io.field("schedule", j);
  }
}

template <typename Io, typename Spec>
void lr_range_fields(Io& io, Spec& s) {
  io.required("min", s.lr_min);
  io.required("max", s.lr_max);
  io.required("trials", s.trials);
  io.check("min", s.lr_min > 0, "must be > 0, got " + num(s.lr_min));
  io.check("max", s.lr_max >= s.lr_min, "must be >= min, got " + num(s.lr_max));
  io.check("trials", s.trials >= 1, "must be >= 1, got " + std::to_string(s.trials));
}

template <typename Io, typename Spec>
void momentum_range_fields(Io& io, Spec& s) {
  io.required("min", s.momentum_min);
  io.required("max", s.momentum_max);
  io.check("max", s.momentum_min >= 0 && s.momentum_max < 1 && s.momentum_min <= s.momentum_max,
           "need 0 <= min <= max < 1");
}

template <typename Io, typename Spec>
void search_fields(Io& io, Spec& s) {
  const bool listed = io.given("lr", !s.lr.empty());
  io.check("lr", listed != io.given("lr_range", s.lr.empty()), "give exactly one of search.lr, search.lr_range");
  if (listed) {
    io.field("lr", s.lr);
    io.check("lr", !s.lr.empty(), "must not be empty");
    for (std::size_t i = 0; i < s.lr.size(); ++i) {
      io.check("lr[" + std::to_string(i) + "]", s.lr[i] > 0, "must be > 0, got " + num(s.lr[i]));
    }
  } else {
    io.object("lr_range", s, [](auto& q, auto& spec) { lr_range_fields(q, spec); });
  }
  if (io.given("momentum", !s.momentum.empty())) {
    io.field("momentum", s.momentum);
    for (const double m : s.momentum) io.check("momentum", m >= 0 && m < 1, "each must be in [0, 1), got " + num(m));
  }
  if (io.given("momentum_range", s.momentum_max > 0)) {
    io.check("momentum_range", s.momentum.empty() && s.trials > 0,
             "goes with search.lr_range and without search.momentum");
    io.object("momentum_range", s, [](auto& q, auto& spec) { momentum_range_fields(q, spec); });
  }
}

// "dataset", "model" and "optimizer": the registered name under `name_key`
// (absent: the spec's default), the rest resolved by its registration
// (workload.h) or entry (optim/optimizer.h).
json dataset_resolver(const std::string& name, const json& params) {
  const DatasetRegistration r = dataset_registration(name);
  return r.resolve ? r.resolve(params) : params;
}
json model_resolver(const std::string& type, const json& params) {
  const ModelRegistration r = model_registration(type);
  return r.resolve ? r.resolve(params) : params;
}
// "optimizer": its name (absent: lamb), the rest its entry's keys (optim/).
json optimizer_resolver(const std::string& name, const json& params) {
  return resolve_optimizer(name, params).params;
}

// (Part: WorkloadPart to read into, const WorkloadPart to write from.)
template <typename Io, typename Part>
void part_field(Io& io, const char* key, const char* name_key, Part& part,
                json (*resolve)(const std::string&, const json&)) {
  if constexpr (Io::kReading) {
    JsonReader& r = io.json_reader();
    const std::string path = r.path_of(key);
    const json* given = r.raw(key);
    json params = given != nullptr ? *given : json::object();
    if (!params.is_object()) config_error(path, std::string("expected an object, got ") + params.type_name());
    std::string name = part.name;
    if (const auto it = params.find(name_key); it != params.end()) {
      if (!it->is_string()) config_error(path + "." + name_key, std::string("expected a string, got ") + it->type_name());
      name = it->template get<std::string>();
      params.erase(name_key);
    }
    json resolved = resolve(name, params);
    if (!resolved.is_object()) config_error(path, "the registration of \"" + name + "\" resolved it to a non-object");
    resolved.erase(name_key);
    part = {name, std::move(resolved)};
  } else {
    json j = part.params;
    j[name_key] = part.name;
    io.field(key, j);
  }
}

// A missing object that has no useful default.
template <typename Io>
void need(Io& io, const char* key, bool in_spec, const char* what) {
  io.check(key, io.given(key, in_spec), std::string("missing (") + what + ")");
}

// fp16 needs a compressor without memory: one that carries gradients between
// steps would hold loss-scaled ones, an overflow step's inf among them for
// good (every later step non-finite, the scale halving to nothing).
template <typename Io, typename Spec>
void check_precision(Io& io, const Spec& t) {
  const std::string refusal = precision_refusal(t.precision, t.device);
  io.check("precision", refusal.empty(), refusal);
  const auto& c = t.distributed.compression;
  io.check("precision", t.precision != Precision::kFp16 || !distributed::carries_gradients(c),
           std::string("fp16's loss-scaled gradients cannot feed distributed.compression ") +
               distributed::compression_name(c.method) +
               ", which keeps gradients between steps (use bf16, or a compressor without memory: none, fp16, bf16, "
               "terngrad, qsgd, or randomk/sign with error_feedback false)");
}

// Why `t`'s horizons cannot be branched ("" when they can): the decay must
// end at the budget and be one whose end a horizon moves (wsd: its cooldown
// keeps its fraction of the run; cosine, linear, polynomial: their length),
// in the budget's unit, and every horizon must leave room for the warmup
// and that decay.
std::string horizons_refusal(const TrialConfig& t) {
  using schedules::DecayType;
  const schedules::ScheduleSpec& s = t.schedule;
  const DecayType d = s.decay.type;
  const bool wsd = d == DecayType::kWsd;
  if (!wsd && d != DecayType::kCosine && d != DecayType::kLinear && d != DecayType::kPolynomial) {
    return "need a schedule.decay that ends with the run (wsd, cosine, linear or polynomial), got " +
           schedules::to_string(d);
  }
  if (s.unit != t.budget.unit) {
    return "give schedule.unit and the budget in one unit (schedule " + schedules::to_string(s.unit) +
           ", budget " + schedules::to_string(t.budget.unit) + ")";
  }
  if (s.regime_adaptation) return "not with schedule.regime_adaptation (it stretches the decay with the batch)";
  const double end = s.warmup.length + (wsd ? s.decay.stable + s.decay.cooldown : s.decay.length);
  if (std::abs(end - t.budget.length) > 1e-9 * t.budget.length) {
    return "the warmup and decay must end at the budget (" + num(t.budget.length) + "), they end at " + num(end);
  }
  double last = 0;
  for (const double h : t.horizons) {
    if (!(h > last && h < t.budget.length)) {
      return "must increase and stay between 0 and the budget (" + num(t.budget.length) + "), got " + num(h);
    }
    const double room = wsd ? h * (1 - s.decay.cooldown / t.budget.length) : h;
    if (room <= s.warmup.length && !(wsd && room == s.warmup.length)) {
      return "horizon " + num(h) + " leaves no room for the warmup (" + num(s.warmup.length) + ") and the decay";
    }
    last = h;
  }
  return "";
}

// What a sweep and each of its trials share: everything but the name, batch
// size, seed and (in a sweep) the rate.
template <typename Io, typename Spec>
void common_fields(Io& io, Spec& t, bool with_rate) {
  const auto nested = [&](const char* key, auto& spec, auto fields) { io.object(key, spec, fields); };
  part_field(io, "dataset", "name", t.data, dataset_resolver);
  part_field(io, "model", "type", t.model, model_resolver);
  part_field(io, "optimizer", "name", t.optimizer, optimizer_resolver);
  schedule_field(io, t.schedule, with_rate);
  nested("noise", t.noise, [](auto& q, auto& n) { noise_fields(q, n); });
  need(io, "target", true, "an object with metric, threshold, eval_every");
  nested("target", t.target, [](auto& q, auto& x) { target_fields(q, x); });
  need(io, "budget", true, "an object with steps or epochs");
  nested("budget", t.budget, [](auto& q, auto& b) { budget_fields(q, b); });
  nested("gns", t.gns, [](auto& q, auto& g) { gns_fields(q, g); });
  if (io.given("distributed", !t.distributed.is_default())) {
    nested("distributed", t.distributed, [](auto& q, auto& d) { distributed_fields(q, d); });
  }
  if (io.given("average", t.average.on())) {
    nested("average", t.average, [](auto& q, auto& a) { average_fields(q, a); });
  }
  if (io.given("horizons", !t.horizons.empty())) {
    io.field("horizons", t.horizons);
    io.check("horizons", !t.horizons.empty(), "must not be empty (leave it out for none)");
    if (!t.horizons.empty()) io.check("horizons", horizons_refusal(t).empty(), horizons_refusal(t));
  }
  io.check("average", !t.average.on() || !optimizer_entry(t.optimizer.name).evaluation_point,
           t.optimizer.name + " is evaluated at an average of its own (Schedule-Free's x); averaging its training "
                              "point y is not that");
  io.choice("device", t.device, kDeviceTypes);
  if (io.given("precision", t.precision != Precision::kFp32)) io.choice("precision", t.precision, kPrecisions);
  check_precision(io, t);
  const distributed::ShardStage shard = t.distributed.shard;
  if (shard != distributed::ShardStage::kNone && !optimizer_entry(t.optimizer.name).shards) {
    io.check("distributed", false,
             std::string("shard \"") + distributed::shard_stage_name(shard) + "\": " + t.optimizer.name +
                 " has no sharded form (" + sharding_optimizers() + " have)");
  }
  io.check("precision", shard != distributed::ShardStage::kGradients || t.precision != Precision::kFp16,
           "fp16's loss scaler reads every rank's whole gradient, which distributed.shard \"gradients\" frees; use "
           "bf16 or shard \"states\"");
  if (!t.distributed.synchronous()) {  // each rank's own model between synchronizations
    const std::string sync = distributed::sync_type_name(t.distributed.sync.type);
    io.check("average", !t.average.on(), "not with distributed.sync " + sync + ": the ranks' weights differ between "
                                         "synchronizations");
    io.check("optimizer", !optimizer_entry(t.optimizer.name).evaluation_point,
             t.optimizer.name + " is evaluated at a point of its own, which distributed.sync " + sync +
                 " does not synchronize");
    io.check("horizons", t.horizons.empty(), "not with distributed.sync " + sync);
  }
  io.field("checkpoint_every", t.checkpoint_every);
  io.field("tensorboard", t.tensorboard);
  io.check("checkpoint_every", t.checkpoint_every == 0 || t.distributed.synchronous(),
           "not with distributed.sync " + std::string(distributed::sync_type_name(t.distributed.sync.type)) +
               ": between synchronizations each rank's model and optimizer are its own, which one rank's "
               "checkpoint does not hold");
  io.check("checkpoint_every", t.checkpoint_every >= 0 && t.checkpoint_every % t.target.eval_every == 0,
           "must be 0 (off) or a multiple of target.eval_every (" + std::to_string(t.target.eval_every) +
               "), got " + std::to_string(t.checkpoint_every));
}

template <typename Io, typename Spec>
void sweep_fields(Io& io, Spec& s) {
  auto& t = s.base;
  io.required("name", t.sweep);
  check_name(t.sweep, "name");
  common_fields(io, t, /*with_rate=*/false);
  need(io, "batch_sizes", true, "a list of batch sizes");
  io.field("batch_sizes", s.batch_sizes);
  io.check("batch_sizes", !s.batch_sizes.empty(), "must not be empty");
  std::set<std::int64_t> seen;
  for (std::size_t i = 0; i < s.batch_sizes.size(); ++i) {
    const auto b = s.batch_sizes[i];
    const std::string key = "batch_sizes[" + std::to_string(i) + "]";
    io.check(key, b > 0, "must be > 0, got " + std::to_string(b));
    io.check(key, seen.insert(b).second, "repeats batch size " + std::to_string(b));
    io.check(key, t.gns.micro_batches == 0 || b % t.gns.micro_batches == 0,
             std::to_string(b) + " is not divisible by gns.micro_batches " + std::to_string(t.gns.micro_batches));
    io.check(key, t.noise.type != NoiseType::kMultiplicative || b >= t.noise.base_batch,
             std::to_string(b) + " is smaller than noise.base_batch " + std::to_string(t.noise.base_batch));
  }
  if constexpr (Io::kReading) {
    // The schedule's option rules at every batch size (the rate only scales
    // the timescale's decay): an optimizer without the option, or a beta the
    // rule pushes out of [0, 1), is refused here, before any trial runs.
    for (const auto b : s.batch_sizes) schedules::ruled_options(t.schedule, b, 1.0, t.optimizer.name, t.optimizer.params);
  }
  need(io, "search", true, "an object with lr or lr_range");
  io.object("search", s.search, [](auto& q, auto& x) { search_fields(q, x); });
  // The search's momentum is the optimizer's "momentum" key.
  io.check(s.search.momentum.empty() ? "search.momentum_range" : "search.momentum",
           (s.search.momentum.empty() && s.search.momentum_max == 0) || t.optimizer.momentum(),
           t.optimizer.name + " has no momentum to search");
  io.field("seeds", s.seeds);
  io.check("seeds", !s.seeds.empty(), "must not be empty");
  io.object("runner", s.runner, [](auto& q, auto& r) {
    q.field("prune", r.prune);
    q.field("batch_trials", r.batch_trials);
    q.field("loader_threads", r.loader.threads);
    q.check("loader_threads", r.loader.threads >= -1,
            "must be >= 0, or -1 (auto), got " + std::to_string(r.loader.threads));
    q.field("prefetch", r.loader.prefetch);
    q.check("prefetch", r.loader.prefetch >= 1, "must be >= 1, got " + std::to_string(r.loader.prefetch));
    q.field("threads_per_trial", r.threads_per_trial);
    q.check("threads_per_trial", r.threads_per_trial >= 1 && r.threads_per_trial <= 1024,
            "must be in [1, 1024], got " + std::to_string(r.threads_per_trial));
  });
}

template <typename Io, typename Spec>
void trial_fields(Io& io, Spec& t) {
  io.required("sweep", t.sweep);
  io.required("name", t.name);
  io.field("batch_size", t.batch_size);
  io.field("seed", t.seed);
  common_fields(io, t, /*with_rate=*/true);
}

}  // namespace

bool DistributedSpec::is_default() const {
  return compression.method == distributed::Compression::kNone && bucket_mb == 25 && !compression.overlap &&
         shard == distributed::ShardStage::kNone && synchronous();
}

namespace {

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

// ------------------------------------------------------------ cbs configs --

// "checkpoints" as given: a list of examples, or {"first", "last", "count"}
// spaced evenly in log(examples), each rounded to a multiple of the
// reference batch. `path` names the key in errors.
std::vector<std::int64_t> read_checkpoints(const json& value, std::int64_t batch, const std::string& path) {
  std::vector<std::int64_t> out;
  if (value.is_object()) {
    JsonReader r(value, path);
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

std::string precision_refusal(Precision precision, DeviceType device) {
  if (precision == Precision::kFp32) return "";
  const auto dtype = precision == Precision::kBf16 ? at::kBFloat16 : at::kHalf;
  const auto type = device == DeviceType::kCuda ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
  if (compat::autocast_supports(type, dtype)) return "";
  return to_string(precision) + " on device " + to_string(device) + " needs LibTorch 2.5 or later (this is " + TORCH_VERSION +
         ", whose CPU autocast takes bf16 alone)";
}

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
    Reader r(JsonReader(j, ""));
    SweepConfig s;
    sweep_fields(r, s);
    r.json_reader().finish();
    return s;
  } catch (const c10::Error& e) {
    throw ConfigError(e.what_without_backtrace());
  }
}

json read_config(const std::string& path) {
  if (std::filesystem::is_directory(path)) throw ConfigError(path + ": a folder, not a config file");
  std::string text;
  try {
    text = read_file(path);
  } catch (const std::runtime_error& e) {
    throw ConfigError(e.what());  // "<path>: cannot read: <reason>"
  }
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    throw ConfigError(path + ": not valid JSON: " + e.what());
  }
}


std::vector<NamedSweep> parse_sweeps(const json& j) {
  if (j.is_object() && j.contains("cbs")) throw ConfigError("cbs: this is a cbs config: run it with `bigbatch cbs`");
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
  const auto given = base.find("name");
  if (given != base.end() && !given->is_string()) {
    throw ConfigError(std::string("name: expected a string, got ") + given->type_name());
  }
  const std::string name = given == base.end() ? std::string() : given->get<std::string>();
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

TrialConfig horizon_trial(const TrialConfig& trial, std::size_t k) {
  TORCH_CHECK(k < trial.horizons.size(), "horizon_trial: trial ", trial.name, " has ", trial.horizons.size(),
              " horizons, asked for ", k + 1);
  TrialConfig t = trial;
  const double h = trial.horizons[k];
  schedules::DecaySpec& d = t.schedule.decay;
  if (d.type == schedules::DecayType::kWsd) {
    d.cooldown = d.cooldown * h / trial.budget.length;
    d.stable = std::max(0.0, h - t.schedule.warmup.length - d.cooldown);
  } else {
    d.length = h - t.schedule.warmup.length;
  }
  t.budget.length = h;
  t.horizons.clear();
  t.name = trial.name + "/horizon_" + std::to_string(k + 1);
  return t;
}

namespace {

TrialConfig make_trial(const SweepConfig& sweep, std::int64_t batch, double lr, std::optional<double> momentum,
                       std::uint64_t seed, const char* kind, std::size_t k) {
  TrialConfig t = sweep.base;
  t.loader = sweep.runner.loader;
  t.batch_size = batch;
  t.seed = seed;
  t.schedule.base_lr = lr;
  if (momentum) t.optimizer.params["momentum"] = *momentum;
  // The options the schedule's rules give this batch (SDE, timescale,
  // half-life), written into the trial's keys: its config holds what it trains with.
  if (schedules::has_option_rules(t.schedule)) {
    t.optimizer.params = schedules::ruled_options(t.schedule, batch, lr, t.optimizer.name, t.optimizer.params);
  }
  std::ostringstream name;  // (not string +: GCC 12 warns falsely about it, PR 105651)
  name << 'b' << batch << '_' << kind << k << "_s" << seed;
  t.name = name.str();
  return t;
}

}  // namespace

std::vector<TrialConfig> expand(const SweepConfig& sweep) {
  std::vector<TrialConfig> out;
  const auto points = search_points(sweep.search);
  for (const auto batch : sweep.batch_sizes) {
    for (std::size_t i = 0; i < points.size(); ++i) {
      for (const auto seed : sweep.seeds) {
        out.push_back(make_trial(sweep, batch, points[i].lr, points[i].momentum, seed, "p", i));
      }
    }
  }
  return out;
}

std::vector<TrialConfig> expand(const SweepConfig& sweep, const std::vector<ExtraPoint>& extra) {
  std::vector<TrialConfig> out = expand(sweep);
  std::map<std::int64_t, std::size_t> count;
  for (const ExtraPoint& p : extra) {
    const std::size_t k = count[p.batch_size]++;
    for (const auto seed : sweep.seeds) out.push_back(make_trial(sweep, p.batch_size, p.lr, p.momentum, seed, "x", k));
  }
  return out;
}

json to_json(const SweepConfig& s) {
  Writer w;
  sweep_fields(w, s);
  return w.out();
}

json to_json(const TrialConfig& t) {
  Writer w;
  trial_fields(w, t);
  return w.out();
}


namespace {

// Folders written before "resnet" had a depth hold no "depth": theirs was 8,
// the default, so a depth of 8 is left out of the comparison.
void drop_default_depth(json& j) {
  if (j.is_object()) {
    const auto type = j.find("type");
    const auto depth = j.find("depth");
    if (type != j.end() && *type == "resnet" && depth != j.end() && *depth == 8) j.erase("depth");
  }
  if (j.is_structured()) {
    for (auto& item : j) drop_default_depth(item);
  }
}

// Folders written before each optimizer owned its keys hold every
// optimizer's momentum, nesterov and momentum_correction, and no defaults of
// the optional keys: compared as a config of today resolves them.
void normalize_optimizers(json& j) {
  if (!j.is_structured()) return;
  if (j.is_object()) {
    const auto optimizer = j.find("optimizer");
    if (optimizer != j.end()) *optimizer = normalized_optimizer(*optimizer);
  }
  for (auto& item : j) normalize_optimizers(item);
}

}  // namespace

json identity(json resolved) {
  if (resolved.is_object()) {
    resolved.erase("tensorboard");
    resolved.erase("machine");  // what the sweep ran on (machine.h), written beside the config
    // Of the runner's keys only the thread count changes results.
    const auto runner = resolved.find("runner");
    if (runner != resolved.end()) {
      const auto threads = runner->find("threads_per_trial");
      *runner = threads != runner->end() ? json{{"threads_per_trial", *threads}} : json::object();
    }
  }
  drop_default_depth(resolved);
  normalize_optimizers(resolved);
  return resolved;
}

std::optional<std::string> identity_difference(const json& existing, const json& resolved) {
  json a = identity(existing), b = identity(resolved);
  // Folders from before runner.threads_per_trial do not say theirs.
  if (a.is_object() && b.is_object() && !(a.contains("runner") && a["runner"].contains("threads_per_trial"))) {
    a.erase("runner");
    b.erase("runner");
  }
  if (a == b) return std::nullopt;
  const json patch = json::diff(a, b);
  return patch.empty() ? std::string() : patch[0].value("path", std::string());
}


std::string to_string(NoiseType type) { return config::enum_name(kNoiseTypes, type); }
std::string to_string(Metric metric) { return config::enum_name(kMetrics, metric); }
std::string to_string(DeviceType device) { return config::enum_name(kDeviceTypes, device); }
std::string to_string(Precision precision) { return config::enum_name(kPrecisions, precision); }

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
    Reader r(JsonReader(j.at("cbs"), "cbs"));
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
  // Asked before the sweep's own reading, which would apply the rules to the
  // branches' batches (a schedule that does not read is refused by it, below).
  if (workload["schedule"].is_object()) {
    json spec = workload["schedule"];
    spec["base_lr"] = 1.0;
    bool rules = false;
    try {
      rules = schedules::has_option_rules(schedules::schedule_from_json(spec));
    } catch (const c10::Error&) {
    }
    if (rules) {
      throw ConfigError("schedule: a cbs config's branches scale the rate only; scaling \"sde\", "
                        "weight_decay_timescale and beta2_half_life are for sweeps");
    }
  }
  c.sweep = parse_sweep(workload);
  const schedules::ScheduleSpec& s = c.sweep.base.schedule;
  if (s.warmup.length != 0 || s.decay.type != schedules::DecayType::kConstant || s.batch_increase ||
      !s.batch_warmup.empty() || s.regime_adaptation) {
    throw ConfigError("schedule: a cbs reference and its branches train at a constant rate (the scaling rule sets "
                      "each branch's), so no warmup, decay, batch_increase, batch_warmup or regime_adaptation");
  }
  if (!c.sweep.base.horizons.empty()) {
    throw ConfigError("horizons: not a key of a cbs config (a cbs reference trains at a constant rate)");
  }
  if (c.sweep.base.average.on()) {
    throw ConfigError("average: not a key of a cbs config (its branches start from the reference's weights, "
                      "not from an average)");
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
  // Of the runner only the thread count changes results (identity()).
  j["runner"] = {{"threads_per_trial", c.sweep.runner.threads_per_trial}};
  Writer w;
  cbs_fields(w, c.cbs);
  j["cbs"] = w.out();
  return j;
}

}  // namespace bigbatch::experiments
