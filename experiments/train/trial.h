// The training loop: one trial, or a batched group of trials (lanes) that
// share everything but their rate and momentum, each trained until it
// reaches the target (reached), runs out of budget (not reached), turns
// non-finite (diverged) or is stopped by the sweep (pruned). One loop serves
// both: a single trial is a run of one lane. What differs, how the lanes'
// gradients and evaluations are computed, sits behind LaneModel
// (lane_model.h): one model, data-parallel or not, or a stacked model whose
// layers carry a lane dimension (batched.h).
#pragma once

#include "../runconfig/config.h"
#include "../workload/data.h"
#include "../workload/workload.h"
#include "../../distributed/compression.h"
#include "../../distributed/process_group.h"
#include "../../noise/gradient_noise.h"
#include "../../noise/noise_scale.h"
#include "../../schedules/lr_adapter.h"

#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace bigbatch::experiments {

/// A value not measured (a regression's error, the noise scale before its
/// first measurement): an empty cell in metrics.csv, null in JSON.
inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

/// One evaluation: a row of metrics.csv.
struct EvalRow {
  std::int64_t step = 0;        ///< optimizer steps taken
  double epoch = 0;             ///< examples / training-set size
  std::int64_t examples = 0;
  double train_loss = 0;        ///< mean training loss since the last evaluation
  double val_loss = 0;
  double val_error = 0;         ///< 1 - accuracy (NaN for regression)
  double lr = 0;                ///< the rate of the last step (first group)
  std::int64_t batch_size = 0;
  double wall_time = 0;         ///< seconds since the trial started
  double gns = 0;               ///< B_simple so far (NaN when not measured)
  /// A data-parallel trial's gradient exchange so far, on rank 0 (NaN
  /// without one): bytes this rank sent and received (ring counts,
  /// distributed/compression.h), seconds compressing and communicating.
  double bytes_sent = kNaN;
  double bytes_received = kNaN;
  double compress_seconds = kNaN;
  double comm_seconds = kNaN;
  /// The synchronizations so far (data-parallel: every step; local SGD and
  /// DiLoCo: the rounds after which one or more fragments were averaged),
  /// and the norm of the last outer step (local SGD, DiLoCo); NaN without.
  double syncs = kNaN;
  double outer_norm = kNaN;
  /// An fp16 trial's loss scale after its last step, and the steps its
  /// scaler skipped so far for inf or NaN gradients (NaN for the others:
  /// fp32 and bf16 trials scale nothing).
  double loss_scale = kNaN;
  double skipped_steps = kNaN;
  /// A trial whose optimizer is sharded across the ranks (distributed.shard):
  /// the largest rank's optimizer-state bytes and peak resident memory so
  /// far (summary.json's "shard" has each rank's); NaN for the others.
  double state_bytes = kNaN;
  double peak_rss_bytes = kNaN;
  /// A trial with "average": the validation loss and error of its averaged
  /// weights (NaN for the others, and before there is an average).
  double avg_val_loss = kNaN;
  double avg_val_error = kNaN;
  /// The workload's further validation metrics (WorkloadData::metrics, in
  /// its order): metrics.csv's columns after the fields below.
  std::vector<double> extra;
};

/// One evaluation of a lane on the validation split: the mean loss, the
/// fraction misclassified (NaN for regression), and the workload's further
/// metrics (WorkloadData::metrics, in its order).
struct ValidationMetrics {
  double loss = 0;
  double error = 0;
  std::vector<double> extra;
};

/// EvalRow's one field list: visit(name, member) for each field in column
/// order (the workload's own metrics, `extra`, follow them). metrics.csv and the checkpoint both read it, so a new field is
/// written, saved and restored by adding it here.
template <typename Row, typename Visit>
void for_each_field(Row&& row, Visit&& visit) {
  visit("step", row.step);
  visit("epoch", row.epoch);
  visit("examples", row.examples);
  visit("train_loss", row.train_loss);
  visit("val_loss", row.val_loss);
  visit("val_error", row.val_error);
  visit("lr", row.lr);
  visit("batch_size", row.batch_size);
  visit("wall_time", row.wall_time);
  visit("gns", row.gns);
  visit("bytes_sent", row.bytes_sent);
  visit("bytes_received", row.bytes_received);
  visit("compress_seconds", row.compress_seconds);
  visit("comm_seconds", row.comm_seconds);
  visit("syncs", row.syncs);
  visit("outer_norm", row.outer_norm);
  visit("loss_scale", row.loss_scale);
  visit("skipped_steps", row.skipped_steps);
  visit("state_bytes", row.state_bytes);
  visit("peak_rss_bytes", row.peak_rss_bytes);
  visit("avg_val_loss", row.avg_val_loss);
  visit("avg_val_error", row.avg_val_error);
}

