// Optimizer state sharded across data-parallel ranks (ZeRO stages 1 and 2,
// Rajbhandari et al. 2020) for bigbatch's layer-wise optimizers: each rank
// keeps the moments and fp32 master weights of its 1/N of the parameters
// (stage "states"), and at stage "gradients" also only its 1/N of the averaged
// gradient, which a reduce-scatter gives it. The tensors are cut at the fused
// engine's chunk boundaries (16384 elements), so each rank's fused step runs
// on slices of the parameters (views, not copies), and the per-tensor norms a
// layer-wise optimizer needs (trust ratios, NovoGrad's layer norms, clipping's
// global norm, the non-finite check) come from every rank's chunk sums, added
// in one small all-reduce per reduce pass (kernels/engine.h's ShardSpec): the
// same sums, in the same order, as the unsharded step, so the step is the
// unsharded step bit for bit once the gradients are. Muon, whose
// orthogonalization needs whole matrices, gets each tensor whole on one rank
// instead (as Dion and Megatron's layer-sharded Muon do); only its skip
// decision spans the ranks. After the step the ranks all-gather the parameters. docs/distributed.md shows how to use it;
// docs/formulas.md has the norms across shards.
#pragma once

#include "compression.h"
#include "process_group.h"
#include "shard_plan.h"

#include "../optimizers/layerwise_optimizer.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace bigbatch::distributed {

struct SavedShard;  // one rank's shard as read from its archive (sharded.cpp)

/// A bigbatch optimizer (LARS, LARC, LAMB, NovoGrad, Lion, Muon, Schedule-Free) whose state
/// is sharded across the ranks of `group`: cut at chunk boundaries
/// (plan_shards), or for a kind that takes whole tensors (Muon:
/// shards_whole_tensors) each tensor whole on one rank (plan_whole_tensors).
/// Every rank builds it over the same parameter groups; `make` builds the
/// wrapped optimizer over this rank's slices of them (the groups' options are
/// passed on), and is called once before over the whole groups, to learn
/// which plan the kind takes (that one is dropped, having no state), for instance
///   ShardedOptimizer opt(pg, model->parameters(), [](auto groups) {
///     return std::make_unique<LAMB>(std::move(groups), LAMBOptions(1e-3)); }, ShardStage::kGradients);
///   ... backward; opt.reduce_gradients(); opt.step();
/// Parameters must be contiguous and on one device; the slices are views of
/// them, which follow a parameter given new storage of the same size, dtype
/// and device (a module's load(), set_data) at the next step; a parameter
/// moved to another device is refused.
class ShardedOptimizer final : public optim::LayerwiseOptimizerBase {
 public:
  using Factory = std::function<std::unique_ptr<optim::LayerwiseOptimizerBase>(
      std::vector<torch::optim::OptimizerParamGroup> groups)>;

  ShardedOptimizer(ProcessGroup& group, std::vector<torch::optim::OptimizerParamGroup> groups,
                   const Factory& make, ShardStage stage);
  ShardedOptimizer(ProcessGroup& group, std::vector<at::Tensor> params, const Factory& make, ShardStage stage);
  /// The sharded form of `like`: its parameter groups and options, its kind
  /// (make_like), none of its state (build it before its first step).
  ShardedOptimizer(ProcessGroup& group, const optim::LayerwiseOptimizerBase& like, ShardStage stage);
  ~ShardedOptimizer() override;

  /// Averages this step's gradients over the ranks: at stage "states" as
  /// allreduce_gradients (every rank gets the whole average; any exchange that
  /// gives that, a compressed one included, may be used instead); at stage
  /// "gradients" by one reduce-scatter in fp32, after which this rank holds
  /// only its slice of the average (the parameters' own .grad are left as the
  /// backward pass made them). Returns the squared norms before and after
  /// averaging, as allreduce_gradients does.
  GradientNorms reduce_gradients(std::int64_t bucket_bytes = 25 << 20);

  /// One step of this rank's slices, then the all-gather of the parameters.
  /// Without a closure the gradients must be averaged already (stage
  /// "gradients": by reduce_gradients() since the last step); a closure
  /// computes this rank's gradients, which step() then averages itself.
  torch::Tensor step(LossClosure closure = nullptr) override;

  /// Moves this rank's slices between the training and evaluation points
  /// (Schedule-Free), then all-gathers the parameters as a step does.
  void train(bool on = true) override;
  bool has_evaluation_point() const override { return inner_->has_evaluation_point(); }

  /// The wrapped optimizer's skipped steps (the same on every rank).
  std::int64_t skipped_steps() const override;
  /// Every parameter's trust ratio in the last step, the whole tensor's (the
  /// same on every rank, and those of the unsharded step).
  std::vector<optim::TrustRatio> trust_ratios() const override;
  /// Refuses: it is sharded already.
  void shard(std::shared_ptr<const optim::OptimizerSharding> sharding) override;
  /// This rank's optimizer state.
  std::int64_t state_bytes() const override;
  /// Refuses: shard the wrapped kind instead.
  std::unique_ptr<optim::LayerwiseOptimizerBase> make_like(
      std::vector<torch::optim::OptimizerParamGroup> groups) const override;

