// The model side of the training loop (trial.h): how a run's lanes get their
// gradients for a batch and their validation metrics. Two kinds: one
// unbatched model (a single trial; data-parallel with a process group;
// trial.cpp) and a stacked model whose layers carry a lane dimension (a
// batched group; batched.cpp). The loop itself, the lanes' optimizers,
// schedules, noise and outcomes, is written once in trial.cpp. Internal to
// experiments/.
#pragma once

#include "../workload/data.h"
#include "trial.h"
#include "../workload/workload.h"
#include "../../distributed/compression.h"
#include "../../distributed/process_group.h"

#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace bigbatch::experiments {

/// Rows of the validation set one forward pass of an evaluation takes.
inline constexpr std::int64_t kEvalChunk = 8192;
/// Training rows BatchNorm statistics are recomputed from at an optimizer's
/// point to evaluate (Schedule-Free), before each evaluation there.
inline constexpr std::int64_t kNormStatisticsRows = 2048;

/// One step's examples: their indices in the training set (the global batch:
/// every rank draws the same), and this rank's share of them (all of them
/// without a process group): the examples (augmented, on the CPU: the
/// loader's) and the multiplicative noise's per-example weights (undefined
/// without it).
struct StepBatch {
  at::Tensor index, weights;
  Batch rows;
  std::int64_t size = 0;
  /// What the loss is multiplied by before backward: an fp16 trial's loss
  /// scale (optim::LossScaler), 1 for the others. The gradients are left
  /// scaled; the losses and noise-scale norms returned are not.
  double loss_scale = 1;
};

/// The two gradient norms of one step that the noise scale is made of
/// (noise/noise_scale.h): |G|^2 at a small and at a big batch.
struct NoiseSample {
  double small_sq, big_sq;
  std::int64_t small_batch, big_batch;
};

/// What a lane's step measured: its batch loss, and when measured, the
/// norms of its noise scale.
struct LaneGradient {
  double loss = 0;
  std::optional<NoiseSample> noise;
};

/// The validation split's metrics for a model whose outputs carry `lanes`
/// leading lanes ([K, N, ...]; 0: one unbatched model, [N, ...]), in chunks
/// of kEvalChunk rows; grad off, the caller sets eval mode.
std::vector<ValidationMetrics> evaluate_split(const WorkloadData& data, const at::Device& device, std::int64_t lanes,
                                        const std::function<at::Tensor(const at::Tensor&)>& forward);

class LaneModel {
 public:
  virtual ~LaneModel() = default;

  std::size_t lanes() const { return lanes_; }
  /// Lane k's parameters under the unbatched model's names.
  virtual torch::nn::Module& lane(std::size_t k) = 0;
  /// The unbatched model of a single trial; nullptr for a stacked one.
  virtual torch::nn::Sequential* sequential() { return nullptr; }
  /// Whether this is a single trial's model (not a stacked group's, even of one lane).
  virtual bool single() const { return false; }
  /// A data-parallel trial's gradient exchange (its compressor and counts); null otherwise.
  virtual distributed::GradientExchange* exchange() { return nullptr; }
  /// From now on a data-parallel step averages its gradients by `reduce`
  /// rather than by its exchange (a ShardedOptimizer at stage "gradients"
  /// reduce-scatters them); a model without ranks ignores it.
  virtual void reduce_gradients_with(std::function<distributed::GradientNorms()> reduce) { (void)reduce; }
  const distributed::GradientExchange* exchange() const { return const_cast<LaneModel*>(this)->exchange(); }
  /// From now on each rank steps on its own share's gradient, exchanging
  /// none (local SGD, DiLoCo: distributed/local_sgd.h synchronizes the
  /// parameters instead); exchange() becomes null. A model without ranks ignores it.
  virtual void local_steps() {}

  /// Leaves in each active lane's parameters' .grad its mean gradient over
  /// `batch` (the sum over the examples of a weighted batch) and returns
  /// every lane's measurement (an ended lane's: whatever the pass computed).
  /// micro_batches >= 2: the noise scale from that split (one process);
  /// data-parallel: from the ranks' gradients.
  virtual std::vector<LaneGradient> gradients(const StepBatch& batch, const std::vector<bool>& active,
                                              std::int64_t micro_batches) = 0;

  /// Each lane's validation metrics in eval mode.
  virtual std::vector<ValidationMetrics> evaluate() = 0;

  /// Recomputes the running statistics of every BatchNorm layer at the
  /// parameters as they are now (an optimizer's point to evaluate) from the
  /// first `rows` training examples, in batches, training mode, without
  /// gradients: their plain average (momentum None), keeping what it
  /// replaced. Batched models do not take such optimizers (batch_refusal).
  virtual void recompute_norm_statistics(std::int64_t rows) { (void)rows; }
  /// Puts back the statistics and momenta recompute_norm_statistics replaced.
  virtual void restore_norm_statistics() {}

 protected:
  explicit LaneModel(std::size_t lanes) : lanes_(lanes) {}

 private:
  std::size_t lanes_;
};

/// forward() under autocast to `precision` on `device`'s type (fp32: as it
/// is), its output cast to fp32: the workload's loss and metrics always see
/// fp32 outputs, and backward runs outside the autocast region.
at::Tensor forward_in(Precision precision, const at::Device& device, const std::function<at::Tensor()>& forward);

/// One trial's model, moved to `device`; with a process group, rank 0's
/// weights broadcast and the gradients averaged over the ranks. Its forward
/// passes run in `precision` (forward_in).
std::unique_ptr<LaneModel> single_model(Model model, const WorkloadData& data, const at::Device& device,
                                        distributed::ProcessGroup* group,
                                        const distributed::CompressionSpec& compression = {},
                                        Precision precision = Precision::kFp32);
/// The model of `lanes` lanes that start from `model`'s weights (batched.h).
std::unique_ptr<LaneModel> stacked_model(const torch::nn::Sequential& model, std::int64_t lanes,
                                         const WorkloadData& data, const at::Device& device,
                                         Precision precision = Precision::kFp32);

/// A stacked model's outputs [K, N, ...] as one batch [K * N, ...], and the
/// targets [N, ...] repeated once per lane to match: how a workload's
/// per-example loss or metric sees the outputs of K lanes.
inline std::pair<at::Tensor, at::Tensor> lanes_as_batch(const at::Tensor& out, const at::Tensor& target) {
  const std::int64_t k = out.size(0);
  std::vector<std::int64_t> flat{k * out.size(1)};
  flat.insert(flat.end(), out.sizes().begin() + 2, out.sizes().end());
  std::vector<std::int64_t> times(static_cast<std::size_t>(target.dim()), 1);
  times[0] = k;
  return {out.reshape(flat), target.repeat(times)};
}

/// A step's examples on `device` (non-blocking from the loader's pinned
/// memory on a GPU).
inline Batch on_device(const Batch& rows, const at::Device& device) {
  return {rows.input.to(device, /*non_blocking=*/true), rows.target.to(device, /*non_blocking=*/true)};
}

}  // namespace bigbatch::experiments