/// What a trial's target is read on at an evaluation: target.metric of the
/// trained weights, or of the averaged ones (average.target_on "averaged";
/// NaN before there is an average: never reached).
inline double target_metric(const TrialConfig& t, const EvalRow& row) {
  const bool averaged = t.average.on() && t.average.target_on == TargetOn::kAveraged;
  if (t.target.metric == Metric::kValError) return averaged ? row.avg_val_error : row.val_error;
  return averaged ? row.avg_val_loss : row.val_loss;
}

/// kFailed: the workload (its data, model or loss) threw during the run;
/// TrialResult::error says what, and a resumed sweep runs it again.
/// kPruned: stopped by the sweep once a sibling (same batch size) had reached
/// the target at a step this trial could no longer beat (trial_queue.h).
enum class TrialStatus { kReached, kNotReached, kDiverged, kPruned, kFailed };
inline constexpr config::EnumName<TrialStatus> kTrialStatuses[] = {
    {TrialStatus::kReached, "reached"}, {TrialStatus::kNotReached, "not_reached"},
    {TrialStatus::kDiverged, "diverged"}, {TrialStatus::kPruned, "pruned"}, {TrialStatus::kFailed, "failed"}};
std::string to_string(TrialStatus status);

struct TrialResult {
  TrialStatus status = TrialStatus::kNotReached;
  std::optional<std::int64_t> steps_to_target;
  std::optional<std::int64_t> examples_to_target;
  std::int64_t steps = 0;    ///< steps run
  std::int64_t budget = 0;   ///< steps allowed
  double best_metric = 0;    ///< lowest target metric seen
  double peak_lr = 0;        ///< the scaled rate after warmup
  double wall_time = 0;
  std::vector<EvalRow> rows;
  std::string error;  ///< kFailed: the message the workload threw
  /// The data pipeline (loader.h): its background threads, and the fraction
  /// of the steps' time they spent waiting for their batch (with 0
  /// threads: fetching it), over this run (since the last resume); NaN
  /// before a step.
  int loader_threads = 0;
  double data_wait_fraction = kNaN;
  nlohmann::json data_report;  ///< WorkloadData::report's, when it has one
  /// A data-parallel trial's exchange: summary.json's "exchange" (trial.cpp's
  /// exchange_report: the compressor, the synchronization, bytes sent and
  /// received by rank 0 in all and per synchronization, what fp32 all-reduce
  /// would have sent, seconds compressing and communicating, and the bytes
  /// and synchronizations to reach the target, null when it was not reached).
  nlohmann::json exchange;
  /// A trial whose optimizer is sharded across the ranks (distributed.shard):
  /// summary.json's "shard" (the stage, each rank's optimizer-state bytes,
  /// gradient bytes and peak resident memory, the bytes a step exchanges).
  nlohmann::json shard;
  /// A trial with distributed.sync "delayed": summary.json's "staleness"
  /// (tau, draw, staleness_aware, the steps, each staleness's count
  /// (histogram[k]: the steps whose gradient was k steps old) and their mean).
  nlohmann::json staleness;
};

/// The loader threads (loader.h) a trial of `data` runs with: spec.threads,
/// or for -1 (auto) 1 when fetching its training batches is costly, else 0.
int loader_threads(const LoaderSpec& spec, const WorkloadData& data);

/// What a progress line shows.
struct TrialProgress {
  std::int64_t step, budget;
  double loss, steps_per_second;
};

/// What Trainer::Hooks::interrupt asks of a run.
enum class Interrupt {
  kNone,        ///< go on
  kCheckpoint,  ///< stop now, after on_checkpoint (one trial) whatever checkpoint_every: preemption
  kAbandon,     ///< stop now, writing nothing more: the trial is no longer this worker's
};

/// Thrown by Trainer::run when Hooks::interrupt stops it: the trial did not
/// end and has no result; rerun, it resumes from its last checkpoint.
struct TrialInterrupted : std::runtime_error {
  explicit TrialInterrupted(Interrupt how)
      : std::runtime_error(how == Interrupt::kAbandon ? "trial abandoned" : "trial interrupted"), how(how) {}
  Interrupt how;
};

class LaneModel;
class BatchLoader;
struct StepBatch;