  /// Saves this rank's shard: where it lies (world size, rank, the tensors'
  /// sizes, its pieces of them), each tensor's state by field (its elements
  /// of the elementwise fields), the groups' options and the skipped steps.
  /// load() takes the shard saved by the same rank of the same world over the
  /// same tensors, and refuses any other naming what differs; load_shards()
  /// takes every rank's, from any world size.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  /// Loads the state saved by every rank of a sharded optimizer over the
  /// same tensors, at this world size or another (`shards`: each rank's
  /// save(), in any order): each rank takes its elements from the shards
  /// that hold them, and the step goes on as the saved optimizer's would.
  /// Refuses, before changing anything, shards of other tensors or of
  /// several worlds, a missing or repeated rank, and a torn shard (a field or
  /// a tensor's state that one shard has and another lacks).
  void load_shards(std::vector<torch::serialize::InputArchive>& shards);
  /// load_shards() from one file per rank (what torch::save(optimizer, path)
  /// writes); a file that does not read is refused with its path and reason.
  void load_shard_files(const std::vector<std::string>& paths);
  /// Loads what the unsharded optimizer of the same kind over the same
  /// parameters saved (its save()); each rank keeps its elements. Every rank
  /// holds the whole state while it loads.
  void load_unsharded(torch::serialize::InputArchive& archive);
  /// Refuses: a sharded optimizer's state is cut across ranks (load_sharded_into).
  std::optional<optim::NamedState> named_state(const at::Tensor& param) const override;
  void set_named_state(const at::Tensor& param, const std::optional<optim::NamedState>& state) override;
  void set_skipped_steps(std::int64_t count) override;
  /// The wrapped optimizer's.
  const char* kind() const override;

  ShardStage stage() const { return stage_; }
  const ShardPlan& plan() const { return plan_; }
  /// Bytes of averaged gradient this rank keeps for the step: the whole
  /// gradient's at stage "states", its slice's at stage "gradients".
  std::int64_t gradient_bytes() const;
  /// What one step exchanges per rank, by the ring formulas (ExchangeBytes):
  /// the gradient in fp32, the parameters in their own dtype.
  ExchangeBytes exchange_bytes() const;
  /// The optimizer over this rank's slices.
  optim::LayerwiseOptimizerBase& wrapped() { return *inner_; }
  const optim::LayerwiseOptimizerBase& wrapped() const { return *inner_; }
  /// Every group's parameters, in order: the plan's tensors.
  const std::vector<at::Tensor>& params() const { return params_; }
  /// The plan's index of the tensor whose slice (a parameter of wrapped())
  /// `slice` is, or nullopt for another tensor.
  std::optional<std::size_t> tensor_of(const at::Tensor& slice) const;

 private:
  struct Parts;
  ShardedOptimizer(ProcessGroup& group, Parts parts, ShardStage stage);
  static Parts build(const ProcessGroup& group, std::vector<torch::optim::OptimizerParamGroup> groups,
                     const Factory& make, ShardStage stage);
  /// `like`'s groups: its parameters and a copy of each group's options.
  static std::vector<torch::optim::OptimizerParamGroup> groups_of(const optim::LayerwiseOptimizerBase& like);
  void refresh_slices();
  /// Takes the loaded states (one per tensor: its slice's) and skipped steps.
  void adopt_states(std::vector<std::optional<optim::NamedState>> states, std::int64_t skipped);
  /// Takes this rank's elements of the shards, their options and skipped steps.
  void adopt_shards(std::vector<SavedShard>& shards);
  void slice_gradients();
  void all_gather_params();
  /// This rank's piece of each tensor.
  const std::vector<ShardPiece>& mine() const { return plan_.piece[static_cast<std::size_t>(group_.rank())]; }

  /// The parameters of one dtype, all-gathered together after each step:
  /// which tensors, and the most elements of them any rank holds.
  struct Gather {
    at::ScalarType dtype;
    std::vector<std::size_t> members;
    std::int64_t part = 0;
  };

  ProcessGroup& group_;
  ShardStage stage_;
  bool whole_;                      // each tensor whole on one rank (the wrapped kind's shards_whole_tensors)
  ShardPlan plan_;
  std::vector<at::Tensor> params_;  // every group's, in order: the plan's tensors
  std::vector<at::Tensor> slices_;  // this rank's slice of each (views, possibly empty)
  std::unordered_map<const void*, std::size_t> index_;  // a slice's TensorImpl -> its tensor
  at::Device device_;               // the parameters'
  std::vector<Gather> gathers_;     // by dtype, fixed with the plan
  std::unique_ptr<optim::LayerwiseOptimizerBase> inner_;
  std::shared_ptr<optim::OptimizerSharding> sharding_;
  bool reduced_ = false;            // stage gradients: reduce_gradients() gave the slices their gradients
  std::vector<bool> has_grad_;      // stage gradients: which tensors had a gradient to reduce
};

/// Loads into `whole`, an unsharded optimizer of the same kind over the same
/// parameters (in group order), the state every rank of a sharded optimizer
/// saved (`shards`, one save() per rank, any world size): the other way round
/// from ShardedOptimizer::load_unsharded. `whole` then steps, saves and loads
/// as if it had taken the sharded steps itself. Refuses what load_shards()
/// refuses, before changing anything.
void load_sharded_into(optim::LayerwiseOptimizerBase& whole, std::vector<torch::serialize::InputArchive>& shards);

}  // namespace bigbatch::distributed
