#include "sharded.h"

#include "../kernels/plan.h"
#include "../noise/noise_scale.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <optional>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

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

// ------------------------------------------------------------ the optimizer --

struct ShardedOptimizer::Parts {
  bool whole = false;  // each tensor whole on one rank (shards_whole_tensors)
  ShardPlan plan;
  std::vector<at::Tensor> params;
  std::vector<at::Tensor> slices;
  std::vector<torch::optim::OptimizerParamGroup> groups;  // the whole parameters, the wrapped groups' options
  std::unique_ptr<optim::LayerwiseOptimizerBase> inner;
};

auto ShardedOptimizer::build(const ProcessGroup& group, std::vector<torch::optim::OptimizerParamGroup> groups,
                             const Factory& make, ShardStage stage) -> Parts {
  TORCH_CHECK(stage != ShardStage::kNone,
              "ShardedOptimizer: stage \"none\" keeps the whole state on every rank; use the optimizer itself");
  TORCH_CHECK(make != nullptr, "ShardedOptimizer: no factory for the wrapped optimizer");
  Parts parts;
  std::vector<std::int64_t> numel;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    for (std::size_t j = 0; j < groups[i].params().size(); ++j) {
      const at::Tensor& p = groups[i].params()[j];
      TORCH_CHECK(p.is_contiguous() && p.is_floating_point(), "ShardedOptimizer: parameter ", j, " of group ", i,
                  " is not a contiguous floating point tensor (shape ", p.sizes(), ", ", p.scalar_type(), ")");
      TORCH_CHECK(parts.params.empty() || p.device() == parts.params[0].device(), "ShardedOptimizer: parameter ", j,
                  " of group ", i, " is on ", p.device(), ", the first on ", parts.params[0].device());
      parts.params.push_back(p);
      numel.push_back(p.numel());
    }
  }
  // Whether the kind takes whole tensors (Muon): asked of one built over the
  // whole parameters, which holds no state yet.
  parts.whole = make(groups)->shards_whole_tensors();
  parts.plan = parts.whole ? plan_whole_tensors(numel, group.size()) : plan_shards(numel, group.size());
  std::vector<torch::optim::OptimizerParamGroup> sliced;
  std::size_t t = 0;
  for (const auto& g : groups) {
    std::vector<at::Tensor> slices;
    for (std::size_t j = 0; j < g.params().size(); ++j, ++t) {
      const ShardPiece& piece = parts.plan.piece[static_cast<std::size_t>(group.rank())][t];
      const at::Tensor& p = parts.params[t];
      // A view of this rank's elements under a tensor of its own: the wrapped
      // optimizer keys its state and gradient by it. Whole tensors keep their
      // shape; another rank's keeps its dimensions with none of its rows.
      if (!parts.whole) {
        slices.push_back(p.detach().view({-1}).narrow(0, piece.begin, piece.size()).detach());
      } else if (piece.size() > 0) {
        slices.push_back(p.detach());
      } else {
        slices.push_back(p.dim() == 0 ? p.detach().view({-1}).narrow(0, 0, 0).detach() : p.detach().narrow(0, 0, 0).detach());
      }
    }
    parts.slices.insert(parts.slices.end(), slices.begin(), slices.end());
    sliced.push_back(g.has_options() ? torch::optim::OptimizerParamGroup(slices, g.options().clone())
                                     : torch::optim::OptimizerParamGroup(slices));
  }
  parts.inner = make(std::move(sliced));
  TORCH_CHECK(parts.inner != nullptr, "ShardedOptimizer: the factory made no optimizer");
  const auto& made = parts.inner->param_groups();
  TORCH_CHECK(made.size() == groups.size(), "ShardedOptimizer: the factory made ", made.size(),
              " parameter groups of the ", groups.size(), " it was given");
  for (std::size_t i = 0; i < groups.size(); ++i) {
    TORCH_CHECK(made[i].params().size() == groups[i].params().size(), "ShardedOptimizer: the factory's group ", i,
                " has ", made[i].params().size(), " parameters of the ", groups[i].params().size(), " it was given");
    parts.groups.emplace_back(groups[i].params(), made[i].options().clone());
  }
  return parts;
}

ShardedOptimizer::ShardedOptimizer(ProcessGroup& group, std::vector<torch::optim::OptimizerParamGroup> groups,
                                   const Factory& make, ShardStage stage)
    : ShardedOptimizer(group, build(group, std::move(groups), make, stage), stage) {}

