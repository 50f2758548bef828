// The configs of the experiment runner: sweep and trial configs, and cbs
// configs (bigbatch cbs, cbs.h); strict JSON parsing (every key known, every
// type checked, errors naming the key), the expansion of a sweep into
// trials, and the resolved JSON written beside the results.
#pragma once

#include "../optim/optimizer.h"
#include "../workload/data.h"
#include "../workload/models.h"
#include "../../distributed/compression.h"
#include "../../distributed/delayed.h"
#include "../../distributed/local_sgd.h"
#include "../../distributed/sharded.h"
#include "../../optimizers/weight_average.h"
#include "../../config/json_reader.h"
#include "../../schedules/schedule.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace bigbatch::experiments {

enum class NoiseType { kNone, kAnnealed, kMultiplicative };
enum class Metric { kValError, kValLoss };
enum class DeviceType { kCpu, kCuda };
/// The arithmetic of a trial's forward and backward passes (docs/experiments.md
/// "Mixed precision"): fp32; or autocast to bf16 or fp16 with fp32 weights,
/// fp16 with a dynamic loss scale.
enum class Precision { kFp32, kBf16, kFp16 };

/// How configs and result files spell them, in the order error messages list
/// them (the optimizers' names are their entries', optim/optimizer.h).
inline constexpr config::EnumName<NoiseType> kNoiseTypes[] = {
    {NoiseType::kNone, "none"}, {NoiseType::kAnnealed, "annealed"}, {NoiseType::kMultiplicative, "multiplicative"}};
inline constexpr config::EnumName<Metric> kMetrics[] = {{Metric::kValError, "val_error"},
                                                           {Metric::kValLoss, "val_loss"}};
inline constexpr config::EnumName<DeviceType> kDeviceTypes[] = {{DeviceType::kCpu, "cpu"},
                                                                   {DeviceType::kCuda, "cuda"}};
inline constexpr config::EnumName<Precision> kPrecisions[] = {
    {Precision::kFp32, "fp32"}, {Precision::kBf16, "bf16"}, {Precision::kFp16, "fp16"}};

/// Which weights a trial's target is read on (AverageSpec::target_on).
enum class TargetOn { kRaw, kAveraged };
inline constexpr config::EnumName<optim::AverageType> kAverageTypes[] = {
    {optim::AverageType::kNone, "none"}, {optim::AverageType::kEma, "ema"}, {optim::AverageType::kLawa, "lawa"}};
inline constexpr config::EnumName<TargetOn> kTargetOns[] = {{TargetOn::kRaw, "raw"},
                                                            {TargetOn::kAveraged, "averaged"}};

std::string to_string(NoiseType type);
std::string to_string(Metric metric);
std::string to_string(DeviceType device);
std::string to_string(Precision precision);

struct NoiseSpec {
  NoiseType type = NoiseType::kNone;
  double eta = 0.01;          ///< annealed: a variance
  double gamma = 0.55;        ///< annealed
  std::int64_t base_batch = 0;  ///< multiplicative: M0
};

struct TargetSpec {
  Metric metric = Metric::kValError;  ///< val_error (classification), val_loss
  double threshold = 0;               ///< reached when metric <= threshold
  std::int64_t eval_every = 50;       ///< steps between evaluations
};

struct BudgetSpec {
  double length = 1000;
  schedules::Unit unit = schedules::Unit::kSteps;
};

struct GnsSpec {
  std::int64_t micro_batches = 0;  ///< >= 2 measures the noise scale; 0 off
  double beta = 0.99;
};

/// "distributed": how the ranks of a data-parallel trial exchange their
/// gradients (distributed/compression.h) and shard the optimizer's state. Left out of resolved configs when
/// it is the default (fp32 all-reduce in 25 MiB buckets after backward), so that folders
/// written before it existed keep their identity.
struct DistributedSpec {
  /// "compression": {"name": ..., its parameters}; bucket_bytes comes from
  /// bucket_mb, overlap from "overlap" and the seed from the trial's seed.
  distributed::CompressionSpec compression;
  double bucket_mb = 25;
  /// "shard": what each rank keeps of the optimizer (distributed/sharded.h):
  /// "none", "states" (ZeRO stage 1) or "gradients" (stage 2). Left out of
  /// resolved configs when "none".
  distributed::ShardStage shard = distributed::ShardStage::kNone;
  /// "sync": how often the ranks agree (distributed/local_sgd.h):
  /// {"type": "every_step"} (synchronous, the default, left out of resolved
  /// configs), or "local_sgd" / "diloco" with "every" (H), "fragments" (P)
  /// and, for diloco, "outer" {"lr", "momentum", "nesterov"} (its compressor
  /// is "compression", applied to the pseudo-gradients); or "delayed" with
  /// "tau", "draw", "staleness_aware" (asynchronous SGD's stale gradients in
  /// one process, distributed/delayed.h: `delay`).
  distributed::LocalSgdSpec sync = every_step();
  distributed::DelaySpec delay;
  /// The default "sync": the gradients averaged every step.
  static distributed::LocalSgdSpec every_step() {
    distributed::LocalSgdSpec s;
    s.type = distributed::SyncType::kEveryStep;
    return s;
  }
  bool synchronous() const { return sync.type == distributed::SyncType::kEveryStep; }
  bool delayed() const { return sync.type == distributed::SyncType::kDelayed; }
  bool is_default() const;
};

