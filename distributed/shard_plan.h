// How data-parallel ranks divide tensors between them (docs/distributed.md,
// docs/formulas.md "Norms across shards"): the stages of sharding (ZeRO 1
// and 2), the plans that cut tensors at the fused engine's chunks or give
// each tensor whole to one rank, and the bytes a step exchanges. Plain
// arithmetic, no communication: distributed/sharded.h steps by these plans.
#pragma once

#include <cstdint>
#include <vector>

namespace bigbatch::distributed {

/// What a rank keeps of the optimizer: everything (none), its shard of the
/// state (states: ZeRO stage 1), and of the gradient too (gradients: stage 2).
enum class ShardStage { kNone, kStates, kGradients };

/// How configs and result files spell each stage, in the order messages list them.
struct ShardStageName {
  ShardStage value;
  const char* name;
};
inline constexpr ShardStageName kShardStageNames[] = {
    {ShardStage::kNone, "none"}, {ShardStage::kStates, "states"}, {ShardStage::kGradients, "gradients"}};

const char* shard_stage_name(ShardStage stage);

/// One rank's piece of one tensor: elements [begin, end) of its flat view.
struct ShardPiece {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::int64_t size() const { return end - begin; }
};

/// How tensors (their element counts, in order) are cut across the ranks:
/// the tensors' chunks of 16384 elements, in order, in `world` contiguous
/// runs of whole chunks, each run starting at the chunk nearest to r/world of
/// all the elements. A rank's piece of a tensor may be empty.
struct ShardPlan {
  std::vector<std::int64_t> numel;             ///< [T]
  std::vector<std::vector<ShardPiece>> piece;  ///< [world][T]

  int world() const { return static_cast<int>(piece.size()); }
  /// Elements of every tensor that `rank` holds.
  std::int64_t elements(int rank) const;
  /// The most any rank holds (the part of a reduce-scatter or all-gather).
  std::int64_t max_elements() const;
};

/// The plan for tensors of `numel` elements across `world` ranks. Throws
/// std::invalid_argument for world < 1 or a negative count.
ShardPlan plan_shards(const std::vector<std::int64_t>& numel, int world);

/// The plan for an optimizer that takes whole tensors (Muon): each tensor
/// whole to one rank, the largest first, each to the rank holding the fewest
/// elements so far: each rank within the largest tensor of an equal share.
/// Throws as plan_shards.
ShardPlan plan_whole_tensors(const std::vector<std::int64_t>& numel, int world);

/// Bytes one rank sends (and receives) per step to exchange `elements`
/// elements of `bytes_per_element` among `world` ranks in a ring: an
/// all-reduce 2(N-1)/N of them, a reduce-scatter or an all-gather (N-1)/N.
struct ExchangeBytes {
  std::int64_t reduce_scatter = 0;  ///< gradients at stage "gradients"
  std::int64_t all_reduce = 0;      ///< gradients at stages "none" and "states"
  std::int64_t all_gather = 0;      ///< parameters after a sharded step
};

}  // namespace bigbatch::distributed
