#include "sharded.h"

#include "../kernels/plan.h"
#include "../noise/noise_scale.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <map>
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

// ------------------------------------------------------------ the optimizer --

struct ShardedOptimizer::Parts {
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
  parts.plan = plan_shards(numel, group.size());
  std::vector<torch::optim::OptimizerParamGroup> sliced;
  std::size_t t = 0;
  for (const auto& g : groups) {
    std::vector<at::Tensor> slices;
    for (std::size_t j = 0; j < g.params().size(); ++j, ++t) {
      const ShardPiece& piece = parts.plan.piece[static_cast<std::size_t>(group.rank())][t];
      // A view of this rank's elements under a tensor of its own: the wrapped
      // optimizer keys its state and gradient by it.
      slices.push_back(parts.params[t].detach().view({-1}).narrow(0, piece.begin, piece.size()).detach());
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
    sharding_->shards[slices_[t].unsafeGetTensorImpl()] = {(plan_.numel[t] + kChunkElements - 1) / kChunkElements,
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
    if (has_grad_[t]) {
      slices_[t].mutable_grad() = averaged.narrow(0, offset, mine()[t].size()).to(params_[t].scalar_type());
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
    slice.set_(p.storage(), offset, {mine[t].size()}, {1});
  }
}

void ShardedOptimizer::slice_gradients() {
  const auto& mine = this->mine();
  if (stage_ == ShardStage::kStates) {
    for (std::size_t t = 0; t < params_.size(); ++t) {
      const at::Tensor& g = params_[t].grad();
      slices_[t].mutable_grad() =
          g.defined() ? g.contiguous().view({-1}).narrow(0, mine[t].begin, mine[t].size()) : at::Tensor();
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
      if (n > 0) own.narrow(0, offset, n).copy_(slices_[t]);
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

std::int64_t ShardedOptimizer::skipped_steps() const { return inner_->skipped_steps(); }

std::vector<optim::TrustRatio> ShardedOptimizer::trust_ratios() const {
  std::unordered_map<const void*, std::size_t> index;
  for (std::size_t t = 0; t < slices_.size(); ++t) index[slices_[t].unsafeGetTensorImpl()] = t;
  std::vector<optim::TrustRatio> out;
  for (const optim::TrustRatio& r : inner_->trust_ratios()) {
    const auto it = index.find(r.param.unsafeGetTensorImpl());
    if (it != index.end()) out.push_back({params_[it->second], r.ratio});
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

void ShardedOptimizer::save(torch::serialize::OutputArchive& archive) const {
  torch::serialize::OutputArchive inner;
  inner_->save(inner);
  archive.write("bigbatch/shard/inner", inner);
  archive.write("bigbatch/shard/world_size", at::scalar_tensor(static_cast<std::int64_t>(group_.size()), at::kLong));
  archive.write("bigbatch/shard/rank", at::scalar_tensor(static_cast<std::int64_t>(group_.rank()), at::kLong));
  archive.write("bigbatch/shard/numel", at::tensor(plan_.numel, at::kLong));
}

void ShardedOptimizer::load(torch::serialize::InputArchive& archive) {
  at::Tensor world;
  at::Tensor rank;
  at::Tensor numel;
  TORCH_CHECK(archive.try_read("bigbatch/shard/world_size", world) && archive.try_read("bigbatch/shard/rank", rank) &&
                  archive.try_read("bigbatch/shard/numel", numel),
              "ShardedOptimizer: the archive holds no sharded optimizer state");
  TORCH_CHECK(world.item<std::int64_t>() == group_.size() && rank.item<std::int64_t>() == group_.rank(),
              "ShardedOptimizer: the archive holds the shard of rank ", rank.item<std::int64_t>(), " of ",
              world.item<std::int64_t>(), "; this is rank ", group_.rank(), " of ", group_.size());
  const std::vector<std::int64_t> saved(numel.data_ptr<std::int64_t>(), numel.data_ptr<std::int64_t>() + numel.numel());
  TORCH_CHECK(saved == plan_.numel, "ShardedOptimizer: the archive's tensors (", saved.size(),
              ") are not this optimizer's (", plan_.numel.size(), "), or differ in size");
  torch::serialize::InputArchive inner;
  archive.read("bigbatch/shard/inner", inner);
  inner_->load(inner);
}

}  // namespace bigbatch::distributed
