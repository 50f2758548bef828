// One trial of a sweep: trains a model with an optimizer, schedule, noise and
// batch size, evaluates every eval_every steps, and stops at the target
// (reached), at the budget (not reached) or at a non-finite loss (diverged).
#pragma once

#include <bigbatch/experiments/config.h>
#include <bigbatch/experiments/data.h>
#include <bigbatch/distributed/process_group.h>
#include <bigbatch/noise/gradient_noise.h>
#include <bigbatch/noise/noise_scale.h>
#include <bigbatch/schedules/lr_adapter.h>

#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/optimizer.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace bigbatch::experiments {

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
};

/// EvalRow's one field list: visit(name, member) for each field in column
/// order. metrics.csv and the checkpoint both read it, so a new field is
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
}

/// kPruned: stopped by the sweep once a sibling (same batch size) had reached
/// the target at a step this trial could no longer beat (sweep.h).
enum class TrialStatus { kReached, kNotReached, kDiverged, kPruned };
inline constexpr schedules::EnumName<TrialStatus> kTrialStatuses[] = {
    {TrialStatus::kReached, "reached"}, {TrialStatus::kNotReached, "not_reached"},
    {TrialStatus::kDiverged, "diverged"}, {TrialStatus::kPruned, "pruned"}};
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
};

/// The trust ratio of each parameter of `model` that the layer-wise
/// `optimizer` adapts (Trainer::trust_ratios), by its name in `model`.
std::vector<std::pair<std::string, double>> trust_ratios(const torch::optim::Optimizer& optimizer,
                                                        const torch::nn::Module& model);

/// Model initialization draws from LibTorch's global generator: a trainer
/// seeds and builds under this lock, so parallel trials stay reproducible.
std::mutex& model_init_mutex();

/// What a progress line shows.
struct TrialProgress {
  std::int64_t step, budget;
  double loss, steps_per_second;
};

/// The training loop. The constructor builds the model (seeded by the
/// trial's seed), the optimizer, the schedule adapter and the noise.
///
/// Data-parallel with a process group: config.batch_size is the global batch
/// (the scaling rules see it); every rank draws the same global batch from the
/// shared shuffle and trains on its 1/world share; rank 0's initial weights are
/// broadcast; gradients are averaged with bucketed all-reduce, and the per-rank
/// and averaged gradient norms give the noise scale (micro-batches are then not
/// needed). Rank 0 evaluates and broadcasts the result, so every rank stops at
/// the same step. BatchNorm and ghost batch norm see each rank's share only.
///
/// config.device cuda trains on the GPU (cuda:LOCAL_RANK under a process
/// group): the model lives there, the data stays on the CPU and each batch is
/// copied over.
class Trainer {
 public:
  Trainer(const TrialConfig& config, const Dataset& data, distributed::ProcessGroup* group = nullptr);

  /// One optimizer step at the schedule's batch size; returns the batch loss.
  double train_step();
  /// Validation loss and error with the model in eval mode.
  std::pair<double, double> evaluate();
  /// Runs to the target, the budget or divergence (from where restore() left
  /// it). With config.checkpoint_every > 0, on_checkpoint gets checkpoint()
  /// after each evaluation at a multiple of it that does not end the trial.
  /// on_eval sees each evaluation's row as it is made (before a checkpoint).
  /// prune is asked before every step with the step of the next evaluation;
  /// true ends the run there as kPruned (every rank must answer alike).
  TrialResult run(const std::function<void(const TrialProgress&)>& progress = {},
                  const std::function<void(const std::string&)>& on_checkpoint = {},
                  const std::function<void(const EvalRow&)>& on_eval = {},
                  const std::function<bool(std::int64_t)>& prune = {});

  /// The trust ratio of each parameter the layer-wise optimizer adapts, by the
  /// model's parameter names ("0.weight"): LARS's and LAMB's ratio, LARC's
  /// clipped scale. Recomputed from the weights, gradients and optimizer state
  /// as the last step left them, so it is that step's ratio up to the change
  /// that step made to the weight norm. Empty for SGD, Adam, AdamW, NovoGrad
  /// and before the first step.
  std::vector<std::pair<std::string, double>> trust_ratios() const;

  /// The whole state of the run between two steps, as the bytes of a torch
  /// archive with named keys: model, optimizer, step, sampler, noise-scale
  /// averages, and the evaluations so far (one column per EvalRow field),
  /// after the line "bigbatch checkpoint" and framed with its length and
  /// CRC32C (a TFRecord, tensorboard.h).
  /// Deterministic noise needs no state (seed, step).
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
  /// B_simple of the steps so far (NaN before the first measurement).
  double b_simple() const;

  torch::nn::Sequential& model() { return model_; }
  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  std::int64_t step() const { return step_; }
  const at::Device& device() const { return device_; }
  std::int64_t budget_steps() const { return budget_; }

 private:
  // This step's examples on this rank: inputs, targets, the multiplicative
  // noise's weights (undefined without it), the global and the local size.
  struct Batch {
    at::Tensor x, y, weights;
    std::int64_t global = 0, local = 0;
  };
  at::Tensor batch_loss(const at::Tensor& x, const at::Tensor& y, const at::Tensor& weights);
  // The three ways to the step's gradient; each leaves it in .grad and returns the loss.
  double gradients_whole(const Batch& b);
  double gradients_data_parallel(const Batch& b);
  double gradients_in_micro_batches(const Batch& b);
  std::pair<double, double> evaluate_local();
  // The weights, optimizer state, sampler and examples of a checkpoint.
  void load_run(torch::serialize::InputArchive& archive);

  TrialConfig config_;
  const Dataset& data_;
  distributed::ProcessGroup* group_;
  at::Device device_;
  torch::nn::Sequential model_{nullptr};
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::optional<schedules::LRAdapter> adapter_;
  BatchSampler sampler_;
  std::optional<noise::AnnealedGradientNoise> annealed_;
  std::optional<noise::MultiplicativeNoise> multiplicative_;
  noise::GradientNoiseScale gns_;
  std::vector<at::Tensor> params_;
  std::int64_t step_ = 0;
  std::int64_t examples_ = 0;
  std::int64_t budget_ = 0;
  double last_lr_ = 0;
  std::vector<EvalRow> rows_;  // evaluations so far
  double best_metric_;         // the lowest target metric so far
  double elapsed_ = 0;         // seconds of earlier runs of this trial
};

}  // namespace bigbatch::experiments
