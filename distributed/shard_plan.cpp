#include "shard_plan.h"

#include "../kernels/plan.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

namespace bigbatch::distributed {

using kernels::kChunkElements;

const char* shard_stage_name(ShardStage stage) {
  for (const auto& n : kShardStageNames) {
    if (n.value == stage) return n.name;
  }
  return "?";
}

std::int64_t ShardPlan::elements(int rank) const {
  std::int64_t n = 0;
  for (const ShardPiece& p : piece.at(static_cast<std::size_t>(rank))) n += p.size();
  return n;
}

std::int64_t ShardPlan::max_elements() const {
  std::int64_t most = 0;
  for (int r = 0; r < world(); ++r) most = std::max(most, elements(r));
  return most;
}

ShardPlan plan_shards(const std::vector<std::int64_t>& numel, int world) {
  if (world < 1) throw std::invalid_argument("plan_shards: the world size must be >= 1, got " + std::to_string(world));
  // Every chunk of every tensor in order, by the element where it starts.
  std::vector<std::int64_t> chunk_begin;
  std::vector<std::int64_t> first_chunk(numel.size() + 1, 0);
  std::int64_t elements = 0;
  for (std::size_t t = 0; t < numel.size(); ++t) {
    if (numel[t] < 0) {
      throw std::invalid_argument("plan_shards: tensor " + std::to_string(t) + " has " + std::to_string(numel[t]) +
                                  " elements");
    }
    first_chunk[t] = static_cast<std::int64_t>(chunk_begin.size());
    for (std::int64_t c = 0; c * kChunkElements < numel[t]; ++c) chunk_begin.push_back(elements + c * kChunkElements);
    elements += numel[t];
  }
  const auto chunks = static_cast<std::int64_t>(chunk_begin.size());
  first_chunk[numel.size()] = chunks;
  chunk_begin.push_back(elements);
  // Rank r's run starts at the chunk boundary nearest to r/world of the elements.
  std::vector<std::int64_t> bound(static_cast<std::size_t>(world) + 1, 0);
  bound[static_cast<std::size_t>(world)] = chunks;
  for (int r = 1; r < world; ++r) {
    const auto target = static_cast<std::int64_t>(static_cast<long double>(elements) * r / world);
    auto c = std::lower_bound(chunk_begin.begin(), chunk_begin.end() - 1, target) - chunk_begin.begin();
    if (c > 0 && target - chunk_begin[c - 1] < chunk_begin[c] - target) --c;
    bound[r] = std::max<std::int64_t>(bound[r - 1], c);
  }
  ShardPlan plan;
  plan.numel = numel;
  plan.piece.assign(static_cast<std::size_t>(world), std::vector<ShardPiece>(numel.size()));
  for (int r = 0; r < world; ++r) {
    for (std::size_t t = 0; t < numel.size(); ++t) {
      const auto clamp = [&](std::int64_t c) { return std::clamp(c, first_chunk[t], first_chunk[t + 1]) - first_chunk[t]; };
      ShardPiece& p = plan.piece[r][t];
      p.begin = std::min(clamp(bound[r]) * kChunkElements, numel[t]);
      p.end = std::min(clamp(bound[r + 1]) * kChunkElements, numel[t]);
    }
  }
  return plan;
}

ShardPlan plan_whole_tensors(const std::vector<std::int64_t>& numel, int world) {
  if (world < 1) {
    throw std::invalid_argument("plan_whole_tensors: the world size must be >= 1, got " + std::to_string(world));
  }
  ShardPlan plan;
  plan.numel = numel;
  plan.piece.assign(static_cast<std::size_t>(world), std::vector<ShardPiece>(numel.size()));
  std::vector<std::size_t> order(numel.size());
  for (std::size_t t = 0; t < order.size(); ++t) {
    if (numel[t] < 0) {
      throw std::invalid_argument("plan_whole_tensors: tensor " + std::to_string(t) + " has " +
                                  std::to_string(numel[t]) + " elements");
    }
    order[t] = t;
  }
  // Largest first, each to the rank holding the fewest elements so far (the
  // lowest such rank): within the largest tensor of an equal share.
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return numel[a] > numel[b]; });
  std::vector<std::int64_t> load(static_cast<std::size_t>(world), 0);
  for (const std::size_t t : order) {
    const auto r = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    plan.piece[r][t] = {0, numel[t]};
    load[r] += numel[t];
  }
  return plan;
}

}  // namespace bigbatch::distributed
