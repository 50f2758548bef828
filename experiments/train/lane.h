// One trial's own part of a training run (trial.h): what the loop keeps per
// lane beside the model's lane (lane_model.h). Internal to experiments/:
// trial.cpp runs it, checkpoint.cpp saves and restores it.
#pragma once

#include "trial.h"
#include "../optim/optimizer.h"
#include "../../distributed/delayed.h"
#include "../../distributed/local_sgd.h"
#include "../../distributed/sharded.h"
#include "../../optimizers/loss_scaler.h"
#include "../../optimizers/weight_average.h"

#include <limits>
#include <memory>
#include <optional>
#include <vector>

namespace bigbatch::experiments {

/// Its optimizer over its lane's parameters, schedule, noise, noise scale,
/// and evaluations so far.
struct Trainer::Lane {
  TrialConfig config;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  /// The optimizer when distributed.shard shards it across the ranks, else null.
  distributed::ShardedOptimizer* sharded = nullptr;
  /// Its last measure across the ranks (shard_report), taken at each evaluation.
  nlohmann::json shard_report;
  /// Its layer scalars gathered from every rank's shard (shard_scalars), taken
  /// at each evaluation: a rank holds only its own tensors' (Muon's update RMS).
  std::vector<LayerScalar> shard_scalars;
  /// distributed.sync local_sgd or diloco: the synchronizations of the
  /// lane's parameters (the model exchanges no gradients then), else null.
  std::unique_ptr<distributed::LocalSgd> local;
  /// A non-finite loss on this rank since the ranks last agreed on one
  /// (local steps: known to the others at the next synchronization or evaluation).
  bool local_nonfinite = false;
  /// distributed.sync delayed: the past parameters each step's gradient is
  /// taken at, and the staleness histogram, else null.
  std::unique_ptr<distributed::DelayedGradients> delayed;
  /// The synchronizations and bytes sent when the target was reached.
  std::optional<std::int64_t> syncs_to_target;
  std::optional<double> bytes_to_target;
  std::optional<schedules::LRAdapter> adapter;
  std::optional<noise::AnnealedGradientNoise> annealed;
  std::optional<noise::MultiplicativeNoise> multiplicative;
  noise::GradientNoiseScale gns;
  std::optional<optim::LossScaler> scaler;  // precision fp16
  std::optional<optim::WeightAverage> average;  // "average": over params, after each step
  std::vector<at::Tensor> params;
  bool active = true;
  double last_lr = 0;    // the rate of the last step (first group)
  double loss = 0;       // the last step's batch loss
  double loss_sum = 0;   // since the last evaluation
  std::int64_t losses = 0;
  double best_metric = std::numeric_limits<double>::infinity();
  std::vector<EvalRow> rows;
  TrialResult result;

  explicit Lane(const TrialConfig& c);
};

}  // namespace bigbatch::experiments