/// The training loop. The constructor builds the model (seeded by the
/// trials' seed), and for each lane its optimizer, schedule adapter and noise.
///
/// One trial, data-parallel with a process group: config.batch_size is the
/// global batch (the scaling rules see it); every rank draws the same global
/// batch from the shared shuffle and trains on its 1/world share; rank 0's
/// initial weights are broadcast; gradients are averaged with bucketed
/// all-reduce, and the per-rank and averaged gradient norms give the noise
/// scale (micro-batches are then not needed). Rank 0 evaluates and
/// broadcasts the result, so every rank stops at the same step. BatchNorm
/// and ghost batch norm see each rank's share only.
///
/// A batched group (batched.h): K trials, batchable_together pairwise, see
/// the same batches and train as one stacked model, one matrix product
/// serving all K. Each lane keeps its own optimizer (over views of its
/// slices, named as in the unbatched model), schedule, noise scale,
/// evaluations and outcome; a lane that ends leaves the group (its slice is
/// frozen). Nothing downstream can tell a lane from the same trial run alone
/// but its speed and fp32 rounding (docs/experiments.md "Batched trials").
///
/// config.device cuda trains on the GPU (cuda:LOCAL_RANK under a process
/// group, cuda:0 for a group of lanes): the model lives there, the data
/// stays on the CPU and each batch is copied over.
class Trainer {
 public:
  /// One trial.
  Trainer(const TrialConfig& config, const WorkloadData& data, distributed::ProcessGroup* group = nullptr);
  /// A batched group of trials, one lane each, in this order.
  Trainer(const std::vector<TrialConfig>& lanes, const WorkloadData& data);
  ~Trainer();

  /// What run() reports and asks, lane by lane (every hook may be empty).
  struct Hooks {
    /// Progress of the run: the step and the first active lane's loss.
    std::function<void(const TrialProgress&)> progress;
    /// Each evaluation's row, as it is made (before a checkpoint).
    std::function<void(std::size_t lane, const EvalRow&)> on_eval;
    /// Asked before every step, for each active lane, with the step of its
    /// next evaluation; true ends that lane there as kPruned (under a
    /// process group every rank must answer alike).
    std::function<bool(std::size_t lane, std::int64_t next_eval)> prune;
    /// A lane's result, as soon as it ends.
    std::function<void(std::size_t lane, const TrialResult&)> finished;
    /// With config.checkpoint_every > 0 (one trial only): checkpoint() after
    /// each evaluation at a multiple of it that does not end the run; and
    /// when interrupt asks for kCheckpoint.
    std::function<void(const std::string&)> on_checkpoint;
    /// Asked before every step: anything but kNone ends run() there by
    /// throwing TrialInterrupted, no lane's result reported (a sweep's
    /// preemption signal, a claim taken over: sweep.h).
    std::function<Interrupt()> interrupt;
    /// Called before every step with the steps taken so far (after
    /// interrupt): where a trial with horizons branches (trial_folder.h).
    std::function<void(std::int64_t step)> before_step;
    /// Train every lane to its budget even once it reaches the target: the
    /// result keeps the first step that reached it (kReached), and the
    /// evaluations go on to the end (a trial with horizons, whose final
    /// metrics are its measurement).
    bool past_target = false;
  };
  /// Runs every lane to the target, its budget, divergence or pruning (from
  /// where restore() left it); each lane's result, in lane order.
  std::vector<TrialResult> run(const Hooks& hooks);
  std::vector<TrialResult> run();  ///< run({}) (an overload: Hooks' member initializers)

  /// One optimizer step of every active lane at the schedule's batch size;
  /// each lane's batch loss (NaN for a lane that has ended).
  std::vector<double> train_step();
  /// Each lane's validation metrics, with the model in eval mode.
  std::vector<ValidationMetrics> evaluate();
  /// The names of the workload's further metrics (EvalRow::extra), without
  /// the "val_" that metrics.csv puts before them.
  std::vector<std::string> metric_names() const;

  std::size_t lanes() const { return lanes_.size(); }
  /// Lane `lane`'s parameters under the unbatched model's names ("1.weight"):
  /// the model itself for one trial, views into the stacked model for a group.
  torch::nn::Module& module(std::size_t lane = 0);
  torch::optim::Optimizer& optimizer(std::size_t lane = 0);
  /// The unbatched model of a single trial (not of a group) when it is a
  /// torch::nn::Sequential (the built-in models are); module() otherwise.
  torch::nn::Sequential& model();