ShardedOptimizer::ShardedOptimizer(ProcessGroup& group, std::vector<at::Tensor> params, const Factory& make,
                                   ShardStage stage)
    : ShardedOptimizer(group, std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(std::move(params))},
                       make, stage) {}

namespace {

// `like`'s groups: its parameters and a copy of each group's options.
std::vector<torch::optim::OptimizerParamGroup> groups_of(const optim::LayerwiseOptimizerBase& like) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (const auto& g : like.param_groups()) groups.emplace_back(g.params(), g.options().clone());
  return groups;
}

}  // namespace

ShardedOptimizer::ShardedOptimizer(ProcessGroup& group, const optim::LayerwiseOptimizerBase& like, ShardStage stage)
    : ShardedOptimizer(group, groups_of(like),
                       [&like](std::vector<torch::optim::OptimizerParamGroup> groups) {
                         return like.make_like(std::move(groups));
                       },
                       stage) {}

ShardedOptimizer::ShardedOptimizer(ProcessGroup& group, Parts parts, ShardStage stage)
    : LayerwiseOptimizerBase(std::vector<torch::optim::OptimizerParamGroup>{}, parts.inner->defaults().clone()),
      group_(group),
      stage_(stage),
      whole_(parts.whole),
      plan_(std::move(parts.plan)),
      params_(std::move(parts.params)),
      slices_(std::move(parts.slices)),
      device_(params_.empty() ? at::Device(at::kCPU) : params_[0].device()),
      inner_(std::move(parts.inner)) {
  for (const auto& g : parts.groups) {
    // LibTorch 2.x's add_param_group replaces options of a type it does not know: set them again.
    torch::optim::Optimizer::add_param_group(g);
    param_groups_.back().set_options(g.options().clone());
  }
  sharding_ = std::make_shared<optim::OptimizerSharding>();
  for (std::size_t t = 0; t < params_.size(); ++t) {
    index_[slices_[t].unsafeGetTensorImpl()] = t;  // a slice keeps its TensorImpl (refresh_slices)
    sharding_->shards[slices_[t].unsafeGetTensorImpl()] = {kernels::chunks_of(plan_.numel[t]),
                                                           mine()[t].begin / kChunkElements};
  }
  std::map<at::ScalarType, std::vector<std::size_t>> by_dtype;
  for (std::size_t t = 0; t < params_.size(); ++t) by_dtype[params_[t].scalar_type()].push_back(t);
  for (auto& [dtype, members] : by_dtype) {
    Gather g{dtype, std::move(members), 0};
    for (int r = 0; r < plan_.world(); ++r) {
      std::int64_t n = 0;
      for (const std::size_t t : g.members) n += plan_.piece[r][t].size();
      g.part = std::max(g.part, n);
    }
    gathers_.push_back(std::move(g));
  }
  ProcessGroup* pg = &group_;
  const at::Device device = device_;
  sharding_->allreduce_sum = [pg, device](double* data, std::int64_t count, cudaStream_t) {
    if (count == 0) return;
    std::vector<at::Tensor> sums{at::from_blob(data, {count}, at::TensorOptions().dtype(at::kDouble).device(device))};
    pg->allreduce_sum(sums);
  };
  inner_->shard(sharding_);
}

ShardedOptimizer::~ShardedOptimizer() = default;

