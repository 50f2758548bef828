// The checkpoint format of ShardedOptimizer (distributed/sharded.h): what
// one rank's save() writes, how load() checks it, and how the shards of
// every rank (at any world size) or an unsharded optimizer's state become
// this rank's, and the other way round (load_sharded_into).
#include "sharded.h"

#include <c10/util/Exception.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

namespace bigbatch::distributed {

// ------------------------------------------------------------ checkpoints --
//
// A shard is portable: each tensor's state by field, the elementwise fields
// holding only the shard's elements (flat), so the shards of any world can be
// cut again for another (load_shards), joined for the unsharded optimizer
// (load_sharded_into), and an unsharded state cut for the ranks (load_unsharded).

namespace {

const std::string kShardKey = "bigbatch/shard/";

std::string state_key(std::size_t t) { return kShardKey + "state/" + std::to_string(t) + "/"; }

at::Tensor longs(const std::vector<std::int64_t>& values) {
  return at::tensor(values, at::kLong);  // copies
}

std::vector<std::int64_t> longs_of(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kLong).contiguous();
  return {c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel()};
}

// Whether a field is elementwise over `elements` elements of its tensor (it
// holds one value per element) rather than one value for the whole tensor.
bool elementwise(const c10::IValue& value, std::int64_t elements) {
  return value.isTensor() && value.toTensor().dim() >= 1 && value.toTensor().numel() == elements;
}

}  // namespace

// What one saved shard holds, read whole before any optimizer changes.
struct SavedShard {
  std::string kind;  // the wrapped optimizer's ("LAMB", ...)
  int world = 0;
  int rank = 0;
  std::vector<std::int64_t> numel;
  std::vector<ShardPiece> pieces;
  std::int64_t skipped = 0;
  std::vector<std::optional<optim::NamedState>> state;  // [T]
  std::vector<torch::serialize::InputArchive> options;  // per group
};