  /// The per-layer scalars of lane `lane`'s optimizer in the last step, as
  /// (TensorBoard tag, value), by the model's parameter names: "trust_ratio/0.weight"
  /// for each parameter a layer-wise optimizer adapted (LARS's and LAMB's
  /// ratio, LARC's clipped scale), "muon_update_rms/0.weight" for each matrix
  /// Muon orthogonalized (the RMS of its update). Empty for SGD, Adam, AdamW,
  /// NovoGrad, Lion and before the first step.
  std::vector<std::pair<std::string, double>> layer_scalars(std::size_t lane = 0) const;

  /// The whole state of a one-trial run between two steps, as the bytes of a
  /// torch archive with named keys (checkpoint.cpp): model, optimizer, step,
  /// sampler, noise-scale averages, and the evaluations so far (one column
  /// per EvalRow field), after the line "bigbatch checkpoint" and framed
  /// with its length and CRC32C (records.h). Deterministic noise needs no
  /// state (seed, step).
  std::string checkpoint() const;
  /// Continues from checkpoint() bytes of a trainer made with the same config:
  /// the run then goes on exactly as it would have without the interruption.
  /// Throws c10::Error on bytes cut short, damaged (checked before LibTorch
  /// reads them), or of another format.
  void restore(const std::string& bytes);
  /// Starts this trainer as a branch of another run (bigbatch cbs) from that
  /// run's checkpoint() bytes: its weights, optimizer state, data order and
  /// examples seen, under this trainer's own config (batch size, rate,
  /// budget) from step 0, with no evaluations yet. Same checks as restore().
  void branch_from(const std::string& bytes);
  /// B_simple of lane `lane`'s steps so far (NaN before the first measurement).
  double b_simple(std::size_t lane = 0) const;

  /// The fraction of the steps' time since run() began (or since the first
  /// step) spent waiting for the data (TrialResult::data_wait_fraction).
  double data_wait_fraction() const;

  std::int64_t step() const { return step_; }
  const at::Device& device() const { return device_; }
  std::int64_t budget_steps() const { return budget_; }

 private:
  struct Lane;
  // The lanes' own parts, built over model_'s lane modules.
  void add_lanes(const std::vector<TrialConfig>& configs);
  /// Replaces a lane's optimizer by its sharded form across the group's ranks
  /// (distributed.shard), and at stage "gradients" makes the model average
  /// its gradients by the optimizer's reduce-scatter.
  void shard_lane(Lane& lane);
  /// Local SGD, DiLoCo: the synchronizations due after this step's inner
  /// step, and the loss the ranks agree on (NaN on every rank once any rank's
  /// was not finite, known at the next synchronization or evaluation; until
  /// then this rank's last finite one). `loss` is this rank's.
  double synchronize(Lane& lane, double loss);
  // A lane's result as it ends: status, steps, best metric, rows, time.
  void leave(std::size_t lane, TrialStatus status, double seconds, const Hooks& hooks);
  // An evaluation of every active lane: its row, and the stop rules (the
  // target, a non-finite validation loss).
  void evaluate_lanes(const Hooks& hooks, const std::function<double()>& seconds);
  bool any_active() const;
  // The weights, optimizer state, sampler and examples of a checkpoint.
  void load_run(torch::serialize::InputArchive& archive);
  void check_one_lane(const char* what) const;
  // Draws this step's batch (b.index, of b.size) and returns its examples
  // (the rank's share) through the loader, the next batches asked for ahead.
  Batch fetch(StepBatch& b);
  // A rank's share of the rows of a global batch (its indices, its noise
  // weights): all of them without a group.
  at::Tensor share(const at::Tensor& rows) const;

  const WorkloadData& data_;
  distributed::ProcessGroup* group_;
  at::Device device_;
  std::unique_ptr<LaneModel> model_;
  std::vector<std::unique_ptr<Lane>> lanes_;
  BatchSampler sampler_;
  std::unique_ptr<BatchLoader> loader_;
  std::int64_t prefetch_ = 0;
  std::optional<BatchSampler> ahead_;  // the sampler's copy that asks for the next batches
  std::int64_t ahead_step_ = 0;        // the step ahead_'s next batch is for
  double step_seconds_ = 0;            // train_step's time in this run, and of it
  double wait_base_ = 0;               // (the loader's waited() at this run's start)
  std::int64_t step_ = 0;
  std::int64_t examples_ = 0;
  std::int64_t budget_ = 0;
  double elapsed_ = 0;  // seconds of earlier runs of this trial (restore)
};

}  // namespace bigbatch::experiments