/// "average": a copy of the weights averaged over the run
/// (optimizers/weight_average.h), evaluated at each evaluation beside the
/// trained ones (metrics.csv's avg_val_loss, avg_val_error). Left out of
/// resolved configs when off, so that folders written before it existed
/// keep their identity.
struct AverageSpec {
  optim::AverageOptions options;
  /// "raw": steps to target are read on the trained weights' metric;
  /// "averaged": on the averaged weights' (Zhang et al. 2024's measurement).
  TargetOn target_on = TargetOn::kRaw;
  bool on() const { return options.type != optim::AverageType::kNone; }
};

/// How a trial's batches are fetched (loader.h), not what they hold: the
/// batches are the same whatever these are.
struct LoaderSpec {
  /// Background threads fetching (decoding, augmenting) batches ahead of the
  /// step; 0: fetched in the step itself; -1 (auto): 1 when the training
  /// data says fetching is costly (Examples::costly), else 0.
  std::int64_t threads = -1;
  std::int64_t prefetch = 2;  ///< batches fetched ahead of the step (with threads > 0)
};

/// One training run: everything fixed.
struct TrialConfig {
  std::string sweep;  ///< the sweep's name
  std::string name;   ///< the trial's folder name
  WorkloadPart data = dataset_part(DataSpec{});   ///< "dataset"
  WorkloadPart model = model_part(ModelSpec{});  ///< "model"
  /// "optimizer": its name and keys, resolved by its entry (optim/optimizer.h)
  OptimizerSpec optimizer = resolve_optimizer("lamb");
  schedules::ScheduleSpec schedule;  ///< base_lr is the trial's rate
  NoiseSpec noise;
  TargetSpec target;
  BudgetSpec budget;
  GnsSpec gns;
  DistributedSpec distributed;
  AverageSpec average;
  /// "horizons": shorter training lengths (the budget's unit, increasing,
  /// each below the budget) at which the same run with its decay ending
  /// there is measured too, each branched from this run where their
  /// schedules part (horizon_trial; docs/experiments.md "Horizons"). Empty:
  /// none. Left out of resolved configs when empty.
  std::vector<double> horizons;
  std::int64_t batch_size = 0;
  std::uint64_t seed = 0;
  DeviceType device = DeviceType::kCpu;  ///< cuda: each rank its cuda:LOCAL_RANK
  /// Left out of resolved configs when fp32, so that folders written before
  /// it existed keep their identity.
  Precision precision = Precision::kFp32;
  std::int64_t checkpoint_every = 0;  ///< steps between checkpoints (a multiple of target.eval_every); 0 off
  bool tensorboard = true;  ///< write a TensorBoard event file in the trial's folder (not part of its identity)
  LoaderSpec loader;  ///< the sweep's runner.loader_*: not written in the trial's config.json
};

/// The nuisance-parameter search run at every batch size.
struct SearchSpec {
  std::vector<double> lr;              ///< a list of base rates, or:
  double lr_min = 0, lr_max = 0;       ///< a log-uniform quasi-random search
  std::int64_t trials = 0;             ///< over [lr_min, lr_max] with this many points
  /// optional list (crossed with lr): the optimizer's "momentum" key,
  /// refused for an optimizer without one
  std::vector<double> momentum;
  double momentum_min = 0, momentum_max = 0;  ///< optional: 1 - momentum log-uniform, drawn with lr
};

/// How the runner goes about a sweep, not what it computes: left out of the
/// sweep's identity, like "tensorboard".
struct RunnerSpec {
  bool prune = true;  ///< stop a trial once it cannot change the steps-to-target table (trial_queue.h)
  /// Train trials that differ only in rate and momentum as one stacked model
  /// (batched.h). Unset: on for a CUDA sweep (2.6x faster on an H100), off
  /// on CPUs (no faster there); docs/experiments.md "Batched trials".
  std::optional<bool> batch_trials;
  LoaderSpec loader;  ///< "loader_threads", "prefetch"
  /// Intra-op threads of each trial (each rank of a data-parallel one). The
  /// thread count orders floating-point sums, so results depend on it; it is
  /// part of a sweep's identity, and --jobs runs that many trials side by side
  /// without changing it (docs/experiments.md "Threads and reproducibility").
  std::int64_t threads_per_trial = 1;
};

struct SweepConfig {
  TrialConfig base;  ///< everything but batch size, rate, momentum, seed, name
  std::vector<std::int64_t> batch_sizes;
  SearchSpec search;
  std::vector<std::uint64_t> seeds{0};
  RunnerSpec runner;
};