namespace {

std::int64_t read_long(torch::serialize::InputArchive& archive, const std::string& key, const char* what) {
  at::Tensor value;
  TORCH_CHECK(archive.try_read(key, value), "ShardedOptimizer: the archive holds no sharded optimizer state (no ",
              what, ")");
  return value.item<std::int64_t>();
}

SavedShard read_shard(torch::serialize::InputArchive& archive) {
  SavedShard shard;
  shard.world = static_cast<int>(read_long(archive, kShardKey + "world_size", "world size"));
  shard.rank = static_cast<int>(read_long(archive, kShardKey + "rank", "rank"));
  const auto groups = read_long(archive, kShardKey + "groups", "group count");
  shard.skipped = read_long(archive, kShardKey + "skipped_steps", "skipped steps");
  const std::string who = "the shard of rank " + std::to_string(shard.rank) + " of " + std::to_string(shard.world);
  c10::IValue kind;
  TORCH_CHECK(archive.try_read(kShardKey + "kind", kind) && kind.isString(), "ShardedOptimizer: ", who,
              " is torn: it does not name its optimizer");
  shard.kind = kind.toStringRef();
  at::Tensor numel;
  at::Tensor pieces;
  TORCH_CHECK(archive.try_read(kShardKey + "numel", numel) && archive.try_read(kShardKey + "pieces", pieces),
              "ShardedOptimizer: ", who, " is torn: it lacks its tensors' sizes or its pieces");
  shard.numel = longs_of(numel);
  const std::vector<std::int64_t> bounds = longs_of(pieces);
  TORCH_CHECK(bounds.size() == 2 * shard.numel.size(), "ShardedOptimizer: ", who, " is torn: ", bounds.size() / 2,
              " pieces of ", shard.numel.size(), " tensors");
  for (std::size_t t = 0; t < shard.numel.size(); ++t) {
    const ShardPiece piece{bounds[2 * t], bounds[2 * t + 1]};
    TORCH_CHECK(0 <= piece.begin && piece.begin <= piece.end && piece.end <= shard.numel[t], "ShardedOptimizer: ",
                who, " is torn: its piece of tensor ", t, " is [", piece.begin, ", ", piece.end, ") of ",
                shard.numel[t], " elements");
    shard.pieces.push_back(piece);
    c10::IValue names;
    if (!archive.try_read(state_key(t) + "fields", names)) {
      shard.state.emplace_back();
      continue;
    }
    optim::NamedState state;
    std::stringstream list(names.toStringRef());
    for (std::string name; std::getline(list, name, ',');) {
      c10::IValue value;
      TORCH_CHECK(archive.try_read(state_key(t) + name, value), "ShardedOptimizer: ", who,
                  " is torn: no value for field '", name, "' of tensor ", t);
      TORCH_CHECK(!elementwise(value, piece.size()) || value.toTensor().dim() == 1 || piece.size() == shard.numel[t],
                  "ShardedOptimizer: ", who, " holds field '", name, "' of tensor ", t, " shaped ",
                  value.toTensor().sizes(), ", not flat");
      state.emplace_back(name, std::move(value));
    }
    shard.state.emplace_back(std::move(state));
  }
  for (std::int64_t i = 0; i < groups; ++i) {
    torch::serialize::InputArchive options;
    TORCH_CHECK(archive.try_read(kShardKey + "options/" + std::to_string(i), options), "ShardedOptimizer: ", who,
                " is torn: no options for group ", i);
    shard.options.push_back(std::move(options));
  }
  return shard;
}

// Refuses a shard of another optimizer's state.
void check_kind(const SavedShard& shard, const std::string& kind) {
  TORCH_CHECK(shard.kind == kind, "ShardedOptimizer: the shard of rank ", shard.rank, " holds ", shard.kind,
              "'s state; this is ", kind);
}

// Reads every rank's shard and checks that they are the whole of one world's
// over tensors of `numel` elements: each rank once, the pieces of each
// tensor tiling it.
std::vector<SavedShard> read_shards(std::vector<torch::serialize::InputArchive>& archives,
                                    const std::vector<std::int64_t>& numel, const std::string& kind) {
  TORCH_CHECK(!archives.empty(), "ShardedOptimizer: no shards to load");
  std::vector<SavedShard> shards;
  for (auto& archive : archives) shards.push_back(read_shard(archive));
  const int world = shards[0].world;
  std::vector<int> seen(static_cast<std::size_t>(std::max(world, 0)), 0);
  for (const SavedShard& shard : shards) {
    check_kind(shard, kind);
    TORCH_CHECK(shard.world == world, "ShardedOptimizer: the shards come from worlds of ", world, " and ",
                shard.world, " ranks");
    TORCH_CHECK(shard.rank >= 0 && shard.rank < world && seen[static_cast<std::size_t>(shard.rank)]++ == 0,
                "ShardedOptimizer: rank ", shard.rank, " of ", world, " comes more than once, or is not a rank");
    TORCH_CHECK(shard.numel == numel, "ShardedOptimizer: the shard of rank ", shard.rank, " is of ",
                shard.numel.size(), " tensors, not of this optimizer's ", numel.size(), ", or they differ in size");
    TORCH_CHECK(shard.options.size() == shards[0].options.size(), "ShardedOptimizer: the shards hold ",
                shards[0].options.size(), " and ", shard.options.size(), " parameter groups");
  }
  for (int r = 0; r < world; ++r) {
    TORCH_CHECK(seen[static_cast<std::size_t>(r)] == 1, "ShardedOptimizer: the shard of rank ", r, " of ", world,
                " is missing (", shards.size(), " given)");
  }
  for (std::size_t t = 0; t < numel.size(); ++t) {
    std::vector<ShardPiece> pieces;
    for (const SavedShard& shard : shards) {
      if (shard.pieces[t].size() > 0) pieces.push_back(shard.pieces[t]);
    }
    std::sort(pieces.begin(), pieces.end(), [](const ShardPiece& a, const ShardPiece& b) { return a.begin < b.begin; });
    std::int64_t covered = 0;
    for (const ShardPiece& p : pieces) {
      TORCH_CHECK(p.begin == covered, "ShardedOptimizer: the shards' pieces of tensor ", t, " do not tile it (",
                  p.begin, " follows ", covered, ")");
      covered = p.end;
    }
    TORCH_CHECK(covered == numel[t], "ShardedOptimizer: the shards cover ", covered, " of tensor ", t, "'s ",
                numel[t], " elements");
  }
  return shards;
}

// Tensor t's state over its elements [begin, end), joined from the shards
// that hold them, on `device`; elementwise fields flat. nullopt where no
// shard has a state for it (it has not stepped) or the range is empty.
std::optional<optim::NamedState> join_state(const std::vector<SavedShard>& shards, std::size_t t, std::int64_t begin,
                                            std::int64_t end, const at::Device& device) {
  if (begin >= end) return std::nullopt;
  std::vector<const SavedShard*> holders;
  for (const SavedShard& shard : shards) {
    const ShardPiece& p = shard.pieces[t];
    if (p.begin < end && begin < p.end) holders.push_back(&shard);
  }
  std::size_t with_state = 0;
  for (const SavedShard* shard : holders) with_state += shard->state[t].has_value() ? 1 : 0;
  if (with_state == 0) return std::nullopt;
  TORCH_CHECK(with_state == holders.size(), "ShardedOptimizer: tensor ", t,
              " has a state in some shards and none in others: a torn checkpoint");
  optim::NamedState joined;
  const SavedShard& first = *holders[0];
  for (const auto& [name, value] : *first.state[t]) {
    if (!elementwise(value, first.pieces[t].size())) {
      joined.emplace_back(name, value.isTensor() ? c10::IValue(value.toTensor().to(device)) : value);
      continue;
    }
    at::Tensor out = at::empty({end - begin}, value.toTensor().options().device(device));
    for (const SavedShard* shard : holders) {
      const optim::NamedState& state = *shard->state[t];
      const auto it = std::find_if(state.begin(), state.end(), [&n = name](const auto& f) { return f.first == n; });
      TORCH_CHECK(it != state.end() && elementwise(it->second, shard->pieces[t].size()), "ShardedOptimizer: the shard "
                  "of rank ", shard->rank, " lacks the elementwise field '", name, "' of tensor ", t, ": a torn checkpoint");
      const ShardPiece& p = shard->pieces[t];
      const std::int64_t lo = std::max(begin, p.begin);
      const std::int64_t hi = std::min(end, p.end);
      out.narrow(0, lo - begin, hi - lo).copy_(it->second.toTensor().reshape({-1}).narrow(0, lo - p.begin, hi - lo));
    }
    joined.emplace_back(name, out);
  }
  return joined;
}

// The elementwise fields of `state` (flat, of `like`'s elements) shaped as `like`.
void shape_like(std::optional<optim::NamedState>& state, const at::Tensor& like) {
  if (!state.has_value()) return;
  for (auto& [name, value] : *state) {
    if (elementwise(value, like.numel())) value = value.toTensor().reshape(like.sizes());
  }
}

// Sets each group's options of `optimizer` from a shard's.
void load_options(torch::optim::Optimizer& optimizer, std::vector<torch::serialize::InputArchive>& options) {
  TORCH_CHECK(options.size() == optimizer.param_groups().size(), "ShardedOptimizer: the shards hold ", options.size(),
              " parameter groups, the optimizer ", optimizer.param_groups().size());
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> loaded;
  for (std::size_t i = 0; i < options.size(); ++i) {
    loaded.push_back(optimizer.param_groups()[i].options().clone());
    try {
      loaded.back()->serialize(options[i]);
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "ShardedOptimizer: the shards' options of group ", i,
                  " do not load into this optimizer (another kind?): ", e.what_without_backtrace());
    }
  }
  for (std::size_t i = 0; i < loaded.size(); ++i) optimizer.param_groups()[i].set_options(std::move(loaded[i]));
}

