// Batched trials: K trials that differ only in their rate and momentum, at
// the same batch size and seed, see the same batches; they train as one
// stacked model whose layers carry a leading trial ("lane") dimension, so one
// matrix product serves all K. Each lane keeps its own optimizer (over views
// of its slices, named as in the unbatched model), schedule, noise scale,
// evaluations and outcome; the loss is the sum of the active lanes' mean
// losses, so no lane's gradient sees another's. A lane that reaches the
// target, is pruned or diverges leaves (its slice is frozen); nothing
// downstream can tell a lane from an unbatched trial of the same config but
// its speed (and fp32 rounding: docs/experiments.md "Batched trials").
#pragma once

#include <bigbatch/experiments/trial.h>

#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace bigbatch::experiments {

/// Why `trial` cannot be trained in a batched group ("" when it can): no
/// gradient noise, no checkpoints, not data-parallel (the caller's business).
/// Every model batches; with device cuda the group trains on cuda:0.
std::string batch_refusal(const TrialConfig& trial);

/// Whether trials a and b can share a group: both batchable, and equal but
/// for their names, rates and momenta.
bool batchable_together(const TrialConfig& a, const TrialConfig& b);

/// The stacked model: the unbatched model's layers with a lane dimension.
class StackedModel;

/// Trains a group of trials (batchable_together pairwise) in lockstep.
class GroupTrainer {
 public:
  GroupTrainer(const std::vector<TrialConfig>& trials, const Dataset& data);
  ~GroupTrainer();

  struct Hooks {
    /// Lane `lane`'s evaluation row, as Trainer::run's on_eval.
    std::function<void(std::size_t lane, const EvalRow&)> on_eval;
    /// Asked before every step for each active lane with the step of its
    /// next evaluation; true ends that lane as kPruned.
    std::function<bool(std::size_t lane, std::int64_t next_eval)> prune;
    /// A lane's result, as soon as it leaves the group.
    std::function<void(std::size_t lane, const TrialResult&)> finished;
    /// Progress of the group (the first active lane's loss).
    std::function<void(const TrialProgress&)> progress;
  };
  /// Runs every lane to its end; returns their results in lane order.
  std::vector<TrialResult> run(const Hooks& hooks);

  /// One optimizer step of every active lane; the lanes' validation
  /// (loss, error) pairs with the model in eval mode. run() uses both.
  void train_step();
  std::vector<std::pair<double, double>> evaluate();

  std::size_t lanes() const;
  /// Lane `lane`'s parameters under the unbatched model's names ("1.weight"):
  /// views into the stacked model (trust ratios, tests).
  const torch::nn::Module& lane_module(std::size_t lane) const;
  torch::optim::Optimizer& lane_optimizer(std::size_t lane);

 private:
  struct Lane;

  const Dataset& data_;
  at::Device device_;
  std::unique_ptr<StackedModel> model_;
  std::vector<at::Tensor> stacked_;  // the stacked model's parameters, as its slots list them
  std::vector<std::unique_ptr<Lane>> lanes_;
  BatchSampler sampler_;
  std::int64_t step_ = 0, examples_ = 0, budget_ = 0;
};

}  // namespace bigbatch::experiments