/// Horizon k's trial (k < trial.horizons.size()): the same trial with its
/// budget trial.horizons[k] and its decay ending there (a wsd decay keeps
/// its cooldown's fraction of the run; cosine, linear and polynomial decays
/// end at the horizon), without horizons of its own, named
/// "<trial>/horizon_<k+1>".
TrialConfig horizon_trial(const TrialConfig& trial, std::size_t k);

/// Parses a sweep config. Throws ConfigError "<key>: <problem>".
SweepConfig parse_sweep(const nlohmann::json& j);

/// A config file may hold one sweep, or a base sweep and "variants": an
/// object mapping variant names to JSON merge patches (RFC 7386) of the base.
/// Each variant is a sweep of its own, named after the variant and written to
/// <out>/<name>/<variant>/. `folder` is the part of the path below <out>.
struct NamedSweep {
  std::string folder;
  SweepConfig sweep;
};
std::vector<NamedSweep> parse_sweeps(const nlohmann::json& j);
std::vector<NamedSweep> load_sweeps(const std::string& path);
/// The JSON of a config file; ConfigError naming the file when it is missing
/// or not JSON.
nlohmann::json read_config(const std::string& path);

/// Every trial of the sweep: batch sizes x search points x seeds, in that order.
std::vector<TrialConfig> expand(const SweepConfig& sweep);

/// A rate the search added at one batch size beyond the edge of its rates
/// (bigbatch sweep --extend-search), kept in the sweep folder's
/// extensions.json. momentum: the trial's, when the search sets it.
struct ExtraPoint {
  std::int64_t batch_size = 0;
  double lr = 0;
  std::optional<double> momentum;
};
/// expand(sweep), then a trial per extra point and seed, named
/// b<batch>_x<k>_s<seed> (k counts the points of that batch size), in order.
std::vector<TrialConfig> expand(const SweepConfig& sweep, const std::vector<ExtraPoint>& extra);

/// The resolved configs, every default written out (sweep.json, config.json).
nlohmann::json to_json(const SweepConfig& sweep);
nlohmann::json to_json(const TrialConfig& trial);

/// A resolved config (sweep.json, config.json) without the keys that change
/// how a run is recorded or scheduled but not what it computes ("tensorboard",
/// "runner" but for its threads_per_trial): what a resumed sweep compares, so
/// that turning a log on or off redoes nothing. A folder written before
/// threads_per_trial existed compares without it; each "optimizer" object is
/// compared as its entry resolves it today (normalized_optimizer()), so that
/// folders written before each optimizer owned its keys resume.
nlohmann::json identity(nlohmann::json resolved);
/// Where two resolved configs first differ in identity(): the JSON pointer
/// of the first change; nullopt when they are the same.
std::optional<std::string> identity_difference(const nlohmann::json& existing, const nlohmann::json& resolved);

/// Why this LibTorch cannot train `precision` on `device` ("" when it can):
/// fp16 on the CPU needs LibTorch 2.5 or later (1.13's CPU autocast takes bf16 alone).
std::string precision_refusal(Precision precision, DeviceType device);

/// A name that can be a folder: [A-Za-z0-9._-]+, not "." or "..". Throws
/// ConfigError naming `what` otherwise.
void check_name(const std::string& name, const std::string& what);

// ------------------------------------------------------------ cbs configs --

/// How far a branch's loss may be above a smaller branch's: loss_b <=
/// loss_a + value (absolute, the paper's 0.01) or loss_a * (1 + value).
struct CbsTolerance {
  bool relative = false;
  double value = 0.01;
};

struct CbsSpec {
  std::int64_t reference_batch = 0;
  double reference_lr = 0;  ///< the rate at reference_batch; branches scale it by schedule.scaling
  /// Examples the reference has seen at each checkpoint (multiples of
  /// reference_batch, increasing; 0 is the initialization).
  std::vector<std::int64_t> checkpoints;
  std::vector<std::int64_t> branch_batches;  ///< increasing, including reference_batch
  std::int64_t window = 0;                   ///< examples each branch trains (a multiple of every branch batch)
  CbsTolerance tolerance;
  /// The branch rate rule: the scaled rate times each factor; a branch's loss
  /// is its best factor's (mean over seeds). {1}: the scaling rule alone.
  std::vector<double> lr_factors{1.0};
};

/// A cbs config: a sweep config's workload (dataset, model, optimizer,
/// schedule, noise, gns, target and budget for --compare, seeds, device)
/// without batch_sizes and search, plus "cbs". `sweep.batch_sizes` holds the
/// branch batches (checked against the data like a sweep's) and
/// `sweep.search.lr` the reference rate.
struct CbsConfig {
  SweepConfig sweep;
  CbsSpec cbs;
};

/// Parses a cbs config; ConfigError "<key>: <problem>" (exit 2 in the CLI).
CbsConfig parse_cbs(const nlohmann::json& j);
CbsConfig load_cbs(const std::string& path);
/// The resolved config (cbs.json): every default written out, the
/// checkpoints as a list.
nlohmann::json to_json(const CbsConfig& config);

}  // namespace bigbatch::experiments