// The whole parameters of `optimizer`, in group order.
std::vector<at::Tensor> params_of(const torch::optim::Optimizer& optimizer) {
  std::vector<at::Tensor> params;
  for (const auto& g : optimizer.param_groups()) params.insert(params.end(), g.params().begin(), g.params().end());
  return params;
}

std::vector<std::int64_t> numel_of(const std::vector<at::Tensor>& params) {
  std::vector<std::int64_t> numel;
  for (const at::Tensor& p : params) numel.push_back(p.numel());
  return numel;
}

}  // namespace

void ShardedOptimizer::adopt_states(std::vector<std::optional<optim::NamedState>> states, std::int64_t skipped) {
  for (std::size_t t = 0; t < slices_.size(); ++t) inner_->set_named_state(slices_[t], states[t]);
  inner_->set_skipped_steps(skipped);
}

void ShardedOptimizer::adopt_shards(std::vector<SavedShard>& shards) {
  std::vector<std::optional<optim::NamedState>> states;
  for (std::size_t t = 0; t < slices_.size(); ++t) {
    states.push_back(join_state(shards, t, mine()[t].begin, mine()[t].end, device_));
    shape_like(states.back(), slices_[t]);
  }
  load_options(*this, shards[0].options);
  adopt_states(std::move(states), shards[0].skipped);
}

