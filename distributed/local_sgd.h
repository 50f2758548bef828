// Fewer synchronizations: the ranks train on their own shares for H steps
// with their own optimizers, then agree on the parameters. Local SGD (Lin et
// al. 2020, arXiv 1808.07217) averages them; DiLoCo (Douillard et al. 2023,
// arXiv 2311.08105, Algorithm 1) takes an outer step (Nesterov momentum) on
// the averaged pseudo-gradient, the parameters' change since the last
// synchronization; Streaming DiLoCo (Douillard et al. 2025, arXiv 2501.18512)
// synchronizes the parameters in P fragments, each in turn, so that one
// synchronization sends about 1/P of the model. The math is in
// docs/formulas.md ("Local SGD and DiLoCo"); how to use it, in
// docs/distributed.md.
#pragma once

#include "compression.h"
#include "process_group.h"
#include "../optimizers/tensor_swap.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

namespace bigbatch::distributed {

/// every_step: synchronous data parallelism (the gradients averaged every
/// step, compression.h); local_sgd: the parameters averaged every H steps;
/// diloco: an outer optimizer step on the averaged pseudo-gradient every H
/// steps; delayed: asynchronous SGD's stale gradients, simulated in one
/// process (delayed.h).
enum class SyncType { kEveryStep, kLocalSgd, kDiloco, kDelayed };

struct SyncTypeName {
  SyncType value;
  const char* name;
};
inline constexpr SyncTypeName kSyncTypeNames[] = {
    {SyncType::kEveryStep, "every_step"}, {SyncType::kLocalSgd, "local_sgd"}, {SyncType::kDiloco, "diloco"},
    {SyncType::kDelayed, "delayed"}};

/// The config name of a synchronization.
const char* sync_type_name(SyncType type);

/// The outer step on the averaged pseudo-gradient D = anchor - mean over
/// ranks of the parameters: b <- momentum b + D (b starts at zero), then
/// anchor <- anchor - lr (D + momentum b) with Nesterov, anchor - lr b
/// without. lr 1 and momentum 0 give the ranks' average (local SGD).
struct OuterSpec {
  double lr = 1;
  double momentum = 0;
  bool nesterov = false;
};

/// DiLoCo's outer optimizer: Nesterov momentum 0.9 at rate 0.7 (Douillard et al. 2023, section 3).
inline OuterSpec diloco_outer() { return {0.7, 0.9, true}; }

struct LocalSgdSpec {
  SyncType type = SyncType::kLocalSgd;
  /// H: steps of each fragment between its synchronizations, >= 1.
  std::int64_t every = 1;
  /// local_sgd: lr 1, momentum 0 (the average; nothing else is taken);
  /// diloco: any, diloco_outer() for the paper's (the runner's config
  /// reader gives it unless "outer" says otherwise).
  OuterSpec outer;
  /// P: the parameters, flattened and joined in order, cut into P runs of
  /// equal elements (fragment p: elements [p N / P, (p + 1) N / P)), so that
  /// a fragment's bytes are 1/P of the model's whatever its layers' sizes;
  /// fragment p synchronizes after the steps t with t mod H = p H / P. H
  /// must divide by P. (Streaming DiLoCo cuts at layers; the outer step is
  /// elementwise, so where the cuts fall changes nothing else.)
  std::int64_t fragments = 1;
  /// How the pseudo-gradients are averaged: none (an all-reduce in the
  /// parameters' own dtype), or a compressor of compression.h with its error
  /// feedback (one exchange per fragment over the fragment's pieces, in
  /// buckets of bucket_bytes, its memories carried from one synchronization
  /// of the fragment to the next; its start_steps and warmup_steps count
  /// that fragment's synchronizations). A piece that is part of a tensor is
  /// one-dimensional: PowerSGD sends it uncompressed. overlap must be false.
  CompressionSpec compression;
};

/// Checks the spec (type local_sgd or diloco, every, fragments, the outer
/// step, the compressor); throws c10::Error naming the field and its value.
void check_spec(const LocalSgdSpec& spec);

/// What the synchronizations cost so far, on this rank. Bytes are counted as
/// compression.h counts them (a ring all-reduce of N bytes sends 2 (W - 1) / W N).
struct SyncStats {
  std::int64_t rounds = 0;          ///< steps after which one or more fragments synchronized
  std::int64_t fragment_syncs = 0;  ///< fragments synchronized, summed over rounds
  double bytes_sent = 0;
  double bytes_received = 0;
  /// What an fp32 all-reduce of the same pseudo-gradients would have sent.
  double dense_bytes = 0;
  /// The most bytes one scheduled round sent (the peak a network sees: 1/P
  /// of the model's all-reduce with P fragments), finish()'s left out.
  double peak_round_bytes = 0;
  double compress_seconds = 0;
  double communicate_seconds = 0;
  /// The L2 norm of the last round's outer update (lr times the update, over
  /// the fragments it synchronized); NaN before the first round.
  double last_outer_norm = std::numeric_limits<double>::quiet_NaN();
};

/// The synchronizations of one run on one rank. Construct it over the
/// model's parameters once they are the same on every rank (after
/// broadcast_module), call after_step() after every inner optimizer step and
/// finish() at the run's end, on every rank, with the same parameters.
class LocalSgd {
 public:
  /// `buffers`: the model's buffers; the floating ones (BatchNorm's running
  /// statistics) are averaged over the ranks with every round, plainly, and
  /// take part in Global.
  LocalSgd(LocalSgdSpec spec, std::vector<at::Tensor> params, const std::vector<at::Tensor>& buffers = {});
  ~LocalSgd();
  LocalSgd(const LocalSgd&) = delete;
  LocalSgd& operator=(const LocalSgd&) = delete;