GradientNorms ShardedOptimizer::reduce_gradients(std::int64_t bucket_bytes) {
  at::NoGradGuard no_grad;
  if (stage_ == ShardStage::kStates) return allreduce_gradients(group_, params_, bucket_bytes);
  const int world = group_.size();
  const std::int64_t part = plan_.max_elements();
  // Rank r's part holds its pieces, in tensor order; a tensor without a gradient sends zeros.
  at::Tensor flat = at::zeros({world * part}, at::TensorOptions().dtype(at::kFloat).device(device_));
  GradientNorms norms;
  norms.local_sq = noise::grad_sq_norm(params_);
  has_grad_.assign(params_.size(), false);
  for (int r = 0; r < world; ++r) {
    std::int64_t offset = r * part;
    for (std::size_t t = 0; t < params_.size(); ++t) {
      const ShardPiece& piece = plan_.piece[static_cast<std::size_t>(r)][t];
      const at::Tensor& g = params_[t].grad();
      if (g.defined() && piece.size() > 0) {
        flat.narrow(0, offset, piece.size()).copy_(g.reshape({-1}).narrow(0, piece.begin, piece.size()));
      }
      offset += piece.size();
    }
  }
  for (std::size_t t = 0; t < params_.size(); ++t) {
    has_grad_[t] = params_[t].grad().defined();
    // Stage 2 keeps only the averaged slice: the whole local gradient goes now.
    if (has_grad_[t]) params_[t].mutable_grad().reset();
  }
  at::Tensor averaged = group_.reduce_scatter_sum(flat);
  averaged.div_(static_cast<double>(world));  // as allreduce_gradients divides
  // This rank's slices get their part of the average, in their parameter's
  // dtype (rounded as allreduce_gradients rounds into a 16-bit gradient).
  std::vector<at::Tensor> global{at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device_))};
  std::int64_t offset = 0;
  for (std::size_t t = 0; t < params_.size(); ++t) {
    if (has_grad_[t] && (!whole_ || mine()[t].size() > 0)) {
      slices_[t].mutable_grad() =
          averaged.narrow(0, offset, mine()[t].size()).view(slices_[t].sizes()).to(params_[t].scalar_type());
      global[0] += slices_[t].grad().to(at::kDouble).square().sum();
    }
    offset += mine()[t].size();
  }
  reduced_ = true;
  group_.allreduce_sum(global);
  norms.global_sq = global[0].item<double>();
  return norms;
}

void ShardedOptimizer::refresh_slices() {
  const auto& mine = this->mine();
  for (std::size_t t = 0; t < params_.size(); ++t) {
    const at::Tensor& p = params_[t];
    at::Tensor& slice = slices_[t];
    const std::int64_t offset = p.storage_offset() + mine[t].begin;
    if (p.storage().unsafeGetStorageImpl() == slice.storage().unsafeGetStorageImpl() &&
        slice.storage_offset() == offset) {
      continue;
    }
    // A module's load() (set_), or set_data, gave the parameter other
    // storage: the slice follows it, keeping its identity (the wrapped
    // optimizer's state is keyed by it).
    TORCH_CHECK(p.is_contiguous() && p.numel() == plan_.numel[t] && p.scalar_type() == slice.scalar_type() &&
                    p.device() == slice.device(),
                "ShardedOptimizer: parameter ", t, " is now ", p.scalar_type(), " of ", p.numel(), " elements on ",
                p.device(), (p.is_contiguous() ? "" : ", not contiguous"), "; it was ", slice.scalar_type(), " of ",
                plan_.numel[t], " elements on ", slice.device(), ". Build the optimizer after moving the model");
    slice.set_(p.storage(), offset, slice.sizes(), slice.strides());
  }
}

void ShardedOptimizer::slice_gradients() {
  const auto& mine = this->mine();
  if (stage_ == ShardStage::kStates) {
    for (std::size_t t = 0; t < params_.size(); ++t) {
      const at::Tensor& g = params_[t].grad();
      // Whole tensors: another rank's has no gradient here (no state, no step).
      slices_[t].mutable_grad() = g.defined() && (!whole_ || mine[t].size() > 0)
                                      ? g.contiguous().view({-1}).narrow(0, mine[t].begin, mine[t].size()).view(
                                            slices_[t].sizes())
                                      : at::Tensor();
    }
    return;
  }
  TORCH_CHECK(reduced_, "ShardedOptimizer: at stage \"gradients\" call reduce_gradients() after the backward "
              "pass and before step()");
}

void ShardedOptimizer::all_gather_params() {
  const auto& plan = plan_;
  const int rank = group_.rank();
  for (const auto& [dtype, members, part] : gathers_) {
    if (part == 0) continue;
    at::Tensor own = at::zeros({part}, params_[members[0]].options());
    std::int64_t offset = 0;
    for (const std::size_t t : members) {
      const std::int64_t n = plan.piece[rank][t].size();
      if (n > 0) own.narrow(0, offset, n).copy_(slices_[t].view({-1}));
      offset += n;
    }
    // 16-bit parameters travel as fp16 bits (a view, bit for bit): LibTorch 1.13's Gloo has no bf16 or int16.
    std::vector<at::Tensor> all = group_.allgather(own.element_size() == 2 ? own.view(at::kHalf) : own);
    for (at::Tensor& a : all) a = a.view(dtype);
    for (int r = 0; r < plan.world(); ++r) {
      if (r == rank) continue;
      offset = 0;
      for (const std::size_t t : members) {
        const ShardPiece& piece = plan.piece[r][t];
        if (piece.size() > 0) {
          params_[t].detach().view({-1}).narrow(0, piece.begin, piece.size()).copy_(all[r].narrow(0, offset, piece.size()));
        }
        offset += piece.size();
      }
    }
  }
}