void ShardedOptimizer::save(torch::serialize::OutputArchive& archive) const {
  archive.write(kShardKey + "kind", c10::IValue(std::string(inner_->kind())));
  archive.write(kShardKey + "world_size", at::scalar_tensor(static_cast<std::int64_t>(group_.size()), at::kLong));
  archive.write(kShardKey + "rank", at::scalar_tensor(static_cast<std::int64_t>(group_.rank()), at::kLong));
  archive.write(kShardKey + "numel", longs(plan_.numel));
  std::vector<std::int64_t> bounds;
  for (const ShardPiece& p : mine()) bounds.insert(bounds.end(), {p.begin, p.end});
  archive.write(kShardKey + "pieces", longs(bounds));
  archive.write(kShardKey + "skipped_steps", at::scalar_tensor(inner_->skipped_steps(), at::kLong));
  archive.write(kShardKey + "groups", at::scalar_tensor(static_cast<std::int64_t>(param_groups_.size()), at::kLong));
  for (std::size_t i = 0; i < param_groups_.size(); ++i) {
    torch::serialize::OutputArchive options;
    param_groups_[i].options().serialize(options);
    archive.write(kShardKey + "options/" + std::to_string(i), options);
  }
  for (std::size_t t = 0; t < slices_.size(); ++t) {
    const std::optional<optim::NamedState> state = inner_->named_state(slices_[t]);
    if (!state.has_value()) continue;
    std::string names;
    for (const auto& [name, value] : *state) {
      names += (names.empty() ? "" : ",") + name;
      archive.write(state_key(t) + name, value);
    }
    archive.write(state_key(t) + "fields", c10::IValue(names));
  }
}

void ShardedOptimizer::load(torch::serialize::InputArchive& archive) {
  std::vector<SavedShard> shards;
  shards.push_back(read_shard(archive));
  TORCH_CHECK(shards[0].world == group_.size() && shards[0].rank == group_.rank(),
              "ShardedOptimizer: the archive holds the shard of rank ", shards[0].rank, " of ", shards[0].world,
              "; this is rank ", group_.rank(), " of ", group_.size(),
              " (load_shards() takes every rank's shards, of any world)");
  check_kind(shards[0], inner_->kind());
  TORCH_CHECK(shards[0].numel == plan_.numel, "ShardedOptimizer: the archive's tensors (", shards[0].numel.size(),
              ") are not this optimizer's (", plan_.numel.size(), "), or differ in size");
  for (std::size_t t = 0; t < plan_.numel.size(); ++t) {
    TORCH_CHECK(shards[0].pieces[t].begin == mine()[t].begin && shards[0].pieces[t].end == mine()[t].end,
                "ShardedOptimizer: the archive's piece of tensor ", t, " is [", shards[0].pieces[t].begin, ", ",
                shards[0].pieces[t].end, "), this rank's [", mine()[t].begin, ", ", mine()[t].end, ")");
  }
  adopt_shards(shards);
}

void ShardedOptimizer::load_shards(std::vector<torch::serialize::InputArchive>& archives) {
  std::vector<SavedShard> shards = read_shards(archives, plan_.numel, inner_->kind());
  adopt_shards(shards);
}

void ShardedOptimizer::load_shard_files(const std::vector<std::string>& paths) {
  std::vector<torch::serialize::InputArchive> archives(paths.size());
  for (std::size_t i = 0; i < paths.size(); ++i) {
    try {
      archives[i].load_from(paths[i]);
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "ShardedOptimizer: cannot read the shard ", paths[i], ": ", e.what_without_backtrace());
    }
  }
  load_shards(archives);
}

void ShardedOptimizer::load_unsharded(torch::serialize::InputArchive& archive) {
  const std::unique_ptr<optim::LayerwiseOptimizerBase> whole = inner_->make_like(groups_of(*this));
  whole->load(archive);
  std::vector<std::optional<optim::NamedState>> states;
  for (std::size_t t = 0; t < params_.size(); ++t) {
    std::optional<optim::NamedState> state = whole->named_state(params_[t]);
    const ShardPiece& piece = mine()[t];
    if (state.has_value() && piece.size() > 0) {
      for (auto& [name, value] : *state) {
        if (elementwise(value, plan_.numel[t])) {
          value = value.toTensor().reshape({-1}).narrow(0, piece.begin, piece.size()).clone();
        }
      }
      shape_like(state, slices_[t]);
    } else {
      state.reset();
    }
    states.push_back(std::move(state));
  }
  for (std::size_t i = 0; i < param_groups_.size(); ++i) {
    param_groups_[i].set_options(whole->param_groups()[i].options().clone());
  }
  adopt_states(std::move(states), whole->skipped_steps());
}

void load_sharded_into(optim::LayerwiseOptimizerBase& whole, std::vector<torch::serialize::InputArchive>& archives) {
  const std::vector<at::Tensor> params = params_of(whole);
  std::vector<SavedShard> shards = read_shards(archives, numel_of(params), whole.kind());
  std::vector<std::optional<optim::NamedState>> states;
  for (std::size_t t = 0; t < params.size(); ++t) {
    states.push_back(join_state(shards, t, 0, params[t].numel(), params[t].device()));
    shape_like(states.back(), params[t]);
  }
  load_options(whole, shards[0].options);
  for (std::size_t t = 0; t < params.size(); ++t) whole.set_named_state(params[t], states[t]);
  whole.set_skipped_steps(shards[0].skipped);
}

}  // namespace bigbatch::distributed