  /// After the inner step that makes `steps` steps in all (>= 1): the
  /// fragments due at it synchronize (a collective over `group`; nullptr for
  /// a world of one, where the outer step alone runs). Returns whether any did.
  bool after_step(ProcessGroup* group, std::int64_t steps);
  /// The run's end: every fragment not synchronized after `steps` does now,
  /// so that the ranks end with one model (call it on every rank). Returns
  /// whether any did.
  bool finish(ProcessGroup* group, std::int64_t steps);
  /// Whether fragment `f` synchronizes after step `steps`.
  bool due(std::size_t f, std::int64_t steps) const;

  /// While it lives, the parameters hold the global model (each fragment's
  /// last synchronized values, the same on every rank; the floating buffers
  /// as last averaged), and this rank's own come back bit for bit when it
  /// ends: what an evaluation sees.
  class Global {
   public:
    explicit Global(LocalSgd& sync);

   private:
    optim::TensorSwap swap_;
  };

  const LocalSgdSpec& spec() const { return spec_; }
  /// A fragment's part of one parameter: its flattened elements [begin, end).
  struct Piece {
    std::size_t param;
    std::int64_t begin, end;
    bool operator==(const Piece& o) const { return param == o.param && begin == o.begin && end == o.end; }
  };
  /// Each fragment's pieces, in parameter order.
  const std::vector<std::vector<Piece>>& fragments() const { return fragments_; }
  const SyncStats& totals() const { return totals_; }

 private:
  /// The fragments due after `steps` (every one not synchronized at it, with `all`).
  bool round(ProcessGroup* group, std::int64_t steps, bool all);
  void sync(ProcessGroup* group, std::size_t f, double& outer_sq);

  LocalSgdSpec spec_;
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> anchors_;  ///< the last synchronized parameters
  std::vector<at::Tensor> momenta_;  ///< the outer step's b (momentum > 0)
  std::vector<std::vector<Piece>> fragments_;
  /// Per fragment, per piece: views of the parameter, its anchor and its
  /// momentum (the whole tensors where a piece is all of one), and the
  /// pseudo-gradient's holder for a compressor's exchange.
  struct Views {
    std::vector<at::Tensor> param, anchor, momentum, carrier;
  };
  std::vector<Views> views_;
  std::vector<std::unique_ptr<GradientExchange>> exchanges_;  ///< one per fragment, with a compressor
  std::vector<std::int64_t> last_synced_;                     ///< each fragment's last step synchronized
  std::int64_t last_round_ = 0;                               ///< the last step with a round
  double round_outer_sq_ = 0;                                 ///< its outer update's squared norm so far
  std::vector<at::Tensor> buffers_, buffer_anchors_;          ///< the floating buffers, as last averaged
  SyncStats totals_;
};

}  // namespace bigbatch::distributed