torch::Tensor ShardedOptimizer::step(LossClosure closure) {
  torch::Tensor loss;
  if (closure != nullptr) {
    loss = optim::run_closure(closure);
    reduce_gradients();
  }
  at::NoGradGuard no_grad;
  // Options changed since the last step (a learning-rate schedule) reach the wrapped groups.
  for (std::size_t i = 0; i < param_groups_.size(); ++i) {
    inner_->param_groups()[i].set_options(param_groups_[i].options().clone());
  }
  refresh_slices();
  slice_gradients();
  inner_->step();
  reduced_ = false;
  for (at::Tensor& s : slices_) s.mutable_grad().reset();  // views of the gradients: not kept past the step
  all_gather_params();
  return loss;
}

void ShardedOptimizer::train(bool on) {
  if (on == training_) return;
  at::NoGradGuard no_grad;
  refresh_slices();
  inner_->train(on);
  all_gather_params();
  training_ = on;
}

std::int64_t ShardedOptimizer::skipped_steps() const { return inner_->skipped_steps(); }

std::optional<std::size_t> ShardedOptimizer::tensor_of(const at::Tensor& slice) const {
  const auto it = index_.find(slice.unsafeGetTensorImpl());
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

std::vector<optim::TrustRatio> ShardedOptimizer::trust_ratios() const {
  std::vector<optim::TrustRatio> out;
  for (const optim::TrustRatio& r : inner_->trust_ratios()) {
    if (const auto t = tensor_of(r.param)) out.push_back({params_[*t], r.ratio});
  }
  return out;
}

void ShardedOptimizer::shard(std::shared_ptr<const optim::OptimizerSharding> sharding) {
  TORCH_CHECK(sharding == nullptr, "ShardedOptimizer: it is sharded already");
}

std::int64_t ShardedOptimizer::state_bytes() const { return inner_->state_bytes(); }

std::unique_ptr<optim::LayerwiseOptimizerBase> ShardedOptimizer::make_like(
    std::vector<torch::optim::OptimizerParamGroup>) const {
  TORCH_CHECK(false, "ShardedOptimizer: make_like of a sharded optimizer; shard the wrapped kind instead");
}

std::int64_t ShardedOptimizer::gradient_bytes() const {
  if (stage_ == ShardStage::kGradients) return plan_.elements(group_.rank()) * 4;
  std::int64_t bytes = 0;
  for (const at::Tensor& p : params_) bytes += p.numel() * static_cast<std::int64_t>(p.element_size());
  return bytes;
}

ExchangeBytes ShardedOptimizer::exchange_bytes() const {
  const std::int64_t n = group_.size();
  ExchangeBytes bytes;
  std::int64_t elements = 0;
  for (const at::Tensor& p : params_) elements += p.numel();
  bytes.all_reduce = stage_ == ShardStage::kStates ? 2 * (n - 1) * elements * 4 / n : 0;
  bytes.reduce_scatter = stage_ == ShardStage::kGradients ? (n - 1) * plan_.max_elements() * 4 : 0;
  for (const Gather& g : gathers_) bytes.all_gather += (n - 1) * g.part * static_cast<std::int64_t>(c10::elementSize(g.dtype));
  return bytes;
}

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

std::optional<optim::NamedState> ShardedOptimizer::named_state(const at::Tensor&) const {
  TORCH_CHECK(false, "ShardedOptimizer: its state is cut across the ranks; join it with load_sharded_into()");
}

void ShardedOptimizer::set_named_state(const at::Tensor&, const std::optional<optim::NamedState>&) {
  TORCH_CHECK(false, "ShardedOptimizer: its state is cut across the ranks; load it with load_shards() or "
              "load_unsharded()");
}

void ShardedOptimizer::set_skipped_steps(std::int64_t count) { inner_->set_skipped_steps(count); }

const char* ShardedOptimizer::kind() const { return inner_->kind(); }

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
