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

std::vector<torch::optim::OptimizerParamGroup> ShardedOptimizer::groups_of(const optim::LayerwiseOptimizerBase& like) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (const auto& g : like.param_groups()) groups.emplace_back(g.params(), g.options().clone());
  return groups;
}

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

std::optional<optim::NamedState> ShardedOptimizer::named_state(const at::Tensor&) const {
  TORCH_CHECK(false, "ShardedOptimizer: its state is cut across the ranks; join it with load_sharded_into()");
}

void ShardedOptimizer::set_named_state(const at::Tensor&, const std::optional<optim::NamedState>&) {
  TORCH_CHECK(false, "ShardedOptimizer: its state is cut across the ranks; load it with load_shards() or "
              "load_unsharded()");
}

void ShardedOptimizer::set_skipped_steps(std::int64_t count) { inner_->set_skipped_steps(count); }

const char* ShardedOptimizer::kind() const { return inner_->kind(); }

}  // namespace bigbatch::distributed
